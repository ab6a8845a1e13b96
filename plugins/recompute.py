"""Activation recomputation, selective and full (paper eqs. [29]–[32]; Korthikanti et al. 2022).

Per layer and micro-batch (S = the layer's saved activations, S_in its input, S_core the
attention core's saved tensors — scores, softmax, dropout mask and output):

**selective** [29][30] (Megatron ``--recompute-granularity selective``)::

    S' = S − S_core                         (TP+SP GPT: 34·s·b·h/t)
    T_bwd' = T_bwd + T_core_fwd

*What is re-run* (**choice**): Megatron-LM checkpoints only ``CoreAttention`` (QKᵀ, softmax,
dropout, attention·V) and keeps Q, K, V, so backward adds the core-attention forward only —
Korthikanti et al. §4.2 and their Table 4 (22B: backward +1.3 ms, i.e. about the core's
forward). The MoFa paper's prose also re-runs the QKV projection; ``include_qkv = true``
selects that reading (``T_bwd' = T_bwd + T_qkv_fwd + T_core_fwd``, engine field
``qkv_attn_fwd_s``); Q, K, V then need not be kept either, but [29] keeps the memory term
the same, and so does this plugin.

**full** [31][32] (``--recompute-granularity full --recompute-method block``)::

    S' = S_in                               (TP+SP GPT: 2·s·b·h/t)
    T_bwd' = T_bwd + T_fwd                  (the layer's whole forward, TP/CP/EP comm included)
    W = S − S_in                            (one layer re-materialised while its backward runs)

``num_layers`` = Megatron's ``--recompute-num-layers``: the first ``num_layers`` layers of
every model chunk are recomputed, the others keep everything (0 = all). With
``r = min(num_layers, L_chunk)/L_chunk`` (L_chunk = layers per chunk on the first stage) the
per-layer costs are the r-weighted mix of the two.

**selective by module** (Megatron-Core ``--recompute-modules``): one boolean option per module
— ``core_attn``, ``moe_act``, ``layernorm``, ``mla_up_proj``, ``mlp``, ``moe``,
``shared_experts``. None set means ``core_attn`` (the default above); setting any replaces
it, as in Megatron. For each module m: ``S' = S − S_m`` and ``T_bwd' = T_bwd + T_m_fwd``, where
``S_m`` is what the module's output-discarding (``moe_act``, ``layernorm``, ``mla_up_proj``) or
checkpointing (``mlp``, ``moe``, ``shared_experts``) drops (``decompose.module_saved_bytes``)
and ``T_m_fwd`` its re-run operators (``decompose.module_operators``) priced by the engine;
a checkpointed submodule is re-materialised while its backward runs (``W ≥ S_m``). ``moe``
covers ``moe_act`` and ``shared_experts``. docs/features/memory.md tabulates each module. ``S_m``
counts as stored: after ``fp8``/``nvfp4`` its GEMM inputs are quantised copies
(``act_gemm_input_scale`` of their bf16 bytes), and a module cannot drop more than the layer
still stores — dropping the bf16 size would count those savings twice (negative activations).

**op** (torchtitan's per-op selective checkpointing, ``activation_checkpoint.selective_ac_option =
"op"``): inside each layer's checkpoint the policy saves the outputs of the attention kernel (its
output and fp32 log-sum-exp), of reduce-scatters and of every *other* matmul in call order — of
wq, wk, wv, wo, w1, w3, w2 the odd ones wq, wv, w1, w2 — and re-runs everything else (norms, RoPE,
wk, wo, w3, the activation) in backward. Per token (q = a·d, v = kv·d, the attention's output a·d_v)::

    S' = dt·(h/sp + q/t + v/t + a·d_v/t + f/t + h/sp) + 4·a/t        (dense layer, flash attention)

(MoE layers: f → the routed pairs' expert width ``k·f_e/etp``). The re-run forward is the
unsaved matmuls' (wk, wo, w3) FLOPs share of the layer's GEMM time, ``1 − (q + v + 2f)/(2q + 2v +
3f)`` of ``tp_gemm_fwd_s`` (a third of ``expert_fwd_s``), plus the layer's non-GEMM, non-attention
operators; the working set while a layer runs backward is what it dropped. The policy saves
reduce-scatters' outputs but not all-gathers' (``torchtitan/distributed/activation_checkpoint.py``,
the save list), so with tensor parallelism the forward's all-gathers run again in backward — half
the forward's TP communication with sequence parallelism, all of it (all-reduces) without — added
to the backward's TP communication, where an overlap feature may hide it.

Recomputed forward FLOPs go to ``recompute_flops`` (hardware FLOPs, HFU).
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.decompose import (
    GEMM,
    RECOMPUTE_MODULES,
    layer_operators,
    module_operators,
    module_saved_bytes,
    routed_pairs,
    tp_sublayers,
)
from mofa_framework.engine import price_operators
from mofa_framework.limits import MAX_LAYERS, between
from mofa_framework.types import MemoryOptimizer, option


@attrs.frozen(kw_only=True)
class RecomputeOptions:
    granularity: str = option("selective", choices=("selective", "full", "op"), search=("selective", "full"),
                              doc="selective: re-run the attention core; full: re-run the whole layer; op: "
                                  "torchtitan's per-op policy (keep every other matmul's output and attention's)")
    num_layers: int = option(0, validator=between(0, MAX_LAYERS, integer=True, why="layers per chunk"),
                             doc="full only: layers per model chunk recomputed (Megatron --recompute-num-layers); "
                                 "0 = all")
    include_qkv: bool = option(False, doc="selective only: also re-run the QKV projection (the MoFa paper's "
                                          "reading; Megatron re-runs the core only)")
    # Megatron-Core --recompute-modules (selective only); none set = core_attn, Megatron's default
    core_attn: bool = option(False, doc="selective: recompute the core attention (Megatron's default module)")
    moe_act: bool = option(False, doc="selective: recompute the routed experts' activation function")
    layernorm: bool = option(False, doc="selective: recompute input_layernorm and pre_mlp_layernorm")
    mla_up_proj: bool = option(False, doc="selective: recompute the MLA up projections (and RoPE); without MLA, a low-rank query's")
    mlp: bool = option(False, doc="selective: recompute the dense MLP submodule")
    moe: bool = option(False, doc="selective: recompute the whole MoE layer (router, dispatch, experts, combine)")
    shared_experts: bool = option(False, doc="selective: recompute the shared experts of an MoE layer")

    @property
    def modules(self) -> tuple[str, ...]:
        """Megatron --recompute-modules this selects (core_attn when none is set)."""
        return tuple(m for m in RECOMPUTE_MODULES if getattr(self, m)) or ("core_attn",)


def _group_flops(ctx, kind: str, *groups: str) -> tuple[np.ndarray, ...]:
    """Forward FLOPs of each of the operator `groups` of a `kind` layer, per row (one decomposition
    of the layer, per structure)."""
    def flops(c):
        ops = layer_operators(c.model, c.geometry, kind)
        z = np.zeros(len(c.geometry.b))
        return tuple(sum((np.asarray(o.flops, dtype=np.float64) for o in ops if o.group == g), z) for g in groups)
    return tuple(ctx.per_structure(flops))


#: which LayerCosts forward-time field already carries each operator group's (FP8/kernel-scaled) time
_GROUP_FIELD = {"qkv": "tp_gemm_fwd_s", "proj": "tp_gemm_fwd_s", "mlp": "tp_gemm_fwd_s",
                "core_attn": "attn_fwd_s", "expert": "expert_fwd_s"}


def module_rerun(state, kind: str, c, module: str) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, FLOPs) of the forward that recomputing `module` re-runs in one layer's backward.

    The module's operators are priced as the engine prices them, then rescaled per operator
    group by the layer's current group time over its base price (1 unless an earlier feature
    such as FP8 changed that group's time). Checkpointed submodules that contain collectives
    re-run them too: ``mlp`` its TP block (half of a dense layer's exposed TP forward), ``moe``
    the EP dispatch/combine (the exposed EP forward) and, with shared experts, their TP block.
    """
    ctx = state.ctx
    z = np.zeros(len(ctx.geometry.b))
    ops = module_operators(ctx.model, ctx.geometry, kind, module)
    if not ops:
        return z, z
    base = layer_operators(ctx.model, ctx.geometry, kind)
    base_t = price_operators(ctx, base)
    scale = {}
    for grp, field in _GROUP_FIELD.items():
        groups = [k for k, f in _GROUP_FIELD.items() if f == field]
        priced = sum((t for t, o in zip(base_t, base) if o.group in groups), z)
        scale[grp] = np.divide(getattr(c, field), priced, out=np.ones_like(z), where=priced > 0)
    secs = sum((t * scale.get(o.group, 1.0) for t, o in zip(price_operators(ctx, ops), ops)), z)
    flops = sum((np.asarray(o.flops, dtype=np.float64) for o in ops), z)
    share = 1.0 / max(tp_sublayers(ctx.model, ctx.model.block(kind)), 1)  # the module's TP block
    if module == "mlp":
        secs = secs + share * c.tp_exposed_fwd_s
    elif module == "moe":
        secs = secs + c.ep_exposed_fwd_s + (share * c.tp_exposed_fwd_s if ctx.model.shared_expert_ffn else 0.0)
    return secs, flops


