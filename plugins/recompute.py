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

Recomputed forward FLOPs go to ``recompute_flops`` (hardware FLOPs, HFU).
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.decompose import layer_operators
from mofa_framework.types import MemoryOptimizer, option


@attrs.frozen(kw_only=True)
class RecomputeOptions:
    granularity: str = option("selective", choices=("selective", "full"), search=("selective", "full"),
                              doc="selective: re-run the attention core; full: re-run the whole layer")
    num_layers: int = option(0, validator=attrs.validators.ge(0),
                             doc="full only: layers per model chunk recomputed (Megatron --recompute-num-layers); "
                                 "0 = all")
    include_qkv: bool = option(False, doc="selective only: also re-run the QKV projection (the MoFa paper's "
                                          "reading; Megatron re-runs the core only)")


def _group_flops(ctx, kind: str, groups) -> np.ndarray:
    ops = layer_operators(ctx.model, ctx.geometry, kind)
    z = np.zeros(len(ctx.geometry.b))
    return sum((np.asarray(o.flops, dtype=np.float64) for o in ops if o.group in groups), z)


def full_fraction(state, rows) -> np.ndarray:
    """Share of a chunk's layers that full recompute re-runs."""
    lay = state.layout
    per_chunk = lay.total[0] / state.batch.vpp
    n = rows.options["num_layers"]
    return np.where(n > 0, np.minimum(n, per_chunk) / np.maximum(per_chunk, 1.0), 1.0)


def layer(state, rows):
    full = rows.choice("granularity", "full")
    qkv = rows.options["include_qkv"] > 0.5
    r = np.where(full, full_fraction(state, rows), 0.0)
    out = {}
    for kind, c in state.layers.items():
        # selective
        sel_time = np.where(qkv, c.qkv_attn_fwd_s, c.attn_fwd_s)
        sel_flops = (_group_flops(state.ctx, kind, ("core_attn",))
                     + np.where(qkv, _group_flops(state.ctx, kind, ("qkv",)), 0.0))
        sel_saved = c.act_saved_bytes - c.act_core_attn_bytes
        # full: the whole forward including its exposed communication
        fwd = c.fwd_compute_s + c.tp_exposed_fwd_s + c.cp_exposed_fwd_s + c.ep_exposed_fwd_s
        full_saved = r * c.act_layer_input_bytes + (1.0 - r) * c.act_saved_bytes
        full_work = np.where(r > 0, np.maximum(c.act_working_bytes, c.act_saved_bytes - c.act_layer_input_bytes),
                             c.act_working_bytes)
        out[kind] = attrs.evolve(
            c,
            recompute_s=c.recompute_s + np.where(full, r * fwd, sel_time),
            recompute_flops=c.recompute_flops + np.where(full, r * c.fwd_flops, sel_flops),
            act_saved_bytes=np.where(full, full_saved, sel_saved),
            act_core_attn_bytes=np.where(full, (1.0 - r) * c.act_core_attn_bytes, 0.0),
            act_other_bytes=np.where(full, (1.0 - r) * c.act_other_bytes, c.act_other_bytes),
            act_working_bytes=np.where(full, full_work, c.act_working_bytes),
        )
    return attrs.evolve(state, layers=out)


def megatron_args(options) -> list[str]:
    if options.granularity == "selective":
        return ["--recompute-granularity", "selective"]
    if options.num_layers:
        return ["--recompute-granularity", "full", "--recompute-method", "block",
                "--recompute-num-layers", str(options.num_layers)]
    return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]


FEATURE = MemoryOptimizer(
    name="recompute",
    description="activation recomputation: selective (attention core) or full (whole layers, Megatron "
                "--recompute-granularity/--recompute-num-layers)",
    equation="[29]-[32]",
    megatron_args=megatron_args,
    options_type=RecomputeOptions,
    layer=layer,
    after=("fp8", "kernel_scaling", "tp_overlap", "cp_overlap", "ep_overlap"),
    before=("activation_offload",),
)


@hookimpl
def mofa_register_memory_optimizers():
    return [FEATURE]
