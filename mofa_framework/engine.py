"""The vectorised engine: operators → layers → pipeline → optimizer → step time and memory.

One call evaluates a :class:`~mofa_framework.batch.CandidateBatch` — a single prediction is a
batch of one, a tuning chunk a batch of a million — with no Python loop over rows. The flow
(paper §3.2, eqs. [1]–[15]; cost-model.md §3–§6):

1. the model is decomposed into operators and collectives per layer type, priced by the
   ``mofa_operator_latency`` and ``mofa_collective_latency`` providers in one call each;
2. *layer*-phase features transform the per-layer costs;
3. layers are placed on pipeline stages; *pipeline*-phase features transform the schedule's
   inputs; each row's schedule gives the pipeline time and the micro-batches in flight;
4. DP communication and the optimizer update are costed; *optimizer*-phase features act;
5. memory per stage is costed; *memory*-phase features act; peak and fit follow.

A feature's transform only affects the rows where it is on: the engine merges its output
back with ``np.where`` so every other row stays bit-identical.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import SimpleNamespace

import attrs
import numpy as np

from .batch import (PRECISIONS, CandidateBatch, CollectiveBatch, FeatureRows, GatheredOptions, OperatorBatch,
                    distinct_rows, sequence_shapes)
from .row_groups import layer_rows, pipeline_rows
from .decompose import (
    ALL_REDUCE,
    Coll,
    Geometry,
    Op,
    embedding_operators,
    head_collectives,
    head_operators,
    layer_collectives,
    layer_operators,
    layer_params,
    mtp_module_params,
    recurrent_state_bytes,
    saved_activation_bytes,
    training_flops_per_sequence,
)
from . import invariants
from .errors import PluginError, PluginResultError
from .types import HardwareProfile, ModelSpec, Phase
from .units import GIB, BoolArray, FloatArray, IntArray

#: bytes of HBM traffic per parameter of one Adam step (fp32 master, m, v read+write,
#: fp32 gradient read, bf16 parameter write)
ADAM_BYTES_PER_PARAM = 30.0
#: optimizer state bytes per parameter kept by mixed-precision Adam: fp32 master + m + v
OPTIMIZER_STATE_BYTES = 12.0
#: bytes per logit element at the loss's peak with Megatron's fused vocab-parallel cross entropy
#: (``megatron/core/tensor_parallel/cross_entropy.py``): the output layer's bf16 logits (2) while
#: their fp32 copy (4) is made; the copy becomes the softmax kept for backward, whose gradient is
#: written in place and cast back to bf16 (4 + 2). A loss that upcasts and keeps more says so
#: through a memory feature (``fp32_cross_entropy``)
LOSS_BYTES_PER_LOGIT = 6.0

STAGES = ("first", "mid", "last")


# ====================================================================== state records


@attrs.frozen(kw_only=True, eq=False)
class LayerCosts:
    """One layer of one type, per micro-batch, on one GPU (seconds / bytes / FLOPs)."""

    fwd_compute_s: FloatArray
    bwd_input_s: FloatArray
    bwd_weight_s: FloatArray
    recompute_s: FloatArray
    #: compute that overlap features can hide communication behind
    tp_gemm_fwd_s: FloatArray
    tp_gemm_bwd_s: FloatArray
    attn_fwd_s: FloatArray
    attn_bwd_s: FloatArray
    expert_fwd_s: FloatArray
    expert_bwd_s: FloatArray
    #: what selective recompute re-runs: QKV projection + core attention forward
    qkv_attn_fwd_s: FloatArray
    #: communication, total and exposed, per pass
    tp_fwd_s: FloatArray
    tp_bwd_s: FloatArray
    cp_fwd_s: FloatArray
    cp_bwd_s: FloatArray
    ep_fwd_s: FloatArray
    ep_bwd_s: FloatArray
    tp_exposed_fwd_s: FloatArray
    tp_exposed_bwd_s: FloatArray
    cp_exposed_fwd_s: FloatArray
    cp_exposed_bwd_s: FloatArray
    ep_exposed_fwd_s: FloatArray
    ep_exposed_bwd_s: FloatArray
    offload_exposed_fwd_s: FloatArray
    offload_exposed_bwd_s: FloatArray
    #: data-parallel communication that runs inside the layer's passes (fully sharded data
    #: parallelism gathers the layer's parameters and scatters its gradients per micro-batch):
    #: total and exposed, per pass; 0 in the base model, where DP communication is per step
    dp_fwd_s: FloatArray
    dp_bwd_s: FloatArray
    dp_exposed_fwd_s: FloatArray
    dp_exposed_bwd_s: FloatArray
    #: saved activations: the pieces recompute features choose from, and what is kept
    act_layer_input_bytes: FloatArray
    act_core_attn_bytes: FloatArray
    act_other_bytes: FloatArray
    act_saved_bytes: FloatArray
    #: transient bytes while this layer runs (a recurrent mixer's chunk states; a layer full recompute
    #: re-materialises while its backward runs)
    act_working_bytes: FloatArray
    #: bytes a saved GEMM input occupies, as a fraction of its bf16 size: 1, less when a feature keeps
    #: a quantised copy for the weight gradient instead (fp8: 0.5). Features that later drop saved
    #: tensors (recompute modules, MemFine) drop them at this size, not twice
    act_gemm_input_scale: FloatArray
    fwd_flops: FloatArray
    recompute_flops: FloatArray

    @property
    def fwd_s(self) -> FloatArray:
        return (self.fwd_compute_s + self.tp_exposed_fwd_s + self.cp_exposed_fwd_s + self.ep_exposed_fwd_s
                + self.offload_exposed_fwd_s + self.dp_exposed_fwd_s)

    @property
    def bwd_input_total_s(self) -> FloatArray:
        """Backward-input pass incl. recompute and exposed backward communication (ZeroBubble's B)."""
        return (self.bwd_input_s + self.recompute_s + self.tp_exposed_bwd_s + self.cp_exposed_bwd_s
                + self.ep_exposed_bwd_s + self.offload_exposed_bwd_s + self.dp_exposed_bwd_s)


@attrs.frozen(kw_only=True, eq=False)
class PipelineInputs:
    """What a schedule needs, over the rows that chose it (seconds per micro-batch).

    ``F``, ``B``, ``W`` are per *chunk* (stage / v) of the critical stage — forward,
    backward-input and backward-weight; ``sum_*`` are per-micro-batch totals over all stages.
    """

    p: FloatArray
    v: FloatArray
    m: FloatArray
    F: FloatArray
    B: FloatArray
    W: FloatArray
    sum_F: FloatArray
    sum_B: FloatArray
    sum_W: FloatArray
    #: τ: one p2p transfer between stages (one micro-batch, one direction), the mean over the hops
    p2p_s: FloatArray
    #: exposed p2p per steady-state forward+backward pair: the slowest stage's two sends (2τ when
    #: no hop leaves a scale-up domain; :func:`pipeline_p2p_s`) unless PP overlap hides them
    steady_p2p_s: FloatArray


@attrs.frozen(kw_only=True, eq=False)
class PipelineTimes:
    """A schedule's answer. ``busy + bubble + pp_comm`` is the pipeline time; warmup, steady
    and cooldown split the same total by phase."""

    busy_s: FloatArray
    bubble_s: FloatArray
    pp_comm_s: FloatArray
    warmup_s: FloatArray
    steady_s: FloatArray
    cooldown_s: FloatArray

    @property
    def total_s(self) -> FloatArray:
        return self.busy_s + self.bubble_s + self.pp_comm_s


@attrs.frozen(kw_only=True, eq=False)
class Inflight:
    """Micro-batches' worth of one stage's activations held at peak by the first, the
    worst middle and the last stage. A mirrored schedule (``PipelineSchedule.mirrored``) also says
    what the same GPU holds of its mirrored stage's activations: the GPU of the first stage holds
    ``mirror_first`` micro-batches of the last stage's, the last's ``mirror_last`` of the first's,
    a middle one ``mirror_mid`` of another middle stage's (0, the default, for other schedules)."""

    first: FloatArray
    mid: FloatArray
    last: FloatArray
    mirror_first: FloatArray | float = 0.0
    mirror_mid: FloatArray | float = 0.0
    mirror_last: FloatArray | float = 0.0


@attrs.frozen(kw_only=True, eq=False)
class OptimizerCosts:
    """Per-step DP communication and the optimizer update (eq. [13])."""

    dp_comm_s: FloatArray
    dp_exposed_s: FloatArray
    update_s: FloatArray
    host_s: FloatArray  #: exposed host transfers + CPU update (CPU optimizer)
    #: gradient bytes reduced per step (dense / expert parameter groups)
    dense_grad_bytes: FloatArray
    expert_grad_bytes: FloatArray


@attrs.frozen(kw_only=True, eq=False)
class MemoryCosts:
    """Bytes per GPU on the first, worst middle and last stage: arrays of shape (3, N)."""

    dense_params: np.ndarray
    expert_params: np.ndarray
    weights_bytes: np.ndarray
    grads_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    activations_bytes: np.ndarray
    #: features' own buffers (gathered FSDP layers, ZeRO buckets, ...), held beside the activations
    buffers_bytes: np.ndarray
    #: the loss's working set at its peak: the logits and their fp32 copies (`logits_loss_bytes`)
    logits_bytes: np.ndarray
    #: the working set of the layer being recomputed at the start of its backward
    working_bytes: np.ndarray
    host_bytes: np.ndarray

    @property
    def transient_bytes(self) -> np.ndarray:
        """The loss and a recomputed layer's working set never coexist: the larger counts."""
        return np.maximum(self.logits_bytes, self.working_bytes)

    @property
    def gpu_bytes(self) -> np.ndarray:
        """Bytes the caching allocator holds at the stage's peak (the runtime's own memory apart)."""
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes
                + self.buffers_bytes + self.transient_bytes)


@attrs.frozen(kw_only=True, eq=False)
class Context:
    """What transforms may use besides the state: the model, hardware and pricing hooks."""

    model: ModelSpec
    hardware: HardwareProfile
    geometry: Geometry
    pm: object
    #: ``(first_rows, inverse)`` when rows share structures (see :func:`evaluate`)
    structure: tuple[np.ndarray, np.ndarray] | None = None

    def collective_s(self, coll: Coll, per_structure: bool = False) -> FloatArray:
        """Seconds for `coll` (once) on every row, priced by the collective provider.

        ``per_structure=True`` promises that the collective's sizes depend only on the
        structure (parallel sizes, batch shape), not on feature options: it is then priced
        once per structure and expanded, as the engine prices layers.
        """
        if per_structure and self.structure is not None:
            first, inverse = self.structure
            pick = lambda x: x[first] if np.ndim(x) else x  # noqa: E731
            sub = Coll(name=coll.name, parallel=coll.parallel, kind=pick(coll.kind), bytes=pick(coll.bytes),
                       group_size=pick(coll.group_size), stride=pick(coll.stride), count=coll.count,
                       passes=coll.passes)
            sub_ctx = attrs.evolve(self, geometry=_take_geometry(self.geometry, first), structure=None)
            return price_collectives(sub_ctx, [sub])[0][inverse]
        return price_collectives(self, [coll])[0]

    def group_nodes(self, group_size, stride) -> FloatArray:
        return nodes_spanned(group_size, stride, self.hardware.scaleup_domain_gpus)

    def per_structure(self, fn):
        """``fn(ctx)`` computed once per structure and repeated to every row: for values that
        depend only on the structure (parallel sizes, batch shape, precision — the geometry), not
        on feature options, such as a layer's operator FLOPs or a collective's time. `fn` returns
        an array over rows, or a tuple/list/mapping of them."""
        if self.structure is None:
            return fn(self)
        first, inverse = self.structure
        out = fn(attrs.evolve(self, geometry=_take_geometry(self.geometry, first), structure=None))
        if isinstance(out, (tuple, list)):
            return type(out)(_expand(np.asarray(x), inverse) if np.ndim(x) else x for x in out)
        return _expand(out, inverse)


def _take_geometry(g: Geometry, rows: np.ndarray) -> Geometry:
    if isinstance(g, _Taken) and "_src" in g.__dict__:  # rows of a lazily taken one: from its source
        g, rows = g.__dict__["_src"], g.__dict__["_inverse"][rows]
    return attrs.evolve(g, **{f.name: getattr(g, f.name)[rows] if np.ndim(getattr(g, f.name)) else getattr(g, f.name)
                              for f in attrs.fields(Geometry)})


