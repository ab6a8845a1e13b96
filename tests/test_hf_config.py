"""`--model` and `[model] config = ...` take a HuggingFace config.json."""

import json

import pytest
from click.testing import CliRunner

from mofa_framework.cli import _builtin_commands, cli
from mofa_framework.config import model_from_hf_config

_builtin_commands()

# Meta-Llama-3-8B's published config.json (the fields MoFa reads)
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
             "intermediate_size": 14336, "max_position_embeddings": 8192, "model_type": "llama",
             "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
             "tie_word_embeddings": False, "vocab_size": 128256}
# Mixtral-8x7B's (MoE)
MIXTRAL = {"hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336, "model_type": "mixtral",
           "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
           "num_experts_per_tok": 2, "rms_norm_eps": 1e-05, "vocab_size": 32000, "sliding_window": None}


def test_hf_config_matches_the_zoo(tmp_path, mofa_predictor):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(LLAMA3_8B))
    m = model_from_hf_config(p)
    zoo = mofa_predictor.registry.model("llama3-8b")
    for f in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size",
              "activation", "tied_embeddings"):
        assert getattr(m, f) == getattr(zoo, f), f


def test_hf_moe_config(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(MIXTRAL))
    m = model_from_hf_config(p)
    assert (m.num_experts, m.experts_per_token, m.moe_ffn_hidden_size) == (8, 2, 14336)
    assert m.sliding_window == 0


def test_cli_predicts_from_hf_config_and_matches_zoo(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(LLAMA3_8B))
    flags = ["--hardware", "h100-sxm5-80gb", "--gpus", "8", "--tp", "2", "--gbs", "16", "--seq", "4096",
             "--format", "json"]
    r1 = json.loads(CliRunner().invoke(cli, ["predict", "--model", str(p), *flags]).output)
    r2 = json.loads(CliRunner().invoke(cli, ["predict", "--model", "llama3-8b", *flags]).output)
    assert r1["step_time_s"] == pytest.approx(r2["step_time_s"])


def test_bad_hf_config_is_one_line(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    r = CliRunner().invoke(cli, ["predict", "--model", str(p), "--hardware", "h100-sxm5-80gb", "--gpus", "8",
                                 "--gbs", "8", "--seq", "1024"])
    assert r.exit_code == 2 and "config.json" in r.output and len(r.output.strip().splitlines()) == 1


# DeepSeek-V3's published config.json, the routing fields (group-limited: 8 groups, best 4)
DEEPSEEK_V3_ROUTING = {"hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432, "model_type": "deepseek_v3",
                       "num_attention_heads": 128, "num_hidden_layers": 61, "num_key_value_heads": 128,
                       "vocab_size": 129280, "n_routed_experts": 256, "num_experts_per_tok": 8,
                       "moe_intermediate_size": 2048, "n_shared_experts": 1, "first_k_dense_replace": 3,
                       "n_group": 8, "topk_group": 4, "q_lora_rank": 1536, "kv_lora_rank": 512,
                       "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}


def test_hf_group_limited_routing(tmp_path, mofa_predictor):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(DEEPSEEK_V3_ROUTING))
    m = model_from_hf_config(p)
    zoo = mofa_predictor.registry.model("deepseek-v3")
    assert (m.moe_router_num_groups, m.moe_router_group_topk) == (8, 4)
    assert (zoo.moe_router_num_groups, zoo.moe_router_group_topk) == (8, 4)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**DEEPSEEK_V3_ROUTING, "n_group": 7}))  # 7 does not divide 256 experts
    r = CliRunner().invoke(cli, ["predict", "--model", str(bad), "--hardware", "h100-sxm5-80gb", "--gpus", "8",
                                 "--gbs", "8", "--seq", "1024"])
    assert r.exit_code == 2 and "moe_router_num_groups" in r.output and len(r.output.strip().splitlines()) == 1
