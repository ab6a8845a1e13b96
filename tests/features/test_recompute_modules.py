"""Megatron-Core module-level selective recompute (``--recompute-modules``).

Expected bytes and times are derived by hand from the operator formulas of
``mofa_framework/decompose.py`` (the tensors each module keeps, the operators it re-runs)
and the *off* prediction's engine state, never by calling the plugin's transform.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mofa_framework.config import jobs_to_batch
from mofa_framework.decompose import ELEMENTWISE, GEMM, Op
from mofa_framework.engine import price_operators
from mofa_framework.errors import ConfigError
from mofa_framework.testing.contract import assert_same_row

REPO = Path(__file__).resolve().parents[2]

GPT = {"model": {"name": "gpt3-175b"}, "hardware": {"name": "a100-sxm4-80gb", "num_gpus": 128},
       "parallel": {"tp": 8, "pp": 8, "vpp": 3, "micro_batch_size": 1, "global_batch_size": 64,
                    "sequence_length": 2048, "flash_attention": False}}
MOE = {"model": {"name": "mixtral-8x7b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 64},
       "parallel": {"tp": 2, "pp": 4, "ep": 8, "micro_batch_size": 1, "global_batch_size": 256,
                    "sequence_length": 4096}}
DSV3 = {"model": {"name": "deepseek-v3"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 1024},
        "parallel": {"tp": 2, "pp": 8, "vpp": 4, "ep": 64, "etp": 1, "micro_batch_size": 1,
                     "global_batch_size": 8192, "sequence_length": 4096}}
DT = 2.0  # bf16 activations


def job(pred, features, base):
    return pred.job({**base, "features": features or {}})


def both(pred, features, base):
    """One batch of [on, off]."""
    jobs = [job(pred, features, base), job(pred, None, base)]
    return pred.evaluate(jobs_to_batch(jobs, pred.registry), jobs[0].model, jobs[0].hardware)


def close(a, b, rel=1e-9):
    np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=rel, atol=1e-12)


def rec(**modules):
    return {"recompute": {"granularity": "selective", **{m: True for m in modules}}}


def price(res, ops):
    """Engine price of hand-built operators on the batch's two rows."""
    return sum(price_operators(res.state.ctx, ops), np.zeros(2))


def ew(name, nbytes):
    nbytes = np.full(2, float(nbytes))
    return Op(name=name, kind=ELEMENTWISE, flops=nbytes / 2.0, bytes=nbytes, bwd_input=1.0, bwd_weight=0.0)


def gemm(name, m, n, k, count=1.0):
    """count equal GEMMs of m×n×k (a grouped GEMM: FLOPs and bytes are the group's total)."""
    f = lambda x: np.full(2, float(x))  # noqa: E731
    return Op(name=name, kind=GEMM, flops=f(2 * m * n * k * count), bytes=f((m * k + k * n + m * n) * DT * count),
              m=f(m), n=f(n), k=f(k), count=f(count))


# ------------------------------------------------------------------ layernorm (output-discarding)


def test_layernorm_drops_two_norm_outputs_and_reruns_two_norms(mofa_predictor):
    res = both(mofa_predictor, rec(layernorm=True), GPT)
    L = res.state.layers["dense"]
    s, b, h, t = 2048, 1, 12288, 8
    # QKV input and MLP input (the norms' outputs), sequence-parallel: 2 · 2·s·b·h/t bytes;
    # the attention core is not recomputed (only layernorm is listed)
    close(L.act_saved_bytes[0], L.act_saved_bytes[1] - 2 * DT * s * b * h / t)
    close(L.act_core_attn_bytes[0], L.act_core_attn_bytes[1])
    # each norm reads and writes s·b·h/t elements
    norm = ew("norm", 2 * DT * s * b * h / t)
    close(L.recompute_s[0], price(res, [norm, norm])[0])
    close(L.recompute_flops[0], 2 * (2 * DT * s * b * h / t) / 2)
    assert L.recompute_s[1] == 0.0


# ------------------------------------------------------------------ mlp (checkpointed dense MLP)


def test_mlp_drops_the_dense_mlp_and_reruns_it_with_its_tp_block(mofa_predictor):
    res = both(mofa_predictor, rec(mlp=True), GPT)
    L = res.state.layers["dense"]
    s, b, h, t, f = 2048, 1, 12288, 8, 4 * 12288
    # GELU MLP keeps fc1's output and the activation's output: 2 · 2·s·b·4h/t = 16·s·b·h/t bytes
    close(L.act_saved_bytes[0], L.act_saved_bytes[1] - 16 * s * b * h / t)
    close(L.act_working_bytes[0], max(L.act_working_bytes[1], 16 * s * b * h / t))
    ops = [gemm("fc1", s * b, f / t, h), ew("act", 2 * s * b * f / t * DT), gemm("fc2", s * b, h, f / t)]
    # plus the MLP block's TP all-gather/reduce-scatter: one of a dense layer's two TP blocks
    close(L.recompute_s[0], price(res, ops)[0] + 0.5 * L.tp_exposed_fwd_s[1])
    close(L.recompute_flops[0], 2 * 2 * s * b * f / t * h + 2 * s * b * f / t * DT / 2)


