"""The overlap strategies [20]–[24] and kernel scaling [17][18].

Each expected value is derived here, by hand, from the paper equation and the chunk times
of the feature-off prediction's state — never by calling the plugin's own code.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mofa_framework.cli import cli
from mofa_framework.config import jobs_to_batch
from mofa_framework.errors import ConfigError
from mofa_framework.types import CostTransform, OverlapStrategy, Phase

OVERLAPS = ("tp_overlap", "cp_overlap", "ep_overlap", "pp_overlap", "dp_overlap")
DENSE = {"model": {"name": "llama3-70b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 64},
         "parallel": {"tp": 8, "pp": 2, "vpp": 2, "micro_batch_size": 1, "global_batch_size": 64,
                      "sequence_length": 4096}}
CP = {**DENSE, "parallel": {"tp": 8, "pp": 2, "cp": 2, "micro_batch_size": 1, "global_batch_size": 64,
                            "sequence_length": 8192}}
MOE = {"model": {"name": "mixtral-8x7b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 64},
       "parallel": {"tp": 2, "pp": 2, "ep": 8, "micro_batch_size": 1, "global_batch_size": 128,
                    "sequence_length": 4096}}
#: the configuration each feature is checked on (one where it has something to do)
CONFIG = {"tp_overlap": DENSE, "cp_overlap": CP, "pp_overlap": DENSE, "dp_overlap": DENSE, "kernel_scaling": DENSE,
          # Megatron-Core overlaps the MoE all-to-all at PP > 1 only in the interleaved schedule
          "ep_overlap": {**MOE, "parallel": {**MOE["parallel"], "vpp": 2}}}
ON_OPTIONS = {"tp_overlap": {"chunks": 4}, "kernel_scaling": {"compute_factor": 1.25, "bandwidth_factor": 2.0}}


def make_job(predictor, base, features=None, name="job"):
    return predictor.job({**base, "features": features or {}}, name=name)


def evaluate(predictor, base, features=None):
    """The engine's Prediction (with its CostState) for one job."""
    job = make_job(predictor, base, features)
    return predictor.evaluate(jobs_to_batch([job], predictor.registry), job.model, job.hardware), job


def coefficients(job):
    eff = job.hardware.efficiency
    return eff.contention_compute, eff.contention_comm


def f0(x) -> float:
    return float(np.asarray(x)[0])


def assert_memory_unchanged(on, off):
    assert np.array_equal(on.peak_memory_bytes, off.peak_memory_bytes)
    for k in off.memory_breakdown:
        assert np.array_equal(on.memory_breakdown[k], off.memory_breakdown[k]), k


# ------------------------------------------------------------------ registration


def test_registered_with_types_options_and_order(mofa_predictor):
    reg = mofa_predictor.registry
    for name in OVERLAPS:
        assert isinstance(reg.features[name], OverlapStrategy)
        assert reg.features[name].equation.startswith("[2")
    assert isinstance(reg.features["kernel_scaling"], CostTransform)
    chunks = attrs.fields_dict(reg.features["tp_overlap"].options_type)["chunks"]
    assert chunks.default == 4 and chunks.metadata["search"] == (2, 4, 8)
    layer = [f.name for f in reg.features_in_phase(Phase.layer)]
    assert layer.index("kernel_scaling") < min(layer.index(n) for n in ("tp_overlap", "cp_overlap", "ep_overlap"))
    opt = [f.name for f in reg.features_in_phase(Phase.optimizer)]
    assert opt.index("kernel_scaling") < opt.index("dp_overlap")
    if "distributed_optimizer" in opt:
        assert opt.index("distributed_optimizer") < opt.index("kernel_scaling")


@pytest.mark.parametrize("features", [{"tp_overlap": {"chunks": 0}}, {"cp_overlap": {"contention_comm": 0.5}},
                                      {"kernel_scaling": {"compute_factor": 0.5}},
                                      {"ep_overlap": {"hide_with": "router"}}])
def test_bad_options_are_config_errors(mofa_predictor, features):
    with pytest.raises(ConfigError):
        make_job(mofa_predictor, DENSE, features)


# ------------------------------------------------------------------ each equation by hand


