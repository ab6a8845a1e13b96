"""Tensor-parallel communication overlap: paper eq. [20].

The TP collectives of a layer (with sequence parallelism: the all-gathers before and the
reduce-scatters after the QKV/O/MLP GEMMs) and their adjacent GEMMs are split into n chunks
(option ``chunks``) and pipelined, as Megatron's ``--tp-comm-overlap`` (userbuffers) does.
With c_i = c/n, m_i = m/n the compute and communication of chunk i (c = ``tp_gemm_*_s``,
m = ``tp_*_s``, per layer and pass), the total time of GEMMs + collectives is
(cost-model.md's **choice** for [20], the first communication chunk and the last compute
chunk exposed)::

    T = β·m_1 + Σ_{i=1}^{n−1} max(α·c_i, β·m_{i+1}) + α·c_n

α, β are the contention coefficients (hardware profile, or the options). The GEMMs are
already counted in ``compute_fwd`` / ``compute_bwd_*``, so the exposed TP communication
becomes ``T − c`` (forward and backward separately); it contains the contention slowdown
``(α−1)·c`` of the GEMMs, so the breakdown still sums. With α = β = 1 it is
``m/n + (n−1)/n·max(0, m − c) ≤ m``: never slower than no overlap.

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
from mofa_plugins._overlap import overlap_layers, ContentionOptions, _positive_int, contention, opt


@attrs.frozen(kw_only=True)
class TpOverlapOptions(ContentionOptions):
    chunks: int = option(4, search=(2, 4, 8), validator=_positive_int,
                         doc="n: chunks each GEMM and its TP collective are split into and pipelined")


def pipelined(c, m, n, alpha, beta):
    """[20]: total time of compute c and communication m pipelined in n equal chunks."""
    ci, mi = c / n, m / n
    return beta * mi + (n - 1.0) * np.maximum(alpha * ci, beta * mi) + alpha * ci


def layer(state, rows):
    b = state.batch
    alpha, beta = contention(state, rows)
    n = opt(rows, "chunks", 4.0)
    applies = (b.tp > 1) & np.asarray(b.sequence_parallel, bool)

    return overlap_layers(state, applies, "tp_gemm_{}_s", "tp_{}_s", "tp_exposed_{}_s",
                          lambda gemm, comm: pipelined(gemm, comm, n, alpha, beta))


def from_megatron(args):
    """On with ``--tp-comm-overlap`` (Transformer Engine's userbuffers GEMM/collective overlap)."""
    return {} if args.has("--tp-comm-overlap") else None


FEATURE = OverlapStrategy(
    name="tp_overlap",
    description="pipeline each TP collective with its adjacent GEMM in n chunks (Megatron --tp-comm-overlap)",
    equation="[20] T = β·m_1 + Σ_{i=1}^{n−1} max(α·c_i, β·m_{i+1}) + α·c_n",
    options_type=TpOverlapOptions,
    layer=layer,
    applies=lambda batch, model, hardware: (batch.tp > 1) & batch.sequence_parallel,
    megatron_args=lambda o: ["--tp-comm-overlap"],
    from_megatron=from_megatron,
)


@hookimpl
def mofa_register_overlap_strategies():
    return [FEATURE]
