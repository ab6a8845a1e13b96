"""Pipeline p2p overlap in the steady phase: paper eq. [23].

In 1F1B's steady phase the send/receive of one micro-batch's boundary activation (or
gradient) runs while the stage computes the next forward or backward chunk (Megatron's
``--overlap-p2p-communication``). Per steady pair of one forward + one backward chunk, the
time becomes::

    T_pair = max(β·τ_pair, α·T_chunk),   τ_pair = the pair's two sends (2τ inside one domain),   T_chunk = F + B + W

(F, B, W: the critical stage's per-chunk forward, backward-input and backward-weight times
from the pipeline inputs) — the paper's form, in which the contention α slows the *whole*
chunk even when the transfer lasts a sliver of it. Contention is a sharing of resources
(SMs, HBM, the copy engines) and lasts only while both streams run, so MoFa prices the pair
with ``_overlap.contended_total(T_chunk, τ_pair, α, β)``: each stream is slowed while the
other runs and the survivor finishes at full speed (equal to eq. [23] at α = β = 1). The
chunk's work is already counted, so the exposed p2p per steady pair
(``PipelineInputs.steady_p2p_s`` without overlap) becomes ``T_pair − (F+B+W)``, which
lies in ``[0, τ_pair]``: PP overlap never makes a step slower than no overlap (a property test
over random jobs checks it). Schedules multiply it by the number of steady pairs and report
it under ``pp_comm`` (it includes the contention slowdown of the chunk). Warmup and cooldown
transfers stay exposed. Rows with ``pp == 1`` are left unchanged (no-op), and so are rows whose
schedule's implementation cannot overlap (``PipelineSchedule.overlaps_p2p`` False): Megatron-LM
overlaps p2p only in its interleaved schedule and turns ``overlap_p2p_comm`` off for the plain 1F1B
whatever the flags say ("non-interleaved schedule does not support overlapping p2p communication",
``megatron/training/arguments.py`` since 2023-10). Memory is unchanged.

**Megatron-LM arguments**: none. Overlap is Megatron-LM's default in the interleaved schedule since
2023-10 (``--overlap-p2p-communication`` was the flag from 2023-05 to 2023-10; current Megatron-LM
rejects it, having only ``--no-overlap-p2p-communication``); the interleaved schedule writes that
flag for a configuration priced without this feature.
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.types import OverlapStrategy
from mofa_plugins._overlap import ContentionOptions, contended_total, contention


@attrs.frozen(kw_only=True)
class PpOverlapOptions(ContentionOptions):
    pass


#: Megatron-LM's flag that turns off the p2p overlap its interleaved schedule (and the ZeroBubble fork)
#: runs by default since 2023-10
NO_P2P_OVERLAP = "--no-overlap-p2p-communication"


def priced_without(context) -> bool:
    """Whether a configuration (a ``MegatronContext``) was priced without PP overlap: a schedule
    that overlaps by default then writes :data:`NO_P2P_OVERLAP` in its Megatron line."""
    return "pp_overlap" not in context.features


def overlapping_schedules(state) -> np.ndarray:
    """Per row: whether its schedule's implementation can overlap p2p (``overlaps_p2p``)."""
    registry = state.ctx.pm.registry
    flags = np.array([s.overlaps_p2p for s in registry.schedules.values()], dtype=bool)
    return flags[np.asarray(state.batch.schedule, dtype=np.int64)]


def pipeline(state, rows):
    alpha, beta = contention(state, rows)
    p = state.pipe
    work = p.F + p.B + p.W
    pair = p.steady_p2p_s  # the pair's two sends unless another feature changed them
    # Never more than the serial transfer: T − work can exceed it by one rounding when T = work + pair.
    exposed = np.minimum(contended_total(work, pair, alpha, beta) - work, pair)
    applies = (p.p > 1) & (pair > 0) & overlapping_schedules(state)
    return attrs.evolve(state, pipe=attrs.evolve(p, steady_p2p_s=np.where(applies, exposed, p.steady_p2p_s)))


def from_megatron(args):
    """Megatron-LM overlaps p2p with compute in the interleaved schedule unless
    ``--no-overlap-p2p-communication`` (older releases: ``--overlap-p2p-communication``), and
    turns it off for the non-interleaved one whatever the flags say."""
    off, on = args.has("--no-overlap-p2p-communication"), args.has("--overlap-p2p-communication")
    interleaved = args.parallel.get("pp", 1) > 1 and args.parallel.get("vpp", 1) > 1
    return {} if interleaved and (on or not off) else None


FEATURE = OverlapStrategy(
    name="pp_overlap",
    description="steady-phase p2p of one micro-batch hidden behind the next chunk's compute",
    equation="[23] T = max(β·τ, α·T_chunk) per steady pair, contention only while both streams run",
    options_type=PpOverlapOptions,
    pipeline=pipeline,
    applies=lambda batch, model, hardware: batch.pp > 1,
    from_megatron=from_megatron,
)


@hookimpl
def mofa_register_overlap_strategies():
    return [FEATURE]