def test_tp_overlap_eq20(mofa_predictor):
    off, job = evaluate(mofa_predictor, DENSE)
    on, _ = evaluate(mofa_predictor, DENSE, {"tp_overlap": {"method": "chunked", "chunks": 4}})
    a, b = coefficients(job)
    n = 4
    saved = 0.0
    for d in ("fwd", "bwd"):
        lc = off.state.layers["dense"]
        c, m = f0(getattr(lc, f"tp_gemm_{d}_s")), f0(getattr(lc, f"tp_{d}_s"))
        assert m > 0 and c > 0
        total = b * m / n + (n - 1) * max(a * c / n, b * m / n) + a * c / n
        got = f0(getattr(on.state.layers["dense"], f"tp_exposed_{d}_s"))
        assert got == pytest.approx(total - c, rel=1e-12)
        saved += f0(getattr(lc, f"tp_exposed_{d}_s")) - got
        # only the exposed TP field moves
        assert f0(getattr(on.state.layers["dense"], f"tp_{d}_s")) == m
    assert np.array_equal(on.state.layers["dense"].fwd_compute_s, off.state.layers["dense"].fwd_compute_s)
    # m = 64 / (DP 4 · mbs 1) = 16 micro-batches of 40 layers on the critical stage
    assert f0(on.breakdown["tp_comm"]) == pytest.approx(f0(off.breakdown["tp_comm"]) - 16 * 40 * saved, rel=1e-12)
    assert f0(on.step_time_s) < f0(off.step_time_s)
    assert_memory_unchanged(on, off)


def test_cp_overlap_eq21(mofa_predictor):
    off, job = evaluate(mofa_predictor, CP)
    on, _ = evaluate(mofa_predictor, CP, {"cp_overlap": {}})
    a, b = coefficients(job)
    c = 2  # cp
    saved = 0.0
    for d in ("fwd", "bwd"):
        lc = off.state.layers["dense"]
        attn, p2p = f0(getattr(lc, f"attn_{d}_s")), f0(getattr(lc, f"cp_{d}_s"))
        assert attn > 0 and p2p > 0
        steps = [max(a * attn / c, b * p2p / (c - 1)) for _ in range(c - 1)]
        total = sum(steps) + a * attn / c
        got = f0(getattr(on.state.layers["dense"], f"cp_exposed_{d}_s"))
        assert got == pytest.approx(total - attn, rel=1e-12)
        saved += p2p - got
    # DP = 64 / (8·2·2) = 2: m = 32 micro-batches of 40 layers
    assert f0(on.breakdown["cp_comm"]) == pytest.approx(f0(off.breakdown["cp_comm"]) - 32 * 40 * saved, rel=1e-12)
    assert f0(on.step_time_s) < f0(off.step_time_s)
    assert_memory_unchanged(on, off)


@pytest.mark.parametrize("hide_with", ["layer", "experts"])
def test_ep_overlap_eq22(mofa_predictor, hide_with):
    off, job = evaluate(mofa_predictor, MOE)
    on, _ = evaluate(mofa_predictor, MOE, {"ep_overlap": {"hide_with": hide_with}})
    a, b = coefficients(job)
    lc = off.state.layers["moe"]
    if hide_with == "layer":
        fwd_comp, bwd_comp = f0(lc.fwd_compute_s), f0(lc.bwd_input_s) + f0(lc.bwd_weight_s)
    else:
        fwd_comp, bwd_comp = f0(lc.expert_fwd_s), f0(lc.expert_bwd_s)
    a2a_f, a2a_b = f0(lc.ep_fwd_s), f0(lc.ep_bwd_s)
    assert a2a_f > 0 and a2a_b > 0
    # T = Σ_i max(α·comp_i, β·a2a_i): the forward hides the backward's all-to-all and vice versa
    exp_f = max(a * fwd_comp, b * a2a_b) - fwd_comp
    exp_b = max(a * bwd_comp, b * a2a_f) - bwd_comp
    new = on.state.layers["moe"]
    assert f0(new.ep_exposed_fwd_s) == pytest.approx(exp_f, rel=1e-12)
    assert f0(new.ep_exposed_bwd_s) == pytest.approx(exp_b, rel=1e-12)
    # Mixtral's stack is MoE layers only: no other kind of layer is priced
    assert set(on.state.layers) == {"moe"}
    # DP = 64 / (2·2) = 16: m = 128 / 16 = 8 micro-batches of 16 MoE layers on the critical stage
    saved = a2a_f + a2a_b - exp_f - exp_b
    assert f0(on.breakdown["ep_comm"]) == pytest.approx(f0(off.breakdown["ep_comm"]) - 8 * 16 * saved, rel=1e-12)
    assert f0(on.step_time_s) < f0(off.step_time_s)
    assert_memory_unchanged(on, off)


