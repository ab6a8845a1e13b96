"""Fully sharded data parallelism (ZeRO-3 / FSDP), the bf16 gradient reduction of the distributed
optimizer, and the grouped-GEMM / collective pricing the MoE and FSDP rows depend on.

Expectations are derived by hand from the plugin's formula and the *off* prediction's engine
state, never by calling the plugin's transforms.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from mofa_framework.config import jobs_to_batch
from mofa_framework.decompose import ALL_GATHER, ALL_TO_ALL, REDUCE_SCATTER, Coll, layer_params
from mofa_framework.errors import MofaError

# llama3-8b, 32 H100s, TP 2, PP 1: D = 16 (two nodes), m = 32 / (16·1) = 2 micro-batches
JOB = {"model": {"name": "llama3-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 32},
       "parallel": {"tp": 2, "pp": 1, "micro_batch_size": 1, "global_batch_size": 32, "sequence_length": 4096}}
D, M, T = 16, 2, 2


def predict(pred, features):
    jobs = [pred.job({**JOB, "features": f}) for f in features]
    return pred.evaluate(jobs_to_batch(jobs, pred.registry), jobs[0].model, jobs[0].hardware)


def close(a, b, rel=1e-9):
    np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=rel, atol=1e-12)


def layer_shard(pred):
    lp = layer_params(pred.registry.model("llama3-8b"), "dense")
    return lp["sharded"] / T + lp["replicated"]


def price(ctx, kind, nbytes):
    return ctx.collective_s(Coll(name="x", parallel="dp", kind=kind, bytes=np.full(2, nbytes),
                                 group_size=np.full(2, float(D)), stride=np.full(2, float(T))))[0]


def test_fsdp_memory_is_18_over_d_plus_gathered_layers(mofa_predictor):
    both = predict(mofa_predictor, [{"fsdp": {}}, {}])
    mem = both.state.mem
    P = mem.dense_params[0, 0] + mem.expert_params[0, 0]
    pl = layer_shard(mofa_predictor)
    close(mem.weights_bytes[0, 0], 2.0 * P / D)
    close(mem.grads_bytes[0, 0], 4.0 * P / D)
    close(mem.optimizer_bytes[0, 0], 12.0 * P / D)
    # running + one prefetched layer of bf16 parameters; the root unit (llama3-8b's untied embedding
    # and output layer, 2·V·h/T = 2·128256·4096/2 parameters on the one stage) gathered in bf16 from
    # forward to backward; and the larger unit's fp32 gradient (the root's: 262.7M > a layer's)
    root = 2 * 128256 * 4096 / T
    assert root > pl
    close(mem.buffers_bytes[0, 0] - mem.buffers_bytes[0, 1], 2 * pl * 2.0 + root * 2.0 + root * 4.0)
    assert both.peak_memory_gib[0] < both.peak_memory_gib[1]
    # without resharding the gathered weights stay: unsharded weights, no parameter buffer
    keep = predict(mofa_predictor, [{"fsdp": {"reshard_after_forward": False}}, {}]).state.mem
    close(keep.weights_bytes[0, 0], 2.0 * P)
    close(keep.buffers_bytes[0, 0] - keep.buffers_bytes[0, 1], root * 4.0)


def test_fsdp_layer_communication_without_prefetch_is_all_exposed(mofa_predictor):
    both = predict(mofa_predictor, [{"fsdp": {"prefetch": 0}}, {}])
    ctx = both.state.ctx
    pl = layer_shard(mofa_predictor)
    ag, rs = price(ctx, ALL_GATHER, pl * 2.0), price(ctx, REDUCE_SCATTER, pl * 4.0)
    dense = both.state.layers["dense"]
    close(dense.dp_fwd_s[0], ag)
    close(dense.dp_bwd_s[0], ag + rs)  # gathered again in backward, gradients scattered
    close(dense.dp_exposed_fwd_s[0] + dense.dp_exposed_bwd_s[0], 2 * ag + rs)
    L = mofa_predictor.registry.model("llama3-8b").num_layers
    close(both.breakdown["dp_layer_comm"][0], M * L * (2 * ag + rs), rel=1e-6)
    assert both.breakdown["dp_layer_comm"][1] == 0.0
    # the per-step all-reduce is gone: only the embedding and head are reduced once per step —
    # 2·128,256·4,096 = 1.05e9 of Llama 3 8B's 8.03e9 parameters (13 %), so well under a fifth of
    # the full all-reduce (a measured collective curve is not linear in the size: not exactly 13 %)
    assert both.state.opt.dp_comm_s[0] < both.state.opt.dp_comm_s[1] / 5


def test_fsdp_prefetch_hides_behind_the_layer_compute(mofa_predictor):
    both = predict(mofa_predictor, [{"fsdp": {}}, {"fsdp": {"prefetch": 0}}])
    d = both.state.layers["dense"]
    hw = both.hardware.efficiency
    a, b = hw.contention_compute, hw.contention_comm
    f, bw = d.fwd_compute_s[0], d.bwd_input_s[0] + d.bwd_weight_s[0]
    close(d.dp_exposed_fwd_s[0], max(a * f, b * d.dp_fwd_s[0]) - f)
    close(d.dp_exposed_bwd_s[0], max(a * bw, b * d.dp_bwd_s[0]) - bw)
    assert both.step_time_s[0] < both.step_time_s[1]


def test_fsdp_backward_collectives_hide_behind_the_recomputed_forward(mofa_predictor):
    # full recompute re-runs the layer's forward inside its backward, with the parameters already
    # gathered: the backward gather and scatter overlap B + W + R, not B + W alone
    both = predict(mofa_predictor, [{"fsdp": {}, "recompute": {"granularity": "full"}},
                                    {"fsdp": {}}])
    d = both.state.layers["dense"]
    hw = both.hardware.efficiency
    a, b = hw.contention_compute, hw.contention_comm
    r = d.recompute_s[0]
    assert r > 0 and d.recompute_s[1] == 0.0
    close(d.dp_bwd_s[0], d.dp_bwd_s[1])
    window = d.bwd_input_s[0] + d.bwd_weight_s[0] + r
    close(d.dp_exposed_bwd_s[0], max(a * window, b * d.dp_bwd_s[0]) - window)


def test_fsdp_bf16_gradient_reduction_halves_the_scatter(mofa_predictor):
    both = predict(mofa_predictor, [{"fsdp": {"grad_reduce_dtype": "bf16", "prefetch": 0}}, {"fsdp": {"prefetch": 0}}])
    pl = layer_shard(mofa_predictor)
    ctx = both.state.ctx
    d = both.state.layers["dense"]
    close(d.dp_bwd_s[0], price(ctx, ALL_GATHER, pl * 2.0) + price(ctx, REDUCE_SCATTER, pl * 2.0))
    close(both.state.mem.grads_bytes[0, 0], both.state.mem.grads_bytes[0, 1] / 2)


def test_fsdp_conflicts_and_arguments(mofa_predictor):
    feat = mofa_predictor.registry.features["fsdp"]
    assert set(feat.conflicts) == {"distributed_optimizer", "cpu_optimizer"}
    # current Megatron-LM's flag (--use-custom-fsdp is deprecated) and the checkpoint format it asserts
    assert feat.megatron_args(feat.options_type()) == ["--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor",
                                                       "--data-parallel-sharding-strategy", "optim_grads_params"]
    assert "--grad-reduce-in-bf16" in feat.megatron_args(feat.options_type(grad_reduce_dtype="bf16"))
    with pytest.raises(MofaError):
        predict(mofa_predictor, [{"fsdp": {}, "distributed_optimizer": {}}])
    batch = jobs_to_batch([mofa_predictor.job(JOB)], mofa_predictor.registry)
    assert feat.applies(batch, mofa_predictor.registry.model("llama3-8b"), None).all()
    single = jobs_to_batch([mofa_predictor.job({**JOB, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 2},
                                                "parallel": {**JOB["parallel"], "global_batch_size": 2}})],
                           mofa_predictor.registry)
    assert not feat.applies(single, mofa_predictor.registry.model("llama3-8b"), None).any()


def test_distributed_optimizer_bf16_gradient_reduction(mofa_predictor):
    both = predict(mofa_predictor, [{"distributed_optimizer": {"grad_reduce_dtype": "bf16"}},
                                    {"distributed_optimizer": {}}])
    ctx, opt = both.state.ctx, both.state.opt
    P = opt.dense_grad_bytes[1] / 4.0
    close(opt.dp_comm_s[0], price(ctx, REDUCE_SCATTER, P * 2.0) + price(ctx, ALL_GATHER, P * 2.0))
    close(opt.dp_comm_s[1], price(ctx, REDUCE_SCATTER, P * 4.0) + price(ctx, ALL_GATHER, P * 2.0))
    close(both.state.mem.grads_bytes[:, 0], both.state.mem.grads_bytes[:, 1] / 2)
    feat = mofa_predictor.registry.features["distributed_optimizer"]
    assert feat.megatron_args(feat.options_type(grad_reduce_dtype="bf16")) == [
        "--use-distributed-optimizer", "--grad-reduce-in-bf16"]


# ------------------------------------------------------------------ pricing the MoE / FSDP rows rely on


def test_grouped_gemm_sees_each_experts_size(mofa_predictor):
    from mofa_framework.batch import OperatorBatch
    from mofa_plugins.roofline import operator_seconds

    hw = mofa_predictor.registry.hardware_profile("h100-sxm5-80gb")
    hw = attrs.evolve(hw, efficiency=attrs.evolve(hw.efficiency, gemm_half_efficiency_s=1e-5, kernel_launch_s=3e-6,
                                                  gemm_half_dim=0.0, gemm_half_dim_k=0.0, host_dispatch_s=0.0))
    f = 2.0 * 512 * 2048 * 4096  # one expert's GEMM
    ops = OperatorBatch(flops=[8 * f, 8 * f], bytes=[0.0, 0.0], kind=[0, 0], precision=[0, 0], gemm_m=[512, 4096],
                        gemm_n=[2048, 2048], gemm_k=[4096, 4096], count=np.array([8.0, 1.0]))
    t = operator_seconds(ops, hw)
    peak = hw.peak_flops_per_s("bf16") * hw.efficiency.gemm_efficiency
    half = 1e-5 * hw.peak_flops_per_s("bf16")
    close(t[0], 8 * f / (peak * f / (f + half)) + 3e-6)  # eight GEMMs of size f, one launch
    close(t[1], 8 * f / (peak * 8 * f / (8 * f + half)) + 3e-6)
    assert t[0] > t[1]


def test_cross_domain_rings_and_all_to_all(mofa_predictor):
    from mofa_framework.batch import CollectiveBatch
    from mofa_plugins.collectives import collective_seconds

    hw = mofa_predictor.registry.hardware_profile("h100-sxm5-80gb")
    e = hw.efficiency
    up = hw.scaleup_bandwidth_bytes_per_s * e.scaleup_bus_efficiency
    out = hw.scaleout_bandwidth_bytes_per_s * e.scaleout_bus_efficiency * (1 - e.bandwidth_decay_per_doubling)
    lat = e.scaleout_latency_us * 1e-6
    S = 1e9
    # 16 ranks on 2 nodes, 8 per node: the ring's crossings spread over 8 NICs (capped by NVLink);
    # the all-to-all sends 7/16 over NVLink and 8/16 over the NIC at the same time
    c = CollectiveBatch(kind=[1, ALL_TO_ALL, 1], bytes=[S, S, S], group_size=[16, 16, 16], nodes=[2, 2, 16])
    t = collective_seconds(c, hw)
    close(t[0], 15 / 16 * S / min(up, 8 * out) + 15 * lat)
    close(t[1], max(7 / 16 * S / up, 8 / 16 * S / out) / e.alltoall_relative_efficiency + lat)
    out16 = hw.scaleout_bandwidth_bytes_per_s * e.scaleout_bus_efficiency * (1 - e.bandwidth_decay_per_doubling) ** 4
    close(t[2], 15 / 16 * S / out16 + 15 * lat)  # one rank per node: the NIC alone


def test_alltoall_relative_efficiency_slows_only_all_to_alls(mofa_predictor):
    """An all-to-all's bandwidth terms divide by ``alltoall_relative_efficiency``; its latency and
    every other collective are unchanged."""
    from mofa_framework.batch import CollectiveBatch
    from mofa_plugins.collectives import collective_seconds

    hw = mofa_predictor.registry.hardware_profile("h100-sxm5-80gb")
    e = attrs.evolve(hw.efficiency, alltoall_relative_efficiency=1.0)
    one, half = attrs.evolve(hw, efficiency=e), attrs.evolve(hw, efficiency=attrs.evolve(e, alltoall_relative_efficiency=0.5))
    c = CollectiveBatch(kind=[ALL_TO_ALL, ALL_TO_ALL, 0, 1], bytes=[1e9] * 4, group_size=[8, 16, 16, 16],
                        nodes=[1, 2, 2, 2])
    t1, t2 = collective_seconds(c, one), collective_seconds(c, half)
    lat_up, lat_out = e.scaleup_latency_us * 1e-6, e.scaleout_latency_us * 1e-6
    close(t2[0] - lat_up, 2.0 * (t1[0] - lat_up))
    close(t2[1] - lat_out, 2.0 * (t1[1] - lat_out))
    close(t2[2:], t1[2:])
