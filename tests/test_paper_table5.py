"""The paper's Table 5 step times predicted from its hardware (issue 17 §4).

Hardware A and B are inferred from the paper's own Tables 3, 5, 6 and §5.6.1 by
benchmarks/paper_hardware.py (one free coefficient each: the peak; docs/paper-hardware.md).
Here: the shipped paper-a / paper-b profiles are what that inference gives, Table 5's columns
are predicted within 5 % of the measured step times (DeepSeek-V3 excepted: listed as a known
miss), the LLaMA2-70B weak-scaling rows grow with scale, and the predicted step times chain
through ETTR to the end-to-end time.
"""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import paper_hardware as ph  # noqa: E402

from mofa_framework.e2e import e2e_time, num_steps  # noqa: E402

MTTR_3_6_1 = 0.3 * 141 + 0.6 * 262 + 0.1 * 307  # eq. [41], paper §3.4
#: Table 5: column → (T_save s, T_init s, B_g, ETTR %, T_total s) as printed
E2E = {
    "llama2-70b-128": (4.19, 134.41, 256, 98.49, 26947190.75),
    "llama2-70b-256": (2.35, 147.72, 512, 99.11, 13465926.21),
    "llama2-70b-512": (1.59, 174.34, 1024, 99.32, 6800277.57),
    "llama2-70b-1024": (0.95, 227.58, 2048, 99.39, 3457670.27),
    "llama3-405b-64": (9.3, 127.75, 16, 96.32, 387465533.9),
}
WITHIN_5 = list(E2E)


@pytest.fixture(scope="module")
def table5():
    from mofa_framework import Predictor

    return ph.predict_table5(Predictor())


def test_decay_read_off_the_weak_scaling_table_by_hand():
    # §5.6.1: DP 3.50, 3.97, 4.46, 4.99 s at DP 16, 32, 64, 128; per doubling
    # 1 − d = [(2D−1)/2D ÷ (D−1)/D] ÷ (T_2D/T_D): (31/32 ÷ 15/16)/(3.97/3.50) = 0.91075,
    # (63/64 ÷ 31/32)/(4.46/3.97) = 0.90443, (127/128 ÷ 63/64)/(4.99/4.46) = 0.90117
    gm = (0.91075 * 0.90443 * 0.90117) ** (1 / 3)
    assert ph.decay_from_weak_scaling() == pytest.approx(1 - gm, abs=2e-5)
    assert 0.09 < ph.decay_from_weak_scaling() < 0.10


@pytest.mark.parametrize("column", WITHIN_5)
def test_table5_step_time_within_5_percent_of_the_measurement(table5, column):
    r = table5[column]
    assert abs(r["error"]) <= 0.05, (column, r)


def test_llama2_70b_weak_scaling_grows_with_scale(table5):
    steps = [table5[f"llama2-70b-{g}"]["predicted"] for g in (128, 256, 512, 1024)]
    assert all(b > a for a, b in zip(steps, steps[1:]))
    # the paper: 27.83 → 28.83 s modelled, 27.94 → 29.52 s measured; MoFa's growth is smaller
    # (its DP traffic for the distributed optimizer is less than the paper's: docs/paper-hardware.md)
    assert 0.05 < steps[-1] - steps[0] < 2.0


def test_deepseek_v3_is_a_documented_miss(table5):
    """MoE on B: MoFa predicts ~46 s against 76.24 s measured (docs/paper-hardware.md says why);
    this test pins the miss so a change to it is seen and the doc updated."""
    assert -0.45 < table5["deepseek-v3-128"]["error"] < -0.30


@pytest.mark.parametrize("column", WITHIN_5)
def test_predicted_step_chains_to_ettr_and_total_time(table5, column):
    save, init, gbs, ettr_pct, total = E2E[column]
    gpus = int(column.rsplit("-", 1)[1])
    step = table5[column]["predicted"]
    r = e2e_time(step, num_steps=num_steps(1e12, gbs, 4096), num_gpus=gpus, gpus_per_node=8,
                 node_failures_per_day=0.005, mttr_s=MTTR_3_6_1, checkpoint_save_s=save, init_s=init,
                 checkpoint_interval_steps=10)
    assert abs(r.ettr * 100 - ettr_pct) < 0.3
    assert math.isclose(r.total_time_s, total, rel_tol=0.05)


def test_shipped_paper_profiles_are_what_the_inference_gives():
    from mofa_framework import Predictor

    pred = Predictor()
    values = ph.infer(pred)
    for name, v in values.items():
        hw = pred.registry.hardware_profile(name)
        assert hw.compute.peak_tflops["bf16"] == pytest.approx(v["peak"], rel=2e-3)
        assert hw.interconnect.scaleup_bandwidth_gbps == pytest.approx(v["scaleup_bandwidth_gbps"], rel=2e-3)
        assert hw.interconnect.scaleout_bandwidth_gbps == pytest.approx(v["scaleout_bandwidth_gbps"], rel=2e-3)
        assert hw.efficiency.bandwidth_decay_per_doubling == pytest.approx(v["bandwidth_decay_per_doubling"],
                                                                           rel=2e-3)
