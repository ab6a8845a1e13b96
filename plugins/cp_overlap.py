"""Context-parallel (ring attention) communication overlap: paper eq. [21].

Ring attention runs c = ``cp`` steps per layer and pass; step i computes attention against
the K/V block received at step i−1 while the p2p transfer of the next block is in flight.
With attn_i = attn/c (``attn_*_s`` split over the c blocks; causal load balancing keeps the
blocks equal) and p2p_i = p2p/(c−1) (``cp_*_s`` is the c−1 transfers)::

    T = Σ_{i=1}^{c−1} max(α·attn_i, β·p2p_i) + α·attn_c

The attention is already counted in the compute components, so the exposed CP
communication becomes ``T − attn`` (forward and backward separately), including the
contention slowdown ``(α−1)·attn``. With α = β = 1 it is ``max(0, p2p − (c−1)/c·attn) ≤
p2p``: never slower than no overlap.

Rows with ``cp == 1`` (nothing to overlap) are left unchanged: a no-op, not an infeasible
row, so the tuner can keep the feature on everywhere. Memory is unchanged.
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.types import OverlapStrategy
from mofa_plugins._overlap import overlap_layers, ContentionOptions, contention


@attrs.frozen(kw_only=True)
class CpOverlapOptions(ContentionOptions):
    pass


def ring(attn, p2p, c, alpha, beta):
    """[21]: total time of c ring-attention steps with the c−1 p2p transfers overlapped."""
    steps = np.maximum(c - 1.0, 1.0)
    return steps * np.maximum(alpha * attn / c, beta * p2p / steps) + alpha * attn / c


def layer(state, rows):
    alpha, beta = contention(state, rows)
    c = state.batch.cp.astype(np.float64)
    applies = c > 1

    return overlap_layers(state, applies, "attn_{}_s", "cp_{}_s", "cp_exposed_{}_s",
                          lambda attn, comm: ring(attn, comm, c, alpha, beta))


def cp_comm_type(args) -> str | None:
    """The context-parallel communication a Megatron launch uses (``--cp-comm-type``, default p2p:
    the ring; Megatron-DeepSpeed's ``--ds-sequence-parallel-size``, DeepSpeed-Ulysses, is a2a), or
    None without context parallelism."""
    if args.parallel.get("cp", 1) <= 1:
        return None
    if args.number("--ds-sequence-parallel-size", 1) > 1:
        return "a2a"
    return (args.values("--cp-comm-type") or ("p2p",))[0]


def from_megatron(args):
    """On for context parallelism with the p2p (ring) communication, Megatron's default ``--cp-comm-type``."""
    return {} if cp_comm_type(args) == "p2p" else None


FEATURE = OverlapStrategy(
    name="cp_overlap",
    description="ring attention: each step's attention hides the next K/V p2p transfer",
    equation="[21] T = Σ_{i=1}^{c−1} max(α·attn_i, β·p2p_i) + α·attn_c",
    options_type=CpOverlapOptions,
    layer=layer,
    applies=lambda batch, model, hardware: batch.cp > 1,
    from_megatron=from_megatron,
    megatron_args=lambda o: ["--cp-comm-type", "p2p"],  # TE ring attention overlaps each step's K/V transfer
)


@hookimpl
def mofa_register_overlap_strategies():
    return [FEATURE]
