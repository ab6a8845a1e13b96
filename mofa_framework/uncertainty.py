"""Error bands, extrapolation flags and sensitivities of a prediction.

**Bands.** Every prediction carries the range its step time will likely fall in: the
:data:`COVERAGE` central share (10th to 90th percentile) of the cross-validated errors of the
published runs nearest to the job. The errors are those of ``mofa calibrate --cross-validate``
(each run predicted by profiles fitted without its source), shipped as a generated table
(``mofa_framework/data/cross_validation.csv``, written by ``benchmarks/validation_report.py``,
never by hand). With ``e = ln(predicted / measured)`` of the chosen rows, the band is
``[t·exp(−q90(e)), t·exp(−q10(e))]``: a model that runs slow on similar jobs moves the band up.

The nearest rows (:func:`band`): the rows on the job's GPU — or, for a GPU with none, on the
GPUs closest to it in bf16 peak and HBM bandwidth — then the first of these with at least
:data:`MIN_ROWS` rows: same precision, model family and scale (GPU count within ×:data:`SCALE_SPAN`);
same precision and family; same precision; any.

**Flags** say where the job is outside the calibrated regimes: a GPU with no rows, a precision or
a model family with no rows on that GPU, more GPUs than :data:`SCALE_SPAN` times the largest
calibrated run on it, a pipeline schedule or a feature that no validated run used. A flagged band
does not take each row's leave-one-source-out error but the largest of its held-out errors that
match the extrapolation: the leave-one-precision-on-one-GPU-out error for a GPU or precision
without rows, the leave-one-model-family-out error for a family, and the largest over every
leave-one-out kind for a schedule, a feature or a scale never validated — so where a schedule or
feature has no validation data, its band widens to what holding out a whole regime cost.

**Sensitivity** (:func:`sensitivity`): ∂ ln(step) / ∂ ln(c) for each coefficient c of the
hardware profile's ``[efficiency]`` table, by central finite differences (±:data:`SENSITIVITY_STEP`
relative; one-sided at a bound), one prediction per perturbed profile.
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
import numpy as np

from .crossval import KINDS, Regime, regime_of

TABLE = Path(__file__).resolve().parent / "data" / "cross_validation.csv"
#: the central share of the held-out errors a band covers
COVERAGE = 0.8
#: fewest rows a band is drawn from
MIN_ROWS = 10
#: rows within this factor of the job's GPU count are "at its scale"; a job beyond this factor
#: times the largest calibrated run on its GPU is flagged
SCALE_SPAN = 8


@attrs.frozen(kw_only=True)
class Band:
    """The likely range of a predicted step time and what it was drawn from."""

    low_s: float
    high_s: float
    #: rows the band was drawn from, and which (a sentence)
    rows: int
    basis: str
    #: where the job lies outside the calibrated regimes, one sentence each
    flags: tuple[str, ...] = ()

    @property
    def half_width_s(self) -> float:
        return 0.5 * (self.high_s - self.low_s)


@attrs.frozen(kw_only=True, eq=False)
class ResidualTable:
    """The shipped table as arrays (one entry per validated row)."""

    source: np.ndarray
    gpu: np.ndarray
    precision: np.ndarray
    family: np.ndarray
    schedule: np.ndarray
    features: tuple[frozenset[str], ...]
    num_gpus: np.ndarray
    #: ln(predicted / measured): in-sample and under each leave-one-out kind
    log_error: Mapping[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.gpu)

    def subset(self, keep: np.ndarray) -> ResidualTable:
        """The rows where `keep` is true."""
        return ResidualTable(source=self.source[keep], gpu=self.gpu[keep], precision=self.precision[keep],
                             family=self.family[keep], schedule=self.schedule[keep],
                             features=tuple(f for f, k in zip(self.features, keep) if k), num_gpus=self.num_gpus[keep],
                             log_error={k: v[keep] for k, v in self.log_error.items()})


def read_table(path: str | Path = TABLE) -> ResidualTable:
    """The residual table at `path` (comment lines skipped)."""
    path = Path(path)
    lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")] if path.exists() else []
    rows = list(csv.DictReader(lines))
    col = lambda k: np.array([r[k] for r in rows], dtype=object)  # noqa: E731
    meas = np.array([float(r["measured_s"]) for r in rows])
    errs = {"in-sample": np.log(np.array([float(r["in_sample_s"]) for r in rows]) / meas)}
    for k in KINDS:
        name = f"{k.replace('-', '_')}_out_s"
        if rows and name in rows[0]:
            errs[k] = np.log(np.array([float(r[name]) for r in rows]) / meas)
    return ResidualTable(source=col("source"), gpu=col("gpu"), precision=col("precision"), family=col("family"),
                         schedule=col("schedule"), features=tuple(frozenset(filter(None, r["features"].split(";"))) for r in rows),
                         num_gpus=np.array([int(r["num_gpus"]) for r in rows], dtype=float), log_error=errs)


@functools.cache
def shipped_table() -> ResidualTable:
    return read_table(TABLE)


def _similar_gpus(gpu: str, table: ResidualTable, registry) -> list[str]:
    """GPUs of the table, nearest first by |Δ ln bf16 peak| + |Δ ln HBM bandwidth| (unknown last)."""
    def spec(name):
        hw = registry.hardware.get(name)
        return None if hw is None else (math.log(hw.peak_flops_per_s("bf16")), math.log(hw.hbm_bandwidth_bytes_per_s))

    me = spec(gpu)
    names = list(dict.fromkeys(table.gpu))
    if me is None:
        return names

    def dist(name):
        s = spec(name)
        return math.inf if s is None else abs(s[0] - me[0]) + abs(s[1] - me[1])

    return sorted(names, key=dist)


def _worst(errors: Sequence[np.ndarray]) -> np.ndarray:
    """Per row, the error of largest magnitude among `errors` (NaN ignored)."""
    stack = np.vstack(errors)
    mag = np.where(np.isfinite(stack), np.abs(stack), -1.0)
    return stack[np.argmax(mag, axis=0), np.arange(stack.shape[1])]


def band(step_s: float, regime: Regime, registry, table: ResidualTable | None = None) -> Band:
    """The band of a step time `step_s` predicted for a job of `regime` (see the module doc)."""
    table = shipped_table() if table is None else table
    if not len(table) or "source" not in table.log_error:
        return Band(low_s=math.nan, high_s=math.nan, rows=0, basis="no cross-validation table",
                    flags=("no cross-validation table is installed: no band",))
    flags: list[str] = []
    kinds = {"source"}
    on_gpu = table.gpu == regime.gpu
    where = regime.gpu
    if not on_gpu.any():
        near: list[str] = []
        on_gpu = np.zeros(len(table), bool)
        for g in _similar_gpus(regime.gpu, table, registry):
            near.append(g)
            on_gpu |= table.gpu == g
            if (on_gpu & (table.precision == regime.precision)).sum() >= MIN_ROWS:
                break
        where = ", ".join(near)
        flags.append(f"no calibration rows for {regime.precision} on {regime.gpu}; band from similar GPUs ({where})")
        kinds.add("gpu-precision")
    elif not (on_gpu & (table.precision == regime.precision)).any():
        flags.append(f"no calibration rows for {regime.precision} on {regime.gpu}; band from its other precisions")
        kinds.add("gpu-precision")
    if on_gpu.any() and not (on_gpu & (table.family == regime.family)).any():
        flags.append(f"no calibration rows for {regime.family} models on {where}")
        kinds.add("model-family")
    largest = float(table.num_gpus[on_gpu].max()) if on_gpu.any() else 0.0
    if regime.num_gpus > SCALE_SPAN * largest:
        flags.append(f"{regime.num_gpus:,} GPUs: more than {SCALE_SPAN}× the largest calibrated run on {where} "
                     f"({largest:,.0f} GPUs)")
        kinds.update(KINDS)
    if not (table.schedule == regime.schedule).any():
        flags.append(f"no validated run uses the {regime.schedule} schedule: band widened")
        kinds.update(KINDS)
    seen = frozenset().union(*table.features)
    for f in regime.features:
        if f not in seen:
            flags.append(f"no validated run uses the {f} feature: band widened")
            kinds.update(KINDS)
    same_prec = table.precision == regime.precision
    same_fam = table.family == regime.family
    near_scale = (table.num_gpus * SCALE_SPAN >= regime.num_gpus) & (table.num_gpus <= SCALE_SPAN * regime.num_gpus)
    levels = ((same_prec & same_fam & near_scale, f"{regime.precision}, {regime.family}, ~{regime.num_gpus:,} GPUs"),
              (same_prec & same_fam, f"{regime.precision}, {regime.family}"), (same_prec, regime.precision),
              (np.ones(len(table), bool), "every precision"))
    sel, what = next(((on_gpu & m, w) for m, w in levels if (on_gpu & m).sum() >= MIN_ROWS), (on_gpu, "every row"))
    if not sel.any():
        sel, what, where = np.ones(len(table), bool), "every validated run", "any GPU"
    e = _worst([table.log_error[k] for k in KINDS if k in kinds and k in table.log_error])[sel]
    e = e[np.isfinite(e)]
    lo_q, hi_q = np.percentile(e, [50 * (1 - COVERAGE), 50 * (1 + COVERAGE)])
    held = "held-out" if kinds == {"source"} else "worst held-out"
    return Band(low_s=float(step_s * math.exp(-hi_q)), high_s=float(step_s * math.exp(-lo_q)), rows=int(len(e)),
                basis=f"{COVERAGE:.0%} of the {held} errors of {len(e)} runs on {where} ({what})", flags=tuple(flags))


def band_for(result, job, registry, table: ResidualTable | None = None) -> Band:
    """The band of a :class:`~mofa_framework.api.PredictionResult` of `job`."""
    return band(result.step_time_s, regime_of(job, result.mfu_precision), registry, table)


def row_regime(table: ResidualTable, i: int) -> Regime:
    """The :class:`~mofa_framework.crossval.Regime` of the table's row `i`."""
    return Regime(gpu=str(table.gpu[i]), precision=str(table.precision[i]), family=str(table.family[i]),
                  schedule=str(table.schedule[i]), features=tuple(sorted(table.features[i])),
                  num_gpus=int(table.num_gpus[i]))


