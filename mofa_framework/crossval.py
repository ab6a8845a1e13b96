"""Cross-validated error of the calibrated profiles (``mofa calibrate --cross-validate``).

The number that counts is the error on runs the profiles were not fitted to. Every fitted profile
records the command that fitted it (``mofa calibrate --write``: its ``--param`` list and files,
:func:`recorded_plans`); here each profile is refitted the same way without the rows held out,
and the held-out rows are predicted by those refits:

- **leave one source out** (``source``): a source is a measurement file (``MappedRow.source``, the
  file stem). Each source's rows are predicted by every profile they touch refitted without that
  source;
- **leave one regime out**: one precision on one GPU (``gpu-precision``: the format the GEMMs run
  in, as the engine reports it, on one hardware profile), one model family (``model-family``:
  :func:`model_family`, the architecture class), one framework generation (``framework``:
  ``MappedRow.framework`` as the reader names it).

A held-out measurement is held out wherever it appears: a row of another file with the same model,
profile, GPU count, global batch, sequence length, TP and PP whose measured step time agrees within
:data:`TWIN_TOLERANCE` is the same measurement republished (NVIDIA's tables and their ``*_dense``
twins) and is left out of the refits too. A profile none of whose fitted rows is held out is not
refitted (its prediction is the shipped one); a profile left with no row takes its prior for what
it fitted: the library's default coefficients, or — as a shipped GPU without rows takes its fitted
sibling's — the recorded ``--prior-from`` sibling's coefficients *refitted in the same fold*, then
the recorded ``--prior`` values (a GPU with no step-time row: its microbenchmarks and that prior).
Profiles without a recorded fit are used as shipped.

The fit is the calibration's own (:mod:`mofa_framework.calibrate`: same weights, prior, bounds,
robust loss, and coefficients the remaining rows cannot see reset to the library default or the
recorded ``--prior``, as ``--hold-out`` does), started from the shipped coefficients. Rows are mapped, resolved and
prepared once; each fold evaluates only the batches holding its training or held-out rows.
*In-sample* is the shipped profiles' prediction (they were fitted to these rows).
"""

from __future__ import annotations

import math
import re
import shlex
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import attrs
import numpy as np

from .batch import PRECISIONS
from .errors import ConfigError
from .types import EfficiencySpec, MappedRow, ModelSpec, SkippedRow
from .validate import (NOT_STATED, ErrorStats, RowResult, SourceSummary, predict_prepared, prepare, rank_stats,
                       resolve_unstated, row_results, summarize)

#: what a fold holds out, in the order the report lists them
KINDS = ("source", "gpu-precision", "model-family", "framework")
KIND_TITLES = {"source": "leave one source out", "gpu-precision": "leave one precision on one GPU out",
               "model-family": "leave one model family out", "framework": "leave one framework generation out"}
#: measured step times within this relative difference (same job) are one measurement republished
TWIN_TOLERANCE = 0.02


# ====================================================================== regimes


def model_family(model: ModelSpec) -> str:
    """The architecture class the cost model prices differently: dense or MoE; a stack with
    recurrent mixers (hybrid Mamba, hybrid linear attention); MHA, GQA, MLA or compressed
    attention (DeepSeek-V4); a gated (three-matrix) or a plain two-matrix MLP."""
    blocks = model.block_kinds.values()
    if any(b.attention == "compressed" for b in blocks):
        attn = "compressed-attention"
    else:
        attn = "MLA" if model.is_mla else ("GQA" if model.num_kv_heads < model.num_attention_heads else "MHA")
    mixers = {b.mixer for b in blocks}
    stack = ("hybrid Mamba " if mixers & {"mamba2", "mamba"} else
             "hybrid linear-attention " if mixers & {"gated_deltanet", "linear_attention"} else "")
    mlp = "gated MLP" if model.activation.value == "swiglu" else "2-matrix MLP"
    return f"{'MoE' if model.is_moe else 'dense'} {stack}{attn} {mlp}"


