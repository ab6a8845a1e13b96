"""Every zoo model through `mofa tune`'s default search on H100s: a configuration that fits, and
only possible numbers (the engine's own invariants check each candidate; this checks the answer a
user reads). Scale as a user would start: 64 GPUs, 1,024 for models above 100B parameters, four
sequences of 4,096 tokens per GPU (at most 2,048 in all). The search may stop at its time budget
(an answer labelled not proven optimal); how fast it is, is `benchmarks/tune_benchmark.py`'s."""

from __future__ import annotations

import math

from mofa_framework.decompose import total_params
from mofa_framework.tuner import TuneRequest, default_space, tune

HARDWARE = "h100-sxm5-80gb"
SEQ = 4096


def _job(model) -> tuple[int, int]:
    gpus = 1024 if total_params(model)["total"] > 1e11 else 64
    return gpus, min(4 * gpus, 2048)


def _problems(best, model, hbm_gib: float) -> list[str]:
    out = []
    if not (math.isfinite(best.step_time_s) and best.step_time_s > 0):
        out.append(f"step {best.step_time_s}")
    if not 0 < best.mfu <= 1:
        out.append(f"MFU {best.mfu}")
    if not 0 < best.peak_memory_gib <= hbm_gib:
        out.append(f"peak {best.peak_memory_gib:.1f} GiB on a {hbm_gib:.1f} GiB part")
    p = best.parallel
    if p["tp"] * p["pp"] * p["cp"] * p["dp"] != _job(model)[0]:
        out.append(f"TP·PP·CP·DP = {p['tp'] * p['pp'] * p['cp'] * p['dp']} GPUs")
    return out


def test_every_zoo_model_tunes_to_a_fitting_configuration(mofa_predictor):
    reg = mofa_predictor.registry
    hw = reg.hardware_profile(HARDWARE)
    failures = []
    for name in sorted(reg.models):
        model = reg.model(name)
        gpus, gbs = _job(model)
        req = TuneRequest(model=model, hardware=hw, num_gpus=gpus, global_batch_size=gbs, sequence_length=SEQ,
                          space=default_space(reg, model, hw, gpus, SEQ), top_k=1, time_budget_s=1.0)
        try:
            res = tune(mofa_predictor, req)
        except Exception as e:  # noqa: BLE001 - every model's failure is listed, not only the first
            failures.append(f"{name}: {type(e).__name__}: {e}")
            continue
        if not res.best:
            failures.append(f"{name}: no configuration fits ({gpus} GPUs, batch {gbs})")
            continue
        failures += [f"{name}: {p}" for p in _problems(res.best[0], model, hw.hbm_bytes / 2**30)]
    assert not failures, "\n".join(failures)
