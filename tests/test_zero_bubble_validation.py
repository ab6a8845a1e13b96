"""ZeroBubble (Qi et al. 2023) measurements: schedule order and peak memory.

Each of the 102 rows of zero_bubble.csv becomes a job (benchmarks/zero_bubble_report.py has
the mapping and writes the same figures to docs/schedules.md). Thresholds, with the figures
at the time of writing in brackets: the measured throughput order of two schedules on the
same model/pp/batch is predicted in ≥ 85 % of the pairs [95 %] and the whole order in ≥ 70 %
of the groups [83 %] — a coin flip would give 50 % and the ZB paper's own gaps between
schedules are 2–15 %, so this is the ranking the tuner needs; peak memory is within 10 % on
≥ 75 % of the rows [88 / 102] with unfused attention, as the ZB fork runs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.validation


def _report():
    spec = importlib.util.spec_from_file_location("zero_bubble_report", ROOT / "benchmarks" / "zero_bubble_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def report():
    mod = _report()
    return mod


@pytest.fixture
def results(report, mofa_predictor):
    rows = report.load_rows()
    return report.predict_rows(rows, mofa_predictor)


def test_every_row_predicted(results):
    assert len(results) == 102
    assert {r["schedule"] for r in results} == {"1F1B", "1F1B-I", "ZB-1p", "ZB-2p", "ZB-V"}
    assert all(r["pred_tput"] > 0 and r["pred_mem"] > 0 for r in results)


def test_throughput_order(report, results):
    s = report.summarize(results)
    assert s["groups"] == 30
    assert s["pair_agree"] >= 0.85, s
    assert s["exact_order"] >= 0.70, s
    # with the fitted A100 profile: median |error| 3.0 % (gate just above). It was 1.9 % before the
    # host overhead split into a per-micro-batch and a per-chunk term (docs/cost-model.md): the A100
    # fit, led by vTrain's 1,440 rows, moved its GEMM and bus coefficients; the pairwise order of
    # these rows went 94 → 99 % at the same time. 3.12 % after the A100 refit with Megatron's softmax
    # fallback (vTrain's TP-8 micro-batch-1 rows; the fitted NVLink efficiency 0.77 → 0.70)
    assert s["tput_median_abs_err"] <= 0.032, s


def test_schedules_doc_is_current(report):
    """docs/schedules.md's generated section is what the report produces now."""
    assert report.main(["--check"]) == 0, "run: python benchmarks/zero_bubble_report.py"


def test_peak_memory(report, results):
    s = report.summarize(results)
    assert s["mem_within_10"] >= 0.75 * s["rows"], s
    assert abs(s["mem_median_err"]) <= 0.05, s
    # ZB-2p holds about twice 1F1B's activations and the prediction shows it
    by = {(r["model"], r["pp"], r["mbs"], r["gbs"], r["schedule"]): r for r in results}
    for (model, pp, mbs, gbs, sched), r in by.items():
        if sched == "ZB-2p" and (model, pp, mbs, gbs, "1F1B") in by and r["m"] >= 2 * pp:
            assert r["pred_mem"] > by[(model, pp, mbs, gbs, "1F1B")]["pred_mem"]


def test_csv_schedule_names_are_registered(report, mofa_predictor):
    for csv_name, mofa_name in report.SCHEDULES.items():
        assert mofa_predictor.registry.schedule(mofa_name)  # ZB-1p/ZB-2p/ZB-V resolve by alias
