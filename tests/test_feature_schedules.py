"""A feature that runs pipelines under named schedules only (``Feature.schedules``; DeepSpeed's ZeRO
runs its pipeline engine's own 1F1B): a third party's declaration holds in a prediction and in a
search, exactly as a built-in's."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from mofa_framework import Predictor, hookimpl
from mofa_framework.batch import FeatureRows
from mofa_framework.errors import ConfigError
from mofa_framework.invariants import schedule_result
from mofa_framework.manager import MofaPluginManager
from mofa_framework.tuner import TuneRequest, default_space, tune
from mofa_framework.types import CostTransform

JOB = {"model": {"name": "llama3-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 16},
       "parallel": {"tp": 2, "pp": 2, "global_batch_size": 32, "sequence_length": 4096}}


def _slower(state, rows):
    """1 % more forward compute where the feature is on (a distinct configuration, not an equivalent)."""
    on = np.asarray(rows.enabled, bool)
    layers = {k: attrs.evolve(c, fwd_compute_s=np.where(on, c.fwd_compute_s * 1.01, c.fwd_compute_s))
              for k, c in state.layers.items()}
    return attrs.evolve(state, layers=layers)


class GpipeOnly:
    @hookimpl
    def mofa_register_cost_transforms(self):
        return [CostTransform(name="gpipe_only", description="runs its pipelines under GPipe only", layer=_slower,
                              schedules=("gpipe",))]


@pytest.fixture(scope="module")
def pred() -> Predictor:
    pm = MofaPluginManager(strict=False)
    pm.load_entrypoints(builtin_only=True)
    pm.register_plugin(GpipeOnly(), "gpipe_only_plugin")
    return Predictor(pm=pm)


def _job(pred, schedule, pp=2):
    return pred.job({**JOB, "parallel": {**JOB["parallel"], "pp": pp}, "pipeline": {"schedule": schedule},
                     "features": {"gpipe_only": {}}})


def test_a_prediction_under_another_schedule_is_one_line_naming_the_feature(pred):
    with pytest.raises(ConfigError, match=r"^job: features.gpipe_only runs a pipeline only under the gpipe schedule: "
                                          r"set pipeline.schedule = 'gpipe', or parallel.pp = 1$") as exc:
        pred.predict(_job(pred, "1f1b"))
    assert "\n" not in str(exc.value)
    assert pred.predict(_job(pred, "gpipe"))[0].step_time_s > 0
    assert pred.predict(_job(pred, "1f1b", pp=1))[0].step_time_s > 0  # no pipeline: any schedule


def test_the_rule_by_hand():
    """Rows: (on, pp, schedule) → feasible = off, or pp ≤ 1, or the schedule is named."""
    registry = type("R", (), {"schedules": {"1f1b": None, "gpipe": None, "zb-v": None}})()
    feat = CostTransform(name="x", description="x", schedules=("gpipe", "zb-v"))
    batch = type("B", (), {"pp": np.array([2, 2, 2, 1, 4, 2]), "schedule": np.array([0, 1, 2, 0, 0, 0])})()
    rows = FeatureRows(enabled=np.array([True, True, True, True, True, False]))
    r = schedule_result(registry, feat, batch, rows)
    assert r.feasible.tolist() == [False, True, True, True, False, True]
    assert "gpipe / zb-v" in r.reason
    assert schedule_result(registry, CostTransform(name="y", description="y"), batch, rows) is None


def test_a_search_pairs_it_with_the_named_schedule_only(pred):
    reg = pred.registry
    model, hw = reg.model("llama3-8b"), reg.hardware["h100-sxm5-80gb"]
    space = attrs.evolve(default_space(reg, model, hw, 16, 4096, features=["gpipe_only"]), tp=(2,), pp=(1, 2, 4),
                         vpp=(1,), cp=(1,), micro_batch_size=(1,), lighter_ends=(0,), lighter_last=(0,))
    best = tune(pred, TuneRequest(model=model, hardware=hw, num_gpus=16, global_batch_size=32, sequence_length=4096,
                                  space=space, top_k=10_000)).best
    with_it = [c for c in best if "gpipe_only" in c.features]
    assert {c.schedule for c in best if c.parallel["pp"] > 1} - {"gpipe"}  # the others still run without it
    assert with_it and all(c.parallel["pp"] == 1 or c.schedule == "gpipe" for c in with_it)
    assert any(c.parallel["pp"] > 1 for c in with_it)
