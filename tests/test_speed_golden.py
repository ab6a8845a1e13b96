"""Speed work changes no number: a seeded random sample of every job's ranked candidates, and each
job's Pareto front, equal bit for bit the values recorded before the evaluator was made faster.

Each job is a small sub-space of `mofa tune`'s default space (every tunable feature, every
schedule), searched for its top 200 (and, evaluating every candidate, its Pareto front): the ranking comes
from the tuner's lean path and each kept candidate's numbers from a full prediction. Regenerate (only when a
change is meant to move numbers) with ``python tests/test_speed_golden.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import attrs
import numpy as np
import pytest

from mofa_framework import Predictor
from mofa_framework.tuner import TuneRequest, default_space, tune

GOLDEN = Path(__file__).parent / "data" / "speed_golden.json"
SAMPLE = 25
#: ranked candidates per job (the tuner's bounds prune the rest)
TOP_K = 200
#: (model, hardware, GPUs, global batch, sequence, narrowing of the default space)
JOBS = {
    "dense": ("llama3.1-405b", "h100-sxm5-80gb", 1024, 512, 8192, {"tp": (8,), "pp": (8, 16), "cp": (1, 2),
                                                                   "micro_batch_size": (1,)}),
    "moe": ("deepseek-v3", "h800-sxm5-80gb", 1024, 4096, 4096, {"tp": (2,), "pp": (8,), "ep": (64,), "etp": (1,),
                                                                "micro_batch_size": (1,),
                                                                "schedules": ("1f1b", "zb-h1", "dualpipe"),
                                                                "lighter_last": (0,)}),  # the space recorded
    "hybrid": ("nemotron-h-8b", "a100-sxm4-80gb", 16, 64, 4096, {"tp": (2, 4), "pp": (2,), "micro_batch_size": (1,),
                                                                 "schedules": ("1f1b", "interleaved-1f1b")}),
}


def _request(predictor, job, pareto: bool):
    model_name, hw_name, gpus, gbs, seq, narrow = job
    reg = predictor.registry
    model, hw = reg.model(model_name), reg.hardware_profile(hw_name)
    tunable = [n for n, f in reg.features.items() if f.tunable]
    space = attrs.evolve(default_space(reg, model, hw, gpus, seq, features=tunable), **narrow)
    return TuneRequest(model=model, hardware=hw, num_gpus=gpus, global_batch_size=gbs, sequence_length=seq,
                       space=space, pareto=pareto, top_k=TOP_K)


def _row(c) -> dict:
    return {"parallel": dict(c.parallel), "schedule": c.schedule, "features": json.loads(json.dumps(c.features)),
            "step_time_s": c.step_time_s, "mfu": c.mfu, "peak_memory_gib": c.peak_memory_gib,
            "breakdown": dict(c.breakdown), "memory_breakdown": dict(c.memory_breakdown)}


def sample(predictor, job) -> dict:
    """Ranked candidates (a seeded sample of ranks, and how many there are) and the Pareto front."""
    best = tune(predictor, _request(predictor, job, pareto=False)).best
    ranks = sorted(np.random.default_rng(15).choice(len(best), size=min(SAMPLE, len(best)), replace=False).tolist())
    front = tune(predictor, _request(predictor, job, pareto=True)).pareto
    return {"ranked": len(best), "sample": {str(r): _row(best[r]) for r in ranks}, "pareto": [_row(c) for c in front]}


@pytest.fixture(scope="module")
def golden():
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", sorted(JOBS))
def test_numbers_unchanged_by_speed_work(mofa_predictor, golden, name):
    got = json.loads(json.dumps(sample(mofa_predictor, JOBS[name])))
    want = golden[name]
    assert got["ranked"] == want["ranked"]
    assert got["sample"] == want["sample"]  # exact floats: the same configurations at the same ranks
    assert got["pareto"] == want["pareto"]


if __name__ == "__main__":
    predictor = Predictor()
    GOLDEN.write_text(json.dumps({n: sample(predictor, j) for n, j in JOBS.items()}, sort_keys=True) + "\n")
    sys.exit(0)


def test_layer_costs_taken_to_rows_read_as_the_rows_themselves():
    """Past the layer phase the engine repeats a layer's costs to every row lazily (engine._expand):
    each field, property and rows-of-rows read equals the eager gather, and evolving one builds a
    whole LayerCosts."""
    from mofa_framework import engine

    names = [f.name for f in attrs.fields(engine.LayerCosts)]
    rng = np.random.default_rng(0)
    c = engine.LayerCosts(**{n: rng.random(3) for n in names})
    inv, inv2 = np.array([2, 0, 0, 1]), np.array([3, 1])
    taken = engine._expand(c, inv)
    for n in names:
        np.testing.assert_array_equal(getattr(taken, n), getattr(c, n)[inv])
    np.testing.assert_array_equal(taken.fwd_s, c.fwd_s[inv])
    np.testing.assert_array_equal(engine.layer_work_s(taken), engine.layer_work_s(c)[inv])
    twice = engine._expand(engine._expand(c, inv), inv2)
    np.testing.assert_array_equal(twice.bwd_input_total_s, c.bwd_input_total_s[inv][inv2])
    changed = attrs.evolve(twice, recompute_s=np.zeros(2))
    np.testing.assert_array_equal(changed.act_saved_bytes, c.act_saved_bytes[inv][inv2])
    assert isinstance(changed, engine.LayerCosts) and not changed.recompute_s.any()
