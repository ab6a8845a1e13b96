"""Fit a hardware profile's ``[efficiency]`` coefficients to published step times (``mofa calibrate``).

A few physically meaningful coefficients of :class:`~mofa_framework.types.EfficiencySpec` are
fitted per hardware profile, across all its rows of all sources (never one per row), by least
squares on the log step-time error::

    r_i = w_i · ln(t_pred,i(θ) / t_meas,i)        w_i = 1/√(rows of row i's source)

so every source weighs the same however many rows it has (vTrain's 1,440 would otherwise drown
Megatron's 25), plus a weak prior ``λ·ln(θ/θ₀)`` that holds coefficients the rows cannot see at
the library's default θ₀ (``EfficiencySpec``; ``start=`` overrides it). The fit never starts from
the profile's current values, so re-running the command recorded in a profile reproduces it. Bounds keep them physical (efficiencies in [0.3, 1]). The search runs on each
coefficient's range normalised to [0, 1] and starts twice — from the profile's values and from
the middle of the ranges — keeping the better fit (a floor such as ``host_dispatch_s`` has no
gradient where it is inactive). Coefficients the rows are insensitive to are reported and left
alone. k-fold cross-validation refits on k−1 folds and
reports the error on the rows held out.

SciPy (``pip install mofa[fit]``) is used if present (``scipy.optimize.least_squares``); without
it a small numpy coordinate search does the same job, more slowly.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs
import numpy as np

from .config import HARDWARE_PATH, read_toml, user_toml_files
from .errors import ConfigError
from .types import EfficiencySpec
from .validate import ErrorStats, MappedRow, from_sources, map_rows, predict_prepared, prepare, resolve_unstated

#: name → (lower, upper, log-scaled?)
PARAMETERS: dict[str, tuple[float, float, bool]] = {
    "gemm_efficiency": (0.3, 1.0, False),
    "gemm_half_efficiency_s": (1e-8, 1e-4, True),
    "gemm_half_dim": (0.0, 1024.0, False),
    "gemm_half_dim_k": (0.0, 2048.0, False),
    "kernel_launch_s": (0.0, 2.0e-5, False),
    "host_dispatch_s": (0.0, 2.0e-4, False),
    "attention_efficiency": (0.3, 1.0, False),
    # the measured tables' coefficients: what a training run reaches relative to the microbenchmark
    # (prior 1 = the microbenchmark's rate; see plugins/profiled_gemm.py, profiled_attention.py)
    "profiled_gemm_relative_efficiency": (0.6, 1.1, False),
    # the kernel curves (attention_kernels.toml) now price the kernel a framework runs (cuDNN on Hopper and
    # Blackwell), so what is left is a training run against its kernel's benchmark: 0.6–1.5, not the
    # 0.5–4.0 that let Blackwell profiles carry cuDNN's 3× over FlashAttention-2 (and whatever else)
    "profiled_attention_relative_efficiency": (0.6, 1.5, False),
    "attention_half_head_dim": (0.0, 256.0, False),
    "memory_efficiency": (0.3, 1.0, False),
    "fp4_gemm_relative_efficiency": (0.3, 1.0, False),
    "fp8_gemm_relative_efficiency": (0.3, 1.0, False),
    "mxfp8_gemm_relative_efficiency": (0.3, 1.0, False),
    "scaleup_bus_efficiency": (0.3, 1.0, False),
    "scaleout_bus_efficiency": (0.3, 1.0, False),
    "alltoall_relative_efficiency": (0.1, 1.0, False),
    "scaleup_latency_us": (0.5, 100.0, True),
    "scaleout_latency_us": (0.5, 100.0, True),
    "bandwidth_decay_per_doubling": (0.0, 0.2, False),
    # what Megatron does once per step outside the priced optimizer and DP collectives (gradient norm,
    # loss-scale check, timers, logging) takes ms to tens of ms: a larger constant stands for a missing
    # mechanism and charges it to every step (Blackwell's fits put 0.3-0.6 s there: docs/validation.md)
    "step_overhead_s": (0.0, 0.1, False),
    "moe_step_overhead_s": (0.0, 2.0, False),
    "microbatch_overhead_s": (0.0, 0.02, False),
    "chunk_overhead_s": (0.0, 0.005, False),
    "contention_compute": (1.0, 1.5, False),
    "contention_comm": (1.0, 2.0, False),
}
DEFAULT_PARAMETERS = ("gemm_efficiency", "gemm_half_efficiency_s", "attention_efficiency",
                      "scaleup_bus_efficiency", "scaleout_bus_efficiency", "step_overhead_s")
#: per-step constants: identifiable if a second of them moves some row (their bounds' 2 s would
#: flag every row)
STEP_CONSTANTS = ("step_overhead_s", "moe_step_overhead_s")
#: weight of the prior ln(θ/θ₀) residuals (≈ a 1/λ relative step is worth one source's misfit)
PRIOR_WEIGHT = 0.05
#: a coefficient is fitted only if some row's ln t moves by this much over its bounds' range
MIN_SENSITIVITY = 0.01
#: robust loss: residuals beyond ~this weighted ln-error count linearly, not squared (outlier rows,
#: e.g. MoE configurations whose expert kernels the cost model does not price, cannot drag the fit)
ROBUST_SCALE = 0.05


@attrs.frozen(kw_only=True)
class FoldResult:
    fold: int
    train_rows: int
    test_rows: int
    coefficients: dict[str, float]
    test: ErrorStats


@attrs.frozen(kw_only=True)
class CalibrationResult:
    hardware: str
    #: coefficients before and after
    start: dict[str, float]
    fitted: dict[str, float]
    #: parameters asked for but left alone (the rows do not constrain them)
    not_identifiable: tuple[str, ...]
    rows: int
    rows_by_source: dict[str, int]
    before: ErrorStats
    after: ErrorStats
    after_by_source: dict[str, ErrorStats]
    folds: tuple[FoldResult, ...]
    #: held-out error over all folds (each row predicted by the fit that did not see it)
    cross_validated: ErrorStats | None
    cross_validated_by_source: dict[str, ErrorStats]
    method: str
    skipped: int
    #: rows on the profile their reader marks as not for fitting (``MappedRow.fit``)
    unfitted: int = 0
    #: rows of the profile left out of the fit (``hold_out``) and their error before / after it
    held_back_rows: int = 0
    held_back_before: ErrorStats | None = None
    held_back_after: ErrorStats | None = None
    held_back_by_source: dict[str, ErrorStats] = attrs.field(factory=dict)

    def to_dict(self) -> dict:
        return attrs.asdict(self)


# ====================================================================== model of the fit


class _Problem:
    """Rows of one hardware profile, prepared once; ln-error as a function of θ."""

    def __init__(self, mapped: Sequence[MappedRow], predictor, hw, params: Sequence[str], groups=None):
        self.mapped = list(mapped)
        self.predictor = predictor
        self.hw = hw
        self.params = list(params)
        # ``groups``: batches already prepared over `mapped` (cross-validation prepares once for every fold)
        self.groups, self.infeasible = (list(groups), []) if groups is not None else prepare(self.mapped, predictor)
        self.meas = np.array([m.measured_s for m in self.mapped])
        self.sources = np.array([m.source for m in self.mapped])
        self.n_evals = 0

    def coefficients(self, x: np.ndarray) -> dict[str, float]:
        out = {}
        for name, xi in zip(self.params, x):
            lo, hi, log = PARAMETERS[name]
            out[name] = float(10.0 ** xi) if log else float(xi)
        return out

    def encode(self, coeffs: dict[str, float]) -> np.ndarray:
        out = []
        for name in self.params:
            lo, hi, log = PARAMETERS[name]
            v = min(max(coeffs[name], lo if not log else lo * 1.0000001), hi)
            out.append(math.log10(max(v, 1e-30)) if log else v)
        return np.array(out, dtype=float)

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        lo = [math.log10(PARAMETERS[n][0]) if PARAMETERS[n][2] else PARAMETERS[n][0] for n in self.params]
        hi = [math.log10(PARAMETERS[n][1]) if PARAMETERS[n][2] else PARAMETERS[n][1] for n in self.params]
        return np.array(lo), np.array(hi)

    def profile(self, coeffs: dict[str, float]):
        return attrs.evolve(self.hw, efficiency=attrs.evolve(self.hw.efficiency, **coeffs))

    def log_error(self, coeffs: dict[str, float]) -> np.ndarray:
        self.n_evals += 1
        arr = predict_prepared(self.groups, self.predictor, {self.hw.name: self.profile(coeffs)},
                               n_rows=len(self.mapped))
        return np.log(arr["step_s"] / self.meas)


def _weights(sources: np.ndarray, mask: np.ndarray) -> np.ndarray:
    w = np.zeros(len(sources))
    for s in np.unique(sources[mask]):
        sel = mask & (sources == s)
        w[sel] = 1.0 / math.sqrt(sel.sum())
    return w


def _fit(problem: _Problem, x0: np.ndarray, mask: np.ndarray, prior: np.ndarray) -> tuple[np.ndarray, str]:
    lo, hi = problem.bounds()
    w = _weights(problem.sources, mask)
    span = hi - lo

    # the search runs on u = (x − lo)/span ∈ [0, 1], so finite-difference steps are a fixed fraction
    # of each coefficient's range (a relative step on x itself would be ~1e-3 s for a coefficient
    # bounded at 2e-5 s, or nothing at all for one starting at 0)
    def residuals(u):
        x = lo + u * span
        e = problem.log_error(problem.coefficients(x))
        e = np.where(np.isfinite(e), e, 5.0)
        return np.concatenate([(w * e)[mask], PRIOR_WEIGHT * (x - prior) / span])

    u0 = np.clip((x0 - lo) / span, 1e-9, 1.0 - 1e-9)
    try:
        from scipy.optimize import least_squares
    except ImportError:
        u = _coordinate_search(residuals, u0, np.zeros_like(u0), np.ones_like(u0))
        return lo + u * span, "numpy coordinate search"
    sol = least_squares(residuals, u0, bounds=(0.0, 1.0), diff_step=1e-3, xtol=1e-6, ftol=1e-8,
                        loss="soft_l1", f_scale=ROBUST_SCALE, max_nfev=200)
    return lo + sol.x * span, "scipy.optimize.least_squares (trust-region reflective)"


def _cost(problem: _Problem, x: np.ndarray, mask: np.ndarray, prior: np.ndarray) -> float:
    """The robust objective the fit minimises (soft-ℓ1 of the weighted residuals, plus the prior)."""
    lo, hi = problem.bounds()
    e = problem.log_error(problem.coefficients(x))
    r = (_weights(problem.sources, mask) * np.where(np.isfinite(e), e, 5.0))[mask] / ROBUST_SCALE
    p = PRIOR_WEIGHT * (x - prior) / (hi - lo) / ROBUST_SCALE
    return float(np.sum(2.0 * (np.sqrt(1.0 + r * r) - 1.0)) + np.sum(2.0 * (np.sqrt(1.0 + p * p) - 1.0)))


def _best_of_starts(problem: _Problem, x0: np.ndarray, mask: np.ndarray,
                    prior: np.ndarray) -> tuple[np.ndarray, str]:
    """Fit from the profile's coefficients and from the middle of every range; keep the better.

    The objective is not convex: a floor such as ``host_dispatch_s`` has no gradient while it is
    below every operator's GPU time, so a fit started at 0 never switches it on; a second start
    from the middle of the ranges finds that basin when the rows want it.
    """
    lo, hi = problem.bounds()
    best: tuple[float, np.ndarray, str] | None = None
    for start in (x0, lo + 0.5 * (hi - lo)):
        x, method = _fit(problem, start, mask, prior)
        cost = _cost(problem, x, mask, prior)
        if best is None or cost < best[0]:
            best = (cost, x, method)
    assert best is not None
    return best[1], best[2]


def _coordinate_search(residuals, x0, lo, hi, rounds: int = 30) -> np.ndarray:
    """Fallback without SciPy: shrink-step coordinate descent on Σr²."""
    x = x0.copy()
    best = float(np.sum(residuals(x) ** 2))
    step = (hi - lo) / 4.0
    for _ in range(rounds):
        improved = False
        for i in range(len(x)):
            for sgn in (1.0, -1.0):
                y = x.copy()
                y[i] = min(max(y[i] + sgn * step[i], lo[i]), hi[i])
                f = float(np.sum(residuals(y) ** 2))
                if f < best:
                    x, best, improved = y, f, True
                    break
        if not improved:
            step = step / 2.0
            if np.all(step < 1e-4 * (hi - lo)):
                break
    return x


# ====================================================================== entry point


def identifiable(problem: _Problem, base: dict[str, float], parameters: Sequence[str], mask: np.ndarray) -> list[str]:
    """The `parameters` the rows in `mask` see: some row's ln t moves by ``MIN_SENSITIVITY`` or more
    between the ends of the coefficient's bounds (the others are left alone by the fit)."""
    keep = []
    for name in parameters:
        lo, hi, _ = PARAMETERS[name]
        a = problem.log_error({**base, name: lo if name not in STEP_CONSTANTS else 0.0})
        b = problem.log_error({**base, name: hi if name not in STEP_CONSTANTS else 1.0})
        if mask.any() and np.nanmax(np.abs(a - b)[mask]) >= MIN_SENSITIVITY:
            keep.append(name)
    return keep


