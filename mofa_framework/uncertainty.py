"""Error bands, extrapolation flags and sensitivities of a prediction.

**Bands.** Every prediction carries the range its step time will likely fall in: the
:data:`COVERAGE` central share (10th to 90th percentile) of the cross-validated errors of the
published runs nearest to the job. The errors are those of ``mofa calibrate --cross-validate``
(each run predicted by profiles fitted without its source), shipped as a generated table
(``mofa_framework/data/cross_validation.csv``, written by ``benchmarks/validation_report.py``,
never by hand). With ``e = ln(predicted / measured)``, the band is ``[t·exp(−q90), t·exp(−q10)]``
for the 10th and 90th percentiles of the errors expected for a run of a source not in the table:
a model that runs slow on similar jobs moves the band down.

Rows of one source (a measurement file on one GPU) share a bias, so they are not independent draws
for a new source: the expected error is the mean bias + a new source's bias (the chosen sources'
biases about their mean, widened by √(1 + 1/k); with fewer than :data:`MIN_SOURCES` of them, every
source's of the table) + the scatter within a source (each chosen row's deviation from its source's
bias, every source weighted alike; with fewer than :data:`MIN_SOURCES` sources the band is at least
as wide as every source's scatter makes it, and the mean bias of the k chosen sources is pooled with
the table's, ``(k·mean + (MIN_SOURCES − k)·table mean) / MIN_SOURCES``) — :func:`_quantiles`. Within the calibrated regimes each row
gives its held-out error of every kind of :data:`POOLED_KINDS`.

The nearest rows (:func:`band`): the rows on the job's GPU — or, for a GPU with none, on the
GPUs closest to it in bf16 peak and HBM bandwidth — then the first of these with at least
:data:`MIN_ROWS` rows: same precision, model family and scale (GPU count within ×:data:`SCALE_SPAN`);
same precision and family; same precision; any.

**Flags** say where the job is outside the calibrated regimes: a GPU with no rows, a precision or
a model family with no rows on that GPU, more GPUs than :data:`SCALE_SPAN` times the largest
calibrated run on it, a pipeline schedule or a feature that no validated run used. A flagged band
takes from each row one error, the largest of its held-out errors that match the extrapolation: the leave-one-precision-on-one-GPU-out error for a GPU or precision
without rows, the leave-one-model-family-out error for a family, and the largest over every
leave-one-out kind for a schedule, a feature or a scale never validated — so where a schedule or
feature has no validation data, its band widens to what holding out a whole regime cost.

**Sensitivity** (:func:`sensitivity`): ∂ ln(step) / ∂ ln(c) for each coefficient c of the
hardware profile's ``[efficiency]`` table, by central finite differences (±:data:`SENSITIVITY_STEP`
relative; one-sided at a bound), one prediction per perturbed profile.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple
from pathlib import Path

import attrs
import numpy as np

from .config import own_network
from .crossval import KINDS, Regime, regime_of, table_columns, table_gpu_specs
from .errors import MofaError

TABLE = Path(__file__).resolve().parent / "data" / "cross_validation.csv"
#: the central share of the held-out errors a band covers
COVERAGE = 0.8
#: fewest rows a band is drawn from
MIN_ROWS = 10
#: fewest sources (publications on one GPU) whose biases a band's spread across sources is drawn from;
#: with fewer, from every source of the table
MIN_SOURCES = 3
#: the held-out errors a band within the calibrated regimes draws from: a user's run is a new
#: publication, and may be a new stack or family as well (see :func:`band`)
POOLED_KINDS = KINDS
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
    #: GPU → (bf16 peak FLOP/s, HBM bytes/s) of the table's GPUs, as the table was written
    gpu_specs: Mapping[str, tuple[float, float]] = attrs.field(factory=dict)

    def __len__(self) -> int:
        return len(self.gpu)

    def subset(self, keep: np.ndarray) -> ResidualTable:
        """The rows where `keep` is true."""
        return ResidualTable(source=self.source[keep], gpu=self.gpu[keep], precision=self.precision[keep],
                             family=self.family[keep], schedule=self.schedule[keep],
                             features=tuple(f for f, k in zip(self.features, keep) if k), num_gpus=self.num_gpus[keep],
                             log_error={k: v[keep] for k, v in self.log_error.items()}, gpu_specs=self.gpu_specs)


def read_table(path: str | Path = TABLE) -> ResidualTable:
    """The residual table at `path` (:func:`~mofa_framework.crossval.residual_table`; none: empty)."""
    path = Path(path)
    text = path.read_text() if path.exists() else ""
    cols = table_columns(text) if text else {}
    col = lambda k: np.array(cols.get(k, ()), dtype=object)  # noqa: E731
    seconds = lambda k: np.array(cols[k], dtype=float)  # noqa: E731
    meas = seconds("measured_s") if cols else np.zeros(0)
    errs = {"in-sample": np.log(seconds("in_sample_s") / meas) if cols else np.zeros(0)}
    for k in KINDS:
        name = f"{k.replace('-', '_')}_out_s"
        if cols.get(name):
            errs[k] = np.log(seconds(name) / meas)
    return ResidualTable(source=col("source"), gpu=col("gpu"), precision=col("precision"), family=col("family"),
                         schedule=col("schedule"), features=tuple(frozenset(filter(None, f.split(";")))
                                                                  for f in cols.get("features", ())),
                         num_gpus=np.array(cols.get("num_gpus", ()), dtype=float), log_error=errs,
                         gpu_specs=table_gpu_specs(text))


@functools.cache
def shipped_table() -> ResidualTable:
    return read_table(TABLE)


def _similar_gpus(gpu: str, table: ResidualTable, registry) -> list[str]:
    """GPUs of the table, nearest first by |Δ ln bf16 peak| + |Δ ln HBM bandwidth| (unknown last).
    The table's own GPUs are ranked by the specs it records (reading their profiles, microbenchmark
    tables and all, took longer than the prediction); the job's GPU, and a table without them, by
    the registry's profiles."""
    def spec(name):
        if name != gpu and name in table.gpu_specs:
            peak, hbm = table.gpu_specs[name]
            return math.log(peak), math.log(hbm)
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
    flags += [f for f in (_power_flag(regime, registry), _network_flag(regime, registry)) if f]
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
    errors = _errors(table, frozenset(kinds))
    lo_q, hi_q, groups = _quantiles(errors, _groups(table), sel, _every_source(table, frozenset(kinds)))
    rows = int(np.isfinite(errors[sel]).any(axis=1).sum())
    held = "held-out" if kinds == {"source"} else "worst held-out"
    return Band(low_s=float(step_s * math.exp(-hi_q)), high_s=float(step_s * math.exp(-lo_q)), rows=rows,
                basis=f"{COVERAGE:.0%} of the {held} errors of {rows} runs on {where} ({what}; {groups} "
                      f"source{'s' if groups != 1 else ''}, spread as for a new one)", flags=tuple(flags))


