"""A small discrete-event simulator of one pipeline-parallel step, to validate schedules.

The closed forms schedule plugins give the engine (``PipelineSchedule.time``) are checked
against this simulator in the tests. It knows no schedule by name: a schedule is described
by its *op order* — for each of the ``p`` stages the ordered list of ops it runs, each op a
``(kind, micro_batch, chunk)`` triple — and by the *route* each micro-batch takes through
the (stage, chunk) pairs. Schedule plugins provide ``op_order(p, v, m)`` (and, when it is
not Megatron's, a ``route``); the simulator only enforces the data dependencies:

- ``F`` of a micro-batch on hop k of its route needs its ``F`` on hop k−1;
- ``B`` (input gradient) on hop k needs ``B`` on hop k+1 and its own ``F`` on hop k;
- ``W`` (weight gradient) needs ``B`` of the same hop;
- ``BW`` is an unsplit backward (``B`` and ``W`` as one op, 1F1B/GPipe): it counts as both;
- a dependency that crosses stages waits the p2p time ``τ`` (``p2p="async"``: the transfer
  overlaps compute, as with non-blocking sends), or keeps the *sender* busy for ``τ``
  (``p2p="blocking"``: Megatron's batched send/recv, the accounting of the engine's
  closed forms, which expose τ per transfer on the critical stage).

A stage runs its ops strictly in the given order, each as soon as its dependencies are met.
The result has the makespan (first op start to last op end), each stage's busy and idle
time, its *span* (its own first start to last end — the per-step time of a schedule that
overlaps consecutive steps through optimizer post-validation, as ZeroBubble does) and the
timeline. :func:`peak_inflight` counts the activations each stage holds at its peak and
:func:`draw_timeline` draws the timeline (needs matplotlib, the ``plot`` extra).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import numpy as np

KINDS = ("F", "B", "W", "BW")

#: one op on one stage: (kind, micro-batch, chunk)
Op = tuple[str, int, int]
#: one simulated op: (stage, kind, micro-batch, chunk, start_s, end_s)
Event = tuple[int, str, int, int, float, float]


def megatron_route(p: int, v: int) -> Callable[[int], list[tuple[int, int]]]:
    """Interleaved placement: virtual stage ``k`` is chunk ``k // p`` on stage ``k % p``."""
    hops = [(k % p, k // p) for k in range(p * v)]
    return lambda mb: hops


@attrs.frozen(kw_only=True, eq=False)
class SimResult:
    """What :func:`simulate` returns (seconds)."""

    makespan_s: float
    #: per stage: compute time, idle time within the makespan, own first-start→last-end span
    busy_s: np.ndarray
    idle_s: np.ndarray
    span_s: np.ndarray
    #: (stage, kind, micro-batch, chunk, start, end), in the order ops started
    timeline: list[Event]

    @property
    def max_span_s(self) -> float:
        """The longest stage span: the step time when steps overlap (post-validation)."""
        return float(self.span_s.max())


def _durations(x, p: int, v: int) -> np.ndarray:
    arr = np.broadcast_to(np.asarray(x, dtype=np.float64), (p, v))
    if (arr < 0).any() or not np.isfinite(arr).all():
        raise ValueError("op durations must be finite and >= 0")
    return arr


def simulate(order: Sequence[Sequence[Op]], *, p: int, v: int = 1, m: int, F, B, W=0.0, tau=0.0,
             p2p: str = "async", route: Callable[[int], Sequence[tuple[int, int]]] | None = None) -> SimResult:
    """Simulate the op lists `order` (one per stage) of a step with `m` micro-batches.

    `F`, `B`, `W` are per-chunk durations: scalars or arrays broadcastable to ``(p, v)``
    (stage, chunk). `tau` is the p2p time of a transfer between stages: a scalar, or a
    ``(p, p)`` array whose ``[s, d]`` is the transfer from stage s to stage d (stages in
    different scale-up domains). `route(mb)` lists the (stage, chunk) hops of a micro-batch's
    forward pass (default: Megatron's interleaved placement). Raises ``ValueError`` if the order
    deadlocks, misses an op or repeats one.
    """
    if p2p not in ("async", "blocking"):
        raise ValueError(f"p2p must be 'async' or 'blocking', got {p2p!r}")
    if len(order) != p:
        raise ValueError(f"order has {len(order)} stage lists, expected p = {p}")
    route = route or megatron_route(p, v)
    dur = {"F": _durations(F, p, v), "B": _durations(B, p, v), "W": _durations(W, p, v)}
    dur["BW"] = dur["B"] + dur["W"]
    hop_s = np.asarray(tau, dtype=np.float64)
    if hop_s.shape not in ((), (p, p)) or not np.all(np.isfinite(hop_s) & (hop_s >= 0)):
        raise ValueError(f"tau must be a number or a ({p}, {p}) array of per-hop seconds, finite and ≥ 0; "
                         f"got shape {hop_s.shape}")
    hop_s = np.broadcast_to(hop_s, (p, p))
    hops = {mb: list(route(mb)) for mb in range(m)}
    where = {mb: {sc: k for k, sc in enumerate(h)} for mb, h in hops.items()}
    # every (stage, chunk) a micro-batch visits must run F and a backward exactly once
    seen: set = set()
    for s, ops in enumerate(order):
        for kind, mb, c in ops:
            if kind not in KINDS:
                raise ValueError(f"stage {s}: unknown op kind {kind!r}; expected one of {KINDS}")
            if (kind, mb, c, s) in seen:
                raise ValueError(f"stage {s}: op {(kind, mb, c)} appears twice")
            if mb not in where or (s, c) not in where[mb]:
                raise ValueError(f"stage {s}: op {(kind, mb, c)} is not on micro-batch {mb}'s route")
            seen.add((kind, mb, c, s))
    missing = [(mb, s, c) for mb, h in hops.items() for (s, c) in h if ("F", mb, c, s) not in seen]
    if missing:
        raise ValueError(f"{len(missing)} forward ops are missing from the order, "
                         f"e.g. (micro-batch, stage, chunk) {missing[0]}")

    done: dict[tuple[str, int, int], float] = {}  # (kind, mb, hop) -> time its output is available
    finish: dict[tuple[str, int, int], float] = {}  # (kind, mb, hop) -> end of compute on its stage
    ptr = [0] * p
    free = [0.0] * p
    first = [np.inf] * p
    last = [0.0] * p
    busy = np.zeros(p)
    timeline: list[Event] = []

    def ready(s: int, op: Op) -> float | None:
        kind, mb, c = op
        k = where[mb][(s, c)]
        n_hops = len(hops[mb])
        deps: list[float] = []
        if kind == "F":
            if k > 0:
                deps.append(done.get(("F", mb, k - 1), np.nan))
        elif kind in ("B", "BW"):
            deps.append(finish.get(("F", mb, k), np.nan))
            if k < n_hops - 1:
                deps.append(done.get(("B", mb, k + 1), np.nan))
        else:  # W
            deps.append(finish.get(("B", mb, k), np.nan))
        if any(np.isnan(d) for d in deps):
            return None
        return max(deps, default=0.0)

    total = sum(len(o) for o in order)
    n_done = 0
    while n_done < total:
        progressed = False
        for s in range(p):
            while ptr[s] < len(order[s]):
                op = order[s][ptr[s]]
                t = ready(s, op)
                if t is None:
                    break
                kind, mb, c = op
                k = where[mb][(s, c)]
                start = max(free[s], t)
                end = start + float(dur[kind][s, c])
                # where the op's output goes next, and whether that crosses stages
                nxt = None
                if kind == "F" and k < len(hops[mb]) - 1:
                    nxt = hops[mb][k + 1][0]
                elif kind in ("B", "BW") and k > 0:
                    nxt = hops[mb][k - 1][0]
                cross = nxt is not None and nxt != s
                avail = end
                if cross and p2p == "async":
                    avail = end + float(hop_s[s, nxt])
                elif cross:  # blocking: the sender is occupied by the transfer
                    end = end + float(hop_s[s, nxt])
                    avail = end
                kinds = ("B", "W") if kind == "BW" else (kind,)
                for kd in kinds:
                    finish[(kd, mb, k)] = end
                    done[(kd, mb, k)] = avail
                free[s] = end
                first[s] = min(first[s], start)
                last[s] = max(last[s], end)
                busy[s] += float(dur[kind][s, c])
                timeline.append((s, kind, mb, c, start, end))
                ptr[s] += 1
                n_done += 1
                progressed = True
        if not progressed:
            stuck = {s: order[s][ptr[s]] for s in range(p) if ptr[s] < len(order[s])}
            raise ValueError(f"the op order deadlocks: stages wait on {stuck}")
    # every forward needs its backward
    for (kind, mb, k) in list(finish):
        if kind == "F" and ("B", mb, k) not in finish:
            raise ValueError(f"micro-batch {mb} hop {k} has a forward but no backward in the order")
    t0 = min(first)
    makespan = max(last) - t0
    span = np.array([last[s] - first[s] if np.isfinite(first[s]) else 0.0 for s in range(p)])
    return SimResult(makespan_s=makespan, busy_s=busy, idle_s=makespan - busy, span_s=span, timeline=timeline)


def peak_inflight(timeline: Sequence[Event], p: int | None = None) -> np.ndarray:
    """Per stage, the most chunk activations held at once: a (micro-batch, chunk) is held
    from its forward's start to the end of its input-gradient backward (``B`` or ``BW``).

    Divide by v for "micro-batches' worth of one stage's activations" (the engine's unit).
    """
    p = p if p is not None else (max(e[0] for e in timeline) + 1 if timeline else 0)
    events: list[list[tuple[float, int]]] = [[] for _ in range(p)]
    for s, kind, mb, c, start, end in timeline:
        if kind == "F":
            events[s].append((start, 1))
        elif kind in ("B", "BW"):
            events[s].append((end, -1))
    out = np.zeros(p)
    for s in range(p):
        level = peak = 0
        for _, d in sorted(events[s], key=lambda e: (e[0], e[1])):  # frees before allocations at ties
            level += d
            peak = max(peak, level)
        out[s] = peak
    return out


_COLORS = {"F": "#4c72b0", "B": "#55a868", "W": "#c44e52", "BW": "#8172b2"}


def draw_timeline(timeline: Sequence[Event], path, title: str = "", stages: Sequence[int] | None = None) -> None:
    """Draw `timeline` as one row per stage (a Gantt chart) into the image file `path`;
    `stages` lists the stages to draw (default: 0 to the last one in the timeline)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("draw_timeline needs matplotlib: pip install 'mofa[plot]'") from None
    stages = list(stages) if stages is not None else list(range(max(e[0] for e in timeline) + 1 if timeline else 1))
    row = {s: k for k, s in enumerate(stages)}
    p = len(stages)
    end = max((e[5] for e in timeline), default=1.0)
    fig, ax = plt.subplots(figsize=(max(6.0, min(24.0, len(timeline) / (2.0 * p))), 0.45 * p + 1.2))
    for s, kind, mb, c, t0, t1 in timeline:
        if s not in row:
            continue
        ax.barh(row[s], t1 - t0, left=t0, height=0.8, color=_COLORS[kind], alpha=0.55 + 0.45 * (c % 2 == 0),
                edgecolor="black", linewidth=0.3)
        if t1 - t0 > end / 150:
            ax.text((t0 + t1) / 2, row[s], str(mb), ha="center", va="center", fontsize=6)
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"stage {s}" for s in stages])
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_title(title or "pipeline timeline (F blue, B green, W red, BW purple; numbers: micro-batch)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def greedy_order(*, p: int, v: int = 1, m: int, limit: Callable[[int], float], route=None, F=1.0, B=1.0, W=1.0,
                 tau: float = 0.0, gated_chunks: Sequence[int] = (0,)) -> list[list[Op]]:
    """A per-stage op order found by greedy list scheduling (ZeroBubble's heuristic, §3.1).

    Whenever a stage is free it starts, among the ops whose inputs are ready, the one that
    can start earliest; ties go to ``B`` (it unblocks the stages before it), then ``F``,
    then ``W`` (which only fills gaps). A forward of a chunk in `gated_chunks` — one that
    starts a micro-batch's stay on the stage — may only start while the stage holds fewer
    than ``limit(stage)`` chunk activations (F started, B not finished), which bounds
    memory. Durations are per chunk as in :func:`simulate` (scalars; default unit times,
    the setting of the handcrafted ZeroBubble schedules).
    """
    route = route or megatron_route(p, v)
    hops = {mb: list(route(mb)) for mb in range(m)}
    dur = {"F": float(F), "B": float(B), "W": float(W)}
    # per stage, the forward ops in micro-batch then hop order
    fq: list[list[tuple[int, int]]] = [[] for _ in range(p)]
    for mb in range(m):
        for k, (s, c) in enumerate(hops[mb]):
            fq[s].append((mb, k))
    avail: dict[tuple[str, int, int], float] = {}
    own: dict[tuple[str, int, int], float] = {}
    started_f: set = set()
    started_b: set = set()
    held = [0] * p
    wq: list[list[tuple[int, int]]] = [[] for _ in range(p)]
    free = [0.0] * p
    order: list[list[Op]] = [[] for _ in range(p)]
    total = sum(len(h) for h in hops.values()) * 3
    for _ in range(total):
        best = None
        for s in range(p):
            cands = []
            # backward: any (mb, hop) on s whose forward ran and whose next hop's B is done
            for (mb, k) in fq[s]:
                if ("F", mb, k) in own and (mb, k) not in started_b:
                    last = k == len(hops[mb]) - 1
                    t = own[("F", mb, k)] if last else avail.get(("B", mb, k + 1))
                    if t is not None:
                        cands.append((max(free[s], t), 0, mb, k, "B"))
            for (mb, k) in fq[s]:
                if (mb, k) in started_f:
                    continue
                t = 0.0 if k == 0 else avail.get(("F", mb, k - 1))
                if t is None:
                    continue
                c = hops[mb][k][1]
                if c in gated_chunks and held[s] >= limit(s):
                    continue
                cands.append((max(free[s], t), 1, mb, k, "F"))
            if wq[s]:
                mb, k = wq[s][0]
                cands.append((free[s], 2, mb, k, "W"))
            if cands:
                c = min(cands)
                if best is None or (c[0], c[1], s) < (best[1][0], best[1][1], best[0]):
                    best = (s, c)
        if best is None:
            raise ValueError("greedy_order: no op can start (the memory limit is too small for this route)")
        s, (start, _, mb, k, kind) = best
        end = start + dur[kind]
        free[s] = end
        st, c = hops[mb][k]
        order[s].append((kind, mb, c))
        own[(kind, mb, k)] = end
        nxt = hops[mb][k + 1][0] if kind == "F" and k + 1 < len(hops[mb]) else (
            hops[mb][k - 1][0] if kind == "B" and k > 0 else s)
        avail[(kind, mb, k)] = end + (tau if nxt != s else 0.0)
        if kind == "F":
            started_f.add((mb, k))
            held[s] += 1
        elif kind == "B":
            started_b.add((mb, k))
            held[s] -= 1
            wq[s].append((mb, k))
        else:
            wq[s].pop(0)
    return order