def parse_priors(items: Iterable[str]) -> dict[str, float]:
    """``NAME=VALUE`` strings (``--prior``) → {coefficient: prior value}: the value a fit holds the
    coefficient towards (and starts from) instead of the library default. Each must name a fittable
    coefficient and lie within its bounds (:data:`PARAMETERS`)."""
    out: dict[str, float] = {}
    for item in items:
        name, eq, text = item.partition("=")
        name = name.strip()
        if not eq or name not in PARAMETERS:
            raise ConfigError(f"--prior {item!r}: give NAME=VALUE with NAME one of {', '.join(PARAMETERS)}")
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"--prior {item!r}: VALUE {text!r} is not a number (e.g. {name}=1e-4)") from None
        lo, hi, _ = PARAMETERS[name]
        if not lo <= value <= hi:
            raise ConfigError(f"--prior {item!r}: {value:g} is outside {name}'s bounds [{lo:g}, {hi:g}]")
        out[name] = value
    return out


def sibling_prior(efficiency: EfficiencySpec, parameters: Sequence[str]) -> dict[str, float]:
    """A fitted sibling's coefficients as the prior of `parameters` (``--prior-from``), each within
    its fitting bounds: the same GPU in another system, or its predecessor, is a better guess for
    what no row of this profile constrains than the library's default (which prices an unfitted
    GPU at its microbenchmarks' burst speed with no framework overhead)."""
    out = {}
    for name in parameters:
        lo, hi, _ = PARAMETERS[name]
        out[name] = min(max(float(getattr(efficiency, name)), lo), hi)
    return out


