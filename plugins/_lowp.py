"""Shared by the features that re-price a layer's operators (``fp8``, ``nvfp4``, ``cuda_graphs``):
re-pricing a layer's GEMMs at another numeric format with the quantisation casts Transformer
Engine adds, applying per-operator time changes to every layer field that depends on them, and the
GEMM weights each stage holds (for the quantised weight copies). Not a plugin: no entry point, no
hooks.
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework.decompose import GEMM, layer_operators, layer_params, parallel_block, routed_pairs
from mofa_framework.engine import mirrored_rows, per_gpu, price_operators, stage_layout
from mofa_framework.types import ConstraintResult

#: transforms a GEMM re-pricing feature must run before: they read the re-priced compute times
REPRICE_BEFORE = ("kernel_scaling", "recompute", "memfine", "activation_offload", "tp_overlap", "cp_overlap",
                  "ep_overlap")


def gemm_input_bytes(model, g, kind) -> np.ndarray:
    """Saved bf16 GEMM inputs of one layer (the part of ``act_other_bytes`` a quantised copy replaces):
    each sublayer's normed input (QKV / mixer input, MLP input), the mixer's output-projection input
    and the MLP's FC2 inputs (a parallel block's sublayers share one normed input)."""
    block = model.block(kind)
    h = model.hidden_size
    T, t, spd, dt = g.tokens, g.t, g.sp_div, g.dt
    normed = 1.0 if parallel_block(model, block) else float(block.sublayers)
    out = dt * T * h / spd * normed + _out_proj_input(model, g, block)
    if block.ffn == "moe":
        routed = routed_pairs(model, g)
        out = out + dt * routed * model.expert_width + dt * routed * model.moe_ffn_hidden_size / g.etp
        if model.shared_expert_ffn:
            out = out + dt * T * model.shared_expert_ffn / t
    elif block.ffn == "dense":
        out = out + dt * T * model.ffn_hidden_size / t
    return out


def _out_proj_input(model, g, block) -> np.ndarray:
    """The input of the mixer's output projection, saved for its weight gradient."""
    if block.mixer == "attention":
        return g.dt * g.tokens * model.num_attention_heads * model.v_dim / g.t
    width = {"mamba2": model.mamba_inner_size, "mamba": model.mamba_inner_size, "none": 0}.get(
        block.mixer, model.linear_num_value_heads * model.linear_value_head_dim)
    return g.dt * g.tokens * width / g.t


def reprice_gemms(state, target: int, efficiency, cast_bytes, saved_fraction, share=1.0, weight_cast_bytes=0.0,
                  recast_input_bytes=0.0, measured=None):
    """Every layer's GEMMs but the attention core re-priced at numeric format ``target``.

    ``Δt_op = t_op(target) / efficiency − t_op(row precision)`` is applied to the layer fields
    the op feeds (forward, backward-input, backward-weight, the TP/expert/QKV groups overlap
    features read), plus the quantisation casts: each GEMM's activation input in forward and its
    output gradient in backward, ``cast_bytes`` per element (scalar or per row) at η_m·BW_hbm, and,
    where no quantised weight copy is kept across micro-batches, its weight in forward and again
    (transposed) in backward, ``weight_cast_bytes`` per element (0: cached), and where the bf16 input
    is saved instead of its quantised copy, that input again in backward, ``recast_input_bytes``
    per element. Saved GEMM inputs
    shrink by ``saved_fraction`` of their bf16 bytes. ``share`` (0–1) scales all of it: the share
    of the layers that run quantised.

    ``measured(op)``, when given, is a measured speedup of the quantised GEMM (its casts included)
    over its time at the row's own precision, per row (NaN where none applies): there
    ``Δt_op = t_op(row precision) / (speedup · efficiency) − t_op(row precision)`` instead (the caller
    passes zero cast bytes for those rows).
    """
    ctx = state.ctx
    g = ctx.geometry
    n = len(g.b)
    ctx_q = attrs.evolve(ctx, geometry=attrs.evolve(g, precision=np.full(n, target)))
    bw = ctx.hardware.efficiency.memory_efficiency * ctx.hardware.hbm_bandwidth_bytes_per_s
    z = np.zeros(n)
    out = {}
    for kind, c in state.layers.items():
        ops = [o for o in layer_operators(ctx.model, g, kind)
               if np.all(np.asarray(o.kind) == GEMM) and o.group != "core_attn"]
        base = price_operators(ctx, ops)
        fast = price_operators(ctx_q, ops)
        cast_f, cast_b = z.copy(), z.copy()
        for o in ops:
            mult = np.asarray(o.flops) / np.maximum(2.0 * o.m * o.n * o.k, 1.0)  # grouped GEMMs: local experts
            cast_f += mult * (o.m * o.k * cast_bytes + o.k * o.n * weight_cast_bytes) / bw
            cast_b += mult * (o.m * o.n * cast_bytes + o.k * o.n * weight_cast_bytes
                              + o.m * o.k * recast_input_bytes) / bw
        saved_cut = saved_fraction * gemm_input_bytes(ctx.model, g, kind) * share
        if measured is not None:  # a measured speedup replaces the re-priced time where it applies
            fast = [np.where(np.isfinite(sp), t0 / np.where(np.isfinite(sp), sp, 1.0), tq)
                    for o, t0, tq in zip(ops, base, fast) for sp in (measured(o),)]
        c = with_op_deltas(c, ops, [(tq / efficiency - t0) * share for t0, tq in zip(base, fast)])
        out[kind] = attrs.evolve(
            c,
            fwd_compute_s=c.fwd_compute_s + cast_f * share,
            bwd_input_s=c.bwd_input_s + cast_b * share,
            act_other_bytes=c.act_other_bytes - saved_cut,
            act_saved_bytes=c.act_saved_bytes - saved_cut,
            act_gemm_input_scale=c.act_gemm_input_scale - saved_fraction * share,
        )
    return attrs.evolve(state, layers=out)


