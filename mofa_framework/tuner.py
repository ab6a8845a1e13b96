"""The tuner (paper §4): an exact branch-and-bound search over parallel strategies and features.

The space is TP × PP × VPP × CP × EP × ETP × micro-batch × schedule × end-stage split (the
*structure*) crossed with every installed feature's options (each feature off, or on with each
value of its options' ``search`` tuples). Structures are pruned first with every plugin's
``mofa_candidate_constraints`` and the paper's rules (§4.1: TP within a scale-up domain,
m ≥ the schedule's minimum, GBS divisibility); a feature whose ``applies`` is false on a
structure is only tried off there (on and off are the same row), and one whose ``never_slower``
is true there is only tried on (unless a feature it conflicts with is on): its off leaves cannot
be the only optimum (:func:`_never_off`; counted under :data:`NEVER_SLOWER`).

The rest is a best-first branch and bound over levels of partial decisions, each with a lower
bound of the objective of every configuration below it:

0. a structure: the compute its critical stage runs per step (features off, except those
   that may reduce compute, tried in every combination);
1. + the layer-phase features that may make layers faster (overlaps, faster dispatch,
   kernels), the others off: the critical stage's busy time ``m·(F+B+W)`` after the layer
   phase. Features flagged ``adds_time_only`` (recompute, offloading, FSDP, MemFine) can only
   add to it, so it bounds every setting of theirs;
2. … 1 + n: + those features, in the order the layer phase applies them, one more per level
   (consecutive ones that exclude each other share one; :func:`_levels`): the busy time with the
   undecided ones off, which bounds every setting of theirs; at the last of these levels, the
   exact busy time;
2 + n. + the pipeline-phase features: the pipeline time (busy, bubble, exposed p2p) — the
   *pipeline level*;
leaves: every feature set: the optimizer and memory phases finish each one from its
   pipeline-level node's pipeline (:func:`engine.finish`), and memory is checked. Before that, a
   pipeline-level node's memory with the leaf features off, then each setting of those that lower
   memory (:func:`memory_alternatives`), floors its leaves: a node over in every setting is never
   pushed, a leaf whose own setting is over is never evaluated.

The step time is the pipeline time plus exposed DP communication, the optimizer and a fixed
overhead, all ≥ 0 (the optimizer and memory phases cannot change the pipeline); a schedule's
busy time is ``m·v·(F+B+W)`` per chunk. Levels 2 … 1 + n only run the engine's layer phase and read
the busy time off the engine's stage sums (:func:`engine.busy_terms`). The pending node with
the smallest bound is expanded first (in vectorised chunks, across every group of structures),
so the search stops as soon as no pending bound can beat the k-th best configuration found:
the answer equals brute force. Until something fits, a memory-bound search (and one out of time)
dives instead — the deepest level first — which finds a first fit sooner and keeps few nodes
pending; the order never changes the answer. End-to-end objectives grow with the step time and are bounded
through it. docs/tuning.md states the contracts the bounds rely on and the tests that check them.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import numpy as np

from . import engine
from .batch import (ATTENTION_KERNELS, PRECISIONS, CandidateBatch, FeatureRows, GatheredOptions, distinct_rows,
                    taken)
from .config import SearchSection, jobs_to_batch, structure
from .engine import Prediction
from .errors import ConfigError
from .invariants import feature_rules, schedule_rules
from .limits import short
from .types import EnvRequirement, HardwareProfile, MegatronContext, ModelSpec, Phase, positional_count
from .units import GIB

OBJECTIVES = ("step_time", "e2e_time", "gpu_hours")
#: a bound prunes only when above the k-th best by more than float rounding of the stage sums
_REL_EPS = 1e-9
#: batches at least this large are split by the exclusive features they turn on
_GROUP_ROWS = 4096
#: candidates per engine call, best-first: small enough that the incumbent the first chunks find
#: prunes the later ones (65,536 or 131,072 evaluate 1.1–3.0× the candidates in 0.9–1.6× the CPU time)
CHUNK_ROWS = 32_768
#: candidates per engine call for a Pareto front, where every leaf is evaluated and nothing prunes:
#: fewer, larger calls (+20 % candidates per CPU-second on the exhaustive sub-spaces of
#: ``benchmarks/tune_benchmark.py``; peak 211 MiB on DeepSeek-V3's, against 638 MiB at 524,288)
PARETO_CHUNK_ROWS = 131_072
#: a best-first search whose leaves mostly do not fit in memory (fewer than this share of those
#: reached, once a chunk's worth has been) pops :data:`MEMORY_BOUND_GROWTH` times as many candidates
#: at a time: its fast nodes must all be priced to learn that they do not fit, so the incumbent that
#: small chunks keep for pruning comes late either way, and larger engine calls price them for less
#: (above the pipeline level only, where the floors cannot drop nodes yet; 2, not 4: the same CPU
#: time within noise on the memory-bound searches, DeepSeek-V3's peak 598 → 457 MiB, DeepSeek-V4-Pro's
#: 1,114 → 991 MiB at +12 % CPU)
MEMORY_BOUND_SHARE = 0.05
MEMORY_BOUND_GROWTH = 2


def _pow2_upto(n: int) -> tuple[int, ...]:
    return tuple(2**i for i in range(int(math.log2(max(n, 1))) + 1))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@attrs.frozen(kw_only=True)
class SearchSpace:
    """Values to try per dimension; `features` maps a feature name to the option dicts to try
    (``None`` in the tuple = the feature off).

    ``lighter_ends``: how many layers fewer the first and the last pipeline stage hold than each
    middle stage. 0 is Megatron's default split (balanced; when pp does not divide the layers the
    end stages take the remainder off); d ≥ 1 places ``(L + 2d)/pp − d`` layers on each end stage
    and ``(L + 2d)/pp`` on the others, where that divides (d = 1 is Megatron-Core's
    ``--account-for-embedding/loss-in-pipeline-split``: the embedding and the loss count as a
    layer each, as Llama 3 405B ran on 16 stages: 7 + 14 × 8 + 7). Explicit end stages may split
    into virtual chunks unevenly, so they combine with interleaving where the default split cannot.

    ``lighter_last``: how many layers fewer the last stage holds than the first, on top of
    ``lighter_ends``. The last stage also runs the output layer and the loss, and a model's
    multi-token-prediction modules (each a layer with its own output layer), so it is the critical
    stage of a split that ignores them: e ≥ 1 places ``mid = (L + 2d + e)/pp`` layers on each
    middle stage, ``mid − d`` on the first and ``mid − d − e`` on the last (Megatron-Bridge runs
    DeepSeek-V3's 61 layers and MTP module on 16 stages as 4 + 14 × 4 + 1, d = 0, e = 3). At pp 2
    (no middle stage) only d = 0 is meaningful: ``(L + e)/2`` layers first, ``(L − e)/2`` last.
    d = e = 0 is the default split.
    """

    tp: tuple[int, ...]
    pp: tuple[int, ...]
    vpp: tuple[int, ...]
    cp: tuple[int, ...]
    ep: tuple[int, ...]
    etp: tuple[int, ...]
    micro_batch_size: tuple[int, ...]
    schedules: tuple[str, ...]
    features: Mapping[str, tuple[Mapping[str, Any] | None, ...]] = attrs.field(factory=dict)
    lighter_ends: tuple[int, ...] = (0,)
    lighter_last: tuple[int, ...] = (0,)

    @property
    def structures(self) -> int:
        return math.prod(len(x) for x in (self.tp, self.pp, self.vpp, self.cp, self.ep, self.etp,
                                          self.micro_batch_size, self.schedules, self.lighter_ends,
                                          self.lighter_last))

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
    """The paper's space: powers of two within sensible bounds, every schedule, end stages balanced
    or one layer lighter (where that divides), the last stage up to :func:`last_stage_relief` layers
    lighter than the first, and the `features` named (default: every *tunable* feature, what
    ``mofa tune`` searches; numerics such as fp8, software-stack settings and LoRA are searched
    only when named)."""
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
    names = [n for n, f in registry.features.items() if f.tunable] if features is None else list(features)
    return SearchSpace(tp=tp, pp=pp, vpp=vpp, cp=cp or (1,), ep=ep, etp=etp, micro_batch_size=(1, 2, 4),
                       schedules=tuple(n for n, s in registry.schedules.items() if s.searched), lighter_ends=(0, 1),
                       lighter_last=tuple(range(last_stage_relief(model) + 1)),
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
    #: e2e objectives: ``(step_time_s array, batch) -> E2EResult`` (or the total seconds array)
    e2e: Callable | None = None
    #: candidates per engine call (bounds peak memory); None: :data:`CHUNK_ROWS` with bounds,
    #: :data:`PARETO_CHUNK_ROWS` for a Pareto front
    chunk_rows: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(1)))
    pareto: bool = False
    flash_attention: bool = True
    #: the fused-attention kernel (a job property, not searched)
    attention_kernel: str = attrs.field(default="auto", validator=attrs.validators.in_(ATTENTION_KERNELS))
    #: packed sequences' mean document length (a job property, not searched; 0 = unpacked)
    document_length: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    #: stop after this many seconds (wall clock) with the best found so far, not proven optimal (if
    #: nothing that fits was found by then, the search dives to the first configuration that does, for
    #: at most :func:`dive_deadline` seconds in all)
    time_budget_s: float | None = attrs.field(default=None, validator=attrs.validators.optional(
        attrs.validators.gt(0.0)))
    #: GiB of HBM per GPU a configuration must leave free: it fits when its peak ≤ HBM − headroom
    memory_headroom_gib: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))


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
    #: e2e objectives: the checkpoint interval used (steps) and the effective training time ratio
    checkpoint_interval_steps: float | None = None
    ettr: float | None = None
    #: the feature sets of configurations identical to this one in every number (same layout,
    #: step time and memory): the features they differ in change nothing here
    variants: tuple[Mapping[str, Mapping[str, Any]], ...] = ()
    #: each variant's pipeline schedule (aligned with ``variants``): a schedule that changes nothing
    #: (any of 1F1B, ZB-H1, ZB-H2 without a pipeline) is a variant too
    variant_schedules: tuple[str, ...] = ()
    #: the step time's band and extrapolation flags (:func:`mofa_framework.uncertainty.band_candidates`)
    step_time_s_low: float = float("nan")
    step_time_s_high: float = float("nan")
    extrapolation: tuple[str, ...] = ()
    #: this step time and rank 1's lie inside each other's band: the two are not told apart
    within_band_of_best: bool = False

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
    #: feasible candidates never evaluated because a lower bound showed they could not beat the
    #: k-th best found (exact branch and bound)
    skipped_by_bound: int = 0
    #: False when the time budget ran out first: `best` is the best found, `unexplored` were not looked at
    proven_optimal: bool = True
    unexplored: int = 0
    #: candidates whose time the bounds priced without a full evaluation (levels 1 and 2)
    bounded_rows: int = 0
    #: the request's ``memory_headroom_gib``: every configuration kept leaves this much HBM free
    memory_headroom_gib: float = 0.0
    #: candidates ruled out, without being evaluated, by their pipeline-level node's memory floor
    #: (counted in ``removed_by`` as over the HBM or the host memory too)
    floored: int = 0

    @property
    def candidates_per_s(self) -> float:
        return self.evaluated / self.elapsed_s if self.elapsed_s > 0 else float("inf")

    def why_empty(self) -> str:
        """One line: which rules emptied the space (rows counted under the first rule they fail)."""
        over = self.removed_by.get(OVER_HBM, 0) + self.removed_by.get(OVER_HOST, 0)
        if not self.proven_optimal and not self.evaluated and not over:
            return (f"the time budget ran out after {self.elapsed_s:.1f} s before any candidate was evaluated: "
                    "give a larger --time-budget")
        if not self.proven_optimal:
            # the memory floors rule candidates out without evaluating them
            floored = f", {over:,} over memory (evaluated, or ruled out by their memory floor)" if over else ""
            return (f"the time budget ran out after {self.elapsed_s:.1f} s (the dive for a configuration that fits "
                    f"included) with none found: {self.evaluated:,} evaluated{floored}, {self.unexplored:,} "
                    "candidates not explored: not proven that none fits; give a larger --time-budget, or none")
        if not self.removed_by:
            return "the search space is empty"
        ranked = sorted(self.removed_by.items(), key=lambda kv: -kv[1])
        rules = "; then ".join(f"{rule} ({n:,})" for rule, n in ranked[:3])
        if over and not self.feasible:  # what to change comes first (a long line is cut at the end)
            # those the memory floor ruled out were not evaluated: their peak is known from below
            at_least = "" if self.evaluated else "at least "
            room = (f" less the {self.memory_headroom_gib:g} GiB headroom" if self.memory_headroom_gib else "")
            fix = "add GPUs, enable memory features" + (", or lower the headroom" if room else "")
            return (f"no feasible configuration among {self.space_size:,} candidates: all {over:,} that passed "
                    f"every rule need more memory than the GPU has{room} (smallest peak {at_least}"
                    f"{self.min_peak_memory_gib:.1f} GiB): {fix}; the rules removed the others, most by {rules}")
        return f"no feasible configuration among {self.space_size:,} candidates: most were removed by {rules}"


@attrs.frozen(kw_only=True)
class TuneProgress:
    """Where a search stands: candidates evaluated, ruled out by a bound, and left."""

    evaluated: int
    skipped: int
    total: int
    best: float | None
    elapsed_s: float
    #: leaves reached (evaluated, or shown by their node's memory floor not to fit) and those that fit
    reached: int = 0
    feasible: int = 0
    #: a chunk's worth of leaves reached and fewer than :data:`MEMORY_BOUND_SHARE` of them fit: the fast
    #: layouts do not fit and the search prices them all to show it, so the best found so far is often
    #: the answer long before it is proven (``--time-budget`` returns it)
    memory_tight: bool = False

    @property
    def fraction(self) -> float:
        """Of the candidates, those settled: reached (evaluated, or ruled out by their node's memory
        floor) or ruled out by a bound."""
        done = max(self.reached, self.evaluated) + self.skipped
        return min(1.0, done / self.total) if self.total else 1.0

    @property
    def eta_s(self) -> float | None:
        f = self.fraction
        return self.elapsed_s * (1.0 - f) / f if f > 0 else None


# ---------------------------------------------------------------------- enumeration


def last_stage_relief(model: ModelSpec) -> int:
    """How many layers lighter than the first the default space lets the last stage be: one for
    the output layer and loss, two for each multi-token-prediction module (its layer and its own
    output layer) — DeepSeek-V3 (one module): 3, as Megatron-Bridge places it."""
    return 1 + 2 * model.num_mtp_layers


def end_stage_layers(num_layers: int, pp, lighter, lighter_last=0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(layers on the first stage, on the last, valid) of ``lighter_ends`` = d and ``lighter_last``
    = e: 0, 0 for the default split (the engine's balanced placement); else ``mid − d`` and
    ``mid − d − e`` with ``mid = (L + 2d + e)/pp`` layers on each middle stage, where pp divides
    ``L + 2d + e`` and the last stage keeps a layer; d ≥ 1 needs a middle stage (pp ≥ 3), e ≥ 1
    two stages."""
    pp, d, e = np.asarray(pp), np.asarray(lighter), np.asarray(lighter_last)
    n = num_layers + 2 * d + e
    mid = n // np.maximum(pp, 1)
    explicit = (d > 0) | (e > 0)
    ok = ~explicit | ((pp >= np.where(d > 0, 3, 2)) & (n % np.maximum(pp, 1) == 0) & (mid - d - e >= 1))
    return np.where(explicit, mid - d, 0), np.where(explicit, mid - d - e, 0), ok


def default_end_layers(num_layers: int, pp):
    """(first, last) stage layers of the default split, as ``engine.stage_layout`` places them:
    ⌈L/p⌉ per stage, the end stages taking the remainder off (126 on 16: 7 + 14 × 8 + 7)."""
    p = np.maximum(np.asarray(pp), 1)
    base = -(-num_layers // p)
    deficit = base * p - num_layers
    return base - (deficit + 1) // 2, base - deficit // 2


def _default_split_covers(num_layers: int, pp, vpp, first, last) -> np.ndarray:
    """Rows whose explicit end stages are what the default split places anyway, and interleave
    as well: the same configuration as lighter_ends = lighter_last = 0."""
    d_first, d_last = default_end_layers(num_layers, pp)
    return (d_first == first) & (d_last == last) & (first % vpp == 0) & (last % vpp == 0)


def _structure_batch(req: TuneRequest, registry) -> tuple[CandidateBatch, dict[str, int]]:
    """Every structure of the space that divides the GPUs and the layers, and how many structures
    each of those rules removed. The pipeline dimensions are filtered before they are crossed
    with the rest (a DeepSeek-V3 space has millions of nominal structures)."""
    s = req.space
    L = req.model.num_layers
    pipe = [g.ravel() for g in np.meshgrid(np.array(s.tp), np.array(s.pp), np.array(s.cp), np.array(s.vpp),
                                           np.array(s.lighter_ends), np.array(s.lighter_last), indexing="ij")]
    tp, pp, cp, vpp, lighter, lighter_last = pipe
    first, last, split_ok = end_stage_layers(L, pp, lighter, lighter_last)
    rest = len(s.ep) * len(s.etp) * len(s.micro_batch_size) * len(s.schedules)
    removed = {}
    keep = req.num_gpus % (tp * pp * cp) == 0
    removed["hardware.num_gpus must be a multiple of tp × pp × cp"] = int((~keep).sum()) * rest
    bad = keep & ~split_ok
    removed["lighter end stages need pp dividing the layers + 2 × (layers fewer per end stage) + (fewer on "
            "the last), pp ≥ 3 for both ends lighter"] = int(bad.sum()) * rest
    keep &= split_ok
    dup = keep & ((lighter > 0) | (lighter_last > 0)) & _default_split_covers(L, pp, vpp, first, last)
    removed["the default split already places the end stages so"] = int(dup.sum()) * rest
    keep &= ~dup
    head = np.flatnonzero(keep)
    other = [g.ravel() for g in np.meshgrid(np.array(s.ep), np.array(s.etp), np.array(s.micro_batch_size),
                                            np.array([registry.schedule_code(x) for x in s.schedules]), indexing="ij")]
    h_idx = np.repeat(head, len(other[0]))
    o_idx = np.tile(np.arange(len(other[0])), len(head))
    tp, pp, cp, vpp, first, last = (a[h_idx] for a in (tp, pp, cp, vpp, first, last))
    ep, etp, mbs, sched = (a[o_idx] for a in other)
    ok = etp <= tp
    removed["expert tensor parallelism cannot exceed tensor parallelism (etp ≤ tp)"] = int((~ok).sum())
    tp, pp, vpp, cp, ep, etp, mbs, sched, first, last = (a[ok] for a in (tp, pp, vpp, cp, ep, etp, mbs, sched,
                                                                        first, last))
    n = len(tp)
    batch = CandidateBatch(
        tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, dp=req.num_gpus // (tp * pp * cp), micro_batch_size=mbs,
        global_batch_size=np.full(n, req.global_batch_size), sequence_length=np.full(n, req.sequence_length),
        sequence_parallel=tp > 1, precision=np.full(n, PRECISIONS.index(req.precision)), schedule=sched,
        first_stage_layers=first, last_stage_layers=last, flash_attention=np.full(n, req.flash_attention),
        attention_kernel=np.full(n, ATTENTION_KERNELS.index(req.attention_kernel)),
        document_length=np.full(n, req.document_length))
    return batch, removed


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


def _combos(req: TuneRequest, registry, names: list[str]) -> np.ndarray:
    """Conflict-free combinations of the given features' choices: an int array (combinations ×
    features) of indices into ``req.space.features[name]`` (whose ``None`` = off), in
    lexicographic order."""
    choices = [req.space.features[n] for n in names]
    on = [np.array([o is not None for o in c]) for c in choices]
    pos = {n: j for j, n in enumerate(names)}
    clash = {(min(j, pos[o]), max(j, pos[o])) for j, n in enumerate(names)
             for o in registry.features[n].conflicts if o in pos and pos[o] != j}
    # one feature at a time, rows dropped as soon as a conflict shows: never the whole product
    # (22 features: 170 M combinations, 3.2 M of them conflict-free)
    small = np.int8 if max((len(c) for c in choices), default=0) < 128 else np.int64
    grid = np.zeros((1, 0), small)
    for j, c in enumerate(choices):
        grid = np.column_stack([np.repeat(grid, len(c), axis=0), np.tile(np.arange(len(c), dtype=small), len(grid))])
        bad = np.zeros(len(grid), bool)
        for i in (i for i, k in clash if k == j):
            bad |= on[j][grid[:, j]] & on[i][grid[:, i]]
        grid = grid[~bad]
    return grid.astype(np.int64)


def _count_combos(req: TuneRequest, registry, names: list[str]) -> int:
    """``len(_combos(...))`` without enumerating the features that conflict with none of the others."""
    tied = [n for n in names if any(c in names for c in registry.features[n].conflicts)
            or any(n in registry.features[o].conflicts for o in names)]
    free = math.prod(len(req.space.features[n]) for n in names if n not in tied)
    return free * len(_combos(req, registry, tied))


def _choice_table(registry, name: str, choices) -> tuple[np.ndarray, dict, dict]:
    """One feature's choices as arrays: on/off and each option's value (categorical: its index)."""
    feat = registry.features[name]
    fields = attrs.fields(feat.options_type) if attrs.has(feat.options_type) else ()
    enabled = np.array([c is not None for c in choices], bool)
    opts = {}
    for f in fields:
        cat = f.metadata.get("choices")
        vals = [(c or {}).get(f.name, f.default) for c in choices]
        opts[f.name] = np.array([float(cat.index(v)) if cat else float(v) for v in vals])
    return enabled, opts, {f.name: f.metadata["choices"] for f in fields if f.metadata.get("choices")}


def _feature_tables(req: TuneRequest, registry, names, grid: np.ndarray) -> dict[str, tuple[np.ndarray, dict, dict]]:
    """Per feature: on/off and option values of every combination (rows of `grid`, choice
    indices per name)."""
    tables = {}
    for j, name in enumerate(names):
        enabled, opts, cats = _choice_table(registry, name, req.space.features[name])
        col = grid[:, j]
        tables[name] = (enabled[col], {k: v[col] for k, v in opts.items()}, cats)
    return tables


def _feature_rows(tables, combo_idx: np.ndarray) -> dict[str, FeatureRows]:
    """FeatureRows of a chunk: each row is combination ``combo_idx[row]`` of its group."""
    return {name: FeatureRows(enabled=enabled[combo_idx], options={k: v[combo_idx] for k, v in opts.items()},
                              choices=choices)
            for name, (enabled, opts, choices) in tables.items()}


def _csr(parent: np.ndarray, n_parents: int) -> tuple[np.ndarray, np.ndarray]:
    """Children of each parent: (offsets, child ids sorted by parent)."""
    order = np.argsort(parent, kind="stable")
    offsets = np.zeros(n_parents + 1, np.int64)
    np.cumsum(np.bincount(parent, minlength=n_parents), out=offsets[1:])
    return offsets, order


#: level 1, below the structures: (bound, which features a node of the level has set) — the layer
#: features that may speed layers up
SETTLED = ("settled", lambda f: f.layer is not None and not f.adds_time_only)
#: the last level above the leaves: every layer- and pipeline-phase feature set
PIPELINE = ("pipeline", lambda f: f.layer is not None or f.pipeline is not None)


def _lattice_order(registry, names: list[str]) -> list[str]:
    """The searched features flagged ``adds_time_only`` in the order the engine applies them in
    the layer phase: each sees the layer costs the ones before it made, so turning it on, with
    those before it set anyhow and those after it off, only adds its own time (≥ 0)."""
    order = [f.name for f in registry.features_in_phase(Phase.layer)]
    return [n for n in order if n in names and registry.features[n].adds_time_only]


def _levels(registry, names: list[str]) -> tuple[tuple[str, Callable], ...]:
    """The search's levels below the structures, each (bound, which features a node of it has set):
    :data:`SETTLED`; then the busy levels, a lattice over the searched features flagged
    ``adds_time_only`` (recompute, offloading, FSDP, ZeRO, MemFine), one more decided per level
    (:func:`_lattice_steps`) in :func:`_lattice_order`, the busy time with the undecided ones off
    bounding every setting of theirs — a setting of one that cannot win prunes every combination
    of the later ones below it (not in any order: activation offloading costs less once MemFine or
    recompute has shrunk what it moves); the last sets every layer feature (the only one when
    there are no such features); then :data:`PIPELINE`."""
    steps = _lattice_steps(registry, _lattice_order(registry, names))
    decided = [frozenset().union(*steps[:k]) for k in range(1, len(steps) + 1)] or [frozenset()]
    busy = tuple(("busy", lambda f, d=d: f.layer is not None and (not f.adds_time_only or f.name in d))
                 for d in decided)
    return (SETTLED, *busy, PIPELINE)


def _lattice_steps(registry, adders: list[str]) -> list[frozenset[str]]:
    """`adders` (in order) cut into the features each level decides: consecutive features that
    exclude one another (ZeRO, FSDP, weight offloading) share a level, where their settings add up
    instead of multiplying; any other feature starts a level of its own."""
    def excludes(a: str, b: str) -> bool:
        return b in registry.features[a].conflicts or a in registry.features[b].conflicts

    steps: list[set[str]] = []
    for n in adders:
        if steps and all(excludes(n, m) for m in steps[-1]):
            steps[-1].add(n)
        else:
            steps.append({n})
    return [frozenset(s) for s in steps]


def _columns(table: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Columns `idx` of a (fields, rows) table, read-only: its rows are contiguous arrays the
    frozen converters keep as they are."""
    out = table.take(idx, axis=1)
    out.setflags(write=False)
    return out


class _Choices:
    """Every searched feature's choices as arrays, so that rows from any group of structures can
    share one batch: a row's features are a vector of choice indices (−1 = not set, off)."""

    def __init__(self, req: TuneRequest, registry, names: list[str]):
        self.names = names
        self.tables = []
        for n in names:
            enabled, opts, cats = _choice_table(registry, n, req.space.features[n])
            feat = registry.features[n]
            fields = attrs.fields(feat.options_type) if attrs.has(feat.options_type) else ()
            default = {f.name: float(f.metadata["choices"].index(f.default)) if f.metadata.get("choices")
                       else float(f.default) for f in fields}
            # one more slot, last, for "not set": index −1 reads it
            self.tables.append((np.r_[enabled, False], {k: np.r_[v, default[k]] for k, v in opts.items()}, cats))
        # the options of each feature as one (options, choices + 1) table, read at the rows' choices
        # when a phase first asks for an option (GatheredOptions)
        self.stacked = [({k: i for i, k in enumerate(opts)}, np.stack(list(opts.values())) if opts else None)
                        for _, opts, _ in self.tables]

    def rows(self, choice: np.ndarray) -> dict[str, FeatureRows]:
        """FeatureRows of rows whose choice vectors are `choice` (rows × features)."""
        out = {}
        # one contiguous copy of the columns of the features some row sets, feature by feature: the
        # options are read later, from these indices, whatever becomes of `choice`
        on = np.flatnonzero((choice >= 0).any(axis=0))
        cols = np.ascontiguousarray(choice[:, on].T)
        cols.setflags(write=False)
        for col, j in zip(cols, on.tolist()):
            name = self.names[j]
            enabled, _, cats = self.tables[j]
            index, table = self.stacked[j]
            opts = GatheredOptions(index, table, col) if table is not None else {}
            out[name] = FeatureRows(enabled=taken(enabled, col), options=opts, choices=cats)
        return out


@attrs.define
class _Group:
    """Structures on which the same features apply, and their feature combinations: the leaves
    (every feature set) and, per level of :func:`_levels`, the distinct settings of the level's
    features, each with its parent in the level above (level 0's parent is the structure).
    Settings are choice vectors over every searched feature (−1 = not set)."""

    leaf_choice: np.ndarray
    level_choice: list[np.ndarray]
    #: CSR children of each node of a level (level 0: its nodes; last: the leaves)
    children: list[tuple[np.ndarray, np.ndarray]]
    #: the level sets no feature its parent level did not: same layer costs, copy its bound
    same_as_parent: list[bool]
    leaves_below: list[np.ndarray]
    n_on: np.ndarray  #: features on per leaf (ties go to fewer)
    #: the node of the level above of each node of the last level (its layer-feature setting)
    layer_parent: np.ndarray
    #: leaves not searched because a feature never slower here was off in them (:func:`_never_off`)
    dominated: int = 0

    @classmethod
    def build(cls, req: TuneRequest, registry, all_names: list[str], names: list[str],
              levels: tuple, always_on: list[str] = ()) -> _Group:
        feats = registry.features
        grid = _combos(req, registry, names)
        keep = _never_off(req, registry, names, grid, always_on)
        dominated, grid = int((~keep).sum()), grid[keep]
        cols = np.array([all_names.index(n) for n in names], np.int64)

        def spread(sub: np.ndarray, pos) -> np.ndarray:
            out = np.full((len(sub), len(all_names)), -1, np.int64)
            out[:, cols[pos]] = sub
            return out

        radix = np.array([len(req.space.features[n]) for n in names], np.int64)
        ids, choice, positions = [], [], []
        for _, wanted in levels:
            pos = [j for j, n in enumerate(names) if wanted(feats[n])]
            # the level's setting of each leaf as one mixed-radix number (rows sorted like np.unique)
            code = np.zeros(len(grid), np.int64)
            for j in pos:
                code = code * radix[j] + grid[:, j]
            _, first, of = np.unique(code, return_index=True, return_inverse=True)
            ids.append(np.asarray(of, np.int64).reshape(-1))
            choice.append(spread(grid[first][:, pos], pos))
            positions.append(pos)
        children = []
        for k in range(1, len(levels)):
            parent = np.zeros(len(choice[k]), np.int64)
            parent[ids[k]] = ids[k - 1]
            children.append(_csr(parent, len(choice[k - 1])))
        layer_parent = parent
        children.append(_csr(ids[-1], len(choice[-1])))
        same = [False] + [positions[k] == positions[k - 1] and levels[k][0] == levels[k - 1][0]
                          for k in range(1, len(levels))]
        n_on = np.zeros(len(grid), np.int64)
        for j, n in enumerate(names):
            n_on += np.array([o is not None for o in req.space.features[n]])[grid[:, j]]
        return cls(leaf_choice=spread(grid, list(range(len(names)))), level_choice=choice, children=children,
                   same_as_parent=same, leaves_below=[np.bincount(i, minlength=len(c)) for i, c in zip(ids, choice)],
                   n_on=n_on, layer_parent=layer_parent, dominated=dominated)


def _never_off(req: TuneRequest, registry, names: list[str], grid: np.ndarray, always_on) -> np.ndarray:
    """Leaves (rows of `grid`, choices of `names`) to search: not those with a feature of `always_on`
    (``Feature.never_slower`` on these structures) off while none it conflicts with is on — turning
    it on there gives a leaf no slower, with the same memory; beside a conflicting feature it stays
    off. A feature the space searches only off (or only on) is left as it is."""
    keep = np.ones(len(grid), bool)
    for n in always_on:
        if n not in names:
            continue
        j = names.index(n)
        on = np.array([o is not None for o in req.space.features[n]])
        if on.all() or not on.any():
            continue
        rivals = [names.index(o) for o in names if o != n and (
            o in registry.features[n].conflicts or n in registry.features[o].conflicts)]
        busy = np.zeros(len(grid), bool)
        for i in rivals:
            busy |= np.array([o is not None for o in req.space.features[names[i]]])[grid[:, i]]
        keep &= on[grid[:, j]] | busy
    return keep


class _Nodes:
    """Every group's settings numbered as one, level by level: node i of group g at level d is
    ``base[d][g] + i`` (level ``len(levels)``: the leaves), so the children of nodes from any
    groups come from one table instead of a loop over the groups."""

    def __init__(self, groups: list[_Group], n_levels: int):
        D = n_levels
        sizes = [np.array([len(g.level_choice[d]) for g in groups], np.int64) for d in range(D)]
        sizes.append(np.array([len(g.leaf_choice) for g in groups], np.int64))
        self.level0 = sizes[0]
        self.base = [np.cumsum(n) - n for n in sizes]
        # choice vectors in the smallest integer type that holds them: a search gathers them by the million
        choice = [[g.level_choice[d] for g in groups] for d in range(D)] + [[g.leaf_choice for g in groups]]
        top = max(int(c.max(initial=0)) for level in choice for c in level)
        small = np.int8 if top < 127 else np.int16 if top < 32767 else np.int64
        self.choice = [np.concatenate(level).astype(small) for level in choice]
        #: CSR per level d < D: the children (level d + 1) of each node, global ids
        self.csr = [self._joined([g.children[d] for g in groups], self.base[d + 1]) for d in range(D)]
        self.fanout = [np.diff(offsets) for offsets, _ in self.csr]
        self.leaves_below = [np.concatenate([g.leaves_below[d] for g in groups]) for d in range(D)]
        self.same = np.array([[g.same_as_parent[d] for g in groups] for d in range(D)], bool).reshape(D, len(groups))
        self.n_on = np.concatenate([g.n_on for g in groups])
        self.layer_parent = np.concatenate([g.layer_parent for g in groups])
        self.layer_width = max(len(g.level_choice[-2]) for g in groups)

    @staticmethod
    def _joined(csrs, child_base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        starts = np.cumsum([0] + [int(o[-1]) for o, _ in csrs])
        offsets = np.concatenate([o[:-1] + start for (o, _), start in zip(csrs, starts)] + [starts[-1:]])
        return offsets.astype(np.int64), np.concatenate([i + b for (_, i), b in zip(csrs, child_base)]).astype(np.int64)

    def children(self, depth: int, grp: np.ndarray, sub: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(parent position, child's global id) of every child of the nodes (`grp`, `sub`) of level
        ``depth − 1`` (depth 0: structures, whose children are every level-0 setting of their
        group), each parent's children in order."""
        if depth == 0:
            first, counts = self.base[0][grp], self.level0[grp]
        else:
            offsets, ids = self.csr[depth - 1]
            pid = self.base[depth - 1][grp] + sub
            first, counts = offsets[pid], offsets[pid + 1] - offsets[pid]
        rep = np.repeat(np.arange(len(grp)), counts)
        at = first[rep] + np.arange(len(rep)) - np.repeat(np.cumsum(counts) - counts, counts)
        return rep, (at if depth == 0 else self.csr[depth - 1][1][at])


def _present(a: np.ndarray) -> np.ndarray:
    """The distinct values of an array of small non-negative integers (group ids, labels), sorted:
    ``np.unique(a)`` by counting instead of sorting."""
    return np.flatnonzero(np.bincount(a)) if len(a) else np.zeros(0, np.int64)


def _runs(s_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first row, inverse) of a structure index array sorted into runs: the engine's
    ``structure`` argument (price once per structure)."""
    change = np.r_[True, s_idx[1:] != s_idx[:-1]]
    return np.flatnonzero(change), np.cumsum(change) - 1


# ---------------------------------------------------------------------- objective


def _e2e(req: TuneRequest, step, batch):
    if req.e2e is None:
        raise ConfigError(f"objective {req.objective!r} needs training.tokens (the tokens to train on)")
    return req.e2e(np.asarray(step, dtype=np.float64), batch)


def _objective(req: TuneRequest, step, batch) -> np.ndarray:
    """The objective of step times `step` on `batch` (minimised)."""
    if req.objective == "step_time":
        return np.asarray(step, dtype=np.float64)
    out = _e2e(req, step, batch)
    total = np.asarray(getattr(out, "total_time_s", out), dtype=np.float64)
    return total if req.objective == "e2e_time" else total * req.num_gpus / 3600.0


#: why configurations that pass every rule are dropped: they do not fit
OVER_HBM = "peak memory exceeds the GPU's HBM"
#: the removed-by reason of leaves with a feature off where it is never slower on (Feature.never_slower)
NEVER_SLOWER = "off where a feature is never slower on (Feature.never_slower)"
OVER_HOST = "offloaded host memory exceeds the node's CPU memory per GPU"


class _TopK:
    """The k best configurations seen so far; configurations identical in every number (same
    layout — the structure but for its schedule —, step time and memory) are one entry listing its
    variants. Members are kept as
    opaque references (the search turns them into candidates at the end)."""

    def __init__(self, k: int):
        self.k = k
        self.entries: dict[tuple, list] = {}  # same-key → [value, members: [(tie key, ref)]]
        self._order: list[tuple[float, tuple, tuple]] = []

    def threshold(self) -> float:
        return self._order[-1][0] if len(self._order) >= self.k else np.inf

    def best_value(self) -> float | None:
        return self._order[0][0] if self._order else None

    def offer(self, value: float, same: tuple, tie: tuple, ref) -> None:
        entry = self.entries.get(same)
        if entry is not None:
            entry[1].append((tie, ref))
            return
        if len(self._order) >= self.k and (value, tie) >= self._order[-1][:2]:
            return
        self.entries[same] = [value, [(tie, ref)]]
        self._order.append((value, tie, same))
        self._order.sort(key=lambda x: (x[0], x[1]))
        for _, _, gone in self._order[self.k:]:
            del self.entries[gone]
        del self._order[self.k:]

    def ranked(self) -> list[tuple[float, list]]:
        """(value, member refs simplest first) of each entry, best first."""
        return [(value, [m[1] for m in sorted(self.entries[same][1], key=lambda m: m[0])])
                for value, _, same in self._order]


# ---------------------------------------------------------------------- search


class _Level:
    """Pending nodes of one level: group, structure, setting id, bound, leaves below, children.

    Each pushed batch is kept as one *part*, sorted by bound once (stably: equal bounds keep their
    order), with a cursor past the nodes already popped and running sums of the leaves and
    children below. A pop reads the heads of the parts instead of the whole level, so its cost
    does not grow with the pending nodes (DeepSeek-V3 on 256 A100s keeps millions pending)."""

    FIELDS = ("grp", "s", "sub", "bound", "count", "fanout")
    #: a part is copied without its popped head or dead tail once those are at least half of it and
    #: at least this many nodes: its memory follows the nodes still pending, at amortised O(1) a node
    COMPACT_MIN = 4096

    def __init__(self, **arrays):
        #: per part: [arrays sorted by bound (FIELDS order), cumulative count, cumulative fanout, cursor]
        self.parts: list[list] = []
        #: leaves below nodes dropped because their bound could no longer win (:meth:`prune`)
        self.dropped = 0
        if arrays:
            self.push(*(arrays[f] for f in self.FIELDS))

    def push(self, *arrays, limit: float = np.inf) -> None:
        """Add nodes; those whose bound is above `limit` (the k-th best: they can never be popped)
        are not kept, their leaves counted as dropped."""
        if not len(arrays[0]):
            return
        order = np.argsort(arrays[3], kind="stable")
        cut = int(np.searchsorted(np.asarray(arrays[3])[order], limit, side="right"))
        if cut < len(order):
            self.dropped += int(np.asarray(arrays[4])[order[cut:]].sum())
            order = order[:cut]
        if not len(order):
            return
        self.parts.append(self._part(tuple(np.asarray(a)[order] for a in arrays)))

    def prune(self, limit: float) -> None:
        """Drop the nodes whose bound is above `limit` (the k-th best, which only falls) and the
        popped heads, where that is at least half of a part (see :data:`COMPACT_MIN`)."""
        kept = []
        for part in self.parts:
            cols, ccount, cfan, cur = part
            n = len(cols[0])
            cut = max(cur, int(np.searchsorted(cols[3], limit, side="right")))
            if cut == cur:
                self.dropped += int(ccount[-1]) - self._before(ccount, cur)
                continue
            if (n - cut) + cur >= max(n // 2, self.COMPACT_MIN):
                self.dropped += int(ccount[-1]) - self._before(ccount, cut)
                part = self._part(tuple(c[cur:cut].copy() for c in cols))
            kept.append(part)
        self.parts = kept

    @staticmethod
    def _part(cols: tuple) -> list:
        """A part of nodes sorted by bound: [columns, cumulative count, cumulative fanout, cursor]."""
        return [cols, np.cumsum(cols[4]), np.cumsum(cols[5]), 0]

    @staticmethod
    def _before(cum: np.ndarray, i: int) -> int:
        """Sum of the first `i` entries of the array whose running sum is `cum`."""
        return int(cum[i - 1]) if i > 0 else 0

    def __len__(self) -> int:
        return sum(len(p[0][0]) - p[3] for p in self.parts)

    def min(self) -> float:
        return min((float(p[0][3][p[3]]) for p in self.parts), default=np.inf)

    def leaves(self, above: float) -> tuple[int, int]:
        """(leaves below nodes whose bound is above `above` — and below those already dropped —,
        leaves below the others)."""
        pruned, kept = self.dropped, 0
        for cols, ccount, _, cur in self.parts:
            cut = max(cur, int(np.searchsorted(cols[3], above, side="right")))
            start, total = self._before(ccount, cur), int(ccount[-1])
            kept += self._before(ccount, cut) - start
            pruned += total - self._before(ccount, cut)
        return pruned, kept

    def _heads(self, limit: float, budget: int) -> list[tuple[int, int, int]]:
        """(part, cursor, nodes) of each part's head that a pop may take: its nodes with bound ≤
        `limit`, at most as many as pass the `budget` on their own, and none above the bound at which
        some part's head alone passes it (that part's nodes up to there come first)."""
        heads, cut = [], limit
        for k, (cols, _, cfan, cur) in enumerate(self.parts):
            live = int(np.searchsorted(cols[3], limit, side="right")) - cur
            if live > 0:
                reach = int(np.searchsorted(cfan[cur:], self._before(cfan, cur) + budget, side="right")) + 1
                if reach <= live:
                    cut = min(cut, float(cols[3][cur + reach - 1]))
                heads.append((k, cur, min(live, reach)))
        heads = [(k, cur, min(n, int(np.searchsorted(self.parts[k][0][3], cut, side="right")) - cur))
                 for k, cur, n in heads]
        return [h for h in heads if h[2] > 0]

    def pop(self, limit: float, budget: int):
        """Nodes with bound ≤ `limit`, smallest first (equal bounds in the order they were pushed),
        the most whose children total at most `budget` rows (at least one): (group, structure,
        setting, bound) arrays, or None."""
        heads = self._heads(limit, budget)
        if not heads:
            return None
        part_of = np.concatenate([np.full(n, k) for k, _, n in heads])
        pick = [np.concatenate([self.parts[k][0][f][cur:cur + n] for k, cur, n in heads]) for f in range(6)]
        order = np.argsort(pick[3], kind="stable")
        take = order[:max(1, int(np.searchsorted(np.cumsum(pick[5][order]), budget, side="right")))]
        taken = np.bincount(part_of[take], minlength=len(self.parts))
        for k, _, _ in heads:  # a part's smallest bounds go first: what it gave is a prefix
            self.parts[k][3] += int(taken[k])
        self.parts = [p for p in self.parts if p[3] < len(p[0][0])]
        for k, part in enumerate(self.parts):  # the popped heads' memory back, past half a part
            cols, ccount, cfan, cur = part
            if cur >= max(len(cols[0]) // 2, self.COMPACT_MIN):
                self.parts[k] = self._part(tuple(c[cur:].copy() for c in cols))
        return pick[0][take], pick[1][take], pick[2][take], pick[3][take]


#: out of time with nothing that fits, the search dives for the first configuration that does for at
#: most as long again as the budget, and at least this long; then it stops, having found none
DIVE_GRACE_S = 10.0


def memory_alternatives(registry, req: TuneRequest, leaf) -> list[tuple]:
    """Every setting a leaf may give the leaf features that lower memory (``lowers_memory`` not
    empty): conflict-free sets of them, each with one of its searched option settings, as tuples of
    (feature, {option: value}, categorical choices, index of the choice in ``req.space.features``)
    in the engine's memory-phase order; the empty set first."""
    order = {f.name: i for i, f in enumerate(registry.features_in_phase(Phase.memory))}
    lowering = sorted((f for f in leaf if f.lowers_memory), key=lambda f: order.get(f.name, len(order)))
    settings = {}
    for f in lowering:
        enabled, opts, cats = _choice_table(registry, f.name, req.space.features[f.name])
        settings[f.name] = [(f, {k: v[i] for k, v in opts.items()}, cats, int(i)) for i in np.flatnonzero(enabled)]
    out = []
    for k in range(len(lowering) + 1):
        for subset in itertools.combinations(lowering, k):
            names = {f.name for f in subset}
            if any(c in names for f in subset for c in f.conflicts):
                continue
            out += list(itertools.product(*(settings[f.name] for f in subset)))
    return out


def alternative_rows(alternatives: list[tuple], n: int) -> list[tuple]:
    """:func:`memory_alternatives` as :func:`engine.memory_floor` takes them: (feature, FeatureRows)
    pairs, on in all `n` rows with the setting's options."""
    return [tuple((f, FeatureRows(enabled=np.ones(n, bool), options={k: np.full(n, v) for k, v in opts.items()},
                                  choices=cats)) for f, opts, cats, _ in alt) for alt in alternatives]


def alternative_of(alternatives: list[tuple], req: TuneRequest, names: list[str]) -> Callable[[np.ndarray], np.ndarray]:
    """A function from leaves' choice vectors (rows × `names`, indices into ``req.space.features``,
    −1 = not set) to the index of their setting in `alternatives` (:func:`memory_alternatives`):
    which memory-lowering features each turns on, with which choice."""
    lowering = list(dict.fromkeys(f.name for alt in alternatives for f, *_ in alt))
    cols = [names.index(n) for n in lowering]
    radix = np.array([len(req.space.features[n]) + 1 for n in lowering], np.int64)
    stride = np.concatenate([np.cumprod(radix[::-1])[::-1][1:], [1]]).astype(np.int64) if len(radix) else radix
    table = np.full(int(np.prod(radix)), -1, np.int64)
    for a, alt in enumerate(alternatives):
        table[sum(int(stride[lowering.index(f.name)]) * (i + 1) for f, _, _, i in alt)] = a
    on = [np.array([c is not None for c in req.space.features[n]] + [False]) for n in lowering]

    def of(choice: np.ndarray) -> np.ndarray:
        code = np.zeros(len(choice), np.int64)
        for k, j in enumerate(cols):
            c = choice[:, j]
            code += stride[k] * np.where(on[k][c], c + 1, 0)  # −1 (not set) reads the appended False
        return table[code]

    return of


def dive_deadline(budget_s: float) -> float:
    """Seconds after which a search out of time that has found nothing that fits gives up."""
    return budget_s + max(budget_s, DIVE_GRACE_S)


class _Search:
    """The best-first branch and bound (see the module docstring)."""

    def __init__(self, predictor, req: TuneRequest, structs: CandidateBatch, groups: list[_Group],
                 group_of: np.ndarray, all_names: list[str], level_kinds: tuple[str, ...]):
        self.predictor, self.req, self.structs = predictor, req, structs
        self.level_kinds = level_kinds
        self.chunk_rows = req.chunk_rows or (PARETO_CHUNK_ROWS if req.pareto else CHUNK_ROWS)
        self.groups, self.group_of = groups, group_of
        self.nodes = _Nodes(groups, len(level_kinds))
        self.registry = predictor.registry
        self.all_names = all_names
        self.choices = _Choices(req, self.registry, all_names)
        # the structures' fields as one table per dtype: a batch's rows gathered in one take each
        fields = [f.name for f in attrs.fields(CandidateBatch) if f.name != "features"]
        by_dtype: dict[str, list[str]] = {}
        for name in fields:
            by_dtype.setdefault(getattr(structs, name).dtype.str, []).append(name)
        self.struct_cols = [(names, np.stack([getattr(structs, n) for n in names])) for names in by_dtype.values()]
        # structures alike but for their pipeline schedule: at pp 1 most schedules run the same step
        layout = np.stack([np.asarray(getattr(structs, n), np.float64) for n in fields if n != "schedule"], axis=1)
        self.layout_of = distinct_rows(layout)[1]
        self.top = _TopK(req.top_k)
        self.pareto: list[tuple] = []
        #: the (step time, memory) staircase of the front points kept so far: what a chunk's rows
        #: must not be strictly dominated by to be worth its Pareto sort
        self.staircase = (np.zeros(0), np.zeros(0))
        self.removed: dict[str, int] = {}
        self.evaluated = self.feasible = self.bounded_rows = 0
        #: leaves counted as memory failures by their node's floor, not evaluated
        self.floored = 0
        #: the chunk may grow in a memory-bound search (not when the request sets it, nor for a front)
        self.adaptive = req.chunk_rows is None and not req.pareto
        self.min_peak = np.inf
        self.levels: list[_Level] = []
        self.overhead_s = engine.step_overhead_s(req.model, req.hardware)
        # everything the providers price, once per structure for the whole search
        self.priced = engine.price_structures(structs, req.model, req.hardware, predictor.pm)
        state, priced = engine.layer_phase(structs, req.model, req.hardware, predictor.pm,
                                           shared=(self.priced, np.arange(len(structs))))
        self.counts, self.const = engine.busy_terms(state, priced)
        self.exists = engine.stages_present(structs)
        self.m = structs.num_microbatches.astype(np.float64)
        self.monotone = np.array([s.monotone_bubble for s in self.registry.schedules.values()], bool)
        # features that cannot be combined with some other: rows are evaluated in groups that turn
        # on the same ones, so a group skips the others' transforms (their rows would be a minority)
        self.exclusive = [j for j, n in enumerate(all_names) if self.registry.features[n].conflicts]
        # the settings of the leaf features that lower memory, each a floor of the leaves that take
        # it (None: a leaf feature that does not say what it lowers, no floor)
        leaf = [self.registry.features[n] for n in all_names
                if self.registry.features[n].layer is None and self.registry.features[n].pipeline is None]
        self.alternatives = (None if any(f.lowers_memory is None for f in leaf)
                             else memory_alternatives(self.registry, req, leaf))
        self.alternative_of = (None if self.alternatives is None
                               else alternative_of(self.alternatives, req, all_names))
        self.min_floor = np.inf

    def threshold(self) -> float:
        if self.req.pareto:
            return np.inf
        t = self.top.threshold()
        return t + abs(t) * _REL_EPS if np.isfinite(t) else t

    def budget(self, depth: int) -> int:
        """Candidates the next pop (of level `depth`) may take: the chunk, or, above the pipeline
        level, :data:`MEMORY_BOUND_GROWTH` chunks once at least a chunk of leaves has been reached
        and fewer than :data:`MEMORY_BOUND_SHARE` of them fit (counts, not time: the same search pops
        the same nodes on any machine). Pipeline-level nodes are popped a chunk at a time: their
        memory floors dropped those with no leaf that fits, so their leaves' incumbent prunes."""
        if self.adaptive and depth < len(self.level_kinds) and self.memory_bound():
            return self.chunk_rows * MEMORY_BOUND_GROWTH
        return self.chunk_rows

    def memory_bound(self) -> bool:
        """Whether at least a chunk of leaves has been reached and fewer than
        :data:`MEMORY_BOUND_SHARE` of them fit (evaluated, or ruled out by their node's floor)."""
        reached = self.evaluated + self.floored
        return reached >= self.chunk_rows and self.feasible < MEMORY_BOUND_SHARE * reached

    def _batch(self, s_idx: np.ndarray, choice: np.ndarray) -> CandidateBatch:
        """The batch of rows (structure, choice vector): as ``structs.take(s_idx)`` with the
        choices' features, each dtype's fields gathered in one take."""
        kw = {}
        for names, table in self.struct_cols:
            kw.update(zip(names, _columns(table, s_idx)))
        return CandidateBatch(**kw, features=self.choices.rows(choice))

    def _engine_args(self, s_idx: np.ndarray) -> dict:
        """Rows sorted by structure: priced once per structure for the whole search."""
        return {"structure": _runs(s_idx), "shared": (self.priced, s_idx)}

    def _groups(self, choice: np.ndarray) -> list[np.ndarray]:
        """Rows (in order) that turn on the same features among those that exclude others."""
        if not self.exclusive or len(choice) < _GROUP_ROWS:  # small batches: one call costs less
            return [np.arange(len(choice))]
        label = np.zeros(len(choice), np.int64)
        for j in self.exclusive:
            c = choice[:, j]
            label = label * 2 + self.choices.tables[j][0][c]
        return [np.flatnonzero(label == x) for x in _present(label)]

    def _grouped(self, fn, s_idx: np.ndarray, choice: np.ndarray) -> np.ndarray:
        """``fn`` over the rows, one group of exclusive features at a time: its values (one per row,
        or a (k, rows) stack of k per row) in the rows' order."""
        out = None
        for rows in self._groups(choice):
            vals = fn(s_idx[rows], choice[rows])
            if out is None:
                out = np.empty(vals.shape[:-1] + (len(s_idx),))
            out[..., rows] = vals
        return out

    # ---- bounds (rows sorted by structure)
    def _busy(self, s_idx: np.ndarray, choice: np.ndarray) -> np.ndarray:
        """Objective bound of rows (structure, layer-feature setting): busy time + overhead."""
        batch = self._batch(s_idx, choice)
        state, _ = engine.layer_phase(batch, self.req.model, self.req.hardware, self.predictor.pm, layers_only=True,
                                      **self._engine_args(s_idx))
        work = self.const[:, s_idx] + sum(self.counts[k][:, s_idx] * engine.layer_work_s(c)[None, :]
                                          for k, c in state.layers.items())
        busy = self.m[s_idx] * np.where(self.exists[:, s_idx], work, -np.inf).max(axis=0)
        return _objective(self.req, busy + self.overhead_s, batch)

    def _settled(self, s_idx: np.ndarray, choice: np.ndarray) -> np.ndarray:
        """Objective bound of rows (structure, setting of the layer features that may speed layers
        up, the others and the pipeline-phase ones off): busy time, plus the bubble where the
        schedule's grows with every stage's F and B (``monotone_bubble``), + overhead."""
        batch = self._batch(s_idx, choice)
        pl = engine.pipeline_phase(batch, self.req.model, self.req.hardware, self.predictor.pm,
                                   **self._engine_args(s_idx))
        bubble = np.where(self.monotone[batch.schedule], pl.times.bubble_s, 0.0)
        return _objective(self.req, pl.times.busy_s + bubble + self.overhead_s, batch)

    def _pipeline(self, s_idx: np.ndarray, choice: np.ndarray) -> np.ndarray:
        """Objective bound of rows (structure, layer- and pipeline-feature setting): the pipeline
        time (busy, bubble, exposed p2p) + overhead; DP and the optimizer only add. Stacked with
        each row's memory floor (:meth:`_floors`) once the search is :meth:`memory_bound` (before,
        most nodes have leaves that fit, and a memory pass per bounded node costs more than the
        nodes it would spare)."""
        batch = self._batch(s_idx, choice)
        pl = engine.pipeline_phase(batch, self.req.model, self.req.hardware, self.predictor.pm,
                                   **self._engine_args(s_idx))
        bound = _objective(self.req, pl.times.total_s + self.overhead_s, batch)
        if self.alternatives is None or not self.memory_bound():
            return bound
        return np.stack([bound, *self._floors(pl)])

    def _floors(self, pl) -> tuple[np.ndarray, np.ndarray]:
        """(which memory no leaf below a pipeline-level node can fit in — 0 none, 1 the HBM, 2 the
        host's —, its GPU floor in GiB): over where every setting of the leaf features that lower
        memory is (:meth:`_over`; over the HBM where one is, else the host's)."""
        over_hbm, over_host, floor_gib = self._over(pl)
        dead = (over_hbm | over_host).all(axis=0)
        return np.where(dead, np.where(over_hbm.any(axis=0), 1.0, 2.0), 0.0), floor_gib

    def _over(self, pl) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(over the HBM, over the host memory), arrays (settings, nodes), and each node's GPU floor
        in GiB: the pipeline-level nodes' memory with the leaf features off, then each setting of the
        leaf features that lower memory (:func:`memory_alternatives`), a floor of every leaf that
        takes that setting."""
        gpu, host = engine.memory_floor(pl, alternative_rows(self.alternatives, len(pl.state.batch)))
        return gpu > self.req.hardware.hbm_bytes, host > self.req.hardware.host_bytes_per_gpu, gpu.min(axis=0) / GIB

    # ---- expansions
    def _child_rows(self, depth: int, grp, s, sub):
        """Children of popped nodes across groups, sorted by structure (a structure's children in
        the order of their parents): (group, structure, child id in its group, its choice vector,
        parent position, child's global id)."""
        par = np.arange(len(s)) if np.all(s[1:] >= s[:-1]) else np.argsort(s, kind="stable")
        rep, gid = self.nodes.children(depth, grp[par], sub[par])
        pos = par[rep]
        g_idx = grp[pos]
        return g_idx, s[pos], gid - self.nodes.base[depth][g_idx], self.nodes.choice[depth][gid], pos, gid

    def expand(self, depth: int, grp: np.ndarray, s: np.ndarray, sub: np.ndarray, bound: np.ndarray) -> None:
        """Children of popped nodes of level `depth` (0 = structures): bounded and pushed one level
        down, or evaluated when they are leaves."""
        if depth == len(self.level_kinds):  # the popped nodes' children are leaves
            self.evaluate(grp, s, sub)
            return
        g_idx, rows_s, child, choice, pos, gid = self._child_rows(depth, grp, s, sub)
        same = self.nodes.same[depth][g_idx] if depth > 0 else np.zeros(len(g_idx), bool)
        b = bound[pos].astype(np.float64)  # the same layer costs: the same bound
        todo = np.flatnonzero(~same)
        alive = None  # children with room in memory below, where a floor dropped some
        if self.req.pareto:  # no pruning: every leaf is evaluated, bounds would be wasted work
            b[:] = 0.0
        elif len(todo):
            fn = {"settled": self._settled, "busy": self._busy, "pipeline": self._pipeline}[self.level_kinds[depth]]
            vals = self._grouped(fn, rows_s[todo], choice[todo])
            self.bounded_rows += len(todo)
            if vals.ndim == 2:  # pipeline-level nodes with their memory floors: drop those no leaf fits
                vals, over, floor_gib = vals
                fits = self._room_below(todo, vals, over, floor_gib, self.nodes.leaves_below[depth][gid])
                if not fits.all():
                    alive = np.ones(len(b), bool)
                    alive[todo[~fits]] = False
                    todo, vals = todo[fits], vals[fits]
            # a node's bound holds for all below it: a child keeps the larger of the two
            b[todo] = np.maximum(vals, b[todo])
        if alive is not None:
            g_idx, rows_s, child, b, gid = (a[alive] for a in (g_idx, rows_s, child, b, gid))
        self.levels[depth + 1].push(g_idx, rows_s, child, b, self.nodes.leaves_below[depth][gid],
                                    self.nodes.fanout[depth][gid], limit=self.threshold())

    def _room_below(self, todo: np.ndarray, bound: np.ndarray, over: np.ndarray, floor_gib: np.ndarray,
                    leaves: np.ndarray) -> np.ndarray:
        """Whether some leaf below each pipeline-level node (children `todo`, their `bound`) may fit
        in memory (:meth:`_count_over`); the others' leaves count as reached too (for :meth:`budget`)
        where the node's bound could still win: the search would have popped it to learn that
        nothing below fits."""
        if not len(todo):
            return np.ones(0, bool)
        fits = self._count_over(over, floor_gib, leaves[todo])
        self.floored += int(leaves[todo[~fits & (bound <= self.threshold())]].sum())
        return fits

    def _count_over(self, over: np.ndarray, floor_gib: np.ndarray, leaves: np.ndarray) -> np.ndarray:
        """Nodes (or leaves) with room (``over == 0``: 1 over the HBM, 2 over the host memory only);
        the `leaves` below each other one are counted as memory failures, the smallest floor kept."""
        self.min_floor = min(self.min_floor, float(floor_gib.min()))
        for reason, code in ((OVER_HBM, 1.0), (OVER_HOST, 2.0)):
            hit = over == code
            if hit.any():
                self.removed[reason] = self.removed.get(reason, 0) + int(leaves[hit].sum())
        return over == 0.0

    def evaluate(self, grp: np.ndarray, ps: np.ndarray, pf: np.ndarray) -> None:
        """The leaves below pipeline-level nodes (structure `ps`, layer+pipeline setting `pf`): the
        engine runs through the pipeline once per node and finishes (optimizer, memory) per leaf;
        feature feasibility and memory checked, the best offered to the top-k."""
        order = np.argsort(ps, kind="stable")
        grp, ps, pf = grp[order], ps[order], pf[order]
        parent_choice = self._choices_of(grp, pf)
        for rows in self._groups(parent_choice):
            self._leaves(grp[rows], ps[rows], pf[rows], parent_choice[rows])

    def _leaves(self, grp: np.ndarray, ps: np.ndarray, pf: np.ndarray, parent_choice: np.ndarray) -> None:
        req, registry = self.req, self.registry
        pl = engine.pipeline_phase(self._batch(ps, parent_choice), req.model, req.hardware, self.predictor.pm,
                                   layer_key=self._layer_key(grp, ps, pf), lean=True, **self._engine_args(ps))
        g_idx, s_idx, c_idx, choice, parent, leaf = self._child_rows(len(self.level_kinds), grp, ps, pf)
        keep = self._memory_room(pl, parent, choice)
        if keep is not None:
            if not len(keep):
                return
            g_idx, s_idx, c_idx, choice, parent, leaf = (a[keep] for a in (g_idx, s_idx, c_idx, choice, parent, leaf))
        batch = self._batch(s_idx, choice)
        ok = np.ones(len(batch), bool)
        for feat in registry.features.values():
            rows = batch.feature(feat.name)
            if not rows.enabled.any():
                continue
            for r in feature_rules(registry, feat, batch, rows):
                bad = ~r.feasible & ok
                self.removed[r.reason] = self.removed.get(r.reason, 0) + int(bad.sum())
                ok &= ~bad
        # the plugins' and the schedules' rules again, now with the features on (host memory of the
        # offloads, cp_a2a's heads, fp8's MX recipe, the features a fork's schedule cannot run): the
        # structures passed them with every feature off, and the plugin rules declared blind to
        # features cannot fail now
        rules = self.predictor.plugin_constraints(batch, req.model, req.hardware, feature_rules_only=True)
        for r in rules + schedule_rules(registry, batch, req.model, req.hardware):
            bad = ~np.asarray(r.feasible, bool) & ok
            if bad.any():
                self.removed[r.reason] = self.removed.get(r.reason, 0) + int(bad.sum())
                ok &= ~bad
        idx = np.flatnonzero(ok)
        if not len(idx):
            return
        if len(idx) < len(batch):
            batch, parent, s_idx, c_idx, g_idx = batch.take(idx), parent[idx], s_idx[idx], c_idx[idx], g_idx[idx]
            choice, leaf = choice[idx], leaf[idx]
        out = self._finish(pl, parent, batch, s_idx, choice)
        self.evaluated += len(idx)
        fits = out.fits_in_memory
        self.min_peak = min(self.min_peak, float(out.peak_memory_bytes.min()) / GIB)
        over_hbm = out.peak_memory_bytes > req.hardware.hbm_bytes
        self.removed[OVER_HBM] = self.removed.get(OVER_HBM, 0) + int(over_hbm.sum())
        over_host = ~fits & ~over_hbm
        if over_host.any():
            self.removed[OVER_HOST] = self.removed.get(OVER_HOST, 0) + int(over_host.sum())
        self.feasible += int(fits.sum())
        val = np.where(fits, _objective(req, out.step_time_s, batch), np.inf)
        for t in np.argsort(val, kind="stable"):
            if not np.isfinite(val[t]) or val[t] > self.top.threshold():
                break
            same = (int(self.layout_of[s_idx[t]]), float(out.step_time_s[t]), float(out.peak_memory_bytes[t]))
            tie = (int(self.nodes.n_on[leaf[t]]), int(s_idx[t]), tuple(choice[t].tolist()))
            self.top.offer(float(val[t]), same, tie, (int(g_idx[t]), int(s_idx[t]), int(c_idx[t])))
        if req.pareto:
            ok_rows = np.flatnonzero(fits)
            ok_rows = ok_rows[~_dominated(self.staircase, out.step_time_s[ok_rows], out.peak_memory_bytes[ok_rows])]
            c_ok = c_idx[ok_rows]
            tie = np.stack([self.nodes.n_on[leaf[ok_rows]], s_idx[ok_rows], c_ok])
            front = _pareto(out.step_time_s[ok_rows], out.peak_memory_bytes[ok_rows], tie)
            for t in front:
                r = int(ok_rows[t])
                self.pareto.append((float(out.step_time_s[r]), float(out.peak_memory_bytes[r]), float(val[r]),
                                    (int(g_idx[r]), int(s_idx[r]), int(c_idx[r])), tuple(int(x) for x in tie[:, t])))
            rows = ok_rows[front]
            self.staircase = _staircase(*self.staircase, out.step_time_s[rows], out.peak_memory_bytes[rows])

    def _memory_room(self, pl, parent: np.ndarray, choice: np.ndarray) -> np.ndarray | None:
        """The leaves (positions) with room in memory, or None when all have or no floor is worth it:
        a leaf whose setting of the leaf features that lower memory (its `choice`) is over the HBM or
        the host memory on its pipeline-level node (:meth:`_over`) cannot fit; those are counted as
        memory failures."""
        n = len(pl.state.batch)
        if self.alternatives is None or len(parent) < 2 * n:  # a floor costs about one leaf per node
            return None
        over_hbm, over_host, floor_gib = self._over(pl)
        if not (over_hbm | over_host).any():
            self.min_floor = min(self.min_floor, float(floor_gib.min()))
            return None
        alt = self.alternative_of(choice)
        known = alt >= 0  # every conflict-free setting is an alternative; a leaf outside them is kept
        over = np.where(known & over_hbm[alt, parent], 1.0, np.where(known & over_host[alt, parent], 2.0, 0.0))
        fits = self._count_over(over, floor_gib, np.ones(len(over), np.int64))
        self.floored += int((~fits).sum())
        return np.flatnonzero(fits)

    def _finish(self, pl, parent: np.ndarray, batch: CandidateBatch, s_idx: np.ndarray, choice: np.ndarray):
        """Step time, peak memory and fit of leaves (rows of `batch`, sorted by structure) that
        share their parents' pipeline `pl`, one group of exclusive features at a time."""
        step, peak, fits = np.empty(len(batch)), np.empty(len(batch)), np.empty(len(batch), bool)
        for rows in self._groups(choice):
            sub = self._batch(s_idx[rows], choice[rows]) if len(rows) < len(batch) else batch
            out = engine.finish(engine.expand_pipelined(pl, parent[rows], sub, _runs(s_idx[rows]), lean=True),
                                lean=True)
            step[rows], peak[rows], fits[rows] = out.step_time_s, out.peak_memory_bytes, out.fits_in_memory
        return engine.Outcome(batch=batch, step_time_s=step, peak_memory_bytes=peak, fits_in_memory=fits)

    def _layer_key(self, grp: np.ndarray, ps: np.ndarray, pf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(first row, inverse) of pipeline-level nodes (rows sorted by structure) by their layer-phase key:
        structure and setting of every layer feature (their parent in the level above); rows that
        differ only in pipeline-phase features share the layer phase (the engine's `layer_key`)."""
        parent = self.nodes.layer_parent[self.nodes.base[-2][grp] + pf]
        code = (ps * len(self.groups) + grp) * self.nodes.layer_width + parent
        _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
        return first, np.asarray(inverse, np.int64).reshape(-1)

    def _choices_of(self, grp: np.ndarray, pf: np.ndarray) -> np.ndarray:
        return self.nodes.choice[-2][self.nodes.base[-2][grp] + pf]

    def candidates(self, refs: list[tuple[int, int, int]], values: list[float]) -> list[Candidate]:
        """Full predictions (breakdowns) of the configurations `refs` = (group, structure, leaf)."""
        req = self.req
        if not refs:
            return []
        s_idx = np.array([r[1] for r in refs])
        choice = np.stack([self.groups[r[0]].leaf_choice[r[2]] for r in refs])
        batch = self._batch(s_idx, choice)
        pred = self.predictor.evaluate(batch, req.model, req.hardware)
        e2e = _e2e(req, pred.step_time_s, batch) if req.objective != "step_time" else None
        return [_candidate(0, pred, t, self.all_names, self.registry, req, values[t], e2e) for t in range(len(refs))]

    def best(self) -> tuple[Candidate, ...]:
        ranked = self.top.ranked()
        refs = [r for _, members in ranked for r in members]
        values = [v for v, members in ranked for _ in members]
        cands = iter(self.candidates(refs, values))
        best = []
        for rank, (_, members) in enumerate(ranked, start=1):
            group = [next(cands) for _ in members]
            best.append(attrs.evolve(group[0], rank=rank, variants=tuple(c.features for c in group[1:]),
                                     variant_schedules=tuple(c.schedule for c in group[1:])))
        return tuple(best)

    def pareto_front(self) -> tuple[Candidate, ...]:
        if not self.pareto:
            return ()
        t = np.array([x[0] for x in self.pareto])
        mem = np.array([x[1] for x in self.pareto])
        keep = sorted(_pareto(t, mem, np.array([x[4] for x in self.pareto]).T), key=lambda i: t[i])
        return tuple(self.candidates([self.pareto[i][3] for i in keep], [self.pareto[i][2] for i in keep]))

    # ---- the loop
    def run(self, structure_bound: np.ndarray, total: int, t0: float, progress) -> bool:
        """Expand the most promising pending node until none can beat the k-th best; False when
        the time budget ran out first."""
        req = self.req
        n = len(self.structs)
        per_group = [(len(g.leaf_choice), len(g.level_choice[0])) for g in self.groups]
        leaves = np.array([x[0] for x in per_group], np.int64)[self.group_of]
        fan = np.array([x[1] for x in per_group], np.int64)[self.group_of]
        self.levels = levels = [_Level(grp=self.group_of.copy(), s=np.arange(n), sub=np.zeros(n, np.int64),
                                       bound=np.asarray(structure_bound, np.float64), count=leaves, fanout=fan)]
        levels += [_Level() for _ in self.level_kinds]
        last_report = -np.inf
        out_of_time = False
        pruned_at = np.inf
        while True:
            limit = self.threshold()
            if limit < pruned_at:  # a better k-th best: what is pending above it can never be popped
                for lv in levels:
                    lv.prune(limit)
                pruned_at = limit
            live = [i for i, lv in enumerate(levels) if len(lv) and lv.min() <= limit]
            if not live:  # no pending bound can beat the k-th best
                return True
            if req.time_budget_s is not None and time.perf_counter() - t0 > req.time_budget_s:
                out_of_time = True
                if self.feasible or time.perf_counter() - t0 > dive_deadline(req.time_budget_s):
                    return False
            # the smallest bound first; on a tie the deepest level (it reaches a leaf sooner). Out of
            # time, or memory-bound, with nothing that fits yet: dive (deepest level first) to the
            # first that does — with no k-th best no bound prunes, and a dive keeps the pending nodes
            # to a few chunks a level where best-first would hold every level's children at once
            dive = out_of_time or (self.top.best_value() is None and self.memory_bound())
            depth = max(live) if dive else min(live, key=lambda i: (levels[i].min(), -i))
            self.expand(depth, *levels[depth].pop(limit, self.budget(depth)))
            now = time.perf_counter()
            if progress is not None and now - last_report > 0.25:
                last_report = now
                progress(self.progress(total, now - t0))

    def skipped(self, limit: float) -> tuple[int, int]:
        """(leaves below pending nodes whose bound cannot win, leaves below the others)."""
        parts = [lv.leaves(limit) for lv in self.levels]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)

    def progress(self, total: int, elapsed: float) -> TuneProgress:
        pruned, _ = self.skipped(self.threshold())
        return TuneProgress(evaluated=self.evaluated, skipped=pruned, total=total, best=self.top.best_value(),
                            elapsed_s=elapsed, reached=self.evaluated + self.floored, feasible=self.feasible,
                            memory_tight=self.memory_bound())


#: the parallel sizes a job's search ranges over (``[search]``, ``values=``, ``--*-values``)
SEARCHED_SIZES = ("tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch_size", "lighter_ends", "lighter_last")


def _min_peak(search) -> float:
    """The smallest peak evaluated; where the memory floors pruned everything, the smallest floor
    (every pruned configuration peaks above it)."""
    if search is None:
        return float("inf")
    return search.min_peak if np.isfinite(search.min_peak) else search.min_floor


def job_request(job, registry, *, features: Iterable[str] | None = None, schedules: Iterable[str] | None = None,
                values: Mapping[str, tuple[int, ...]] | None = None, objective: str = "step_time", top_k: int = 10,
                pareto: bool = False, time_budget_s: float | None = None, memory_headroom_gib: float | None = None,
                fields: tuple[str, str] = ("features", "schedules")) -> TuneRequest:
    """The search ``mofa tune`` runs for `job`: the default space narrowed by the job's ``[search]``
    table and then by `values` (``{"tp": (4, 8)}``: any of :data:`SEARCHED_SIZES`); `features`
    searched (else the table's, else every tunable one) and the job's own features held on with
    their options; `schedules` likewise. An end-to-end objective reads the job's ``[training]`` and
    ``[reliability]``. `memory_headroom_gib` (else the table's) is the HBM every configuration leaves
    free. `fields` name the two lists in error lines (the CLI's flags)."""
    srch, values = job.search, _sizes_arg(values)
    features, schedules = _names_arg(features, fields[0]), _names_arg(schedules, fields[1])
    _check_request_args(objective, top_k, time_budget_s, memory_headroom_gib)
    headroom = srch.memory_headroom_gib if memory_headroom_gib is None else float(memory_headroom_gib)
    feats = features if features is not None else srch.features
    if feats is None:
        feats = tuple(n for n, f in registry.features.items() if f.tunable)
    feats = tuple(dict.fromkeys((*feats, *job.features)))  # the job's own are held on even if not searched
    for f in feats:
        registry.feature(f, field=fields[0])
    base = default_space(registry, job.model, job.hardware, job.num_gpus, job.parallel.sequence_length, features=feats)
    sched = schedules or srch.schedules or base.schedules
    sched = tuple(registry.schedule(s, field=fields[1]).name for s in sched)
    pick = {k: values.get(k) or getattr(srch, k) or getattr(base, k) for k in SEARCHED_SIZES}
    space = SearchSpace(**pick, schedules=sched,
                        features={f: (feature_choices(registry, f, attrs.asdict(job.features[f]), allow_off=False)
                                      if f in job.features else base.features[f]) for f in feats})
    e2e = None
    if objective != "step_time":
        from .e2e import e2e_inputs, e2e_time

        kwargs = e2e_inputs(job, registry).model_kwargs()
        e2e = lambda step, batch: e2e_time(step, **kwargs)  # noqa: E731
    par = job.parallel
    return TuneRequest(model=job.model, hardware=job.hardware, num_gpus=job.num_gpus,
                       global_batch_size=par.global_batch_size, sequence_length=par.sequence_length,
                       precision=par.precision, space=space, objective=objective, top_k=top_k, e2e=e2e, pareto=pareto,
                       flash_attention=par.flash_attention, time_budget_s=time_budget_s,
                       attention_kernel=par.attention_kernel, document_length=par.document_length,
                       memory_headroom_gib=headroom)


def _check_request_args(objective, top_k, time_budget_s, memory_headroom_gib=None) -> None:
    """:func:`job_request`'s scalar arguments, each refused with one line naming it."""
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective: {short(objective)} is not an objective; use one of {', '.join(OBJECTIVES)}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ConfigError(f"top_k: expected an integer ≥ 1 (configurations to return), got {short(top_k)}")
    ok = isinstance(time_budget_s, (int, float)) and not isinstance(time_budget_s, bool)
    if time_budget_s is not None and not (ok and math.isfinite(time_budget_s) and time_budget_s > 0):
        raise ConfigError(f"time_budget_s: expected seconds > 0 (or None: no budget), got {short(time_budget_s)}")
    room = memory_headroom_gib
    ok = isinstance(room, (int, float)) and not isinstance(room, bool)
    if room is not None and not (ok and math.isfinite(room) and room >= 0):
        raise ConfigError(f"memory_headroom_gib: expected GiB ≥ 0 of HBM to leave free (or None: the job's "
                          f"[search] value), got {short(room)}")


def _sizes_arg(values) -> dict[str, tuple[int, ...]]:
    """`values` of :func:`job_request` checked as a job file's ``[search]`` ranges are (a bare
    integer is one value): ConfigError naming ``values.<size>``."""
    if values is not None and not isinstance(values, Mapping):
        raise ConfigError(f"values: expected a mapping of sizes to values, e.g. {{'tp': (4, 8)}}, got {short(values)}")
    values = dict(values or {})
    bad = sorted(set(values) - set(SEARCHED_SIZES))
    if bad:
        raise ConfigError(f"values: {bad[0]!r} is not searched; use one of {', '.join(SEARCHED_SIZES)}")
    one = {k: (v,) if isinstance(v, int) and not isinstance(v, bool) else v for k, v in values.items()}
    checked = structure(one, SearchSection, "values")
    return {k: getattr(checked, k) for k in values}


def _names_arg(names, field: str) -> tuple[str, ...] | None:
    """Feature or schedule names of :func:`job_request`: None, one name, or a list of them."""
    if names is None or isinstance(names, str):
        return names if names is None else (names,)
    if not isinstance(names, Iterable) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{field}: expected a name or a list of names, got {short(names)}")
    return tuple(names)


def tune(predictor, req: TuneRequest, progress: Callable[[TuneProgress], None] | None = None) -> TuneResult:
    """Search `req.space` exactly (branch and bound, see the module docstring) and return the
    best configurations; `progress` is called with a :class:`TuneProgress` as the search goes."""
    t0 = time.perf_counter()
    registry = predictor.registry
    req = _with_headroom(req)
    all_names = sorted(req.space.features)
    for f in all_names:
        registry.feature(f, field=f"search.features.{f}")
    sb, removed_s = _structure_batch(req, registry)
    n_combo_full = _count_combos(req, registry, all_names)
    removed = {k: v * n_combo_full for k, v in removed_s.items()}
    keep = np.ones(len(sb), bool)
    if len(sb):
        for reason, ok in _structure_checks(predictor, req, sb):
            removed[reason] = removed.get(reason, 0) + int((~ok & keep).sum()) * n_combo_full
            keep &= ok
    structs = sb.take(np.flatnonzero(keep))
    # which features can change each structure, and which are never slower there: one group per pattern
    applic = np.ones((len(structs), len(all_names)), bool)
    always = np.zeros((len(structs), len(all_names)), bool)
    for j, name in enumerate(all_names):
        feat = registry.features[name]
        if feat.applies is not None and len(structs):
            applic[:, j] = np.asarray(feat.applies(structs, req.model, req.hardware), bool)
        if feat.never_slower is not None and len(structs):
            always[:, j] = applic[:, j] & np.asarray(feat.never_slower(structs, req.model, req.hardware), bool)
    sig_rows = np.concatenate([applic, always], axis=1)
    first, group_of = distinct_rows(sig_rows) if len(structs) else (np.zeros(0, np.int64), [])
    levels = _levels(registry, all_names)
    groups = [_Group.build(req, registry, all_names, [n for n, on in zip(all_names, applic[i]) if on], levels,
                           always_on=[n for n, on in zip(all_names, always[i]) if on]) for i in first]
    group_of = np.asarray(group_of, np.int64).reshape(-1)
    if len(structs):
        per_group = np.bincount(group_of, minlength=len(groups))
        dominated = sum(int(g.dominated) * int(k) for g, k in zip(groups, per_group))
        if dominated:
            removed[NEVER_SLOWER] = removed.get(NEVER_SLOWER, 0) + dominated
    total = int(np.array([len(g.leaf_choice) for g in groups], np.int64)[group_of].sum()) if len(group_of) else 0
    proven, unexplored, skipped = True, 0, 0
    search = None
    if len(structs):
        search = _Search(predictor, req, structs, groups, group_of, all_names, tuple(k for k, _ in levels))
        bound = _lower_bounds(predictor, req, structs, all_names)
        proven = search.run(bound if bound is not None else np.zeros(len(structs)), total, t0, progress)
        # whatever is still pending could not win (or was not reached within the time budget)
        skipped, unexplored = search.skipped(search.threshold())
        for k, v in search.removed.items():
            removed[k] = removed.get(k, 0) + v
    from .uncertainty import band_candidates

    best = band_candidates(search.best(), req, registry) if search else ()
    front = search.pareto_front() if search else ()
    return TuneResult(best=best, evaluated=search.evaluated if search else 0,
                      feasible=search.feasible if search else 0, space_size=req.space.size,
                      skipped_by_bound=skipped, structures=req.space.structures, structures_feasible=len(structs),
                      elapsed_s=time.perf_counter() - t0, removed_by={k: v for k, v in removed.items() if v},
                      pareto=front, min_peak_memory_gib=_min_peak(search),
                      proven_optimal=proven, unexplored=unexplored if not proven else 0,
                      bounded_rows=search.bounded_rows if search else 0, memory_headroom_gib=req.memory_headroom_gib,
                      floored=search.floored if search else 0)


def every_candidate(predictor, req: TuneRequest, chunk_rows: int = 1 << 17):
    """Every configuration of `req.space` that passes every rule — brute force's candidates, the search's
    reference — in batches of whole structures, about `chunk_rows` candidate rows (one structure at
    least: its feature combinations never split), left with the rows that pass the rules; each with its
    rows' structures ``(first_rows, inverse)`` for :func:`engine.evaluate`. Whether each fits in memory
    is the prediction's to say (``fits_in_memory``), not a rule here. The benchmark of the evaluator
    itself prices these (``benchmarks/tune_benchmark.py``, the ``flat-`` cases)."""
    registry = predictor.registry
    req = _with_headroom(req)
    names = sorted(req.space.features)
    structs, _ = _structure_batch(req, registry)
    if not len(structs):
        return
    keep = np.logical_and.reduce([ok for _, ok in _structure_checks(predictor, req, structs)])
    structs = structs.take(np.flatnonzero(keep))
    grid = _combos(req, registry, names)
    tables = _feature_tables(req, registry, names, grid)
    per = max(1, chunk_rows // max(len(grid), 1))
    for lo in range(0, len(structs), per):
        n_s = min(per, len(structs) - lo)
        s_idx = np.repeat(np.arange(n_s), len(grid))
        combos = np.tile(np.arange(len(grid)), n_s)
        batch = attrs.evolve(structs.take(lo + s_idx), features=_feature_rows(tables, combos))
        rows = np.flatnonzero(_passes(predictor, req, batch))
        if len(rows):
            _, first, inverse = np.unique(s_idx[rows], return_index=True, return_inverse=True)
            yield batch.take(rows), (first, np.asarray(inverse, np.int64).reshape(-1))


def _structure_checks(predictor, req: TuneRequest, structs: CandidateBatch) -> list[tuple[str, np.ndarray]]:
    """(reason, rows that pass) of every rule a structure must pass before features are chosen: the
    plugins' and schedules' rules (:meth:`Predictor.constraints`) and §4.1's (:func:`_paper_rules`)."""
    checks = [(r.reason, np.asarray(r.feasible, bool)) for r in predictor.constraints(structs, req.model, req.hardware)]
    return checks + _paper_rules(req, predictor.registry, structs)


def _passes(predictor, req: TuneRequest, batch: CandidateBatch) -> np.ndarray:
    """Rows of `batch` that pass every rule of every plugin (:meth:`Predictor.constraints`)."""
    ok = np.ones(len(batch), bool)
    for r in predictor.constraints(batch, req.model, req.hardware):
        ok &= np.asarray(r.feasible, bool)
    return ok


def _with_headroom(req: TuneRequest) -> TuneRequest:
    """`req` searched on a GPU whose HBM is less by the request's headroom: every memory check of the
    search (the floors, each leaf's fit) then leaves that much free. Pricing does not read the HBM's
    size, only the fits do. A headroom that leaves no memory is one line."""
    room = req.memory_headroom_gib
    if not room:
        return req
    hbm = req.hardware.memory.hbm_gib
    if room >= hbm:
        raise ConfigError(f"memory_headroom_gib: {room:g} GiB leaves none of {req.hardware.name}'s {hbm:g} GiB of HBM; "
                          f"give less than {hbm:g}")
    memory = attrs.evolve(req.hardware.memory, hbm_gib=hbm - room)
    return attrs.evolve(req, hardware=attrs.evolve(req.hardware, memory=memory))


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
    combos = _combos(req, reg, reducers)
    tables = _feature_tables(req, reg, reducers, combos)
    lb = np.full(len(structs), np.inf)
    for ci in range(len(combos)):
        idx = np.full(len(structs), ci)
        batch = attrs.evolve(structs, features=_feature_rows(tables, idx)) if reducers else structs
        pred = predictor.evaluate(batch, req.model, req.hardware)
        bd = pred.breakdown
        compute = (bd["compute_fwd"] + bd["compute_bwd_input"] + bd["compute_bwd_weight"]
                   + np.minimum(bd["schedule_adjust"], 0))
        lb = np.minimum(lb, np.maximum(compute, 0.0))
    return _objective(req, lb, structs)


def _staircase(t0: np.ndarray, m0: np.ndarray, t1: np.ndarray, m1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The front of two point sets (step time, memory), as a staircase: times rising, memories
    strictly falling (of equal points one is kept: the staircase only tests dominance)."""
    t, m = np.r_[t0, t1], np.r_[m0, m1]
    front = _pareto(t, m)  # in rising time
    return t[front], m[front]


def _dominated(staircase: tuple[np.ndarray, np.ndarray], time_s: np.ndarray, mem: np.ndarray) -> np.ndarray:
    """Rows strictly dominated by a staircase point (no slower and no larger, and not equal in both):
    never on the front, whatever comes later. The last point no slower than a row has the least
    memory of those; an equal one leaves the row to the tie rule of :func:`_pareto`."""
    st, sm = staircase
    if not len(st):
        return np.zeros(len(time_s), bool)
    i = np.searchsorted(st, time_s, side="right") - 1
    j = np.maximum(i, 0)
    return (i >= 0) & (sm[j] <= mem) & ((st[j] < time_s) | (sm[j] < mem))


def _pareto(time_s: np.ndarray, mem: np.ndarray, tie: np.ndarray | None = None) -> list[int]:
    """Indices on the front of (step time, memory), both minimised. Of configurations equal in
    both, the one first in `tie` (rows of keys, most significant first: features on, structure,
    leaf) stands for them, whatever order they were evaluated in."""
    order = np.lexsort((mem, time_s))
    t, m = np.asarray(time_s, dtype=np.float64)[order], np.asarray(mem, dtype=np.float64)[order]
    below = m < np.minimum.accumulate(np.r_[np.inf, m[:-1]]) if len(m) else np.zeros(0, bool)
    if tie is None or not below.any():
        return [int(i) for i in order[below]]
    # rows equal in both sit next to the front point that opens their run: the first in `tie` wins
    run = np.cumsum(np.r_[True, (t[1:] != t[:-1]) | (m[1:] != m[:-1])]) - 1
    rows = np.flatnonzero(np.isin(run, run[below]))
    keys = np.asarray(tie)[:, order[rows]]
    pick = rows[np.lexsort((*keys[::-1], run[rows]))]
    first = np.r_[True, run[pick[1:]] != run[pick[:-1]]]
    return [int(i) for i in order[pick[first]]]


def _parallel_of(b: CandidateBatch, row: int) -> dict[str, Any]:
    """``Candidate.parallel`` of one row of a batch: its layout, batch shape and precision."""
    return {"tp": int(b.tp[row]), "pp": int(b.pp[row]), "vpp": int(b.vpp[row]), "cp": int(b.cp[row]),
            "ep": int(b.ep[row]), "etp": int(b.etp[row]), "dp": int(b.dp[row]),
            "micro_batch_size": int(b.micro_batch_size[row]), "global_batch_size": int(b.global_batch_size[row]),
            "sequence_length": int(b.sequence_length[row]), "sequence_parallel": bool(b.sequence_parallel[row]),
            "precision": PRECISIONS[int(b.precision[row])],
            "first_stage_layers": int(b.first_stage_layers[row]), "last_stage_layers": int(b.last_stage_layers[row])}


def _candidate(rank, pred: Prediction, row: int, names, registry, req: TuneRequest, value, e2e=None) -> Candidate:
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
    parallel = _parallel_of(b, row)
    compute = bd["compute_fwd"] + bd["compute_bwd_input"] + bd["compute_bwd_weight"] + bd["recompute"]
    interval = ettr = None
    if e2e is not None and hasattr(e2e, "checkpoint_interval_steps"):
        interval = float(np.asarray(e2e.checkpoint_interval_steps)[row])
        ettr = float(np.asarray(e2e.ettr)[row])
    return Candidate(
        rank=rank, parallel=parallel, schedule=list(registry.schedules)[int(b.schedule[row])], features=feats,
        step_time_s=f(pred.step_time_s), objective_value=float(value), model_tflops_per_gpu=f(pred.model_tflops_per_gpu),
        mfu=f(pred.mfu), peak_memory_gib=f(pred.peak_memory_bytes) / GIB, compute_s=compute, tp_comm_s=bd["tp_comm"],
        pp_comm_s=bd["pp_comm"], dp_comm_s=bd["dp_comm"], optimizer_s=bd["optimizer"] + bd["optimizer_host"],
        breakdown=bd, memory_breakdown={k: f(v) / GIB for k, v in pred.memory_breakdown.items()},
        total_time_s=float(value) if req.objective == "e2e_time" else None,
        checkpoint_interval_steps=interval, ettr=ettr,
    )


def stage_layers(num_layers: int, pp: int, first: int = 0, last: int = 0) -> tuple[int, int, int]:
    """Layers on the first, each middle and the last pipeline stage, as the engine places them:
    explicit end stages and the rest shared equally, or the default split (balanced; when pp
    does not divide the layers the end stages take the remainder off)."""
    if pp == 1:
        return num_layers, num_layers, num_layers
    if not (first or last):
        first, last = (int(x) for x in default_end_layers(num_layers, pp))
    mid = (num_layers - first - last) // (pp - 2) if pp > 2 else 0
    return first, mid, last


def pipeline_layout_arguments(model: ModelSpec, parallel: Mapping[str, Any], interleave: bool = True) -> list[str]:
    """Megatron-Core arguments placing the layers on pipeline stages and virtual chunks:
    ``--num-layers-per-virtual-pipeline-stage`` when every stage holds the same layers;
    ``--decoder-first/last-pipeline-num-layers`` for lighter end stages (with
    ``--num-virtual-stages-per-pipeline-rank`` when each stage splits into whole chunks);
    ``--account-for-embedding/loss-in-pipeline-split`` when the end stages are one layer lighter and
    the embedding and loss complete their first and last chunk; else an explicit
    ``--pipeline-model-parallel-layout``. `interleave` False: the schedule's own arguments
    split the stages into chunks (only the end stages are placed here)."""
    L, pp, v = model.num_layers, parallel["pp"], parallel["vpp"] if interleave else 1
    if pp == 1:
        return []
    first, mid, last = stage_layers(L, pp, parallel.get("first_stage_layers", 0), parallel.get("last_stage_layers", 0))
    uneven = pp > 2 and (first, last) != (mid, mid) or pp == 2 and first != last
    if not uneven:
        return ["--num-layers-per-virtual-pipeline-stage", str(L // (pp * v))] if v > 1 else []
    ends = ["--decoder-first-pipeline-num-layers", str(first), "--decoder-last-pipeline-num-layers", str(last)]
    if v == 1:
        return ends
    chunks = ["--num-virtual-stages-per-pipeline-rank", str(v)]
    if first % v == 0 and last % v == 0 and (pp == 2 or mid % v == 0):
        return ends + chunks
    if first == last == mid - 1 and not model.num_mtp_layers and (L + 2) % (pp * v) == 0:
        return ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split", *chunks]
    return ["--pipeline-model-parallel-layout", _layout_string(model, pp, v, first, mid, last)]


def _layout_string(model: ModelSpec, pp: int, v: int, first: int, mid: int, last: int) -> str:
    """Megatron-Core's layout string: virtual stages in order (chunk 0 of every rank, then chunk
    1, …) split by ``|``; E = embedding, t = decoder layer, m = MTP layer, L = loss. A stage's layers
    split into chunks as evenly as possible, the lighter chunks where the embedding and the loss are."""
    def split(n: int, heavy_last: bool) -> list[int]:
        q, r = divmod(n, v)
        return [q + (i >= v - r if heavy_last else i < r) for i in range(v)]

    per_rank = [split(first, True)] + [split(mid, True)] * (pp - 2) + [split(last, False)]
    segments = []
    for chunk in range(v):
        for rank in range(pp):
            n = per_rank[rank][chunk]
            seg = ("E" if chunk == rank == 0 else "") + (f"t*{n}" if n > 1 else "t" * n)
            if chunk == v - 1 and rank == pp - 1:
                seg += "m" * model.num_mtp_layers + "L"
            segments.append(seg)
    return "|".join(segments)


#: what the Megatron line states for every MoE model unless a feature states otherwise (the flex
#: dispatcher): the token dispatch and the expert GEMMs MoFa prices, where Megatron-Core's defaults
#: differ (``moe_token_dispatcher_type = "allgather"``, ``moe_grouped_gemm = False``)
MOE_DEFAULTS = ("--moe-token-dispatcher-type alltoall", "--moe-grouped-gemm")


def schedule_arguments(sched, model: ModelSpec, parallel: Mapping[str, Any], context: MegatronContext) -> list[str]:
    """A schedule's part of the Megatron line: its ``megatron_args`` function's tokens (it places its
    chunks itself, ZB-V's V, or adds to Megatron-Core's placement; given the context when it takes
    three arguments), else Megatron-Core's layout arguments and its fixed tokens."""
    if callable(sched.megatron_args):
        if positional_count(sched.megatron_args) >= 3:
            return list(sched.megatron_args(model, parallel, context))
        return list(sched.megatron_args(model, parallel))
    return pipeline_layout_arguments(model, parallel) + list(sched.megatron_args)


@attrs.frozen(kw_only=True)
class LaunchConfig:
    """What a Megatron-LM launch line describes of a configuration: its parallel settings (the keys of
    ``Candidate.parallel``), pipeline schedule and features (name → options). A :class:`Candidate`
    has the same three; :meth:`of_job` makes one of a resolved job, so :func:`megatron_arguments` and
    :func:`megatron_environment` write a job's launch as they write a tuned candidate's."""

    parallel: Mapping[str, Any]
    schedule: str
    features: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)

    @classmethod
    def of_job(cls, job, registry) -> LaunchConfig:
        """A resolved job's layout (as the tuner reads a candidate's off its batch row), schedule and
        features."""
        feats = {n: attrs.asdict(o) if attrs.has(type(o)) else {} for n, o in job.features.items()}
        return cls(parallel=_parallel_of(jobs_to_batch([job], registry), 0), schedule=job.schedule, features=feats)


def megatron_context(model: ModelSpec, cand: Candidate | LaunchConfig,
                     hardware: HardwareProfile | None = None) -> MegatronContext:
    """What a feature's Megatron-LM hooks (``megatron_args``, ``megatron_env``) read of a candidate."""
    arch = hardware.compute.architecture if hardware is not None else ""
    return MegatronContext(model=model, parallel=cand.parallel, features=cand.features, schedule=cand.schedule,
                           architecture=arch)


def _feature_options(registry, cand: Candidate | LaunchConfig):
    """(feature, its options object or None) of every feature on in `cand`, in name order."""
    for name, opts in sorted(cand.features.items()):
        feat = registry.features[name]
        yield feat, (feat.options_type(**opts) if attrs.has(feat.options_type) else None)


def megatron_arguments(model: ModelSpec, cand: Candidate | LaunchConfig, registry,
                       hardware: HardwareProfile | None = None) -> tuple[list[str], list[str]]:
    """Megatron-LM arguments for a candidate, one ``--flag value`` per item, and notes (what
    Megatron-LM mainline cannot express). Features and schedules contribute their own; `hardware`
    (optional) tells them the GPU architecture (``MegatronContext.architecture``)."""
    p = cand.parallel
    sched = registry.schedules[cand.schedule]
    tokens = ["--tensor-model-parallel-size", str(p["tp"]), "--pipeline-model-parallel-size", str(p["pp"])]
    context = megatron_context(model, cand, hardware)
    tokens += schedule_arguments(sched, model, p, context)
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
    for feat, opt_obj in _feature_options(registry, cand):
        tokens += feat.megatron_tokens(opt_obj, context)
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
    # an MoE layer as MoFa prices it (all-to-all dispatch, grouped expert GEMMs) unless a feature set
    # the dispatcher: Megatron-Core's defaults are the allgather dispatcher and one GEMM per expert
    if model.is_moe:
        for flag in MOE_DEFAULTS:
            if flag.split()[0] not in seen:
                lines.append(flag)
                seen.add(flag.split()[0])
    # a feature's flag Megatron-LM accepts only beside another (its megatron_requires): dropped without
    present = {ln.split()[0] for ln in lines if ln}
    for name in cand.features:
        for flag, needs in registry.features[name].megatron_requires.items():
            if flag in present and not present & set(needs):
                lines = [ln for ln in lines if not ln or ln.split()[0] != flag]
    # flags the schedule's code base (a fork) does not take: a note with what it does instead
    unsupported = sched.megatron_unsupported
    notes += [f"{ln}: {unsupported[ln.split()[0]]}" for ln in lines if ln and ln.split()[0] in unsupported]
    return [ln for ln in lines if ln and ln.split()[0] not in unsupported], notes


#: GPU architectures on which Megatron-LM asserts ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with tensor or context
#: parallelism: a device major version below 10 (``validate_args``: ``get_device_arch_version() < 10``,
#: "no longer exists since the Blackwell architecture"), where one hardware queue keeps a layer's
#: communication kernels in issue order with its GEMMs — NVIDIA before Blackwell, and AMD's CDNA GPUs,
#: whose gfx9 devices report major 9 under ROCm. A profile that names no architecture gets it too (the
#: launch then runs anywhere but under a feature that forbids it)
SINGLE_QUEUE_ARCHITECTURES = ("", "volta", "turing", "ampere", "ada", "hopper", "cdna2", "cdna3")
#: the variable
MAX_CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"


@attrs.frozen(kw_only=True)
class LaunchEnvironment:
    """The environment a Megatron-LM launch of a candidate needs (:func:`megatron_environment`).

    ``settings``: variable → value, or None where the launch must leave it unset (a requirement that
    it be anything but a value, with none asking for one). ``reasons``: variable → why, one line.
    ``notes``: requirements that could not all be met (two features asking different values)."""

    settings: Mapping[str, str | None] = attrs.field(factory=dict)
    reasons: Mapping[str, str] = attrs.field(factory=dict)
    notes: tuple[str, ...] = ()
    #: variables whose setting Megatron-LM asserts (a launch without it stops before its first step)
    asserted: frozenset[str] = attrs.field(factory=frozenset, converter=frozenset)
    #: variable → the values a requirement forbids it to hold
    forbidden: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)

    def shell(self) -> list[str]:
        """``export NAME=VALUE`` / ``unset NAME`` lines, in name order."""
        return [f"export {k}={v}" if v is not None else f"unset {k}" for k, v in sorted(self.settings.items())]

    def to_dict(self) -> dict:
        return {k: self.settings[k] for k in sorted(self.settings)}


def core_environment(cand: Candidate | LaunchConfig, architecture: str) -> list[EnvRequirement]:
    """The core's own requirement: ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with tensor or context parallelism
    before Blackwell (:data:`SINGLE_QUEUE_ARCHITECTURES`), which Megatron-LM asserts."""
    p = cand.parallel
    if (p["tp"] > 1 or p["cp"] > 1) and architecture in SINGLE_QUEUE_ARCHITECTURES:
        return [EnvRequirement(name=MAX_CONNECTIONS, value="1", reason=(
            "asserted by Megatron-LM's validate_args with tensor or context parallelism before Blackwell"))]
    return []


def compose_environment(core: Iterable[EnvRequirement],
                        features: Iterable[tuple[str, EnvRequirement]]) -> LaunchEnvironment:
    """One launch environment from the core's requirements and the features' (feature name, requirement).

    A feature's requirement on a variable replaces the core's on it (Megatron-LM waives its own where
    the feature's code needs otherwise). Per variable: the first required value, else the first
    recommended one (features in name order), unless a requirement forbids it; no value asked and
    one forbidden: unset. A value asked against another or against a forbidding requirement is kept
    out and said in a note."""
    by: dict[str, list[tuple[str, EnvRequirement]]] = {}
    for who, req in features:
        by.setdefault(req.name, []).append((who, req))
    waived: dict[str, EnvRequirement] = {}
    for req in core:
        if req.name in by:
            waived[req.name] = req
        else:
            by[req.name] = [("core", req)]
    settings: dict[str, str | None] = {}
    reasons: dict[str, str] = {}
    notes: list[str] = []
    asserted: set[str] = set()
    forbidden: dict[str, tuple[str, ...]] = {}
    for name in sorted(by):
        reqs = by[name]
        forbid = [(w, r) for w, r in reqs if not r.equal]
        ask = sorted(((w, r) for w, r in reqs if r.equal), key=lambda wr: not wr[1].required)
        value, why = None, []
        for who, req in ask:
            against = [w for w, r in forbid if r.value == req.value]
            if against:
                notes.append(f"{name}={req.value} ({who}) left out: {', '.join(against)} cannot run with it")
            elif value is None:
                value, why = req.value, [f"{who}: {req.reason}" if req.reason else who]
                if req.required:
                    asserted.add(name)
            elif req.value != value:
                notes.append(f"{name}={req.value} ({who}: {req.reason}) left out: {value} kept")
        if any(r.required for _, r in forbid):
            asserted.add(name)
        if forbid:
            forbidden[name] = tuple(dict.fromkeys(r.value for _, r in forbid))
        settings[name] = value
        reasons[name] = "; ".join(why + [f"{w}: {r.reason}" if r.reason else f"{w}: not {r.value}" for w, r in forbid])
        core_req = waived.get(name)
        if core_req is not None and core_req.equal and value != core_req.value:
            notes.append(f"{name}: {', '.join(sorted({w for w, _ in reqs}))} overrides the core's {core_req.value} "
                         f"({core_req.reason}); Megatron-LM waives its assertion there but warns that the two "
                         "run best at different values")
    return LaunchEnvironment(settings=settings, reasons=reasons, notes=tuple(notes), asserted=asserted,
                             forbidden=forbidden)


def environment_findings(env: LaunchEnvironment, exported: Mapping[str, str]) -> list[str]:
    """What a launch's own environment (`exported`: the variables its script sets) does against what
    its line needs (`env`), one line each: a value Megatron-LM asserts against stops the run before
    its first step; a recommended one missed runs slower than MoFa prices; a needed one the script
    leaves to its surroundings is named."""
    out = []
    for name in sorted(env.settings):
        want, have = env.settings[name], exported.get(name)
        stops = name in env.asserted
        why = env.reasons.get(name, "")
        if have is not None and have in env.forbidden.get(name, ()):
            out.append(f"the launch exports {name}={have} against {why} — "
                       + ("Megatron-LM stops there before its first step: unset it" if stops else
                          "unset it, or the step runs slower than predicted"))
        elif want is not None and have is not None and have != want:
            out.append(f"the launch exports {name}={have}; the line needs {want} ({why}) — "
                       + ("Megatron-LM stops there before its first step" if stops else
                          "MoFa prices what the needed value gives"))
        elif want is not None and have is None:
            out.append(f"the launch does not set {name}; the line needs {want} ({why}) "
                       + ("— Megatron-LM stops without it, unless the job's environment sets it" if stops else
                          "for the speed MoFa prices"))
    return out


def megatron_environment(model: ModelSpec, cand: Candidate | LaunchConfig, registry,
                         hardware: HardwareProfile | None = None) -> LaunchEnvironment:
    """The environment variables a Megatron-LM launch of `cand` (its :func:`megatron_arguments` line)
    needs: the core's (:func:`core_environment`, on `hardware`'s architecture; unknown without it)
    and every feature's ``megatron_env`` (:class:`~mofa_framework.types.EnvRequirement`), composed by
    :func:`compose_environment`."""
    context = megatron_context(model, cand, hardware)
    wanted: list[tuple[str, EnvRequirement]] = []
    for feat, opt_obj in _feature_options(registry, cand):
        wanted += [(feat.name, r) for r in feat.megatron_env_requirements(opt_obj, context)]
    return compose_environment(core_environment(cand, context.architecture), wanted)


def megatron_launch(model: ModelSpec, cand: Candidate | LaunchConfig, registry,
                    hardware: HardwareProfile | None = None) -> list[str]:
    """A configuration as a Megatron-LM launch fragment, one line each: ``#`` notes (the line's and
    the environment's), ``export`` / ``unset`` lines, then the arguments joined by ``\\`` line
    continuations (``mofa tune`` and ``mofa predict --format megatron``)."""
    line, notes = megatron_arguments(model, cand, registry, hardware)
    return launch_lines(line, notes, megatron_environment(model, cand, registry, hardware))


def launch_lines(line: list[str], notes: list[str], env: LaunchEnvironment) -> list[str]:
    """A Megatron line, its notes and its environment as a launch fragment (:func:`megatron_launch`)."""
    args = [f"{a} \\" for a in line[:-1]] + line[-1:]
    return [f"# {n}" for n in [*notes, *env.notes]] + env.shell() + args