def _check_enough_rows(rows: int, fitted: Sequence[str], folds: int, hardware: str) -> None:
    """ConfigError when the rows cannot determine the coefficients: fewer rows than coefficients, more
    folds than rows, or folds whose training rows are fewer than the coefficients."""
    if len(fitted) > rows:
        raise ConfigError(f"{len(fitted)} coefficients ({', '.join(fitted)}) cannot be fitted to {rows} row(s) on "
                          f"{hardware!r}: give at least {len(fitted)} rows, or fit fewer with --param")
    if folds > rows:
        raise ConfigError(f"--folds {folds}: only {rows} rows are fitted on {hardware!r}; use at most {rows} "
                          "(leave-one-out) or 0 (no cross-validation)")
    if folds >= 2 and fitted and rows - math.ceil(rows / folds) < len(fitted):
        raise ConfigError(f"--folds {folds}: each fold's fit would see {rows - math.ceil(rows / folds)} of the {rows} "
                          f"rows on {hardware!r} for {len(fitted)} coefficients; use fewer folds, or 0")


def calibrate(paths: Iterable[str | Path], hardware: str, predictor=None, *,
              parameters: Sequence[str] = DEFAULT_PARAMETERS, folds: int = 5, seed: int = 0,
              start: dict[str, float] | None = None, mapped: Sequence[MappedRow] | None = None,
              hold_out: Sequence[str] = (), prior_from: str | None = None) -> CalibrationResult:
    """Fit `parameters` of `hardware`'s efficiency to every row on that profile in `paths`.

    ``start`` overrides the prior the fit starts from and holds coefficients towards (default: the
    library's, :class:`EfficiencySpec`; ``--prior``); ``prior_from`` names a fitted sibling profile
    whose coefficients replace the library's as that prior (``--prior-from``; ``start`` still wins
    where it names a coefficient); ``mapped`` passes
    rows already mapped (tests, synthetic data). ``folds`` < 2 skips cross-validation.
    ``hold_out`` holds back the rows whose source (file stem) or reference contains one of the
    given strings (case-insensitive): they are not fitted, and their error before and after the
    fit is reported (a held-back split, e.g. one publication against the others).
    """
    from .api import Predictor

    predictor = predictor or Predictor()
    unknown = [p for p in parameters if p not in PARAMETERS]
    if unknown:
        raise ConfigError(f"--param {unknown[0]}: not a fittable coefficient; choose from {', '.join(PARAMETERS)}")
    hw = predictor.registry.hardware_profile(hardware, field="--hardware")
    if mapped is None:
        mapped, _ = map_rows(paths, predictor.registry)
    mapped = resolve_unstated(mapped, predictor)  # rows given already resolved pass unchanged
    mine = [m for m in mapped if predictor.registry.hardware_profile(m.job["hardware"]["name"]).name == hw.name]
    unfitted = sum(1 for m in mine if not m.fit)
    mine = [m for m in mine if m.fit]  # rows their reader marks as not for fitting (validated only)
    if not mine:
        marked = f"; {unfitted} are marked by their reader as not for fitting" if unfitted else ""
        raise ConfigError(f"no mappable rows on hardware {hw.name!r} in the given files (their GPU columns name "
                          f"other profiles{marked}: --all-rows fits every row on {hw.name!r}; see `mofa validate`)")
    current = {name: float(getattr(hw.efficiency, name)) for name in parameters}
    base = dict(current)
    # the fit starts from, and is weakly held towards, the library's defaults (EfficiencySpec), not
    # the profile's current values: re-running the command recorded in a profile reproduces it
    defaults = EfficiencySpec()
    anchor = {name: float(getattr(defaults, name)) for name in parameters}
    if prior_from:
        sibling = predictor.registry.hardware_profile(prior_from, field="--prior-from")
        if sibling.name == hw.name:
            raise ConfigError(f"--prior-from {prior_from}: name another profile than --hardware {hw.name} "
                              "(a fitted sibling: the same GPU in another system, or its predecessor)")
        anchor.update(sibling_prior(sibling.efficiency, parameters))
    if start:
        anchor.update({k: float(v) for k, v in start.items() if k in anchor})
    problem = _Problem(mine, predictor, hw, parameters)
    feasible = np.isfinite(problem.log_error(base))
    if not feasible.any():
        raise ConfigError(f"none of the {len(mine)} rows on {hw.name!r} is feasible (see `mofa validate`)")
    back = np.array([from_sources(m, hold_out) for m in mine], bool)
    back &= feasible
    ok = feasible & ~back  # the rows fitted
    if not ok.any():
        raise ConfigError(f"--hold-out {', '.join(hold_out)}: holds back every feasible row on {hw.name!r}, "
                          "none is left to fit")
    keep = identifiable(problem, base, parameters, ok)
    frozen = tuple(p for p in parameters if p not in keep)
    _check_enough_rows(int(ok.sum()), keep, folds, hw.name)
    if back.any():
        # a clean split: what the fitted rows do not constrain takes the library default, not the
        # profile's value (which the held-back rows may have set)
        base = {**base, **{p: anchor[p] for p in frozen}}
    problem.params = keep
    prior = problem.encode(anchor)
    x0 = prior.copy()
    before = ErrorStats.of(np.expm1(problem.log_error(current)[ok]))
    method = "none (no identifiable coefficient)"
    x = x0
    if keep:
        x, method = _best_of_starts(problem, x0, ok, prior)
    fitted = {**base, **problem.coefficients(x)}
    err = np.expm1(problem.log_error(fitted))
    after = ErrorStats.of(err[ok])
    by_source = {s: ErrorStats.of(err[ok & (problem.sources == s)]) for s in dict.fromkeys(problem.sources[ok])}
    fold_results: list[FoldResult] = []
    held = np.full(len(mine), np.nan)
    if folds >= 2 and keep:
        rng = np.random.default_rng(seed)
        idx = rng.permutation(np.flatnonzero(ok))
        for k, test in enumerate(np.array_split(idx, folds)):
            train = ok.copy()
            train[test] = False
            xk, _ = _fit(problem, x, train, prior)
            ck = {**base, **problem.coefficients(xk)}
            ek = np.expm1(problem.log_error(ck))
            held[test] = ek[test]
            fold_results.append(FoldResult(fold=k + 1, train_rows=int(train.sum()), test_rows=len(test),
                                           coefficients=problem.coefficients(xk), test=ErrorStats.of(ek[test])))
    cv = ErrorStats.of(held[np.isfinite(held)]) if fold_results else None
    cv_by = ({s: ErrorStats.of(held[np.isfinite(held) & (problem.sources == s)])
              for s in dict.fromkeys(problem.sources[ok])} if fold_results else {})
    counts: dict[str, int] = defaultdict(int)
    for s in problem.sources[ok]:
        counts[str(s)] += 1
    held_back: dict = {}
    if back.any():
        err0 = np.expm1(problem.log_error(current))
        held_back = dict(held_back_rows=int(back.sum()), held_back_before=ErrorStats.of(err0[back]),
                         held_back_after=ErrorStats.of(err[back]),
                         held_back_by_source={s: ErrorStats.of(err[back & (problem.sources == s)])
                                              for s in dict.fromkeys(problem.sources[back])})
    return CalibrationResult(
        hardware=hw.name, start=current, fitted=fitted, not_identifiable=frozen, rows=int(ok.sum()),
        rows_by_source=dict(counts), before=before, after=after, after_by_source=by_source,
        folds=tuple(fold_results), cross_validated=cv, cross_validated_by_source=cv_by, method=method,
        skipped=int((~feasible).sum()), unfitted=unfitted, **held_back)


