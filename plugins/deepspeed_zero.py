"""DeepSpeed ZeRO stages 1, 2 and 3 with DeepSpeed's own communication pattern (Rajbhandari et al.
2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"; DeepSpeed's
``zero_optimization`` config and its ``stage_1_and_2.py`` / ``stage3.py`` runtime).

Notation: P = parameters held by this GPU after TP/PP/EP sharding (Ψ of the paper for that GPU),
D = the data-parallel group its gradients are reduced over (``engine._dp_groups``: DP×CP for dense
parameters, the expert-DP size for expert parameters), m = micro-batches per step, g = gradient
bytes: the model dtype (2: DeepSpeed ZeRO keeps fp16/bf16 gradients, unlike Megatron's fp32 main
grads), 4 with ``grad_accum_dtype = "fp32"`` (DeepSpeed's BF16 optimizer, stage 1 only).

**Memory** (model states; the paper's 2Ψ + 2Ψ + KΨ with K = 12: fp32 master, momentum, variance)::

    stage 1:  P·2 + P·g + 12·P/D            (paper: 4Ψ + 12Ψ/N_d)
    stage 2:  P·2 + (g + 12)·P/D            (paper: 2Ψ + 14Ψ/N_d)
    stage 3:  (2 + g + 12)·P/D              (paper: 16Ψ/N_d)

plus DeepSpeed's buffers: the contiguous gradient bucket of ``reduce_bucket_size`` elements (model
dtype; stages 1–2 allocate two with ``overlap_comm``), and at stage 3 the gathered parameters of the
running layer P_ℓ, those kept gathered across the forward→backward turn R and prefetched ahead
(``prefetch_bucket_size``), capped by ``max_live_parameters``, with the running layer's unsharded
gradient: ``(min(R + prefetch, max_live) + P_ℓ)·2 + P_ℓ·g``. R = min(max_reuse_distance / 2, P):
a parameter is not released if it is used again within ``max_reuse_distance`` elements of the
trace, and a layer's reuse in backward comes after the forward and backward of every later layer
(twice their parameters).

**Communication** (gradients reduced with ``use_multi_rank_bucket_allreduce``, DeepSpeed's
default: each ``reduce_bucket_size`` bucket is all-reduced and every rank keeps its slice, so the
gradient reduction moves an all-reduce's volume; ``false``: one reduce per owner rank, a
reduce-scatter's volume — the paper's)::

    stage 1:  per step    RED(P·g) + AG(P·2)            (paper, RS: 2Ψ)
    stage 2:  per micro-batch RED(P·g); per step AG(P·2)
    stage 3:  per micro-batch AG(P·2) forward + AG(P·2) backward + RS(P·g)   (paper: 3Ψ)
              (+ AG(P·2) per recomputed forward; AR(P·g) without contiguous_gradients)

every collective priced by the collective provider at DeepSpeed's bucket granularity: ⌊E/B⌋
buckets of B elements and the remainder, one collective each (``reduce_bucket_size`` for
gradients, ``allgather_bucket_size`` for the stage-1/2 parameter all-gather; stage 3 gathers per
layer). Stage 2 reduces every micro-batch (DeepSpeed's engine: "ZeRO stage >= 2 communicates
during non gradient accumulation boundaries as well"); stage 1 only at the boundary.

**Overlap** (``overlap_comm``; DeepSpeed's default: on for stage 3 only). A bucket is reduced when
it is full, on a side stream, while the backward continues; the last bucket has nothing left to
hide behind. With C the reduction time, C_last its last bucket and T the backward it overlaps::

    E = max(α·T, β·(C − C_last)) − T + C_last        (one bucket: E = C; overlap off: E = C)

T is the last micro-batch's backward for stage 1 (reduced once, at the boundary), each
micro-batch's backward for stage 2. Stage 3 prefetches the next layer's parameters
(``prefetch_bucket_size`` > 0) and, with ``overlap_comm``, reduce-scatters behind the backward,
per layer as ``fsdp`` does — but gathers each layer module by module, ``modules_per_layer``
all-gathers of P_ℓ·2/k bytes (DeepSpeed fetches per submodule; each costs a collective's latency): ``E_ℓ = max(α·c_ℓ, β·comm_ℓ) − c_ℓ``, the last gradient bucket exposed.
The parameters retained across the turn (R above) are not gathered again in backward. Full
recompute re-runs each layer's forward inside the backward and gathers its parameters again; the
backward behind it gathers once more the modules released since: module j of k is reused after the
2(k−1−j)·P_ℓ/k elements the recompute and backward of the modules behind it touch, and kept if that
is within ``max_reuse_distance`` D (⌈D·k/2P_ℓ⌉ of the k modules). Backward gathers per layer:
``AG_ℓ·(keep + r·(1 − kept))``, r the share of layers full recompute re-runs. Prefetch runs only
while the gathered parameters are under ``max_live_parameters``: a module of P_ℓ/k at or above it is
gathered when asked, exposed. ``contiguous_gradients = false`` (stage 3's default before DeepSpeed
v0.4.5) all-reduces the gradient buckets instead of reduce-scattering them. The
stage-1/2 parameter all-gather follows the optimizer step and is exposed. α, β: the contention
coefficients. Per-micro-batch stage-2/3 traffic goes into the layers' ``dp_layer_comm`` (spread
evenly over the stage's layers), per-step traffic into ``dp_comm``.

**Choices.** The embedding's first gather of each pass at stage 3 has nothing to hide behind;
like ``fsdp`` it is neglected. Stage 2/3 with pipeline parallelism is refused (DeepSpeed's
pipeline engine supports ZeRO stage 1 only). The transient fp32 copy of the gradient partition
at the optimizer step is not counted (the activations are free by then). ``max_live_parameters``
caps only what is kept or prefetched, never the running layer.

Conflicts with ``distributed_optimizer``, ``fsdp`` and ``cpu_optimizer`` (other frameworks' ZeRO)
and ``dp_overlap`` (Megatron's gradient-reduction overlap; DeepSpeed overlaps with
``overlap_comm``). Runs after ``fp8``, ``kernel_scaling``, ``memfine`` and ``recompute`` (its
overlap sees their compute times).
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.decompose import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, Coll
from mofa_framework.engine import _grad_bytes_per_param, dp_param_groups, params_on_stages, stage_picker
from mofa_framework.types import ConstraintResult, MemoryOptimizer, option
from mofa_plugins._overlap import ContentionOptions, contention, opt
from mofa_plugins.distributed_optimizer import dp_sizes, shard_fraction
from mofa_plugins.fsdp import PARAM_BYTES, _rest_params, layer_gather_s, layer_shards

STAGES = (1, 2, 3)
OVERLAP = ("auto", "on", "off")
GRAD_ACCUM = ("model", "fp32")


def _positive(inst, attribute, value):
    if isinstance(value, bool) or not value > 0:
        raise ValueError(f"'{attribute.name}' must be > 0, got {value!r}")


def _nonneg(inst, attribute, value):
    if isinstance(value, bool) or not value >= 0:
        raise ValueError(f"'{attribute.name}' must be ≥ 0, got {value!r}")


@attrs.frozen(kw_only=True)
class DeepSpeedZeroOptions(ContentionOptions):
    stage: int = option(1, choices=STAGES, search=STAGES,
                        doc="1: partition optimizer states; 2: + gradients; 3: + parameters")
    overlap_comm: str = option("auto", choices=OVERLAP, search=("on",),
                               doc="reduce gradient buckets on a side stream during the backward; auto = "
                                   "DeepSpeed's default (on for stage 3 only)")
    reduce_bucket_size: float = option(5e8, validator=_positive,
                                       doc="elements per gradient-reduction bucket (DeepSpeed default 5e8)")
    allgather_bucket_size: float = option(5e8, validator=_positive,
                                          doc="elements per stage-1/2 parameter all-gather (default 5e8)")
    use_multi_rank_bucket_allreduce: bool = option(
        True, doc="stages 1-2: all-reduce each gradient bucket and keep the own slice (DeepSpeed's default); "
                  "false: one reduce per owner rank, a reduce-scatter's volume")
    prefetch_bucket_size: float = option(5e7, validator=_nonneg,
                                         doc="stage 3: parameter elements gathered ahead (0 = no prefetch)")
    max_live_parameters: float = option(1e9, validator=_nonneg,
                                        doc="stage 3: gathered elements kept or prefetched at most")
    max_reuse_distance: float = option(1e9, validator=_nonneg,
                                       doc="stage 3: a parameter used again within this many elements stays "
                                           "gathered")
    modules_per_layer: int = option(4, validator=_positive,
                                    doc="stage 3: parameter all-gathers per layer, one per module (Megatron-DeepSpeed's "
                                        "QKV, attention output, MLP in, MLP out; 7 for HuggingFace Llama)")
    contiguous_gradients: bool = option(
        True, doc="stage 3: reduce-scatter the gradients out of a contiguous bucket (DeepSpeed's default since "
                  "v0.4.5, Aug 2021); false: all-reduce them bucket by bucket, each rank keeping its slice "
                  "(the stage-3 default before: twice the volume)")
    grad_accum_dtype: str = option("model", choices=GRAD_ACCUM,
                                   doc="gradient dtype: the model's (fp16/bf16), or fp32 (the BF16 optimizer, "
                                       "stage 1 only)")

    def __attrs_post_init__(self):
        if self.grad_accum_dtype == "fp32" and self.stage != 1:
            raise ValueError(f"grad_accum_dtype = 'fp32' needs stage = 1 (DeepSpeed's BF16 optimizer); stage "
                             f"{self.stage} accumulates gradients in the model dtype: use grad_accum_dtype = 'model'")


# ---------------------------------------------------------------------- per-row settings


def stage_of(rows) -> np.ndarray:
    """The ZeRO stage per row (1 where the feature is off)."""
    return np.asarray(STAGES, dtype=np.float64)[opt(rows, "stage", 0.0).astype(int)]


def overlaps(rows, stage) -> np.ndarray:
    code = opt(rows, "overlap_comm", 0.0).astype(int)
    return np.where(code == 0, stage == 3, code == 1)


def grad_bytes(rows) -> np.ndarray:
    """g: 2 (fp16/bf16 gradients), 4 with grad_accum_dtype = fp32."""
    return np.where(opt(rows, "grad_accum_dtype", 0.0) == GRAD_ACCUM.index("fp32"), 4.0, 2.0)


def _reduce_kind(rows, stage) -> np.ndarray:
    """All-reduce (multi-rank buckets, or the BF16 optimizer's fp32 all-reduce; at stage 3 without
    ``contiguous_gradients``) or reduce-scatter."""
    allreduce = (opt(rows, "use_multi_rank_bucket_allreduce", 1.0) > 0.5) | (grad_bytes(rows) == 4.0)
    allreduce3 = opt(rows, "contiguous_gradients", 1.0) < 0.5
    return np.where(np.where(stage < 3, allreduce, allreduce3), ALL_REDUCE, REDUCE_SCATTER)


# ---------------------------------------------------------------------- pricing


def bucketed_s(ctx, name, kind, elems, bytes_per_elem, bucket_elems, size, stride):
    """(total, last) seconds to move `elems` elements in buckets of `bucket_elems`: ⌊E/B⌋ full buckets
    and the remainder, one collective each; `last` is the final bucket's collective."""
    n = len(ctx.geometry.b)
    elems = np.broadcast_to(np.asarray(elems, dtype=np.float64), (n,))
    bucket = np.broadcast_to(np.asarray(bucket_elems, dtype=np.float64), (n,))
    full = np.floor(elems / bucket)
    rem = elems - full * bucket

    def price(count, label):
        c = Coll(name=f"{name}_{label}", parallel="dp", kind=kind, bytes=count * bytes_per_elem, group_size=size,
                 stride=stride)
        return ctx.collective_s(c)

    t_full = np.where(full > 0, price(bucket, "bucket"), 0.0)
    t_rem = np.where(rem > 0, price(rem, "rest"), 0.0)
    return full * t_full + t_rem, np.where(rem > 0, t_rem, t_full)


