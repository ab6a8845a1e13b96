"""The HuggingFace importer reads every zoo model's published config.json and the common key families,
and any broken config.json — including ≥ 2,000 fuzzed ones — is one ConfigError line, never a traceback."""

import json
import math
import random

import pytest

from mofa_framework.api import Predictor
from mofa_framework.config import model_from_hf_config, model_from_hf_dict
from mofa_framework.decompose import total_params
from mofa_framework.errors import ConfigError
from mofa_framework.hf_config import read_hf_bytes

from hf_configs import FAMILIES, ZOO

REG = Predictor().registry
SHAPE = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "kv_channels", "vocab_size",
         "activation", "normalization", "position_embedding", "tied_embeddings", "num_experts", "experts_per_token",
         "moe_ffn_hidden_size", "shared_expert_ffn", "sliding_window", "attention_chunk_size", "mamba_inner_size",
         "mamba_heads", "mamba_num_groups", "mamba_state_size", "linear_num_value_heads", "num_mtp_layers",
         "parallel_attention_mlp")


@pytest.mark.parametrize("name", sorted(ZOO))
def test_each_zoo_model_reads_from_its_config_json(name):
    """The imported model is the zoo's: same shape, same stack of kinds, same parameter counts."""
    zoo, imported = REG.model(name), model_from_hf_dict(ZOO[name], f"{name}/config.json")
    for field in SHAPE:
        assert getattr(imported, field) == getattr(zoo, field), field
    assert imported.layer_kinds == zoo.layer_kinds and imported.mtp_kind_counts == zoo.mtp_kind_counts
    assert total_params(imported) == total_params(zoo)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_common_key_families(family):
    cfg, expected = FAMILIES[family]
    m = model_from_hf_dict(cfg, f"{family}/config.json")
    for field, value in expected.items():
        got = getattr(m, field)
        assert (got.value if hasattr(got, "value") else got) == value, field


def test_gpt2_and_neox_parameter_counts():
    """GPT-2 XL: 1,557,611,200 parameters (with 1024·1600 learned positions and biases, which the schema
    does not count: 1.6M + 1.0M); GPT-NeoX-20B: 20,554,567,680 (biases 0.6M)."""
    gpt2 = model_from_hf_dict(FAMILIES["gpt2"][0], "gpt2-xl")
    assert total_params(gpt2)["total"] == pytest.approx(1_557_611_200, rel=0.005)
    neox = model_from_hf_dict(FAMILIES["gpt_neox"][0], "gpt-neox-20b")
    assert total_params(neox)["total"] == pytest.approx(20_554_567_680, rel=0.005)


def _one_line(exc: ConfigError) -> str:
    text = str(exc)
    assert "\n" not in text and "Traceback" not in text
    return text


@pytest.mark.parametrize("content, words", [
    (b"[1, 2]", "one JSON object"),
    (b"null", "null"),
    (b'{"model_type": 5, "num_hidden_layers": 2}', "model_type = 5"),
    (b'{"num_hidden_layers": 2, "hidden_size": "4096"}', "hidden_size = '4096'"),
    ("{\"model_type\": \"caf\xe9\"}".encode("latin-1"), "not UTF-8"),
    (b"\xff\xfe\x00garbage", "not UTF-8"),
    (b"{not json", "not JSON"),
    (b"[" * 100_000, "not JSON"),
])
def test_unreadable_documents_are_one_clear_line(content, words):
    with pytest.raises(ConfigError, match=words) as err:
        model_from_hf_dict(read_hf_bytes(content, "config.json"), "config.json")
    _one_line(err.value)


@pytest.mark.parametrize("layer_types, words", [([], "layer_types = \\[\\]"), ("sliding", "layer_types = 'sliding'"),
                                                ([1, 2], "layer_types"), (["sliding_attention"] * 3, "one per layer"),
                                                (["local"] * 4, "layer_types = 'local'")])
def test_bad_layer_types_name_the_key_the_value_and_the_fix(layer_types, words):
    cfg = {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
           "vocab_size": 1000, "sliding_window": 128, "layer_types": layer_types}
    with pytest.raises(ConfigError, match=words) as err:
        model_from_hf_dict(cfg, "config.json")
    assert "fix the config.json" in _one_line(err.value)


