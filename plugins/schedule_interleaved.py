"""Interleaved 1F1B (Narayanan et al. 2021; paper eqs. [9]–[12]).

Each stage holds v model chunks. The first stage runs ``n_w = (p−1)·2 + (v−1)·p`` forward
chunks before its first backward (Megatron's count), so raising v multiplies exposed p2p:
warmup and cooldown each expose n_w transfers and the steady phase one per chunk pair. The
bubble shrinks to ``(p−1)(F_s+B_s)/v``. Stage j holds
``min(m·v, 2(p−j−1) + (v−1)p + 1) / v`` micro-batches' worth of its activations — the first
stage ``p(1 + (p−1)/(p·v))`` (Korthikanti et al.).
"""

from __future__ import annotations

import numpy as np

from mofa_framework import hookimpl
from mofa_framework.types import PipelineSchedule
from mofa_plugins.schedule_1f1b import phase_times
from mofa_framework.engine import Inflight, PipelineTimes


def time(x) -> PipelineTimes:
    n_w = np.minimum(x.m * x.v, 2.0 * (x.p - 1.0) + (x.v - 1.0) * x.p)
    return phase_times(x, n_w, x.v)


def inflight(x) -> Inflight:
    def stage(j):
        return np.minimum(x.m * x.v, 2.0 * np.maximum(x.p - j - 1.0, 0.0) + (x.v - 1.0) * x.p + 1.0) / x.v
    return Inflight(first=stage(0.0), mid=stage(np.minimum(1.0, x.p - 1.0)), last=stage(x.p - 1.0))


def op_order(p, v, m):
    """Megatron's interleaved 1F1B (needs m % p == 0): virtual op k of a stage is chunk
    (k // p) % v of micro-batch (k // (p·v))·p + k % p; backwards run the chunks in reverse."""
    def fwd(k):
        return (k // (p * v)) * p + k % p, (k // p) % v

    def bwd(k):
        return (k // (p * v)) * p + k % p, v - 1 - (k // p) % v

    total = m * v
    out = []
    for s in range(p):
        n = min(total, (p - s - 1) * 2 + (v - 1) * p)
        ops = [("F", *fwd(k)) for k in range(n)]
        for i in range(total - n):
            ops += [("F", *fwd(n + i)), ("BW", *bwd(i))]
        out.append(ops + [("BW", *bwd(i)) for i in range(total - n, total)])
    return out


SCHEDULE = PipelineSchedule(
    name="interleaved-1f1b",
    description="interleaved 1F1B with v virtual chunks per stage (Megatron --num-layers-per-virtual-pipeline-stage)",
    time=time, inflight=inflight, supports_vpp=True, requires_vpp=True, equation="[9]-[12]",
    monotone_bubble=True,  # busy + bubble = (m − 1/v)·max stage work + Σ work / v: grows with any F or B
    min_microbatches=lambda p: p, order=op_order, aliases=("1f1b-i", "interleaved"),
)


@hookimpl
def mofa_register_pipeline_schedules():
    return [SCHEDULE]