@attrs.frozen(kw_only=True)
class Regime:
    """What a row or a job is, for holding out and for error bands."""

    gpu: str
    #: the format the GEMMs run in (:data:`~mofa_framework.batch.PRECISIONS`)
    precision: str
    family: str
    schedule: str
    features: tuple[str, ...]
    num_gpus: int
    #: the framework generation (rows only; a job does not say)
    framework: str = ""
    #: watts: the GPUs' power limit (``compute.power_limit_w``; 0 = rated power)
    power_limit_w: float = 0.0
    #: GB/s per GPU between scale-up domains the job runs on (0 = not stated: the profile's)
    scaleout_bandwidth_gbps: float = 0.0

    def key(self, kind: str) -> str:
        """This regime's value for a leave-one-out kind (``source`` is the row's, not the regime's)."""
        if kind == "gpu-precision":
            return f"{self.precision} on {self.gpu}"
        if kind == "model-family":
            return self.family
        if kind == "framework":
            return self.framework or NOT_STATED
        raise ValueError(kind)


def regime_of(job, precision: str, framework: str = "") -> Regime:
    """The :class:`Regime` of a resolved job (:class:`~mofa_framework.config.TrainingJob`)."""
    return Regime(gpu=job.hardware.name, precision=precision, family=model_family(job.model), schedule=job.schedule,
                  features=tuple(sorted(job.features)), num_gpus=int(job.num_gpus), framework=framework,
                  power_limit_w=float(job.hardware.compute.power_limit_w),
                  scaleout_bandwidth_gbps=float(job.hardware.interconnect.scaleout_bandwidth_gbps))


# ====================================================================== what was fitted


@attrs.frozen(kw_only=True)
class FitPlan:
    """How one profile is fitted: its coefficients and the sources (file stems) whose rows it fits
    (empty: every row on it)."""

    hardware: str
    parameters: tuple[str, ...]
    sources: tuple[str, ...] = ()
    #: the measurement files the recorded command read (names, looked up in the shipped data)
    files: tuple[str, ...] = ()
    #: (coefficient, value) priors the recorded command gave (``--prior``) instead of the defaults
    priors: tuple[tuple[str, float], ...] = ()
    #: the fitted sibling profile whose coefficients are the prior (``--prior-from``; "" for none)
    prior_from: str = ""


_RECORD = re.compile(r"^# \[efficiency\] fitted by `mofa calibrate`: (.*)$", re.M)


def parse_recorded(hardware: str, text: str) -> FitPlan | None:
    """The :class:`FitPlan` of a profile TOML's recorded ``mofa calibrate`` command (None: not
    fitted, or fitted to rows of other GPUs with ``--all-rows``, which a refit cannot reproduce)."""
    from .calibrate import DEFAULT_PARAMETERS, parse_priors
    from .measurements import builtin_sets

    m = _RECORD.search(text)
    if m is None:
        return None
    try:
        argv = shlex.split(m.group(1))
    except ValueError:
        argv = m.group(1).split()
    params: list[str] = []
    files: list[str] = []
    priors: list[str] = []
    prior_from = ""
    builtin = False
    sets = builtin_sets()
    it = iter(argv)
    for tok in it:
        opt, eq, val = tok.partition("=")
        if opt in ("--param", "--prior", "--prior-from", "--builtin-set", "--source", "--hold-out", "--folds", "--seed",
                   "--write", "--name", "--reader", "--hardware", "--format") and not eq:
            val = next(it, "")
        if opt == "--all-rows":
            return None
        if opt == "--param":
            params.append(val)
        elif opt == "--prior":
            priors.append(val)
        elif opt == "--prior-from":
            prior_from = val
        elif opt == "--builtin":
            builtin = True
        elif opt == "--builtin-set":
            files += sets.get(val, ())
        elif not tok.startswith("-") and tok.endswith(".csv"):
            files.append(Path(tok).name)
    if builtin:
        files += sets.get("calibration", ())
    files = list(dict.fromkeys(files))
    return FitPlan(hardware=hardware, parameters=tuple(params or DEFAULT_PARAMETERS),
                   sources=tuple(Path(f).stem for f in files), files=tuple(files),
                   priors=tuple(parse_priors(priors).items()), prior_from=prior_from)