def tail_exposed(total, last, compute, alpha, beta):
    """E = max(α·T, β·(C − C_last)) − T + C_last: every bucket but the last hides behind T."""
    body = total - last
    return np.where(body > 0, np.maximum(alpha * compute, beta * body) - compute, 0.0) + last


def busiest_stage(state):
    """(dense, expert) parameters of the stage holding the most (the engine's choice for the DP
    reduction), its backward seconds per micro-batch and its layer count."""
    lay = state.layout
    dense, expert = params_on_stages(state)
    worst = np.argmax(dense + expert, axis=0)
    pick = stage_picker(worst)
    bwd = sum((pick(lay.of(k)) * (c.bwd_input_s + c.bwd_weight_s + c.recompute_s) for k, c in state.layers.items()),
              np.zeros(len(state.batch)))
    return pick(dense), pick(expert), bwd, np.maximum(pick(lay.total), 1.0)


def gradient_reduction_s(state, rows, dense, expert, stage):
    """(total, last bucket) seconds of one reduction of the gradients of `dense` and `expert`
    parameters, each over its own DP group, in ``reduce_bucket_size`` buckets."""
    kind, g, bucket = _reduce_kind(rows, stage), grad_bytes(rows), opt(rows, "reduce_bucket_size", 5e8)
    total = last = 0.0
    for label, params, size, stride in dp_param_groups(state.ctx, state.batch, dense, expert):
        t, t_last = bucketed_s(state.ctx, f"zero_grad_{label}", kind, params, g, bucket, size, stride)
        total, last = total + t, last + t_last
    return total, last


