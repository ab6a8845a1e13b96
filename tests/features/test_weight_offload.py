"""Weight and optimizer-state offload to host memory (``weight_offload``): memory and transfer times
derived by hand from the feature's equations and the *off* prediction's engine state, and the
check against Calculon's published example (issue 18: 175B on 64 A100s, 20.3 GiB HBM + 40.5 GiB
host)."""

from __future__ import annotations

import numpy as np
import pytest

from mofa_framework.config import jobs_to_batch
from mofa_framework.decompose import layer_params
from mofa_framework.errors import ConfigError
from mofa_framework.testing.contract import assert_same_row
from mofa_framework.tuner import feature_choices
from mofa_framework.units import GIB

# Calculon's optimum for GPT-3 175B on 64 A100 80GB (`calculon llm models/gpt3-175B.json` with TP 4, PP 16,
# DP 1, micro-batch 1, fp16, full recompute, weight_offload + optimizer_offload): "Mem tier1 capacity
# requirement: 20.345 GiB; Mem tier2 capacity requirement: 40.504 GiB". Calculon keeps unsharded
# activations (no sequence parallelism) and the unfused attention of 2022.
CALCULON = {"model": {"name": "gpt3-175b"}, "hardware": {"name": "a100-sxm4-80gb", "num_gpus": 64},
            "parallel": {"tp": 4, "pp": 16, "micro_batch_size": 1, "global_batch_size": 1024, "sequence_length": 2048,
                         "precision": "fp16", "sequence_parallel": False, "flash_attention": False}}
FULL = {"recompute": {"granularity": "full"}}
CALCULON_HBM_GIB, CALCULON_HOST_GIB = 20.345, 40.504

# a small data-parallel case: llama3-8b, 16 H100s, TP 2, PP 2 -> DP 4, m = 8
DP_JOB = {"model": {"name": "llama3-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 16},
          "parallel": {"tp": 2, "pp": 2, "micro_batch_size": 1, "global_batch_size": 32, "sequence_length": 4096}}


def evaluate(pred, base, features):
    jobs = [pred.job({**base, "features": f}) for f in features]
    return pred.evaluate(jobs_to_batch(jobs, pred.registry), jobs[0].model, jobs[0].hardware)


def close(a, b, rel=1e-9):
    np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=rel, atol=1e-12)


def layer_params_per_gpu(pred, name, tp):
    lp = layer_params(pred.registry.model(name), "dense")
    return lp["sharded"] / tp + lp["replicated"]


# ------------------------------------------------------------------ Calculon's example


def test_calculon_175b_on_64_a100s(mofa_predictor):
    """Host: 2 + 2 + 12 bytes per parameter (fp16 weights and gradients, fp32 master and Adam) of the
    stage: 40.50 GiB on a middle stage = Calculon's 40.504 (its count has no embedding; the end stages
    hold the 157M-parameter embedding/head too: 42.8 GiB). HBM: two layers' weights, two layers'
    gradients, two layers' streamed optimizer states and the 16 in-flight micro-batches' layer
    inputs (6 layers × 16 × s·h·2 = 4.5 GiB) are Calculon's own terms to the byte; MoFa's peak adds its
    3 GiB reserve (CUDA context, allocator) and counts 0.8 GiB of working buffers where Calculon counts
    1.5 GiB of activation working space and activation gradients: 21.8 vs 20.3 GiB (+7 %)."""
    r = evaluate(mofa_predictor, CALCULON, [{**FULL, "weight_offload": {"optimizer": "gpu"}}])
    mem = r.state.mem
    P_mid = mem.dense_params[1, 0]
    close(mem.host_bytes[1, 0], 16.0 * P_mid)
    assert mem.host_bytes[1, 0] / GIB == pytest.approx(CALCULON_HOST_GIB, rel=5e-4)
    pl = layer_params_per_gpu(mofa_predictor, "gpt3-175b", 4)
    close(mem.weights_bytes[0, 0], 2 * pl * 2)       # running + prefetched layer
    close(mem.grads_bytes[0, 0], 2 * pl * 2)         # running layer's gradient + the one being sent
    close(mem.optimizer_bytes[0, 0], 2 * pl * 12)    # two layers' states streamed through the GPU (D = 1)
    close(mem.activations_bytes[0, 0], 6 * 16 * 2048 * 12288 * 2)
    assert mem.activations_bytes[0, 0] / GIB == pytest.approx(4.5)
    peak = r.peak_memory_gib[0]
    assert peak == pytest.approx(21.80, abs=0.01)
    assert peak - r.hardware.efficiency.reserved_memory_gib < CALCULON_HBM_GIB < peak


