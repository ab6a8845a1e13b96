"""MemFine-style chunked MoE recomputation (beyond the paper's equations).

MemFine splits an MoE layer's token dispatch and expert computation into ``n`` chunks
(``chunks``) and recomputes the experts chunk by chunk in backward, so only a chunk's worth
of expert activations is materialised at a time. Per MoE layer and micro-batch, with
S_exp = the expert activations (dispatched tokens + the expert FFN's saved tensors,
``dt·R·h + dt·R·(3|2)·f_e/etp`` for R routed token-expert pairs on this GPU, as in
``decompose.saved_activation_bytes``)::

    S' = S − S_exp + S_exp/n             (the last chunk's, whose backward starts at once)
    W  = max(W, S_exp/n)                 (one recomputed chunk while its backward runs)
    T_bwd' = T_bwd + (n−1)/n · T_exp_fwd + (n−1)·o
    T_fwd' = T_fwd + (n−1)·o

``o`` (``chunk_overhead_us``, default 20 µs) is the cost of one more chunk per pass: an
extra grouped-GEMM launch pair and an extra dispatch/combine all-to-all pair, whose
latency no longer amortises (**choice**: a constant; measure it with `mofa calibrate`).
After ``fp8``/``nvfp4``, which already keep the experts' saved GEMM inputs quantised, S_exp is
what they left (``stored_expert_bytes``), so their saving is not dropped twice.
Dense layers are untouched. MemFine acts before ``recompute``: under full recompute the
re-run forward is chunked again and its experts are recomputed again (nested checkpoints), so
both recompute times count. The recomputed expert forward FLOPs go to ``recompute_flops``.
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.decompose import layer_operators, routed_pairs
from mofa_framework.limits import between
from mofa_framework.types import Activation, MemoryOptimizer, option


@attrs.frozen(kw_only=True)
class MemFineOptions:
    chunks: int = option(4, validator=between(1, 1024, integer=True), search=(2, 4, 8),
                         doc="chunks the dispatch + expert computation of a micro-batch is split into")
    chunk_overhead_us: float = option(20.0, validator=between(0.0, 1e6, why="µs"),
                                      doc="launch + all-to-all latency per extra chunk and pass, µs")


def expert_activation_bytes(model, g) -> np.ndarray:
    """S_exp: the routed experts' saved tensors per MoE layer and micro-batch."""
    routed = routed_pairs(model, g)
    width = 3.0 if model.activation is Activation.swiglu else 2.0
    return g.dt * routed * model.expert_width + g.dt * routed * width * model.moe_ffn_hidden_size / g.etp


def stored_expert_bytes(model, g, c) -> np.ndarray:
    """S_exp as the layer costs `c` store it now. A feature that ran before (fp8, nvfp4) may keep a
    quantised copy of every saved GEMM input, ``act_gemm_input_scale`` of its bf16 size — the
    experts' input and FC2 input among them: ``S_exp' = S_exp − (1 − scale)·dt·R·(h + f_e/etp)``.
    Dropping the bf16 S_exp after such a cut would count the cut twice (negative activations)."""
    routed = routed_pairs(model, g)
    cut = (1.0 - c.act_gemm_input_scale) * g.dt * routed * (model.expert_width + model.moe_ffn_hidden_size / g.etp)
    return np.maximum(expert_activation_bytes(model, g) - cut, 0.0)


def _expert_flops(ctx, kind: str) -> np.ndarray:
    """The routed experts' forward FLOPs per layer of MoE `kind` and micro-batch."""
    ops = layer_operators(ctx.model, ctx.geometry, kind)
    return sum((np.asarray(op.flops, dtype=np.float64) for op in ops if op.group == "expert"),
               np.zeros(len(ctx.geometry.b)))


def layer(state, rows):
    ctx = state.ctx
    n = np.maximum(rows.options["chunks"], 1.0)
    extra = (n - 1.0) / n
    o = (n - 1.0) * rows.options["chunk_overhead_us"] * 1e-6
    out = dict(state.layers)
    for kind in ctx.model.moe_kinds:  # MoE layers only
        c = out[kind]
        s_exp = stored_expert_bytes(ctx.model, ctx.geometry, c)
        dropped = s_exp * extra
        exp_flops = ctx.per_structure(lambda cx, kind=kind: _expert_flops(cx, kind))
        out[kind] = attrs.evolve(
            c,
            fwd_compute_s=c.fwd_compute_s + o,
            bwd_input_s=c.bwd_input_s + o,
            expert_fwd_s=c.expert_fwd_s + o,
            expert_bwd_s=c.expert_bwd_s + o,
            recompute_s=c.recompute_s + extra * c.expert_fwd_s,
            recompute_flops=c.recompute_flops + extra * exp_flops,
            act_other_bytes=c.act_other_bytes - dropped,
            act_saved_bytes=c.act_saved_bytes - dropped,
            act_working_bytes=np.maximum(c.act_working_bytes, s_exp / n),
        )
    return attrs.evolve(state, layers=out)


def megatron_args(options) -> list[str]:
    return []  # not an upstream Megatron-LM option


FEATURE = MemoryOptimizer(
    name="memfine",
    description="MemFine: chunked MoE token dispatch + expert computation with per-chunk recomputation "
                "(MoE layers only)",
    equation="S' = S − (n−1)/n·S_exp; T_bwd' = T_bwd + (n−1)/n·T_exp_fwd + (n−1)·o",
    megatron_args=megatron_args,
    options_type=MemFineOptions,
    layer=layer,
    adds_time_only=True,  # trades time for memory: never makes a layer faster
    after=("fp8", "kernel_scaling", "tp_overlap", "ep_overlap"),
    before=("recompute", "activation_offload"),
    applies=lambda batch, model, hardware: np.full(len(batch), model.is_moe),
)


@hookimpl
def mofa_register_memory_optimizers():
    return [FEATURE]