def recorded_plans(registry) -> list[FitPlan]:
    """Every registered profile whose TOML records the ``mofa calibrate`` command that fitted it."""
    from .calibrate import profile_path

    out = []
    for name in registry.hardware:
        try:
            text = profile_path(name).read_text()
        except (ConfigError, OSError):
            continue
        plan = parse_recorded(name, text)
        if plan is not None:
            out.append(plan)
    return out


def siblings(plans: Sequence[FitPlan], recorded: Sequence[FitPlan]) -> list[FitPlan]:
    """The recorded fits `plans` take their prior from (``--prior-from``, transitively) that are not
    among `plans` themselves: a fold refits them too, so no anchor comes from a fit that saw the
    rows the fold holds out."""
    by_name = {p.hardware: p for p in recorded}
    have = {p.hardware for p in plans}
    out: list[FitPlan] = []
    todo = [p.prior_from for p in plans if p.prior_from]
    while todo:
        name = todo.pop()
        plan = by_name.get(name)
        if plan is None or name in have:
            continue
        have.add(name)
        out.append(plan)
        if plan.prior_from:
            todo.append(plan.prior_from)
    return out


# ====================================================================== results


@attrs.frozen(kw_only=True)
class Fold:
    """One held-out set: which rows, and the profiles refitted without them."""

    kind: str
    key: str
    #: rows held out and predicted (scored rows only)
    rows: int
    #: profile → its coefficients refitted without the held-out rows (profiles not refitted absent)
    refits: dict[str, dict[str, float]]
    #: profile → rows its refit was fitted to
    train_rows: dict[str, int]
    cpu_s: float


@attrs.frozen(kw_only=True)
class Scheme:
    """Every scored row predicted one way: in-sample, or by the folds of one leave-one-out kind."""

    kind: str
    rows: tuple[RowResult, ...]
    folds: tuple[Fold, ...] = ()
    cpu_s: float = 0.0

    def summaries(self, skipped: Sequence[SkippedRow] = ()) -> list[SourceSummary]:
        """Per source (in order of appearance) then ``overall``: step-time error and ranking."""
        by: dict[str, list[RowResult]] = defaultdict(list)
        for r in self.rows:
            by[r.source].append(r)
        skip: dict[str, list[SkippedRow]] = defaultdict(list)
        for s in skipped:
            skip[s.source].append(s)
        return [*(summarize(k, v, skip[k]) for k, v in by.items()), summarize("overall", self.rows, skipped)]