@pytest.mark.parametrize("contention", [None, 1.0])
def test_pp_overlap_eq23(mofa_predictor, contention):
    opts = {} if contention is None else {"contention_compute": contention, "contention_comm": contention}
    off, job = evaluate(mofa_predictor, DENSE)
    on, _ = evaluate(mofa_predictor, DENSE, {"pp_overlap": opts})
    a, b = coefficients(job) if contention is None else (1.0, 1.0)
    pipe = off.state.pipe
    tau, work = f0(pipe.p2p_s), f0(pipe.F) + f0(pipe.B) + f0(pipe.W)
    assert tau > 0 and f0(pipe.steady_p2p_s) == 2 * tau
    # eq. [23] with contention only while both streams run (plugins/_overlap.contended_total):
    # 2τ ≪ F+B+W here, so the transfer ends first, slowed by β, and the chunk loses (α−1)/α of
    # the transfer's contended duration
    m = 2 * tau
    assert a * work > b * m
    expected = b * m * (1 - 1 / a)
    assert f0(on.state.pipe.steady_p2p_s) == pytest.approx(expected, rel=1e-12)
    assert 0 <= expected <= m
    assert f0(on.state.pipe.p2p_s) == tau  # warmup/cooldown transfers stay exposed
    # interleaved 1F1B, p = 2, v = 2, m = 16: warmup n_w = 2(p−1) + (v−1)p = 4 of m·v = 32 chunks
    steady_pairs = 16 * 2 - 4
    assert f0(on.breakdown["pp_comm"]) == pytest.approx(
        f0(off.breakdown["pp_comm"]) + steady_pairs * (expected - 2 * tau), rel=1e-12)
    if contention == 1.0:  # 2τ ≪ F+B+W: the whole steady p2p is hidden
        assert expected == 0.0 and f0(on.step_time_s) < f0(off.step_time_s)
    assert_memory_unchanged(on, off)


def test_pp_overlap_changes_nothing_where_the_schedule_cannot_overlap(mofa_predictor):
    """Megatron-LM overlaps p2p only in its interleaved schedule: its arguments turn
    ``overlap_p2p_comm`` off for the plain 1F1B ("non-interleaved schedule does not support
    overlapping p2p communication", megatron/training/arguments.py since 2023-10), so on a 1F1B row
    (``overlaps_p2p = False``) PP overlap leaves the steady p2p and the step as they are, while on
    the interleaved row beside it it hides them (Llama 3 70B, TP 8, PP 2, 64 H100s)."""
    reg = mofa_predictor.registry
    assert reg.schedules["1f1b"].overlaps_p2p is False and reg.schedules["interleaved-1f1b"].overlaps_p2p is True
    plain = {**DENSE, "parallel": {**DENSE["parallel"], "vpp": 1}, "pipeline": {"schedule": "1f1b"}}
    off, _ = evaluate(mofa_predictor, plain)
    on, _ = evaluate(mofa_predictor, plain, {"pp_overlap": {}})
    assert f0(off.state.pipe.steady_p2p_s) > 0
    assert f0(on.state.pipe.steady_p2p_s) == f0(off.state.pipe.steady_p2p_s)
    assert f0(on.step_time_s) == f0(off.step_time_s) and f0(on.breakdown["pp_comm"]) == f0(off.breakdown["pp_comm"])
    i_off, _ = evaluate(mofa_predictor, DENSE)
    i_on, _ = evaluate(mofa_predictor, DENSE, {"pp_overlap": {}})
    assert f0(i_on.state.pipe.steady_p2p_s) < f0(i_off.state.pipe.steady_p2p_s)
    assert f0(i_on.step_time_s) < f0(i_off.step_time_s)


def _dp_side(comm, compute, pieces, a, b):
    """[24], one side: the first (or last) piece exposed, each other one against `compute`."""
    piece = comm / pieces
    return piece + sum(max(a * compute, b * piece) - compute for _ in range(pieces - 1))


def _dp_side_buckets(comm, chunk_compute, last_compute, v, k, k_last, a, b):
    """[24] with buckets: the v − 1 earlier chunks, k pieces each against chunk_compute / k; the
    chunk reduced last in k_last buckets, all but one against last_compute / k_last."""
    c = comm / v
    earlier = sum(max(a * chunk_compute / k, b * c / k) - chunk_compute / k for _ in range((v - 1) * k))
    return earlier + _dp_side(c, last_compute / k_last, k_last, a, b)


#: a bucket larger than any chunk: one bucket per chunk, the paper's per-chunk eq. [24]
ONE_BUCKET = {"bucket_size": 1e12}