def module_gemm_inputs(model, g, kind: str, module: str) -> np.ndarray:
    """The part of :func:`~mofa_framework.decompose.module_saved_bytes` that is saved GEMM inputs
    (bf16 bytes), which fp8/nvfp4 may already keep quantised: the norms' outputs (QKV and MLP
    inputs), FC2's input (the activation's output) of the MLP, experts and shared experts, and the
    experts' dispatched input."""
    block = model.block(kind)
    T, t, dt, spd = g.tokens, g.t, g.dt, g.sp_div
    h, fe = model.hidden_size, model.moe_ffn_hidden_size
    z = np.zeros_like(np.asarray(T, dtype=np.float64))
    shared = dt * T * model.shared_expert_ffn / t
    if module == "layernorm":  # each sublayer's normed input
        return z + float(block.sublayers) * dt * T * h / spd
    if module == "mlp" and block.ffn == "dense":
        return z + dt * T * model.ffn_hidden_size / t
    if block.ffn != "moe" or module not in ("moe", "moe_act", "shared_experts"):
        return z
    routed = routed_pairs(model, g)
    if module == "moe":
        return dt * routed * (model.expert_width + fe / g.etp) + shared
    return z + (dt * routed * fe / g.etp if module == "moe_act" else shared)


def stored_module_bytes(ctx, kind: str, module: str, bf16_bytes, c, stored_other) -> np.ndarray:
    """What recomputing `module` drops from the layer's saved tensors as they are stored now: its
    bf16 bytes less what an earlier quantising feature (``act_gemm_input_scale`` < 1) already saved on
    its GEMM inputs, and never more than the layer still stores (MemFine may have dropped experts)."""
    part = module_gemm_inputs(ctx.model, ctx.geometry, kind, module)
    return np.clip(bf16_bytes - (1.0 - c.act_gemm_input_scale) * part, 0.0, np.maximum(stored_other, 0.0))


