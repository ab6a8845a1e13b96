"""FP8 training with Transformer Engine (a cost transform beyond the paper).

**How it relates to ``parallel.precision``.** ``precision = "fp8"`` only tells the operator
provider to price *every* GEMM of the row at the FP8 peak; it changes nothing else. This
feature models the Transformer Engine recipe around it and never double-counts:

- *Time (layer phase).* The layer's GEMMs except the attention core (which stays bf16, as in
  TE's ``DotProductAttention``) are re-priced by the operator provider at ``fp8`` and the
  difference to what the engine priced them at (the row's own precision) is applied to every
  affected layer field::

      Δt_op = t_op(fp8) / efficiency − t_op(row precision)

  so a row that already says ``precision = "fp8"`` gets Δ = 0 from the GEMMs (with
  ``efficiency = 1``) and only the effects below. A GPU without an FP8 entry in
  ``compute.peak_tflops`` is rejected by a constraint. Plus the casts TE adds: each GEMM's
  activation input is quantised in forward (read bf16, write fp8: 3 bytes/element) and its
  output gradient in backward, memory-bound at η_m·BW_hbm. Weight casts happen once per
  step (TE caches the fp8 weights across micro-batches, ``is_first_microbatch``) and are
  neglected. Embedding and LM head stay in the row's precision.
- *Weights (memory phase).* TE keeps the bf16 weights (the optimizer's fp32 master copy is
  unchanged) plus an fp8 copy of each GEMM weight, and on Hopper-style tensor cores (TN
  layout only) an fp8 transposed copy for the backward: ``weights += P_gemm · (1 + 1)`` bytes
  (``transpose_cache = false``: 1 byte). P_gemm: the TP-sharded attention/MLP matrices and the
  local experts, not embeddings or norms.
- *Activations (layer phase, ``fp8_activations``).* TE saves the fp8 cast of a GEMM's input
  for its weight-gradient GEMM instead of the bf16 tensor. With the option on (default), the
  saved GEMM inputs — QKV input, O-projection input, FC1 input, FC2 input, and for MoE the
  dispatched tokens and the expert FC2 input — count 1 byte per element instead of 2.
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.batch import PRECISIONS
from mofa_framework.decompose import GEMM, layer_operators, layer_params
from mofa_framework.engine import price_operators, stage_layout
from mofa_framework.types import ConstraintResult, CostTransform, option

FP8 = PRECISIONS.index("fp8")
#: bytes moved per element by a bf16 → fp8 quantisation kernel
CAST_BYTES = 3.0


@attrs.frozen(kw_only=True)
class Fp8Options:
    efficiency: float = option(1.0, validator=[attrs.validators.gt(0.0), attrs.validators.le(1.0)],
                               doc="fp8 GEMM efficiency relative to the provider's (time = t_fp8 / efficiency)")
    fp8_activations: bool = option(True, doc="save GEMM inputs for backward in fp8 (1 byte) instead of bf16")
    transpose_cache: bool = option(True, doc="keep an fp8 transposed weight copy besides the fp8 weights")


def _gemm_input_bytes(model, g, kind) -> np.ndarray:
    """Saved bf16 GEMM inputs of one layer (the part of ``act_other_bytes`` fp8 halves)."""
    h, a = model.hidden_size, model.num_attention_heads
    T, t, spd, dt = g.tokens, g.t, g.sp_div, g.dt
    o_in = dt * T * a * model.v_dim / t
    out = dt * T * h / spd * 2.0 + o_in  # QKV input, MLP (FC1) input, O-proj input
    if kind == "moe":
        routed = T / spd * model.experts_per_token * g.etp
        out = out + dt * routed * h + dt * routed * model.moe_ffn_hidden_size / g.etp
        if model.num_shared_experts:
            out = out + dt * T * model.num_shared_experts * model.moe_ffn_hidden_size / t
    else:
        out = out + dt * T * model.ffn_hidden_size / t
    return out


def layer(state, rows):
    ctx = state.ctx
    g = ctx.geometry
    n = len(g.b)
    ctx8 = attrs.evolve(ctx, geometry=attrs.evolve(g, precision=np.full(n, FP8)))
    eff = rows.options["efficiency"]
    bw = ctx.hardware.efficiency.memory_efficiency * ctx.hardware.hbm_bandwidth_bytes_per_s
    z = np.zeros(n)
    out = {}
    for kind, c in state.layers.items():
        ops = [o for o in layer_operators(ctx.model, g, kind)
               if np.all(np.asarray(o.kind) == GEMM) and o.group != "core_attn"]
        base = price_operators(ctx, ops)
        fast = price_operators(ctx8, ops)
        d = {k: z.copy() for k in ("fwd", "bi", "bw", "tp_f", "tp_b", "ex_f", "ex_b", "qkv")}
        cast_f, cast_b = z.copy(), z.copy()
        for o, t0, t8 in zip(ops, base, fast):
            dt = t8 / eff - t0
            d["fwd"] += dt
            d["bi"] += dt * o.bwd_input
            d["bw"] += dt * o.bwd_weight
            if o.group in ("qkv", "proj", "mlp"):
                d["tp_f"] += dt
                d["tp_b"] += dt * (o.bwd_input + o.bwd_weight)
            if o.group == "expert":
                d["ex_f"] += dt
                d["ex_b"] += dt * (o.bwd_input + o.bwd_weight)
            if o.group == "qkv":
                d["qkv"] += dt
            mult = np.asarray(o.flops) / np.maximum(2.0 * o.m * o.n * o.k, 1.0)  # grouped GEMMs: local experts
            cast_f += mult * o.m * o.k * CAST_BYTES / bw
            cast_b += mult * o.m * o.n * CAST_BYTES / bw
        saved_cut = np.where(rows.options["fp8_activations"] > 0.5, _gemm_input_bytes(ctx.model, g, kind) / 2.0, 0.0)
        out[kind] = attrs.evolve(
            c,
            fwd_compute_s=c.fwd_compute_s + d["fwd"] + cast_f,
            bwd_input_s=c.bwd_input_s + d["bi"] + cast_b,
            bwd_weight_s=c.bwd_weight_s + d["bw"],
            tp_gemm_fwd_s=c.tp_gemm_fwd_s + d["tp_f"],
            tp_gemm_bwd_s=c.tp_gemm_bwd_s + d["tp_b"],
            expert_fwd_s=c.expert_fwd_s + d["ex_f"],
            expert_bwd_s=c.expert_bwd_s + d["ex_b"],
            qkv_attn_fwd_s=c.qkv_attn_fwd_s + d["qkv"],
            act_other_bytes=c.act_other_bytes - saved_cut,
            act_saved_bytes=c.act_saved_bytes - saved_cut,
        )
    return attrs.evolve(state, layers=out)


def gemm_params_on_stages(model, batch) -> np.ndarray:
    """GEMM weights (TP-sharded matrices + local experts) per GPU on each stage, (3, N)."""
    lay = stage_layout(model, batch)
    t = batch.tp.astype(np.float64)
    d = layer_params(model, "dense")
    out = lay.dense * (d["sharded"] / t)
    if model.is_moe:
        mo = layer_params(model, "moe")
        out = out + lay.moe * (mo["sharded"] / t + mo["expert"] / (batch.ep * batch.etp))
    return out


def memory(state, rows):
    mem = state.mem
    per = 1.0 + np.where(rows.options["transpose_cache"] > 0.5, 1.0, 0.0)
    extra = gemm_params_on_stages(state.ctx.model, state.batch) * per[None, :]
    return attrs.evolve(state, mem=attrs.evolve(mem, weights_bytes=mem.weights_bytes + extra))


@hookimpl
def mofa_candidate_constraints(batch, model, hardware):
    rows = batch.feature("fp8")
    if not rows.enabled.any():
        return
    ok = "fp8" in hardware.compute.peak_tflops
    yield ConstraintResult(
        name="fp8_needs_fp8_hardware", feasible=~rows.enabled | ok,
        reason=f"features.fp8 needs FP8 tensor cores, but {hardware.name} lists no fp8 in compute.peak_tflops: "
               "disable the feature or choose another GPU")


def megatron_args(options) -> list[str]:
    return ["--fp8-format", "hybrid"]


FEATURE = CostTransform(
    name="fp8",
    description="FP8 GEMMs with Transformer Engine: GEMMs at the fp8 peak (attention stays bf16), cast "
                "kernels, fp8 weight (+ transpose) caches, fp8-saved GEMM inputs",
    equation="Δt = Σ_GEMM t(fp8)/η − t(row precision) + casts; M_w += P_gemm·(1+1)",
    megatron_args=megatron_args,
    options_type=Fp8Options,
    layer=layer,
    memory=memory,
    before=("kernel_scaling", "recompute", "memfine", "activation_offload", "tp_overlap", "cp_overlap",
            "ep_overlap"),
    applies=lambda batch, model, hardware: np.full(len(batch), "fp8" in hardware.compute.peak_tflops),
    tunable=False,  # numerics are the user's choice: `mofa tune --features ...,fp8` searches it
    may_reduce_compute=True,
)


@hookimpl
def mofa_register_cost_transforms():
    return [FEATURE]
