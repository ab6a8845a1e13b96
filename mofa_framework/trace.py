"""A predicted training step as a Chrome trace-event timeline (open it in ui.perfetto.dev).

:func:`build` turns one row of a :class:`~mofa_framework.engine.Prediction` into the JSON
object format of the trace-event spec: one *process* per pipeline stage (the first, a middle
and the last stage, or every stage), one *thread* per stream — compute, the exposed and the
overlapped part of each communication kind (TP, CP, EP, PP, DP), activation offload, the
optimizer and the fixed step overhead — one complete slice per forward (F), backward-input
(B) and backward-weight (W) of every micro-batch and model chunk, and the stage's memory as a
counter track. It knows no schedule and no feature: the order of the slices is the row's
schedule plugin's own ``order`` (and ``route``) run through :func:`~mofa_framework.simulate.simulate`;
the durations are the engine's per-stage times.

**How the trace agrees with the prediction.** The prediction is the schedule's closed form;
the simulator runs the same ops in the schedule's order and reaches a makespan that may differ
(greedy orders, unequal stages, p2p). The trace keeps the simulator's order and the engine's
durations and reconciles the rest explicitly:

1. every op lasts exactly its stage's per-chunk time, split into compute and the exposed
   communication of that pass — so on the critical stage each stream sums to its breakdown
   component (``m × per-micro-batch time``);
2. the closed form's exposed p2p (``pp_comm``) is spread evenly over the critical stage's
   cross-stage sends, each keeping its sender busy (Megatron's blocking send/recv) — the PP
   thread sums to ``pp_comm``;
3. what is left is idle time; every stage's idle gaps are scaled by one factor,
   ``bubble_scale`` = (closed-form bubble) / (simulated idle time of the critical stage), so
   the critical stage's pipeline phase ends at the closed form's time exactly. A stage that
   would then overrun it gets a smaller factor of its own;
4. the DP communication the optimizer waits for, the optimizer update and the fixed step
   overhead follow the pipeline phase, so the trace spans the predicted step time.

``bubble_scale`` is 1 when the simulator reproduces the closed form (1F1B, GPipe,
interleaved 1F1B and ZB-H1 at equal stages without p2p); the trace's ``otherData`` records it
with the simulated pipeline time, so the gap is visible rather than hidden. A schedule that
gives no ``order`` gets a generic one (all forwards in route order, then all backwards) and
``otherData.order`` says so.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from .engine import Prediction
from .errors import ConfigError
from .simulate import megatron_route, simulate
from .units import GIB

#: thread id and name of every stream, in display order
THREADS = {
    "compute": (1, "compute"),
    "tp": (2, "TP comm (exposed)"), "tp_hidden": (3, "TP comm (overlapped)"),
    "cp": (4, "CP comm (exposed)"), "cp_hidden": (5, "CP comm (overlapped)"),
    "ep": (6, "EP comm (exposed)"), "ep_hidden": (7, "EP comm (overlapped)"),
    "pp": (8, "PP p2p (exposed)"), "pp_hidden": (9, "PP p2p (overlapped)"),
    "dp": (10, "DP comm (exposed)"), "dp_hidden": (11, "DP comm (overlapped)"),
    "offload": (12, "activation offload (exposed)"),
    "optimizer": (13, "optimizer"),
    "overhead": (14, "step overhead"),
}
#: breakdown components each exposed stream's slices add up to (on the critical stage)
STREAM_COMPONENTS = {
    "compute": ("compute_fwd", "compute_bwd_input", "compute_bwd_weight", "recompute", "microbatch_overhead"),
    "tp": ("tp_comm",), "cp": ("cp_comm",), "ep": ("ep_comm",), "pp": ("pp_comm",),
    "dp": ("dp_comm", "dp_layer_comm"), "offload": ("offload",), "optimizer": ("optimizer", "optimizer_host"),
    "overhead": ("overhead",),
}
#: exposed communication inside a pass: (stream, stage_parts key suffix)
_PASS_COMM = (("tp", "tp"), ("cp", "cp"), ("ep", "ep"), ("dp", "dp_layer"), ("offload", "offload"))
_HIDDEN = (("tp_hidden", "tp"), ("cp_hidden", "cp"), ("ep_hidden", "ep"), ("dp_hidden", "dp_layer"))
_US = 1e6
#: stage_parts keys of a forward and of an input-gradient backward
_FWD = ("compute_fwd", "microbatch_overhead", "tp_fwd", "cp_fwd", "ep_fwd", "dp_layer_fwd", "offload_fwd")
_BWD = ("compute_bwd_input", "recompute", "tp_bwd", "cp_bwd", "ep_bwd", "dp_layer_bwd", "offload_bwd")
#: breakdown components after the pipeline phase
_TAIL = ("dp_comm", "optimizer", "optimizer_host", "overhead")


def _stage_row(s: int, p: int) -> int:
    """The engine's stage row (0 first, 1 middle, 2 last) that stage `s` of `p` follows."""
    return 0 if s == 0 else (2 if s == p - 1 else 1)