# ====================================================================== writing the profile


def profile_path(hardware: str) -> Path:
    """The TOML a profile was read from: ``hardware_profiles/<name>.toml``, else the file of a
    ``MOFA_HARDWARE_PATH`` directory whose ``name`` is `hardware`."""
    import mofa_hardware_profiles

    p = Path(mofa_hardware_profiles.__file__).resolve().parent / f"{hardware}.toml"
    if p.exists():
        return p
    for user in user_toml_files(HARDWARE_PATH):
        if read_toml(user).get("name") == hardware:
            return user
    raise ConfigError(f"profile {hardware!r} has no TOML in {p.parent} or {HARDWARE_PATH}; "
                      "write its [efficiency] table by hand")


def rename_profile(text: str, name: str, display_name: str) -> str:
    """`text` (a profile TOML) as the profile `name`: its top-level ``name`` and ``display_name``
    replaced and its aliases dropped (they belong to the profile it was copied from)."""
    out, top = [], True
    for line in text.splitlines():
        if re.match(r"\s*\[", line):
            top = False
        key = re.match(r"\s*(name|display_name|aliases)\s*=", line) if top else None
        if key is None:
            out.append(line)
        elif key.group(1) == "name":
            out.append(f"name = {json.dumps(name)}")
            out.append(f"display_name = {json.dumps(display_name)}")
    return "\n".join(out) + "\n"


