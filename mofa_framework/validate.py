"""Validation against published measurements (``mofa validate``): prediction and scoring.

Reading a measurement file is not done here: :mod:`mofa_framework.measurements` matches each file
to a reader (a plugin's, through ``mofa_register_measurement_readers``, or the core's plain
schema) that turns every row into a job (:class:`~mofa_framework.types.MappedRow`) or lists it
with the reason (:class:`~mofa_framework.types.SkippedRow`). This module predicts the mapped rows
— rows sharing model and hardware as one batch (:func:`prepare` + :func:`predict_prepared`),
feasibility checked row by row, unstated settings resolved to what a tuned run would use
(:func:`resolve_unstated`) — and scores them: per row measured vs predicted step time, per
source MAPE / p90 / max / bias, Spearman rank correlation of strategies within a model and
top-1 regret (:func:`validate` → :class:`ValidationResult`), errors grouped by any key
(:func:`group_errors`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from .batch import PRECISIONS
from .config import listing
from .errors import ConfigError
from .measurements import map_files, map_rows  # noqa: F401  (map_rows: part of this module's API)
from .types import ALLOCATOR_COUNTERS, MappedRow, SkippedRow
from .units import GIB

__all__ = ["ErrorStats", "GroupErrors", "MappedRow", "RankStats", "RowResult", "SkippedRow", "SourceSummary",
           "ValidationResult", "group_errors", "group_keys", "map_rows", "predict_prepared", "prepare",
           "resolve_unstated", "spearman", "validate"]


# ====================================================================== records

@attrs.frozen(kw_only=True)
class RowResult:
    source: str
    reference: str
    row_id: str
    model: str
    hardware: str
    num_gpus: int
    strategy: str
    target: str
    measured_s: float
    predicted_s: float
    #: predicted / measured − 1
    error: float
    measured_tflops: float | None
    #: the source's own TFLOPS convention applied to the predicted time (= measured FLOPs / predicted time)
    predicted_tflops_source_convention: float | None
    predicted_model_tflops: float
    tflops_convention: str
    measured_memory_gib: float | None
    #: the predicted peak in the measured figure's counter (``memory_counter``): less the runtime's
    #: memory outside the caching allocator for ``allocated`` / ``reserved``, else the whole peak
    predicted_memory_gib: float
    fits_in_memory: bool
    group: tuple | None = None
    #: seconds per sequence (ranking key: step time / global batch)
    measured_s_per_seq: float = 0.0
    predicted_s_per_seq: float = 0.0
    #: what the mapping assumed beyond the row (``MappedRow.assumptions``)
    assumptions: str = ""
    #: what the measured memory counts (``MappedRow.memory_counter``)
    memory_counter: str = ""
    #: the format the GEMMs ran in (:data:`~mofa_framework.batch.PRECISIONS`: the row's precision, or
    #: fp8 / fp4 where a feature runs them there)
    precision: str = ""
    #: the software stack and its generation as the reader names it (``MappedRow.framework``)
    framework: str = ""


@attrs.frozen(kw_only=True)
class ErrorStats:
    n: int
    mape: float
    p90: float
    max: float
    #: mean signed error (bias)
    bias: float

    @classmethod
    def of(cls, errors: Sequence[float]) -> ErrorStats:
        e = np.asarray(list(errors), dtype=float)
        if not len(e):
            return cls(n=0, mape=math.nan, p90=math.nan, max=math.nan, bias=math.nan)
        a = np.abs(e)
        return cls(n=len(e), mape=float(a.mean()), p90=float(np.percentile(a, 90)), max=float(a.max()),
                   bias=float(e.mean()))


@attrs.frozen(kw_only=True)
class RankStats:
    """Strategy ranking within groups of ≥ 3 strategies (same source, model, hardware, GPU count; rows
    of one job measured more than once count once: :func:`strategies`)."""

    groups: int
    #: Spearman ρ per group key
    spearman: dict[str, float]
    #: top-1 regret per group: measured time/seq of the predicted best ÷ measured best − 1
    regret: dict[str, float]

    @property
    def spearman_mean(self) -> float:
        return float(np.mean(list(self.spearman.values()))) if self.spearman else math.nan

    @property
    def spearman_min(self) -> float:
        return float(min(self.spearman.values())) if self.spearman else math.nan

    @property
    def regret_mean(self) -> float:
        return float(np.mean(list(self.regret.values()))) if self.regret else math.nan

    @property
    def regret_max(self) -> float:
        return float(max(self.regret.values())) if self.regret else math.nan


@attrs.frozen(kw_only=True)
class SourceSummary:
    source: str
    rows: int
    skipped: int
    step_time: ErrorStats
    memory: ErrorStats
    ranking: RankStats
    targets: dict[str, int]
    #: rows predicted not to fit in memory: each row is a run that completed, so every one of them is a
    #: memory over-estimate (or a layout the source misstates) — a check every row gives, memory column
    #: or not; a tuner search would have ruled these configurations out
    ran_over_memory: int = 0


@attrs.frozen(kw_only=True)
class ValidationResult:
    rows: list[RowResult]
    skipped: list[SkippedRow]
    sources: list[SourceSummary]
    overall: SourceSummary
    #: files passed over (not measurement files, no rows) and other remarks, one line each
    notes: list[str] = attrs.field(factory=list)

    def to_dict(self) -> dict[str, Any]:
        def summary(s: SourceSummary) -> dict:
            d = attrs.asdict(s)
            d["ranking"].update(spearman_mean=s.ranking.spearman_mean, spearman_min=s.ranking.spearman_min,
                                regret_mean=s.ranking.regret_mean, regret_max=s.ranking.regret_max)
            return d

        return {"overall": summary(self.overall), "sources": [summary(s) for s in self.sources],
                "rows": [attrs.asdict(r) for r in self.rows], "skipped": [attrs.asdict(s) for s in self.skipped],
                "notes": list(self.notes)}


# ====================================================================== prediction


@attrs.frozen(kw_only=True, eq=False)
class PreparedGroup:
    """Feasible rows sharing model + hardware, as one batch (re-evaluable with other efficiencies)."""

    model: Any
    hardware: Any
    batch: Any
    rows: list[int]  # indices into the mapped list
    jobs: list[Any]


def prepare(mapped: Sequence[MappedRow], predictor) -> tuple[list[PreparedGroup], list[SkippedRow]]:
    """Resolve jobs, check feasibility, and group feasible rows into batches."""
    from .config import jobs_to_batch
    from .errors import MofaError

    infeasible: list[SkippedRow] = []
    groups: dict[tuple, list[tuple[int, Any]]] = defaultdict(list)
    for i, m in enumerate(mapped):
        try:
            job = predictor.job(m.job, name=f"{m.source}:{m.row_id}")
        except MofaError as exc:
            infeasible.append(SkippedRow(source=m.source, reference=m.reference, row_id=m.row_id,
                                         model=str(m.job["model"].get("name")), reason=str(exc), kind="infeasible"))
            continue
        groups[job.batch_key].append((i, job))
    out: list[PreparedGroup] = []
    for members in groups.values():
        jobs = [j for _, j in members]
        model, hw = jobs[0].model, jobs[0].hardware
        batch = jobs_to_batch(jobs, predictor.registry)
        ok = np.ones(len(jobs), dtype=bool)
        reasons: dict[int, str] = {}
        for c in predictor.constraints(batch, model, hw):
            bad = ~np.asarray(c.feasible, bool)
            for k in np.flatnonzero(bad & ok):
                if c.name in mapped[members[k][0]].ignore_constraints:
                    continue
                ok[k] = False
                reasons[k] = f"{c.name}: {c.reason_for(k)}"
        for k, reason in reasons.items():
            m = mapped[members[k][0]]
            infeasible.append(SkippedRow(source=m.source, reference=m.reference, row_id=m.row_id,
                                         model=model.name, reason=reason, kind="infeasible"))
        keep = [members[k] for k in np.flatnonzero(ok)]
        if not keep:
            continue
        kjobs = [j for _, j in keep]
        out.append(PreparedGroup(model=model, hardware=hw, batch=jobs_to_batch(kjobs, predictor.registry),
                                 rows=[i for i, _ in keep], jobs=kjobs))
    return out, infeasible


def predict_prepared(groups: Sequence[PreparedGroup], predictor, hardware_override: dict | None = None,
                     n_rows: int | None = None, failed: list[tuple[int, str]] | None = None
                     ) -> dict[str, np.ndarray]:
    """Arrays over the mapped rows (NaN where not predicted): step time, model TFLOPS, memory, fit and
    the GEMMs' format (``precision``: an index into :data:`~mofa_framework.batch.PRECISIONS`).

    ``hardware_override`` maps a profile name to a :class:`HardwareProfile` whose efficiency
    coefficients replace the group's (calibration evaluates the same batches with other
    coefficients); the group's own run settings — a power limit, another network — stay. With ``failed`` (a
    list) a group the engine cannot price (a plugin's answer breaks an invariant) is split until
    the rows at fault are alone: each is appended as (row, message) and left NaN, the others are
    predicted. Without it the error propagates (a fit must not silently lose rows).
    """
    n = n_rows if n_rows is not None else (max((max(g.rows) for g in groups), default=-1) + 1)
    out = {k: np.full(n, np.nan) for k in ("step_s", "model_tflops", "memory_gib", "runtime_gib", "fits", "precision")}
    for g in groups:
        repl = (hardware_override or {}).get(g.hardware.name)
        hw = g.hardware if repl is None else attrs.evolve(g.hardware, efficiency=repl.efficiency)
        for idx, pred in _priced(g, predictor, hw, failed):
            _store(out, idx, pred)
    return out


def _priced(g: PreparedGroup, predictor, hw, failed: list[tuple[int, str]] | None):
    """(rows, prediction) pairs covering the group's rows the engine can price (see
    :func:`predict_prepared`): the whole group in one evaluation when it succeeds, else its halves."""
    from .config import jobs_to_batch
    from .errors import PluginError

    try:
        return [(np.asarray(g.rows), predictor.evaluate(g.batch, g.model, hw))]
    except PluginError as exc:
        if failed is None:
            raise
        if len(g.rows) == 1:
            failed.append((g.rows[0], str(exc)))
            return []
    half = len(g.rows) // 2
    parts = []
    for sl in (slice(0, half), slice(half, None)):
        jobs = g.jobs[sl]
        sub = attrs.evolve(g, batch=jobs_to_batch(jobs, predictor.registry), rows=g.rows[sl], jobs=jobs)
        parts += _priced(sub, predictor, hw, failed)
    return parts


def _store(out: dict[str, np.ndarray], idx: np.ndarray, pred) -> None:
    out["step_s"][idx] = pred.step_time_s
    out["model_tflops"][idx] = pred.model_tflops_per_gpu
    out["memory_gib"][idx] = pred.peak_memory_gib
    out["runtime_gib"][idx] = pred.memory_breakdown["runtime"] / GIB
    out["fits"][idx] = np.asarray(pred.fits_in_memory, float)
    out["precision"][idx] = pred.mfu_precision


def not_priced(m: MappedRow, message: str) -> SkippedRow:
    """A row the engine could not price (a plugin's answer broke an output invariant), listed as not
    predicted instead of stopping the whole validation: an internal error to report, not bad input."""
    return SkippedRow(source=m.source, reference=m.reference, row_id=m.row_id, model=str(m.job["model"].get("name")),
                      reason=f"internal error, please report it: {message}", kind="error")


def _strategy(job: dict) -> str:
    p = job["parallel"]
    bits = [f"TP{p.get('tp', 1)}", f"PP{p.get('pp', 1)}"]
    if p.get("vpp", 1) > 1:
        bits.append(f"v{p['vpp']}")
    if p.get("cp", 1) > 1:
        bits.append(f"CP{p['cp']}")
    if p.get("ep", 1) > 1:
        bits.append(f"EP{p['ep']}")
    bits.append(f"mbs{p.get('micro_batch_size', 1)}")
    bits.append(f"gbs{p['global_batch_size']}")
    sched = job.get("pipeline", {}).get("schedule")
    if sched and sched not in ("1f1b",):
        bits.append(sched)
    rec = job.get("features", {}).get("recompute")
    if rec:  # options given; the granularity only when stated (a row may set modules alone)
        bits.append(f"rc-{rec['granularity']}" if "granularity" in rec else "rc")
    return " ".join(bits)


def compared_memory_gib(arrays: dict[str, np.ndarray], i: int, m: MappedRow) -> float:
    """Row `i`'s predicted peak in the counter its measurement uses: PyTorch's allocator counters
    (``allocated``, ``reserved``) leave out the runtime's memory (CUDA context, NCCL)."""
    peak = float(arrays["memory_gib"][i])
    return peak - float(arrays["runtime_gib"][i]) if m.memory_counter in ALLOCATOR_COUNTERS else peak


def _precision(arrays: dict[str, np.ndarray], i: int) -> str:
    """Row `i`'s GEMM format from the arrays' ``precision`` index ("" where they carry none)."""
    code = arrays.get("precision")
    return PRECISIONS[int(code[i])] if code is not None and np.isfinite(code[i]) else ""


def row_results(mapped: Sequence[MappedRow], arrays: dict[str, np.ndarray]) -> list[RowResult]:
    out = []
    for i, m in enumerate(mapped):
        t = arrays["step_s"][i]
        if not np.isfinite(t):
            continue
        gbs = m.job["parallel"]["global_batch_size"]
        out.append(RowResult(
            source=m.source, reference=m.reference, row_id=m.row_id, model=str(m.job["model"]["name"]),
            hardware=m.job["hardware"]["name"], num_gpus=m.job["hardware"]["num_gpus"], strategy=_strategy(m.job),
            target=m.target, measured_s=m.measured_s, predicted_s=float(t), error=float(t / m.measured_s - 1.0),
            measured_tflops=m.measured_tflops,
            predicted_tflops_source_convention=(m.measured_tflops * m.measured_s / float(t)
                                                if m.measured_tflops else None),
            predicted_model_tflops=float(arrays["model_tflops"][i]), tflops_convention=m.tflops_convention,
            measured_memory_gib=m.measured_memory_gib, predicted_memory_gib=compared_memory_gib(arrays, i, m),
            fits_in_memory=bool(arrays["fits"][i] > 0.5), group=m.group,
            measured_s_per_seq=m.measured_s / gbs, predicted_s_per_seq=float(t) / gbs, assumptions=m.assumptions,
            memory_counter=m.memory_counter, precision=_precision(arrays, i), framework=m.framework))
    return out


# ====================================================================== statistics


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's ρ with average ranks for ties."""
    def ranks(v):
        v = np.asarray(v, float)
        order = np.argsort(v, kind="mergesort")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for val in np.unique(v):  # average ties
            sel = v == val
            if sel.sum() > 1:
                r[sel] = r[sel].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def strategies(members: Sequence) -> tuple[list[float], list[float]]:
    """(measured, predicted) time per sequence of each strategy among rows of one group: rows the
    model predicts alike (to a relative 1e-9: the same job as mapped) are one strategy measured more
    than once — another release, a rerun — and count once, at their median measured time."""
    by: dict[float, list[float]] = {}
    for r in sorted(members, key=lambda r: r.predicted_s_per_seq):  # alike predictions are neighbours
        last = next(reversed(by), None)
        key = last if last is not None and math.isclose(last, r.predicted_s_per_seq, rel_tol=1e-9) \
            else r.predicted_s_per_seq
        by.setdefault(key, []).append(r.measured_s_per_seq)
    return [float(np.median(v)) for v in by.values()], list(by)


def rank_stats(rows: Sequence[RowResult], min_size: int = 3) -> RankStats:
    """Spearman ρ and top-1 regret of the strategies (:func:`strategies`) of each group with at
    least `min_size` of them."""
    groups: dict[tuple, list[RowResult]] = defaultdict(list)
    for r in rows:
        if r.group is not None:
            groups[r.group].append(r)
    rho: dict[str, float] = {}
    regret: dict[str, float] = {}
    for key, members in groups.items():
        meas, pred = strategies(members)
        if len(meas) < min_size:
            continue
        name = " / ".join(str(k) for k in key[1:])
        s = spearman(meas, pred)
        if not math.isnan(s):
            rho[name] = s
        regret[name] = float(meas[int(np.argmin(pred))] / min(meas) - 1.0)
    return RankStats(groups=len(regret), spearman=rho, regret=regret)


def from_sources(row, texts: Iterable[str]) -> bool:
    """Whether the row's source (file stem) or reference contains one of `texts` (case-insensitive):
    the ``--source`` filter and the ``--hold-out`` split."""
    keys = [t.lower() for t in texts]
    return any(k in row.source.lower() or k in row.reference.lower() for k in keys)


#: what ``group_errors`` can group predicted rows by
GROUP_KEYS = ("source", "reference", "model", "hardware", "num_gpus", "precision", "framework")


def group_keys(text: str) -> list[str]:
    """``--by`` text ("model,hardware") as grouping keys; ConfigError naming the valid ones."""
    keys = [k.strip() for k in text.split(",") if k.strip()]
    if not keys or any(k not in GROUP_KEYS for k in keys):
        raise ConfigError(f"--by {text or '(nothing)'}: group by one or more of {', '.join(GROUP_KEYS)}")
    return keys


@attrs.frozen(kw_only=True)
class GroupErrors:
    """The step-time error of the predicted rows sharing `key` (values of the grouping fields)."""

    key: tuple
    step_time: ErrorStats
    #: this group's share of the summed |error| of all rows: where the error is
    share_of_error: float


#: the group an empty value (a plain-schema file without a framework column) falls in, here and in the
#: cross-validation's framework fold
NOT_STATED = "(not stated)"


def _stated(value):
    """A grouping value, :data:`NOT_STATED` for an empty one."""
    return NOT_STATED if value == "" else value


def group_errors(rows: Sequence[RowResult], by: Sequence[str]) -> list[GroupErrors]:
    """Rows grouped by the fields `by` (of :data:`GROUP_KEYS`), largest summed |error| first."""
    by = group_keys(",".join(by))
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        groups[tuple(_stated(getattr(r, k)) for k in by)].append(r.error)
    total = sum(abs(e) for errs in groups.values() for e in errs) or 1.0
    out = [GroupErrors(key=k, step_time=ErrorStats.of(v), share_of_error=sum(map(abs, v)) / total)
           for k, v in groups.items()]
    return sorted(out, key=lambda g: -g.share_of_error)


def summarize(source: str, rows: Sequence[RowResult], skipped: Sequence[SkippedRow]) -> SourceSummary:
    mem = [r.predicted_memory_gib / r.measured_memory_gib - 1.0 for r in rows if r.measured_memory_gib]
    targets: dict[str, int] = defaultdict(int)
    for r in rows:
        targets[r.target] += 1
    return SourceSummary(source=source, rows=len(rows), skipped=len(skipped),
                         step_time=ErrorStats.of([r.error for r in rows]), memory=ErrorStats.of(mem),
                         ranking=rank_stats(rows), targets=dict(targets),
                         ran_over_memory=sum(not r.fits_in_memory for r in rows))


def resolve_unstated(mapped: Sequence[MappedRow], predictor) -> list[MappedRow]:
    """Settle each row's unstated setting (its ``variants``) to what a tuned run would use.

    Every candidate is predicted and the fastest is kept. For an unstated interleaving memory does
    not decide: the sources that leave it unstated leave recompute and sequence parallelism
    unstated too (Llama 3, the Megatron-Core README), so the mapped job's memory is not the run's.
    For an unstated layout (``tp`` among the variants: "the most performant model- and
    data-parallel configuration") the run had to fit, so the fastest layout that fits is kept (the
    fastest of all when none does, and the note says so). The choice is made once, with the
    predictor's current profiles, and written into the row's notes.
    """
    todo = [i for i, m in enumerate(mapped) if m.variants]
    out = list(mapped)
    if not todo:
        return out
    trial: list[MappedRow] = []
    owner: list[tuple[int, dict]] = []
    for i in todo:
        m = mapped[i]
        for v in m.variants:
            par = {**m.job["parallel"], **{k: x for k, x in v.items() if k != "features"}}
            par = {k: x for k, x in par.items() if x is not None}
            job = {**m.job, "parallel": par, "features": v.get("features", m.job["features"])}
            trial.append(attrs.evolve(m, job=job, variants=()))
            owner.append((i, v))
    groups, _ = prepare(trial, predictor)
    arrays = predict_prepared(groups, predictor, n_rows=len(trial), failed=[])  # a variant not priced is not kept
    for i in todo:
        ks = [k for k, (j, _) in enumerate(owner) if j == i and np.isfinite(arrays["step_s"][k])]
        if not ks:
            continue
        out[i] = _settled(mapped[i], trial, owner, ks, arrays)
    return out


def _settled(m: MappedRow, trial, owner, ks: list[int], arrays) -> MappedRow:
    """Row `m` with the variant :func:`resolve_unstated` keeps, and a note saying which and why."""
    v0 = owner[ks[0]][1]
    if "tp" not in v0:
        best = min(ks, key=lambda k: arrays["step_s"][k])
        note = f"interleaving not stated: vpp {owner[best][1]['vpp']}, the fastest of {len(ks)} predicted"
    else:
        fit = [k for k in ks if arrays["fits"][k] > 0.5]
        best = min(fit or ks, key=lambda k: arrays["step_s"][k])
        p = trial[best].job["parallel"]
        note = (f"layout not stated: TP {p['tp']}, PP {p['pp']}, the fastest of "
                + (f"the {len(fit)} of {len(ks)} layouts that fit in memory" if fit
                   else f"{len(ks)} layouts (none fits in memory)"))
    return attrs.evolve(trial[best], assumptions="; ".join(filter(None, (m.assumptions, note))))


def select_sources(mapped: list[MappedRow], skipped: list[SkippedRow], sources: Iterable[str] | None
                   ) -> tuple[list[MappedRow], list[SkippedRow]]:
    """The rows of the given sources (``--source``); ConfigError when the filter keeps no row."""
    if not sources:
        return mapped, skipped
    sources = list(sources)
    keep_m = [m for m in mapped if from_sources(m, sources)]
    keep_s = [s for s in skipped if from_sources(s, sources)]
    if not keep_m and not keep_s:
        names = sorted({r.source for r in [*mapped, *skipped]})
        raise ConfigError(f"--source {listing(sources, 4)}: matches none of the {len(mapped) + len(skipped)} rows; "
                          f"their sources (file stems) are {listing(names)} (references match too)")
    return keep_m, keep_s


def why_none(skipped: Sequence[SkippedRow], total: int) -> str:
    """One line: why none of `total` rows was predicted, the commonest reasons first."""
    counts: dict[str, int] = defaultdict(int)
    for s in skipped:
        counts[f"{s.kind}: {s.reason}"] += 1
    top = sorted(counts.items(), key=lambda kv: -kv[1])
    shown = "; ".join(f"{n} × {r[:160]}" for r, n in top[:3])
    more = f"; and {len(top) - 3} other reasons" if len(top) > 3 else ""
    return f"none of the {total} rows could be predicted: {shown}{more}"


def validate(paths: Iterable[str | Path], predictor=None, sources: Iterable[str] | None = None,
             hardware: str | None = None, reader: str | None = None, require_rows: bool = True
             ) -> ValidationResult:
    """Map, predict and score every row of the measurement files at `paths`.

    ``sources`` keeps only rows whose source (file stem) or reference contains one of the
    given strings (case-insensitive); matching no row is a ConfigError. ``hardware`` predicts
    every row on that profile instead of the GPU the row names, ``reader`` reads every file with
    that reader (see :func:`~mofa_framework.measurements.map_rows`). A file that is not a
    measurement file, or has no rows, is passed over with a note when others are given. With
    ``require_rows`` (the default) a result with no predicted row is a ConfigError naming why.
    """
    from .api import Predictor

    predictor = predictor or Predictor()
    mapped, skipped, notes = map_files(paths, predictor.registry, hardware, reader)
    mapped, skipped = select_sources(mapped, skipped, sources)
    mapped = resolve_unstated(mapped, predictor)
    groups, infeasible = prepare(mapped, predictor)
    failed: list[tuple[int, str]] = []
    arrays = predict_prepared(groups, predictor, n_rows=len(mapped), failed=failed)
    skipped = skipped + infeasible + [not_priced(mapped[i], message) for i, message in failed]
    rows = row_results(mapped, arrays)
    if require_rows and not rows:
        raise ConfigError(why_none(skipped, len(skipped)))
    by_source: dict[str, list[RowResult]] = defaultdict(list)
    for r in rows:
        by_source[r.source].append(r)
    skipped_by: dict[str, list[SkippedRow]] = defaultdict(list)
    for s in skipped:
        skipped_by[s.source].append(s)
    names = list(dict.fromkeys([m.source for m in mapped] + [s.source for s in skipped]))
    summaries = [summarize(n, by_source[n], skipped_by[n]) for n in names]
    return ValidationResult(rows=rows, skipped=skipped, sources=summaries, overall=summarize("overall", rows, skipped),
                            notes=notes)