def _power_flag(regime: Regime, registry) -> str:
    """A flag when the job runs its GPUs at another power limit than the profile's calibration rows
    (the clock model prices it; no row measures it), else ""."""
    try:
        hw = registry.hardware_profile(regime.gpu)
    except MofaError:
        return ""
    if regime.power_limit_w == hw.compute.power_limit_w:
        return ""
    c = hw.compute
    watts = regime.power_limit_w or c.tdp_w
    scale = attrs.evolve(hw, compute=attrs.evolve(c, power_limit_w=regime.power_limit_w)).compute_clock_scale
    return (f"GPUs at {watts:g} W (the profile's rows: {c.power_limit_w or c.tdp_w:g} W): tensor-core work modelled "
            f"at {scale:.2f} of rated speed (docs/cost-model.md, Power limit); band from the profile's rows")


def _network_flag(regime: Regime, registry) -> str:
    """A flag when a job across scale-up domains runs on another network than the profile's
    calibration rows (the collectives are priced from it; no row measures it), else ""."""
    try:
        hw = registry.hardware_profile(regime.gpu)
    except MofaError:
        return ""
    own = own_network(regime.scaleout_bandwidth_gbps, hw)  # a regime that states none (0) is the profile's
    if not own or regime.num_gpus <= hw.scaleup_domain_gpus:
        return ""
    return (f"{own:g} GB/s per GPU between nodes (the profile's rows: {hw.interconnect.scaleout_bandwidth_gbps:g}): "
            "collectives across nodes priced from it (docs/cost-model.md, Another network); band from the profile's rows")


@functools.lru_cache(maxsize=64)
def _errors(table: ResidualTable, kinds: frozenset[str]) -> np.ndarray:
    """Per row, the held-out errors a band draws from (rows × samples, NaN where none): within the
    calibrated regimes every kind of :data:`POOLED_KINDS` the table has (one sample each); outside
    them (`kinds` beyond ``source``), the row's worst error over `kinds`. (Cached per table: read only.)"""
    if kinds == {"source"}:
        cols = [table.log_error[k] for k in POOLED_KINDS if k in table.log_error]
    else:
        cols = [_worst([table.log_error[k] for k in KINDS if k in kinds and k in table.log_error])]
    out = np.column_stack(cols)
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=64)
def _groups(table: ResidualTable) -> np.ndarray:
    """Each row's group: its source on its GPU (rows of one publication on one GPU share a bias)."""
    out = np.array([f"{s}|{g}" for s, g in zip(table.source, table.gpu)], dtype=object)
    out.setflags(write=False)
    return out