def held_out_coverage(table: ResidualTable, registry) -> dict[str, tuple[int, int]]:
    """Per source, then ``overall``: (rows whose measured step time falls inside the band, rows).

    Each row is predicted by profiles fitted without its source (its leave-one-source-out
    prediction) and its band is drawn from the table *without that source* — what a user whose
    run is new to MoFa gets. Inside means ``low ≤ measured ≤ high``; for a band of
    :data:`COVERAGE` = 0.8 drawn from errors like the row's, about 80 % of rows fall inside."""
    out: dict[str, list[int]] = {}
    e = table.log_error["source"]
    for src in dict.fromkeys(table.source):
        others = table.subset(table.source != src)
        for i in np.flatnonzero(table.source == src):
            if not np.isfinite(e[i]):
                continue
            b = band(math.exp(e[i]), row_regime(table, i), registry, others)  # measured step time = 1
            hit = out.setdefault(str(src), [0, 0])
            hit[0] += int(b.low_s <= 1.0 <= b.high_s)
            hit[1] += 1
    total = [sum(v[0] for v in out.values()), sum(v[1] for v in out.values())]
    return {k: (v[0], v[1]) for k, v in {**out, "overall": total}.items()}


# ====================================================================== sensitivity

#: relative step of the finite differences
SENSITIVITY_STEP = 0.05


