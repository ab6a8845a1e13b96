"""CUDA graphs: captured operators lose the host-dispatch floor. Expected values derived here."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mofa_framework.config import jobs_to_batch
from mofa_framework.decompose import layer_operators
from mofa_framework.engine import price_operators

# Qwen3-30B-A3B on B200 at micro-batch 1: router, top-k and permutation are host-bound
BASE = {"model": {"name": "qwen3-30b-a3b"}, "hardware": {"name": "b200-sxm-180gb", "num_gpus": 64},
        "parallel": {"tp": 1, "pp": 1, "ep": 8, "micro_batch_size": 1, "global_batch_size": 512,
                     "sequence_length": 4096}}
HOST_S = 1.0e-4


def _hw(pred, host_s=HOST_S):
    hw = pred.registry.hardware_profile("b200-sxm-180gb")
    return attrs.evolve(hw, efficiency=attrs.evolve(hw.efficiency, host_dispatch_s=host_s))


def _evaluate(pred, features_list, hw):
    jobs = [pred.job({**BASE, "features": f}) for f in features_list]
    return pred.evaluate(jobs_to_batch(jobs, pred.registry), jobs[0].model, hw)


def close(a, b, rel=1e-9):
    np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=rel, atol=1e-12)


def test_full_iteration_prices_the_layers_without_the_host_floor(mofa_predictor):
    hw = _hw(mofa_predictor)
    on = _evaluate(mofa_predictor, [{"cuda_graphs": {}}, {}], hw)
    free = _evaluate(mofa_predictor, [{}], _hw(mofa_predictor, 0.0))
    L, F = on.state.layers["moe"], free.state.layers["moe"]
    for field in ("fwd_compute_s", "bwd_input_s", "bwd_weight_s", "expert_fwd_s", "tp_gemm_fwd_s", "attn_fwd_s"):
        close(getattr(L, field)[0], getattr(F, field)[0])
    assert L.fwd_compute_s[0] < L.fwd_compute_s[1]  # the floor binds on this layer
    assert on.step_time_s[0] < on.step_time_s[1]


def test_per_module_router_only_removes_the_router_floor(mofa_predictor):
    """Only the router GEMM and its top-k kernels lose the floor: Δfwd = Σ over those two ops of
    t(no host) − t, and the backward moves by the same ops' backward multiples."""
    hw = _hw(mofa_predictor)
    only_router = {"scope": "per_module", "attn": False, "mlp": False, "moe_router": True, "moe_preprocess": False}
    pred = _evaluate(mofa_predictor, [{"cuda_graphs": only_router}, {}], hw)
    ctx = pred.state.ctx
    ops = [o for o in layer_operators(ctx.model, ctx.geometry, "moe") if o.group == "router"]
    assert [o.name for o in ops] == ["router", "router_topk"]
    t = price_operators(ctx, ops)
    t0 = price_operators(attrs.evolve(ctx, hardware=_hw(mofa_predictor, 0.0)), ops)
    d_fwd = sum(a[0] - b[0] for a, b in zip(t0, t))
    d_bwd = sum((a[0] - b[0]) * o.bwd_input for a, b, o in zip(t0, t, ops))
    assert d_fwd < 0
    L = pred.state.layers["moe"]
    close(L.fwd_compute_s[0] - L.fwd_compute_s[1], d_fwd)
    close(L.bwd_input_s[0] - L.bwd_input_s[1], d_bwd)
    close(L.expert_fwd_s[0], L.expert_fwd_s[1])  # the router is not in the expert group


def test_no_host_floor_no_effect(mofa_predictor):
    pred = _evaluate(mofa_predictor, [{"cuda_graphs": {}}, {}], _hw(mofa_predictor, 0.0))
    assert pred.step_time_s[0] == pred.step_time_s[1]
    assert pred.peak_memory_gib[0] == pred.peak_memory_gib[1]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(host_s=st.floats(0.0, 2e-4), mbs=st.sampled_from([1, 2, 4]), scope=st.sampled_from(["full_iteration", "per_module"]))
def test_graphs_never_slower(mofa_predictor, host_s, mbs, scope):
    hw = _hw(mofa_predictor, host_s)
    jobs = [mofa_predictor.job({**BASE, "parallel": {**BASE["parallel"], "micro_batch_size": mbs}, "features": f})
            for f in ({"cuda_graphs": {"scope": scope}}, {})]
    pred = mofa_predictor.evaluate(jobs_to_batch(jobs, mofa_predictor.registry), jobs[0].model, hw)
    assert pred.step_time_s[0] <= pred.step_time_s[1] * (1 + 1e-12)


@pytest.mark.parametrize("options, args", [
    ({}, ["--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration"]),
    ({"scope": "per_module", "mlp": False},
     ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn", "moe_router", "moe_preprocess"]),
])
def test_megatron_arguments(options, args):
    from mofa_plugins.cuda_graphs import FEATURE, CudaGraphsOptions

    assert FEATURE.megatron_args(CudaGraphsOptions(**options)) == args