def test_frees_hbm_and_fills_the_host(mofa_predictor):
    r = evaluate(mofa_predictor, CALCULON, [{**FULL, "weight_offload": {}}, FULL])
    mem = r.state.mem
    close(mem.optimizer_bytes[:, 0], 0.0)  # optimizer = cpu: no states in HBM
    close(mem.host_bytes[:, 0], mem.weights_bytes[:, 1] + mem.grads_bytes[:, 1] + mem.optimizer_bytes[:, 1])
    assert r.peak_memory_gib[0] < r.peak_memory_gib[1] / 4


# ------------------------------------------------------------------ transfer times


def test_per_layer_transfers_without_prefetch_are_exposed(mofa_predictor):
    """Forward: H2D P_ℓ·2; backward: max(H2D P_ℓ·2, D2H P_ℓ·g), with the embedding/head's share
    (157M parameters on the 6-layer end stage) spread over the layers."""
    r = evaluate(mofa_predictor, CALCULON, [{**FULL, "weight_offload": {"prefetch": 0}}])
    hw = r.hardware
    rest = r.state.mem.dense_params[0, 0] - 6 * layer_params_per_gpu(mofa_predictor, "gpt3-175b", 4)
    p = layer_params_per_gpu(mofa_predictor, "gpt3-175b", 4) + rest / 6
    d = r.state.layers["dense"]
    close(d.offload_exposed_fwd_s[0], p * 2 / hw.h2d_bandwidth_bytes_per_s)
    close(d.offload_exposed_bwd_s[0], max(p * 2 / hw.h2d_bandwidth_bytes_per_s, p * 2 / hw.d2h_bandwidth_bytes_per_s))


def test_prefetch_hides_behind_the_layer(mofa_predictor):
    r = evaluate(mofa_predictor, DP_JOB, [{"weight_offload": {}}, {"weight_offload": {"prefetch": 0}}])
    d = r.state.layers["dense"]
    eff = r.hardware.efficiency
    f = d.fwd_s[0] - d.offload_exposed_fwd_s[0]
    link = d.offload_exposed_fwd_s[1]
    close(d.offload_exposed_fwd_s[0], max(eff.contention_compute * f, eff.contention_comm * link) - f)
    assert d.offload_exposed_fwd_s[0] < link


def test_step_update_on_cpu_and_on_gpu_at_dp_1(mofa_predictor):
    """D = 1: the CPU updates the host copy in place (no transfer): P/(R_cpu/G); the GPU update streams
    H2D g·P + 12·P and D2H 12·P + 2·P."""
    r = evaluate(mofa_predictor, CALCULON, [{**FULL, "weight_offload": {}}, {**FULL, "weight_offload": {"optimizer": "gpu"}},
                                            FULL])
    hw = r.hardware
    P = r.state.opt.dense_grad_bytes[2] / 2.0  # fp16: 2-byte gradients
    close(r.state.opt.host_s[0], P / (hw.host.cpu_optimizer_params_per_s / hw.gpus_per_node))
    close(r.state.opt.host_s[1], max((2 * P + 12 * P) / hw.h2d_bandwidth_bytes_per_s,
                                     (12 * P + 2 * P) / hw.d2h_bandwidth_bytes_per_s))
    close(r.state.opt.update_s[[0, 1]], [0.0, r.state.opt.update_s[2]])


