"""Breadth-first pipeline schedule (Lamy-Poirier 2022) as a third-party plugin.

Each stage runs the forward of *all* micro-batches through a chunk before moving on (looping
over the v chunks), then the backwards in reverse. Its bubble equals interleaved 1F1B's,
``(p−1)(F_s+B_s)/v``, and every p2p can overlap with the next micro-batch's compute, but
like GPipe it keeps all m micro-batches' activations in flight.
"""

import numpy as np

from mofa_framework import hookimpl
from mofa_framework.engine import Inflight, PipelineTimes
from mofa_framework.types import PipelineSchedule


def time(x):
    work = x.F + x.B + x.W
    busy = x.m * x.v * work
    bubble = np.maximum((x.sum_F + x.sum_B + x.sum_W) / x.v - work, 0.0)
    pp = 2.0 * (x.p - 1.0) * x.p2p_s  # only the fill and drain transfers are exposed
    half = (busy + bubble + pp) / 2
    return PipelineTimes(busy_s=busy, bubble_s=bubble, pp_comm_s=pp, warmup_s=half, steady_s=np.zeros_like(busy),
                         cooldown_s=half)


def inflight(x):
    return Inflight(first=x.m, mid=x.m, last=x.m)


def op_order(p, v, m):
    """Per stage: the forwards of every micro-batch chunk by chunk, then the backwards in reverse
    (for the simulator and ``mofa predict --trace``; Megatron's interleaved placement)."""
    fwd = [("F", mb, c) for c in range(v) for mb in range(m)]
    bwd = [("BW", mb, c) for c in reversed(range(v)) for mb in range(m)]
    return [fwd + bwd for _ in range(p)]


@hookimpl
def mofa_register_pipeline_schedules():
    return [PipelineSchedule(name="breadth-first", description="breadth-first pipeline (Lamy-Poirier 2022)",
                             time=time, inflight=inflight, supports_vpp=True, order=op_order)]
