"""Layer stacks (mofa_framework/stack.py): the pattern language, the kinds of layer, their placement on
pipeline stages, and the rule that a stack of transformer layers only is today's model, bit for bit."""

import json

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mofa_framework.api import Predictor
from mofa_framework.batch import CandidateBatch
from mofa_framework.config import job_from_dict
from mofa_framework.engine import kind_weights, layers_per_stage_valid, stage_layout
from mofa_framework.errors import ConfigError
from mofa_framework.stack import BUILTIN_BLOCKS, BlockSpec, expand_pattern, kind_key

PRED = Predictor()
REG = PRED.registry


def _model(**kw):
    base = dict(name="toy", num_layers=8, hidden_size=256, num_attention_heads=8, num_kv_heads=8,
                ffn_hidden_size=512, vocab_size=1000)
    return job_from_dict({"model": {**base, **kw}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 1},
                          "parallel": {"global_batch_size": 1, "sequence_length": 128}}, REG).model


# ---------------------------------------------------------------------- the pattern language


def test_counts_and_groups_expand():
    assert expand_pattern("D3X2") == "DDDXX"
    assert expand_pattern("(LG)3") == "LGLGLG"
    assert expand_pattern("((ab)2c)2") == "ababcababc"
    assert expand_pattern("M-M* -") == "M-M*-"  # spaces are ignored
    assert expand_pattern("M-M-M-M*-") == "M-M-M-M*-"  # Nemotron-H's hybrid_override_pattern as is


@pytest.mark.parametrize("bad", ["(", ")", "()", "3", "D0", "(D)0"])
def test_malformed_patterns_are_refused(bad):
    with pytest.raises(ValueError, match="layer_pattern"):
        expand_pattern(bad)


@pytest.mark.parametrize("kw, words", [
    ({"layer_pattern": "DQ"}, "undefined symbol"),
    ({"blocks": {"a": {"ffn": "moe"}}}, "layer_pattern is empty"),
    ({"layer_pattern": "DX", "num_experts": 8, "experts_per_token": 2, "moe_ffn_hidden_size": 64,
      "first_k_dense_layers": 1}, "first_k_dense_layers"),
    ({"layer_pattern": "DX"}, "num_experts is 0"),
    ({"layer_pattern": "D", "num_experts": 8, "experts_per_token": 2, "moe_ffn_hidden_size": 64}, "no MoE block"),
    ({"layer_pattern": "l", "blocks": {"l": {"attention": "sliding"}}}, "sliding_window"),
    ({"layer_pattern": "c", "blocks": {"c": {"attention": "chunked"}}}, "attention_chunk_size"),
    ({"layer_pattern": "n", "blocks": {"n": {"mixer": "gated_deltanet"}}}, "linear_num_key_heads"),
    ({"layer_pattern": "M", "mamba_num_groups": 3}, "mamba_num_groups"),
    ({"layer_pattern": "a", "blocks": {"a": {"mixer": "none", "ffn": "none"}}}, "mixer or an ffn"),
    ({"layer_pattern": "a", "blocks": {"a": {"mixer": "mamba2", "attention": "full"}}}, "attention mixers only"),
    ({"layer_pattern": "7", "blocks": {"7": {}}}, "symbol"),
])
def test_bad_stacks_are_one_clear_line(kw, words):
    with pytest.raises(ConfigError, match=words) as err:
        _model(**kw)
    assert "\n" not in str(err.value)


def test_the_pattern_repeats_to_num_layers_and_is_cut_there():
    gemma3 = REG.model("gemma-3-1b")  # "lllllg" over 26 layers: 4 full units and 2 more local layers
    assert gemma3.kind_counts == {"sliding_attention+mlp": 22, "full_attention+mlp": 4}
    assert gemma3.layer_kinds[-3:] == ("full_attention+mlp", "sliding_attention+mlp", "sliding_attention+mlp")
    nh = REG.model("nemotron-h-8b")
    assert nh.kind_counts == {"mamba2": 24, "mlp": 24, "attention": 4}