def parameter_gather_s(state, rows, dense, expert):
    """Seconds of the stage-1/2 all-gather of the updated bf16 parameters (``allgather_bucket_size``)."""
    bucket = opt(rows, "allgather_bucket_size", 5e8)
    total = 0.0
    for label, params, size, stride in dp_param_groups(state.ctx, state.batch, dense, expert):
        total = total + bucketed_s(state.ctx, f"zero_param_{label}", ALL_GATHER, params, PARAM_BYTES, bucket, size,
                                   stride)[0]
    return total


def retained_elements(rows, params):
    """R: parameters kept gathered across the forward→backward turn (stage 3)."""
    return np.minimum(opt(rows, "max_reuse_distance", 1e9) / 2.0, params)


def recomputed_share(state) -> np.ndarray:
    """r: share of the layers whose forward full recompute re-runs inside the backward (the
    ``recompute`` feature's full granularity; 0 without it: selective recompute re-runs only the
    attention core, which has no parameters to gather)."""
    from mofa_plugins.recompute import full_fraction

    rec = state.batch.feature("recompute")
    if not rec.enabled.any():
        return np.zeros(len(state.batch))
    return np.where(rec.enabled & rec.choice("granularity", "full"), full_fraction(state, rec), 0.0)


def kept_after_recompute(rows, layer_params, modules) -> np.ndarray:
    """Share of a layer's modules still gathered when the backward reaches them after the recompute:
    module j of k (P_ℓ/k elements each) is used again after the recompute and backward of the k−1−j
    modules behind it, 2(k−1−j)·P_ℓ/k elements, and kept if that is within ``max_reuse_distance`` D:
    ⌈D·k / (2P_ℓ)⌉ of the k modules (the last one always, as long as D > 0)."""
    d = opt(rows, "max_reuse_distance", 1e9)
    n = np.ceil(d * modules / np.maximum(2.0 * layer_params, 1.0))
    return np.clip(n, 0.0, modules) / modules


