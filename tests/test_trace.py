"""The Chrome trace-event export (mofa_framework.trace): a valid trace-event file whose span is
the predicted step and whose streams add up to the breakdown, in the schedule plugin's order,
for every built-in schedule and for third-party ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from mofa_framework import trace as mtrace
from mofa_framework.api import Predictor
from mofa_framework.cli import _builtin_commands, cli
from mofa_framework.config import jobs_to_batch

_builtin_commands()
ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_SCHEDULE = ROOT / "examples" / "plugins" / "mofa-example-thirdparty" / "mofa_example_thirdparty" / "schedule.py"


def check_trace_format(tr: dict) -> None:
    """The JSON object format of the trace-event spec: required fields per phase, complete
    slices with dur ≥ 0 that never overlap on one thread, and events sorted by time."""
    json.dumps(tr)  # serialisable
    assert isinstance(tr["traceEvents"], list) and tr["displayTimeUnit"] in ("ms", "ns")
    timed = []
    lanes: dict[tuple, list] = {}
    for e in tr["traceEvents"]:
        assert {"name", "ph", "pid"} <= set(e), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index")
            assert "args" in e and "tid" in e
        elif e["ph"] == "X":
            assert {"ts", "dur", "tid", "cat"} <= set(e), e
            assert e["dur"] >= 0 and np.isfinite(e["ts"]) and np.isfinite(e["dur"])
            lanes.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
            timed.append(e["ts"])
        elif e["ph"] == "C":
            assert "ts" in e and all(np.isfinite(v) for v in e["args"].values())
            timed.append(e["ts"])
        else:
            raise AssertionError(f"unexpected phase {e['ph']!r}")
    assert timed == sorted(timed), "timed events must be sorted by ts"
    for key, spans in lanes.items():
        spans.sort()
        for (s0, e0), (s1, _) in zip(spans, spans[1:]):
            assert s1 >= e0 - 1e-6, f"overlapping slices on thread {key}: {e0} > {s1}"
    named = {(e["pid"], e["tid"]) for e in tr["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(lanes) <= named, "every thread with slices is named"


def predict_trace(predictor, data, **kw):
    job = predictor.job(data)
    pred = predictor.evaluate(jobs_to_batch([job], predictor.registry), job.model, job.hardware)
    return pred, mtrace.build(pred, 0, registry=predictor.registry, name=job.name, **kw)


def span_s(tr) -> float:
    ev = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    return (max(e["ts"] + e["dur"] for e in ev) - min(e["ts"] for e in ev)) / 1e6


def assert_reconciled(tr) -> None:
    od = tr["otherData"]
    bd = od["breakdown_s"]
    assert span_s(tr) == pytest.approx(od["step_time_s"], rel=1e-3)
    for pid in od["stages_shown"]:  # every stage starts at 0 at the earliest and ends with the step
        ev = [e for e in tr["traceEvents"] if e["ph"] == "X" and e["pid"] == pid]
        assert min(e["ts"] for e in ev) >= -1e-6
        assert max(e["ts"] + e["dur"] for e in ev) / 1e6 == pytest.approx(od["step_time_s"], rel=1e-3)
    totals = mtrace.stream_totals_s(tr, od["critical_stage"])
    for stream, comps in mtrace.STREAM_COMPONENTS.items():
        want = sum(bd.get(c, 0.0) for c in comps)
        assert totals.get(stream, 0.0) == pytest.approx(want, rel=1e-6, abs=1e-9), stream
    # what is left on the critical stage is idle: the bubble (and any schedule adjustment)
    busy = sum(totals.get(k, 0.0) for k in mtrace.STREAM_COMPONENTS)
    assert od["step_time_s"] - busy == pytest.approx(bd["bubble"] + bd["schedule_adjust"], rel=1e-3, abs=1e-6)


@pytest.fixture(scope="module")
def predictor():
    return Predictor()


BASE = {"model": {"name": "llama3-70b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 64},
        "parallel": {"tp": 8, "pp": 4, "global_batch_size": 32, "sequence_length": 4096},
        "features": {"distributed_optimizer": {}, "dp_overlap": {}, "tp_overlap": {}}}
SCHEDULES = [("1f1b", 1), ("gpipe", 1), ("interleaved-1f1b", 2), ("zb-h1", 1), ("zb-h2", 1), ("zb-v", 2),
             ("dualpipe", 1)]


def job_data(schedule, vpp, **parallel):
    return {**BASE, "parallel": {**BASE["parallel"], "vpp": vpp, **parallel}, "pipeline": {"schedule": schedule}}


@pytest.mark.parametrize("schedule,vpp", SCHEDULES)
def test_every_builtin_schedule_traces_valid_and_reconciled(predictor, schedule, vpp):
    pred, tr = predict_trace(predictor, job_data(schedule, vpp))
    check_trace_format(tr)
    assert_reconciled(tr)
    od = tr["otherData"]
    assert od["schedule"] == schedule and od["order"] == f"schedule {schedule!r}"
    # one forward, one backward-input and one backward-weight slice per micro-batch and chunk
    m, v = od["micro_batches"], od["vpp"]
    for pid in od["stages_shown"]:
        kinds = [(e["cat"], e["args"]["micro_batch"], e["args"]["chunk"]) for e in tr["traceEvents"]
                 if e["ph"] == "X" and e["pid"] == pid and e["tid"] == mtrace.THREADS["compute"][0]]
        visits = len(kinds) // (3 * m)
        assert len(kinds) == 3 * m * visits and len(set(kinds)) == len(kinds)
        assert visits == (v if schedule != "dualpipe" else 1)
    # the first, a middle and the last stage, or all with all_stages
    assert od["stages_shown"] == [0, 2, 3]
    _, full = predict_trace(predictor, job_data(schedule, vpp), all_stages=True)
    assert full["otherData"]["stages_shown"] == [0, 1, 2, 3]
    check_trace_format(full)


def test_slices_follow_the_schedule_plugins_order(predictor):
    """Stage by stage, the compute slices are the plugin's op order (BW drawn as B then W)."""
    _, tr = predict_trace(predictor, job_data("interleaved-1f1b", 2))
    sched = predictor.registry.schedules["interleaved-1f1b"]
    od = tr["otherData"]
    order = sched.order(od["pp"], od["vpp"], od["micro_batches"])
    cat = {"forward": "F", "backward-input": "B", "backward-weight": "W"}
    for pid in od["stages_shown"]:
        got = [(cat[e["cat"]], e["args"]["micro_batch"], e["args"]["chunk"]) for e in tr["traceEvents"]
               if e["ph"] == "X" and e["pid"] == pid and e["tid"] == mtrace.THREADS["compute"][0]]
        want = [x for kind, mb, c in order[pid] for x in ([("B", mb, c), ("W", mb, c)] if kind == "BW"
                                                           else [(kind, mb, c)])]
        assert got == want


