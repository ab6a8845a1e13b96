"""Memory terms that make a predicted peak comparable with a published one: the loss's logits
(Megatron's fused loss and PyTorch's fp32-upcast one, eager or compiled), torchtitan's per-op
activation checkpointing, the transient max of the loss and a recomputed layer, the runtime's memory
outside the allocator, and which counter a published figure reads. Every expected value is derived
by hand from the formula's source (named per test), never by calling the code under test."""

from __future__ import annotations

import numpy as np
import pytest

from mofa_framework.config import jobs_to_batch
from mofa_framework.measurements import builtin_data_dir, map_rows
from mofa_framework.units import GIB
from mofa_framework.validate import compared_memory_gib

# llama3-8b (h 4096, 32 heads of 128, 8 KV heads, SwiGLU f 14336, vocabulary 128256, untied), one
# H100, one micro-batch of 4096 tokens: T = 4096, t = 1, flash attention
JOB = {"model": {"name": "llama3-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 1},
       "parallel": {"tp": 1, "pp": 1, "micro_batch_size": 1, "global_batch_size": 1, "sequence_length": 4096}}
T, V, H, A, D_HEAD, KV, F = 4096, 128256, 4096, 32, 128, 8, 14336


def predict(pred, features, gpus=1, **parallel):
    jobs = [pred.job({**JOB, "hardware": {**JOB["hardware"], "num_gpus": gpus},
                      "parallel": {**JOB["parallel"], **parallel}, "features": f}) for f in features]
    return pred.evaluate(jobs_to_batch(jobs, pred.registry), jobs[0].model, jobs[0].hardware)


def close(a, b, rel=1e-9):
    np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=rel)


def test_fused_loss_keeps_six_bytes_per_logit(mofa_predictor):
    # Megatron's vocab-parallel cross entropy: bf16 logits (2) + their fp32 copy / softmax (4)
    out = predict(mofa_predictor, [{}])
    close(out.state.mem.logits_bytes[0, 0], T * V * 6.0)
    close(out.memory_breakdown["logits_loss"][0], T * V * 6.0)
    # with TP 2 each rank holds half the vocabulary
    two = mofa_predictor.job({**JOB, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 2},
                              "parallel": {**JOB["parallel"], "tp": 2}})
    tp = mofa_predictor.evaluate(jobs_to_batch([two], mofa_predictor.registry), two.model, two.hardware)
    close(tp.state.mem.logits_bytes[0, 0], T * V / 2 * 6.0)


def test_fp32_cross_entropy_eager_twelve_compiled_four(mofa_predictor):
    # F.cross_entropy(logits.float()): saved log_softmax (4) + nll_loss's dense gradient (4) +
    # log_softmax_backward's result (4) = 12 at the backward; compiled (Inductor): bf16 logits (2) +
    # the bf16 gradient (2) = 4
    out = predict(mofa_predictor, [{}, {"fp32_cross_entropy": {}}, {"fp32_cross_entropy": {"compiled": True}}])
    close(out.memory_breakdown["logits_loss"], [T * V * 6.0, T * V * 12.0, T * V * 4.0])
    # the loss term is all that changes, and the peak by exactly the difference (it exceeds the
    # recomputed layer's working set, which is 0 without recompute)
    close(out.peak_memory_bytes[1] - out.peak_memory_bytes[0], T * V * 6.0)
    close(out.step_time_s[1], out.step_time_s[0])


def test_op_checkpointing_keeps_every_other_matmul(mofa_predictor):
    # torchtitan's per-op policy: layer input h and the outputs of wq (a·d), wv (kv·d), the attention
    # (a·d) with its fp32 log-sum-exp (4·a per token), w1 (f) and w2 (h), bf16
    per_token = 2.0 * (H + A * D_HEAD + KV * D_HEAD + A * D_HEAD + F + H) + 4.0 * A
    out = predict(mofa_predictor, [{"recompute": {"granularity": "op"}}, {}])
    layers = out.state.layers["dense"]
    close(layers.act_saved_bytes[0], T * per_token)
    # re-run: wk, wo, w3's share of the GEMM FLOPs, 1 − (q + v + 2f)/(2q + 2v + 3f)
    q, v = A * D_HEAD, KV * D_HEAD
    share = 1.0 - (q + v + 2 * F) / (2 * q + 2 * v + 3 * F)
    gemm_flops = 2.0 * T * H * (q + 2 * v + q) + 2.0 * T * H * 3 * F  # QKV, O, SwiGLU's three
    close(layers.recompute_flops[0], share * gemm_flops)
    # the working set while a layer runs backward: what it dropped (the no-recompute layer's rest)
    close(layers.act_working_bytes[0], out.state.layers["dense"].act_saved_bytes[1] - T * per_token)