@attrs.frozen(kw_only=True)
class CrossValidation:
    """In-sample and held-out predictions of the same rows (aligned: ``regimes[i]`` is row i's)."""

    regimes: tuple[Regime, ...]
    in_sample: Scheme
    held_out: dict[str, Scheme]
    skipped: tuple[SkippedRow, ...]
    plans: tuple[FitPlan, ...]
    #: whether some plan fitted row i (a source no profile was fitted to is out of sample anyway)
    fitted: tuple[bool, ...]
    #: CPU seconds: mapping and preparing the rows once, and the whole run
    prepare_cpu_s: float = 0.0
    cpu_s: float = 0.0
    notes: tuple[str, ...] = ()

    def by_regime(self, kind: str, scheme: str | None = None) -> list[tuple[str, ErrorStats, ErrorStats]]:
        """Per value of `kind`'s regime key: (value, in-sample stats, held-out stats under `scheme`
        (default: that kind's own folds)), largest held-out MAPE first."""
        held = self.held_out[scheme or kind]
        groups: dict[str, list[int]] = defaultdict(list)
        for i, (reg, r) in enumerate(zip(self.regimes, self.in_sample.rows)):
            groups[r.source if kind == "source" else reg.key(kind)].append(i)
        out = [(k, ErrorStats.of([self.in_sample.rows[i].error for i in idx]),
                ErrorStats.of([held.rows[i].error for i in idx])) for k, idx in groups.items()]
        return sorted(out, key=lambda t: -(t[2].mape if t[2].n else 0.0))

    def to_dict(self) -> dict:
        def scheme(s: Scheme) -> dict:
            sums = [attrs.asdict(x) for x in s.summaries(self.skipped)]
            for d, x in zip(sums, s.summaries(self.skipped)):
                d["ranking"].update(spearman_mean=x.ranking.spearman_mean, spearman_min=x.ranking.spearman_min,
                                    regret_mean=x.ranking.regret_mean, regret_max=x.ranking.regret_max)
            return {"kind": s.kind, "cpu_s": s.cpu_s, "sources": sums, "folds": [attrs.asdict(f) for f in s.folds]}

        rows = []
        for i, r in enumerate(self.in_sample.rows):
            rows.append({"source": r.source, "reference": r.reference, "row_id": r.row_id, "model": r.model,
                         "hardware": r.hardware, "num_gpus": r.num_gpus, "strategy": r.strategy,
                         "measured_s": r.measured_s, "predicted_in_sample_s": r.predicted_s, "fitted": self.fitted[i],
                         **{f"predicted_{k.replace('-', '_')}_out_s": s.rows[i].predicted_s
                            for k, s in self.held_out.items()},
                         "regime": attrs.asdict(self.regimes[i])})
        return {"in_sample": scheme(self.in_sample), "held_out": {k: scheme(s) for k, s in self.held_out.items()},
                "regimes": {k: [{"key": key, "in_sample": attrs.asdict(a), "held_out": attrs.asdict(b)}
                                for key, a, b in self.by_regime(k)] for k in self.held_out},
                "plans": [attrs.asdict(p) for p in self.plans], "rows": rows,
                "skipped": [attrs.asdict(s) for s in self.skipped], "prepare_cpu_s": self.prepare_cpu_s,
                "cpu_s": self.cpu_s, "notes": list(self.notes)}


# ====================================================================== the folds


def twins(mapped: Sequence[MappedRow], hardware: Sequence[str]) -> list[list[int]]:
    """For each row, the rows of *other* sources that are the same measurement (see module doc)."""
    by_job: dict[tuple, list[int]] = defaultdict(list)
    for i, m in enumerate(mapped):
        par = m.job["parallel"]
        by_job[(str(m.job["model"].get("name")), hardware[i], m.job["hardware"]["num_gpus"],
                par.get("global_batch_size"), par.get("sequence_length"), par.get("tp", 1), par.get("pp", 1))].append(i)
    out: list[list[int]] = [[] for _ in mapped]
    for idx in by_job.values():
        for a in idx:
            out[a] = [b for b in idx if mapped[b].source != mapped[a].source
                      and abs(mapped[a].measured_s / mapped[b].measured_s - 1.0) <= TWIN_TOLERANCE]
    return out


