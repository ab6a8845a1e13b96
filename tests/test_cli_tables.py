"""The predict tables show what their resolution can print: no '0.0 ms' or '-0.0 ms' rows."""

from types import SimpleNamespace

from mofa_framework.cli import _prediction_tables


def _result(breakdown):
    return SimpleNamespace(breakdown=breakdown, step_time_s=2.0, provenance={}, stage_memory_gib={"mid": 10.0},
                           peak_memory_gib=10.0, memory_breakdown={"weights": 10.0}, critical_stage="mid")


def test_rounding_residuals_are_not_rows_but_small_components_are():
    rows = _prediction_tables(_result({"compute_fwd": 1.9, "optimizer": 0.5e-3,
                                       "schedule_adjust": -1e-17, "tiny": 4e-5}))[0][2]
    shown = {row[0]: row[1] for row in rows}
    assert shown == {"compute_fwd": "1.900 s", "optimizer": "0.5 ms", "step": "2.000 s"}
    assert not any(row[1].startswith("-0.0") for row in rows)