def test_step_staging_with_data_parallelism(mofa_predictor):
    """D = 4: the host gradients go through the GPU for the reduce-scatter (H2D g·P), the reduced shard
    comes back for the CPU update (D2H g·P/D), the updated shard goes up (H2D 2·P/D) for the all-gather
    and the gathered weights come back (D2H 2·P); DP communication = RS + AG as the distributed optimizer."""
    r = evaluate(mofa_predictor, DP_JOB, [{"weight_offload": {}}, {"distributed_optimizer": {}}, {}])
    hw, o = r.hardware, r.state.opt
    P, D, g = o.dense_grad_bytes[2] / 4.0, 4, 4.0
    cpu = P / D / (hw.host.cpu_optimizer_params_per_s / hw.gpus_per_node)
    link = max((g * P + 2 * P / D) / hw.h2d_bandwidth_bytes_per_s, (g * P / D + 2 * P) / hw.d2h_bandwidth_bytes_per_s)
    close(o.host_s[0], link + cpu)
    close(o.dp_comm_s[0], o.dp_comm_s[1])


def test_shares_the_link_with_activation_offload(mofa_predictor):
    """One link: forward max(H2D weights, D2H activations); backward max(H2D weights + H2D activations,
    D2H gradients); written once (activation_offload's own exposure is replaced)."""
    r = evaluate(mofa_predictor, DP_JOB, [{"weight_offload": {"prefetch": 0}, "activation_offload": {}},
                                          {"weight_offload": {"prefetch": 0}}])
    hw = r.hardware
    d = r.state.layers["dense"]  # row 0: both features, row 1: weight_offload alone
    q = 1.0 - min(1.0, 2 / r.state.layout.total[0, 0])  # activation_offload's share, resident_layers = 2, v = 1
    s = d.act_saved_bytes[0]
    w_in = d.offload_exposed_fwd_s[1]  # the weights' H2D alone (prefetch 0: all exposed)
    close(d.offload_exposed_fwd_s[0], max(w_in, q * s / hw.d2h_bandwidth_bytes_per_s))
    grads_out = d.offload_exposed_bwd_s[1]  # = max(w_in, g·p/d2h) = g·p/d2h (g = 4 > 2)
    close(d.offload_exposed_bwd_s[0], max(w_in + q * s / hw.h2d_bandwidth_bytes_per_s, grads_out))


# ------------------------------------------------------------------ contracts


def test_host_memory_must_fit(mofa_predictor):
    """175B on 8 GPUs: 21.9B parameters per GPU × 16 bytes ≫ the profile's host memory per GPU."""
    job = mofa_predictor.job({**CALCULON, "hardware": {"name": "a100-sxm4-80gb", "num_gpus": 8},
                              "parallel": {**CALCULON["parallel"], "pp": 2},
                              "features": {**FULL, "weight_offload": {}}})
    with pytest.raises(ConfigError, match="features.weight_offload needs up to .* GiB of host memory"):
        mofa_predictor.predict(job)


def test_rows_with_the_feature_off_are_bit_identical(mofa_predictor):
    both = evaluate(mofa_predictor, DP_JOB, [{"weight_offload": {"optimizer": "gpu"}}, {}])
    alone = evaluate(mofa_predictor, DP_JOB, [{}])
    assert_same_row(both, 1, alone)
    assert both.peak_memory_bytes[0] < both.peak_memory_bytes[1]


def test_conflicts_and_tuning(mofa_predictor):
    reg = mofa_predictor.registry
    feat = reg.features["weight_offload"]
    assert set(feat.conflicts) == {"cpu_optimizer", "distributed_optimizer", "fsdp", "deepspeed_zero", "dp_overlap"}
    with pytest.raises(ConfigError):
        mofa_predictor.predict(mofa_predictor.job({**DP_JOB, "features": {"weight_offload": {}, "cpu_optimizer": {}}}))
    assert feat.tunable and [c and c["optimizer"] for c in feature_choices(reg, "weight_offload")] == \
        [None, "cpu", "gpu"]
    # Calculon's rule: at least three layers on every stage (llama3-8b: 32 layers; PP 16 leaves 2)
    jobs = [mofa_predictor.job({**DP_JOB, "hardware": {**DP_JOB["hardware"], "num_gpus": n},
                                "parallel": {**DP_JOB["parallel"], "pp": pp}}) for n, pp in ((16, 2), (32, 16))]
    batch = jobs_to_batch(jobs, reg)
    assert list(feat.applies(batch, jobs[0].model, jobs[0].hardware)) == [True, False]
    assert "--optimizer-cpu-offload" in feat.megatron_args(feat.options_type())
