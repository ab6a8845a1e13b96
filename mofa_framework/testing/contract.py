"""Contract checks for plugin authors (and MoFa's own tests)."""

from __future__ import annotations


def assert_same_row(batch_prediction, row: int, single_prediction, single_row: int = 0) -> None:
    """Row `row` of a batch prediction equals row `single_row` of another prediction, bit for bit:
    step time, peak memory and every breakdown component. A feature transform must leave the
    rows where it is off exactly as they are without it."""
    a, b = batch_prediction, single_prediction
    assert a.step_time_s[row] == b.step_time_s[single_row], "step_time_s"
    assert a.peak_memory_bytes[row] == b.peak_memory_bytes[single_row], "peak_memory_bytes"
    for k in b.breakdown:
        assert a.breakdown[k][row] == b.breakdown[k][single_row], f"breakdown[{k!r}]"
    for k in b.memory_breakdown:
        assert a.memory_breakdown[k][row] == b.memory_breakdown[k][single_row], f"memory_breakdown[{k!r}]"