@attrs.frozen(kw_only=True)
class Sensitivity:
    coefficient: str
    value: float
    #: ∂ ln(step time) / ∂ ln(coefficient)
    elasticity: float


def sensitivity(predictor, job, top: int | None = None) -> list[Sensitivity]:
    """The efficiency coefficients `job`'s step time depends on, largest |∂ ln t / ∂ ln c| first
    (coefficients at 0 have no relative derivative and are left out; `top` keeps the first few)."""
    import attrs as _attrs

    from .types import EfficiencySpec

    hw = job.hardware
    base = math.log(_step(predictor, job))
    out = []
    for f in _attrs.fields(EfficiencySpec):
        c = float(getattr(hw.efficiency, f.name))
        if c == 0:
            continue
        pts = []
        for sign in (1.0, -1.0):
            try:
                eff = _attrs.evolve(hw.efficiency, **{f.name: c * (1.0 + sign * SENSITIVITY_STEP)})
            except ValueError:  # outside the coefficient's bounds: one-sided
                continue
            pts.append((math.log1p(sign * SENSITIVITY_STEP),
                        math.log(_step(predictor, _attrs.evolve(job, hardware=_attrs.evolve(hw, efficiency=eff))))))
        if not pts:
            continue
        if len(pts) == 2:
            d = (pts[0][1] - pts[1][1]) / (pts[0][0] - pts[1][0])
        else:
            d = (pts[0][1] - base) / pts[0][0]
        out.append(Sensitivity(coefficient=f.name, value=c, elasticity=float(d)))
    out.sort(key=lambda s: -abs(s.elasticity))
    return out[:top] if top else out


def _step(predictor, job) -> float:
    return float(predictor._evaluate_jobs([job]).step_time_s[0])