def test_exposed_and_overlapped_communication_are_apart(predictor):
    pred, tr = predict_trace(predictor, job_data("interleaved-1f1b", 2))
    assert pred.state.opt.dp_exposed_s[0] < pred.state.opt.dp_comm_s[0]
    cats = {(e["tid"], e["cat"]) for e in tr["traceEvents"] if e["ph"] == "X"}
    assert (mtrace.THREADS["tp_hidden"][0], "overlapped") in cats  # tp_overlap hides part of TP
    assert (mtrace.THREADS["tp"][0], "exposed") in cats
    assert (mtrace.THREADS["dp_hidden"][0], "overlapped") in cats  # dp_overlap hides the reduction
    names = {e["args"]["name"] for e in tr["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"compute", "TP comm (exposed)", "TP comm (overlapped)", "PP p2p (exposed)", "optimizer"} <= names


def test_memory_counter_peaks_at_each_stages_predicted_memory(predictor):
    pred, tr = predict_trace(predictor, job_data("1f1b", 1))
    gib = 2.0 ** 30
    for pid, row in ((0, 0), (2, 1), (3, 2)):
        peak = max(e["args"]["GiB"] for e in tr["traceEvents"] if e["ph"] == "C" and e["pid"] == pid)
        assert peak == pytest.approx(pred.stage_memory_bytes[row, 0] / gib, rel=1e-9)
    assert max(pred.stage_memory_bytes[:, 0]) == pytest.approx(pred.peak_memory_bytes[0])


def test_bubble_scale_is_one_where_the_simulator_agrees(predictor):
    """Single stage: nothing to reconcile. 1F1B on equal stages: the simulator's idle time is
    the closed form's bubble to a few per cent (the end stages carry embedding and head)."""
    _, tr = predict_trace(predictor, {**BASE, "parallel": {**BASE["parallel"], "pp": 1, "tp": 8}})
    assert tr["otherData"]["bubble_scale"] == 1.0 and tr["otherData"]["stages_shown"] == [0]
    assert_reconciled(tr)
    _, tr = predict_trace(predictor, job_data("1f1b", 1))
    assert 0.97 < tr["otherData"]["bubble_scale"] < 1.03


THIRD_PARTY_NO_ORDER = '''
import numpy as np
from mofa_framework import hookimpl
from mofa_framework.engine import Inflight, PipelineTimes
from mofa_framework.types import PipelineSchedule

def time(x):
    work = x.F + x.B + x.W
    bubble = (x.p - 1.0) * work
    return PipelineTimes(busy_s=x.m * work, bubble_s=bubble, pp_comm_s=2.0 * x.m * x.p2p_s,
                         warmup_s=np.zeros_like(work), steady_s=x.m * work + bubble + 2.0 * x.m * x.p2p_s,
                         cooldown_s=np.zeros_like(work))

@hookimpl
def mofa_register_pipeline_schedules():
    return [PipelineSchedule(name="plain-fill-drain", description="test schedule without an op order",
                             time=time, inflight=lambda x: Inflight(first=x.m, mid=x.m, last=x.m))]
'''


def test_third_party_schedules_get_a_trace_with_no_extra_code(mofa_fake_distribution):
    """The example distribution's breadth-first schedule (entry point, its own op order) and a
    schedule that gives no order at all (a generic order, said so in otherData)."""
    mofa_fake_distribution("mofa-example-thirdparty", "0.1.0",
                           {"example_schedule": "mofa_example_thirdparty_schedule"},
                           {"mofa_example_thirdparty_schedule": EXAMPLE_SCHEDULE.read_text()})
    mofa_fake_distribution("mofa-test-noorder", "0.1.0", {"noorder": "noorder_schedule"},
                           {"noorder_schedule": THIRD_PARTY_NO_ORDER})
    pr = Predictor(strict=True)
    assert {"breadth-first", "plain-fill-drain"} <= set(pr.registry.schedules)
    _, tr = predict_trace(pr, job_data("breadth-first", 2))
    check_trace_format(tr)
    assert_reconciled(tr)
    assert tr["otherData"]["order"] == "schedule 'breadth-first'"
    _, tr = predict_trace(pr, job_data("plain-fill-drain", 1))
    check_trace_format(tr)
    assert_reconciled(tr)
    assert tr["otherData"]["order"].startswith("generic")


def test_generic_order_runs_forwards_then_backwards():
    from mofa_framework.simulate import megatron_route, simulate

    order = mtrace.generic_order(3, 2, 4, megatron_route(3, 2))
    assert order[0][:2] == [("F", 0, 0), ("F", 0, 1)] and order[0][-1] == ("BW", 3, 0)
    r = simulate(order, p=3, v=2, m=4, F=1.0, B=2.0)  # never deadlocks
    assert r.busy_s.max() == pytest.approx(4 * 2 * 3.0)


def test_predictor_trace_api(predictor):
    tr = predictor.trace(job_data("1f1b", 1))
    check_trace_format(tr)
    assert tr["otherData"]["step_time_s"] == pytest.approx(predictor.predict(predictor.job(job_data("1f1b", 1)))[0]
                                                           .step_time_s, rel=1e-12)


# ---------------------------------------------------------------------- the command line


@pytest.fixture
def run(monkeypatch):
    monkeypatch.delenv("MOFA_DISABLED_PLUGINS", raising=False)
    runner = CliRunner()
    return lambda *a: runner.invoke(cli, list(a), catch_exceptions=False)


JOB_FLAGS = ["--model", "llama3-70b", "--hardware", "h100-sxm5-80gb", "--gpus", "64", "--tp", "8", "--pp", "4",
             "--gbs", "32", "--seq", "4096"]


def test_cli_predict_trace_and_timeline(run, tmp_path):
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "step.json", tmp_path / "timeline"
    r = run("predict", *JOB_FLAGS, "--format", "json", "--trace", str(out), "--plot-timeline", str(png),
            "--all-stages")
    assert r.exit_code == 0, r.output
    pred = json.loads(r.stdout)
    tr = json.loads(out.read_text())
    check_trace_format(tr)
    assert tr["otherData"]["step_time_s"] == pytest.approx(pred["step_time_s"])
    assert tr["otherData"]["stages_shown"] == [0, 1, 2, 3]
    written = tmp_path / "timeline.png"  # matplotlib appends .png; the message names that file
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"timeline written to {written}" in r.output
    assert "ui.perfetto.dev" in r.output


def test_cli_trace_needs_one_job(run, tmp_path):
    job = ROOT / "examples" / "llama3-405b-h100.toml"
    r = run("predict", str(job), str(job), "--trace", str(tmp_path / "t.json"))
    assert r.exit_code == 2 and "single job" in r.output


def test_cli_tune_trace_best(run, tmp_path):
    out = tmp_path / "best.json"
    r = run("tune", "--model", "llama3-8b", "--hardware", "h100-sxm5-80gb", "--gpus", "16", "--gbs", "32",
            "--seq", "4096", "--tp-values", "1,2", "--pp-values", "2", "--top", "2", "--format", "json",
            "--trace-best", str(out))
    assert r.exit_code == 0, r.output
    best = json.loads(r.stdout)["best"][0]
    tr = json.loads(out.read_text())
    check_trace_format(tr)
    assert tr["otherData"]["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-9)
    assert tr["otherData"]["schedule"] == best["schedule"]