_MARK = "# [efficiency] fitted by `mofa calibrate`"


def _fmt(x: float) -> str:
    if x == 0:
        return "0.0"
    if abs(x) < 1e-3 or abs(x) >= 1e4:
        return f"{x:.4g}".replace("e-0", "e-").replace("e+0", "e+")
    return f"{x:.4g}" if "." in f"{x:.4g}" or "e" in f"{x:.4g}" else f"{x:.4g}.0"


def efficiency_table(values: dict[str, float], comment: Sequence[str]) -> str:
    lines = [f"{_MARK}: " + comment[0]] + [f"# {c}" for c in comment[1:]] + ["[efficiency]"]
    lines += [f"{k} = {_fmt(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def replace_efficiency(text: str, table: str) -> str:
    """`text` (a profile TOML) with its ``[efficiency]`` table (and our comment) replaced by `table`."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(_MARK):  # our previous comment block
            while i < len(lines) and lines[i].startswith("#"):
                i += 1
            continue
        if line.strip() == "[efficiency]":
            i += 1
            while i < len(lines) and not re.match(r"\s*\[", lines[i]):
                i += 1
            continue
        out.append(line)
        i += 1
    body = "\n".join(out).rstrip("\n")
    return body + "\n\n" + table


def write_profile(result: CalibrationResult, dest: str | Path, command: str, source: str | Path | None = None,
                  name: str | None = None, predictor=None) -> Path:
    """Write the profile's TOML with the fitted ``[efficiency]`` table to `dest`; with `name`, as a
    new profile of that name (see :func:`rename_profile`). `predictor` is the one the fit used
    (default: a new one with every installed plugin)."""
    from .api import Predictor

    src = Path(source) if source else profile_path(result.hardware)
    text = src.read_text()
    hw = (predictor or Predictor()).registry.hardware_profile(result.hardware)
    values = {}
    from .types import EfficiencySpec

    default = EfficiencySpec()
    for f in attrs.fields(EfficiencySpec):  # keep hand-set entries, then the fitted ones
        v = getattr(hw.efficiency, f.name)
        if f.name in result.fitted:
            values[f.name] = result.fitted[f.name]
        elif v != getattr(default, f.name):
            values[f.name] = v
    cv = result.cross_validated
    comment = [command,
               f"{result.rows} rows ({', '.join(f'{k}: {v}' for k, v in result.rows_by_source.items())}); "
               f"step-time MAPE {100 * result.before.mape:.1f} % → {100 * result.after.mape:.1f} %"
               + (f", {len(result.folds)}-fold held-out MAPE {100 * cv.mape:.1f} %" if cv else "")]
    if result.held_back_after is not None:
        comment.append(f"{result.held_back_rows} rows held back, not fitted "
                       f"({', '.join(f'{k}: {v.n}' for k, v in result.held_back_by_source.items())}): step-time MAPE "
                       f"{100 * result.held_back_before.mape:.1f} % → {100 * result.held_back_after.mape:.1f} %")
    if result.not_identifiable:
        comment.append(f"left at their defaults (the rows do not constrain them): {', '.join(result.not_identifiable)}")
    if name:
        text = rename_profile(text, name, f"{hw.display_name or hw.name} calibrated as {name}")
    dest = Path(dest)
    try:
        dest.write_text(replace_efficiency(text, efficiency_table(values, comment)))
    except OSError as exc:
        raise ConfigError(f"--write {dest}: cannot write: {exc}") from None
    return dest
