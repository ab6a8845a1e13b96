"""Shared pieces of the overlap plugins (paper eqs. [20]–[24]); not a plugin itself.

Every overlap strategy prices parts that run concurrently as the max of the two, each
slowed by a contention coefficient: α (``contention_compute``) on the compute and β
(``contention_comm``) on the communication, both ≥ 1. They default to the hardware
profile's ``efficiency.contention_compute`` / ``contention_comm``; a feature's options may
override them per job (``0`` = take the profile's value).

Bookkeeping rule shared by all of them: the overlap formula gives the *total* time T of the
overlapped compute + communication; the compute is already counted in its own breakdown
field, so the feature writes ``T − compute`` into the *exposed communication* field. That
keeps the breakdown additive and puts the contention slowdown of the compute, ``(α−1)·c``,
into the exposed-communication component of the overlap that caused it.
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework.limits import MAX_FACTOR
from mofa_framework.types import option


def _zero_or_at_least_one(inst, attribute, value):
    if not (value == 0.0 or 1.0 <= value <= MAX_FACTOR):
        raise ValueError(f"'{attribute.name}' must be 0 (use the hardware profile's value) or from 1 to {MAX_FACTOR:g}, got {value!r}")


def _at_least_one(inst, attribute, value):
    if not 1 <= value <= MAX_FACTOR:
        raise ValueError(f"'{attribute.name}' must be from 1 to {MAX_FACTOR:g}, got {value!r}")


def _positive_int(inst, attribute, value):
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1024:
        raise ValueError(f"'{attribute.name}' must be an integer from 1 to 1024, got {value!r}")


@attrs.frozen(kw_only=True)
class ContentionOptions:
    """Options every overlap strategy takes: its contention coefficients."""

    contention_compute: float = option(
        0.0, validator=_zero_or_at_least_one,
        doc="α ≥ 1: slowdown of compute while it overlaps communication; 0 = hardware profile's value")
    contention_comm: float = option(
        0.0, validator=_zero_or_at_least_one,
        doc="β ≥ 1: slowdown of communication while it overlaps compute; 0 = hardware profile's value")


def contended_total(c, m, alpha, beta):
    """Total time of compute `c` and communication `m` run together, each slowed (by α, β) only
    while the other is running: the stream that would finish first under contention does so at
    ``min(α·c, β·m)``; the other has then progressed by that time over its slowdown and runs the
    rest at full speed::

        α·c ≤ β·m:  T = m + α·c·(1 − 1/β)        else:  T = c + β·m·(1 − 1/α)

    With α = β = 1 it is ``max(c, m)`` (the paper's overlap); it is never below ``max(c, m)`` and,
    for ``α·(1 − 1/β) ≤ 1`` and ``β·(1 − 1/α) ≤ 1`` (every α ≤ 2, β ≤ 2), never above ``c + m``:
    overlapping never costs more than running the two one after the other. Beyond that the total
    is capped at ``c + m`` (a run that would lose by overlapping does not overlap).
    """
    c, m = np.asarray(c, dtype=np.float64), np.asarray(m, dtype=np.float64)
    comm_last = alpha * c <= beta * m
    t = np.where(comm_last, m + alpha * c * (1.0 - 1.0 / beta), c + beta * m * (1.0 - 1.0 / alpha))
    return np.minimum(t, c + m)


def opt(rows, name: str, default: float) -> np.ndarray:
    """Option `name` over the whole batch as float64; `default` on rows where the feature is off
    (or when the batch carries no such array), so off rows never see a 0 or a NaN."""
    n = len(rows.enabled)
    x = rows.options.get(name)
    if x is None:
        return np.full(n, float(default))
    return np.where(rows.enabled, np.asarray(x, dtype=np.float64), float(default))


def contention(state, rows) -> tuple[np.ndarray, np.ndarray]:
    """(α, β) per row: the option when > 0, else the hardware profile's coefficient."""
    eff = state.ctx.hardware.efficiency
    a = opt(rows, "contention_compute", 0.0)
    b = opt(rows, "contention_comm", 0.0)
    return np.where(a > 0, a, eff.contention_compute), np.where(b > 0, b, eff.contention_comm)


def overlap_layers(state, applies, compute: str, comm: str, exposed: str, total_time, total_time_bwd=None):
    """Set ``exposed`` in every layer type and pass to ``total_time(compute, comm) − compute``.

    `compute`, `comm` and `exposed` name LayerCosts fields with ``{}`` for the pass
    (``"tp_gemm_{}_s"`` → ``tp_gemm_fwd_s`` / ``tp_gemm_bwd_s``); rows where `applies` is false
    or there is no communication keep their exposed time. `total_time` is the overlap's
    equation for the pair (compute + communication run together); `total_time_bwd`, when given,
    replaces it in the backward pass.
    """
    totals = {"fwd": total_time, "bwd": total_time if total_time_bwd is None else total_time_bwd}

    def one(lc):
        kw = {}
        for d, total in totals.items():
            c, m, field = getattr(lc, compute.format(d)), getattr(lc, comm.format(d)), exposed.format(d)
            kw[field] = np.where(applies & (m > 0), total(c, m) - c, getattr(lc, field))
        return attrs.evolve(lc, **kw)

    return attrs.evolve(state, layers={k: one(lc) for k, lc in state.layers.items()})