def test_a_missing_size_says_which_key(tmp_path):
    with pytest.raises(ConfigError, match="num_hidden_layers / n_layer"):
        model_from_hf_dict({"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10}, "config.json")
    d = tmp_path / "dir"
    d.mkdir()
    with pytest.raises(ConfigError, match="is a directory, not a HuggingFace config.json"):
        model_from_hf_config(d)
    with pytest.raises(ConfigError, match="no such file"):
        model_from_hf_config(tmp_path / "missing.json")


# ---------------------------------------------------------------------- fuzzing

_VALUES = [None, True, False, 0, -1, 1, 3, 7, 2 ** 31, 2 ** 70, 1e30, -1e30, 1.5, 4096.0, float("nan"), float("inf"),
           "", "x", "sliding", "4096", [], [0], ["full_attention"], ["linear_attention", 3], {}, {"a": 1},
           "M-M*", "MEX-", "(ab)3"]


def _mutate(doc: dict, rng: random.Random):
    """One random structural mutation of a config document (a deep copy)."""
    doc = json.loads(json.dumps(doc))
    inner = doc.get("text_config")
    target = inner if isinstance(inner, dict) and rng.random() < 0.7 else doc
    keys = list(target)
    op = rng.randrange(6)
    if op == 0 and keys:
        target.pop(rng.choice(keys))
    elif op == 1 and keys:
        target[rng.choice(keys)] = rng.choice(_VALUES)
    elif op == 2 and keys:
        k = rng.choice(keys)
        target[k + rng.choice(["_x", "s", ""]).upper()] = target.pop(k)
    elif op == 3:
        target[rng.choice(["layer_types", "hybrid_override_pattern", "no_rope_layers", "moe_layers",
                           "mlp_only_layers", "text_config", "attn_config", "ffn_config", "n_group",
                           "num_local_experts", "first_k_dense_replace", "full_attention_interval",
                           "attn_layer_period", "expert_layer_period"])] = rng.choice(_VALUES)
    elif op == 4 and keys:
        k = rng.choice(keys)
        if isinstance(target[k], (int, float)) and not isinstance(target[k], bool):
            target[k] = rng.choice([0, -target[k], target[k] * 1000, target[k] + 1, target[k] // 3])
    else:
        return rng.choice([[doc], None, 5, "config", [], {"text_config": doc}])
    return doc


def _bytes_mutation(doc: dict, rng: random.Random) -> bytes:
    raw = bytearray(json.dumps(doc, allow_nan=True).encode())
    for _ in range(rng.randrange(1, 4)):
        if not raw:
            break
        i = rng.randrange(len(raw))
        op = rng.randrange(3)
        if op == 0:
            raw[i] = rng.randrange(256)
        elif op == 1:
            del raw[i:]
        else:
            raw[i:i] = bytes([rng.choice([0xff, 0xc3, 0x00, 0x7b, 0x5b])])
    return bytes(raw)


def test_fuzzed_config_json_documents_raise_config_error_only():
    """10,000 mutated documents (7,500 structural, 2,500 byte-level) from every published config above:
    each is a valid ModelSpec or one ConfigError line, never another exception."""
    rng = random.Random(18)
    seeds = [*ZOO.values(), *(cfg for cfg, _ in FAMILIES.values())]
    accepted = refused = 0
    for i in range(10_000):
        doc = rng.choice(seeds)
        try:
            if i % 4 == 3:
                data = read_hf_bytes(_bytes_mutation(doc, rng), "fuzz.json")
            else:
                data = doc
                for _ in range(1 + i % 3):  # one to three mutations on top of each other
                    data = _mutate(data, rng) if isinstance(data, dict) else data
            m = model_from_hf_dict(data, "fuzz.json")
        except ConfigError as exc:
            _one_line(exc)
            refused += 1
            continue
        assert len(m.layer_kinds) == m.num_layers and m.num_layers >= 1
        assert all(math.isfinite(v) for v in total_params(m).values())
        accepted += 1
    assert accepted > 1000 and refused > 1000  # both paths exercised
