"""The non-interleaved 1F1B pipeline schedule (PipeDream-Flush; paper eqs. [9]–[12]).

On the critical stage, with per-stage forward F, backward-input B and backward-weight W and
p2p time τ: warmup runs ``n_w = min(m, p−1)`` forwards, steady ``m − n_w`` forward/backward
pairs, cooldown the remaining backwards. Busy time is ``m(F+B+W)``; the fill/drain bubble is
the other stages' work ``Σ_j(F_j+B_j+W_j) − (F+B+W)`` — ``(p−1)(F+B+W)`` for equal stages;
p2p is exposed after each warmup forward and cooldown backward, and per steady pair: Megatron-LM's
non-interleaved schedule waits on each batched send/receive (its arguments turn ``overlap_p2p_comm``
off without interleaving), so PP overlap does not apply to it (``overlaps_p2p = False``; the
schedules built on :func:`phase_times` take the steady p2p as the pipeline phase leaves it). Stage j
holds ``min(m, p−j)`` micro-batches.
"""

from __future__ import annotations

import numpy as np

from mofa_framework import hookimpl
from mofa_framework.engine import Inflight, PipelineTimes
from mofa_framework.types import PipelineSchedule
from mofa_plugins.ep_overlap import unpaired_schedule_rule


def phase_times(x, n_w, chunks) -> PipelineTimes:
    """Phase-wise pipeline time shared by 1F1B-family schedules.

    `chunks` forward/backward pairs per micro-batch (v for interleaving), `n_w` warmup
    forwards on the critical stage.
    """
    work = x.F + x.B + x.W
    total_chunks = x.m * chunks
    busy = total_chunks * work
    bubble_f = np.maximum(x.sum_F / chunks - x.F, 0.0)
    bubble_b = np.maximum((x.sum_B + x.sum_W) / chunks - x.B - x.W, 0.0)
    steady_n = total_chunks - n_w
    pp = 2.0 * n_w * x.p2p_s + steady_n * x.steady_p2p_s
    warmup = n_w * (x.F + x.p2p_s) + bubble_f
    steady = steady_n * (work + x.steady_p2p_s)
    cooldown = n_w * (x.B + x.W + x.p2p_s) + bubble_b
    return PipelineTimes(busy_s=busy, bubble_s=bubble_f + bubble_b, pp_comm_s=pp, warmup_s=warmup,
                         steady_s=steady, cooldown_s=cooldown)


def time(x) -> PipelineTimes:
    n_w = np.minimum(x.m, x.p - 1.0)
    return phase_times(x, n_w, 1.0)


def inflight(x) -> Inflight:
    return Inflight(first=np.minimum(x.m, x.p), mid=np.minimum(x.m, np.maximum(x.p - 1.0, 1.0)),
                    last=np.minimum(x.m, 1.0))


def op_order(p, v, m):
    """PipeDream-Flush: stage s warms up with min(m, p−s−1) forwards, then F/BW pairs."""
    out = []
    for s in range(p):
        n = min(m, p - s - 1)
        ops = [("F", i, 0) for i in range(n)]
        for i in range(m - n):
            ops += [("F", n + i, 0), ("BW", i, 0)]
        out.append(ops + [("BW", i, 0) for i in range(m - n, m)])
    return out


SCHEDULE = PipelineSchedule(
    name="1f1b",
    description="one-forward-one-backward (PipeDream-Flush), Megatron's default without interleaving",
    time=time, inflight=inflight, supports_vpp=False, equation="[9]-[12]",
    monotone_bubble=True,  # busy + bubble = (m − 1/v)·max stage work + Σ work / v: grows with any F or B
    min_microbatches=lambda p: p, order=op_order, overlaps_p2p=False,
    feasible=unpaired_schedule_rule("1f1b"),  # no A2A overlap at PP > 1: nothing pairs micro-batches
)


@hookimpl
def mofa_register_pipeline_schedules():
    return [SCHEDULE]