# ---------------------------------------------------------------------- transforms


def layer(state, rows):
    stage = stage_of(rows)
    on = overlaps(rows, stage)
    alpha, beta = contention(state, rows)
    dense, expert, bwd, layers = busiest_stage(state)
    red, red_last = gradient_reduction_s(state, rows, dense, expert, stage)
    # stage 2: every micro-batch's gradients are reduced in buckets during (or after) its backward
    z2 = np.where(on, tail_exposed(red, red_last, bwd, alpha, beta), red)
    # stage 3: the parameters outside the layers are gathered with them, twice per micro-batch
    rest = _rest_params(state)
    rest_ag = np.zeros(len(state.batch))
    for label, params, size, stride in dp_param_groups(state.ctx, state.batch, *rest):
        ag = Coll(name=f"zero3_rest_{label}_ag", parallel="dp", kind=ALL_GATHER, bytes=params * PARAM_BYTES,
                  group_size=size, stride=stride)
        rest_ag = rest_ag + np.where(params > 0, state.ctx.collective_s(ag, per_structure=True), 0.0)
    keep = 1.0 - retained_elements(rows, dense + expert) / np.maximum(dense + expert, 1.0)
    prefetch_on = opt(rows, "prefetch_bucket_size", 5e7) > 0
    modules = opt(rows, "modules_per_layer", 4.0)
    r = recomputed_share(state)
    out = {}
    for kind, c in state.layers.items():
        f_comp, b_comp = c.fwd_compute_s, c.bwd_input_s + c.bwd_weight_s + c.recompute_s
        gather_f = layer_gather_s(state, kind, prefix="zero3", pieces=modules) + rest_ag / layers
        # the recomputed forward gathers like the first (what the turn retained, R, aside); the
        # backward behind it gathers again the modules released since
        p_layer = sum(layer_shards(state, kind))
        gather_b = gather_f * (keep + r * (1.0 - kept_after_recompute(rows, p_layer, modules)))
        # DeepSpeed prefetches only while the gathered parameters are under max_live_parameters: a
        # module that alone reaches the cap is fetched when its layer asks for it, unhidden
        prefetch = prefetch_on & (p_layer / modules < opt(rows, "max_live_parameters", 1e9))
        body, tail = (red - red_last) / layers, red_last / layers
        hide_b = np.where(on, gather_b + body, gather_b)
        exp_f3 = np.where(prefetch, np.maximum(alpha * f_comp, beta * gather_f) - f_comp, gather_f)
        exp_b3 = (np.where(prefetch | on, np.maximum(alpha * b_comp, beta * hide_b) - b_comp, hide_b)
                  + np.where(on, 0.0, body) + tail)
        s2, s3 = stage == 2, stage == 3
        out[kind] = attrs.evolve(
            c, dp_fwd_s=c.dp_fwd_s + np.where(s3, gather_f, 0.0),
            dp_bwd_s=c.dp_bwd_s + np.where(s3, gather_b, 0.0) + np.where(s2 | s3, red / layers, 0.0),
            dp_exposed_fwd_s=c.dp_exposed_fwd_s + np.where(s3, exp_f3, 0.0),
            dp_exposed_bwd_s=c.dp_exposed_bwd_s + np.where(s3, exp_b3, np.where(s2, z2 / layers, 0.0)))
    return attrs.evolve(state, layers=out)