# ------------------------------------------------------------------ MoE modules (Mixtral: SwiGLU, 8 experts top-2)


def test_moe_act_drops_expert_activation_output(mofa_predictor):
    res = both(mofa_predictor, rec(moe_act=True), MOE)
    L = res.state.layers["moe"]
    s, fe, k, t = 4096, 14336, 2, 2
    etp = t  # MoE rows default ETP = TP
    routed = s / t * k * etp  # token-expert pairs on this GPU (sequence-parallel shard × ETP)
    close(L.act_saved_bytes[0], L.act_saved_bytes[1] - DT * routed * fe / etp)
    # SwiGLU reads the 2·fe gate/up output and writes fe
    close(L.recompute_s[0], price(res, [ew("expert_act", 3 * routed * fe / etp * DT)])[0])
    close(L.act_working_bytes[0], L.act_working_bytes[1])  # output-discarding: nothing re-materialised


def test_moe_drops_every_moe_tensor_and_reruns_router_dispatch_experts(mofa_predictor):
    res = both(mofa_predictor, rec(moe=True, moe_act=True), MOE)  # moe subsumes moe_act
    L = res.state.layers["moe"]
    s, h, fe, k, t, E, ep = 4096, 4096, 14336, 2, 2, 8, 8
    etp = t
    tok = s / t
    routed = tok * k * etp
    drop = DT * routed * h + DT * routed * 3 * fe / etp + 4.0 * tok * E
    close(L.act_saved_bytes[0], L.act_saved_bytes[1] - drop)
    close(L.act_working_bytes[0], max(L.act_working_bytes[1], drop))
    local = E / ep
    per_expert = routed / local
    ops = [gemm("router", tok, E, h), ew("router_topk", 4 * 4 * tok * E), ew("permute", 8 * tok * k * h * DT),
           gemm("expert_fc1", per_expert, 2 * fe / etp, h, local), gemm("expert_fc2", per_expert, h, fe / etp, local),
           ew("expert_act", 3 * routed * fe / etp * DT)]
    # kernel launches: router top-k 8, permute 6 + 2 with EP
    ops[1] = attrs.evolve(ops[1], kernels=np.full(2, 8.0))
    ops[2] = attrs.evolve(ops[2], kernels=np.full(2, 8.0))
    close(L.recompute_s[0], price(res, ops)[0] + L.ep_exposed_fwd_s[1])
    # attention untouched: no core-attention recompute
    close(L.act_core_attn_bytes[0], L.act_core_attn_bytes[1])


# ------------------------------------------------------------------ DeepSeek-V3: mla_up_proj + mlp (Megatron-Bridge H100 recipe)


def test_deepseek_v3_mla_up_proj_and_mlp(mofa_predictor):
    res = both(mofa_predictor, rec(mla_up_proj=True, mlp=True), DSV3)
    s, h, a, t = 4096, 7168, 128, 2
    dqk, dv, qr, kvr, f = 192, 128, 1536, 512, 18432
    qkv = DT * s * a * (2 * dqk + dv) / t  # Q, K, V after the up projections
    ups = [gemm("q_up", s, a * dqk / t, qr), gemm("kv_up", s, a * (128 + dv) / t, kvr)]
    M = res.state.layers["moe"]
    # MoE layers: only mla_up_proj applies (mlp is the dense MLP submodule)
    close(M.act_saved_bytes[0], M.act_saved_bytes[1] - qkv)
    close(M.recompute_s[0], price(res, ups)[0])
    D = res.state.layers["dense"]
    mlp = DT * s * 3 * f / t
    close(D.act_saved_bytes[0], D.act_saved_bytes[1] - qkv - mlp)
    mlp_ops = [gemm("fc1", s, 2 * f / t, h), ew("act", 3 * s * f / t * DT), gemm("fc2", s, h, f / t)]
    close(D.recompute_s[0], price(res, ups + mlp_ops)[0] + 0.5 * D.tp_exposed_fwd_s[1])
    assert res.peak_memory_bytes[0] < res.peak_memory_bytes[1]
    assert res.step_time_s[0] > res.step_time_s[1]


