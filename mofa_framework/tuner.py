"""The tuner (paper §4): a vectorised joint search over parallel strategies and features.

The space is TP × PP × VPP × CP × EP × ETP × micro-batch × schedule (the *structure*)
crossed with every installed feature's options (each feature off, or on with each value of
its options' ``search`` tuples). Structures are pruned first with every plugin's
``mofa_candidate_constraints`` and the paper's rules (§4.1: TP within a scale-up domain,
m ≥ the schedule's minimum, GBS divisibility); the surviving structures × feature combinations
are evaluated in vectorised chunks — operator and collective pricing once per structure,
feature transforms per row — and the best rows that fit in memory are kept.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import numpy as np

from .batch import PRECISIONS, CandidateBatch, FeatureRows
from .engine import Prediction
from .errors import ConfigError
from .invariants import feasible_result
from .types import HardwareProfile, ModelSpec
from .units import GIB

OBJECTIVES = ("step_time", "e2e_time", "gpu_hours")


def _pow2_upto(n: int) -> tuple[int, ...]:
    return tuple(2**i for i in range(int(math.log2(max(n, 1))) + 1))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@attrs.frozen(kw_only=True)
class SearchSpace:
    """Values to try per dimension; `features` maps a feature name to the option dicts to try
    (``None`` in the tuple = the feature off)."""

    tp: tuple[int, ...]
    pp: tuple[int, ...]
    vpp: tuple[int, ...]
    cp: tuple[int, ...]
    ep: tuple[int, ...]
    etp: tuple[int, ...]
    micro_batch_size: tuple[int, ...]
    schedules: tuple[str, ...]
    features: Mapping[str, tuple[Mapping[str, Any] | None, ...]] = attrs.field(factory=dict)

    @property
    def structures(self) -> int:
        return math.prod(len(x) for x in (self.tp, self.pp, self.vpp, self.cp, self.ep, self.etp,
                                          self.micro_batch_size, self.schedules))

    @property
    def feature_combinations(self) -> int:
        return math.prod(len(v) for v in self.features.values()) if self.features else 1

    @property
    def size(self) -> int:
        return self.structures * self.feature_combinations


def feature_choices(registry, name: str, fixed: Mapping[str, Any] | None = None,
                    allow_off: bool = True) -> tuple[Mapping[str, Any] | None, ...]:
    """Off plus every combination of the feature's options' ``search`` values."""
    feat = registry.feature(name, field=f"search.features.{name}")
    fields = attrs.fields(feat.options_type) if attrs.has(feat.options_type) else ()
    axes = []
    for f in fields:
        if fixed and f.name in fixed:
            axes.append((f.name, (fixed[f.name],)))
        else:
            search = f.metadata.get("search") or (f.default,)
            axes.append((f.name, tuple(search)))
    combos = [dict(zip([a for a, _ in axes], values)) for values in itertools.product(*[v for _, v in axes])]
    return ((None,) if allow_off else ()) + tuple(combos)


def default_space(registry, model: ModelSpec, hardware: HardwareProfile, num_gpus: int, seq: int,
                  features: Iterable[str] | None = None) -> SearchSpace:
    """The paper's space: powers of two within sensible bounds, every schedule and feature."""
    G = hardware.scaleup_domain_gpus
    tp = tuple(t for t in _pow2_upto(min(G, num_gpus, model.num_attention_heads)))
    pp = tuple(sorted({p for p in (*_pow2_upto(min(num_gpus, model.num_layers)),
                                   *[d for d in _divisors(model.num_layers) if d <= 64])
                       if p <= num_gpus and num_gpus % p == 0}))
    vpp = tuple(v for v in (1, 2, 3, 4, 6, 8, 12, 16) if v <= model.num_layers)
    cp = tuple(c for c in _pow2_upto(min(32, num_gpus)) if seq % (2 * c) == 0 and seq // c >= 1024)
    ep = tuple(e for e in _pow2_upto(min(model.num_experts, num_gpus)) if model.num_experts % e == 0) \
        if model.is_moe else (1,)
    etp = (1,) if not model.is_moe else (1, 2, 4, 8)
    names = list(registry.features) if features is None else list(features)
    return SearchSpace(tp=tp, pp=pp, vpp=vpp, cp=cp or (1,), ep=ep, etp=etp, micro_batch_size=(1, 2, 4),
                       schedules=tuple(registry.schedules),
                       features={n: feature_choices(registry, n) for n in names if n in registry.features})


@attrs.frozen(kw_only=True)
class TuneRequest:
    model: ModelSpec
    hardware: HardwareProfile
    num_gpus: int = attrs.field(validator=attrs.validators.ge(1))
    global_batch_size: int = attrs.field(validator=attrs.validators.ge(1))
    sequence_length: int = attrs.field(validator=attrs.validators.ge(1))
    space: SearchSpace
    precision: str = attrs.field(default="bf16", validator=attrs.validators.in_(PRECISIONS))
    objective: str = attrs.field(default="step_time", validator=attrs.validators.in_(OBJECTIVES))
    top_k: int = attrs.field(default=10, validator=attrs.validators.ge(1))
    #: e2e objectives: ``(step_time_s array, batch) -> total seconds array``
    e2e: Callable | None = None
    chunk_rows: int = 262_144
    pareto: bool = False
    #: worker processes; 0 = one per core for large searches (forked; results are identical)
    workers: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    flash_attention: bool = True


@attrs.frozen(kw_only=True)
class Candidate:
    """One configuration the tuner kept, with the paper's Table 6 columns and the breakdown."""

    rank: int
    parallel: Mapping[str, Any]
    schedule: str
    features: Mapping[str, Mapping[str, Any]]
    step_time_s: float
    objective_value: float
    model_tflops_per_gpu: float
    mfu: float
    peak_memory_gib: float
    compute_s: float
    tp_comm_s: float
    pp_comm_s: float
    dp_comm_s: float
    optimizer_s: float
    breakdown: Mapping[str, float]
    memory_breakdown: Mapping[str, float]
    total_time_s: float | None = None

    def to_dict(self) -> dict:
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class TuneResult:
    best: tuple[Candidate, ...]
    evaluated: int
    feasible: int
    space_size: int
    structures: int
    structures_feasible: int
    elapsed_s: float
    #: rows removed by each rule (a row can fail several)
    removed_by: Mapping[str, int]
    pareto: tuple[Candidate, ...] = ()
    #: the smallest peak memory among evaluated candidates (explains an all-over-memory result)
    min_peak_memory_gib: float = float("inf")
    #: feasible candidates never evaluated because their structure's lower bound could not
    #: beat the k-th best found (exact branch and bound)
    skipped_by_bound: int = 0
    workers: int = 1

    @property
    def candidates_per_s(self) -> float:
        return self.evaluated / self.elapsed_s if self.elapsed_s > 0 else float("inf")

    def why_empty(self) -> str:
        """One line: which rules emptied the space (rows counted under the first rule they fail)."""
        if not self.removed_by:
            return "the search space is empty"
        ranked = sorted(self.removed_by.items(), key=lambda kv: -kv[1])
        head = f"no feasible configuration among {self.space_size:,} candidates: most were removed by " + "; then ".join(
            f"{rule} ({n:,})" for rule, n in ranked[:3])
        if self.evaluated and not self.feasible:
            head += (f". All {self.evaluated:,} that passed every rule need more memory than the GPU has "
                     f"(smallest peak {self.min_peak_memory_gib:.1f} GiB): add GPUs, or enable memory features")
        return head


# ---------------------------------------------------------------------- enumeration


def _structure_batch(req: TuneRequest, registry) -> CandidateBatch:
    s = req.space
    grids = np.meshgrid(np.array(s.tp), np.array(s.pp), np.array(s.vpp), np.array(s.cp), np.array(s.ep),
                        np.array(s.etp), np.array(s.micro_batch_size),
                        np.array([registry.schedule_code(x) for x in s.schedules]), indexing="ij")
    tp, pp, vpp, cp, ep, etp, mbs, sched = (g.ravel() for g in grids)
    denom = tp * pp * cp
    keep = (req.num_gpus % denom == 0) & (etp <= tp)
    tp, pp, vpp, cp, ep, etp, mbs, sched = (a[keep] for a in (tp, pp, vpp, cp, ep, etp, mbs, sched))
    n = len(tp)
    return CandidateBatch(
        tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, dp=req.num_gpus // (tp * pp * cp), micro_batch_size=mbs,
        global_batch_size=np.full(n, req.global_batch_size), sequence_length=np.full(n, req.sequence_length),
        sequence_parallel=tp > 1, precision=np.full(n, PRECISIONS.index(req.precision)), schedule=sched,
        first_stage_layers=np.zeros(n), last_stage_layers=np.zeros(n), flash_attention=np.full(n, req.flash_attention))


def _paper_rules(req: TuneRequest, registry, batch: CandidateBatch) -> list[tuple[str, np.ndarray]]:
    """§4.1 pruning beyond the plugins' constraints: TP in a scale-up domain, enough micro-batches,
    and only schedules that accept the vpp."""
    G = req.hardware.scaleup_domain_gpus
    scheds = list(registry.schedules.values())
    supports = np.array([s.supports_vpp for s in scheds])[batch.schedule]
    requires = np.array([s.requires_vpp for s in scheds])[batch.schedule]
    m = batch.num_microbatches
    min_m = np.ones(len(batch))
    for code, s in enumerate(scheds):
        if s.min_microbatches is not None:
            rows = batch.schedule == code
            min_m = np.where(rows, s.min_microbatches(batch.pp.astype(float)), min_m)
    return [
        ("tensor parallelism must stay inside one scale-up domain (tp ≤ GPUs per NVLink domain)", batch.tp <= G),
        ("the schedule needs more micro-batches per step (m ≥ its minimum, m ≥ p for 1F1B)", m >= min_m),
        ("the schedule does not interleave but vpp > 1, or needs vpp > 1",
         np.where(batch.vpp > 1, supports, ~requires)),
    ]


def _combos(req: TuneRequest, registry, names: list[str]) -> list[tuple]:
    """Conflict-free combinations of the given features' choices (None = off)."""
    out = []
    for combo in itertools.product(*[req.space.features[n] for n in names]) if names else [()]:
        on = {n for n, o in zip(names, combo) if o is not None}
        if any(c in on for n in on for c in registry.features[n].conflicts):
            continue
        out.append(combo)
    return out


def _feature_tables(names, combos, registry) -> dict[str, tuple[np.ndarray, dict, dict]]:
    """Per feature: on/off and option values of every combination (indexed by combination)."""
    tables = {}
    for j, name in enumerate(names):
        feat = registry.features[name]
        fields = attrs.fields(feat.options_type) if attrs.has(feat.options_type) else ()
        enabled = np.array([c[j] is not None for c in combos])
        opts = {}
        for f in fields:
            choices = f.metadata.get("choices")
            vals = [(c[j] or {}).get(f.name, f.default) for c in combos]
            opts[f.name] = np.array([float(choices.index(v)) if choices else float(v) for v in vals])
        tables[name] = (enabled, opts, {f.name: f.metadata["choices"] for f in fields if f.metadata.get("choices")})
    return tables


def _feature_rows(tables, combo_idx: np.ndarray) -> dict[str, FeatureRows]:
    """FeatureRows of a chunk: each row is combination ``combo_idx[row]`` of its group."""
    return {name: FeatureRows(enabled=enabled[combo_idx], options={k: v[combo_idx] for k, v in opts.items()},
                              choices=choices)
            for name, (enabled, opts, choices) in tables.items()}


# ---------------------------------------------------------------------- search


def _objective(req: TuneRequest, pred: Prediction) -> np.ndarray:
    if req.objective == "step_time":
        return pred.step_time_s
    if req.e2e is None:
        raise ConfigError(f"objective {req.objective!r} needs training.tokens (the tokens to train on)")
    total = req.e2e(pred.step_time_s, pred.batch)
    return total if req.objective == "e2e_time" else total * req.num_gpus / 3600.0


class _TopK:
    """The k best (value, tie-break key, candidate) seen so far, across chunks."""

    def __init__(self, k: int):
        self.k = k
        self.items: list[tuple[float, tuple, Candidate]] = []

    def threshold(self) -> float:
        return self.items[-1][0] if len(self.items) >= self.k else np.inf

    def offer(self, value: float, key: tuple, make: Callable[[], Candidate]) -> None:
        if value > self.threshold() or (len(self.items) >= self.k and (value, key) >= self.items[-1][:2]):
            return
        self.items.append((value, key, make()))
        self.items.sort(key=lambda x: (x[0], x[1]))
        del self.items[self.k:]


def tune(predictor, req: TuneRequest, progress: Callable[[int, int], None] | None = None) -> TuneResult:
    """Search `req.space` exhaustively (with exact pruning) and return the best configurations.

    Exact pruning: structures failing a constraint are dropped before feature combinations
    are formed, and a feature that cannot change a structure (its ``applies`` is false there,
    e.g. TP overlap at tp = 1) is only tried off on it, since on and off give the same row.
    """
    t0 = time.perf_counter()
    registry = predictor.registry
    all_names = sorted(req.space.features)
    for f in all_names:
        registry.feature(f, field=f"search.features.{f}")
    removed: dict[str, int] = {}
    sb = _structure_batch(req, registry)
    n_combo_full = len(_combos(req, registry, all_names)) if all_names else 1
    removed["hardware.num_gpus must be a multiple of tp × pp × cp (and etp ≤ tp)"] = \
        (req.space.structures - len(sb)) * n_combo_full
    keep = np.ones(len(sb), bool)
    if len(sb):
        checks = [(r.reason, np.asarray(r.feasible, bool))
                  for r in predictor.constraints(sb, req.model, req.hardware)]
        checks += _paper_rules(req, registry, sb)
        for reason, ok in checks:
            removed[reason] = removed.get(reason, 0) + int((~ok & keep).sum()) * n_combo_full
            keep &= ok
    structs = sb.take(np.flatnonzero(keep))
    # which features can change each structure
    applic = np.ones((len(structs), len(all_names)), bool)
    for j, name in enumerate(all_names):
        fn = registry.features[name].applies
        if fn is not None and len(structs):
            applic[:, j] = np.asarray(fn(structs, req.model, req.hardware), bool)
    groups: dict[tuple, list[int]] = {}
    for i, sig in enumerate(map(tuple, applic)):
        groups.setdefault(sig, []).append(i)
    bound = _lower_bounds(predictor, req, structs, all_names)
    plan = []
    for sig, members in sorted(groups.items()):
        names = [n for n, on in zip(all_names, sig) if on]
        members = np.array(members)
        if bound is not None:  # most promising structures first, so the bound bites early
            members = members[np.argsort(bound[members], kind="stable")]
        plan.append((names, _combos(req, registry, names), members))
    if bound is not None:
        plan.sort(key=lambda g: bound[g[2][0]] if len(g[2]) else np.inf)
    total = sum(len(m) * len(c) for _, c, m in plan)
    # tasks: slices of one group's structures, each about `chunk_rows` candidates
    tasks = []
    for names, combos, members in plan:
        per_chunk = max(1, req.chunk_rows // len(combos))
        tasks += [(names, combos, members[lo:lo + per_chunk]) for lo in range(0, len(members), per_chunk)]
    workers = req.workers or (min(os.cpu_count() or 1, 8) if total > 2 * req.chunk_rows else 1)
    if workers > 1 and "fork" not in mp.get_all_start_methods():
        workers = 1
    parts: list[_Partial] = []
    done = 0
    if workers > 1 and len(tasks) > 1:
        ctx = mp.get_context("fork")
        shared = ctx.Value("d", np.inf)
        _FORKED.update(predictor=predictor, req=req, structs=structs, tasks=tasks, names=all_names, bound=bound,
                       shared=shared)
        try:
            with ctx.Pool(workers) as pool:
                for part in pool.imap_unordered(_run_task, range(len(tasks))):
                    parts.append(part)
                    done += part.done
                    if progress:
                        progress(done, total)
        finally:
            _FORKED.clear()
    else:
        part = _Partial()
        for task in tasks:
            _search_task(predictor, req, structs, task, all_names, bound, part, None)
            if progress:
                progress(part.done, total)
        parts.append(part)
    top = _TopK(req.top_k)
    pareto_items: list[Candidate] = []
    for part in parts:
        for value, key, cand in part.top:
            top.offer(value, key, lambda cand=cand: cand)
        pareto_items += part.pareto
        for k, v in part.removed.items():
            removed[k] = removed.get(k, 0) + v
    best = tuple(attrs.evolve(c, rank=i + 1) for i, (_, _, c) in enumerate(top.items))
    front: tuple[Candidate, ...] = ()
    if pareto_items:
        t = np.array([c.step_time_s for c in pareto_items])
        mem = np.array([c.peak_memory_gib for c in pareto_items])
        front = tuple(pareto_items[i] for i in sorted(_pareto(t, mem), key=lambda i: t[i]))
    return TuneResult(best=best, evaluated=sum(p.evaluated for p in parts), feasible=sum(p.feasible for p in parts),
                      space_size=req.space.size, skipped_by_bound=sum(p.bounded for p in parts),
                      structures=req.space.structures, structures_feasible=len(structs),
                      elapsed_s=time.perf_counter() - t0, removed_by={k: v for k, v in removed.items() if v},
                      pareto=front, min_peak_memory_gib=min((p.min_peak for p in parts), default=float("inf")),
                      workers=workers)


@attrs.define
class _Partial:
    """What one worker (or the sequential loop) found."""

    top: list = attrs.Factory(list)
    pareto: list = attrs.Factory(list)
    removed: dict = attrs.Factory(dict)
    evaluated: int = 0
    feasible: int = 0
    bounded: int = 0
    done: int = 0
    min_peak: float = float("inf")


#: what forked workers inherit (set just before the pool forks, cleared after)
_FORKED: dict = {}


def _run_task(i: int) -> _Partial:
    st = _FORKED
    part = _Partial()
    _search_task(st["predictor"], st["req"], st["structs"], st["tasks"][i], st["names"], st["bound"], part,
                 st["shared"])
    return part


def _search_task(predictor, req: TuneRequest, structs: CandidateBatch, task, all_names, bound, part: _Partial,
                 shared) -> None:
    """Evaluate one slice of structures × its group's feature combinations into `part`."""
    registry = predictor.registry
    names, combos, sel = task
    n_combo = len(combos)
    top = _TopK(req.top_k)
    top.items = part.top
    threshold = (lambda: min(top.threshold(), shared.value)) if shared is not None else top.threshold
    mem_reason = "peak memory exceeds the GPU's HBM"
    removed = part.removed
    if bound is not None:  # exact: no feature combination can beat its structure's bound
        beatable = bound[sel] <= threshold()
        skipped = int((~beatable).sum()) * n_combo
        part.bounded += skipped
        part.done += skipped
        sel = sel[beatable]
        if not len(sel):
            return
    tables = _feature_tables(names, combos, registry)
    s_idx = np.repeat(sel, n_combo)
    c_idx = np.tile(np.arange(n_combo), len(sel))
    batch = attrs.evolve(structs.take(s_idx), features=_feature_rows(tables, c_idx))
    ok = np.ones(len(batch), bool)
    for feat in registry.features.values():
        rows = batch.feature(feat.name)
        if feat.feasible is not None and rows.enabled.any():
            r = feasible_result(registry, "features", feat, batch, rows)
            bad = ~r.feasible & rows.enabled & ok
            removed[r.reason] = removed.get(r.reason, 0) + int(bad.sum())
            ok &= ~bad
    idx = np.flatnonzero(ok)
    part.done += len(batch)
    if not len(idx):
        return
    sub = batch.take(idx) if len(idx) < len(batch) else batch
    first = np.flatnonzero(np.r_[True, np.diff(s_idx[idx]) != 0])
    inverse = np.cumsum(np.r_[False, np.diff(s_idx[idx]) != 0])
    pred = predictor.evaluate(sub, req.model, req.hardware, structure=(first, inverse))
    part.evaluated += len(idx)
    fits = pred.fits_in_memory
    part.min_peak = min(part.min_peak, float(pred.peak_memory_bytes.min()) / GIB)
    removed[mem_reason] = removed.get(mem_reason, 0) + int((~fits).sum())
    part.feasible += int(fits.sum())
    val = np.where(fits, _objective(req, pred), np.inf)
    k = min(req.top_k, len(val))
    best = np.argpartition(val, k - 1)[:k]
    for t in best[np.isfinite(val[best])]:
        combo = combos[c_idx[idx][t]]
        # ties go to the simpler configuration: fewer features on
        key = (sum(o is not None for o in combo), int(s_idx[idx][t]), repr(_combo_key(combo, names)))
        top.offer(float(val[t]), key, lambda t=t: _candidate(0, pred, int(t), all_names, registry, req, float(val[t])))
    part.top = top.items
    if shared is not None and np.isfinite(top.threshold()):
        with shared.get_lock():
            shared.value = min(shared.value, top.threshold())
    if req.pareto:
        ok_rows = np.flatnonzero(fits)
        for t in _pareto(pred.step_time_s[ok_rows], pred.peak_memory_bytes[ok_rows]):
            r = int(ok_rows[t])
            part.pareto.append(_candidate(0, pred, r, all_names, registry, req, float(val[r])))


def _lower_bounds(predictor, req: TuneRequest, structs: CandidateBatch, names: list[str]) -> np.ndarray | None:
    """An exact lower bound of the objective per structure, or None when none is valid.

    The compute (forward, backward-input, backward-weight) a stage runs per step bounds the step
    time of every feature combination on that structure: features only add work (recompute,
    offload) or hide communication — except those flagged ``may_reduce_compute`` (FP8, faster
    kernels). Those are tried in every combination of their searched options, everything else
    off, and the least compute is the bound. Schedules report busy time m·(F+B+W); one that
    claims less lowers the bound by its adjustment. The end-to-end objectives grow with the step
    time, so they are bounded through it.
    """
    reg = predictor.registry
    if req.pareto or not len(structs):
        return None
    reducers = [n for n in names if reg.features[n].may_reduce_compute]
    combos = _combos(req, reg, reducers) if reducers else [()]
    tables = _feature_tables(reducers, combos, reg)
    lb = np.full(len(structs), np.inf)
    pred = None
    for ci in range(len(combos)):
        idx = np.full(len(structs), ci)
        batch = attrs.evolve(structs, features=_feature_rows(tables, idx)) if reducers else structs
        pred = predictor.evaluate(batch, req.model, req.hardware)
        bd = pred.breakdown
        compute = (bd["compute_fwd"] + bd["compute_bwd_input"] + bd["compute_bwd_weight"]
                   + np.minimum(bd["schedule_adjust"], 0))
        lb = np.minimum(lb, np.maximum(compute, 0.0))
    if req.objective == "step_time":
        return lb
    return _objective(req, attrs.evolve(pred, step_time_s=lb))


def _combo_key(combo, names) -> tuple:
    return tuple((n, tuple(sorted((o or {}).items())) if o is not None else None) for n, o in zip(names, combo))


def _pareto(time_s: np.ndarray, mem: np.ndarray) -> list[int]:
    """Indices on the front of (step time, memory), both minimised."""
    order = np.lexsort((mem, time_s))
    out, best_mem = [], np.inf
    for i in order:
        if mem[i] < best_mem:
            out.append(int(i))
            best_mem = mem[i]
    return out


def _candidate(rank, pred: Prediction, row: int, names, registry, req: TuneRequest, value) -> Candidate:
    b = pred.batch
    f = lambda a: float(np.asarray(a)[row])  # noqa: E731
    feats = {}
    for name in names:
        rows = b.feature(name)
        if rows.enabled[row]:
            opts = {}
            feat = registry.features[name]
            for fld in attrs.fields(feat.options_type) if attrs.has(feat.options_type) else ():
                x = rows.options[fld.name][row]
                ch = fld.metadata.get("choices")
                opts[fld.name] = ch[int(x)] if ch else (type(fld.default)(x) if fld.default is not None else x)
            feats[name] = opts
    bd = {k: f(v) for k, v in pred.breakdown.items()}
    parallel = {"tp": int(b.tp[row]), "pp": int(b.pp[row]), "vpp": int(b.vpp[row]), "cp": int(b.cp[row]),
                "ep": int(b.ep[row]), "etp": int(b.etp[row]), "dp": int(b.dp[row]),
                "micro_batch_size": int(b.micro_batch_size[row]), "global_batch_size": int(b.global_batch_size[row]),
                "sequence_length": int(b.sequence_length[row]), "sequence_parallel": bool(b.sequence_parallel[row]),
                "precision": PRECISIONS[int(b.precision[row])]}
    compute = bd["compute_fwd"] + bd["compute_bwd_input"] + bd["compute_bwd_weight"] + bd["recompute"]
    return Candidate(
        rank=rank, parallel=parallel, schedule=list(registry.schedules)[int(b.schedule[row])], features=feats,
        step_time_s=f(pred.step_time_s), objective_value=float(value), model_tflops_per_gpu=f(pred.model_tflops_per_gpu),
        mfu=f(pred.mfu), peak_memory_gib=f(pred.peak_memory_bytes) / GIB, compute_s=compute, tp_comm_s=bd["tp_comm"],
        pp_comm_s=bd["pp_comm"], dp_comm_s=bd["dp_comm"], optimizer_s=bd["optimizer"] + bd["optimizer_host"],
        breakdown=bd, memory_breakdown={k: f(v) / GIB for k, v in pred.memory_breakdown.items()},
        total_time_s=float(value) if req.objective == "e2e_time" else None,
    )


def megatron_arguments(model: ModelSpec, cand: Candidate, registry) -> tuple[list[str], list[str]]:
    """Megatron-LM arguments for a candidate, one ``--flag value`` per item, and notes (what
    Megatron-LM mainline cannot express). Features and schedules contribute their own."""
    p = cand.parallel
    tokens = ["--tensor-model-parallel-size", str(p["tp"]), "--pipeline-model-parallel-size", str(p["pp"])]
    if p["vpp"] > 1:
        tokens += ["--num-layers-per-virtual-pipeline-stage", str(model.num_layers // (p["pp"] * p["vpp"]))]
    if p["cp"] > 1:
        tokens += ["--context-parallel-size", str(p["cp"])]
    if model.is_moe:
        tokens += ["--expert-model-parallel-size", str(p["ep"]), "--expert-tensor-parallel-size", str(p["etp"])]
    if p["sequence_parallel"] and p["tp"] > 1:
        tokens.append("--sequence-parallel")
    tokens += ["--micro-batch-size", str(p["micro_batch_size"]), "--global-batch-size", str(p["global_batch_size"]),
               "--seq-length", str(p["sequence_length"])]
    tokens += {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp8": ["--bf16", "--fp8-format", "hybrid"],
               "fp4": ["--bf16", "--fp4-format", "e2m1"]}[p["precision"]]
    tokens += list(registry.schedules[cand.schedule].megatron_args)
    for name, opts in sorted(cand.features.items()):
        feat = registry.features[name]
        if feat.megatron_args is not None:
            opt_obj = feat.options_type(**opts) if attrs.has(feat.options_type) else None
            tokens += list(feat.megatron_args(opt_obj))
    lines: list[str] = []
    notes: list[str] = []
    seen: set[str] = set()
    for tok in tokens:
        if tok.startswith("#"):
            notes.append(tok.lstrip("# ").strip())
        elif tok.startswith("--"):
            flag = tok.split()[0]
            if flag in seen:
                lines.append("")  # swallow the duplicate flag's values too
                continue
            seen.add(flag)
            lines.append(tok)
        elif lines and lines[-1] != "":
            lines[-1] += f" {tok}"
    return [ln for ln in lines if ln], notes