def full_fraction(state, rows) -> np.ndarray:
    """Share of a chunk's layers that full recompute re-runs."""
    lay = state.layout
    per_chunk = lay.total[0] / state.batch.vpp
    n = rows.options["num_layers"]
    return np.where(n > 0, np.minimum(n, per_chunk) / np.maximum(per_chunk, 1.0), 1.0)


def op_policy(ctx, kind: str, c):
    """(seconds, FLOPs, saved bytes) of torchtitan's per-op policy for one layer (module docstring)."""
    model, g = ctx.model, ctx.geometry
    T, t, dt, spd = g.tokens, g.t, g.dt, g.sp_div
    h, a = model.hidden_size, model.num_attention_heads
    if model.is_mla:
        q, v, o = a * model.qk_head_dim, a * model.v_dim, a * model.v_dim
    else:
        d = model.kv_channels
        q, v, o = a * d, model.num_kv_heads * d, a * d
    if kind == "moe":
        f = routed_pairs(model, g) / T * model.moe_ffn_hidden_size / g.etp * t  # per token, before / t below
    else:
        f = model.ffn_hidden_size
    saved = dt * T * (2.0 * h / spd + (q + v + o + f) / t) + np.where(g.flash, 4.0 * T * a / t, c.act_core_attn_bytes)
    share = 1.0 - (q + v + 2.0 * model.ffn_hidden_size) / (2.0 * q + 2.0 * v + 3.0 * model.ffn_hidden_size)
    other = np.maximum(c.fwd_compute_s - c.tp_gemm_fwd_s - c.attn_fwd_s - c.expert_fwd_s, 0.0)
    secs = share * c.tp_gemm_fwd_s + c.expert_fwd_s / 3.0 + other
    gemm_flops = ctx.per_structure(lambda cc: sum((np.asarray(o.flops, dtype=np.float64)
                                                   for o in layer_operators(cc.model, cc.geometry, kind)
                                                   if np.all(np.asarray(o.kind) == GEMM)),
                                                  np.zeros(len(cc.geometry.b))))
    flops = share * gemm_flops
    return secs, flops, np.minimum(saved, c.act_saved_bytes)