def optimizer(state, rows):
    stage = stage_of(rows)
    alpha, beta = contention(state, rows)
    dense, expert, _, _ = busiest_stage(state)
    red, red_last = gradient_reduction_s(state, rows, dense, expert, stage)
    pipe = state.pipe
    last_bwd = pipe.v * (pipe.B + pipe.W)  # the last micro-batch's backward on the critical stage
    z1 = np.where(overlaps(rows, stage), tail_exposed(red, red_last, last_bwd, alpha, beta), red)
    ag = np.where(stage < 3, parameter_gather_s(state, rows, dense, expert), 0.0)
    s1 = stage == 1
    d_dense, d_expert = dp_sizes(state)
    o, g = state.opt, grad_bytes(rows)
    new = attrs.evolve(o, dp_comm_s=np.where(s1, red, 0.0) + ag, dp_exposed_s=np.where(s1, z1, 0.0) + ag,
                       update_s=o.update_s * shard_fraction(dense, expert, d_dense, d_expert),
                       dense_grad_bytes=dense * g, expert_grad_bytes=expert * g)
    return attrs.evolve(state, opt=new)


def gathered_bytes(state, rows):
    """Stage 3: the gathered parameters (running layer, retained and prefetched) and the running
    layer's unsharded gradient, bytes per GPU."""
    dense, expert, _, _ = busiest_stage(state)
    p_layer = np.zeros(len(state.batch))
    for kind in state.layers:
        d, e = layer_shards(state, kind)
        p_layer = np.maximum(p_layer, d + e)
    ahead = np.minimum(retained_elements(rows, dense + expert) + opt(rows, "prefetch_bucket_size", 5e7),
                       opt(rows, "max_live_parameters", 1e9))
    return (ahead + p_layer) * PARAM_BYTES + p_layer * grad_bytes(rows)