def test_shared_experts(mofa_predictor):
    res = both(mofa_predictor, rec(shared_experts=True), DSV3)
    s, h, t, fs = 4096, 7168, 2, 2048
    M = res.state.layers["moe"]
    close(M.act_saved_bytes[0], M.act_saved_bytes[1] - DT * s * 3 * fs / t)
    ops = [gemm("fc1", s, 2 * fs / t, h), ew("act", 3 * s * fs / t * DT), gemm("fc2", s, h, fs / t)]
    close(M.recompute_s[0], price(res, ops)[0])
    D = res.state.layers["dense"]
    close(D.act_saved_bytes[0], D.act_saved_bytes[1])  # dense layers have no shared experts
    assert D.recompute_s[0] == 0.0


# ------------------------------------------------------------------ defaults, core_attn, megatron_args


def test_no_modules_is_core_attention_and_core_attn_adds(mofa_predictor):
    plain = both(mofa_predictor, {"recompute": {"granularity": "selective"}}, GPT)
    core = both(mofa_predictor, rec(core_attn=True), GPT)
    for k in plain.breakdown:
        assert plain.breakdown[k][0] == core.breakdown[k][0], k
    assert plain.peak_memory_bytes[0] == core.peak_memory_bytes[0]
    combo = both(mofa_predictor, rec(core_attn=True, layernorm=True), GPT)
    P, C = plain.state.layers["dense"], combo.state.layers["dense"]
    s, b, h, t = 2048, 1, 12288, 8
    # [29] 34·s·b·h/t minus the two norm outputs (4·s·b·h/t)
    close(C.act_saved_bytes[0], 30 * s * b * h / t)
    norm = ew("norm", 2 * DT * s * b * h / t)
    close(C.recompute_s[0], P.recompute_s[0] + price(combo, [norm, norm])[0])


def _recompute_module():
    spec = importlib.util.spec_from_file_location("_recompute_plugin", REPO / "plugins" / "recompute.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("_recompute_plugin", mod)
    spec.loader.exec_module(mod)
    return mod


def test_megatron_args_emit_modules():
    mod = _recompute_module()
    O = mod.RecomputeOptions
    assert mod.megatron_args(O()) == ["--recompute-granularity", "selective"]
    assert mod.megatron_args(O(layernorm=True, moe_act=True)) == [
        "--recompute-granularity", "selective", "--recompute-modules", "moe_act", "layernorm"]
    assert mod.megatron_args(O(mla_up_proj=True, mlp=True)) == [
        "--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj", "mlp"]
    assert mod.megatron_args(O(granularity="full"))[:2] == ["--recompute-granularity", "full"]


# ------------------------------------------------------------------ off rows, peak memory


@pytest.mark.parametrize("base,mods", [(GPT, {"mlp": True}), (MOE, {"moe_act": True, "layernorm": True}),
                                       (DSV3, {"mla_up_proj": True, "mlp": True})])
def test_rows_with_feature_off_are_bit_identical(mofa_predictor, base, mods):
    res = both(mofa_predictor, rec(**mods), base)
    alone = mofa_predictor.evaluate(jobs_to_batch([job(mofa_predictor, None, base)], mofa_predictor.registry),
                                    res.state.ctx.model, res.state.ctx.hardware)
    assert_same_row(res, 1, alone)


_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mods=st.sets(st.sampled_from(_MODULES), min_size=1), model=st.sampled_from(["gpt-22b", "mixtral-8x7b",
                                                                                   "qwen3-30b-a3b", "deepseek-v3"]),
       tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2]), mbs=st.sampled_from([1, 2]),
       dp=st.sampled_from([1, 2, 4]), seq=st.sampled_from([1024, 4096]), flash=st.booleans())
def test_module_recompute_never_raises_peak(mofa_predictor, mods, model, tp, pp, mbs, dp, seq, flash):
    moe = model != "gpt-22b"
    par = {"tp": tp, "pp": pp, "micro_batch_size": mbs, "global_batch_size": dp * mbs * 2 * pp,
           "sequence_length": seq, "flash_attention": flash, "ep": min(8, tp * dp) if moe else 1}
    d = {"model": {"name": model}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": tp * pp * dp},
         "parallel": par}
    try:
        jobs = [mofa_predictor.job({**d, "features": rec(**dict.fromkeys(mods, True))}), mofa_predictor.job(d)]
        mofa_predictor.predict(jobs[1])
    except ConfigError:
        assume(False)
        return
    pred = mofa_predictor.evaluate(jobs_to_batch(jobs, mofa_predictor.registry), jobs[0].model, jobs[0].hardware)
    assert pred.peak_memory_bytes[0] <= pred.peak_memory_bytes[1] * (1 + 1e-12)
    assert pred.step_time_s[0] >= pred.step_time_s[1] * (1 - 1e-12)