@pytest.mark.parametrize("buckets", [1, 2])
def test_dp_overlap_eq24_all_reduce(mofa_predictor, buckets):
    off, job = evaluate(mofa_predictor, DENSE)
    on, _ = evaluate(mofa_predictor, DENSE, {"dp_overlap": {"buckets_per_chunk": buckets, **ONE_BUCKET}})
    a, b = coefficients(job)
    pipe, comm = off.state.pipe, f0(off.state.opt.dp_comm_s)
    v = 2
    assert comm > 0 and f0(pipe.v) == v
    # no distributed optimizer: the all-reduce runs chunk by chunk in the cooldown, behind the
    # n = min(m, p) backwards of one chunk the first stage runs before the next chunk's; the chunk
    # reduced last hides its pieces behind its own last micro-batch's backward
    n = min(f0(pipe.m), f0(pipe.p))
    bwd = f0(pipe.B) + f0(pipe.W)
    expected = _dp_side_buckets(comm, n * bwd, bwd, v, buckets, buckets, a, b)
    if buckets == 1:  # the paper's per-chunk form
        assert expected == pytest.approx(_dp_side(comm, n * bwd, v, a, b), rel=1e-12)
    assert f0(on.state.opt.dp_exposed_s) == pytest.approx(expected, rel=1e-12)
    assert f0(on.breakdown["dp_comm"]) == pytest.approx(expected, rel=1e-12)
    assert f0(on.state.opt.dp_comm_s) == comm
    assert f0(on.step_time_s) == pytest.approx(f0(off.step_time_s) - (comm - expected), rel=1e-12)
    assert_memory_unchanged(on, off)


def test_dp_overlap_eq24_distributed_optimizer(mofa_predictor):
    if "distributed_optimizer" not in mofa_predictor.registry.features:
        pytest.skip("the distributed_optimizer plugin is not installed")
    off, job = evaluate(mofa_predictor, DENSE, {"distributed_optimizer": {}})
    on, _ = evaluate(mofa_predictor, DENSE, {"distributed_optimizer": {}, "dp_overlap": ONE_BUCKET})
    a, b = coefficients(job)
    pipe, comm = off.state.pipe, f0(off.state.opt.dp_comm_s)
    # RS of fp32 gradients (4 B/param) + AG of bf16 parameters (2 B/param): split 2/3 : 1/3
    rs, ag = comm * 4 / 6, comm * 2 / 6
    n = min(f0(pipe.m), f0(pipe.p))  # micro-batches of one chunk between two chunks' collectives
    expected = (_dp_side(rs, n * (f0(pipe.B) + f0(pipe.W)), 2, a, b)  # cooldown: backwards hide RS
                + _dp_side(ag, n * f0(pipe.F), 2, a, b))  # warmup: forwards hide AG
    assert f0(on.state.opt.dp_exposed_s) == pytest.approx(expected, rel=1e-12)
    assert f0(on.step_time_s) == pytest.approx(f0(off.step_time_s) - (comm - expected), rel=1e-12)
    assert_memory_unchanged(on, off)


def test_dp_overlap_buckets_by_hand():
    """One chunk (v = 1), 1 s of reduce-scatter in 4 buckets behind a 0.5 s backward, α = β = 1:
    each bucket moves 0.25 s against 0.125 s of compute, so 4·0.25 − 3·0.125 = 0.625 s stays
    exposed; the same traffic as one bucket is all exposed (1 s); behind a 2 s backward only the
    last bucket is (0.25 s)."""
    from mofa_plugins.dp_overlap import side

    one = np.ones(1)
    assert f0(side(one, 0.5 * one, 0.5 * one, one, one, 4 * one, 1.0, 1.0)) == pytest.approx(0.625, rel=1e-15)
    assert f0(side(one, 0.5 * one, 0.5 * one, one, one, one, 1.0, 1.0)) == pytest.approx(1.0, rel=1e-15)
    assert f0(side(one, 2.0 * one, 2.0 * one, one, one, 4 * one, 1.0, 1.0)) == pytest.approx(0.25, rel=1e-15)
    # v = 2, k = 1: the earlier chunk's 0.5 s hides behind 0.75 s (n·X), the last one's 0.5 s in
    # 2 buckets behind 0.2 s: 0 + 0.25 + (0.25 − 0.1) = 0.4 s
    assert f0(side(one, 0.75 * one, 0.2 * one, 2 * one, one, 2 * one, 1.0, 1.0)) == pytest.approx(0.4, rel=1e-15)


