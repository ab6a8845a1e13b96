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


def feasible_prediction(predictor, jobs):
    """Jobs sharing a model and hardware through the predict path in one engine call: the rows every
    feasibility rule accepts, evaluated together (the engine checks its output invariants and
    raises on a violation). Returns ``(prediction or None, feasible mask)``."""
    import numpy as np

    from ..config import jobs_to_batch

    model, hw = jobs[0].model, jobs[0].hardware
    batch = jobs_to_batch(list(jobs), predictor.registry)
    ok = np.ones(len(jobs), bool)
    for r in predictor.constraints(batch, model, hw):
        ok &= np.asarray(r.feasible, bool)
    if not ok.any():
        return None, ok
    return predictor.evaluate(batch.take(np.flatnonzero(ok)), model, hw), ok


def assert_outputs_possible(pred) -> None:
    """Every row of a prediction is physically possible, restated independently of the engine's own
    check: step time finite and > 0; breakdown components finite, ≥ 0 (a schedule's reordering,
    ``schedule_adjust``, may be negative) and summing to the step; memory components ≥ 0 summing to
    the peak; 0 < MFU ≤ the MFU ceiling; HFU ≥ MFU; the stages hold the model's layers once."""
    import numpy as np

    from ..engine import frozen_weight_rows, stage_layer_totals
    from ..invariants import mfu_ceiling

    step = pred.step_time_s
    assert np.all(np.isfinite(step) & (step > 0)), step
    total = np.zeros_like(step)
    for k, a in pred.breakdown.items():
        assert np.all(np.isfinite(a)), k
        assert k == "schedule_adjust" or np.all(a >= -1e-9 * step), (k, a)
        total = total + a
    np.testing.assert_allclose(total, step, rtol=1e-9)
    mem = np.zeros_like(step)
    for k, a in pred.memory_breakdown.items():
        assert np.all(np.isfinite(a) & (a >= 0)), (k, a)
        mem = mem + (a if k != "host" else 0.0)
    np.testing.assert_allclose(mem, pred.peak_memory_bytes, rtol=1e-9)
    assert np.all(np.isfinite(pred.tokens_per_s_per_gpu) & (pred.tokens_per_s_per_gpu > 0))
    ceiling = mfu_ceiling(pred.model, pred.batch, frozen_weight_rows(pred.batch, pred.state.ctx.pm.registry))
    assert np.all((pred.mfu > 0) & (pred.mfu <= ceiling * (1 + 1e-9))), pred.mfu
    assert np.all(pred.hfu >= pred.mfu * (1 - 1e-12)), (pred.hfu, pred.mfu)
    assert np.all(stage_layer_totals(pred.batch, pred.state.layout.total) == pred.model.num_layers)


def assert_constraints_ignore_features(plugin, batch, model, hardware) -> None:
    """A plugin that declares ``MOFA_CONSTRAINTS_READ_FEATURES = False`` gives the same rules, mask
    for mask, on `batch` (give it features on) as on the same rows with every feature off: the
    claim that lets a search check its rules once per structure."""
    import attrs
    import numpy as np

    assert getattr(plugin, "MOFA_CONSTRAINTS_READ_FEATURES", True) is False, "the plugin does not declare it"

    def masks(b):
        return {r.name: np.asarray(r.feasible, bool) for r in plugin.mofa_candidate_constraints(b, model, hardware)}

    assert batch.features, "give the batch features to compare against"
    on, off = masks(batch), masks(attrs.evolve(batch, features={}))
    assert on.keys() == off.keys(), (sorted(on), sorted(off))
    for name in on:
        np.testing.assert_array_equal(on[name], off[name], err_msg=name)
