"""Pipeline schedules: closed forms (the plugins' ``time``/``inflight``) against the
discrete-event simulator (:mod:`mofa_framework.simulate`), properties, and the engine path.

Tolerances: with τ = 0 and equal stages 1F1B, GPipe, interleaved 1F1B and ZB-H1 match the
simulator exactly (1e-9). With τ > 0 the closed forms charge Megatron's blocking p2p, 2τ per
micro-batch (chunk) on the critical stage; the simulator with blocking sends differs by at
most (m·v + 2p)·τ. ZB-H2, ZB-V and DualPipe orders come from a greedy heuristic, so their
closed forms are checked to within 12 % of the step (m ≥ 2p; DualPipe 15 %), and exactly (zero bubble) at
F = B = W for ZB-H2/ZB-V.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mofa_framework.engine import PipelineInputs
from mofa_framework.simulate import draw_timeline, greedy_order, peak_inflight, simulate
from mofa_plugins import schedule_1f1b, schedule_dualpipe, schedule_gpipe, schedule_interleaved
from mofa_plugins import schedule_zero_bubble as zb


# ------------------------------------------------------------------ op orders the 1F1B plugins lack
order_1f1b = schedule_1f1b.op_order
order_interleaved = schedule_interleaved.op_order


def inputs(p, v, m, F, B, W, tau=0.0):
    """PipelineInputs of equal stages with per-chunk times F, B, W."""
    a = lambda z: np.array([float(z)])  # noqa: E731
    return PipelineInputs(p=a(p), v=a(v), m=a(m), F=a(F), B=a(B), W=a(W), sum_F=a(p * v * F), sum_B=a(p * v * B),
                          sum_W=a(p * v * W), p2p_s=a(tau), steady_p2p_s=a(2 * tau))


TIMES = [(1.0, 1.0, 1.0), (1.0, 1.5, 0.7), (1.0, 2.0, 1.0), (0.8, 1.1, 0.3)]
GRID = [(p, m) for p in (2, 4, 8) for m in (p, 2 * p, 4 * p)]


def closed(schedule, p, v, m, F, B, W, tau=0.0):
    return float(schedule.time(inputs(p, v, m, F, B, W, tau)).total_s[0])


# ------------------------------------------------------------------ exact closed forms, τ = 0
@pytest.mark.parametrize("p,m", GRID)
@pytest.mark.parametrize("F,B,W", TIMES)
def test_1f1b_gpipe_zbh1_exact(p, m, F, B, W):
    for sched, order in [(schedule_1f1b.SCHEDULE, order_1f1b), (schedule_gpipe.SCHEDULE, schedule_gpipe.op_order),
                         (zb.ZB_H1, zb.op_order_h1)]:
        r = simulate(order(p, 1, m), p=p, m=m, F=F, B=B, W=W)
        assert r.makespan_s == pytest.approx(closed(sched, p, 1, m, F, B, W), rel=1e-9), sched.name
        assert r.busy_s.max() == pytest.approx(m * (F + B + W))


@pytest.mark.parametrize("p,m", GRID)
@pytest.mark.parametrize("v", [2, 4])
def test_interleaved_exact_and_textbook_bubble(p, v, m):
    F, B, W = 0.5, 0.8, 0.4  # per chunk
    r = simulate(order_interleaved(p, v, m), p=p, v=v, m=m, F=F, B=B, W=W)
    t = schedule_interleaved.SCHEDULE.time(inputs(p, v, m, F, B, W))
    assert r.makespan_s == pytest.approx(float(t.total_s[0]), rel=1e-9)
    # textbook: (p−1)(F_s + B_s)/v with per-stage F_s = v·F, B_s = v·(B+W)
    assert float(t.bubble_s[0]) == pytest.approx((p - 1) * (v * F + v * (B + W)) / v)
    assert r.makespan_s - m * v * (F + B + W) == pytest.approx((p - 1) * (F + B + W))


def test_interleaved_group_size_by_hand():
    """Megatron-Core runs interleaved micro-batches in groups of N per virtual stage (pp by default)
    and refuses a last group smaller than pp: m = 10 on 4 stages needs N = 5 (10 % 5 = 0), m = 9
    N = 5 (9 % 5 = 4 ≥ 4), m = 7 N = 7 (5 and 6 leave 2 and 1), m = 8 the default 4."""
    got = schedule_interleaved.group_size(np.array([10, 9, 7, 8, 12, 10]), np.array([4, 4, 4, 4, 4, 3]))
    assert got.tolist() == [5, 5, 7, 4, 4, 5]


@pytest.mark.parametrize("p,v,m", [(4, 2, 10), (4, 2, 9), (4, 2, 7), (4, 3, 10), (3, 2, 10), (8, 2, 12)])
def test_interleaved_with_micro_batches_pp_does_not_divide(p, v, m):
    """The closed forms with the group size N equal the simulated schedule table (groups of N, the
    first stage warming up with 2(p−1) + (v−1)·N chunks): step time and peak activations."""
    F, B, W = 0.5, 0.8, 0.4
    r = simulate(order_interleaved(p, v, m), p=p, v=v, m=m, F=F, B=B, W=W)
    assert r.makespan_s == pytest.approx(float(schedule_interleaved.SCHEDULE.time(inputs(p, v, m, F, B, W)).total_s[0]))
    got = peak_inflight(simulate(order_interleaved(p, v, m), p=p, v=v, m=m, F=1, B=2, W=0).timeline, p) / v
    fl = schedule_interleaved.inflight(inputs(p, v, m, 1, 2, 0))
    assert got[0] == pytest.approx(fl.first[0]) and got[-1] == pytest.approx(fl.last[0])
    n = int(schedule_interleaved.group_size(m, p)[0])
    assert fl.first[0] == pytest.approx(min(m * v, 2 * (p - 1) + (v - 1) * n + 1) / v)


@pytest.mark.parametrize("p,m", GRID)
@pytest.mark.parametrize("tau", [0.02, 0.1])
def test_p2p_within_stated_tolerance(p, m, tau):
    F, B, W = 1.0, 1.5, 0.7
    cases = [(schedule_1f1b.SCHEDULE, order_1f1b, 1), (schedule_gpipe.SCHEDULE, schedule_gpipe.op_order, 1),
             (zb.ZB_H1, zb.op_order_h1, 1), (schedule_interleaved.SCHEDULE, order_interleaved, 2)]
    for sched, order, v in cases:
        r = simulate(order(p, v, m), p=p, v=v, m=m, F=F / v, B=B / v, W=W / v, tau=tau, p2p="blocking")
        cf = closed(sched, p, v, m, F / v, B / v, W / v, tau)
        assert abs(r.makespan_s - cf) <= (m * v + 2 * p) * tau + 1e-9, sched.name
        # p2p only ever adds time
        assert r.makespan_s >= simulate(order(p, v, m), p=p, v=v, m=m, F=F / v, B=B / v, W=W / v).makespan_s


# ------------------------------------------------------------------ in-flight activations
def test_gpipe_holds_every_micro_batch_only_in_a_pipeline():
    """GPipe's stages hold all m micro-batches at the turn (the simulated order says so); with one
    stage there is no pipeline and frameworks accumulate one micro-batch at a time, as 1F1B."""
    for p, m in ((4, 8), (2, 3)):
        r = simulate(schedule_gpipe.op_order(p, 1, m), p=p, m=m, F=1, B=2, W=0)
        assert list(peak_inflight(r.timeline, p)) == [m] * p
        fl = schedule_gpipe.inflight(inputs(p, 1, m, 1, 2, 0))
        assert fl.first[0] == fl.mid[0] == fl.last[0] == m
    one = schedule_gpipe.inflight(inputs(1, 1, 8, 1, 2, 0))
    assert one.first[0] == one.last[0] == 1 == schedule_1f1b.inflight(inputs(1, 1, 8, 1, 2, 0)).first[0]


@pytest.mark.parametrize("p,m", GRID)
def test_inflight_exact_1f1b_interleaved(p, m):
    r = simulate(order_1f1b(p, 1, m), p=p, m=m, F=1, B=2, W=0)
    got = peak_inflight(r.timeline, p)
    fl = schedule_1f1b.inflight(inputs(p, 1, m, 1, 2, 0))
    assert got[0] == fl.first[0] and got[-1] == fl.last[0]
    assert list(got) == [min(m, p - j) for j in range(p)]
    for v in (2, 4):
        r = simulate(order_interleaved(p, v, m), p=p, v=v, m=m, F=1, B=2, W=0)
        got = peak_inflight(r.timeline, p) / v
        fl = schedule_interleaved.inflight(inputs(p, v, m, 1, 2, 0))
        assert got[0] == pytest.approx(fl.first[0]) and got[-1] == pytest.approx(fl.last[0])
        if m >= p:  # Korthikanti et al.: the first stage holds p(1 + (p−1)/(p·v)) micro-batches
            assert got[0] == pytest.approx(min(p * (1 + (p - 1) / (p * v)), m))


@pytest.mark.parametrize("p,m", GRID)
def test_zero_bubble_memory(p, m):
    h1 = simulate(zb.op_order_h1(p, 1, m), p=p, m=m, F=1, B=1, W=1)
    assert list(peak_inflight(h1.timeline, p)) == [min(m, p - j) for j in range(p)]  # 1F1B's
    h2 = simulate(zb.op_order_h2(p, 1, m), p=p, m=m, F=1, B=1, W=1)
    got = peak_inflight(h2.timeline, p)
    fl = zb.inflight_h2(inputs(p, 1, m, 1, 1, 1))
    assert got[0] == fl.first[0] == min(m, 2 * p - 1)
    assert (got >= peak_inflight(h1.timeline, p)).all()
    v = simulate(zb.op_order_v(p, 2, m), p=p, v=2, m=m, F=1, B=1, W=1, route=zb.v_route(p))
    got = peak_inflight(v.timeline, p) / 2
    flv = zb.inflight_v(inputs(p, 2, m, 1, 1, 1))
    assert got[0] == pytest.approx(flv.first[0]) and got[-1] == pytest.approx(flv.last[0])
    assert got.max() <= p  # never more than 1F1B's first stage


# ------------------------------------------------------------------ ZeroBubble times
@pytest.mark.parametrize("p,m", GRID)
@pytest.mark.parametrize("F,B,W", TIMES)
def test_zero_bubble_ordering(p, m, F, B, W):
    t1f1b = closed(schedule_1f1b.SCHEDULE, p, 1, m, F, B, W)
    h1, h2 = closed(zb.ZB_H1, p, 1, m, F, B, W), closed(zb.ZB_H2, p, 1, m, F, B, W)
    assert h2 <= h1 <= t1f1b
    sim_h1 = simulate(zb.op_order_h1(p, 1, m), p=p, m=m, F=F, B=B, W=W).makespan_s
    sim_h2 = simulate(zb.op_order_h2(p, 1, m, F=F, B=B, W=W), p=p, m=m, F=F, B=B, W=W).max_span_s
    sim_1f1b = simulate(order_1f1b(p, 1, m), p=p, m=m, F=F, B=B, W=W).makespan_s
    assert sim_h1 <= sim_1f1b + 1e-9
    # the greedy ZB-H2 order is a heuristic: at m = p it may lose up to 1 % to ZB-H1
    assert sim_h2 <= sim_h1 * (1.0 if m >= 2 * p else 1.01) + 1e-9


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("F,B,W", TIMES)
def test_greedy_schedules_near_closed_form(p, k, F, B, W):
    m = k * p
    h2 = simulate(zb.op_order_h2(p, 1, m, F=F, B=B, W=W), p=p, m=m, F=F, B=B, W=W)
    assert h2.max_span_s == pytest.approx(closed(zb.ZB_H2, p, 1, m, F, B, W), rel=0.12)
    Fc, Bc, Wc = F / 2, B / 2, W / 2
    v = simulate(zb.op_order_v(p, 2, m, F=Fc, B=Bc, W=Wc), p=p, v=2, m=m, F=Fc, B=Bc, W=Wc, route=zb.v_route(p))
    assert v.max_span_s == pytest.approx(closed(zb.ZB_V, p, 2, m, Fc, Bc, Wc), rel=0.12)
    d = simulate(schedule_dualpipe.op_order(p, 1, m, F=F, B=B, W=W), p=p, v=2, m=m, F=F, B=B, W=W,
                 route=schedule_dualpipe.route(p, m))
    # DualPipe's greedy order has no F&B pairing (the simulator runs one op at a time): 15 %
    assert d.max_span_s == pytest.approx(closed(schedule_dualpipe.SCHEDULE, p, 1, m, F, B, W), rel=0.15)
    assert d.max_span_s <= simulate(zb.op_order_h1(p, 1, m), p=p, m=m, F=F, B=B, W=W).makespan_s + 1e-9


@pytest.mark.parametrize("p", [2, 4, 8])
def test_zero_bubble_at_equal_times(p):
    m = 2 * p
    h2 = simulate(zb.op_order_h2(p, 1, m), p=p, m=m, F=1, B=1, W=1)
    assert h2.max_span_s == pytest.approx(3 * m) == closed(zb.ZB_H2, p, 1, m, 1, 1, 1)
    v = simulate(zb.op_order_v(p, 2, m), p=p, v=2, m=m, F=1, B=1, W=1, route=zb.v_route(p))
    assert v.max_span_s == pytest.approx(6 * m) == closed(zb.ZB_V, p, 2, m, 1, 1, 1)


# ------------------------------------------------------------------ properties
ALL = [schedule_1f1b.SCHEDULE, schedule_gpipe.SCHEDULE, schedule_interleaved.SCHEDULE, zb.ZB_H1, zb.ZB_H2, zb.ZB_V,
       schedule_dualpipe.SCHEDULE]
_pos = st.floats(0.05, 5.0)


@settings(max_examples=60, deadline=None)
@given(p=st.sampled_from([2, 4, 8]), m=st.integers(1, 64), F=_pos, B=_pos, W=st.floats(0.0, 5.0),
       tau=st.floats(0.0, 0.5), idx=st.integers(0, len(ALL) - 1))
def test_more_microbatches_never_faster_and_busy_bound(p, m, F, B, W, tau, idx):
    sched = ALL[idx]
    v = 2 if sched.requires_vpp else 1
    t_m = closed(sched, p, v, m, F, B, W, tau)
    assert closed(sched, p, v, m + 1, F, B, W, tau) >= t_m - 1e-9
    assert t_m >= m * v * (F + B + W) - 1e-9


@settings(max_examples=25, deadline=None)
@given(p=st.sampled_from([2, 4]), m=st.integers(1, 12), F=_pos, B=_pos, W=st.floats(0.0, 3.0))
def test_simulated_time_monotone_in_m(p, m, F, B, W):
    for order in (order_1f1b, zb.op_order_h1, schedule_gpipe.op_order):
        a = simulate(order(p, 1, m), p=p, m=m, F=F, B=B, W=W)
        b = simulate(order(p, 1, m + 1), p=p, m=m + 1, F=F, B=B, W=W)
        assert b.makespan_s >= a.makespan_s - 1e-9
        assert a.makespan_s >= m * (F + B + W) - 1e-9


# ------------------------------------------------------------------ simulator API
def test_simulator_rejects_bad_orders():
    with pytest.raises(ValueError, match="deadlocks"):
        simulate([[("BW", 0, 0), ("F", 0, 0)], [("F", 0, 0), ("BW", 0, 0)]], p=2, m=1, F=1, B=1)
    with pytest.raises(ValueError, match="missing"):
        simulate([[("F", 0, 0), ("BW", 0, 0)], []], p=2, m=1, F=1, B=1)
    with pytest.raises(ValueError, match="twice"):
        simulate([[("F", 0, 0), ("F", 0, 0)]], p=1, m=1, F=1, B=1)
    with pytest.raises(ValueError, match="p2p"):
        simulate([[("F", 0, 0), ("BW", 0, 0)]], p=1, m=1, F=1, B=1, p2p="magic")


def test_timeline_busy_idle():
    r = simulate(order_1f1b(4, 1, 8), p=4, m=8, F=1, B=2, W=0)
    assert len(r.timeline) == 4 * 8 * 2
    assert np.allclose(r.busy_s + r.idle_s, r.makespan_s)
    for s in range(4):
        ev = sorted((e for e in r.timeline if e[0] == s), key=lambda e: e[4])
        assert all(a[5] <= b[4] + 1e-12 for a, b in zip(ev, ev[1:]))  # no overlap on a stage


def test_peak_inflight_hand_made():
    tl = [(0, "F", 0, 0, 0.0, 1.0), (0, "F", 1, 0, 1.0, 2.0), (0, "B", 0, 0, 2.0, 3.0), (0, "W", 0, 0, 3.0, 4.0),
          (0, "F", 2, 0, 4.0, 5.0), (0, "BW", 1, 0, 5.0, 6.0), (0, "BW", 2, 0, 6.0, 7.0), (1, "F", 0, 0, 1.0, 2.0)]
    assert list(peak_inflight(tl, 2)) == [2, 1]
    assert list(peak_inflight([], 1)) == [0]


def test_greedy_order_needs_room():
    with pytest.raises(ValueError, match="memory limit"):
        greedy_order(p=2, m=2, limit=lambda s: 0)


def test_draw_timeline(tmp_path):
    pytest.importorskip("matplotlib")
    r = simulate(zb.op_order_h1(4, 1, 8), p=4, m=8, F=1, B=1, W=1)
    out = tmp_path / "zb.png"
    draw_timeline(r.timeline, out, title="ZB-H1 p=4 m=8")
    assert out.stat().st_size > 1000


def test_draw_timeline_without_matplotlib(tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def fake(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(ImportError, match="pip install"):
        draw_timeline([(0, "F", 0, 0, 0.0, 1.0)], tmp_path / "x.png")


# ------------------------------------------------------------------ through the engine
def _job(pred, schedule, vpp=1, gbs=64):
    """GPT-3 175B as the ZeroBubble fork runs it, for every schedule alike: untied embeddings and fp16
    (the fork asserts the first, and its optimizer post-validation the second)."""
    return pred.job({"model": {"name": "gpt3-175b", "tied_embeddings": False},
                     "hardware": {"name": "a100-sxm4-80gb", "num_gpus": 64},
                     "parallel": {"tp": 8, "pp": 8, "vpp": vpp, "global_batch_size": gbs, "sequence_length": 2048,
                                  "precision": "fp16"},
                     "pipeline": {"schedule": schedule}})


def test_engine_schedules(mofa_predictor):
    names = ["1f1b", "gpipe", "zb-h1", "zb-h2", "dualpipe"]
    res = dict(zip(names, mofa_predictor.predict([_job(mofa_predictor, n) for n in names])))
    res["zb-v"] = mofa_predictor.predict(_job(mofa_predictor, "zb-v", vpp=2))[0]
    for r in res.values():
        assert sum(r.breakdown.values()) == pytest.approx(r.step_time_s, rel=1e-9)
        assert sum(r.pipeline_phases.values()) == pytest.approx(
            r.breakdown["bubble"] + r.breakdown["pp_comm"] + sum(r.breakdown[k] for k in r.breakdown
                                                                   if k.startswith(("compute", "tp_", "cp_", "ep_", "dp_layer",
                                                                                    "recompute", "offload",
                                                                                    "microbatch_overhead",
                                                                                    "schedule_adjust"))), rel=1e-6)
    assert res["zb-h2"].step_time_s <= res["zb-h1"].step_time_s < res["1f1b"].step_time_s
    assert res["gpipe"].step_time_s == pytest.approx(res["1f1b"].step_time_s, rel=1e-6)
    act = {k: r.memory_breakdown["activations"] for k, r in res.items()}
    assert act["zb-h1"] == pytest.approx(act["1f1b"])
    assert act["zb-h2"] > act["zb-h1"] and act["gpipe"] > act["zb-h2"]
    assert res["dualpipe"].memory_breakdown["weights"] == pytest.approx(2 * res["1f1b"].memory_breakdown["weights"])


# ------------------------------------------------------------------ DualPipe: each GPU runs two mirrored stages
def test_dualpipe_inflight_by_hand():
    """DeepSeek-V3 Table 2: p + 1 micro-batches' activations per GPU. An end GPU is the first stage
    of one direction (p of the first stage's, as 1F1B's first stage) and the last of the other (one
    of the last stage's); p = 8, m = 32."""
    x = schedule_dualpipe.inflight(inputs(8, 1, 32, 1.0, 1.0, 1.0))
    got = {k: float(np.ravel(getattr(x, k))[0]) for k in ("first", "mirror_first", "mid", "mirror_mid", "last",
                                                           "mirror_last")}
    assert got == {"first": 8.0, "mirror_first": 1.0, "mid": 9.0, "mirror_mid": 0.0, "last": 1.0, "mirror_last": 8.0}
    assert schedule_dualpipe.SCHEDULE.mirrored and schedule_dualpipe.SCHEDULE.parameter_copies == 1


def test_dualpipe_inflight_matches_the_simulated_split():
    """At m = 2p the greedy DualPipe order holds, on GPU 0, p micro-batches of its first stage
    (direction 0→p−1, chunk 0) and one of its last (chunk 1); no GPU holds more than p + 1."""
    p, m = 8, 16
    r = simulate(schedule_dualpipe.op_order(p, 1, m), p=p, v=2, m=m, F=1.0, B=1.0, W=1.0,
                 route=schedule_dualpipe.route(p, m))
    per_chunk = [peak_inflight([e for e in r.timeline if e[3] == c], p) for c in (0, 1)]
    x = schedule_dualpipe.inflight(inputs(p, 1, m, 1.0, 1.0, 1.0))
    assert (per_chunk[0][0], per_chunk[1][0]) == (float(x.first[0]), float(x.mirror_first[0]))
    peak = peak_inflight(r.timeline, p)
    assert peak.max() == p + 1 and peak[0] == p + 1


def _stages(pred, schedule):
    """(pipelined, memory, optimizer) of Llama 3.1 8B on 32 GPUs at PP 4 with uneven stages
    (6 + 8 + 8 + 10 layers), m = 16 micro-batches."""
    from mofa_framework import engine
    from mofa_framework.config import jobs_to_batch

    job = pred.job({"model": {"name": "llama3.1-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 32},
                    "parallel": {"tp": 1, "pp": 4, "first_stage_layers": 6, "last_stage_layers": 10,
                                 "micro_batch_size": 1, "global_batch_size": 128, "sequence_length": 4096},
                    "pipeline": {"schedule": schedule}})
    pl = engine.pipeline_phase(jobs_to_batch([job], pred.registry), job.model, job.hardware, pred.pm)
    st = engine._optimizer_and_memory(pl, {})
    return pl, st.mem, st.opt


def test_dualpipe_gpus_hold_both_mirrored_stages(mofa_predictor):
    """GPU j holds stage j and stage p−1−j: an end GPU the first and the last stage's parameters,
    p of the first stage's activations and one of the last's (1F1B's first plus its last), the loss
    of one direction; a middle GPU two middle stages' parameters and p + 1 micro-batches; the DP
    reduction moves the busiest GPU's gradients, both stages'."""
    one_pl, one, one_opt = _stages(mofa_predictor, "1f1b")
    dual_pl, dual, dual_opt = _stages(mofa_predictor, "dualpipe")
    p = 4.0
    for field in ("dense_params", "weights_bytes", "grads_bytes"):
        a, d = getattr(one, field)[:, 0], getattr(dual, field)[:, 0]
        assert d[0] == pytest.approx(a[0] + a[2]) and d[2] == pytest.approx(a[0] + a[2]), field
        assert d[1] == pytest.approx(2.0 * a[1]), field
    a, d = one.activations_bytes[:, 0], dual.activations_bytes[:, 0]
    # 1F1B's first stage holds p micro-batches, its last one, its worst middle p − 1
    assert d[0] == pytest.approx(a[0] + a[2]) and d[2] == pytest.approx(a[0] + a[2])
    assert d[1] == pytest.approx(a[1] * (p + 1.0) / (p - 1.0))
    assert dual.logits_bytes[0, 0] == pytest.approx(one.logits_bytes[2, 0]) == pytest.approx(dual.logits_bytes[2, 0])
    assert one.logits_bytes[0, 0] == 0.0
    busiest = max(2.0 * one.dense_params[1, 0], one.dense_params[0, 0] + one.dense_params[2, 0])
    assert dual_opt.dense_grad_bytes[0] == pytest.approx(4.0 * busiest)  # fp32 main grads


def test_dualpipe_end_gpus_run_the_mean_of_the_end_stages(mofa_predictor):
    """An end GPU runs m/2 micro-batches through the first stage and m/2 through the last: its work
    per micro-batch is their mean; a middle GPU's is a middle stage's."""
    one_pl, _, _ = _stages(mofa_predictor, "1f1b")
    dual_pl, _, _ = _stages(mofa_predictor, "dualpipe")
    for k in ("compute_fwd", "compute_bwd_input", "compute_bwd_weight"):
        a, d = one_pl.comp[k][:, 0], dual_pl.comp[k][:, 0]
        assert d[0] == pytest.approx(0.5 * (a[0] + a[2])) == pytest.approx(d[2]), k
        assert d[1] == pytest.approx(a[1]), k


def test_csv_names_resolve(mofa_predictor):
    reg = mofa_predictor.registry
    assert reg.schedule("ZB-1p").name == "zb-h1"
    assert reg.schedule("ZB-2p").name == "zb-h2"
    assert reg.schedule("ZB-V").name == "zb-v"


# ------------------------------------------------------------------ ZB-2p's automatic schedule
def test_adaptive_bubble_by_hand():
    # p 8, F 1, B 1.3, W 0.4: handcrafted (p−1)(F+B−2W) = 10.5; floor (p−1)(B−F) = 2.1
    # m 32: 10.5 − 0.4·(32 − 15) = 3.7 (above the floor); m 64: 10.5 − 19.6 < 2.1, so the floor
    assert zb.adaptive_bubble(10.5, 7.0, 9.1, 0.4, 32, 8) == pytest.approx(3.7)
    assert zb.adaptive_bubble(10.5, 7.0, 9.1, 0.4, 64, 8) == pytest.approx(2.1)
    # p 4, F 1, B 2, W 1.5: the handcrafted form says 0, the memory floor (p−1)(B−F) = 3
    assert zb.adaptive_bubble(0.0, 3.0, 6.0, 1.5, 16, 4) == pytest.approx(3.0)
    # up to 2p − 1 micro-batches nothing changes
    assert zb.adaptive_bubble(10.5, 7.0, 9.1, 0.4, 15, 8) == pytest.approx(10.5)


def test_zb_2p_follows_its_greedy_schedule_at_real_times():
    """The paper's ZB-2p is its heuristic run on the profiled F, B, W: the closed form tracks the
    simulated greedy order at those times better than the handcrafted ZB-H2 bubble does."""
    rng = np.random.default_rng(7)
    new_err, old_err = [], []
    for p in (4, 8):
        for _ in range(4):
            F, B, W = 1.0, float(rng.uniform(0.8, 1.6)), float(rng.uniform(0.3, 1.1))
            for m in (2 * p - 1, 3 * p, 4 * p, 8 * p):
                sim = simulate(zb.op_order_h2(p, 1, m, F=F, B=B, W=W), p=p, m=m, F=F, B=B, W=W).max_span_s
                busy = m * (F + B + W)
                credit = 1.0 + min(max((m - p) / (p - 1), 0.0), 1.0)
                handcrafted = (p - 1) * max(F + B - credit * W, 0.0)
                new_err.append(abs(closed(zb.ZB_H2, p, 1, m, F, B, W) - sim) / busy)
                old_err.append(abs(busy + handcrafted - sim) / busy)
    assert np.mean(new_err) < 0.015 and np.mean(new_err) < 0.5 * np.mean(old_err)


# ------------------------------------------------------------------ fewer micro-batches than stages
def test_zero_bubble_critical_path_by_hand():
    # p 16, m 4, F = B = W = 1 s, τ 0.1 s: micro-batch 0 reaches the last stage after 15 s, which
    # then runs 4 F and 4 B (8 s); the last B runs back up 15 stages (15 s), the first stage's W
    # follows (1 s), 15 hops each way (3 s): 42 s (39 s at τ = 0, the simulated ZB-H1 order's span)
    x = inputs(16, 1, 4, 1.0, 1.0, 1.0, 0.1)
    assert float(zb.critical_path(x, 1)[0]) == pytest.approx(42.0)
    # the bubble formulas alone said busy 12 + (p − 1)(F + B − W) = 27 s at τ = 0: below the chain
    assert closed(zb.ZB_H1, 16, 1, 4, 1.0, 1.0, 1.0) == pytest.approx(39.0)
    # ZB-V, chunk times 0.5 s: 16 + 16 + 3·1 + 0.5 + 2·15·2·0.1 = 41.5 s
    assert float(zb.critical_path(inputs(16, 2, 4, 0.5, 0.5, 0.5, 0.1), 2)[0]) == pytest.approx(41.5)


@pytest.mark.parametrize("sched,order,v,route,tol", [(zb.ZB_H1, zb.op_order_h1, 1, None, 1e-9),
                                                     (zb.ZB_H2, zb.op_order_h2, 1, None, 1e-9),
                                                     (zb.ZB_V, zb.op_order_v, 2, zb.v_route, 0.12)])
def test_zero_bubble_below_p_micro_batches_keeps_to_the_simulated_schedule(sched, order, v, route, tol):
    """m < p (the shared ZeroBubble rows at global batch 4–12): the steady-state W credits no longer
    apply, and the closed forms fell up to 45 % (ZB-V 68 %) below the simulated span; floored at the
    critical path, ZB-H1 and ZB-H2 equal it and ZB-V is never above it and within 12 %."""
    errs = []
    for p in (4, 8, 16):
        for m in range(1, p):
            for F, B, W in TIMES:
                f, b, w = F / v, B / v, W / v
                sim = simulate(order(p, v, m), p=p, v=v, m=m, F=f, B=b, W=w,
                               route=route(p) if route else None).max_span_s
                errs.append((closed(sched, p, v, m, f, b, w) - sim) / sim)
    assert max(errs) <= 1e-9 and min(errs) >= -tol