class _Folds:
    """Rows mapped and prepared once; one refit per (fold, profile the fold touches)."""

    def __init__(self, mapped: list[MappedRow], scored: np.ndarray, predictor, plans: Sequence[FitPlan],
                 support: Sequence[FitPlan] = ()):
        from .calibrate import _Problem

        self.mapped, self.scored, self.predictor = mapped, scored, predictor
        self.groups, self.infeasible = prepare(mapped, predictor)
        n = len(mapped)
        self.arrays = predict_prepared(self.groups, predictor, n_rows=n)  # in-sample: the shipped profiles
        self.predicted = np.isfinite(self.arrays["step_s"])
        self.hw = np.array([""] * n, dtype=object)
        self.regimes: list[Regime | None] = [None] * n
        for g in self.groups:
            for i, job in zip(g.rows, g.jobs):
                self.hw[i] = g.hardware.name
                prec = PRECISIONS[int(self.arrays["precision"][i])]
                self.regimes[i] = regime_of(job, prec, mapped[i].framework)
        self.twins = twins(mapped, list(self.hw))
        self.plans = [p for p in plans if (self.hw == p.hardware).any()]
        # the plans' --prior-from siblings: refitted per fold for their anchors, never scored here
        self.by_name = {p.hardware: p for p in [*support, *self.plans] if (self.hw == p.hardware).any()}
        self.problems, self.eligible, self.base = {}, {}, {}
        sources = np.array([m.source for m in mapped])
        fit = np.array([m.fit for m in mapped], bool)
        for p in self.by_name.values():
            hw = predictor.registry.hardware_profile(p.hardware)
            on = (self.hw == p.hardware) & self.predicted & fit
            if p.sources:
                on &= np.isin(sources, list(p.sources))
            self.eligible[p.hardware] = on
            self.problems[p.hardware] = _Problem(mapped, predictor, hw, p.parameters,
                                                 groups=[g for g in self.groups if g.hardware.name == p.hardware])
            self.base[p.hardware] = {k: float(getattr(hw.efficiency, k)) for k in p.parameters}
        self.fitted = np.zeros(n, bool)
        for p in self.plans:
            self.fitted |= self.eligible[p.hardware]

    def anchor(self, plan: FitPlan, excluded: np.ndarray, cache: dict,
               visiting: frozenset = frozenset()) -> dict[str, float]:
        """The prior `plan`'s fit holds its coefficients towards in a fold leaving out `excluded`:
        the library's defaults, or its ``--prior-from`` sibling's coefficients in the same fold
        (refitted without those rows when its own fit saw them), then its ``--prior`` values."""
        from .calibrate import sibling_prior

        defaults = EfficiencySpec()
        anchor = {k: float(getattr(defaults, k)) for k in plan.parameters}
        if plan.prior_from:
            if plan.prior_from in visiting:
                raise ConfigError(f"--prior-from: the recorded fits of {', '.join(sorted(visiting))} name each other "
                                  "as their prior; one of them must be fitted from the library defaults")
            sibling = self.predictor.registry.hardware_profile(plan.prior_from)
            values = attrs.asdict(sibling.efficiency)
            sib_plan = self.by_name.get(sibling.name)
            if sib_plan is not None:
                values.update(self.coefficients(sib_plan, excluded, cache, visiting | {plan.hardware}) or {})
            anchor.update(sibling_prior(EfficiencySpec(**values), plan.parameters))
        anchor.update({k: v for k, v in plan.priors if k in anchor})
        return anchor

    def coefficients(self, plan: FitPlan, excluded: np.ndarray, cache: dict,
                     visiting: frozenset = frozenset()) -> dict[str, float] | None:
        """`plan`'s coefficients in a fold leaving out `excluded` (memoised in `cache`): refitted
        without those rows, or None when its fit never saw any of them (the shipped ones stand)."""
        if plan.hardware not in cache:
            elig = self.eligible[plan.hardware]
            cache[plan.hardware] = (self.refit(plan, elig & ~excluded, self.anchor(plan, excluded, cache, visiting))
                                    if (elig & excluded).any() else None)
        return cache[plan.hardware]

    def refit(self, plan: FitPlan, train: np.ndarray, anchor: dict[str, float]) -> dict[str, float]:
        """`plan`'s coefficients fitted to the rows in `train` (the calibration's fit), held towards
        `anchor` (:meth:`anchor`)."""
        from .calibrate import _fit, identifiable

        if not train.any():
            return anchor
        problem = self.problems[plan.hardware]
        all_groups = problem.groups
        problem.groups = [g for g in all_groups if train[g.rows].any()]
        try:
            base = self.base[plan.hardware]
            keep = identifiable(problem, base, plan.parameters, train)
            problem.params = keep
            fitted = {}
            if keep:
                x, _ = _fit(problem, problem.encode(base), train, problem.encode(anchor))
                fitted = problem.coefficients(x)
        finally:
            problem.groups, problem.params = all_groups, list(plan.parameters)
        return {**anchor, **fitted}

    def fold(self, kind: str, key: str, held: np.ndarray, out: dict[str, np.ndarray]) -> Fold:
        """Predict the rows in `held` with every profile they touch refitted without them (and
        without their twins); write the predictions into `out`."""
        t0 = time.process_time()
        excluded = held.copy()
        for i in np.flatnonzero(held):
            excluded[self.twins[i]] = True
        refits, train_rows, cache = {}, {}, {}
        for plan in self.plans:
            test = held & (self.hw == plan.hardware) & self.predicted
            elig = self.eligible[plan.hardware]
            if not test.any() or not (elig & excluded).any():
                continue  # the profile's fit never saw these rows: its shipped prediction stands
            train = elig & ~excluded
            coeffs = self.coefficients(plan, excluded, cache)
            problem = self.problems[plan.hardware]
            profile = problem.profile(coeffs)
            groups = [g for g in problem.groups if test[g.rows].any()]
            pred = predict_prepared(groups, self.predictor, {plan.hardware: profile}, n_rows=len(self.mapped))
            for k, arr in out.items():
                arr[test] = pred[k][test]
            refits[plan.hardware], train_rows[plan.hardware] = coeffs, int(train.sum())
        return Fold(kind=kind, key=key, rows=int((held & self.scored & self.predicted).sum()), refits=refits,
                    train_rows=train_rows, cpu_s=time.process_time() - t0)

    def keys(self, kind: str) -> list[str | None]:
        if kind == "source":
            return [m.source for m in self.mapped]
        return [r.key(kind) if r is not None else None for r in self.regimes]

    def scheme(self, kind: str, progress: Callable[[str], None] | None) -> Scheme:
        t0 = time.process_time()
        out = {k: v.copy() for k, v in self.arrays.items()}
        keys = np.array(self.keys(kind), dtype=object)
        values = list(dict.fromkeys(k for k, s, p in zip(keys, self.scored, self.predicted) if s and p))
        folds = []
        for value in values:
            folds.append(self.fold(kind, value, keys == value, out))
            if progress:
                f = folds[-1]
                progress(f"{KIND_TITLES[kind]}: {value} ({f.rows} rows; refitted "
                         f"{', '.join(f.refits) or 'nothing'}; {f.cpu_s:.1f} s CPU)")
        return Scheme(kind=kind, rows=tuple(self.results(out)), folds=tuple(folds), cpu_s=time.process_time() - t0)

    def results(self, arrays: dict[str, np.ndarray]) -> list[RowResult]:
        keep = [i for i in range(len(self.mapped)) if self.scored[i] and self.predicted[i]]
        sub = {k: v[keep] for k, v in arrays.items()}
        return row_results([self.mapped[i] for i in keep], sub)


