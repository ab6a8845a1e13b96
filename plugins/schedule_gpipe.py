"""GPipe (Huang et al. 2019): every forward of the step, then every backward.

With per-stage forward F, backward-input B, backward-weight W and p2p time τ on the critical
stage: busy ``m(F+B+W)``; fill and drain cost the other stages' work,
``Σ_j(F_j+B_j+W_j) − (F+B+W)`` — ``(p−1)(F+B+W)`` for equal stages, the same bubble as 1F1B;
one p2p is exposed after each forward and each backward (``2mτ``; no steady phase for PP
overlap to hide). The price is memory: every stage holds all ``m`` micro-batches'
activations at the turn from forwards to backwards. With one stage (pp = 1) there is no
pipeline to fill: frameworks accumulate gradients one micro-batch at a time (Megatron's
``forward_backward_no_pipelining``; torchtitan and DeepSpeed build no schedule), so one
micro-batch is held, as under 1F1B.
"""

from __future__ import annotations

import numpy as np

from mofa_framework import hookimpl
from mofa_framework.engine import Inflight, PipelineTimes
from mofa_framework.types import PipelineSchedule
from mofa_plugins.ep_overlap import unpaired_schedule_rule


def time(x) -> PipelineTimes:
    bubble_f = np.maximum(x.sum_F - x.F, 0.0)
    bubble_b = np.maximum(x.sum_B + x.sum_W - x.B - x.W, 0.0)
    warmup = x.m * (x.F + x.p2p_s) + bubble_f
    cooldown = x.m * (x.B + x.W + x.p2p_s) + bubble_b
    return PipelineTimes(busy_s=x.m * (x.F + x.B + x.W), bubble_s=bubble_f + bubble_b, pp_comm_s=2.0 * x.m * x.p2p_s,
                         warmup_s=warmup, steady_s=np.zeros_like(x.m), cooldown_s=cooldown)


def inflight(x) -> Inflight:
    held = np.where(x.p > 1, x.m * 1.0, 1.0)
    return Inflight(first=held, mid=held, last=held)


def op_order(p: int, v: int, m: int) -> list[list[tuple[str, int, int]]]:
    """Per stage: F of micro-batches 0..m−1, then their (unsplit) backwards in the same order."""
    return [[("F", i, 0) for i in range(m)] + [("BW", i, 0) for i in range(m)] for _ in range(p)]


SCHEDULE = PipelineSchedule(
    name="gpipe",
    description="GPipe: all forwards, then all backwards; holds every micro-batch's activations",
    time=time, inflight=inflight, supports_vpp=False, equation="[9]-[12] (GPipe)", order=op_order,
    monotone_bubble=True,  # busy + bubble = (m − 1/v)·max stage work + Σ work / v: grows with any F or B
    overlaps_p2p=False,  # no steady phase: nothing for PP overlap to hide
    feasible=unpaired_schedule_rule("gpipe"),  # all forwards, then all backwards: nothing to pair
)


@hookimpl
def mofa_register_pipeline_schedules():
    return [SCHEDULE]