def layer(state, rows):
    full = rows.choice("granularity", "full")
    per_op = rows.choice("granularity", "op")
    qkv = rows.options["include_qkv"] > 0.5
    r = np.where(full, full_fraction(state, rows), 0.0)
    out = {}
    for kind, c in state.layers.items():
        # selective (the QKV projection only with the attention core it feeds)
        qkv_k = qkv & state.ctx.model.block(kind).is_attention
        sel_time = np.where(qkv_k, c.qkv_attn_fwd_s, c.attn_fwd_s)
        attn_flops, qkv_flops = _group_flops(state.ctx, kind, "core_attn", "qkv")
        sel_flops = attn_flops + np.where(qkv_k, qkv_flops, 0.0)
        sel_saved = c.act_saved_bytes - c.act_core_attn_bytes
        sel_other = c.act_other_bytes
        sel_work = c.act_working_bytes
        # the other Megatron --recompute-modules; core_attn above runs unless only others are set
        mods = {m: rows.options[m] > 0.5 for m in RECOMPUTE_MODULES if m in rows.options}
        if any(np.any(v) for v in mods.values()):
            core = mods["core_attn"] | ~np.logical_or.reduce([mods[m] for m in RECOMPUTE_MODULES])
            moe_all = mods["moe"]
            sel_time = np.where(core, sel_time, 0.0)
            sel_flops = np.where(core, sel_flops, 0.0)
            sel_saved = np.where(core, sel_saved, c.act_saved_bytes)
            for m in RECOMPUTE_MODULES[1:]:
                on = mods[m] & ~moe_all if m in ("moe_act", "shared_experts") else mods[m]
                if not np.any(on):
                    continue
                module = module_saved_bytes(state.ctx.model, state.ctx.geometry, kind, m)
                if not np.any(module > 0):
                    continue
                drop = stored_module_bytes(state.ctx, kind, m, module, c, sel_other)
                secs, fl = module_rerun(state, kind, c, m)
                sel_time = sel_time + np.where(on, secs, 0.0)
                sel_flops = sel_flops + np.where(on, fl, 0.0)
                sel_saved = sel_saved - np.where(on, drop, 0.0)
                sel_other = sel_other - np.where(on, drop, 0.0)
                if m in ("mlp", "moe", "shared_experts"):  # a checkpointed submodule is re-materialised
                    sel_work = np.where(on, np.maximum(sel_work, module), sel_work)
            sel_core = np.where(core, 0.0, c.act_core_attn_bytes)
        else:
            sel_core = 0.0
        # full: the whole forward including its exposed communication
        fwd = c.fwd_compute_s + c.tp_exposed_fwd_s + c.cp_exposed_fwd_s + c.ep_exposed_fwd_s
        full_saved = r * c.act_layer_input_bytes + (1.0 - r) * c.act_saved_bytes
        full_work = np.where(r > 0, np.maximum(c.act_working_bytes, c.act_saved_bytes - c.act_layer_input_bytes),
                             c.act_working_bytes)
        if np.any(per_op):
            op_s, op_flops, op_saved = op_policy(state.ctx, kind, c)
            sel_time = np.where(per_op, op_s, sel_time)
            sel_flops = np.where(per_op, op_flops, sel_flops)
            sel_work = np.where(per_op, np.maximum(c.act_working_bytes, c.act_saved_bytes - op_saved), sel_work)
            sel_saved = np.where(per_op, op_saved, sel_saved)
            sel_core = np.where(per_op, 0.0, sel_core)
            sel_other = np.where(per_op, op_saved - c.act_layer_input_bytes, sel_other)
        # per-op: the forward's unsaved TP collectives (all-gathers; all-reduces without SP) run again
        rerun_tp = np.where(per_op, np.where(state.batch.sequence_parallel, 0.5, 1.0) * c.tp_fwd_s, 0.0)
        out[kind] = attrs.evolve(
            c,
            tp_bwd_s=c.tp_bwd_s + rerun_tp, tp_exposed_bwd_s=c.tp_exposed_bwd_s + rerun_tp,
            recompute_s=c.recompute_s + np.where(full, r * fwd, sel_time),
            recompute_flops=c.recompute_flops + np.where(full, r * c.fwd_flops, sel_flops),
            act_saved_bytes=np.where(full, full_saved, sel_saved),
            act_core_attn_bytes=np.where(full, (1.0 - r) * c.act_core_attn_bytes, sel_core),
            act_other_bytes=np.where(full, (1.0 - r) * c.act_other_bytes, sel_other),
            act_working_bytes=np.where(full, full_work, sel_work),
        )
    return attrs.evolve(state, layers=out)