class EverySource(NamedTuple):
    """A new source's error drawn from every source of a table: every source's bias about their
    mean, widened by √(1 + 1/K), and the (10th, 90th) percentiles of that spread plus every
    source's scatter (each source weighted alike), about the mean bias."""

    spread: np.ndarray
    lo: float
    hi: float
    #: the mean bias of every source, each once
    mean: float = 0.0


@functools.lru_cache(maxsize=64)
def _every_source(table: ResidualTable, kinds: frozenset[str]) -> EverySource:
    """What :func:`_quantiles` falls back on when too few sources are near the job to say how far
    apart sources lie or how widely a source scatters: computed once per table and kinds."""
    errors, groups = _errors(table, kinds), _groups(table)
    if not np.isfinite(errors).any():
        return EverySource(np.zeros(0), math.nan, math.nan)
    spread, dev, mean = _bias_spread(errors, groups, np.ones(len(groups), bool))
    spread = spread * math.sqrt(1.0 + 1.0 / len(spread))
    spread.setflags(write=False)
    lo, hi = _sum_quantiles(spread, dev, np.broadcast_to(groups[:, None], errors.shape)[np.isfinite(errors)])
    return EverySource(spread, lo, hi, mean)


def weighted_quantile(x: np.ndarray, w: np.ndarray, q: Sequence[float]) -> np.ndarray:
    """Quantiles `q` of values `x` with weights `w`: linear interpolation between the sorted values,
    each at the middle of its weight, ends pinned to 0 and 1 (position (C_i − w_i/2 − w_1/2) /
    (W − w_1/2 − w_n/2), C cumulative, W total): numpy's default ``linear`` percentile when the
    weights are equal."""
    o = np.argsort(x, kind="stable")
    x, w = x[o], w[o]
    c = np.cumsum(w) - 0.5 * w - 0.5 * w[0]
    span = c[-1]
    pos = c / span if span > 0 else np.zeros_like(c)
    return np.interp(q, pos, x)


