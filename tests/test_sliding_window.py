"""Sliding-window attention on a share of the layers (GPT-OSS: alternating window-128 / full)."""

import json

import attrs
import numpy as np

from mofa_framework.api import Predictor
from mofa_framework.config import model_from_hf_config
from mofa_framework.decompose import (
    CAUSAL_FRACTION,
    Geometry,
    attended_keys,
    layer_operators,
    saved_activation_bytes,
)


def _geometry(s: float, flash: bool = True) -> Geometry:
    one = np.ones(1)
    return Geometry(b=one, s=np.array([s]), t=one, c=one, e=one, etp=one, dp=one, sp=np.zeros(1, bool),
                    dt=2.0 * one, precision=np.zeros(1, int), flash=np.full(1, flash))


def _core_flops(model, g) -> float:
    return float(sum(np.asarray(o.flops)[0] for o in layer_operators(model, g, "moe") if o.name == "core_attention"))


def test_attended_keys_limits():
    model = _gpt_oss()
    assert model.sliding_window == 128 and model.sliding_window_layer_fraction == 0.5
    s = 4096.0
    width, causal = attended_keys(model, s)
    w_causal = 128 * (1 - 128 / (2 * s))
    assert np.isclose(causal, 0.5 * w_causal + 0.5 * CAUSAL_FRACTION * s)
    assert np.isclose(width, 0.5 * 128 + 0.5 * s)
    # a window as long as the sequence is plain causal attention
    full = attrs.evolve(model, sliding_window=int(s), sliding_window_layer_fraction=1.0)
    assert np.isclose(attended_keys(full, s)[1], CAUSAL_FRACTION * s)
    # no window: unchanged
    none = attrs.evolve(model, sliding_window=0)
    assert np.allclose(attended_keys(none, s), (s, CAUSAL_FRACTION * s))


def _gpt_oss():
    """GPT-OSS-120B described without a layer pattern: the model-level window on half of the layers
    (the zoo spells the alternation out; `layer_pattern` below)."""
    from mofa_framework.api import Predictor

    zoo = Predictor().registry.model("gpt-oss-120b")
    return attrs.evolve(zoo, layer_pattern="", blocks={}, sliding_window_layer_fraction=0.5)


def test_half_windowed_layers_cost_between_all_and_none():
    model = _gpt_oss()
    g = _geometry(4096.0)
    half = _core_flops(model, g)
    all_win = _core_flops(attrs.evolve(model, sliding_window_layer_fraction=1.0), g)
    no_win = _core_flops(attrs.evolve(model, sliding_window=0), g)
    assert all_win < half < no_win
    assert np.isclose(half, 0.5 * (all_win + no_win))
    # unfused scores (saved for backward) scale with the same mix
    gu = _geometry(4096.0, flash=False)
    sa = lambda m: float(np.asarray(saved_activation_bytes(m, gu, "moe").core_attention)[0])  # noqa: E731
    assert sa(attrs.evolve(model, sliding_window_layer_fraction=1.0)) < sa(model) < sa(attrs.evolve(model, sliding_window=0))


def test_hf_layer_types_give_the_layer_pattern(tmp_path):
    cfg = {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
           "intermediate_size": 128, "vocab_size": 1000, "sliding_window": 128,
           "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = model_from_hf_config(p)
    assert m.sliding_window == 128
    assert m.layer_kinds == ("sliding_attention+mlp", "full_attention+mlp") * 2


def test_the_explicit_alternation_matches_the_half_fraction_on_average():
    """The zoo's (sf)18 pattern and the fraction form put the same attention work in the model: per
    layer, the mean of a sliding and a full layer (one stage holding all layers)."""
    model = _gpt_oss()
    zoo = Predictor().registry.model("gpt-oss-120b")
    g = _geometry(4096.0)
    core = lambda m, kind: float(sum(np.asarray(o.flops)[0] for o in layer_operators(m, g, kind)  # noqa: E731
                                     if o.name == "core_attention"))
    mean = 0.5 * (core(zoo, "sliding_attention+moe") + core(zoo, "full_attention+moe"))
    assert np.isclose(mean, core(model, "moe"))


def test_notes_map_stated_moe_features(tmp_path):
    """Megatron-Core MoE model-zoo notes: "+1f1b overlap" -> ep_overlap, "recompute=full" -> full recompute,
    "recompute=norm, act" -> selective recompute of modules layernorm and moe_act."""
    from mofa_framework.api import Predictor
    from mofa_framework.validate import map_rows

    head = ("source_id,release,framework,task,model,system,gpu_type,num_gpus,precision,gbs,mbs,seq_len,fsdp,tp,pp,"
            "cp,vp,ep,etp,dp,ga,step_time_s,notes\n")
    rows = ['A,r,Megatron-Core,pretrain,Qwen3-235B-A22B,H100,H100,256,BF16,2048,1,4096,,2,8,1,4,32,1,16,128,17.6,'
            '"dispatcher=DeepEP; recompute=norm, act; +1f1b overlap"\n',
            'B,r,Megatron-Core,pretrain,Qwen3-235B-A22B,H100,H100,256,BF16,2048,4,4096,On,2,1,1,1,8,1,128,4,17.6,'
            'dispatcher=DeepEP; recompute=full; FSDP on\n']
    p = tmp_path / "moe.csv"
    p.write_text(head + "".join(rows))
    mapped, skipped = map_rows([p], Predictor().registry)
    assert not skipped
    a, b = (m.job["features"] for m in mapped)
    assert "ep_overlap" in a  # "recompute=norm, act" -> --recompute-modules layernorm moe_act
    assert a["recompute"] == {"granularity": "selective", "layernorm": True, "moe_act": True}
    assert b["recompute"] == {"granularity": "full"} and "fsdp" in b and "ep_overlap" not in b
