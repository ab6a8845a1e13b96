"""GPUs run below their rated power (``compute.power_limit_w``): the clock model, the providers that
apply it, the job file and the flag that set it, and the Grand Teton H100s that ship with one."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mofa_framework.batch import OP_KINDS, PRECISIONS, OperatorBatch
from mofa_framework.types import IDLE_POWER_FRACTION

H100 = "h100-sxm5-80gb"


def limited(hw, watts: float):
    return attrs.evolve(hw, compute=attrs.evolve(hw.compute, power_limit_w=watts))


@pytest.fixture(scope="module")
def h100():
    from mofa_framework import Predictor

    return Predictor().registry.hardware_profile(H100)


def test_clock_scale_by_hand(mofa_predictor, h100):
    # H100 SXM5, 700 W rated, idle 10 % = 70 W: at 500 W the dynamic budget is 430 of 630 W, and
    # dynamic power goes as f³, so f = (430/630)^(1/3) = 0.682540^(1/3) = 0.880459
    assert IDLE_POWER_FRACTION == 0.1 and h100.compute.tdp_w == 700.0
    assert limited(h100, 500.0).compute_clock_scale == pytest.approx(0.880459, abs=1e-6)
    # A100 SXM4, 400 W rated (idle 40 W): at 300 W, (260/360)^(1/3) = 0.722222^(1/3) = 0.897202
    a100 = mofa_predictor.registry.hardware_profile("a100-sxm4-80gb")
    assert limited(a100, 300.0).compute_clock_scale == pytest.approx(0.897202, abs=1e-6)
    # at the rated power, or with no limit, nothing changes
    assert limited(h100, 700.0).compute_clock_scale == 1.0 and h100.compute_clock_scale == 1.0


@settings(max_examples=60, deadline=None)
@given(a=st.floats(71.0, 700.0), b=st.floats(71.0, 700.0))
def test_clock_scale_grows_with_the_limit_and_stays_in_0_1(h100, a, b):
    lo, hi = sorted((a, b))
    s_lo, s_hi = limited(h100, lo).compute_clock_scale, limited(h100, hi).compute_clock_scale
    assert 0.0 < s_lo <= s_hi <= 1.0


def _ops(kinds, flops, nbytes, m=8192.0, n=8192.0, k=8192.0):
    size = len(kinds)
    return OperatorBatch(flops=np.asarray(flops, float), bytes=np.asarray(nbytes, float),
                         kind=np.array([OP_KINDS.index(x) for x in kinds]),
                         precision=np.full(size, PRECISIONS.index("bf16")), gemm_m=np.full(size, m),
                         gemm_n=np.where(np.array(kinds) == "attention", 4096.0, n),
                         gemm_k=np.where(np.array(kinds) == "attention", 128.0, k))


@pytest.mark.parametrize("gpu", [H100, "a100-sxm4-80gb"])  # profiled tables (H100), roofline (A100)
def test_tensor_core_work_slows_by_the_clock_and_bandwidth_bound_work_does_not(mofa_predictor, gpu):
    hw = mofa_predictor.registry.hardware_profile(gpu)
    # the fixed per-kernel launch and host terms do not scale with the clock: zero here (a refit may put
    # kernel_launch_s at 3e-11 s, which moves a 1 ms GEMM's ratio past the 1e-9 this test holds)
    hw = attrs.evolve(hw, efficiency=attrs.evolve(hw.efficiency, kernel_launch_s=0.0, host_dispatch_s=0.0))
    f = 2.0 * 8192.0 ** 3
    ops = _ops(["gemm", "attention", "elementwise"], [f, f, 0.0], [0.0, 0.0, 4.0e9])
    at = lambda h: mofa_predictor.pm.hook.mofa_operator_latency(ops=ops, hardware=h)  # noqa: E731
    slow = limited(hw, 0.75 * hw.compute.tdp_w)
    ratio = at(slow) / at(hw)
    assert ratio[:2] == pytest.approx(1.0 / slow.compute_clock_scale, rel=1e-9)
    assert ratio[2] == pytest.approx(1.0, rel=1e-12)


def test_job_file_and_tune_flag_set_the_limit(mofa_predictor, tmp_path):
    job = {"model": {"name": "llama3.1-8b"}, "hardware": {"name": H100, "num_gpus": 8},
           "parallel": {"global_batch_size": 16, "micro_batch_size": 1, "sequence_length": 8192}}
    full = mofa_predictor.predict(mofa_predictor.job(job))[0].step_time_s
    capped_job = mofa_predictor.job({**job, "hardware": {**job["hardware"], "power_limit_w": 500}})
    assert capped_job.hardware.compute.power_limit_w == 500.0
    capped = mofa_predictor.predict(capped_job)[0].step_time_s
    # one call with both: each job keeps its own limit (jobs are grouped by hardware and limit)
    both = mofa_predictor.predict([mofa_predictor.job(job), capped_job])
    assert [r.step_time_s for r in both] == [full, capped]
    # mostly tensor-core time: slower by nearly the clock ratio, never by more
    assert 1.0 < capped / full <= 1.0 / 0.880459 + 1e-9
    # the shipped Grand Teton profile runs at its 500 W limit; 700 W in a job lifts it
    gt = {**job, "hardware": {"name": "h100-sxm-96gb-grandteton", "num_gpus": 8}}
    assert mofa_predictor.job(gt).hardware.compute_clock_scale == pytest.approx(0.880459, abs=1e-6)
    lifted = mofa_predictor.job({**gt, "hardware": {**gt["hardware"], "power_limit_w": 700}})
    assert lifted.hardware.compute_clock_scale == 1.0

    from click.testing import CliRunner

    import mofa_framework.cli as c

    c._builtin_commands()
    args = ["tune", "--model", "llama3.1-8b", "--hardware", H100, "--gpus", "8", "--gbs", "16", "--seq", "8192",
            "--tp-values", "1", "--pp-values", "1", "--mbs-values", "1", "--features", "recompute,distributed_optimizer",
            "--top", "1", "--format", "json", "--no-progress"]
    best = [CliRunner().invoke(c.cli, [*args, *extra]) for extra in ([], ["--power-limit-w", "500"])]
    import json

    steps = [json.loads(r.output)["best"][0]["step_time_s"] for r in best]
    assert 1.0 < steps[1] / steps[0] <= 1.0 / 0.880459 + 1e-9


def test_a_job_at_another_limit_than_the_profiles_rows_is_flagged(mofa_predictor):
    job = {"model": {"name": "llama3.1-8b"}, "hardware": {"name": H100, "num_gpus": 8, "power_limit_w": 500},
           "parallel": {"global_batch_size": 16, "micro_batch_size": 1, "sequence_length": 8192}}
    flags = mofa_predictor.predict(mofa_predictor.job(job))[0].extrapolation
    assert any("GPUs at 500 W (the profile's rows: 700 W)" in f and "0.88 of rated speed" in f for f in flags)
    # the Grand Teton profile's own 500 W rows: no flag
    gt = {**job, "hardware": {"name": "h100-sxm-96gb-grandteton", "num_gpus": 8}}
    assert not any("GPUs at" in f for f in mofa_predictor.predict(mofa_predictor.job(gt))[0].extrapolation)


def test_predict_flag_reaches_the_result_and_its_json():
    import json

    from click.testing import CliRunner

    import mofa_framework.cli as c

    c._builtin_commands()
    args = ["predict", "--model", "llama3.1-8b", "--hardware", H100, "--gpus", "8", "--gbs", "16", "--seq", "8192",
            "--format", "json"]
    full, capped = (json.loads(CliRunner().invoke(c.cli, [*args, *extra]).output)
                    for extra in ([], ["--power-limit-w", "500"]))
    assert (full["power_limit_w"], capped["power_limit_w"]) == (0.0, 500.0)
    assert 1.0 < capped["step_time_s"] / full["step_time_s"] <= 1.0 / 0.880459 + 1e-9
    table = CliRunner().invoke(c.cli, [*args[:-2], "--power-limit-w", "500"]).output
    assert f"8 × {H100} at 500 W" in table.splitlines()[0]