def shown_stages(p: int, all_stages: bool = False) -> list[int]:
    """Stages drawn: every one, or the first, a middle one and the last."""
    return list(range(p)) if all_stages else sorted({0, p // 2, p - 1})


def generic_order(p: int, v: int, m: int, route) -> list[list[tuple[str, int, int]]]:
    """All forwards in route order, then all backwards in reverse (for schedules without ``order``)."""
    out: list[list[tuple[str, int, int]]] = [[] for _ in range(p)]
    hops = [list(route(mb)) for mb in range(m)]
    for mb in range(m):
        for s, c in hops[mb]:
            out[s].append(("F", mb, c))
    for mb in range(m):
        for s, c in reversed(hops[mb]):
            out[s].append(("BW", mb, c))
    return out


def _order_and_route(sched, p: int, v: int, m: int, per_chunk: Mapping[str, float]):
    if sched.route is not None:
        route = sched.route(p, v, m)
    else:
        route = megatron_route(p, v)
    if sched.order is None:
        return generic_order(p, v, m, route), route, "generic: the schedule gives no order"
    params = inspect.signature(sched.order).parameters
    kw = {k: float(x) for k, x in per_chunk.items() if k in params}
    try:
        return sched.order(p, v, m, **kw), route, f"schedule {sched.name!r}"
    except Exception as exc:  # noqa: BLE001 - a plugin's order must not take the trace down
        return (generic_order(p, v, m, route), route,
                f"generic: schedule {sched.name!r}'s order failed ({type(exc).__name__}: {exc})")


def _crosses(hops, s: int, c: int, kind: str) -> bool:
    """Whether the output of op `kind` of chunk `c` on stage `s` goes to another stage."""
    k = hops.index((s, c))
    if kind == "F":
        return k + 1 < len(hops) and hops[k + 1][0] != s
    return kind != "W" and k > 0 and hops[k - 1][0] != s


class _Lanes:
    """Complete slices per (pid, thread), kept non-overlapping."""

    def __init__(self):
        self.events: list[dict] = []
        self.end: dict[tuple[int, str], float] = {}

    def add(self, pid: int, stream: str, name: str, start_s: float, dur_s: float, cat: str, args=None,
            clip: bool = False) -> None:
        if dur_s <= 0:
            return
        key = (pid, stream)
        if clip:  # an overlapped slice may not overlap the previous one on its thread
            lo = self.end.get(key, -np.inf)
            if start_s < lo:
                dur_s -= lo - start_s
                start_s = lo
            if dur_s <= 0:
                return
        self.end[key] = max(self.end.get(key, -np.inf), start_s + dur_s)
        ev = {"name": name, "cat": cat, "ph": "X", "ts": start_s * _US, "dur": dur_s * _US, "pid": pid,
              "tid": THREADS[stream][0]}
        if args:
            ev["args"] = args
        self.events.append(ev)


def build(pred: Prediction, row: int = 0, *, registry, all_stages: bool = False, name: str = "") -> dict:
    """The trace-event JSON object (``{"traceEvents": [...], "otherData": {...}}``) of row `row` of `pred`."""
    b = pred.batch
    p, v, m = int(b.pp[row]), int(b.vpp[row]), int(b.num_microbatches[row])
    sched = list(registry.schedules.values())[int(b.schedule[row])]
    parts = {k: np.asarray(a[:, row], dtype=float) for k, a in pred.stage_parts.items()}
    hidden = {k: np.asarray(a[:, row], dtype=float) for k, a in pred.stage_hidden_comm.items()}
    bd = {k: float(np.asarray(a)[row]) for k, a in pred.breakdown.items()}
    crit_row = int(pred.critical_stage[row])
    per_pass = {"F": sum(parts[k] for k in _FWD), "B": sum(parts[k] for k in _BWD), "W": parts["compute_bwd_weight"]}

    # the schedule's op order; each op lasts its stage's time over the chunks a micro-batch runs there
    order, route, order_src = _order_and_route(sched, p, v, m, {k: a[crit_row] / v for k, a in per_pass.items()})
    v_sim = max((c for ops in order for _, _, c in ops), default=0) + 1
    hops = {mb: list(route(mb)) for mb in range(m)}
    visits = np.maximum(np.bincount([st for st, _ in hops[0]], minlength=p)[:p], 1).astype(float)
    rows = np.array([_stage_row(s, p) for s in range(p)])
    dur = {k: np.repeat((a[rows] / visits)[:, None], v_sim, axis=1) for k, a in per_pass.items()}
    crit = (0, p // 2, p - 1)[crit_row] if p > 1 else 0

    # exposed p2p: the closed form's pp_comm spread over the critical stage's sends (blocking)
    n_send = sum(_crosses(hops[mb], s, c, kind) for s, ops in enumerate(order) if s == crit for kind, mb, c in ops)
    tau = bd.get("pp_comm", 0.0) / n_send if n_send else 0.0
    sim = simulate(order, p=p, v=v_sim, m=m, F=dur["F"], B=dur["B"], W=dur["W"], tau=tau,
                   p2p="blocking" if tau > 0 else "async", route=route)

    # idle gaps scaled so the critical stage ends its pipeline phase at the closed form's time
    step = float(pred.step_time_s[row])
    t_pipe = step - sum(bd.get(k, 0.0) for k in _TAIL)
    by_stage: dict[int, list] = {s: [] for s in range(p)}
    for ev in sim.timeline:
        by_stage[ev[0]].append(ev)
    occupied = {s: sum(e[5] - e[4] for e in evs) for s, evs in by_stage.items()}
    idle_sim = sim.makespan_s - occupied[crit]
    scale = max(t_pipe - occupied[crit], 0.0) / idle_sim if idle_sim > 1e-15 else 1.0

    lanes = _Lanes()
    stages = sorted({*shown_stages(p, all_stages), crit})
    tau_total = float(np.asarray(pred.state.pipe.p2p_s)[row]) if pred.state.pipe is not None else 0.0
    for s in stages:
        evs = sorted(by_stage[s], key=lambda e: e[4])
        busy = sum(_op_s(dur, k, s, c) for _, k, _, c, _, _ in evs)
        sends = occupied[s] - busy
        shrink = min(1.0, max(t_pipe - busy, 0.0) / sends) if sends > 1e-15 else 1.0
        inner = (evs[-1][5] - occupied[s]) if evs else 0.0  # idle before the stage's last op ends
        k_s = min(scale, max(t_pipe - busy - shrink * sends, 0.0) / inner) if inner > 1e-15 else scale
        counter = _draw_stage(lanes, s, evs, k_s, shrink, dur, parts, hidden, rows[s], visits[s], hops, tau_total)
        _draw_tail(lanes, s, t_pipe, bd, pred, row)
        _emit_counter(lanes, s, counter, _memory_track(pred, row, rows[s]))
    events = _metadata_events(lanes, stages, p, crit) + sorted(
        lanes.events, key=lambda e: (e["ts"], e["pid"], e.get("tid", 0)))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "job": name, "model": pred.model.name, "hardware": pred.hardware.name, "schedule": sched.name,
            "order": order_src, "pp": p, "vpp": v, "micro_batches": m, "stages_shown": stages,
            "critical_stage": crit, "step_time_s": step, "pipeline_time_s": t_pipe,
            "simulated_pipeline_time_s": sim.makespan_s, "bubble_scale": scale, "p2p_exposed_per_send_s": tau,
            "p2p_per_transfer_s": tau_total, "breakdown_s": bd,
        },
    }


def _op_s(dur, kind: str, s: int, c: int) -> float:
    return float(dur["B"][s, c] + dur["W"][s, c]) if kind == "BW" else float(dur[kind][s, c])


def _draw_stage(lanes, s, evs, k_s, shrink, dur, parts, hidden, r, visits, hops, tau_total) -> list:
    """Every op of stage `s` re-timed (idle gaps × `k_s`, sends × `shrink`); returns the
    (time, chunks held) steps of its activation count."""
    t_prev_sim = t_prev = 0.0
    held = 0
    counter = [(0.0, 0)]
    for _, kind, mb, c, start, end in evs:
        t = t_prev + k_s * (start - t_prev_sim)
        if kind == "F":
            held += 1
            counter.append((t, held))
        op = _op_s(dur, kind, s, c)
        t = _draw_op(lanes, s, kind, mb, c, t, parts, hidden, r, visits)
        if kind in ("B", "BW"):
            held -= 1
            counter.append((t, held))
        send = (end - start - op) * shrink
        d = "F" if kind == "F" else "B"
        lanes.add(s, "pp", f"send {d} mb{mb}", t, send, "exposed", {"micro_batch": mb, "chunk": c})
        if _crosses(hops[mb], s, c, kind):
            lanes.add(s, "pp_hidden", f"p2p {d} mb{mb}", t + send, max(tau_total - send, 0.0), "overlapped",
                      clip=True)
        t_prev_sim, t_prev = end, t + max(send, 0.0)
    return counter


#: per pass drawn on the compute thread: its category, the stage_parts keys of its compute and
#: the suffix of its communication keys
_PASSES = {"F": ("forward", ("compute_fwd", "microbatch_overhead"), "fwd"),
           "B": ("backward-input", ("compute_bwd_input", "recompute"), "bwd")}


def _draw_op(lanes: _Lanes, s: int, kind: str, mb: int, c: int, t: float, parts, hidden, r: int,
             visits: float) -> float:
    """Slices of one op starting at `t`: compute, then each exposed communication; returns its end."""
    per = lambda key: float(parts[key][r]) / visits  # noqa: E731
    if kind in ("F", "B", "BW"):
        t = _draw_pass(lanes, s, "F" if kind == "F" else "B", mb, c, t, per, hidden, r, visits)
    if kind in ("W", "BW"):
        d = per("compute_bwd_weight")
        lanes.add(s, "compute", f"W mb{mb} c{c}", t, d, "backward-weight", {"micro_batch": mb, "chunk": c})
        t += d
    return t


def _draw_pass(lanes: _Lanes, s: int, name: str, mb: int, c: int, t: float, per, hidden, r: int,
               visits: float) -> float:
    """A forward or an input-gradient backward: its compute slice (arguments: the seconds of each
    part), the exposed communication after it, the overlapped communication under it."""
    cat, keys, direction = _PASSES[name]
    args = {"micro_batch": mb, "chunk": c}
    dur = sum(per(k) for k in keys)
    lanes.add(s, "compute", f"{name} mb{mb} c{c}", t, dur, cat, {**args, **{f"{k}_s": per(k) for k in keys}})
    start, t = t, t + dur
    for stream, key in _PASS_COMM:
        d = per(f"{key}_{direction}")
        lanes.add(s, stream, f"{stream.upper()} {name} mb{mb}", t, d, "exposed", args)
        t += d
    _hidden(lanes, s, name, mb, start, hidden, r, visits, direction)
    return t


def _hidden(lanes: _Lanes, s: int, kind: str, mb: int, start: float, hidden, r: int, visits: float,
            direction: str) -> None:
    for stream, key in _HIDDEN:
        d = float(hidden.get(f"{key}_{direction}", np.zeros(3))[r]) / visits
        lanes.add(s, stream, f"{key.split('_')[0].upper()} {kind} mb{mb}", start, d, "overlapped", clip=True)


def _draw_tail(lanes: _Lanes, s: int, t_pipe: float, bd: Mapping[str, float], pred: Prediction, row: int) -> None:
    """After the pipeline: the DP communication left exposed, the optimizer and the step overhead."""
    opt = pred.state.opt
    if opt is not None:
        hid = float(np.asarray(opt.dp_comm_s)[row] - np.asarray(opt.dp_exposed_s)[row])
        lanes.add(s, "dp_hidden", "DP gradient reduction (overlapped)", max(t_pipe - hid, 0.0), min(hid, t_pipe),
                  "overlapped", clip=True)
    t = t_pipe
    for stream, key, label in (("dp", "dp_comm", "DP gradient reduction"), ("optimizer", "optimizer", "optimizer step"),
                               ("optimizer", "optimizer_host", "optimizer (host)"), ("overhead", "overhead",
                                                                                     "step overhead")):
        d = bd.get(key, 0.0)
        lanes.add(s, stream, label, t, d, "exposed" if stream == "dp" else stream)
        t += max(d, 0.0)


def _memory_track(pred: Prediction, row: int, r: int) -> tuple[float, float]:
    """(bytes besides activations, activation bytes at the stage's peak) of stage row `r`."""
    peak = float(pred.stage_memory_bytes[r, row])
    acts = float(pred.state.mem.activations_bytes[r, row]) if pred.state.mem is not None else 0.0
    return peak - acts, acts


def _emit_counter(lanes: _Lanes, s: int, counter: Sequence[tuple[float, int]], mem) -> None:
    """The stage's memory: activations follow the chunks held, scaled so the peak is the prediction's."""
    static, acts = mem
    top = max((h for _, h in counter), default=0) or 1
    for t, h in counter:
        lanes.events.append({"name": "memory", "ph": "C", "ts": t * _US, "pid": s,
                             "args": {"GiB": (static + acts * h / top) / GIB}})


def _metadata_events(lanes: _Lanes, stages: Sequence[int], p: int, crit: int) -> list[dict]:
    used = {(e["pid"], e["tid"]) for e in lanes.events if e["ph"] == "X"}
    out = []
    for i, s in enumerate(stages):
        role = "first" if s == 0 else ("last" if s == p - 1 else "middle")
        label = f"stage {s} ({role}{', critical' if s == crit else ''})"
        out.append({"name": "process_name", "ph": "M", "pid": s, "tid": 0, "args": {"name": label}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": s, "tid": 0, "args": {"sort_index": i}})
        for stream, (tid, tname) in THREADS.items():
            if (s, tid) in used:
                out.append({"name": "thread_name", "ph": "M", "pid": s, "tid": tid, "args": {"name": tname}})
                out.append({"name": "thread_sort_index", "ph": "M", "pid": s, "tid": tid,
                            "args": {"sort_index": tid}})
    return out


def stream_totals_s(trace: Mapping, pid: int) -> dict[str, float]:
    """Seconds of complete slices per stream (thread key of :data:`THREADS`) of process `pid`."""
    by_tid = {tid: key for key, (tid, _) in THREADS.items()}
    out: dict[str, float] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["pid"] == pid:
            key = by_tid[e["tid"]]
            out[key] = out.get(key, 0.0) + e["dur"] / _US
    return out


_KIND = {"forward": "F", "backward-input": "B", "backward-weight": "W"}


def timeline_events(trace: Mapping) -> list[tuple[int, str, int, int, float, float]]:
    """The compute slices of `trace` as :data:`mofa_framework.simulate.Event` tuples (seconds),
    for :func:`~mofa_framework.simulate.draw_timeline`."""
    out = []
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e.get("cat") in _KIND:
            a = e.get("args", {})
            out.append((e["pid"], _KIND[e["cat"]], a.get("micro_batch", 0), a.get("chunk", 0), e["ts"] / _US,
                        (e["ts"] + e["dur"]) / _US))
    return out


def write(trace: Mapping, path) -> Path:
    """Write `trace` as JSON to `path`; an unwritable path is a one-line ConfigError."""
    out = Path(path)
    try:
        out.write_text(json.dumps(trace, separators=(",", ":")))
    except OSError as exc:
        raise ConfigError(f"--trace {out}: cannot write: {exc}") from None
    return out


__all__ = ["STREAM_COMPONENTS", "THREADS", "build", "generic_order", "shown_stages", "stream_totals_s",
           "timeline_events", "write"]