def cross_validate(paths: Iterable[str | Path], predictor=None, *, plans: Sequence[FitPlan] | None = None,
                   kinds: Sequence[str] = KINDS, fit_only: Iterable[str | Path] | None = None,
                   mapped: Sequence[MappedRow] | None = None,
                   progress: Callable[[str], None] | None = None) -> CrossValidation:
    """In-sample and held-out error of every row of the measurement files `paths`.

    ``plans`` (default :func:`recorded_plans`) say how each profile is fitted; ``fit_only`` are
    files whose rows the fits use but that are not scored (default: the plans' recorded files from
    the shipped data that `paths` lacks). ``kinds`` are the leave-one-out kinds of :data:`KINDS`.
    ``mapped`` passes rows already mapped (tests, synthetic data; then nothing is fit-only).
    ``progress`` receives one line per fold.
    """
    from .api import Predictor
    from .measurements import builtin_data_dir, map_files

    t0 = time.process_time()
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ConfigError(f"--leave-out {bad[0]}: choose from {', '.join(KINDS)}")
    predictor = predictor or Predictor()
    recorded = recorded_plans(predictor.registry)
    plans = list(recorded if plans is None else plans)
    support = siblings(plans, recorded)
    notes: list[str] = []
    skipped: list[SkippedRow] = []
    if mapped is None:
        paths = [Path(p) for p in paths]
        mapped, skipped, notes = map_files(paths, predictor.registry)
        if fit_only is None:
            names = {p.name for p in paths}
            fit_only = [builtin_data_dir() / f for f in dict.fromkeys(f for p in [*plans, *support] for f in p.files)
                        if f not in names and (builtin_data_dir() / f).exists()]
        extra, _, _ = map_files(list(fit_only), predictor.registry) if fit_only else ([], [], [])
        scored = np.array([True] * len(mapped) + [False] * len(extra))
        mapped = [*mapped, *extra]
    else:
        scored = np.ones(len(mapped), bool)
    mapped = resolve_unstated(list(mapped), predictor)
    folds = _Folds(mapped, scored, predictor, plans, support)
    scored_sources = {m.source for m, s in zip(mapped, scored) if s}
    skipped += [s for s in folds.infeasible if s.source in scored_sources]
    if not any(folds.scored & folds.predicted):
        raise ConfigError("none of the rows could be predicted (see `mofa validate`)")
    prep = time.process_time() - t0
    in_sample = Scheme(kind="in-sample", rows=tuple(folds.results(folds.arrays)))
    held = {k: folds.scheme(k, progress) for k in kinds}
    keep = [i for i in range(len(mapped)) if scored[i] and folds.predicted[i]]
    return CrossValidation(regimes=tuple(folds.regimes[i] for i in keep), in_sample=in_sample, held_out=held,
                           skipped=tuple(skipped), plans=tuple(folds.plans), fitted=tuple(bool(folds.fitted[i]) for i in keep),
                           prepare_cpu_s=prep, cpu_s=time.process_time() - t0, notes=tuple(notes))