def with_op_deltas(c, ops, deltas):
    """Layer costs `c` with each operator's forward time changed by its delta (arrays over rows):
    forward, backward-input and backward-weight by the op's backward multiples, and the per-group
    times the overlap features read (TP GEMMs, attention core, experts, QKV + attention)."""
    z = np.zeros_like(np.asarray(c.fwd_compute_s, dtype=np.float64))
    d = {k: z.copy() for k in ("fwd", "bi", "bw", "tp_f", "tp_b", "at_f", "at_b", "ex_f", "ex_b", "qkv")}
    for o, dt in zip(ops, deltas):
        d["fwd"] += dt
        d["bi"] += dt * o.bwd_input
        d["bw"] += dt * o.bwd_weight
        both = dt * (o.bwd_input + o.bwd_weight)
        if o.group in ("qkv", "proj", "mlp"):
            d["tp_f"] += dt
            d["tp_b"] += both
        if o.group == "core_attn":
            d["at_f"] += dt
            d["at_b"] += both
        if o.group == "expert":
            d["ex_f"] += dt
            d["ex_b"] += both
        if o.group in ("qkv", "core_attn"):
            d["qkv"] += dt
    return attrs.evolve(
        c,
        fwd_compute_s=c.fwd_compute_s + d["fwd"],
        bwd_input_s=c.bwd_input_s + d["bi"],
        bwd_weight_s=c.bwd_weight_s + d["bw"],
        tp_gemm_fwd_s=c.tp_gemm_fwd_s + d["tp_f"],
        tp_gemm_bwd_s=c.tp_gemm_bwd_s + d["tp_b"],
        attn_fwd_s=c.attn_fwd_s + d["at_f"],
        attn_bwd_s=c.attn_bwd_s + d["at_b"],
        expert_fwd_s=c.expert_fwd_s + d["ex_f"],
        expert_bwd_s=c.expert_bwd_s + d["ex_b"],
        qkv_attn_fwd_s=c.qkv_attn_fwd_s + d["qkv"],
    )


def gemm_params_on_stages(model, batch) -> np.ndarray:
    """GEMM weights (TP-sharded matrices + local experts) per GPU on each stage, (3, N)."""
    lay = stage_layout(model, batch)
    t = batch.tp.astype(np.float64)
    out = np.zeros_like(lay.total)
    for kind, count in lay.counts.items():
        p = layer_params(model, kind)
        out = out + count * (p["sharded"] / t + p["expert"] / (batch.ep * batch.etp))
    return out


def with_weight_copies(state, bytes_per_param):
    """The quantised copies Transformer Engine keeps of each GEMM weight, ``bytes_per_param`` (N,):
    of both stages a mirrored schedule's GPU holds (``engine.per_gpu``)."""
    mem = state.mem
    gemm = per_gpu(gemm_params_on_stages(state.ctx.model, state.batch),
                   mirrored_rows(state.ctx.pm.registry, state.batch))
    extra = gemm * np.asarray(bytes_per_param)[None, :]
    return attrs.evolve(state, mem=attrs.evolve(mem, weights_bytes=mem.weights_bytes + extra))


def needs_format(batch, hardware, feature: str, fmt: str, what: str):
    """Rows with ``feature`` on need ``fmt`` in the profile's ``compute.peak_tflops``."""
    rows = batch.feature(feature)
    if not rows.enabled.any():
        return
    ok = fmt in hardware.compute.peak_tflops
    yield ConstraintResult(
        name=f"{feature}_needs_{fmt}_hardware", feasible=~rows.enabled | ok,
        reason=f"features.{feature} needs {what} tensor cores, but {hardware.name} lists no {fmt} in "
               "compute.peak_tflops: disable the feature or choose another GPU")