def memory(state, rows):
    mem = state.mem
    stage = stage_of(rows)
    d_dense, d_expert = dp_sizes(state)
    frac = shard_fraction(mem.dense_params, mem.expert_params, d_dense[None, :], d_expert[None, :])
    s2, s3 = (stage >= 2)[None, :], (stage == 3)[None, :]
    grads = mem.grads_bytes * (grad_bytes(rows) / _grad_bytes_per_param(state.batch))[None, :]
    bucket = opt(rows, "reduce_bucket_size", 5e8) * 2.0
    ipg = np.where(stage == 3, bucket, np.where(grad_bytes(rows) == 2.0, bucket * (1.0 + overlaps(rows, stage)), 0.0))
    extra = ipg + np.where(stage == 3, gathered_bytes(state, rows), 0.0)
    return attrs.evolve(state, mem=attrs.evolve(
        mem, weights_bytes=np.where(s3, mem.weights_bytes * frac, mem.weights_bytes),
        grads_bytes=np.where(s2, grads * frac, grads), optimizer_bytes=mem.optimizer_bytes * frac,
        buffers_bytes=mem.buffers_bytes + extra[None, :]))


def feasible(batch, rows):
    stage = stage_of(rows)
    return ConstraintResult(
        name="deepspeed_zero_pipeline", feasible=(stage < 2) | (batch.pp == 1),
        reason="features.deepspeed_zero: DeepSpeed's pipeline engine supports ZeRO stage 1 only, but stage 2 or 3 "
               "was asked with pp > 1: use stage = 1, or pp = 1")


def framework_constraints(batch, rows):
    """What DeepSpeed does not run beside its ZeRO: expert parallelism at stage 3 (its engine asserts
    "MoE not supported with Stage 3" for DeepSpeed-MoE layers; an MoE model whose experts are plain
    modules runs stage 3 at ep = 1, sharded as dense parameters), and context parallelism other than
    DeepSpeed-Ulysses' all-to-all (``cp_a2a``): it has no K/V ring."""
    on = np.asarray(rows.enabled, bool)
    stage = stage_of(rows)
    yield ConstraintResult(
        name="deepspeed_zero_moe_stage3", feasible=~(on & (stage == 3) & (np.asarray(batch.ep) > 1)),
        reason="features.deepspeed_zero: DeepSpeed runs no expert parallelism under ZeRO stage 3 (\"MoE not "
               "supported with Stage 3\"): use stage = 1 or 2, or parallel.ep = 1")
    ulysses = np.asarray(batch.feature("cp_a2a").enabled, bool)
    yield ConstraintResult(
        name="deepspeed_zero_cp", feasible=~(on & (np.asarray(batch.cp) > 1) & ~ulysses),
        reason="features.deepspeed_zero: DeepSpeed's context parallelism is DeepSpeed-Ulysses (all-to-all), "
               "not the K/V ring: enable features.cp_a2a, or set parallel.cp = 1")


@hookimpl
def mofa_candidate_constraints(batch, model, hardware):
    rows = batch.feature("deepspeed_zero")
    if rows.enabled.any():
        yield from framework_constraints(batch, rows)


def applies(batch, model, hardware):
    """Rows with something to partition: a data-parallel group of more than one rank."""
    return (batch.dp * batch.cp > 1) | ((batch.tp * batch.cp * batch.dp > batch.ep * batch.etp)
                                        if model.is_moe else False)