def test_dp_overlap_megatron_core_buckets(mofa_predictor):
    """Default bucket size: Megatron-Core's max(40 M, 1 M × DP×CP) parameters; the chunk reduced
    last (the first model chunk) splits into ⌈P_c / size⌉ buckets, the other chunks stay whole."""
    off, job = evaluate(mofa_predictor, DENSE, {"distributed_optimizer": {}})
    on, _ = evaluate(mofa_predictor, DENSE, {"distributed_optimizer": {}, "dp_overlap": {}})
    a, b = coefficients(job)
    pipe, comm = off.state.pipe, f0(off.state.opt.dp_comm_s)
    # llama3-70b, TP 8, PP 2, VPP 2 on 64 GPUs: DP 4, so the bucket is the 40 M floor
    dp = 64 // (8 * 2)
    size = max(40e6, 1e6 * dp)
    params = (f0(off.state.opt.dense_grad_bytes) + f0(off.state.opt.expert_grad_bytes)) / 4.0  # fp32 main grads
    assert 70.55e9 / 16 * 0.9 < params < 70.55e9 / 16 * 1.25  # ≈ a 16th of the model on the busiest stage
    k_last = int(np.ceil(params / 2 / size))
    assert k_last > 20
    n = min(f0(pipe.m), f0(pipe.p))
    bwd = f0(pipe.B) + f0(pipe.W)
    rs, ag = comm * 4 / 6, comm * 2 / 6
    expected = (_dp_side_buckets(rs, n * bwd, bwd, 2, 1, k_last, a, b)
                + _dp_side_buckets(ag, n * f0(pipe.F), f0(pipe.F), 2, 1, k_last, a, b))
    assert f0(on.state.opt.dp_exposed_s) == pytest.approx(expected, rel=1e-12)
    per_chunk, _ = evaluate(mofa_predictor, DENSE, {"distributed_optimizer": {}, "dp_overlap": ONE_BUCKET})
    assert f0(on.state.opt.dp_exposed_s) < f0(per_chunk.state.opt.dp_exposed_s)
    # a bucket size that makes 3 buckets of the last chunk
    three, _ = evaluate(mofa_predictor, DENSE, {"distributed_optimizer": {},
                                                "dp_overlap": {"bucket_size": params / 2 / 2.5}})
    expected3 = (_dp_side_buckets(rs, n * bwd, bwd, 2, 1, 3, a, b)
                 + _dp_side_buckets(ag, n * f0(pipe.F), f0(pipe.F), 2, 1, 3, a, b))
    assert f0(three.state.opt.dp_exposed_s) == pytest.approx(expected3, rel=1e-12)


def test_dp_overlap_without_param_gather_overlap_leaves_the_gathers_exposed(mofa_predictor):
    """overlap_param_gather = false (Megatron without --overlap-param-gather): the reduce-scatter side
    as before, the whole all-gather exposed."""
    off, job = evaluate(mofa_predictor, DENSE, {"distributed_optimizer": {}})
    both, _ = evaluate(mofa_predictor, DENSE, {"distributed_optimizer": {}, "dp_overlap": {}})
    rs_only, _ = evaluate(mofa_predictor, DENSE, {"distributed_optimizer": {},
                                                  "dp_overlap": {"overlap_param_gather": False}})
    a, b = coefficients(job)
    pipe, comm = off.state.pipe, f0(off.state.opt.dp_comm_s)
    rs, ag = comm * 4 / 6, comm * 2 / 6
    params = (f0(off.state.opt.dense_grad_bytes) + f0(off.state.opt.expert_grad_bytes)) / 4.0
    k_last = int(np.ceil(params / 2 / 40e6))  # DP 4: the 40 M floor
    n, bwd = min(f0(pipe.m), f0(pipe.p)), f0(pipe.B) + f0(pipe.W)
    expected = _dp_side_buckets(rs, n * bwd, bwd, 2, 1, k_last, a, b) + ag
    assert f0(rs_only.state.opt.dp_exposed_s) == pytest.approx(expected, rel=1e-12)
    assert f0(both.state.opt.dp_exposed_s) < f0(rs_only.state.opt.dp_exposed_s) <= comm


