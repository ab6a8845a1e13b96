"""Data-parallel communication overlap: paper eq. [24].

Megatron reduces gradients and gathers parameters per virtual pipeline chunk
(``--overlap-grad-reduce``, ``--overlap-param-gather``). In the cooldown, the backward of
chunk j hides the gradient reduce-scatter of chunk j+1 (whose gradients are complete); in
the next step's warmup, the forward of chunk j hides the parameter all-gather of chunk j+1.
Only the first all-gather and the last reduce-scatter have nothing to hide behind. With
v = ``pipe.v`` chunks, the DP communication split evenly over them, and per chunk the
compute the critical stage runs between two chunks' collectives — in interleaved 1F1B the
first stage runs one chunk for ``n = min(m, p)`` micro-batches before moving to the next
(warmup forwards, cooldown backwards), so ``n·F`` and ``n·(B+W)`` with F, B, W per chunk::

    T_dp_exposed = AG_1 + RS_v + Σ_{j=1}^{v−1} [max(α·nF, β·AG_j) − nF]
                               + Σ_{j=1}^{v−1} [max(α·n(B+W), β·RS_j) − n(B+W)]

(v = 1: n = 1, the last micro-batch's backward, split into buckets below.)

**Choice** on contention: cost-model.md writes the overlapped term as
``max(0, β·comm − α·compute)``; that lets a larger α (slower compute) *hide more*. Here the
overlapped pair costs ``max(α·compute, β·comm)`` in total like every other overlap, and its
compute is counted elsewhere, so the exposed part is ``max(α·compute, β·comm) − compute``.
The two agree for α = 1; with α = β = 1 the exposed time never exceeds the DP
communication, so the overlap never makes a step slower.

Which collectives:

- with the distributed optimizer (``distributed_optimizer``, or ``cpu_optimizer`` with
  ``shard = true``) ``opt.dp_comm_s`` is reduce-scatter + all-gather; it is split between
  them by bytes: gradients ``d_g`` bytes/parameter (4 with fp32 main grads, 2 with fp16 or
  a bf16 gradient reduction), parameters 2 (so RS = 2/3, AG = 1/3 with bf16); ``fsdp`` rows
  keep only the per-step remainder (embedding, head) here, split the same way;
- without it the DP communication is an all-reduce (= RS + AG of the same gradients, two
  halves) issued per chunk in the cooldown as its gradients complete (Megatron's
  ``--overlap-grad-reduce`` with the plain DDP): the whole all-reduce sits on the cooldown
  side and the warmup side has nothing to hide.

Option ``buckets_per_chunk`` (default 1, the paper's per-chunk granularity) splits each
chunk's communication and compute further into k equal buckets, as Megatron's gradient
buckets do; it lets a non-interleaved schedule (v = 1) hide anything at all. The per-bucket
collective latency is not re-priced, so large values are optimistic.

Acts in the optimizer phase after ``distributed_optimizer``, ``cpu_optimizer`` and
``kernel_scaling`` (which set and scale ``opt.dp_comm_s``). Rows without DP communication are
left unchanged. Memory is unchanged.
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.types import OverlapStrategy, option
from mofa_plugins._overlap import ContentionOptions, _positive_int, contention, opt
from mofa_plugins.distributed_optimizer import reduce_grad_bytes

#: bytes per parameter of the all-gathered (bf16) parameters
PARAM_BYTES = 2.0


@attrs.frozen(kw_only=True)
class DpOverlapOptions(ContentionOptions):
    buckets_per_chunk: int = option(
        1, validator=_positive_int,
        doc="gradient/parameter buckets per virtual chunk (1 = the paper's per-chunk overlap)")


def sharded_rows(batch) -> np.ndarray:
    """Rows whose DP communication is reduce-scatter + all-gather (a distributed optimizer, FSDP)."""
    dist = np.asarray(batch.feature("distributed_optimizer").enabled, bool)
    dist = dist | np.asarray(batch.feature("fsdp").enabled, bool)
    cpu = batch.feature("cpu_optimizer")
    shard = cpu.options.get("shard", np.ones(len(batch)))
    return dist | (np.asarray(cpu.enabled, bool) & (np.asarray(shard) > 0.5))


def side(comm, compute, pieces, alpha, beta):
    """One side of [24]: `comm` split into `pieces`, all but one hidden behind `compute` each."""
    c = comm / pieces
    return c + (pieces - 1.0) * (np.maximum(alpha * compute, beta * c) - compute)


def optimizer(state, rows):
    batch, o, pipe = state.batch, state.opt, state.pipe
    alpha, beta = contention(state, rows)
    k = opt(rows, "buckets_per_chunk", 1.0)
    pieces = pipe.v * k
    grad_bytes = reduce_grad_bytes(batch)
    rs_share = np.where(sharded_rows(batch), grad_bytes / (grad_bytes + PARAM_BYTES), 1.0)
    comm = o.dp_comm_s
    rs, ag = comm * rs_share, comm * (1.0 - rs_share)
    # micro-batches of one chunk the first stage runs back to back between two chunks' collectives
    n = np.where(pipe.v > 1, np.minimum(pipe.m, pipe.p), 1.0)
    exposed_rs = side(rs, n * (pipe.B + pipe.W) / k, pieces, alpha, beta)
    exposed_ag = np.where(ag > 0, side(ag, n * pipe.F / k, pieces, alpha, beta), 0.0)
    exposed = np.where(comm > 0, exposed_rs + exposed_ag, o.dp_exposed_s)
    return attrs.evolve(state, opt=attrs.evolve(o, dp_exposed_s=exposed))


def from_megatron(args):
    """On with ``--overlap-grad-reduce`` or ``--overlap-param-gather`` (Megatron's DDP overlaps)."""
    grad, param = args.has("--overlap-grad-reduce"), args.has("--overlap-param-gather")
    return {} if grad or param else None


FEATURE = OverlapStrategy(
    name="dp_overlap",
    description="hide gradient reduce-scatters behind cooldown backwards and parameter all-gathers behind "
                "warmup forwards, chunk by chunk (Megatron --overlap-grad-reduce/--overlap-param-gather)",
    equation="[24] T = AG_1 + RS_v + Σ_{j<v} [max(α·F, β·AG_j) − F] + Σ_{j<v} [max(α·(B+W), β·RS_j) − (B+W)]",
    options_type=DpOverlapOptions,
    optimizer=optimizer,
    after=("distributed_optimizer", "cpu_optimizer", "fsdp", "kernel_scaling"),
    applies=lambda batch, model, hardware: (batch.dp * batch.cp > 1) | (
        (batch.tp * batch.cp * batch.dp > batch.ep * batch.etp) if model.is_moe else False),
    megatron_args=lambda o: ["--overlap-grad-reduce", "--overlap-param-gather"],
    from_megatron=from_megatron,
)


@hookimpl
def mofa_register_overlap_strategies():
    return [FEATURE]