def test_kinds_are_named_by_their_block_and_equal_blocks_are_one_kind():
    assert [kind_key(BUILTIN_BLOCKS[s]) for s in "M*-EDX"] == ["mamba2", "attention", "mlp", "moe_mlp", "dense",
                                                                 "moe"]
    assert kind_key(BlockSpec(attention="full", output_gate=True, ffn="moe")) == "gated_full_attention+moe"
    m = _model(layer_pattern="DaDa", blocks={"a": {}})  # 'a' is the transformer layer 'D' again
    assert m.block_kinds == {"dense": BlockSpec()}


def test_a_legacy_stack_is_dense_first_then_moe():
    m = _model(num_experts=8, experts_per_token=2, moe_ffn_hidden_size=64, first_k_dense_layers=3)
    assert m.layer_kinds == ("dense",) * 3 + ("moe",) * 5 and list(m.block_kinds) == ["dense", "moe"]
    m = _model(num_experts=8, experts_per_token=2, moe_ffn_hidden_size=64, moe_layer_frequency=2)
    assert m.layer_kinds == ("moe", "dense") * 4 and list(m.block_kinds) == ["dense", "moe"]
    assert m.num_moe_layers == 4


# ---------------------------------------------------------------------- stack of transformer layers = today's model


def _explicit(model):
    """The same model with its stack spelled out as a pattern of the built-in transformer layers."""
    symbols = "".join({"dense": "D", "moe": "X"}[k] for k in model.layer_kinds)
    return attrs.evolve(model, layer_pattern=symbols, first_k_dense_layers=0, moe_layer_frequency=1)


LEGACY = sorted(n for n, m in REG.models.items() if not m.layer_pattern)
FEATURES = [{}, {"recompute": {"granularity": "full"}}, {"recompute": {"granularity": "selective", "moe": True}},
            {"distributed_optimizer": {}}, {"fp8": {}}, {"ep_overlap": {}}, {"memfine": {}}, {"fsdp": {}},
            {"tp_overlap": {}}, {"cuda_graphs": {}}]


def _flat(d, pre=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{pre}{k}.")
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            yield f"{pre}{k}", v


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(LEGACY), tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 3, 4, 8]),
       vpp=st.sampled_from([1, 2]), ep=st.sampled_from([1, 2, 8]), cp=st.sampled_from([1, 2]),
       mbs=st.sampled_from([1, 2]), seq=st.sampled_from([2048, 4096]), feats=st.sampled_from(FEATURES),
       uneven=st.booleans(), freq=st.sampled_from([1, 2]), first_k=st.sampled_from([0, 1, 3]))
