"""Context parallelism by all-to-all (DeepSpeed-Ulysses; Megatron-Core ``--cp-comm-type a2a``).

The engine prices context parallelism as ring attention: in each pass every attention layer sends
its K/V block c − 1 times around the c ranks (``cp_overlap`` hides those steps behind the
attention). The all-to-all form re-shards instead: before the attention one all-to-all per tensor
turns Q, K and V from "local tokens, all of this TP rank's heads" into "all tokens, 1/c of the
heads", the attention runs whole on those heads, and one all-to-all turns the output back. The
backward mirrors them (dO in; dQ, dK, dV out). Per attention layer and pass, four all-to-alls of
the rank's local tensors (T = the rank's tokens, t = TP, dt = bytes per element)::

    fwd:  Q  T·a·d_qk/t·dt     K  T·g·d_qk/t·dt     V  T·g·d_v/t·dt     O  T·a·d_v/t·dt
    bwd:  the same four sizes (dO in; dQ, dK, dV out)

(a attention heads, g KV heads — every head for MLA, whose K/V are up-projected per head — d_qk,
d_v the head dimensions). Each is one ``ALL_TO_ALL`` of the CP group, priced by the
``mofa_collective_latency`` provider: a rank keeps 1/c of its buffer and exchanges the rest. No
overlap: Megatron-Core runs them on the compute stream, and a sliding window or chunked attention
does not shorten them (every rank needs its heads for the whole sequence). Recurrent mixers keep
their own all-to-all (unchanged).

Needs the heads of each TP rank to split over the CP ranks (``a/t`` and ``g/t`` multiples of c);
conflicts with ``cp_overlap`` (the ring's overlap). Memory is unchanged: a rank holds T·c tokens of
a/c heads, the bytes of T tokens of all of them. Not searched by default (a choice of CP
implementation: ``--features ...,cp_a2a`` adds it to ``mofa tune``).
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.decompose import ALL_TO_ALL, Coll
from mofa_framework.engine import price_collectives
from mofa_framework.types import ConstraintResult, CostTransform
from mofa_plugins.cp_overlap import cp_comm_type


def head_widths(model) -> tuple[float, float, float, float]:
    """Elements per token of Q, K, V and the attention output, all heads (before TP)."""
    a = model.num_attention_heads
    if model.is_mla:
        return a * model.qk_head_dim, a * model.qk_head_dim, a * model.v_dim, a * model.v_dim
    d = model.kv_channels
    g = model.num_kv_heads
    return a * d, g * d, g * d, a * d


def a2a_seconds(ctx) -> np.ndarray:
    """One pass's four all-to-alls of one attention layer, seconds per row."""
    g = ctx.geometry
    one = np.ones_like(np.asarray(g.c, dtype=np.float64))
    colls = [Coll(name=f"cp_a2a_{label}", parallel="cp", kind=ALL_TO_ALL, bytes=g.tokens * width / g.t * g.dt,
                  group_size=g.c, stride=g.t * one)
             for label, width in zip(("q", "k", "v", "o"), head_widths(ctx.model))]
    return sum(price_collectives(ctx, colls))


def layer(state, rows):
    ctx = state.ctx
    kinds = [k for k in ctx.model.block_kinds if ctx.model.block(k).is_attention]
    if not kinds:
        return state
    t = ctx.per_structure(a2a_seconds)
    on = np.asarray(rows.enabled, bool) & (np.asarray(ctx.geometry.c) > 1)
    out = dict(state.layers)
    for kind in kinds:
        lc = out[kind]
        fwd, bwd = np.where(on, t, lc.cp_fwd_s), np.where(on, t, lc.cp_bwd_s)
        out[kind] = attrs.evolve(lc, cp_fwd_s=fwd, cp_bwd_s=bwd,
                                 cp_exposed_fwd_s=np.where(on, t, lc.cp_exposed_fwd_s),
                                 cp_exposed_bwd_s=np.where(on, t, lc.cp_exposed_bwd_s))
    return attrs.evolve(state, layers=out)


def attention_cp(batch, model, hardware):
    """Rows with context parallelism (cp > 1) on a model with attention layers."""
    attention = any(model.block(k).is_attention for k in model.block_kinds)
    return (np.asarray(batch.cp) > 1) & attention


@hookimpl
def mofa_candidate_constraints(batch, model, hardware):
    rows = batch.feature("cp_a2a")
    if not rows.enabled.any():
        return
    per_rank = np.asarray(batch.tp) * np.asarray(batch.cp)
    kv = model.num_attention_heads if model.is_mla else model.num_kv_heads
    ok = (model.num_attention_heads % per_rank == 0) & (kv % per_rank == 0)
    yield ConstraintResult(
        name="cp_a2a_heads", feasible=~(np.asarray(rows.enabled, bool) & (np.asarray(batch.cp) > 1) & ~ok),
        reason=f"features.cp_a2a splits each TP rank's heads over the CP ranks: tp × cp must divide "
               f"model.num_attention_heads ({model.num_attention_heads}) and the KV heads ({kv}); "
               f"lower cp or tp, or use the ring (cp_overlap)")


def from_megatron(args):
    """``--cp-comm-type a2a`` with context parallelism."""
    return {} if cp_comm_type(args) == "a2a" else None


FEATURE = CostTransform(
    name="cp_a2a",
    description="context parallelism by all-to-all (DeepSpeed-Ulysses, --cp-comm-type a2a): Q, K, V and "
                "the output re-sharded from tokens to heads and back instead of the K/V ring",
    equation="t_cp = 4 all-to-alls of T·{a·d_qk, g·d_qk, g·d_v, a·d_v}/t·dt per attention layer and pass",
    layer=layer,
    applies=attention_cp,
    conflicts=("cp_overlap",),
    tunable=False,
    megatron_args=lambda o: ["--cp-comm-type", "a2a"],
    from_megatron=from_megatron,
    before=("kernel_scaling", "recompute", "memfine", "activation_offload"),
)


@hookimpl
def mofa_register_cost_transforms():
    return [FEATURE]