@attrs.frozen(kw_only=True, eq=False)
class CostState:
    """Everything the engine knows about a batch, phase by phase."""

    batch: CandidateBatch
    ctx: Context
    layers: Mapping[str, LayerCosts]
    #: layers of each type on the first / worst middle / last stage
    layout: StageLayout | None = None
    pipe: PipelineInputs | None = None
    opt: OptimizerCosts | None = None
    mem: MemoryCosts | None = None


# ====================================================================== pricing


def nodes_spanned(group_size, stride, domain: int) -> FloatArray:
    """Scale-up domains a group of `group_size` ranks `stride` apart spans (Megatron layout)."""
    n = np.asarray(group_size, dtype=np.float64)
    st = np.asarray(stride, dtype=np.float64)
    span = n * st
    return np.where(span <= domain, 1.0, np.where(st >= domain, n, np.ceil(span / domain)))


def _checked(name: str, out, n: int) -> FloatArray:
    problem = invariants.answer_problem(out, n)
    if problem:
        raise PluginResultError(f"{name} returned {problem}")
    return np.asarray(out, dtype=np.float64)


def _stacked(xs, n: int, dtype=np.float64) -> np.ndarray:
    """Per-op values (arrays of length n, or scalars) laid end to end, read-only."""
    out = np.empty(len(xs) * n, dtype=dtype)
    for i, x in enumerate(xs):
        out[i * n:(i + 1) * n] = x
    out.setflags(write=False)
    return out


def price_operators(ctx: Context, ops: list[Op]) -> list[FloatArray]:
    if not ops:
        return []
    n = len(ctx.geometry.b)
    cat = lambda xs: _stacked(xs, n)  # noqa: E731
    batch = OperatorBatch(
        flops=cat([o.flops if o.priced_flops is None else o.priced_flops for o in ops]),
        bytes=cat([o.bytes for o in ops]),
        kind=_stacked([o.kind for o in ops], n, np.int64),
        precision=_stacked([ctx.geometry.precision] * len(ops), n, np.int64),
        gemm_m=cat([o.m for o in ops]), gemm_n=cat([o.n for o in ops]), gemm_k=cat([o.k for o in ops]),
        count=cat([o.count for o in ops]), kernels=cat([o.kernels for o in ops]),
        attention_kernel=_stacked([ctx.geometry.kernel] * len(ops), n, np.int64),
    )
    out = invariants.provider_result(ctx.pm, "mofa_operator_latency", len(batch), ops=batch, hardware=ctx.hardware)
    return list(out.reshape(len(ops), n))


def price_collectives(ctx: Context, colls: list[Coll]) -> list[FloatArray]:
    """Seconds per collective (one occurrence; multiply by ``count`` yourself). Rows that share a
    structure and every input of every collective are priced once (see :func:`_per_structure_rows`)."""
    if not colls:
        return []
    n = len(ctx.geometry.b)
    cat = lambda xs: _stacked(xs, n)  # noqa: E731
    size = cat([c.group_size for c in colls])
    cols = {"kind": cat([c.kind for c in colls]).astype(np.int64), "bytes": cat([c.bytes for c in colls]),
            "group_size": size.astype(np.int64),
            "nodes": nodes_spanned(size, cat([c.stride for c in colls]),
                                   ctx.hardware.scaleup_domain_gpus).astype(np.int64)}
    rows = _per_structure_rows(ctx, cols, len(colls), n)
    if rows is not None:  # the inputs repeat per structure: price the structures' rows, then repeat
        first, inverse = rows
        cols = {k: v[first] for k, v in cols.items()}
    out = _memo_prices(ctx, cols)
    if rows is not None:
        out = np.asarray(out, dtype=np.float64)[inverse]
    out = np.where(size > 1, out, 0.0)
    return list(out.reshape(len(colls), n))


#: at most this many rows are looked up in the price memo one by one (a structure's collectives)
_MEMO_ROWS = 256
#: (hardware, collective providers) -> (the hardware, the providers, {row's inputs: seconds})
_COLLECTIVE_MEMO: dict[tuple, tuple] = {}


def _memo_prices(ctx: Context, cols: Mapping[str, np.ndarray]) -> FloatArray:
    """The collective provider's seconds for the rows `cols`, each distinct row asked once per
    process: the tuner prices the same structures' collectives chunk after chunk, and a provider
    prices rows independently (kind, bytes, group size, nodes → seconds), so a row seen before
    takes its earlier answer, bit for bit. Large batches (rows that vary per candidate) go to the
    provider directly, each run of equal consecutive rows asked once (:func:`_runs_of`)."""
    n = len(cols["kind"])
    if n > _MEMO_ROWS:
        heads, run = _runs_of(cols)
        if len(heads) < n:
            sub = {k: v[heads] for k, v in cols.items()}
            return _memo_prices(ctx, sub)[run] if len(heads) <= _MEMO_ROWS else \
                invariants.provider_result(ctx.pm, "mofa_collective_latency", len(heads),
                                           colls=CollectiveBatch(**sub), hardware=ctx.hardware)[run]
        return invariants.provider_result(ctx.pm, "mofa_collective_latency", n, colls=CollectiveBatch(**cols),
                                          hardware=ctx.hardware)
    impls = tuple(ctx.pm.hook.mofa_collective_latency.get_hookimpls())
    key = (id(ctx.hardware), tuple(map(id, impls)))
    hit = _COLLECTIVE_MEMO.get(key)
    if hit is None:
        if len(_COLLECTIVE_MEMO) > 64:
            _COLLECTIVE_MEMO.clear()
        hit = _COLLECTIVE_MEMO[key] = (ctx.hardware, impls, {})  # holding them keeps their ids theirs
    table = hit[2]
    if len(table) > 1_000_000:
        table.clear()
    keys = list(zip(*(cols[k].tolist() for k in ("kind", "bytes", "group_size", "nodes"))))
    got = [table.get(k) for k in keys]
    miss = [i for i, v in enumerate(got) if v is None]
    if miss:
        idx = np.array(miss)
        new = invariants.provider_result(ctx.pm, "mofa_collective_latency", len(idx),
                                         colls=CollectiveBatch(**{k: v[idx] for k, v in cols.items()}),
                                         hardware=ctx.hardware)
        for i, v in zip(miss, new.tolist()):
            got[i] = table[keys[i]] = v
    return np.array(got, dtype=np.float64)


