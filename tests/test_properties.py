"""Hypothesis properties of the base cost model."""

import attrs
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from mofa_framework.config import jobs_to_batch
from mofa_framework.errors import ConfigError
from mofa_framework.manager import MofaPluginManager

_PM = MofaPluginManager(strict=False)
_PM.load_entrypoints(builtin_only=True)

from mofa_framework import Predictor  # noqa: E402

PRED = Predictor(pm=_PM)

MODELS = ["llama3-8b", "llama3-70b", "mixtral-8x7b", "deepseek-v3", "gpt3-175b", "qwen3-30b-a3b"]


@st.composite
def jobs(draw):
    model = draw(st.sampled_from(MODELS))
    hw = draw(st.sampled_from(["h100-sxm5-80gb", "a100-sxm4-80gb", "b200-sxm-180gb", "gb200-nvl72"]))
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    cp = draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2, 4, 8]))
    ep = draw(st.sampled_from([1, 2, 4, 8])) if model in ("mixtral-8x7b", "deepseek-v3", "qwen3-30b-a3b") else 1
    vpp = draw(st.sampled_from([1, 2]))
    mbs = draw(st.sampled_from([1, 2]))
    m = draw(st.sampled_from([1, 4, 8]))
    seq = draw(st.sampled_from([2048, 4096]))
    sp = draw(st.booleans())
    data = {"model": {"name": model}, "hardware": {"name": hw, "num_gpus": tp * pp * cp * dp},
            "parallel": {"tp": tp, "pp": pp, "vpp": vpp, "cp": cp, "ep": ep, "etp": 1, "micro_batch_size": mbs,
                         "global_batch_size": dp * mbs * m, "sequence_length": seq, "sequence_parallel": sp}}
    try:
        job = PRED.job(data)
        PRED.predict(job)
    except ConfigError:
        assume(False)
    return job


def _evaluate(job, hardware=None):
    batch = jobs_to_batch([job], PRED.registry)
    return PRED.evaluate(batch, job.model, hardware or job.hardware)


@given(jobs(), st.sampled_from(["hbm", "scaleup", "scaleout", "peak"]), st.floats(1.0, 8.0))
def test_more_bandwidth_or_flops_is_never_slower(job, what, factor):
    hw = job.hardware
    faster = {
        "hbm": lambda: attrs.evolve(hw, memory=attrs.evolve(hw.memory, hbm_bandwidth_gbps=hw.memory.hbm_bandwidth_gbps * factor)),
        "scaleup": lambda: attrs.evolve(hw, interconnect=attrs.evolve(
            hw.interconnect, scaleup_bandwidth_gbps=hw.interconnect.scaleup_bandwidth_gbps * factor)),
        "scaleout": lambda: attrs.evolve(hw, interconnect=attrs.evolve(
            hw.interconnect, scaleout_bandwidth_gbps=hw.interconnect.scaleout_bandwidth_gbps * factor)),
        "peak": lambda: attrs.evolve(hw, compute=attrs.evolve(
            hw.compute, peak_tflops={k: x * factor for k, x in hw.compute.peak_tflops.items()})),
    }[what]()
    base = _evaluate(job).step_time_s[0]
    assert _evaluate(job, faster).step_time_s[0] <= base * (1 + 1e-12)


@given(jobs())
def test_breakdown_sums_to_step_time(job):
    pred = _evaluate(job)
    total = sum(pred.breakdown.values())
    assert total[0] == pytest.approx(pred.step_time_s[0], rel=1e-12)
    assert all(v[0] >= -1e-12 for k, v in pred.breakdown.items() if k != "schedule_adjust")
    mem = sum(v for k, v in pred.memory_breakdown.items() if k != "host")
    assert mem[0] == pytest.approx(pred.peak_memory_bytes[0], rel=1e-12)


@given(st.lists(jobs(), min_size=2, max_size=6))
def test_batch_equals_single_predictions(job_list):
    model, hw = job_list[0].model, job_list[0].hardware
    same = [j for j in job_list if j.model == model and j.hardware == hw]
    batch = jobs_to_batch(same, PRED.registry)
    together = PRED.evaluate(batch, model, hw)
    for i, j in enumerate(same):
        alone = _evaluate(j)
        assert together.step_time_s[i] == alone.step_time_s[0]
        assert together.peak_memory_bytes[i] == alone.peak_memory_bytes[0]
        for k in alone.breakdown:
            assert together.breakdown[k][i] == alone.breakdown[k][0], k


@given(jobs())
def test_mfu_and_memory_are_physical(job):
    pred = _evaluate(job)
    assert 0 < pred.mfu[0] < 1
    assert pred.hfu[0] >= pred.mfu[0]
    assert pred.peak_memory_bytes[0] > 0
    assert np.isfinite(pred.step_time_s[0]) and pred.step_time_s[0] > 0