def megatron_args(options, context=None) -> list[str]:
    """Megatron-LM has no DeepSpeed ZeRO: a note with the DeepSpeed config that runs it (and
    Megatron-DeepSpeed's ZB-H1 flag when the configuration pipelines under ZB-H1)."""
    o = options
    overlap = {"auto": o.stage == 3, "on": True, "off": False}[o.overlap_comm]
    zbh1 = (" --enable-zbh1-pipeline (its ZB-H1, in place of the ZeroBubble fork's flags)"
            if context is not None and context.schedule == "zb-h1"
            and int(context.parallel.get("pp", 1)) > 1 else "")
    cfg = (f'"stage": {o.stage}, "overlap_comm": {str(overlap).lower()}, "reduce_bucket_size": {o.reduce_bucket_size:.0e}, '
           f'"allgather_bucket_size": {o.allgather_bucket_size:.0e}, "use_multi_rank_bucket_allreduce": '
           f'{str(o.use_multi_rank_bucket_allreduce).lower()}')
    if o.stage == 3:
        cfg += (f', "stage3_prefetch_bucket_size": {o.prefetch_bucket_size:.0e}, "stage3_max_live_parameters": '
                f'{o.max_live_parameters:.0e}, "stage3_max_reuse_distance": {o.max_reuse_distance:.0e}, '
                f'"contiguous_gradients": {str(o.contiguous_gradients).lower()}')
    return [f"# DeepSpeed ZeRO stage {o.stage} (no Megatron-LM equivalent): DeepSpeed config "
            f'"zero_optimization": {{{cfg}}}' + (', "data_types": {"grad_accum_dtype": "fp32"}'
                                                   if o.grad_accum_dtype == "fp32" else "")
            + f"; Megatron-DeepSpeed: --zero-stage {o.stage}" + zbh1]


def from_megatron(args):
    """Megatron-DeepSpeed's ``--zero-stage N`` (its launch scripts pass the stage of their DeepSpeed
    config this way): ZeRO stage N; 0 is off."""
    stage = args.number("--zero-stage", 0)
    args.has("--deepspeed")
    return {"stage": stage} if stage in STAGES else None

FEATURE = MemoryOptimizer(
    name="deepspeed_zero",
    description="DeepSpeed ZeRO stage 1/2/3 with DeepSpeed's communication: bucketed gradient all-reduce "
                "(multi-rank buckets) or reduce-scatter, per micro-batch from stage 2, per-layer parameter "
                "all-gathers with prefetch at stage 3, overlap_comm; fp16/bf16 gradients, fp32 master and Adam "
                "states partitioned by stage",
    equation="M = P·2 + P·g + 12P/D | P·2 + (g+12)P/D | (2+g+12)P/D (+ buckets); "
             "C = RED(Pg)+AG(2P) | m·RED(Pg)+AG(2P) | m·(2·AG(2P)+RS(Pg))",
    options_type=DeepSpeedZeroOptions,
    layer=layer,
    adds_time_only=True,  # only adds exposed transfers to a layer (≥ 0): never makes one faster
    optimizer=optimizer,
    memory=memory,
    feasible=feasible,
    applies=applies,
    megatron_args=megatron_args,
    from_megatron=from_megatron,
    after=("fp8", "kernel_scaling", "memfine", "recompute"),
    # other ZeRO implementations, Megatron's gradient-reduction overlap, and what only Megatron-Core /
    # Transformer Engine run: userbuffers TP overlap, the 1F1B all-to-all overlap, DeepEP / HybridEP,
    # CUDA graphs of layers, the K/V ring's overlap, overlapped pipeline p2p
    conflicts=("distributed_optimizer", "fsdp", "cpu_optimizer", "dp_overlap", "tp_overlap", "ep_overlap",
               "flex_dispatcher", "cuda_graphs", "cp_overlap", "pp_overlap"),
    # DeepSpeed's pipeline engine runs its own 1F1B (TrainSchedule), and ZB-H1 in Megatron-DeepSpeed
    # (--enable-zbh1-pipeline, deepspeedai/Megatron-DeepSpeed#396, 2024-06: checked with ZeRO stage 1)
    schedules=("1f1b", "zb-h1"),
)


@hookimpl
def mofa_register_memory_optimizers():
    return [FEATURE]