def pct(x: float) -> str:
    """A fraction as a percentage to one decimal ("—" for NaN)."""
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f} %"


# ====================================================================== the shipped residual table

#: columns of :func:`residual_table` (``<kind>_out_s``: the row predicted with that kind's row held out)
TABLE_COLUMNS = ("source", "row_id", "gpu", "precision", "family", "framework", "schedule", "features", "num_gpus",
                 "global_batch_size", "group", "measured_s", "in_sample_s", *(f"{k.replace('-', '_')}_out_s" for k in KINDS))


def residual_table(cv: CrossValidation, registry, header: str) -> str:
    """Every scored row's regime, global batch, ranking group, measured step time, and in-sample and
    held-out predictions, as CSV (the table error bands are drawn from and the gates are checked on;
    ``header`` is its first comment line). A comment line per
    plan records the coefficients the held-out fits started from, and one per GPU of the rows its
    bf16 peak and HBM bandwidth (what error bands rank GPUs by, without reading their profiles)."""
    import csv
    import io

    buf = io.StringIO()
    buf.write(f"# {header}\n")
    for p in cv.plans:
        eff = registry.hardware_profile(p.hardware).efficiency
        buf.write(f"# plan {p.hardware}: " + " ".join(f"{k}={getattr(eff, k):.6g}" for k in p.parameters)
                  + f" | sources {' '.join(p.sources) or '(all)'}\n")
    for gpu in sorted({reg.gpu for reg in cv.regimes}):
        hw = registry.hardware_profile(gpu)
        buf.write(f"# gpu {gpu}: bf16_peak_flops_per_s={hw.peak_flops_per_s('bf16'):.6g} "
                  f"hbm_bandwidth_bytes_per_s={hw.hbm_bandwidth_bytes_per_s:.6g}\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(TABLE_COLUMNS)
    for i, (reg, r) in enumerate(zip(cv.regimes, cv.in_sample.rows)):
        held = [cv.held_out[k].rows[i].predicted_s if k in cv.held_out else math.nan for k in KINDS]
        w.writerow([r.source, r.row_id, reg.gpu, reg.precision, reg.family, reg.framework, reg.schedule,
                    ";".join(reg.features), reg.num_gpus, round(r.measured_s / r.measured_s_per_seq) if r.measured_s_per_seq
                    else "", "|".join(map(str, r.group)) if r.group else "", f"{r.measured_s:.6g}", f"{r.predicted_s:.6g}",
                    *(f"{x:.6g}" for x in held)])
    return buf.getvalue()


def table_gpu_specs(text: str) -> dict[str, tuple[float, float]]:
    """GPU → (bf16 peak FLOP/s, HBM bytes/s) from a :func:`residual_table` text's ``# gpu`` lines."""
    out = {}
    for line in text.splitlines():
        if line.startswith("# gpu ") and ":" in line:
            name, _, rest = line[len("# gpu "):].partition(":")
            vals = dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)
            try:
                out[name.strip()] = (float(vals["bf16_peak_flops_per_s"]), float(vals["hbm_bandwidth_bytes_per_s"]))
            except (KeyError, ValueError):
                continue
    return out