def test_kernel_scaling_eq17_eq18(mofa_predictor):
    off, _ = evaluate(mofa_predictor, DENSE)
    on, _ = evaluate(mofa_predictor, DENSE, {"kernel_scaling": {"compute_factor": 1.25, "bandwidth_factor": 2.0}})
    lo, ln = off.state.layers["dense"], on.state.layers["dense"]
    for f in ("fwd_compute_s", "bwd_input_s", "bwd_weight_s", "tp_gemm_fwd_s", "attn_bwd_s"):
        assert f0(getattr(ln, f)) == pytest.approx(f0(getattr(lo, f)) / 1.25, rel=1e-12), f
    for f in ("tp_fwd_s", "tp_bwd_s", "tp_exposed_fwd_s", "tp_exposed_bwd_s"):
        assert f0(getattr(ln, f)) == pytest.approx(f0(getattr(lo, f)) / 2.0, rel=1e-12), f
    assert f0(on.state.pipe.p2p_s) == pytest.approx(f0(off.state.pipe.p2p_s) / 2.0, rel=1e-12)
    for k in ("pp_comm", "dp_comm"):  # all p2p and all DP communication are collectives: ÷ γ
        assert f0(on.breakdown[k]) == pytest.approx(f0(off.breakdown[k]) / 2.0, rel=1e-12), k
    assert f0(on.breakdown["optimizer"]) == f0(off.breakdown["optimizer"])
    assert f0(on.step_time_s) < f0(off.step_time_s)
    assert_memory_unchanged(on, off)


def test_tp_overlap_userbuffers(mofa_predictor):
    """Transformer Engine's default userbuffers (method te, the default), by hand at TP 8 with
    α = 1.2, β = 1.1: half of each pass's GEMMs (c' = c/2) against half of its collectives
    (m' = m/2) as a ring exchange of 8 chunks and 7 p2p steps; the other halves as [20] in 4
    chunks (forward) or in bulk behind the whole GEMM (backward)."""
    off, job = evaluate(mofa_predictor, DENSE)
    a, b = 1.2, 1.1
    on, _ = evaluate(mofa_predictor, DENSE, {"tp_overlap": {"contention_compute": a, "contention_comm": b}})
    for d in ("fwd", "bwd"):
        lc = off.state.layers["dense"]
        c, m = f0(getattr(lc, f"tp_gemm_{d}_s")) / 2, f0(getattr(lc, f"tp_{d}_s")) / 2
        ring = 7 * max(a * c / 8, b * m / 7) + a * c / 8
        if d == "fwd":
            rest = b * m / 4 + 3 * max(a * c / 4, b * m / 4) + a * c / 4
        else:  # the one that would finish first under contention does so at min(α·c', β·m')
            rest = m + a * c * (1 - 1 / b) if a * c <= b * m else c + b * m * (1 - 1 / a)
        got = f0(getattr(on.state.layers["dense"], f"tp_exposed_{d}_s"))
        assert got == pytest.approx(ring + rest - 2 * c, rel=1e-12)
        assert 0 < got < f0(getattr(lc, f"tp_exposed_{d}_s"))
    # with the profile's contention and with none, the overlap makes the step faster
    for feats in ({}, {"contention_compute": 1.0, "contention_comm": 1.0}):
        unit, _ = evaluate(mofa_predictor, DENSE, {"tp_overlap": feats})
        assert f0(unit.step_time_s) < f0(off.step_time_s)
    assert_memory_unchanged(on, off)


def test_tp_overlap_ring_exchange_hides_what_chunks_expose(mofa_predictor):
    """With α = β = 1 and each p2p step shorter than its GEMM chunk, the ring exchange hides every
    all-gather and the reduce-scatters expose one of n chunks (forward) or nothing (bulk,
    backward): a quarter of [20]'s m/n per pass in the forward, none in the backward."""
    unit = {"contention_compute": 1.0, "contention_comm": 1.0, "chunks": 4}
    off, _ = evaluate(mofa_predictor, DENSE)
    te, _ = evaluate(mofa_predictor, DENSE, {"tp_overlap": unit})
    ch, _ = evaluate(mofa_predictor, DENSE, {"tp_overlap": {**unit, "method": "chunked"}})
    lc = off.state.layers["dense"]
    for d in ("fwd", "bwd"):
        c, m = f0(getattr(lc, f"tp_gemm_{d}_s")), f0(getattr(lc, f"tp_{d}_s"))
        assert m < c * 7 / 8  # the regime the statement is about: each p2p step within its GEMM chunk
        assert f0(getattr(ch.state.layers["dense"], f"tp_exposed_{d}_s")) == pytest.approx(m / 4, rel=1e-12)
        want = m / 2 / 4 if d == "fwd" else 0.0
        assert f0(getattr(te.state.layers["dense"], f"tp_exposed_{d}_s")) == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_tp_overlap_methods_mixed_in_one_batch(mofa_predictor):
    """A batch whose rows use both methods prices each row as it is priced alone."""
    jobs = [make_job(mofa_predictor, DENSE, {"tp_overlap": {"method": m}}, name=m) for m in ("te", "chunked")]
    both = mofa_predictor.evaluate(jobs_to_batch(jobs, mofa_predictor.registry), jobs[0].model, jobs[0].hardware)
    for i, m in enumerate(("te", "chunked")):
        alone, _ = evaluate(mofa_predictor, DENSE, {"tp_overlap": {"method": m}})
        for d in ("fwd", "bwd"):
            field = f"tp_exposed_{d}_s"
            assert float(getattr(both.state.layers["dense"], field)[i]) == f0(getattr(alone.state.layers["dense"], field))
    assert both.step_time_s[0] < both.step_time_s[1]


