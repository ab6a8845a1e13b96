"""Tensor-parallel communication overlap: paper eq. [20], and Transformer Engine's userbuffers.

The TP collectives of a layer (with sequence parallelism: the all-gathers before and the
reduce-scatters after the QKV/O/MLP GEMMs) run alongside their adjacent GEMMs, as Megatron's
``--tp-comm-overlap`` does. Per layer and pass, c = the GEMMs next to the TP collectives
(``tp_gemm_*_s``) and m = the collectives (``tp_*_s``); α, β are the contention coefficients
(hardware profile, or the options). The GEMMs are already counted in ``compute_fwd`` /
``compute_bwd_*``, so the exposed TP communication becomes ``T − c``, T the total time of the
overlapped GEMMs and collectives; it contains the contention slowdown ``(α−1)·c`` of the GEMMs,
so the breakdown still sums.

Option ``method`` says how they are overlapped:

- ``te`` (default): Transformer Engine's default userbuffers methods (``initialize_ub`` in
  ``transformer_engine/pytorch/module/base.py``). Half of each pass's collectives (the
  all-gathers: before QKV and FC1 in the forward, of the gradient before O and FC2's dgrad in
  the backward) run as a **ring exchange** against half of the pass's GEMMs (``c' = c/2``,
  ``m' = m/2``, t = ``tp``): the GEMM is split into t chunks, the first on the local shard, each
  of the other t − 1 waiting for one p2p step::

      T_ring = (t − 1)·max(α·c'/t, β·m'/(t − 1)) + α·c'/t

  The other half (the reduce-scatters) runs as a **pipeline** of n = ``chunks`` pieces in the
  forward (after O and FC2: eq. [20] below on c', m') and in **bulk** behind the whole wgrad
  GEMM in the backward (after QKV and FC1's dgrad: :func:`contended_total` of c', m'). Pairing
  each half of the collectives with half of the GEMMs is MoFa's **choice**: the engine keeps one
  GEMM time per layer and pass, not one per projection.
- ``chunked``: the paper's eq. [20] on every collective, both split into n = ``chunks`` equal
  chunks (c_i = c/n, m_i = m/n; cost-model.md's **choice** for [20], the first communication
  chunk and the last compute chunk exposed)::

      T = β·m_1 + Σ_{i=1}^{n−1} max(α·c_i, β·m_{i+1}) + α·c_n

With α = β = 1 neither is ever slower than no overlap: eq. [20] exposes
``m/n + (n−1)/n·max(0, m − c) ≤ m``, the ring ``(t−1)·max(0, m'/(t−1) − c'/t) ≤ m'``, the bulk
``max(0, m' − c') ≤ m'``.

Rows where TP overlap cannot apply — ``tp == 1`` or no sequence parallelism (Megatron's TP
overlap requires it) — are left unchanged (a no-op rather than an infeasible row, so the
tuner can leave the feature on everywhere). The LM head's TP collective is not overlapped.
Memory is unchanged.
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.types import OverlapStrategy, option
from mofa_plugins._overlap import (ContentionOptions, _positive_int, contended_total, contention, opt,
                                   overlap_layers)

METHODS = ("te", "chunked")


@attrs.frozen(kw_only=True)
class TpOverlapOptions(ContentionOptions):
    method: str = option("te", choices=METHODS,
                         doc="te: Transformer Engine's userbuffers (ring exchange, pipeline, bulk); chunked: eq. [20]")
    chunks: int = option(4, search=(2, 4, 8), validator=_positive_int,
                         doc="n: chunks a pipelined GEMM and its TP collective are split into")


def pipelined(c, m, n, alpha, beta):
    """[20]: total time of compute c and communication m pipelined in n equal chunks."""
    ci, mi = c / n, m / n
    return beta * mi + (n - 1.0) * np.maximum(alpha * ci, beta * mi) + alpha * ci


def ring_exchange(c, m, t, alpha, beta):
    """Total time of a GEMM c split in t chunks against an all-gather m sent in t − 1 p2p steps: the
    first chunk runs on the local shard, each of the others after its step."""
    return (t - 1.0) * np.maximum(alpha * c / t, beta * m / (t - 1.0)) + alpha * c / t


def userbuffers(c, m, t, n, alpha, beta, backward: bool):
    """Transformer Engine's default: half ring exchange, half pipelined (forward) or bulk (backward)."""
    half_c, half_m = 0.5 * c, 0.5 * m
    rest = (contended_total(half_c, half_m, alpha, beta) if backward
            else pipelined(half_c, half_m, n, alpha, beta))
    return ring_exchange(half_c, half_m, np.maximum(t, 2.0), alpha, beta) + rest


def layer(state, rows):
    b = state.batch
    alpha, beta = contention(state, rows)
    n = opt(rows, "chunks", 4.0)
    te = rows.choice("method", "te") if "method" in rows.options else np.ones(len(b), bool)
    t = np.asarray(b.tp, np.float64)
    applies = (b.tp > 1) & np.asarray(b.sequence_parallel, bool)

    def total(backward: bool):
        def priced(gemm, comm):  # each method only where a row uses it (usually one for all)
            ub = userbuffers(gemm, comm, t, n, alpha, beta, backward) if te.any() else None
            if te.all():
                return ub
            chunked = pipelined(gemm, comm, n, alpha, beta)
            return chunked if ub is None else np.where(te, ub, chunked)
        return priced

    return overlap_layers(state, applies, "tp_gemm_{}_s", "tp_{}_s", "tp_exposed_{}_s", total(False), total(True))


def from_megatron(args):
    """On with ``--tp-comm-overlap`` (Transformer Engine's userbuffers GEMM/collective overlap)."""
    return {} if args.has("--tp-comm-overlap") else None


FEATURE = OverlapStrategy(
    name="tp_overlap",
    description="overlap each TP collective with its adjacent GEMM (Megatron --tp-comm-overlap: TE userbuffers)",
    equation="[20] T = β·m_1 + Σ_{i=1}^{n−1} max(α·c_i, β·m_{i+1}) + α·c_n (method chunked); "
             "method te: ring exchange (t−1)·max(α·c'/t, β·m'/(t−1)) + α·c'/t on half, "
             "[20] (fwd) or bulk (bwd) on the other half",
    options_type=TpOverlapOptions,
    layer=layer,
    applies=lambda batch, model, hardware: (batch.tp > 1) & batch.sequence_parallel,
    megatron_args=lambda o: ["--tp-comm-overlap"],
    from_megatron=from_megatron,
)


@hookimpl
def mofa_register_overlap_strategies():
    return [FEATURE]