def table_records(text: str) -> list[dict[str, str]]:
    """The rows of a :func:`residual_table` text (comment lines skipped)."""
    import csv

    return list(csv.DictReader(ln for ln in text.splitlines() if ln and not ln.startswith("#")))


def table_columns(text: str) -> dict[str, tuple[str, ...]]:
    """The columns of a :func:`residual_table` text, header → cells (comment lines skipped; none:
    empty): what :func:`table_records` reads, a column at a time (twice as fast for the band's reader)."""
    import csv

    reader = csv.reader(ln for ln in text.splitlines() if ln and not ln.startswith("#"))
    header = next(reader, [])
    cells = list(zip(*reader))
    return {h: cells[i] if cells else () for i, h in enumerate(header)}


# ====================================================================== the gates (issue 17 §2)

#: sources with at least this many predicted rows are gated one by one
GATE_MIN_ROWS = 10
GATE_SOURCE_MAPE = 0.10
GATE_OVERALL_MAPE = 0.06
#: reported beside the held-out figures, never gated alone
GATE_IN_SAMPLE_MAPE = 0.04
#: strategy ranking, held out, in every ranked group of a source
GATE_SPEARMAN = 0.90


@attrs.frozen(kw_only=True)
class Gate:
    key: str
    target: str
    achieved: float
    threshold: float
    #: "le": met when achieved ≤ threshold; "ge": ≥
    sense: str = "le"

    @property
    def met(self) -> bool:
        return self.achieved <= self.threshold if self.sense == "le" else self.achieved >= self.threshold


def gates(text: str) -> list[Gate]:
    """Issue 17 §2's gates on a :func:`residual_table` text: per source with ≥ :data:`GATE_MIN_ROWS`
    rows and overall, the leave-one-source-out MAPE; the in-sample overall MAPE; per source with
    ranked groups, the smallest held-out Spearman ρ of its strategy ranking."""
    from types import SimpleNamespace

    recs = table_records(text)
    err = lambda r, col: float(r[col]) / float(r["measured_s"]) - 1.0  # noqa: E731
    by: dict[str, list[dict]] = defaultdict(list)
    for r in recs:
        by[r["source"]].append(r)
    out = []
    for src, rows in by.items():
        st = ErrorStats.of([err(r, "source_out_s") for r in rows])
        if st.n >= GATE_MIN_ROWS:
            out.append(Gate(key=f"source:{src}", target=f"{src}: held-out MAPE ≤ {pct(GATE_SOURCE_MAPE)}",
                            achieved=st.mape, threshold=GATE_SOURCE_MAPE))
    out.append(Gate(key="overall", target=f"overall held-out MAPE ≤ {pct(GATE_OVERALL_MAPE)}",
                    achieved=ErrorStats.of([err(r, "source_out_s") for r in recs]).mape, threshold=GATE_OVERALL_MAPE))
    out.append(Gate(key="in-sample", target=f"overall in-sample MAPE ≤ {pct(GATE_IN_SAMPLE_MAPE)}",
                    achieved=ErrorStats.of([err(r, "in_sample_s") for r in recs]).mape, threshold=GATE_IN_SAMPLE_MAPE))
    for src, rows in by.items():
        ranked = [SimpleNamespace(group=(src, r["group"]), measured_s_per_seq=float(r["measured_s"]) / int(gbs),
                                  predicted_s_per_seq=float(r["source_out_s"]) / int(gbs))
                  for r in rows if r["group"] and (gbs := r["global_batch_size"])]
        rho = rank_stats(ranked).spearman
        if rho:
            out.append(Gate(key=f"ranking:{src}", achieved=min(rho.values()), threshold=GATE_SPEARMAN, sense="ge",
                            target=f"{src}: strategy ranking ρ ≥ {GATE_SPEARMAN} in every group, held out "
                                   f"({len(rho)} groups)"))
    return out