def _bias_spread(errors: np.ndarray, groups: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(the groups' biases − their mean, for every sample: its deviation from its group's bias, the mean bias)
    over the rows in `keep` (a group's bias: the mean of its samples; the mean bias: each group once)."""
    finite = np.isfinite(errors) & keep[:, None]
    names, inv = np.unique(groups, return_inverse=True)
    inv = np.broadcast_to(inv[:, None], errors.shape)[finite]
    vals = errors[finite]
    n = np.bincount(inv, minlength=len(names))
    bias = np.bincount(inv, weights=vals, minlength=len(names)) / np.maximum(n, 1)
    present = n > 0
    mean = float(bias[present].mean())
    return bias[present] - mean, vals - bias[inv], mean


def _sum_quantiles(spread: np.ndarray, dev: np.ndarray, dev_group: np.ndarray) -> tuple[float, float]:
    """The (10th, 90th) percentiles of every (spread, deviation) sum, each group's deviations weighing
    one in all (`dev_group`: the group of each deviation)."""
    _, inv, count = np.unique(dev_group, return_inverse=True, return_counts=True)
    w = 1.0 / count[inv]
    x = (spread[:, None] + dev[None, :]).ravel()
    lo, hi = weighted_quantile(x, np.broadcast_to(w, (len(spread), len(w))).ravel(),
                               [0.5 * (1 - COVERAGE), 0.5 * (1 + COVERAGE)])
    return float(lo), float(hi)


def _quantiles(errors: np.ndarray, groups: np.ndarray, sel: np.ndarray,
               every: EverySource) -> tuple[float, float, int]:
    """The (10th, 90th) percentiles of ln(predicted/measured) for a run of a source not in the table,
    and how many sources (groups) the rows in `sel` come from.

    Rows of one source share its bias, so the rows are not independent draws for a new source: the
    error is modelled as mean bias + a new source's bias + the scatter within a source. The scatter
    is the selected rows' deviations from their own group's bias, each group weighted alike; the new
    source's bias is drawn from the selected groups' biases about their mean, widened by √(1 + 1/k)
    (a new group, and a mean estimated from k groups). With fewer than :data:`MIN_SOURCES` groups
    selected neither is known from them: the biases are drawn from every group of the table likewise,
    the band is at least as wide as `every` (:func:`_every_source` of the table), and its centre, the
    mean bias, is pooled with the table's as if the :data:`MIN_SOURCES` − k missing sources had the
    table's mean bias: one or two sources say little about how widely a new one scatters, nor where
    it lies."""
    if not np.isfinite(errors[sel]).any():
        return math.nan, math.nan, 0
    spread, dev, mean = _bias_spread(errors, groups, sel)
    k = len(spread)
    few = k < MIN_SOURCES
    spread = every.spread if few else spread * math.sqrt(1.0 + 1.0 / k)
    finite = np.isfinite(errors) & sel[:, None]
    lo_q, hi_q = _sum_quantiles(spread, dev, np.broadcast_to(groups[:, None], errors.shape)[finite])
    if few:
        lo_q, hi_q = min(lo_q, every.lo), max(hi_q, every.hi)
        mean = (k * mean + (MIN_SOURCES - k) * every.mean) / MIN_SOURCES
    return mean + lo_q, mean + hi_q, k


def band_for(result, job, registry, table: ResidualTable | None = None) -> Band:
    """The band of a :class:`~mofa_framework.api.PredictionResult` of `job`."""
    return band(result.step_time_s, regime_of(job, result.mfu_precision), registry, table)


def gemm_format(hardware, precision: str, features, registry) -> str:
    """The format a job's GEMMs run in: `precision`, or a faster one an enabled feature declares
    (as :func:`mofa_framework.engine.mfu_precision` decides it for a batch)."""
    best = precision
    for name in features:
        fmt = registry.features[name].gemm_precision if name in registry.features else None
        if fmt is not None and hardware.peak_flops_per_s(fmt) > hardware.peak_flops_per_s(best):
            best = fmt
    return best


def band_candidates(cands, req, registry, table: ResidualTable | None = None) -> tuple:
    """The tuner's top configurations with their bands and flags; ``within_band_of_best`` marks
    those rank 1 cannot be told apart from (:func:`indistinguishable`)."""
    from .crossval import model_family

    family, out = model_family(req.model), []
    unit: dict[Regime, Band] = {}  # the band of a 1 s step per regime: top-k rows share few regimes
    for c in cands:
        reg = Regime(gpu=req.hardware.name, family=family, schedule=c.schedule,
                     precision=gemm_format(req.hardware, c.parallel["precision"], c.features, registry),
                     features=tuple(sorted(c.features)), num_gpus=int(req.num_gpus),
                     power_limit_w=float(req.hardware.compute.power_limit_w),
                     scaleout_bandwidth_gbps=float(req.hardware.interconnect.scaleout_bandwidth_gbps))
        if reg not in unit:
            unit[reg] = band(1.0, reg, registry, table)
        b = unit[reg]
        out.append(attrs.evolve(c, step_time_s_low=c.step_time_s * b.low_s, step_time_s_high=c.step_time_s * b.high_s,
                                extrapolation=b.flags))
    if out:
        top = out[0]
        out = [attrs.evolve(c, within_band_of_best=indistinguishable(c, top)) for c in out]
    return tuple(out)


def indistinguishable(a, b) -> bool:
    """True when two predictions differ by less than half the width of either's band, in log terms:
    |ln(a/b)| ≤ ln(high/low)/2 for both bands. A band is where the *measured* time is expected and
    may not contain its own prediction (a regime whose runs all ran slower than predicted), so the
    test is on the spread, not on containment: equal predictions are always indistinguishable."""
    gap = abs(np.log(a.step_time_s / b.step_time_s))
    half = lambda c: 0.5 * np.log(c.step_time_s_high / c.step_time_s_low)  # noqa: E731
    return bool(gap <= half(a) and gap <= half(b))


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
#: sections of a hardware profile whose rates (``*_gbps``, ``peak_tflops``) are perturbed
RATE_SECTIONS = ("compute", "memory", "interconnect")
#: fields of the rows of a profile's measured tables (``gemm_profile`` …) that are perturbed, all rows at once
TABLE_RATES = ("tflops", "busbw_gbps")


@attrs.frozen(kw_only=True)
class Sensitivity:
    """How step time moves with one hardware-profile parameter."""

    #: dotted path in the profile: ``efficiency.gemm_efficiency``, ``memory.hbm_bandwidth_gbps``,
    #: ``compute.peak_tflops`` (every format at once), ``gemm_profile.tflops`` (every row at once)
    parameter: str
    #: its value (a per-format mapping: the bf16 one; a measured table: its highest bf16 rate, or its
    #: highest rate when it has no bf16 rows)
    value: float
    #: ∂ ln(step time) / ∂ ln(parameter)
    elasticity: float


def _scaled(obj, field: str, factor: float):
    """`obj` with `field` multiplied by `factor` (a mapping: every value)."""
    v = getattr(obj, field)
    new = {k: x * factor for k, x in v.items()} if isinstance(v, Mapping) else v * factor
    return attrs.evolve(obj, **{field: new})


def table_value(rows, col: str) -> float:
    """The number shown for a measured table's rate column: its highest bf16 rate (the format of
    ``compute.peak_tflops``'s value), or its highest rate when no row is bf16."""
    bf16 = [getattr(r, col) for r in rows if getattr(r, "dtype", "bf16") == "bf16"]
    return float(max(bf16 or [getattr(r, col) for r in rows]))


def perturbations(hw) -> list[tuple[str, float, object]]:
    """(parameter, value, f(factor) → the profile with that parameter scaled) for every parameter of
    profile `hw` a step time can depend on: the rates of :data:`RATE_SECTIONS`, the rate columns of
    its measured tables, and every nonzero ``[efficiency]`` coefficient."""
    out = []
    for sec in RATE_SECTIONS:
        part = getattr(hw, sec)
        for f in attrs.fields(type(part)):
            v = getattr(part, f.name)
            if f.name == "peak_tflops" or (f.name.endswith("_gbps") and isinstance(v, float)):
                val = float(v["bf16"]) if isinstance(v, Mapping) else float(v)
                out.append((f"{sec}.{f.name}", val,
                            lambda k, sec=sec, name=f.name: attrs.evolve(hw, **{sec: _scaled(getattr(hw, sec), name, k)})))
    for f in attrs.fields(type(hw)):
        rows = getattr(hw, f.name)
        if not (isinstance(rows, tuple) and rows and attrs.has(type(rows[0]))):
            continue
        for col in TABLE_RATES:
            if hasattr(rows[0], col):
                out.append((f"{f.name}.{col}", table_value(rows, col),
                            lambda k, tab=f.name, col=col: attrs.evolve(
                                hw, **{tab: tuple(_scaled(r, col, k) for r in getattr(hw, tab))})))
    for f in attrs.fields(type(hw.efficiency)):
        c = float(getattr(hw.efficiency, f.name))
        if c != 0:
            out.append((f"efficiency.{f.name}", c,
                        lambda k, name=f.name: attrs.evolve(hw, efficiency=_scaled(hw.efficiency, name, k))))
    return out


def elasticity(step_of, h: float = SENSITIVITY_STEP) -> np.ndarray:
    """∂ ln t / ∂ ln c at factor 1 of `step_of(factor) → step times` (an array over jobs; None: the
    factor is outside the parameter's bounds): central differences in ln c, one-sided at a bound."""
    up, down = step_of(1.0 + h), step_of(1.0 - h)
    if up is not None and down is not None:
        return (np.log(up) - np.log(down)) / (math.log1p(h) - math.log1p(-h))
    base = step_of(1.0)
    one = up if up is not None else down
    if one is None:
        return np.full(np.shape(base), np.nan)
    return (np.log(one) - np.log(base)) / math.log1p(h if up is not None else -h)


def sensitivities(predictor, jobs, top: int | None = None) -> list[list[Sensitivity]]:
    """For each job, the hardware-profile parameters its step time depends on, largest
    |∂ ln t / ∂ ln c| first (zeros left out; `top` keeps the first few). Jobs sharing a model and a
    profile are one batch: every perturbed profile is one engine call over all of them."""
    from .config import jobs_to_batch

    jobs = list(jobs)
    out: list[list[Sensitivity]] = [[] for _ in jobs]
    groups: dict[tuple[str, str, float], list[int]] = {}
    for i, j in enumerate(jobs):
        groups.setdefault(j.batch_key, []).append(i)
    for idx in groups.values():
        group = [jobs[i] for i in idx]
        predictor._evaluate_jobs(group)  # the constraints, once: an infeasible job is one clear error
        batch, model = jobs_to_batch(group, predictor.registry), group[0].model

        for name, value, scaled in perturbations(group[0].hardware):
            def step_of(k, scaled=scaled):
                try:
                    hw = scaled(k)
                except ValueError:  # outside the parameter's bounds
                    return None
                return np.asarray(predictor.evaluate(batch, model, hw).step_time_s, float)

            e = elasticity(step_of)
            for k, i in enumerate(idx):
                if np.isfinite(e[k]) and abs(e[k]) > 1e-9:
                    out[i].append(Sensitivity(parameter=name, value=value, elasticity=float(e[k])))
    for lst in out:
        lst.sort(key=lambda s: -abs(s.elasticity))
    return [lst[:top] if top else lst for lst in out]