def test_op_checkpointing_runs_the_forward_all_gathers_again(mofa_predictor):
    # torchtitan's save list keeps reduce-scatters' outputs, not all-gathers': with TP and sequence
    # parallelism each layer's backward repeats the forward's all-gathers — half its TP communication
    # (one all-gather and one reduce-scatter of the same activation per sublayer); without sequence
    # parallelism the all-reduces, all of it. Nothing else of the TP communication changes.
    for sp, share in ((True, 0.5), (False, 1.0)):
        out = predict(mofa_predictor, [{"recompute": {"granularity": "op"}}, {}], gpus=8, tp=8,
                      sequence_parallel=sp)
        L = out.state.layers["dense"]  # row 0: per-op checkpointing, row 1: none
        assert L.tp_fwd_s[1] > 0
        close(L.tp_bwd_s[0], L.tp_bwd_s[1] + share * L.tp_fwd_s[1])
        close(L.tp_exposed_bwd_s[0], L.tp_exposed_bwd_s[1] + share * L.tp_fwd_s[1])
        close(L.tp_fwd_s[0], L.tp_fwd_s[1])
    # and no TP communication to repeat at TP 1
    one = predict(mofa_predictor, [{"recompute": {"granularity": "op"}}, {}]).state.layers["dense"]
    close(one.tp_bwd_s, [0.0, 0.0])


def test_peak_counts_the_larger_of_loss_and_recomputed_layer(mofa_predictor):
    out = predict(mofa_predictor, [{"recompute": {"granularity": "full"}}])
    mem = out.state.mem
    logits, work = mem.logits_bytes[0, 0], mem.working_bytes[0, 0]
    assert logits > 0 and work > 0
    bd = {k: v[0] for k, v in out.memory_breakdown.items()}
    close(bd["logits_loss"] + bd["recompute_working"], max(logits, work))
    close(bd["runtime"], out.hardware.efficiency.reserved_memory_gib * GIB)
    close(sum(v for k, v in bd.items() if k != "host"), out.peak_memory_bytes[0])


def test_allocator_counters_leave_out_the_runtime():
    arrays = {"memory_gib": np.array([50.0]), "runtime_gib": np.array([3.0])}

    class Row:  # the two fields compared_memory_gib reads
        def __init__(self, counter):
            self.memory_counter = counter

    assert compared_memory_gib(arrays, 0, Row("reserved")) == 47.0
    assert compared_memory_gib(arrays, 0, Row("allocated")) == 47.0
    assert compared_memory_gib(arrays, 0, Row("device")) == 50.0
    assert compared_memory_gib(arrays, 0, Row("")) == 50.0


@pytest.mark.parametrize("row_id, counter, loss, recompute", [
    ("TT-001", "reserved", {}, "op"),                   # 2024 torchtitan: loss compile commented out
    ("TT-002", "reserved", {}, "op"),                   # ... even with torch.compile on
    ("TT-004", "reserved", {}, "full"),
    ("TT-031", "reserved", {"compiled": True}, "op"),   # 2025 components/loss.py compiles it
])
def test_torchtitan_rows_read_reserved_memory_and_its_loss(mofa_predictor, row_id, counter, loss, recompute):
    mapped, _ = map_rows([builtin_data_dir() / "torchtitan_benchmarks.csv"], mofa_predictor.registry)
    row = next(m for m in mapped if m.row_id == row_id)
    assert row.memory_counter == counter
    assert row.job["features"]["fp32_cross_entropy"] == loss
    assert row.job["features"]["recompute"]["granularity"] == recompute


def test_zero_bubble_rows_state_no_counter(mofa_predictor):
    mapped, _ = map_rows([builtin_data_dir() / "zero_bubble.csv"], mofa_predictor.registry)
    assert {m.memory_counter for m in mapped} == {""}
    assert all("fp32_cross_entropy" not in m.job["features"] for m in mapped)