def test_a_stack_of_transformer_layers_predicts_exactly_as_the_model_without_one(
        name, tp, pp, vpp, ep, cp, mbs, seq, feats, uneven, freq, first_k):
    """Property over the zoo's models (made MoE-interleaved and dense-first at random) and random
    layouts, features and uneven end stages: spelling the stack out as 'D'/'X' layers changes no number."""
    zoo = REG.model(name)
    if zoo.is_moe:
        zoo = attrs.evolve(zoo, moe_layer_frequency=freq, first_k_dense_layers=min(first_k, zoo.num_layers))
    else:
        ep = 1
    par = {"tp": tp, "pp": pp, "vpp": vpp if pp > 2 else 1, "cp": cp, "ep": ep, "micro_batch_size": mbs,
           "global_batch_size": 8 * mbs * max(ep // (tp * cp), 1), "sequence_length": seq}
    if uneven and pp > 2:
        par["first_stage_layers"] = par["last_stage_layers"] = max(1, zoo.num_layers // pp - 1)
    gpus = tp * pp * cp * max(ep // (tp * cp), 1)
    job = PRED.job({"model": {"name": name}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": gpus},
                    "parallel": par, "features": feats})
    legacy, explicit = (attrs.evolve(job, model=m) for m in (zoo, _explicit(zoo)))
    assert explicit.model.layer_kinds == legacy.model.layer_kinds
    try:
        a = PRED.predict(legacy)[0].to_dict()
    except ConfigError as exc:  # an infeasible layout is refused the same way
        with pytest.raises(ConfigError, match=str(exc).split(":")[0]):
            PRED.predict(explicit)
        return
    b = PRED.predict(explicit)[0].to_dict()
    assert dict(_flat(a)) == dict(_flat(b))


# ---------------------------------------------------------------------- placement on stages


def _batch(n, **cols):
    base = dict(tp=1, pp=1, vpp=1, cp=1, ep=1, etp=1, dp=1, micro_batch_size=1, global_batch_size=1,
                sequence_length=4096, sequence_parallel=False, precision=0, schedule=0, first_stage_layers=0,
                last_stage_layers=0, flash_attention=True)
    base.update(cols)
    return CandidateBatch(**{k: np.broadcast_to(np.asarray(v), (n,)).copy() for k, v in base.items()}, features={})


def _all_stages(model, p, v, first, mid, last):
    """Layers of each kind on every physical stage (K, p), walking the stack layer by layer through
    the rows of chunks (the reference placement: a stage of n layers has v chunks of ⌊n/v⌋, the first
    n mod v one layer more)."""
    L = model.num_layers
    sizes = [first] + [mid] * (p - 2) + [last] if p > 1 else [L]
    owner = []
    for c in range(v):
        for stage, n in enumerate(sizes):
            owner += [stage] * (n // v + (c < n % v))
    assert len(owner) == L  # the stages tile the stack
    kinds = list(model.block_kinds)
    out = np.zeros((len(kinds), len(sizes)))
    for layer, stage in enumerate(owner):
        out[kinds.index(model.layer_kinds[layer]), stage] += 1
    assert out.sum(axis=0).tolist() == sizes  # every stage holds exactly its layers
    return out


@settings(max_examples=60, deadline=None)
@given(symbols=st.lists(st.sampled_from("M-*DE"), min_size=1, max_size=9), layers=st.integers(4, 60),
       pp=st.integers(1, 12), vpp=st.sampled_from([1, 2, 3]), first=st.integers(0, 6), last=st.integers(0, 6))
def test_stages_hold_every_layer_once_and_the_worst_middle_stage_is_one_of_them(symbols, layers, pp, vpp, first,
                                                                                 last):
    """Conservation: Σ over stages of the layers of each kind = the stack's count of that kind, for any
    pattern, pp, interleaving and uneven end stages; the first, middle and last rows of the layout are
    the first, the heaviest middle and the last stage of a layer-by-layer walk."""
    model = _model(num_layers=layers, layer_pattern="".join(symbols), num_experts=4, experts_per_token=1,
                   moe_ffn_hidden_size=64) if "E" in symbols else _model(num_layers=layers,
                                                                          layer_pattern="".join(symbols))
    batch = _batch(1, pp=pp, vpp=vpp if pp > 2 else 1, first_stage_layers=first if pp > 1 else 0,
                   last_stage_layers=last if pp > 1 else 0)
    lay = stage_layout(model, batch)
    f, m, la = (int(x[0]) for x in lay.total)
    if not layers_per_stage_valid(model, batch)[0]:
        return  # not a valid split: the pp_splits_layers constraint refuses it
    v = int(batch.vpp[0])
    ref = _all_stages(model, pp, v, f, m, la)
    assert ref.sum(axis=1).tolist() == [model.kind_counts[k] for k in model.block_kinds]
    got = np.array([lay.counts[k][:, 0] for k in model.block_kinds])  # (K, 3)
    assert got[:, 0].tolist() == ref[:, 0].tolist() and got[:, 2].tolist() == ref[:, -1].tolist()
    if pp > 2:
        w = kind_weights(model, np.array([4096.0]))[:, 0]
        mids = ref[:, 1:-1]
        best = int(np.argmax(w @ mids))
        assert got[:, 1].tolist() == mids[:, best].tolist()
    # the totals match the per-kind counts on every row
    assert np.array_equal(sum(lay.counts.values()), lay.total)


def test_uneven_end_stages_place_the_hybrid_stack_in_order():
    """Nemotron-H 8B on PP 4 with 10 + 16 + 16 + 10 layers: the first stage holds layers 0–9 of
    'M-M-M-M*-M-M-M-M-M*-...' (5 Mamba, 4 MLP, 1 attention), the last layers 42–51 ('-M-M-M-M-M-':
    5 Mamba, 5 MLP)."""
    nh = REG.model("nemotron-h-8b")
    lay = stage_layout(nh, _batch(1, pp=4, first_stage_layers=10, last_stage_layers=10))
    first = {k: int(c[0, 0]) for k, c in lay.counts.items()}
    last = {k: int(c[2, 0]) for k, c in lay.counts.items()}
    assert first == {"mamba2": 5, "mlp": 4, "attention": 1}
    assert last == {"mamba2": 5, "mlp": 5, "attention": 0}
    assert lay.total[:, 0].tolist() == [10, 16, 10]


# ---------------------------------------------------------------------- fewer layers


def _cli_model(section):
    return job_from_dict({"model": section, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 8},
                          "parallel": {"global_batch_size": 8, "sequence_length": 1024}}, REG).model


def test_num_layers_on_a_dense_zoo_model_is_the_same_model_with_fewer_layers():
    m = _cli_model({"name": "llama3.1-405b", "num_layers": 8})
    assert m == attrs.evolve(REG.model("llama3.1-405b"), num_layers=8)


def test_num_layers_keeps_the_first_layers_of_a_stack():
    assert _cli_model({"name": "deepseek-v3", "num_layers": 2}).layer_kinds == ("dense", "dense")
    assert _cli_model({"name": "deepseek-v3", "num_layers": 5}).layer_kinds == ("dense",) * 3 + ("moe",) * 2
    nh = _cli_model({"name": "nemotron-h-8b", "num_layers": 8})
    assert nh.layer_kinds == ("mamba2", "mlp") * 3 + ("mamba2", "attention")
    g3 = _cli_model({"name": "gemma-3-1b", "num_layers": 12})
    assert g3.kind_counts == {"sliding_attention+mlp": 10, "full_attention+mlp": 2}
    # the first layers of Nemotron-H hold no MoE, but the model keeps its own (none): still valid
    assert REG.model("qwen3-next-80b-a3b").with_num_layers(1).layer_kinds == ("gated_deltanet+moe",)


def test_cli_num_layers_applies_to_flags_and_job_files(tmp_path):
    from click.testing import CliRunner

    from mofa_framework.cli import _builtin_commands, cli

    _builtin_commands()
    flags = ["--hardware", "h100-sxm5-80gb", "--gpus", "8", "--tp", "8", "--gbs", "8", "--seq", "4096",
             "--format", "json"]
    full = json.loads(CliRunner().invoke(cli, ["predict", "--model", "llama3.1-405b", *flags]).output)
    cut = json.loads(CliRunner().invoke(cli, ["predict", "--model", "llama3.1-405b", "--num-layers", "8",
                                              *flags]).output)
    # 8 of 126 layers: the layers' share of the step shrinks 126/8-fold (embedding and head stay)
    assert cut["step_time_s"] < full["step_time_s"] / 8
    job = tmp_path / "j.toml"
    job.write_text('[model]\nname = "llama3.1-405b"\n[hardware]\nname = "h100-sxm5-80gb"\nnum_gpus = 8\n'
                   '[parallel]\ntp = 8\nglobal_batch_size = 8\nsequence_length = 4096\n')
    from_file = json.loads(CliRunner().invoke(cli, ["predict", str(job), "--num-layers", "8", "--format",
                                                    "json"]).output)
    assert from_file["step_time_s"] == cut["step_time_s"]
    bad = CliRunner().invoke(cli, ["predict", "--model", "llama3.1-405b", "--num-layers", "0", *flags])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
