"""DualPipe (DeepSeek-V3 technical report, arXiv 2412.19437, §3.2.1 and Table 2).

Micro-batches are fed from both ends of the pipeline at once: GPU j holds stage j of the pipeline
that flows 0→p−1 *and* stage ``p−1−j`` of the one that flows p−1→0 (``mirrored``: the report's
"two copies of the model parameters"), half the micro-batches take each direction, and a forward
chunk of one direction runs overlapped with a backward chunk of the other ("F&B"). So the GPUs at
the two ends each hold the first stage (the embedding) and the last (the output head, DeepSeek's
MTP modules, the loss) — the report places them together on purpose, to share the embedding and
the output head between the main model and MTP — and a middle GPU holds two middle stages.

With per-stage F, B (input grad), W (weight grad) of the critical GPU (an end GPU's are the mean
of the first and the last stage's: it runs m/2 micro-batches through each): busy ``m(F+B+W)``,
bubble ``(p/2 − 1)(F&B + B − 3W)`` clamped at 0. Here ``F&B = F + B``: the overlap of the two
directions' compute with EP all-to-alls is the business of the ``ep_overlap`` feature, which
shrinks F and B before the schedule sees them. p2p as in 1F1B, p−1 warmup transfers.

Activations: ``p + 1`` micro-batches' worth on every GPU (Table 2). An end GPU is the first stage
of one direction, holding ``p`` micro-batches of the first stage's activations as 1F1B's first
stage does, and the last stage of the other, holding one of the last stage's (``Inflight.first =
p``, ``mirror_first = 1``; the other end the same the other way round; each capped at a
direction's m/2 micro-batches); a middle GPU holds p + 1 of its stages' (capped at m).

Requirements, enforced by :func:`feasible` (a job breaking them is refused; the tuner never
proposes one): ``p`` even and ``m ≥ 2p`` micro-batches, split evenly between the two
directions (DeepSeek's implementation asserts both); ``vpp = 1`` (the two "chunks" are the two
directions; ``supports_vpp = False``).
``op_order`` gives a greedy order (:func:`~mofa_framework.simulate.greedy_order`) on
the two routes for the simulator; without F&B overlap it only bounds the closed form.
"""

from __future__ import annotations

import numpy as np

from mofa_framework import hookimpl
from mofa_framework.engine import Inflight, PipelineTimes
from mofa_framework.simulate import greedy_order
from mofa_framework.types import ConstraintResult, PipelineSchedule


def time(x) -> PipelineTimes:
    work = x.F + x.B + x.W
    busy = x.m * work
    half = np.maximum(x.p / 2.0 - 1.0, 0.0)
    fb = x.F + x.B  # F&B: a forward and a backward chunk run together, no overlap credit here
    bubble = half * np.maximum(fb + x.B - 3.0 * x.W, 0.0)
    n_w = np.minimum(x.m, x.p - 1.0)
    steady_n = x.m - n_w
    pp = 2.0 * n_w * x.p2p_s + steady_n * x.steady_p2p_s
    warmup = n_w * (x.F + x.p2p_s) + 0.5 * bubble
    steady = steady_n * (work + x.steady_p2p_s)
    cooldown = n_w * (x.B + x.W + x.p2p_s) + 0.5 * bubble
    return PipelineTimes(busy_s=busy, bubble_s=bubble, pp_comm_s=pp, warmup_s=warmup, steady_s=steady,
                         cooldown_s=cooldown)


def inflight(x) -> Inflight:
    """p + 1 micro-batches' activations per GPU: an end GPU p of its first stage and one of its
    last (module docstring); a middle GPU p + 1 of its two middle stages."""
    half = x.m / 2.0
    own = np.minimum(half, x.p)
    one = np.minimum(half, 1.0)
    return Inflight(first=own, mid=np.minimum(x.m, x.p + 1.0), last=one, mirror_first=one, mirror_mid=np.zeros_like(own),
                    mirror_last=own)


def route(p: int, m: int):
    """Micro-batches 0..m/2−1 run stages 0→p−1 on chunk 0; the rest p−1→0 on chunk 1."""
    down = [(s, 0) for s in range(p)]
    up = [(s, 1) for s in reversed(range(p))]
    return lambda mb: down if mb < m // 2 else up


def op_order(p: int, v: int, m: int, F=1.0, B=1.0, W=1.0) -> list[list[tuple[str, int, int]]]:
    """A greedy bidirectional order (v is ignored: the two chunks are the two directions)."""
    return greedy_order(p=p, v=2, m=m, limit=lambda s: p + 1, route=route(p, m), F=F, B=B, W=W,
                        gated_chunks=())


def feasible(batch, rows):
    """DualPipe runs two pipelines in opposite directions: pp must be even, and it needs at
    least 2·pp micro-batches per step to fill both."""
    ok = (batch.pp % 2 == 0) & (batch.num_microbatches >= 2 * batch.pp)
    return ConstraintResult(name="dualpipe_shape", feasible=ok,
                            reason="pipeline.schedule dualpipe needs an even parallel.pp and at least 2·pp "
                                   "micro-batches per step (global_batch_size ≥ 2·pp·dp·micro_batch_size)")


SCHEDULE = PipelineSchedule(
    name="dualpipe",
    description="DualPipe (DeepSeek-V3): bidirectional, bubble (p/2-1)(F&B+B-3W), 2x parameters, p+1 activations",
    time=time, inflight=inflight, supports_vpp=False, mirrored=True, equation="DualPipe (DeepSeek-V3 Table 2)",
    min_microbatches=lambda p: 2 * p, order=op_order, route=lambda p, v, m: route(p, m),
    feasible=feasible,
    megatron_args=("# DualPipe: DeepSeek's schedule (github.com/deepseek-ai/DualPipe), not in Megatron-LM mainline: "
                   "rank j holds stages j and pp−1−j (two parameter copies), pp even, ≥ 2·pp micro-batches per step",),
)


@hookimpl
def mofa_register_pipeline_schedules():
    return [SCHEDULE]