def _runs_of(cols: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each run of rows equal in every column of `cols`, each row's run): the
    tuner's batches are sorted by structure, so a collective's inputs repeat row after row."""
    n = len(next(iter(cols.values())))
    starts = np.zeros(n, bool)
    starts[0] = True
    for v in cols.values():
        starts[1:] |= v[1:] != v[:-1]
    return np.flatnonzero(starts), np.cumsum(starts) - 1


def _per_structure_rows(ctx: Context, cols: Mapping[str, np.ndarray], k: int, n: int):
    """When every one of `cols` (k collectives × n rows, end to end) equals its value on its
    structure's first row: (the flat rows to price, where each flat row takes its price from);
    else None. Providers price rows independently, so the prices are the same either way."""
    if ctx.structure is None or n < 2:
        return None
    first, inverse = ctx.structure
    if len(first) * 2 > n:  # few rows share a structure: checking would cost more than it saves
        return None
    offset = (np.arange(k) * n)[:, None]
    rep = (first[inverse][None, :] + offset).ravel()  # each flat row's structure's first row
    if not all(np.array_equal(v, v[rep]) for v in cols.values()):
        return None
    sub = (first[None, :] + offset).ravel()
    back = (inverse[None, :] + (np.arange(k) * len(first))[:, None]).ravel()
    return sub, back


# ====================================================================== layer phase


def _layer_costs(ctx: Context, kind: str) -> LayerCosts:
    model, g = ctx.model, ctx.geometry
    ops = layer_operators(model, g, kind)
    times = price_operators(ctx, ops)
    z = np.zeros_like(g.b)
    fwd = sum(times, z)
    bwd_in = sum((t * o.bwd_input for t, o in zip(times, ops)), z)
    bwd_w = sum((t * o.bwd_weight for t, o in zip(times, ops)), z)

    def grp(*groups):
        sel = [(t, o) for t, o in zip(times, ops) if o.group in groups]
        return (sum((t for t, _ in sel), z), sum((t * (o.bwd_input + o.bwd_weight) for t, o in sel), z))

    tp_f, tp_b = grp("qkv", "proj", "mlp")
    at_f, at_b = grp("core_attn")
    ex_f, ex_b = grp("expert")
    qkv_f, _ = grp("qkv", "core_attn")
    colls = layer_collectives(model, g, kind)
    ctimes = price_collectives(ctx, colls)
    comm = {(p, d): z.copy() for p in ("tp", "cp", "ep") for d in ("fwd", "bwd")}
    for c, t in zip(colls, ctimes):
        for d in ("fwd", "bwd"):
            if d in c.passes:
                comm[(c.parallel, d)] = comm[(c.parallel, d)] + t * c.count
    act = saved_activation_bytes(model, g, kind)
    flops = sum((np.asarray(o.flops, dtype=np.float64) for o in ops), z)
    return LayerCosts(
        fwd_compute_s=fwd, bwd_input_s=bwd_in, bwd_weight_s=bwd_w, recompute_s=z,
        tp_gemm_fwd_s=tp_f, tp_gemm_bwd_s=tp_b, attn_fwd_s=at_f, attn_bwd_s=at_b, expert_fwd_s=ex_f,
        expert_bwd_s=ex_b, qkv_attn_fwd_s=qkv_f,
        tp_fwd_s=comm[("tp", "fwd")], tp_bwd_s=comm[("tp", "bwd")], cp_fwd_s=comm[("cp", "fwd")],
        cp_bwd_s=comm[("cp", "bwd")], ep_fwd_s=comm[("ep", "fwd")], ep_bwd_s=comm[("ep", "bwd")],
        tp_exposed_fwd_s=comm[("tp", "fwd")], tp_exposed_bwd_s=comm[("tp", "bwd")],
        cp_exposed_fwd_s=comm[("cp", "fwd")], cp_exposed_bwd_s=comm[("cp", "bwd")],
        ep_exposed_fwd_s=comm[("ep", "fwd")], ep_exposed_bwd_s=comm[("ep", "bwd")],
        offload_exposed_fwd_s=z, offload_exposed_bwd_s=z,
        dp_fwd_s=z, dp_bwd_s=z, dp_exposed_fwd_s=z, dp_exposed_bwd_s=z,
        act_layer_input_bytes=act.layer_input, act_core_attn_bytes=act.core_attention, act_other_bytes=act.other,
        act_saved_bytes=act.total, act_working_bytes=recurrent_state_bytes(model, g, kind),
        act_gemm_input_scale=z + 1.0, fwd_flops=flops,
        recompute_flops=z,
    )


# ====================================================================== stage placement


@attrs.frozen(kw_only=True, eq=False)
class StageLayout:
    """Layers on the first, the worst middle and the last stage: per kind of layer (``counts``,
    keyed as ``ModelSpec.block_kinds``) and in total; arrays of shape (3, N)."""

    counts: Mapping[str, np.ndarray]
    total: np.ndarray  # layers per stage (first, mid, last)

    def of(self, kind: str) -> np.ndarray:
        """Layers of `kind` per stage (zeros for a kind the model lacks)."""
        out = self.counts.get(kind)
        return np.zeros_like(self.total) if out is None else out


def stage_layout(model: ModelSpec, batch: CandidateBatch) -> StageLayout:
    """Place layers on stages. Balanced by default; `first/last_stage_layers` override the
    end stages (Llama 3: 126 layers on PP 16 as 7 + 14×8 + 7); the middle stages share the
    rest equally. Layers keep their order in the stack (:func:`kinds_on_stages`)."""
    total = stage_sizes(model, batch)
    kinds = model.block_kinds
    if len(kinds) == 1:
        return StageLayout(counts={next(iter(kinds)): total}, total=total)
    counts = kinds_on_stages(model, batch, total)
    return StageLayout(counts=dict(zip(kinds, counts)), total=total)


def stage_sizes(model: ModelSpec, batch: CandidateBatch) -> np.ndarray:
    """Layers on the first, each middle and the last stage, (3, N)."""
    L = model.num_layers
    p = batch.pp.astype(np.float64)
    first_given = batch.first_stage_layers.astype(np.float64)
    last_given = batch.last_stage_layers.astype(np.float64)
    base = np.ceil(L / p)
    deficit = base * p - L  # when L is not a multiple of p the end stages take fewer
    auto_first = base - np.ceil(deficit / 2.0)
    auto_last = base - np.floor(deficit / 2.0)
    first = np.where(first_given > 0, first_given, np.where(p > 1, auto_first, L))
    last = np.where(last_given > 0, last_given, np.where(p > 1, auto_last, L))
    mid_stages = np.maximum(p - 2.0, 1.0)
    rest = L - first - last
    mid = np.where(p > 2, np.ceil(rest / mid_stages), np.where(p > 1, 0.0, L))
    last = np.where(p > 1, last, L)
    return np.stack([first, mid, last])


def kind_weights(model: ModelSpec, seq: np.ndarray) -> np.ndarray:
    """Forward FLOPs per token of one layer of each kind (K, len(seq)), unsharded, fused causal
    attention: what ranks middle stages of a mixed stack by their work."""
    s = np.asarray(seq, dtype=np.float64)
    key = ("kind_weights", s.tobytes())
    if key not in model.derived:
        g = Geometry.unit(s, flash=True)
        out = np.zeros((len(model.block_kinds), len(s)))
        for i, kind in enumerate(model.block_kinds):
            for op in layer_operators(model, g, kind):
                out[i] += np.asarray(op.flops, dtype=np.float64) / s
        model.derived[key] = out
    return model.derived[key]


def kinds_on_stages(model: ModelSpec, batch: CandidateBatch, total: np.ndarray) -> np.ndarray:
    """Layers of each kind on the first, the worst middle and the last stage, (K, 3, N).

    The stack is cut in order. With v virtual chunks (Megatron-Core's interleaved placement) it
    is cut into v rows of chunks, one chunk per stage in each row; a stage of n layers has chunks
    of ⌊n/v⌋ layers, the first ``n mod v`` one layer more (uneven end stages included). So every
    stage holds exactly its layers and the stages tile the stack. The worst middle stage is the
    one with the most forward FLOPs (:func:`kind_weights`), the earliest on a tie. Computed once
    per distinct (pp, vpp, stage sizes, sequence length).
    """
    L = model.num_layers
    kinds = list(model.block_kinds)
    index = np.array([kinds.index(k) for k in model.layer_kinds])
    prefix = np.zeros((len(kinds), L + 1))
    prefix[:, 1:] = np.cumsum(np.eye(len(kinds))[index].T, axis=1)
    cols = [batch.pp, batch.vpp, total[0], total[1], total[2], batch.sequence_length]
    rows, inverse = distinct_rows(np.stack([np.asarray(c, dtype=np.int64) for c in cols], axis=1))
    p, v, first, mid, last, seq = (np.asarray(c, dtype=np.int64)[rows] for c in cols)
    mid_n = np.maximum(p - 2, 0)
    j = np.arange(max(int(p.max()) - 2, 1))[:, None]  # middle stages 1..p−2 as 0..p−3, (J, 1)

    def take(lo, n):  # (K, ...) layers of each kind in [lo, lo + n), clipped to the stack
        lo = np.clip(lo, 0, L)
        return prefix[:, np.clip(lo + n, lo, L)] - prefix[:, lo]

    first_k = last_k = 0.0
    mids = np.zeros((len(kinds), len(j), len(p)))
    start = np.zeros_like(p)  # first layer of the current row of chunks
    for c in range(int(v.max())):
        on = c < v
        f_c, m_c, l_c = (np.where(on, n // v + (c < n % v), 0) for n in (first, mid, last))
        m_c = np.where(p > 2, m_c, 0)
        first_k = first_k + take(start, f_c)
        mids = mids + take(start + f_c + j * m_c, np.broadcast_to(m_c, (len(j), len(p))))
        last_k = last_k + take(start + f_c + mid_n * m_c, np.where(p > 1, l_c, 0))
        start = start + f_c + mid_n * m_c + np.where(p > 1, l_c, 0)
    work = np.einsum("kju,ku->ju", mids, kind_weights(model, seq))
    worst = np.argmax(np.where(j < p - 2, work, -np.inf), axis=0)
    mid_k = np.take_along_axis(mids, worst[None, None, :], axis=1)[:, 0, :]
    mid_k = np.where(p > 2, mid_k, np.where(p > 1, 0.0, first_k))
    last_k = np.where(p > 1, last_k, first_k)
    return np.stack([first_k, mid_k, last_k], axis=1).take(inverse.ravel(), axis=-1)


def stages_hold_layers(model: ModelSpec, batch: CandidateBatch, sizes: np.ndarray | None = None) -> BoolArray:
    """Every layer on exactly one stage and every stage holding at least one (p = 2: the two end
    stages; p = 1: the only one, so explicit end-stage sizes must be the whole model there) —
    what any placement needs, even one whose chunks are uneven. `sizes`: :func:`stage_sizes`, if
    the caller has it."""
    p = batch.pp
    first, mid, last = stage_sizes(model, batch) if sizes is None else sizes
    placed = np.where(p > 2, first + last + mid * (p - 2), np.where(p == 2, first + last, first))
    exact = placed == model.num_layers
    exact &= (p > 1) | (((batch.first_stage_layers == 0) | (batch.first_stage_layers == model.num_layers))
                        & ((batch.last_stage_layers == 0) | (batch.last_stage_layers == model.num_layers)))
    return exact & (first >= 1) & (last >= 1) & np.where(p > 2, mid >= 1, True) & (p <= model.num_layers)


def layers_per_stage_valid(model: ModelSpec, batch: CandidateBatch, sizes: np.ndarray | None = None,
                           held: BoolArray | None = None) -> BoolArray:
    """:func:`stages_hold_layers` (`held`, if the caller has it) and every stage splitting into its
    virtual chunks."""
    p = batch.pp
    sizes = stage_sizes(model, batch) if sizes is None else sizes
    first, mid, last = sizes
    v = batch.vpp
    # the middle stages split into v equal chunks; explicitly uneven end stages may split unevenly
    # (Megatron-Core --pipeline-model-parallel-layout), balanced ones must split equally too
    explicit = (batch.first_stage_layers > 0) | (batch.last_stage_layers > 0)
    chunks_ok = (np.mod(mid, v) == 0) | (p <= 2)
    chunks_ok &= explicit | np.where(p > 1, (np.mod(first, v) == 0) & (np.mod(last, v) == 0), np.mod(first, v) == 0)
    chunks_ok &= (first >= v) & (last >= v) & np.where(p > 2, mid >= v, True)  # every stage holds a layer
    return (stages_hold_layers(model, batch, sizes) if held is None else held) & chunks_ok


# ====================================================================== the engine


@attrs.frozen(kw_only=True, eq=False)
class Prediction:
    """Results for a batch: arrays of length N, plus per-component breakdowns."""

    batch: CandidateBatch
    model: ModelSpec
    hardware: HardwareProfile
    step_time_s: FloatArray
    tokens_per_s_per_gpu: FloatArray
    model_tflops_per_gpu: FloatArray
    hardware_tflops_per_gpu: FloatArray
    #: model FLOPs (hardware FLOPs: + recompute) per second per GPU over the peak of the fastest
    #: numeric format the row's GEMMs run in (:func:`mfu_precision`)
    mfu: FloatArray
    hfu: FloatArray
    #: that format, an index into :data:`~mofa_framework.batch.PRECISIONS`
    mfu_precision: IntArray
    #: MFU against the bf16 peak (as fp8 runs are often quoted); equals `mfu` for bf16 rows
    mfu_bf16_peak: FloatArray
    peak_memory_bytes: FloatArray
    #: the peak fits the GPU's HBM and the host memory (the most any stage's offload features put
    #: there) fits the node's CPU memory per GPU (``HardwareProfile.host_bytes_per_gpu``)
    fits_in_memory: BoolArray
    #: seconds per component, summing to step_time_s
    breakdown: Mapping[str, FloatArray]
    #: bytes per component on the worst stage (GPU); `host` is on the CPU and not in the peak
    memory_breakdown: Mapping[str, FloatArray]
    #: seconds per pipeline phase on the critical stage
    phases: Mapping[str, FloatArray]
    #: which plugin produced each breakdown component
    provenance: Mapping[str, str]
    state: CostState
    #: (3, N) seconds per micro-batch of each component per pass (``compute_fwd``, ``tp_fwd``,
    #: ``tp_bwd``, …) on the first / worst middle / last stage, before the fwd and bwd merge
    stage_parts: Mapping[str, np.ndarray] = attrs.field(factory=dict)
    #: (3, N) communication overlap features hid, per micro-batch (``tp_fwd``, ``cp_bwd``, …)
    stage_hidden_comm: Mapping[str, np.ndarray] = attrs.field(factory=dict)
    #: (N,) the stage row (0 first, 1 middle, 2 last) whose times the schedule was given
    critical_stage: np.ndarray | None = None
    #: (3, N) GPU bytes (incl. reserved) per stage; NaN where the stage does not exist
    stage_memory_bytes: np.ndarray | None = None
    #: (N,) host bytes per GPU on the stage that offloads the most (0 without offload features)
    host_memory_bytes: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.step_time_s)

    @property
    def peak_memory_gib(self) -> FloatArray:
        return self.peak_memory_bytes / GIB


def _merge(mask: np.ndarray, new, old, full: bool = False, made: list | None = None):
    """Rows where `mask` is off keep `old`, bit for bit; recurse through attrs and dicts. `full`
    says that `mask` is on in every row: an array that ``np.where`` would return unchanged (same
    shape and dtype) is kept as it is instead of copied. Every array of the result that is not
    `old`'s goes to `made` (None for a part `old` lacked: check all of it), for the invariants."""
    if new is old or new is None:
        return new  # untouched (transforms evolve what they change and keep the rest)
    if old is None:
        if made is not None:
            made.append(None)
        return new
    if isinstance(old, np.ndarray) or isinstance(new, np.ndarray):
        new = np.asarray(new)
        if new.dtype.kind == "f" and new.dtype != np.float64:
            new = new.astype(np.float64)
        if not (full and isinstance(old, np.ndarray) and new.dtype == np.result_type(new, old)
                and np.broadcast_shapes(mask.shape, new.shape, old.shape) == new.shape):
            new = np.where(mask, new, old)
        if made is not None:
            made.append(new)
        return new
    if isinstance(old, Mapping):
        return {k: _merge(mask, new[k], old[k], full, made) for k in old}
    if attrs.has(type(old)):
        return type(old)(**{a: _merge(mask, getattr(new, k), getattr(old, k), full, made)
                            for k, a in _init_fields(type(old))})
    return new


def _all_sane(arrays: list) -> bool:
    """Whether every float array of `arrays` is finite and ≥ 0 (None: not known, so no)."""
    for a in arrays:
        if a is None:
            return False
        if a.dtype.kind == "f" and a.size and not (a.min() >= 0 and a.max() < np.inf):  # NaN fails min() >= 0
            return False
    return True


@functools.cache
def _init_fields(cls) -> tuple[tuple[str, str], ...]:
    """(attribute, ``__init__`` argument) of an attrs class's init fields: rebuilding with every
    one given is what ``attrs.evolve`` does, without looking the fields up on every call."""
    return tuple((f.name, f.alias) for f in attrs.fields(cls) if f.init)


_PHASE_FIELD = {Phase.layer: "layers", Phase.pipeline: "pipe", Phase.optimizer: "opt", Phase.memory: "mem"}


#: a feature on at most this share of the rows is applied to those rows alone (:func:`_on_rows`), per
#: state field its phase changes, in a batch of at least :data:`_SUBSET_ROWS` rows (below, taking the
#: rows costs about what it saves: a search's batches). Measured break-even: a layer transform evolves
#: every one of a layer's ~37 cost arrays, so taking and merging them back pays only on few rows; the
#: optimizer and memory phases change a few arrays of a state mostly repeated from shared groups
_SUBSET_SHARE = {"layers": 0.1, "pipe": 0.1, "opt": 0.45, "mem": 0.45}
_SUBSET_ROWS = 4096


def _apply_phase(state: CostState, registry, phase: Phase, trail: dict) -> CostState:
    field = _PHASE_FIELD[phase]
    for feat in registry.features_in_phase(phase):
        rows = state.batch.feature(feat.name)
        if not rows.enabled.any():
            continue
        made: list = []
        try:
            merged = _on_rows(state, feat.acts_in(phase), feat.name, rows, field, made)
            if merged is _WHOLE:
                new = feat.acts_in(phase)(state, rows)
        except Exception as exc:  # noqa: BLE001
            plugin = registry.provided_by.get(("features", feat.name), feat.name)
            raise PluginError(f"feature {feat.name!r} (plugin {plugin!r}) failed in its {phase.value} transform: "
                              f"{type(exc).__name__}: {exc}") from exc
        mask = rows.enabled if field != "mem" else rows.enabled[None, :]
        try:
            if merged is _WHOLE:
                merged = _merge(mask, getattr(new, field), getattr(state, field), bool(rows.enabled.all()), made)
        except Exception as exc:  # noqa: BLE001 - a malformed answer (a missing field, a wrong shape)
            plugin = registry.provided_by.get(("features", feat.name), feat.name)
            raise PluginResultError(f"plugin {plugin!r}: feature {feat.name!r}'s {phase.value} transform returned a "
                                    f"malformed state: {type(exc).__name__}: {exc}") from exc
        if not _all_sane(made):  # the arrays the transform changed; the check names the culprits
            invariants.check_transform(feat.name, registry.provided_by.get(("features", feat.name), feat.name),
                                       phase.value, merged, getattr(state, field))
        state = attrs.evolve(state, **{field: merged})
        trail.setdefault(phase.value, []).append(feat.name)
    return state


#: :func:`_on_rows`'s answer when the transform is to run on the whole state instead
_WHOLE = object()


def _on_rows(state: CostState, fn, name: str, rows: FeatureRows, field: str, made: list):
    """A feature's transform `fn` run on the rows where the feature is on alone, its `field` merged
    back (every other row keeps the state's, bit for bit, as :func:`_merge` keeps it); :data:`_WHOLE`
    when the feature is on in more than :data:`_SUBSET_SHARE` of the rows (taking them would cost
    more than it saves), the batch is small, or the answer cannot be merged row by row. Transforms compute each row from
    that row alone (the engine's premise, as in pricing per structure), so the rows' numbers are the
    same either way; a search's leaves turn on ZeRO, FSDP or an offload on a few rows each."""
    n = len(rows.enabled)
    on = np.flatnonzero(rows.enabled)
    if n < _SUBSET_ROWS or len(on) > _SUBSET_SHARE[field] * n:
        return _WHOLE
    sub = _state_rows(state, on)
    new = fn(sub, sub.batch.feature(name))
    try:
        return _scatter(on, n, getattr(new, field), getattr(sub, field), getattr(state, field), made)
    except Exception:  # noqa: BLE001 - unmergeable or malformed: the whole state's run says which
        made.clear()
        return _WHOLE


class _Unmergeable(Exception):
    """A transform's answer that is not rows of the state's (:func:`_scatter`)."""


def _scatter(on: np.ndarray, n: int, new, sub, old, made: list):
    """`old` with rows `on` replaced by `new`, a transform's answer on the state `sub` of those rows:
    what ``_merge(enabled, new on every row, old)`` gives (a part the transform kept, ``new is sub``,
    stays `old`; rows on the last axis; the dtype ``np.where`` would give). Changed arrays go to
    `made`."""
    if new is sub or new is None:
        return old
    if isinstance(old, np.ndarray) or isinstance(new, np.ndarray):
        new = np.asarray(new)
        if new.dtype.kind == "f" and new.dtype != np.float64:
            new = new.astype(np.float64)
        rows_ok = not new.ndim or new.shape[-1] in (1, len(on))
        if not isinstance(old, np.ndarray) or old.shape[-1:] != (n,) or not rows_ok:
            raise _Unmergeable
        shape = np.broadcast_shapes(old.shape, new.shape[:-1] + (n,) if new.ndim else (n,))
        out = np.empty(shape, np.result_type(new, old))
        out[...] = old
        out[..., on] = new
        made.append(out)
        return out
    if isinstance(old, Mapping):
        return {k: _scatter(on, n, new[k], sub[k], old[k], made) for k in old}
    if attrs.has(type(old)) and attrs.has(type(new)):
        return type(old)(**{a: _scatter(on, n, getattr(new, k), getattr(sub, k), getattr(old, k), made)
                            for k, a in _init_fields(type(old))})
    raise _Unmergeable


def _state_rows(state: CostState, idx: np.ndarray) -> CostState:
    """`state` at rows `idx`: every per-row value taken when first read (:func:`_taken`), the
    structures renumbered for those rows."""
    ctx = state.ctx
    ctx = attrs.evolve(ctx, geometry=_taken(ctx.geometry, idx), structure=_rows_structure(ctx.structure, idx))
    lay = state.layout
    if lay is not None:  # its totals and each kind's counts taken when read too
        counts = lay.counts
        lay = _taken(lay, idx)
        object.__setattr__(lay, "counts", _Expanded(counts, idx))
    some = lambda x: None if x is None else _taken(x, idx)  # noqa: E731
    return CostState(batch=_taken_batch(state.batch, idx), ctx=ctx,
                     layers={k: _taken(c, idx) for k, c in state.layers.items()}, layout=lay,
                     pipe=some(state.pipe), opt=some(state.opt), mem=some(state.mem))


def _rows_structure(structure, idx: np.ndarray):
    """``(first, inverse)`` structures of rows `idx` of a batch whose structures are `structure`
    (any row of a structure stands for it: they share what is priced per structure)."""
    if structure is None:
        return None
    first, inverse = structure
    of = inverse[idx]
    seen = np.zeros(len(first), bool)
    seen[of] = True
    ids = np.cumsum(seen) - 1
    sub_inv = ids[of]
    sub_first = np.empty(int(ids[-1]) + 1, np.int64)
    sub_first[sub_inv] = np.arange(len(idx))
    return sub_first, sub_inv


class _Taken:
    """Mixin of a value object whose rows are another's rows ``inverse`` (:func:`_expand`), each field
    taken on first read: a search repeats per-structure and per-node results to every leaf, whose
    finish reads a few of their fields (a layer's activation bytes and recompute FLOPs; a pipeline's
    micro-batch counts and chunk times, not its sums or p2p times), so the others are never
    repeated. A transform that evolves one gets a whole object (``attrs.evolve`` reads every field)."""

    def __getattr__(self, name: str):
        if name.startswith("_") or "_src" not in self.__dict__:
            # a whole object of the lazy class (``attrs.evolve`` of a lazy one): its class's own
            # lookup (attrs' cached properties on slotted classes), if it has one
            fallback = getattr(super(), "__getattr__", None)
            if fallback is None:
                raise AttributeError(name)
            return fallback(name)
        src, inverse = self.__dict__["_src"], self.__dict__["_inverse"]
        value = getattr(src, name)
        if isinstance(value, np.ndarray) and value.ndim:
            value = value.take(inverse, axis=-1)
        object.__setattr__(self, name, value)
        return value


#: the lazily taken subclass of each value class read that way (:func:`_taken`)
_TAKEN_CLASSES: dict[type, type] = {}


def _taken(obj, inverse: np.ndarray):
    """`obj` (a :class:`LayerCosts` or :class:`PipelineInputs`) at rows ``inverse``, its fields taken
    on first read (:class:`_Taken`)."""
    if isinstance(obj, _Taken) and "_src" in obj.__dict__:  # rows of rows: one index, one source
        obj, inverse = obj.__dict__["_src"], obj.__dict__["_inverse"][inverse]
    cls = getattr(type(obj), "_taken_base", type(obj))  # an evolved lazy object is whole: its class's base
    lazy = _TAKEN_CLASSES.get(cls)
    if lazy is None:
        lazy = _TAKEN_CLASSES[cls] = type(f"_Taken{cls.__name__}", (_Taken, cls), {"_taken_base": cls})
    out = object.__new__(lazy)
    out.__dict__.update(_src=obj, _inverse=inverse)
    return out


def _taken_batch(batch: CandidateBatch, idx: np.ndarray) -> CandidateBatch:
    """Rows `idx` of `batch`, each field and each feature's flags and options taken when first read."""
    out = _taken(batch, idx)
    object.__setattr__(out, "features", {k: _taken_feature(r, idx) for k, r in batch.features.items()})
    return out


def _taken_feature(rows: FeatureRows, idx: np.ndarray) -> FeatureRows:
    out = _taken(rows, idx)
    opts = rows.options
    if isinstance(opts, _TakenOptions):  # rows of rows: one index, one source
        opts = _TakenOptions(opts._src, opts._inverse[idx])
    else:
        opts = opts.take(idx) if isinstance(opts, GatheredOptions) else _TakenOptions(opts, idx)
    object.__setattr__(out, "options", opts)
    object.__setattr__(out, "choices", rows.choices)
    return out


class _Expanded(Mapping):
    """A mapping of per-structure (or per-group) values repeated to the batch's rows ``inverse``
    (:func:`_expand`), each when first read."""

    def __init__(self, src: Mapping, inverse: np.ndarray):
        self._src, self._inverse, self._got = src, inverse, {}

    def __getitem__(self, key: str):
        if key not in self._got:
            self._got[key] = _expand(self._src[key], self._inverse)
        return self._got[key]

    def __contains__(self, key) -> bool:
        return key in self._src

    def __iter__(self):
        return iter(self._src)

    def __len__(self) -> int:
        return len(self._src)

    def __repr__(self) -> str:
        return repr(dict(self))


class _TakenOptions(_Expanded):
    """A feature's options at rows `idx`, each taken when first read, read-only as a
    :class:`~mofa_framework.batch.FeatureRows`' options are."""

    def __getitem__(self, key: str) -> np.ndarray:
        got = super().__getitem__(key)
        if isinstance(got, np.ndarray):
            got.setflags(write=False)
        return got


def _expand(obj, inverse: np.ndarray):
    """Rows of per-structure results, repeated to the batch's rows (last axis)."""
    if isinstance(obj, np.ndarray):
        return obj.take(inverse, axis=-1)  # as obj[..., inverse], several times faster
    if isinstance(obj, (LayerCosts, PipelineInputs)):
        return _taken(obj, inverse)
    if isinstance(obj, Mapping):
        return {k: _expand(v, inverse) for k, v in obj.items()}
    if attrs.has(type(obj)):
        fields = _init_fields(type(obj))
        values = [getattr(obj, k) for k, _ in fields]
        flat = _stacked_take(values, inverse)
        return type(obj)(**{a: flat[i] if i in flat else _expand(v, inverse)
                            for i, ((_, a), v) in enumerate(zip(fields, values))})
    return obj


def _stacked_take(values: list, inverse: np.ndarray) -> dict[int, np.ndarray]:
    """The 1-D float64 arrays of `values` of one length, repeated to the rows in one gather: {index:
    row of the result}. Fewer than four such arrays are left to :func:`_expand` one by one."""
    idx = [i for i, v in enumerate(values) if isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype == np.float64]
    if len(idx) < 4 or len({len(values[i]) for i in idx}) != 1:
        return {}
    taken = np.stack([values[i] for i in idx]).take(inverse, axis=1)
    return dict(zip(idx, taken))


#: below this many rows a batch is priced row by row (finding its distinct geometries costs more)
_GEOMETRY_ROWS = 64


def _geometry_rows(g: Geometry) -> tuple[np.ndarray, np.ndarray] | None:
    """(first row, inverse) of the distinct rows of `g`, or None when fewer than half repeat. Layer,
    embedding, head and p2p costs are functions of a row's geometry alone (the providers price
    rows independently), so rows that differ only in what the geometry leaves out — pp, vpp,
    the schedule, the end stages, features — are priced once: a tuner's structures share a few
    geometries each."""
    n = len(g.b)
    if n < _GEOMETRY_ROWS:
        return None
    key = np.zeros(n, np.int64)
    for f in attrs.fields(Geometry):
        col = getattr(g, f.name)
        if np.ndim(col):
            values, inv = np.unique(col, return_inverse=True)
            key = np.unique(key * len(values) + inv.reshape(-1), return_inverse=True)[1].reshape(-1)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return (first, inverse.reshape(-1)) if 2 * len(first) <= n else None


def _priced(ctx: Context, batch: CandidateBatch, layers_only: bool = False) -> dict:
    """Everything the providers price: layer costs, embedding/head, p2p τ, DP and the update
    (only the layer costs with `layers_only`); what depends on the geometry alone is priced once
    per distinct geometry (:func:`_geometry_rows`)."""
    model = ctx.model
    by_geometry = attrs.evolve(ctx, structure=_geometry_rows(ctx.geometry))
    out: dict = {"layers": by_geometry.per_structure(lambda c: {k: _layer_costs(c, k) for k in model.block_kinds}),
                 "layout": stage_layout(model, batch)}
    if layers_only:
        return out
    out.update(by_geometry.per_structure(_end_costs))
    out["tau"], out["tau_steady"] = pipeline_p2p_s(out["tau"], out.pop("tau_cross"), batch.pp, ctx)
    out["opt"] = _optimizer_costs(ctx, batch, out["layout"])
    return out


def _end_costs(ctx: Context) -> dict[str, np.ndarray]:
    """The embedding's and the output head's times and one micro-batch's pipeline p2p (τ)."""
    model, g = ctx.model, ctx.geometry
    z = np.zeros(len(g.b))
    out = {}
    emb_ops, head_ops = embedding_operators(model, g), head_operators(model, g)
    et = price_operators(ctx, emb_ops + head_ops)
    emb_t, head_t = et[: len(emb_ops)], et[len(emb_ops):]
    out["emb_f"] = sum(emb_t, z)
    out["emb_b"] = sum((t * o.bwd_input for t, o in zip(emb_t, emb_ops)), z)
    out["head_f"] = sum(head_t, z)
    out["head_bi"] = sum((t * o.bwd_input for t, o in zip(head_t, head_ops)), z)
    out["head_bw"] = sum((t * o.bwd_weight for t, o in zip(head_t, head_ops)), z)
    hc = head_collectives(model, g)
    out["head_comm"] = sum((t * c.count for t, c in zip(price_collectives(ctx, hc), hc)), z)
    # pipeline p2p: one micro-batch's boundary activation; Megatron sends 1/t of it either way
    # (sequence-parallel shard, or --scatter-gather-tensors-in-pipeline without SP)
    pp_coll = Coll(name="pp_p2p", parallel="pp", kind=4, bytes=g.tokens * model.hidden_size * g.dt / g.t,
                   group_size=np.full(len(z), 2.0), stride=g.t * g.c * g.dp)
    out["tau"] = price_collectives(ctx, [pp_coll])[0]
    cross = attrs.evolve(pp_coll, stride=np.maximum(pp_coll.stride, ctx.hardware.scaleup_domain_gpus))
    out["tau_cross"] = price_collectives(ctx, [cross])[0]
    return out


def pipeline_p2p_s(near: FloatArray, cross: FloatArray, pp, ctx: Context) -> tuple[FloatArray, FloatArray]:
    """(τ, the steady pair's p2p): one warmup or cooldown hop on average, and a steady 1F1B pair's two.

    `near` prices a hop between neighbouring stages (their ranks ``s = t·c·dp`` apart), `cross` the
    same hop between two scale-up domains. A pipeline whose p stages span ``N`` domains crosses
    one at ``N − 1`` of its ``p − 1`` hops (every hop when a domain holds one stage): the warmup
    and cooldown chains pass each hop once, so τ is their mean. In the steady phase each stage
    sends one activation forward and one gradient back per pair and the stages run in lock-step,
    so the pair costs what the slowest stage sends: a stage beside a crossing sends across it one
    way and inside its domain the other (``near + cross``), both ways across when its domain holds
    it alone (``2·cross``). With blocking sends this matches the simulator
    (``tests/test_pipeline_p2p.py``).
    """
    g = ctx.geometry
    p = np.asarray(pp, dtype=np.float64)
    stride, domain = g.t * g.c * g.dp, ctx.hardware.scaleup_domain_gpus
    hops = np.maximum(p - 1.0, 1.0)
    crossings = np.minimum(nodes_spanned(p, stride, domain) - 1.0, hops)
    mean = near + (cross - near) * crossings / hops
    pair = np.where(crossings == 0, 2.0 * near, np.where(2.0 * stride > domain, 2.0 * cross, near + cross))
    return np.where(p > 1, mean, 0.0), np.where(p > 1, pair, 0.0)


def price_structures(batch: CandidateBatch, model: ModelSpec, hardware: HardwareProfile, pm) -> dict:
    """Everything the providers price, for rows that are each a structure: reuse it with
    ``shared=(priced, row_structure)`` in :func:`layer_phase` / :func:`pipeline_phase`."""
    return _priced(Context(model=model, hardware=hardware, geometry=Geometry.of(batch), pm=pm), batch)


def _expand_layout(lay: StageLayout, inverse: np.ndarray) -> StageLayout:
    """A per-structure layout repeated to the batch's rows (a one-kind stack's counts are its
    totals: expanded once)."""
    total = lay.total.take(inverse, axis=1)
    return StageLayout(counts={k: total if c is lay.total else c.take(inverse, axis=1) for k, c in lay.counts.items()},
                       total=total)


def layer_phase(batch: CandidateBatch, model: ModelSpec, hardware: HardwareProfile, pm,
                structure: tuple[np.ndarray, np.ndarray] | None = None, trail: dict | None = None,
                layers_only: bool = False, shared: tuple[Mapping, np.ndarray] | None = None) -> tuple[CostState, dict]:
    """The state after the layer phase (priced layer costs, stage layout, layer-phase features)
    and everything else the providers priced once per structure (see :func:`evaluate`).

    With `layers_only` nothing but the layer costs is priced (the tuner's bounds need no more).
    `shared` = ``(price_structures(...) of some structures, each row's index among them)`` reuses
    that pricing instead of pricing again.
    """
    ctx = Context(model=model, hardware=hardware, geometry=Geometry.of(batch), pm=pm, structure=structure)
    inverse = None
    if shared is not None:
        priced, inverse = shared
        if layers_only:
            priced = {"layers": priced["layers"], "layout": priced["layout"]}
    elif structure is None:
        priced = _priced(ctx, batch, layers_only)
    else:
        first, inverse = structure
        sub = _taken_batch(batch, first)  # pricing reads a few fields (a lazily taken batch's from its source)
        priced = _priced(attrs.evolve(ctx, geometry=Geometry.of(sub), structure=None), sub, layers_only)
    priced = dict(priced)
    lay = priced.pop("layout")
    if inverse is not None:  # priced per structure: repeated to the batch's rows
        priced, lay = _expand(priced, inverse), _expand_layout(lay, inverse)
    state = CostState(batch=batch, ctx=ctx, layers=priced["layers"], layout=lay)
    return _apply_phase(state, pm.registry, Phase.layer, {} if trail is None else trail), priced


def stage_picker(stage: np.ndarray):
    """``pick(a)``: each row's value on its stage `stage` (0 first, 1 middle, 2 last) of a (3, N)
    per-stage array — ``np.take_along_axis(a, stage[None, :], axis=0)[0]`` as one gather of the flat
    array, its index computed once for the many arrays picked on the same stages."""
    n = len(stage)
    flat = np.asarray(stage, dtype=np.intp) * n + np.arange(n)

    def pick(a):
        a = np.asarray(a)
        if a.shape != (3, n):
            return np.take_along_axis(a, np.asarray(stage)[None, :], axis=0)[0]
        return a.reshape(-1).take(flat)

    return pick


def stages_present(batch: CandidateBatch) -> BoolArray:
    """(3, N): whether the first, a middle and a last stage exist (p > 2 has middle stages, p > 1 a last)."""
    return np.stack([np.ones(len(batch), bool), batch.pp > 2, batch.pp > 1])


def _stage_components(state: CostState, priced: Mapping) -> dict[str, np.ndarray]:
    """(3, N) per-micro-batch time of each component on the first / worst middle / last stage.

    Affine in the layer costs: the stage's layers of each type times their costs, plus the
    embedding (first stage), head and MTP modules (last stage) and the per-chunk host time.
    """
    batch, model, hardware, lay = state.batch, state.ctx.model, state.ctx.hardware, state.layout
    n = len(batch)
    emb_f, emb_b = priced["emb_f"], priced["emb_b"]
    head_f, head_bi, head_bw, head_comm = priced["head_f"], priced["head_bi"], priced["head_bw"], priced["head_comm"]
    frozen = frozen_weight_rows(batch, state.ctx.pm.registry)
    if frozen.any():  # a frozen embedding has no backward at all (its backward is its weight gradient)
        emb_b, head_bw = np.where(frozen, 0.0, emb_b), np.where(frozen, 0.0, head_bw)
    L = state.layers
    mtp = float(model.num_mtp_layers)
    getters = {
        "compute_fwd": lambda c: c.fwd_compute_s, "compute_bwd_input": lambda c: c.bwd_input_s,
        "compute_bwd_weight": lambda c: c.bwd_weight_s, "recompute": lambda c: c.recompute_s,
        "tp_fwd": lambda c: c.tp_exposed_fwd_s, "tp_bwd": lambda c: c.tp_exposed_bwd_s,
        "cp_fwd": lambda c: c.cp_exposed_fwd_s, "cp_bwd": lambda c: c.cp_exposed_bwd_s,
        "ep_fwd": lambda c: c.ep_exposed_fwd_s, "ep_bwd": lambda c: c.ep_exposed_bwd_s,
        "offload_fwd": lambda c: c.offload_exposed_fwd_s, "offload_bwd": lambda c: c.offload_exposed_bwd_s,
        "dp_layer_fwd": lambda c: c.dp_exposed_fwd_s, "dp_layer_bwd": lambda c: c.dp_exposed_bwd_s,
        # what overlap features hid (total − exposed): not paid by the step, drawn by the trace
        "hidden_tp_fwd": lambda c: c.tp_fwd_s - c.tp_exposed_fwd_s,
        "hidden_tp_bwd": lambda c: c.tp_bwd_s - c.tp_exposed_bwd_s,
        "hidden_cp_fwd": lambda c: c.cp_fwd_s - c.cp_exposed_fwd_s,
        "hidden_cp_bwd": lambda c: c.cp_bwd_s - c.cp_exposed_bwd_s,
        "hidden_ep_fwd": lambda c: c.ep_fwd_s - c.ep_exposed_fwd_s,
        "hidden_ep_bwd": lambda c: c.ep_bwd_s - c.ep_exposed_bwd_s,
        "hidden_dp_layer_fwd": lambda c: c.dp_fwd_s - c.dp_exposed_fwd_s,
        "hidden_dp_layer_bwd": lambda c: c.dp_bwd_s - c.dp_exposed_bwd_s,
    }
    # (3, N) per-micro-batch time of each component on the first / worst middle / last stage
    comp = {k: _on_stages(lay, L, get) for k, get in getters.items()}
    # the embedding sits on the first stage; the head (and DeepSeek's MTP modules, each a
    # layer plus a head) on the last — on the only stage when pp == 1
    mtp_layers = model.mtp_kind_counts  # each module's layers, run num_mtp_layers times
    ends = {"first": {"compute_fwd": emb_f, "compute_bwd_input": emb_b},
            "last": {k: sum((mtp * n * get(L[kind]) for kind, n in mtp_layers.items()), 0.0)
                     for k, get in getters.items()}}
    last = ends["last"]
    last["compute_fwd"] = last["compute_fwd"] + (1 + mtp) * head_f
    last["compute_bwd_input"] = last["compute_bwd_input"] + (1 + mtp) * head_bi
    last["compute_bwd_weight"] = last["compute_bwd_weight"] + (1 + mtp) * head_bw
    last["tp_fwd"] = last["tp_fwd"] + (1 + mtp) * head_comm
    last["tp_bwd"] = last["tp_bwd"] + (1 + mtp) * head_comm
    single = batch.pp == 1
    for k in comp:
        comp[k][0] += ends["first"].get(k, 0.0) + np.where(single, last.get(k, 0.0), 0.0)
        comp[k][2] += np.where(single, 0.0, last.get(k, 0.0))
    # the training loop's host time on every stage: once per micro-batch (whatever the number of
    # model chunks it is spread over), plus once per micro-batch and chunk
    eff = hardware.efficiency
    per_mb = eff.microbatch_overhead_s + eff.chunk_overhead_s * batch.vpp.astype(np.float64)
    comp["microbatch_overhead"] = np.broadcast_to(per_mb, (3, n)).copy()
    return _mirror_work(comp, mirrored_rows(state.ctx.pm.registry, batch))


def _mirror_work(comp: dict[str, np.ndarray], mirrored: BoolArray) -> dict[str, np.ndarray]:
    """On a mirrored schedule's rows each end GPU runs half its micro-batches through the first
    stage and half through the last: its work per micro-batch is their mean (a middle GPU's, two
    middle stages', the worst middle's)."""
    rows = np.flatnonzero(mirrored)
    for v in comp.values():  # each (3, N) array is this call's own (built by _stage_components)
        ends = 0.5 * (v[0, rows] + v[2, rows])
        v[0, rows] = ends
        v[2, rows] = ends
    return comp


def layer_work_s(c: LayerCosts) -> FloatArray:
    """A layer's forward + backward-input + backward-weight time per micro-batch (F + B + W)."""
    return c.fwd_s + c.bwd_input_total_s + c.bwd_weight_s


def busy_terms(state: CostState, priced: Mapping) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per stage, the layers of each type and the work that is not in layers: ``(counts, const)``,
    each (3, N), such that a stage's work per micro-batch is ``Σ_k counts[k]·layer_work_s(c_k) + const``
    for any layer costs ``c_k`` on the same rows (the stage sums are affine in the layer costs, so
    probing them with zero and unit layers recovers the coefficients exactly). The critical stage's
    busy time per step is then ``m·max`` of that over the stages present (:func:`stages_present`).
    """
    zero = {k: LayerCosts(**{f.name: np.zeros(len(state.batch)) for f in attrs.fields(LayerCosts)})
            for k in state.layers}
    work = lambda layers: sum(v for k, v in _stage_components(attrs.evolve(state, layers=layers), priced).items()  # noqa: E731
                              if not k.startswith("hidden_"))  # what overlaps hid is not work
    const = work(zero)
    counts = {k: work({**zero, k: attrs.evolve(zero[k], fwd_compute_s=np.ones(len(state.batch)))}) - const
              for k in state.layers}
    return counts, const


@attrs.frozen(kw_only=True, eq=False)
class Pipelined:
    """The engine through the pipeline schedules: what the optimizer and memory phases build on."""

    state: CostState
    priced: Mapping
    #: (3, N) per-micro-batch time of each component per stage (see :func:`_stage_components`)
    comp: Mapping[str, np.ndarray]
    times: PipelineTimes
    inflight: Inflight
    #: the critical stage of each row: 0 first, 1 worst middle, 2 last
    crit: np.ndarray
    #: per pass, before the fwd and bwd merge, and what overlaps hid (see :class:`Prediction`)
    stage_parts: Mapping[str, np.ndarray] = attrs.field(factory=dict)
    hidden: Mapping[str, np.ndarray] = attrs.field(factory=dict)


def pipeline_phase(batch: CandidateBatch, model: ModelSpec, hardware: HardwareProfile, pm,
                   structure: tuple[np.ndarray, np.ndarray] | None = None, trail: dict | None = None,
                   shared: tuple[Mapping, np.ndarray] | None = None,
                   layer_key: tuple[np.ndarray, np.ndarray] | None = None, lean: bool = False) -> Pipelined:
    """The layer phase, the stages, the pipeline phase and each row's schedule (see :func:`evaluate`).

    `layer_key` = ``(first_rows, inverse)`` says that rows share their structure and the setting of
    every feature acting in the layer phase with row ``first_rows[inverse[i]]``: everything up to
    the pipeline-phase features (layer costs, stage sums, the schedule's inputs) is computed once
    per key and repeated; results are identical either way. Without one, :func:`layer_rows` looks for
    such rows (a flat batch of structures × feature settings has many), and the pipeline phase and the
    schedules then run once per :func:`pipeline_rows` group. With `lean` the per-component stage
    times are left out (as in :func:`expand_pipelined`).
    """
    registry = pm.registry
    trail = {} if trail is None else trail
    if layer_key is None:  # find the rows that share the layer phase ourselves (a flat batch's many)
        layer_key = layer_rows(batch, registry)
    if layer_key is None:
        state, priced = layer_phase(batch, model, hardware, pm, structure, trail, shared=shared)
        staged = _staged(state, priced)
    else:
        return _shared_pipeline(batch, model, hardware, pm, structure, trail, shared, layer_key, lean)
    comp, hidden, stage_parts, pipe, crit = staged
    state = attrs.evolve(state, pipe=pipe)
    state = _apply_phase(state, registry, Phase.pipeline, trail)
    times, inflight = run_schedules(state, registry)
    return Pipelined(state=state, priced=priced, comp=comp, times=times, inflight=inflight, crit=crit,
                     stage_parts=stage_parts, hidden=hidden)


def _shared_pipeline(batch, model, hardware, pm, structure, trail, shared, layer_key, lean) -> Pipelined:
    """:func:`pipeline_phase` with a `layer_key`: the layer phase and the stage sums once per layer
    group; the pipeline phase and the schedules once per pipeline group (:func:`pipeline_rows`: a
    layer group and one setting of the pipeline-phase features), both repeated to the rows."""
    registry = pm.registry
    first, inv = layer_key
    sub = _taken_batch(batch, first)  # the layer phase reads a few of the batch's features
    sub_shared = None if shared is None else (shared[0], np.asarray(shared[1])[first])
    st, priced = layer_phase(sub, model, hardware, pm, _rows_structure(structure, first), trail, shared=sub_shared)
    comp, hidden, stage_parts, pipe, crit = _staged(st, priced)
    ctx = Context(model=model, hardware=hardware, geometry=Geometry.of(batch), pm=pm, structure=structure)
    groups = pipeline_rows(batch, registry, inv, len(first))
    if groups is None:  # every row its own pipeline: the pipeline phase on all of them
        p_first, p_inv, at = None, None, inv
        p_state = CostState(batch=batch, ctx=ctx, layers=_expand(st.layers, inv), layout=_expand_layout(st.layout, inv),
                            pipe=_expand(pipe, inv))
    else:
        p_first, p_inv = groups
        at = inv[p_first]  # each pipeline group's layer group
        p_ctx = attrs.evolve(ctx, geometry=_taken(ctx.geometry, p_first), structure=_rows_structure(structure, p_first))
        p_state = CostState(batch=_taken_batch(batch, p_first), ctx=p_ctx, layers=_expand(st.layers, at),
                            layout=_expand_layout(st.layout, at), pipe=_expand(pipe, at))
    p_state = _apply_phase(p_state, registry, Phase.pipeline, trail)
    times, inflight = run_schedules(p_state, registry)
    state = p_state
    if p_inv is not None:
        state = CostState(batch=batch, ctx=ctx, layers=_expand(st.layers, inv), layout=_expand_layout(st.layout, inv),
                          pipe=_taken(p_state.pipe, p_inv))
        times, inflight = _expand(times, p_inv), _expand(inflight, p_inv)
    # repeated to the rows when read: a prediction's per-stage parts are read by a trace, not by finish
    parts = (lambda d: {}) if lean else (lambda d: _Expanded(d, inv))  # noqa: E731
    priced = {"opt": _expand(priced["opt"], inv)} if lean else _Expanded(priced, inv)
    return Pipelined(state=state, priced=priced, comp=parts(comp), times=times, inflight=inflight, crit=crit[inv],
                     stage_parts=parts(stage_parts), hidden=parts(hidden))


def _critical_picks(comp: Mapping, crit: np.ndarray, pick) -> dict[str, FloatArray]:
    """Each component of `comp` ((3, N) per stage) on each row's critical stage `crit`: on the
    groups' rows before they are repeated when `comp` is :class:`_Expanded` (the rows of a group
    share their stage times and critical stage), else with `pick` (:func:`stage_picker` of `crit`)."""
    if not isinstance(comp, _Expanded):
        return {k: pick(a) for k, a in comp.items()}
    src, inverse = comp._src, comp._inverse
    crit_src = np.zeros(len(next(iter(src.values()))[0]) if src else 0, crit.dtype)
    crit_src[inverse] = crit
    pick_src = stage_picker(crit_src)
    return {k: pick_src(a).take(inverse) for k, a in src.items()}


def _staged(state: CostState, priced: Mapping) -> tuple[dict, dict, dict, PipelineInputs, np.ndarray]:
    """After the layer phase: (per-component stage times, what overlaps hid, the per-pass parts,
    the schedule's inputs, the critical stage of each row)."""
    batch = state.batch
    comp = _stage_components(state, priced)
    hidden = {k.removeprefix("hidden_"): comp.pop(k) for k in [k for k in comp if k.startswith("hidden_")]}
    stage_parts = dict(comp)  # per pass, before fwd and bwd merge: what the trace lays out
    F = (comp["compute_fwd"] + comp["tp_fwd"] + comp["cp_fwd"] + comp["ep_fwd"] + comp["offload_fwd"]
         + comp["dp_layer_fwd"] + comp["microbatch_overhead"])
    B = (comp["compute_bwd_input"] + comp["recompute"] + comp["tp_bwd"] + comp["cp_bwd"] + comp["ep_bwd"]
         + comp["offload_bwd"] + comp["dp_layer_bwd"])
    W = comp["compute_bwd_weight"]
    for name in ("tp", "cp", "ep", "offload", "dp_layer"):
        key = name if name == "offload" else f"{name}_comm"
        comp[key] = comp.pop(f"{name}_fwd") + comp.pop(f"{name}_bwd")
    p = batch.pp.astype(np.float64)
    v = batch.vpp.astype(np.float64)
    m = batch.num_microbatches.astype(np.float64)
    work = F + B + W
    # the middle row stands for p−2 stages; with p == 2 there is no middle stage, p == 1 one stage
    mid_count = np.maximum(p - 2.0, 0.0)
    exists = stages_present(batch)
    crit = np.argmax(np.where(exists, work, -np.inf), axis=0)
    pick = stage_picker(crit)
    total_of = lambda arr: np.where(p > 1, arr[0] + arr[2] + mid_count * arr[1], arr[0])  # noqa: E731

    tau = priced["tau"]
    pipe = PipelineInputs(p=p, v=v, m=m, F=pick(F) / v, B=pick(B) / v, W=pick(W) / v, sum_F=total_of(F),
                          sum_B=total_of(B), sum_W=total_of(W), p2p_s=tau, steady_p2p_s=priced["tau_steady"])
    return comp, hidden, stage_parts, pipe, crit


def evaluate(batch: CandidateBatch, model: ModelSpec, hardware: HardwareProfile, pm,
             structure: tuple[np.ndarray, np.ndarray] | None = None, check: bool = True) -> Prediction:
    """Cost every row of `batch` for `model` on `hardware` with the plugins of `pm`.

    `structure` = ``(first_rows, inverse)`` says that rows share everything the providers
    price (parallel sizes, batch shape, precision) with row ``first_rows[inverse[i]]``, so
    operators and collectives are priced once per structure (the tuner's case: one
    structure × many feature combinations). Results are identical either way.

    Every row's outputs are checked against :mod:`~mofa_framework.invariants` (finite, ≥ 0,
    additive, MFU within the peak, layers conserved); a violation raises an InvariantError naming
    the plugin at fault. ``check=False`` skips that (the diagnosis re-evaluates with it off).
    """
    trail: dict[str, list[str]] = {}
    return finish(pipeline_phase(batch, model, hardware, pm, structure, trail), trail, check=check)


@attrs.frozen(kw_only=True, eq=False)
class Outcome:
    """What :func:`finish` computes with ``lean=True``: the numbers a search ranks by."""

    batch: CandidateBatch
    step_time_s: FloatArray
    peak_memory_bytes: FloatArray
    #: as :attr:`Prediction.fits_in_memory`: HBM and host memory
    fits_in_memory: BoolArray


def expand_pipelined(pl: Pipelined, parent: np.ndarray, batch: CandidateBatch,
                     structure: tuple[np.ndarray, np.ndarray] | None = None, lean: bool = False) -> Pipelined:
    """`pl` for the rows of `batch`, row i taking parent row ``parent[i]``: rows that differ
    only in features acting after the pipeline phase (optimizer, memory) share everything
    up to it. `structure` maps the new rows to their structures (see :func:`evaluate`). With
    `lean` the per-component stage times are left out (``finish(..., lean=True)`` needs none)."""
    state = pl.state
    ctx = attrs.evolve(state.ctx, geometry=_take_geometry(state.ctx.geometry, parent), structure=structure)
    state = attrs.evolve(state, batch=batch, ctx=ctx, layers=_expand(state.layers, parent),
                         layout=_expand(state.layout, parent), pipe=_expand(state.pipe, parent))
    parts = (lambda d: {}) if lean else (lambda d: _expand(d, parent))  # noqa: E731
    return Pipelined(state=state, priced={"opt": _expand(pl.priced["opt"], parent)}, comp=parts(pl.comp),
                     times=_expand(pl.times, parent), inflight=_expand(pl.inflight, parent), crit=pl.crit[parent],
                     stage_parts=parts(pl.stage_parts), hidden=parts(pl.hidden))


def step_overhead_s(model: ModelSpec, hardware: HardwareProfile) -> float:
    """The fixed host time of one step: ``step_overhead_s``, plus ``moe_step_overhead_s`` for a
    model with MoE layers."""
    eff = hardware.efficiency
    return eff.step_overhead_s + (eff.moe_step_overhead_s if model.is_moe else 0.0)


def _optimizer_and_memory(pl: Pipelined, trail: dict) -> CostState:
    """The optimizer and memory levels of :func:`finish`: the state with ``opt`` and ``mem``."""
    state, registry = pl.state, pl.state.ctx.pm.registry
    state = attrs.evolve(state, opt=pl.priced["opt"])
    state = _apply_phase(state, registry, Phase.optimizer, trail)
    state = attrs.evolve(state, mem=_memory_costs(state, state.layout, pl.inflight))
    return _apply_phase(state, registry, Phase.memory, trail)


#: ``MemoryCosts`` fields by memory component (:data:`~mofa_framework.types.MEMORY_COMPONENTS`)
MEMORY_FIELDS = {"weights": "weights_bytes", "gradients": "grads_bytes", "optimizer_states": "optimizer_bytes",
                 "activations": "activations_bytes", "buffers": "buffers_bytes", "logits_loss": "logits_bytes",
                 "recompute_working": "working_bytes", "host": "host_bytes"}


def memory_floor(pl: Pipelined, alternatives) -> tuple[FloatArray, FloatArray]:
    """(GPU bytes, host bytes) per alternative and row, arrays (alternatives, rows): the rows'
    memory with the search's leaf features off, then each alternative's memory-lowering features
    applied to it (:func:`_with_memory_features`). An alternative is a tuple of (feature, its rows:
    on, one option setting), in the order the engine applies them. Rows are a search's nodes; each
    of their leaves peaks at least at the alternative that turns on its memory-lowering features
    with its options (the others change no component downwards), on the stage with the most."""
    state = _optimizer_and_memory(pl, {})
    exists = stages_present(pl.state.batch)
    reserved = pl.state.ctx.hardware.reserved_memory_bytes
    gpu, host = [], []
    for alt in alternatives:
        mem = _with_memory_features(state, alt).mem
        gpu.append(np.where(exists, mem.gpu_bytes + reserved, -np.inf).max(axis=0))
        host.append(np.where(exists, mem.host_bytes, 0.0).max(axis=0))
    return np.stack(gpu), np.stack(host)


def _with_memory_features(state: CostState, alt) -> CostState:
    """`state` with the features of `alt` ((feature, rows) pairs) on and their memory transforms
    applied in turn; a feature with none has the components it declares (``lowers_memory``) taken
    as 0."""
    if not alt:
        return state
    registry = state.ctx.pm.registry
    state = attrs.evolve(state, batch=attrs.evolve(state.batch, features={**state.batch.features,
                                                                          **{f.name: rows for f, rows in alt}}))
    for feat, rows in alt:
        fn = feat.acts_in(Phase.memory)
        if fn is None:
            mem = state.mem
            state = attrs.evolve(state, mem=attrs.evolve(mem, **{
                MEMORY_FIELDS[c]: np.zeros_like(getattr(mem, MEMORY_FIELDS[c])) for c in feat.lowers_memory}))
            continue
        try:
            state = fn(state, rows)
        except Exception as exc:  # noqa: BLE001 - as _apply_phase says it
            plugin = registry.provided_by.get(("features", feat.name), feat.name)
            raise PluginError(f"feature {feat.name!r} (plugin {plugin!r}) failed in its memory transform (the "
                              f"tuner's memory floor): {type(exc).__name__}: {exc}") from exc
    return state


def finish(pl: Pipelined, trail: dict | None = None, lean: bool = False, check: bool = True) -> Prediction | Outcome:
    """The optimizer and memory phases and the results, after :func:`pipeline_phase`. With
    `lean`, only the step time, the peak memory and whether it fits (:class:`Outcome`); `check`
    as in :func:`evaluate` (a lean outcome is not checked: the search re-evaluates what it keeps)."""
    state, comp, times = pl.state, pl.comp, pl.times
    batch, model, hardware, pm = state.batch, state.ctx.model, state.ctx.hardware, state.ctx.pm
    registry = pm.registry
    trail = {} if trail is None else trail
    n = len(batch)
    z = np.zeros(n)
    stage_parts, hidden, crit = pl.stage_parts, pl.hidden, pl.crit
    lay = state.layout
    m = batch.num_microbatches.astype(np.float64)
    exists = stages_present(batch)
    pick = stage_picker(pl.crit)

    state = _optimizer_and_memory(pl, trail)

    # ---- results
    opt, mem = state.opt, state.mem
    overhead = np.full(n, step_overhead_s(model, hardware))
    step = times.total_s + opt.dp_exposed_s + opt.update_s + opt.host_s + overhead
    gpu = mem.gpu_bytes + hardware.reserved_memory_bytes
    gpu = np.where(exists, gpu, -np.inf)
    # the peak stage's memory: its components (memory_breakdown) sum to it
    peak = gpu.max(axis=0)
    # host memory: what the offload features put there, on the stage that puts the most
    host = np.where(exists, mem.host_bytes, 0.0).max(axis=0)
    fits = (peak <= hardware.hbm_bytes) & (host <= hardware.host_bytes_per_gpu)
    if lean:
        return Outcome(batch=batch, step_time_s=step, peak_memory_bytes=peak, fits_in_memory=fits)
    worst = np.argmax(gpu, axis=0)
    wpick = stage_picker(worst)
    mem_bd = memory_breakdown(mem, wpick, np.full(n, hardware.reserved_memory_bytes))
    stage_memory = np.where(exists, mem.gpu_bytes + hardware.reserved_memory_bytes, np.nan)
    mem_bd["host"] = wpick(mem.host_bytes)

    breakdown = {k: m * a for k, a in _critical_picks(comp, pl.crit, pick).items()}
    breakdown["pp_comm"] = times.pp_comm_s
    breakdown["bubble"] = times.bubble_s
    breakdown["dp_comm"] = opt.dp_exposed_s
    breakdown["optimizer"] = opt.update_s
    breakdown["optimizer_host"] = opt.host_s
    breakdown["overhead"] = overhead
    # schedules may reorder work (and so change busy time, e.g. DualPipe); keep the sum exact
    busy_sum = sum((breakdown[k] for k in comp), z)
    breakdown["schedule_adjust"] = times.busy_s - busy_sum

    tokens = batch.global_batch_size * batch.sequence_length
    n_gpus = batch.num_gpus.astype(np.float64)
    model_flops = training_flops_per_step(model, batch, frozen_weight_rows(batch, registry))
    hw_flops = model_flops + recompute_flops_per_step(state, lay)
    mfu_code = mfu_precision(batch, hardware, registry)
    peak_flops = np.array([hardware.peak_flops_per_s(p) for p in PRECISIONS])[mfu_code]
    bf16_peak = hardware.peak_flops_per_s("bf16")
    prov = _provenance(pm, registry, trail)
    pred = Prediction(
        batch=batch, model=model, hardware=hardware, step_time_s=step,
        tokens_per_s_per_gpu=tokens / step / n_gpus,
        model_tflops_per_gpu=model_flops / step / n_gpus / 1e12,
        hardware_tflops_per_gpu=hw_flops / step / n_gpus / 1e12,
        mfu=model_flops / step / n_gpus / peak_flops, hfu=hw_flops / step / n_gpus / peak_flops,
        mfu_precision=mfu_code, mfu_bf16_peak=model_flops / step / n_gpus / bf16_peak,
        peak_memory_bytes=peak, fits_in_memory=fits, host_memory_bytes=host,
        breakdown=breakdown, memory_breakdown=mem_bd,
        phases={"warmup": times.warmup_s, "steady": times.steady_s, "cooldown": times.cooldown_s},
        provenance=prov, state=state, stage_parts=stage_parts, stage_hidden_comm=hidden, critical_stage=crit,
        stage_memory_bytes=stage_memory,
    )
    if check:
        invariants.check_prediction(pred, pm)
    return pred


def frozen_weight_rows(batch: CandidateBatch, registry) -> BoolArray:
    """Rows with a feature on that trains none of the model's own weights
    (:attr:`~mofa_framework.types.Feature.frozen_weights`)."""
    out = np.zeros(len(batch), bool)
    for feat in registry.features.values():
        if feat.frozen_weights:
            out = out | batch.feature(feat.name).enabled
    return out


def training_flops_per_step(model: ModelSpec, batch: CandidateBatch, frozen: BoolArray) -> FloatArray:
    """Model FLOPs of each row's step (:func:`~mofa_framework.decompose.training_flops_per_sequence`
    × the global batch), priced once per (sequence length, document length)."""
    (seq, doc), inv = sequence_shapes(batch)
    per_seq = training_flops_per_sequence(model, seq, doc=doc)[inv]
    if frozen.any():
        per_seq = np.where(frozen, training_flops_per_sequence(model, seq, True, doc)[inv], per_seq)
    return per_seq * batch.global_batch_size


def mfu_precision(batch: CandidateBatch, hardware: HardwareProfile, registry) -> IntArray:
    """Per row, the fastest numeric format its GEMMs run in: the row's precision, or a faster one a
    feature on the row declares (:attr:`~mofa_framework.types.Feature.gemm_precision`). MFU and HFU
    are measured against its peak, so they stay ≤ 1 however the GEMMs are re-priced."""
    peaks = np.array([hardware.peak_flops_per_s(p) for p in PRECISIONS])
    code = np.asarray(batch.precision, dtype=np.int64).copy()
    for feat in registry.features.values():
        if feat.gemm_precision is None:
            continue
        on = batch.feature(feat.name).enabled
        fmt = PRECISIONS.index(feat.gemm_precision)
        code = np.where(on & (peaks[fmt] > peaks[code]), fmt, code)
    return code


def stage_layer_totals(batch: CandidateBatch, per_stage: np.ndarray) -> FloatArray:
    """Σ over all pipeline stages of a (3, N) per-stage quantity: first + (p − 2)·middle + last,
    or the first row alone when p = 1 (one stage)."""
    p = batch.pp.astype(np.float64)
    return np.where(p > 1, per_stage[0] + np.maximum(p - 2.0, 0.0) * per_stage[1] + per_stage[2], per_stage[0])


def recompute_flops_per_step(state: CostState, lay: StageLayout) -> FloatArray:
    """FLOPs re-run by recomputation in one step on all GPUs: each layer kind's per-micro-batch,
    per-GPU recompute FLOPs × its layers over all stages (and the MTP modules on the last) × the
    micro-batches × the GPUs of a stage (t·c·d)."""
    batch, g, model = state.batch, state.ctx.geometry, state.ctx.model
    L = state.layers
    per_mb = sum((np.asarray(L[k].recompute_flops, dtype=np.float64) * stage_layer_totals(batch, lay.of(k)) for k in L),
                 np.zeros(len(batch)))
    for kind, n in model.mtp_kind_counts.items():
        per_mb = per_mb + model.num_mtp_layers * n * np.asarray(L[kind].recompute_flops, dtype=np.float64)
    return per_mb * batch.num_microbatches * g.t * g.c * g.dp


def _on_stages(lay: StageLayout, layers: Mapping[str, LayerCosts], get) -> np.ndarray:
    """(3, N): Σ over kinds of (layers of the kind on each stage) × get(the kind's costs)."""
    out = None
    for kind, count in lay.counts.items():
        if out is None:
            out = count * get(layers[kind])
        else:
            out += count * get(layers[kind])
    return out


def _provenance(pm, registry, trail) -> dict[str, str]:
    def impl(hook):
        impls = [i for i in reversed(getattr(pm.hook, hook).get_hookimpls()) if not (i.wrapper or i.hookwrapper)]
        wrappers = [i.plugin_name for i in getattr(pm.hook, hook).get_hookimpls() if i.wrapper or i.hookwrapper]
        name = impls[0].plugin_name if impls else "?"
        return f"{name} (wrapped by {', '.join(wrappers)})" if wrappers else name

    op, coll = impl("mofa_operator_latency"), impl("mofa_collective_latency")
    prov = {k: op for k in ("compute_fwd", "compute_bwd_input", "compute_bwd_weight", "recompute")}
    prov.update({k: coll for k in ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "dp_layer_comm")})
    prov.update(bubble="schedule", optimizer="engine", optimizer_host="engine", offload="engine",
                overhead="hardware profile", microbatch_overhead="hardware profile", schedule_adjust="schedule")
    for phase, names in trail.items():
        for name in names:
            plugin = registry.provided_by.get(("features", name), name)
            prov[f"features.{phase}.{name}"] = plugin
    return prov


def run_schedules(state: CostState, registry) -> tuple[PipelineTimes, Inflight]:
    """Ask each row's schedule for its pipeline time and in-flight micro-batches."""
    batch, pipe = state.batch, state.pipe
    n = len(batch)
    out = {f.name: np.zeros(n) for f in attrs.fields(PipelineTimes)}
    inf = {f.name: np.zeros(n) for f in attrs.fields(Inflight)}
    names = list(registry.schedules)
    for code in np.unique(batch.schedule):
        if not 0 <= code < len(names):
            raise PluginError(f"schedule code {code} is not registered (is its plugin disabled?)")
        sched = registry.schedules[names[code]]
        who = f"plugin {registry.provided_by.get(('schedules', sched.name), sched.name)!r}: schedule {sched.name!r}"
        idx = np.flatnonzero(batch.schedule == code)
        sub = PipelineInputs(**{f.name: getattr(pipe, f.name)[idx] for f in attrs.fields(PipelineInputs)})
        try:
            t = sched.time(sub)
            fl = sched.inflight(sub)
        except Exception as exc:  # noqa: BLE001
            raise PluginError(f"{who} failed: {type(exc).__name__}: {exc}") from exc
        for f in attrs.fields(PipelineTimes):
            out[f.name][idx] = _checked(f"{who}: {f.name}", getattr(t, f.name, None), len(idx))
        for f in attrs.fields(Inflight):
            value = getattr(fl, f.name, None)
            if isinstance(value, (int, float)):  # one number for every row (the mirror_* defaults)
                value = np.full(len(idx), float(value))
            inf[f.name][idx] = _checked(f"{who}: inflight.{f.name}", value, len(idx))
    return PipelineTimes(**out), Inflight(**inf)


def _dp_groups(ctx: Context, batch: CandidateBatch):
    """(size, stride) of the dense and expert gradient-reduction groups."""
    g = ctx.geometry
    dense = (g.dp * g.c, g.t)  # Megatron reduces dense grads over DP×CP
    expert = (g.t * g.c * g.dp / (g.e * g.etp), g.e * g.etp)
    return dense, expert


def dp_param_groups(ctx: Context, batch: CandidateBatch, dense, expert):
    """(label, parameters, group size, stride) of the `dense` and the `expert` parameters (per row),
    each with the data-parallel group it is reduced (or sharded) over (:func:`_dp_groups`); a kind no
    row holds any of — a dense model's experts — is left out: its collectives would cost nothing."""
    (d_size, d_stride), (e_size, e_stride) = _dp_groups(ctx, batch)
    for label, params, size, stride in (("dense", dense, d_size, d_stride), ("expert", expert, e_size, e_stride)):
        if np.any(np.asarray(params) > 0):
            yield label, params, size, stride


def _params_on_stages(model: ModelSpec, batch: CandidateBatch, lay: StageLayout):
    """Dense (TP-sharded + replicated) and expert parameters each GPU holds, per stage (3, N)."""
    g_t = batch.tp.astype(np.float64)
    ep = batch.ep * batch.etp
    per = {k: layer_params(model, k) for k in lay.counts}
    dense = expert = None
    for kind, count in lay.counts.items():
        d = count * (per[kind]["sharded"] / g_t + per[kind]["replicated"])
        dense = d if dense is None else dense + d
        if per[kind]["expert"]:
            e = count * (per[kind]["expert"] / ep)
            expert = e if expert is None else expert + e
    expert = np.zeros_like(dense) if expert is None else expert
    emb = model.vocab_size * model.hidden_size / g_t
    p = batch.pp
    dense[0] += emb  # input embedding
    # output layer on the last stage (tied embeddings keep a second copy when pp > 1)
    head = np.where(p > 1, emb, 0.0 if model.tied_embeddings else emb)
    dense[2] += head
    mtp_dense = mtp_expert = 0.0
    if model.num_mtp_layers:  # the MTP modules' weights (one set when they share them), on the last stage
        mp, copies = mtp_module_params(model), model.mtp_param_copies
        mtp_dense = copies * (mp["sharded"] / g_t + mp["replicated"])
        mtp_expert = copies * mp["expert"] / ep
        dense[2] += mtp_dense
        expert[2] += mtp_expert
    single = p == 1  # the only stage holds the head and the MTP modules too
    dense[0] = np.where(single, dense[0] + head + mtp_dense, dense[0])
    expert[0] = np.where(single, expert[0] + mtp_expert, expert[0])
    return dense, expert


def params_on_stages(state: CostState) -> tuple[np.ndarray, np.ndarray]:
    """(dense, expert) parameters each GPU holds per stage, (3, N): :func:`_params_on_stages` of the
    state's rows (its batch and layout), both stages' on a mirrored schedule's GPUs (:func:`per_gpu`);
    computed once per structure when rows share structures (``ctx.structure``: a search's leaves)."""
    ctx, batch, lay = state.ctx, state.batch, state.layout
    if ctx.structure is None:
        return _gpu_params(ctx, batch, lay)
    first, inverse = ctx.structure
    sizes = SimpleNamespace(**{k: getattr(batch, k)[first] for k in ("tp", "ep", "etp", "pp", "schedule")})
    sub = StageLayout(counts={k: v[:, first] for k, v in lay.counts.items()}, total=lay.total[:, first])
    dense, expert = _gpu_params(ctx, sizes, sub)
    return dense.take(inverse, axis=1), expert.take(inverse, axis=1)


def _gpu_params(ctx: Context, batch, lay: StageLayout) -> tuple[np.ndarray, np.ndarray]:
    dense, expert = _params_on_stages(ctx.model, batch, lay)
    mirrored = mirrored_rows(ctx.pm.registry, batch)
    return per_gpu(dense, mirrored), per_gpu(expert, mirrored)


def _grad_bytes_per_param(batch: CandidateBatch) -> FloatArray:
    """Megatron accumulates bf16 gradients in fp32 main-grad buffers; fp16 keeps fp16 grads."""
    return np.where(batch.precision == PRECISIONS.index("fp16"), 2.0, 4.0)


def _optimizer_costs(ctx: Context, batch: CandidateBatch, lay: StageLayout) -> OptimizerCosts:
    dense, expert = _gpu_params(ctx, batch, lay)
    gb = _grad_bytes_per_param(batch)
    (d_size, d_stride), (e_size, e_stride) = _dp_groups(ctx, batch)
    # the busiest stage sets the step (stages reduce concurrently)
    stage_total = dense + expert
    worst = np.argmax(stage_total, axis=0)
    pick = stage_picker(worst)
    dp_dense, dp_expert = pick(dense), pick(expert)
    colls = [Coll(name="dp_grad_ar", parallel="dp", kind=ALL_REDUCE, bytes=dp_dense * gb, group_size=d_size,
                  stride=d_stride),
             Coll(name="dp_expert_grad_ar", parallel="dp", kind=ALL_REDUCE, bytes=dp_expert * gb, group_size=e_size,
                  stride=e_stride)]
    t_dense, t_expert = price_collectives(ctx, colls)
    comm = t_dense + t_expert
    update = (dp_dense + dp_expert) * ADAM_BYTES_PER_PARAM / (
        ctx.hardware.efficiency.memory_efficiency * ctx.hardware.hbm_bandwidth_bytes_per_s)
    z = np.zeros_like(comm)
    return OptimizerCosts(dp_comm_s=comm, dp_exposed_s=comm, update_s=update, host_s=z,
                          dense_grad_bytes=dp_dense * gb, expert_grad_bytes=dp_expert * gb)


def _with_mtp_activations(act_stage, model: ModelSpec, L, pp):
    """The MTP modules' saved activations (each module's layers, num_mtp_layers times) added on the
    stage that runs them: the last, the only one when pp == 1."""
    if not model.num_mtp_layers:
        return act_stage
    mtp = sum(model.num_mtp_layers * n * np.asarray(L[k].act_saved_bytes, dtype=np.float64)
              for k, n in model.mtp_kind_counts.items())
    out = act_stage.copy()
    out[2] = out[2] + mtp
    out[0] = np.where(pp == 1, out[0] + mtp, out[0])
    return out


def _memory_costs(state: CostState, lay: StageLayout, inflight: Inflight) -> MemoryCosts:
    ctx, batch = state.ctx, state.batch
    model, g = ctx.model, ctx.geometry
    dense, expert = params_on_stages(state if lay is state.layout else attrs.evolve(state, layout=lay))
    params = dense + expert
    copies = _param_copies(ctx, batch)
    weights = params * 2.0 * copies
    grads = params * _grad_bytes_per_param(batch) * copies
    optim = params * OPTIMIZER_STATE_BYTES * copies
    L = state.layers
    act_stage = _on_stages(lay, L, lambda c: c.act_saved_bytes)
    act_stage = _with_mtp_activations(act_stage, model, L, batch.pp)
    # transient working set of the layer being recomputed: only layer types the stage holds
    work = np.zeros(len(batch))
    for kind, count in lay.counts.items():
        if _any_nonzero(L[kind], "act_working_bytes"):
            work = np.maximum(work, np.where(count > 0, L[kind].act_working_bytes, 0.0))
    acts = act_stage * np.stack([inflight.first, inflight.mid, inflight.last])
    # a mirrored schedule's GPU also holds its mirrored stage's (first ↔ last, middle ↔ middle)
    mirror = (inflight.mirror_first, inflight.mirror_mid, inflight.mirror_last)
    if any(np.any(m) for m in mirror):
        acts = acts + act_stage[::-1] * np.stack(mirror)
    mirrored = mirrored_rows(ctx.pm.registry, batch)
    logits = np.zeros_like(acts)
    logits[2] = logits_loss_bytes(model, g.tokens, g.t)
    # the only stage runs the loss, and so does each end GPU of a mirrored schedule (one direction's)
    logits[0] = np.where((batch.pp == 1) | mirrored, logits[2], 0.0)
    host = np.zeros_like(acts)
    return MemoryCosts(dense_params=dense, expert_params=expert, weights_bytes=weights, grads_bytes=grads,
                       optimizer_bytes=optim, activations_bytes=acts, buffers_bytes=np.zeros_like(acts),
                       logits_bytes=logits, working_bytes=np.broadcast_to(work, acts.shape).copy(), host_bytes=host)


def _any_nonzero(costs: LayerCosts, name: str) -> bool:
    """Whether field `name` of `costs` is non-zero in any row; a lazily taken one (:class:`_Taken`) is
    asked of its source, so that an all-zero field is never repeated to the rows."""
    src = costs.__dict__.get("_src") if isinstance(costs, _Taken) and name not in costs.__dict__ else None
    return bool(np.any(getattr(src if src is not None else costs, name)))


def logits_loss_bytes(model: ModelSpec, tokens, t, bytes_per_logit: float = LOSS_BYTES_PER_LOGIT):
    """The loss's peak working set on the stage holding the output layer, bytes per GPU:
    ``b·s·V/t · bytes_per_logit · (1 + MTP heads)`` over the micro-batch's tokens (the vocabulary
    split over TP by the vocab-parallel output layer). See :data:`LOSS_BYTES_PER_LOGIT`."""
    return np.asarray(tokens, dtype=np.float64) * model.vocab_size / t * bytes_per_logit * (1 + model.num_mtp_layers)


def memory_breakdown(mem: MemoryCosts, pick, runtime: FloatArray) -> dict[str, FloatArray]:
    """The peak stage's memory by component (they sum to the peak): the allocator's weights,
    gradients, optimizer states, activations, features' buffers, the loss's logits and the part of a
    recomputed layer's working set beyond them (the two never coexist), and the runtime's memory
    outside the allocator (CUDA context, NCCL communicators: the profile's ``reserved_memory_gib``)."""
    logits = pick(mem.logits_bytes)
    return {"weights": pick(mem.weights_bytes), "gradients": pick(mem.grads_bytes),
            "optimizer_states": pick(mem.optimizer_bytes), "activations": pick(mem.activations_bytes),
            "buffers": pick(mem.buffers_bytes), "logits_loss": logits,
            "recompute_working": np.maximum(pick(mem.working_bytes) - logits, 0.0), "runtime": runtime}


def _param_copies(ctx: Context, batch: CandidateBatch) -> FloatArray:
    """Copies of the stage's parameters each row's schedule keeps (``PipelineSchedule.parameter_copies``)."""
    table = np.array([s.parameter_copies for s in ctx.pm.registry.schedules.values()], dtype=np.float64)
    return table[batch.schedule]


def mirrored_rows(registry, batch) -> BoolArray:
    """Rows whose schedule is mirrored (``PipelineSchedule.mirrored``: DualPipe) and has two stages
    or more: each GPU also runs the stage ``p−1−j``."""
    table = np.array([s.mirrored for s in registry.schedules.values()], dtype=bool)
    return table[np.asarray(batch.schedule)] & (np.asarray(batch.pp) > 1)


def per_gpu(stages: np.ndarray, mirrored) -> np.ndarray:
    """(3, N) per-stage amounts (first, worst middle, last) as each GPU holds them: on mirrored rows
    a GPU holds its stage and the mirrored one — first + last at either end, two middle stages in
    between (the worst middle stands for both)."""
    return np.where(mirrored, stages + stages[::-1], stages)
