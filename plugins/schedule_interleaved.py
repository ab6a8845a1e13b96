"""Interleaved 1F1B (Narayanan et al. 2021; paper eqs. [9]–[12]).

Each stage holds v model chunks. Megatron-Core runs the micro-batches of a step in groups of N per
virtual stage (``--microbatch-group-size-per-virtual-pipeline-stage``, pp by default: the schedule
table runs chunk 0 of a group, then chunk 1, …). The first stage runs ``n_w = (p−1)·2 + (v−1)·N``
forward chunks before its first backward (Megatron's count), so raising v multiplies exposed p2p:
warmup and cooldown each expose n_w transfers and the steady phase one per chunk pair. The
bubble shrinks to ``(p−1)(F_s+B_s)/v``. Stage j holds
``min(m·v, 2(p−j−1) + (v−1)N + 1) / v`` micro-batches' worth of its activations — at N = p the
first stage ``p(1 + (p−1)/(p·v))`` (Korthikanti et al.).

**Group size** (:func:`group_size`). Megatron-Core refuses a last group smaller than pp
(megatron/core/pipeline_parallel/schedules.py: "The remainder of M … divided by N … should be 0,
or larger than or equal to the pipeline-parallel size"; before 2024-11, m had to be a multiple of
pp), so with m micro-batches not a multiple of pp the run needs a larger N. MoFa prices the
smallest N in (p, 4p] it accepts (m % N = 0 or ≥ p), else N = m (always accepted), and the
Megatron line states it.
PyTorch's ``ScheduleInterleaved1F1B`` (torchtitan) runs ``m // max(1, m // p)`` micro-batches per
round: the same N wherever both accept m.
"""

from __future__ import annotations

import numpy as np

from mofa_framework import hookimpl
from mofa_framework.types import PipelineSchedule
from mofa_plugins.pp_overlap import NO_P2P_OVERLAP, priced_without
from mofa_plugins.schedule_1f1b import phase_times
from mofa_framework.engine import Inflight, PipelineTimes


def group_size(m, p) -> np.ndarray:
    """Megatron-Core's micro-batch group per virtual stage: p when it divides m, else the smallest
    N in (p, 4p] with ``m % N == 0`` or ``m % N ≥ p``, else m (which always works)."""
    m, p = np.broadcast_arrays(np.atleast_1d(np.asarray(m, dtype=np.int64)),
                               np.maximum(np.atleast_1d(np.asarray(p, dtype=np.int64)), 1))
    n = np.where(m % p == 0, p, m)
    todo = (m % p != 0) & (m > p)  # steps whose micro-batches pp does not divide
    if todo.any():
        found = np.zeros(m.shape, bool)
        for d in range(1, 3 * int(p[todo].max()) + 1):  # candidate sizes, every row at once
            k = p + d
            ok = todo & ~found & (k < m) & ((m % k == 0) | (m % k >= p))
            n = np.where(ok, k, n)
            found |= ok
    return n


def _groups(x) -> np.ndarray:
    return group_size(np.rint(np.broadcast_to(x.m, np.shape(x.F))), np.rint(np.broadcast_to(x.p, np.shape(x.F))))


def time(x) -> PipelineTimes:
    n_w = np.minimum(x.m * x.v, 2.0 * (x.p - 1.0) + (x.v - 1.0) * _groups(x))
    return phase_times(x, n_w, x.v)


def inflight(x) -> Inflight:
    n = _groups(x)

    def stage(j):
        return np.minimum(x.m * x.v, 2.0 * np.maximum(x.p - j - 1.0, 0.0) + (x.v - 1.0) * n + 1.0) / x.v
    return Inflight(first=stage(0.0), mid=stage(np.minimum(1.0, x.p - 1.0)), last=stage(x.p - 1.0))


def op_order(p, v, m):
    """Megatron's interleaved 1F1B: the schedule table runs each group of N micro-batches
    (:func:`group_size`) through chunk 0, then chunk 1, …; stage s runs ``2(p−s−1) + (v−1)·N``
    forward chunks before its first backward, then one forward and one backward; backwards run
    the chunks in reverse."""
    n = int(group_size(m, p)[0])
    table = [(mb, c) for g in range(0, m, n) for c in range(v) for mb in range(g, min(g + n, m))]
    total = m * v
    out = []
    for s in range(p):
        warm = min(total, (p - s - 1) * 2 + (v - 1) * n)
        ops = [("F", *table[k]) for k in range(warm)]
        for i in range(total - warm):
            mb, c = table[i]
            ops += [("F", *table[warm + i]), ("BW", mb, v - 1 - c)]
        out.append(ops + [("BW", table[i][0], v - 1 - table[i][1]) for i in range(total - warm, total)])
    return out


def megatron_args(model, parallel, context) -> list[str]:
    """The layer placement (the core's), the group size when pp does not divide the step's
    micro-batches (Megatron-Core's default, pp, would refuse the run), and ``--no-overlap-p2p-communication``
    for a configuration priced without PP overlap (``pp_overlap`` off), which Megatron-LM would
    otherwise run overlapped — except at pp 2, where Megatron-LM asserts pp > 2 for interleaving
    without the overlap (two sends and receives between the same two ranks per communication batch):
    there a note says the run overlaps."""
    from mofa_framework.tuner import pipeline_layout_arguments

    p, dp = int(parallel["pp"]), max(int(parallel.get("dp", 1)), 1)
    m = int(parallel["global_batch_size"]) // (dp * int(parallel["micro_batch_size"]))
    n = int(group_size(m, p)[0])
    out = pipeline_layout_arguments(model, parallel) + (
        ["--microbatch-group-size-per-virtual-pipeline-stage", str(n)] if n != p else [])
    if priced_without(context):
        if p == 2:  # Megatron-LM refuses the flag here: the run overlaps, as its default
            out.append(f"# p2p overlap on (Megatron-LM's default): it asserts pp > 2 for interleaving with "
                       f"{NO_P2P_OVERLAP}; this configuration was priced without the overlap (pp_overlap)")
        else:
            out.append(NO_P2P_OVERLAP)
    return out


SCHEDULE = PipelineSchedule(
    name="interleaved-1f1b",
    description="interleaved 1F1B with v virtual chunks per stage (Megatron --num-layers-per-virtual-pipeline-stage)",
    time=time, inflight=inflight, supports_vpp=True, requires_vpp=True, equation="[9]-[12]",
    monotone_bubble=True,  # busy + bubble = (m − 1/v)·max stage work + Σ work / v: grows with any F or B
    min_microbatches=lambda p: p, order=op_order, aliases=("1f1b-i", "interleaved"), megatron_args=megatron_args,
)


@hookimpl
def mofa_register_pipeline_schedules():
    return [SCHEDULE]