def test_kernel_scaling_runs_before_tp_overlap(mofa_predictor):
    """tp_overlap sees the scaled times: its exposed TP equals [20] on the ÷β, ÷γ inputs."""
    off, job = evaluate(mofa_predictor, DENSE)
    on, _ = evaluate(mofa_predictor, DENSE, {"kernel_scaling": {"compute_factor": 2.0, "bandwidth_factor": 4.0},
                                             "tp_overlap": {"method": "chunked", "chunks": 2}})
    scaled, _ = evaluate(mofa_predictor, DENSE, {"kernel_scaling": {"compute_factor": 2.0, "bandwidth_factor": 4.0}})
    a, b = coefficients(job)
    # the scaled inputs: ÷ 4 on the collective; ÷ 2 on the GEMMs except where an operator reaches the
    # profile's host-dispatch floor (a kernel cannot finish before the CPU has issued it)
    c, m = f0(scaled.state.layers["dense"].tp_gemm_fwd_s), f0(scaled.state.layers["dense"].tp_fwd_s)
    assert m == pytest.approx(f0(off.state.layers["dense"].tp_fwd_s) / 4.0, rel=1e-12)
    assert f0(off.state.layers["dense"].tp_gemm_fwd_s) / 2.0 <= c < f0(off.state.layers["dense"].tp_gemm_fwd_s)
    total = b * m / 2 + max(a * c / 2, b * m / 2) + a * c / 2
    assert f0(on.state.layers["dense"].tp_exposed_fwd_s) == pytest.approx(total - c, rel=1e-12)


# ------------------------------------------------------------------ rows with the feature off


@pytest.mark.parametrize("feature", [*OVERLAPS, "kernel_scaling"])
def test_off_rows_bit_identical(mofa_predictor, feature):
    base = CONFIG[feature]
    job_on = make_job(mofa_predictor, base, {feature: ON_OPTIONS.get(feature, {})}, name="on")
    job_off = make_job(mofa_predictor, base, name="off")
    both = mofa_predictor.predict([job_on, job_off])
    alone = mofa_predictor.predict(job_off)[0]
    got = both[1]
    assert got.step_time_s == alone.step_time_s
    assert got.breakdown == alone.breakdown  # exact float equality, key by key
    assert got.memory_breakdown == alone.memory_breakdown
    assert got.pipeline_phases == alone.pipeline_phases
    assert both[0].step_time_s != alone.step_time_s  # the feature did act on its row


# ------------------------------------------------------------------ never slower (α = β = 1)

MODELS = {"llama3-8b": False, "mixtral-8x7b": True}


@st.composite
def configs(draw):
    model = draw(st.sampled_from(sorted(MODELS)))
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    vpp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    cp = draw(st.sampled_from([1, 2]))
    dp = 64 // (tp * pp * cp)
    ep = draw(st.sampled_from([e for e in (1, 2, 4, 8) if (cp * dp) % e == 0])) if MODELS[model] else 1
    mbs = draw(st.sampled_from([1, 2]))
    gbs = dp * mbs * draw(st.integers(min_value=pp, max_value=4 * pp))
    seq = draw(st.sampled_from([2048, 4096]))
    sp = draw(st.booleans()) if tp > 1 else False
    return {"model": {"name": model}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 64},
            "parallel": {"tp": tp, "pp": pp, "vpp": vpp, "cp": cp, "ep": ep, "micro_batch_size": mbs,
                         "global_batch_size": gbs, "sequence_length": seq, "sequence_parallel": sp}}


NEUTRAL = {"contention_compute": 1.0, "contention_comm": 1.0}