def megatron_args(options) -> list[str]:
    if options.granularity == "op":
        return ["# torchtitan's per-op selective checkpointing has no Megatron-LM equivalent"]
    if options.granularity == "selective":
        if any(getattr(options, m) for m in RECOMPUTE_MODULES):
            return ["--recompute-granularity", "selective", "--recompute-modules", *options.modules]
        return ["--recompute-granularity", "selective"]
    if options.num_layers:
        return ["--recompute-granularity", "full", "--recompute-method", "block",
                "--recompute-num-layers", str(options.num_layers)]
    return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]


def from_megatron(args):
    """``--recompute-granularity selective`` (with ``--recompute-modules``; ``--recompute-activations``
    is the old spelling) or ``full`` (``--recompute-method block --recompute-num-layers N`` recomputes
    N layers per chunk; ``uniform`` recomputes them all)."""
    gran = args.value("--recompute-granularity")
    method = args.value("--recompute-method")
    n = args.number("--recompute-num-layers", 0)
    modules = args.values("--recompute-modules")
    if args.has("--recompute-activations"):
        gran = gran or "selective"
    if gran == "selective":
        chosen = [m for m in modules if m in RECOMPUTE_MODULES]
        return {} if chosen in ([], ["core_attn"]) else {m: True for m in chosen}
    if gran == "full":
        return {"granularity": "full", "num_layers": n} if method == "block" and n else {"granularity": "full"}
    return None


FEATURE = MemoryOptimizer(
    name="recompute",
    description="activation recomputation: selective (attention core) or full (whole layers, Megatron "
                "--recompute-granularity/--recompute-num-layers)",
    equation="[29]-[32]",
    megatron_args=megatron_args,
    from_megatron=from_megatron,
    options_type=RecomputeOptions,
    layer=layer,
    adds_time_only=True,  # trades time for memory: never makes a layer faster
    after=("fp8", "kernel_scaling", "tp_overlap", "cp_overlap", "ep_overlap"),
    before=("activation_offload",),
)


@hookimpl
def mofa_register_memory_optimizers():
    return [FEATURE]