@pytest.mark.parametrize("features", [*[(f,) for f in OVERLAPS], OVERLAPS], ids=[*OVERLAPS, "all"])
@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(base=configs(), chunks=st.sampled_from([1, 2, 4, 8]), buckets=st.sampled_from([1, 3]))
def test_never_slower_with_unit_contention(mofa_predictor, features, base, chunks, buckets):
    extra = {"tp_overlap": {"chunks": chunks}, "dp_overlap": {"buckets_per_chunk": buckets}}
    feats = {f: {**NEUTRAL, **extra.get(f, {})} for f in features}
    try:
        job_on = make_job(mofa_predictor, base, feats, name="on")
        job_off = make_job(mofa_predictor, base, name="off")
        on, off = mofa_predictor.predict([job_on, job_off])
    except ConfigError:
        assume(False)
        return
    assert on.step_time_s <= off.step_time_s * (1 + 1e-12)
    for k in ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm"):
        assert on.breakdown[k] <= off.breakdown[k] * (1 + 1e-12) + 1e-15, k
    assert on.memory_breakdown == off.memory_breakdown
    assert sum(on.breakdown.values()) == pytest.approx(on.step_time_s, rel=1e-9)


# ------------------------------------------------------------------ the CLI


def test_disable_plugin_removes_tp_overlap(monkeypatch):
    monkeypatch.delenv("MOFA_DISABLED_PLUGINS", raising=False)
    args = ["predict", "--model", "llama3-70b", "--hardware", "h100-sxm5-80gb", "--gpus", "64", "--tp", "8",
            "--pp", "2", "--vpp", "2", "--mbs", "1", "--gbs", "64", "--seq", "4096", "--format", "json",
            "--feature", "tp_overlap:chunks=4"]
    ok = CliRunner().invoke(cli, args)
    assert ok.exit_code == 0, ok.output
    assert '"tp_overlap"' in ok.stdout
    res = CliRunner().invoke(cli, ["--disable-plugin", "tp_overlap", *args])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "tp_overlap" in lines[0]
    assert res.stdout == ""


@st.composite
def _pp_jobs(draw):
    model = draw(st.sampled_from(["llama3-8b", "llama3-70b", "gpt3-175b", "mixtral-8x7b"]))
    hw = draw(st.sampled_from(["h100-sxm5-80gb", "a100-sxm4-80gb", "b200-sxm-180gb", "paper-a"]))
    tp, pp, dp = draw(st.sampled_from([1, 2, 8])), draw(st.sampled_from([2, 4, 8])), draw(st.sampled_from([1, 2, 4]))
    m, mbs = draw(st.sampled_from([1, 2, 8, 32])), draw(st.sampled_from([1, 2]))
    return {"model": {"name": model}, "hardware": {"name": hw, "num_gpus": tp * pp * dp},
            "parallel": {"tp": tp, "pp": pp, "vpp": draw(st.sampled_from([1, 2])), "micro_batch_size": mbs,
                         "global_batch_size": dp * mbs * m, "sequence_length": draw(st.sampled_from([1024, 4096])),
                         "sequence_parallel": tp > 1}}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow,
                                                           HealthCheck.function_scoped_fixture])
@given(_pp_jobs(), st.floats(1.0, 3.0), st.floats(1.0, 3.0))
def test_pp_overlap_never_makes_a_step_slower(mofa_predictor, base, alpha, beta):
    """Issue 17 §5: whatever the job and the contention coefficients (α, β up to 3, beyond any
    profile's bounds), turning PP overlap on never makes the step slower than leaving it off."""
    try:
        off, _ = evaluate(mofa_predictor, base)
        on, _ = evaluate(mofa_predictor, base, {"pp_overlap": {"contention_compute": alpha, "contention_comm": beta}})
    except ConfigError:
        assume(False)
    assert f0(on.step_time_s) <= f0(off.step_time_s) * (1 + 1e-12)
    assert 0.0 <= f0(on.state.pipe.steady_p2p_s) <= f0(off.state.pipe.steady_p2p_s) * (1 + 1e-12)


def test_contended_total_by_hand():
    """plugins/_overlap.contended_total: c = 10, m = 4, α = 1.2, β = 1.5: α·c = 12 > β·m = 6, so the
    transfer ends first (at 6), the compute has done 6/1.2 = 5 of 10 and finishes the other 5 at
    full speed: T = 11 = c + β·m·(1 − 1/α). Swapped (c = 4, m = 10): T = m + α·c·(1 − 1/β) = 11.6.
    With α = β = 1 both are max(c, m); α = β = 10 would cost more than c + m, so it is capped."""
    from mofa_plugins._overlap import contended_total

    assert contended_total(10.0, 4.0, 1.2, 1.5) == pytest.approx(11.0, rel=1e-12)
    assert contended_total(4.0, 10.0, 1.2, 1.5) == pytest.approx(10 + 4 * 1.2 * (1 - 1 / 1.5), rel=1e-12)
    assert contended_total(4.0, 10.0, 1.0, 1.0) == 10.0
    assert contended_total(10.0, 9.0, 10.0, 10.0) == 19.0
