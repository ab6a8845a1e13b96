"""End-to-end time and ETTR (paper §3.4, §4.2, §5.4; mofa_framework/e2e.py, `mofa e2e`)."""

import json
import math
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from mofa_framework import e2e as E
from mofa_framework.cli import _builtin_commands, cli
from mofa_framework.e2e import e2e_for_job, e2e_time, num_steps, optimal_interval_steps, young_interval_steps

_builtin_commands()

MTTR_3_6_1 = 0.3 * 141 + 0.6 * 262 + 0.1 * 307  # eq. [41], paper §3.4

# Paper Table 5 (cost-model.md §7): GPUs, T_save, T_init, T_step, B_g, printed N_step, ETTR %, T_total s
TABLE5 = {
    "llama2-70b-128": (128, 4.19, 134.41, 27.83, 256, 953675, 98.49, 26947190.75),
    "llama2-70b-256": (256, 2.35, 147.72, 27.99, 512, 476838, 99.11, 13465926.21),
    "llama2-70b-512": (512, 1.59, 174.34, 28.33, 1024, 238419, 99.32, 6800277.57),
    "llama2-70b-1024": (1024, 0.95, 227.58, 28.83, 2048, 119210, 99.39, 3457670.27),
    "llama3-405b-64": (64, 9.3, 127.75, 24.46, 16, 15258790, 96.32, 387465533.9),
    "deepseek-v3-128": (128, 7.7, 134.41, 74.5, 960, 254314, 98.96, 19144461.2),
}


def _table5(gpus, save, init, step, gbs):
    n = num_steps(1e12, gbs, 4096)
    return e2e_time(step, num_steps=n, num_gpus=gpus, gpus_per_node=8, node_failures_per_day=0.005,
                    mttr_s=MTTR_3_6_1, checkpoint_save_s=save, init_s=init, checkpoint_interval_steps=10)


# ====================================================================== paper Table 5


@pytest.mark.parametrize("column", list(TABLE5))
def test_table5_reproduced_from_its_inputs(column):
    gpus, save, init, step, gbs, n_paper, ettr_pct, total_paper = TABLE5[column]
    r = _table5(gpus, save, init, step, gbs)
    assert r.num_steps == n_paper  # 10^12 tokens / (B_g · 4096), rounded up
    assert abs(r.ettr * 100 - ettr_pct) <= 0.05
    assert r.total_time_s == pytest.approx(total_paper, rel=0.005)
    assert not r.diverged


def test_table5_needs_half_an_interval_lost_not_a_whole_one():
    """The variant check behind the documented choice: losing a whole interval per failure
    misses the 1024-GPU column by more than 0.05 percentage points."""
    gpus, save, init, step, gbs, _, ettr_pct, _ = TABLE5["llama2-70b-1024"]
    whole = e2e_time(step, num_steps=num_steps(1e12, gbs, 4096), num_gpus=gpus, mttr_s=MTTR_3_6_1,
                     checkpoint_save_s=save, init_s=init, checkpoint_interval_steps=10, lost_interval_fraction=1.0)
    assert abs(whole.ettr * 100 - ettr_pct) > 0.05


def test_table5_ettr_rises_with_scale_but_ever_more_slowly():
    """Paper §5.2: LLaMA2-70B's ETTR grows from 128 to 1024 GPUs, the gain shrinking."""
    e = [_table5(*TABLE5[f"llama2-70b-{g}"][:5]).ettr for g in (128, 256, 512, 1024)]
    gains = np.diff(e)
    assert np.all(gains > 0)
    assert np.all(np.diff(gains) < 0)


def test_startup_constants_fit_table5_init_times():
    for gpus, _, init, *_ in TABLE5.values():
        assert E.STARTUP_S + E.STARTUP_PER_NODE_S * gpus / 8 == pytest.approx(init, abs=0.05)


# ====================================================================== closed form, divergence


def test_fixed_point_closed_form_matches_iteration():
    kw = dict(num_steps=200_000, num_gpus=4096, mttr_s=600.0, checkpoint_save_s=20.0, init_s=300.0,
              checkpoint_interval_steps=50, node_failures_per_day=0.01)
    step = 12.0
    r = e2e_time(step, **kw)
    t_eff = 200_000 * step
    total = t_eff
    for _ in range(500):  # T_total = T_eff + T_init + N_fail(T_total)·(MTTR + I·T_step/2) + (N/I)·T_save
        n_fail = 512 * 0.01 * total / 86400
        total = t_eff + 300 + n_fail * (600 + 0.5 * 50 * step) + 200_000 / 50 * 20
    assert r.total_time_s == pytest.approx(total, rel=1e-9)
    assert r.failures == pytest.approx(512 * 0.01 * total / 86400, rel=1e-9)
    assert r.interruption_time_s == pytest.approx(r.init_s + r.recovery_time_s + r.checkpoint_time_s, rel=1e-9)
    assert r.gpu_hours == pytest.approx(total * 4096 / 3600)
    assert r.total_days == pytest.approx(total / 86400)


def test_diverges_to_infinite_time_and_zero_ettr_when_failures_outpace_progress():
    # 1000 nodes failing 10 times a day each: a failure every 8.6 s, MTTR 230 s
    r = e2e_time(10.0, num_steps=1000, num_gpus=8000, node_failures_per_day=10.0, mttr_s=230.2,
                 checkpoint_save_s=1.0, init_s=100.0, checkpoint_interval_steps=5)
    assert r.diverged and r.total_time_s == math.inf and r.ettr == 0.0
    assert r.failures == math.inf
    # one row diverging does not disturb its neighbours
    rs = e2e_time(np.array([10.0, 10.0]), num_steps=1000, num_gpus=np.array([8000, 8]),
                  node_failures_per_day=10.0, mttr_s=230.2, checkpoint_save_s=1.0, init_s=100.0,
                  checkpoint_interval_steps=5)
    assert rs.diverged.tolist() == [True, False]
    assert 0 < rs.ettr[1] < 1 and np.isfinite(rs.total_time_s[1])


def test_no_failures_means_only_init_and_saves_and_the_longest_interval():
    r = e2e_time(2.0, num_steps=1000, num_gpus=64, node_failures_per_day=0.0, mttr_s=230.2,
                 checkpoint_save_s=5.0, init_s=100.0)
    assert r.optimal_interval_steps == 1000 and r.failures == 0.0
    assert r.total_time_s == pytest.approx(2000 + 100 + 5)


def test_free_checkpoints_are_taken_every_step():
    r = e2e_time(2.0, num_steps=1000, num_gpus=64, mttr_s=230.2, checkpoint_save_s=0.0, init_s=0.0)
    assert r.optimal_interval_steps == 1


@pytest.mark.parametrize("kw, fragment", [
    ({"node_failures_per_day": -0.1}, "failure rate"),
    ({"mttr_s": -1.0}, "MTTR"),
    ({"checkpoint_save_s": -1.0}, "checkpoint save time"),
    ({"num_steps": 0}, "number of steps"),
    ({"checkpoint_interval_steps": -3}, "checkpoint interval"),
])
def test_bad_model_inputs_raise_config_errors(kw, fragment):
    base = dict(num_steps=100, num_gpus=8, mttr_s=230.2, checkpoint_save_s=1.0, init_s=10.0)
    with pytest.raises(E.ConfigError, match=fragment):
        e2e_time(1.0, **{**base, **kw})


def test_num_steps_rounds_up_but_not_exact_multiples():
    assert num_steps(1e12, 256, 4096) == 953675
    assert num_steps(2**20 * 10, 256, 4096) == 10
    assert num_steps(2**20 * 10 + 1, 256, 4096) == 11
    with pytest.raises(E.ConfigError, match="tokens"):
        num_steps(0, 256, 4096)


# ====================================================================== optimal interval [44]


def _total_numeric(interval, step, n, nodes, lam, mttr, save, init, frac=0.5):
    """T_total by root-finding the fixed point of [38]/[39] (independent of the closed form)."""
    from scipy.optimize import brentq

    t_eff = n * step

    def g(t):
        return t - (t_eff + init + nodes * lam * t / 86400 * (mttr + frac * interval * step) + n / interval * save)
    return brentq(g, t_eff, 1e3 * (t_eff + init + n * save + 1.0), xtol=1e-9, rtol=1e-14)


CASES = [  # step, N_step, nodes, λ, MTTR, T_save, T_init
    (27.83, 953675, 16, 0.005, MTTR_3_6_1, 4.19, 134.41),
    (24.46, 15258790, 8, 0.005, MTTR_3_6_1, 9.3, 127.75),
    (5.0, 40000, 2048, 0.0038, 600.0, 30.0, 300.0),
    (1.2, 300000, 512, 0.02, 230.2, 2.0, 200.0),
    (60.0, 5000, 1024, 0.05, 120.0, 120.0, 50.0),
]


@pytest.mark.parametrize("case", CASES)
def test_optimal_interval_is_the_numeric_minimum(case):
    from scipy.optimize import minimize_scalar

    step, n, nodes, lam, mttr, save, init = case
    opt = int(optimal_interval_steps(step, num_steps=n, num_nodes=nodes, node_failures_per_day=lam, mttr_s=mttr,
                                     checkpoint_save_s=save, init_s=init))
    upper = 0.999 * (1 - nodes * lam / 86400 * mttr) / (nodes * lam / 86400 * 0.5 * step)  # divergence bound
    cont = minimize_scalar(lambda i: _total_numeric(i, *case), bounds=(1.0, min(upper, n)), method="bounded",
                           options={"xatol": 1e-6}).x
    best = min((max(1, math.floor(cont)), math.ceil(cont)), key=lambda i: _total_numeric(i, *case))
    assert opt == best
    # and no neighbour does better
    for i in (opt - 1, opt + 1):
        if i >= 1:
            assert _total_numeric(opt, *case) <= _total_numeric(i, *case)


def test_optimal_interval_matches_brute_force_over_every_integer():
    step, n, nodes, lam, mttr, save, init = 3.0, 20000, 256, 0.01, 230.2, 8.0, 100.0
    r = e2e_time(np.full(n, step), num_steps=n, num_gpus=nodes * 8, node_failures_per_day=lam, mttr_s=mttr,
                 checkpoint_save_s=save, init_s=init, checkpoint_interval_steps=np.arange(1, n + 1))
    assert int(r.optimal_interval_steps[0]) == int(np.argmin(r.total_time_s)) + 1
    assert int(np.argmax(r.ettr)) + 1 == int(r.optimal_interval_steps[0])


@pytest.mark.parametrize("column", ["llama2-70b-128", "llama2-70b-1024", "llama3-405b-64", "deepseek-v3-128"])
def test_optimal_interval_agrees_with_youngs_formula_eq44_at_table5_scale(column):
    gpus, save, init, step, gbs, *_ = TABLE5[column]
    n = num_steps(1e12, gbs, 4096)
    r = e2e_time(step, num_steps=n, num_gpus=gpus, mttr_s=MTTR_3_6_1, checkpoint_save_s=save, init_s=init)
    young = young_interval_steps(step, num_steps=n, failures=gpus / 8 * 0.005 * n * step / 86400,
                                 checkpoint_save_s=save)
    assert abs(r.optimal_interval_steps - young) <= max(1.0, 0.02 * young)
    assert r.ettr > _table5(gpus, save, init, step, gbs).ettr  # better than the paper's I = 10


# ====================================================================== §5.4 trends


BASE = dict(num_steps=500_000, num_gpus=256, node_failures_per_day=0.01, mttr_s=230.2, checkpoint_save_s=4.0,
            init_s=150.0, checkpoint_interval_steps=40)


def test_ettr_first_rises_then_falls_with_the_interval():
    intervals = np.arange(1, 400)
    r = e2e_time(np.full(intervals.shape, 10.0), **{**BASE, "checkpoint_interval_steps": intervals})
    peak = int(np.argmax(r.ettr))
    assert 0 < peak < len(intervals) - 1
    assert np.all(np.diff(r.ettr[: peak + 1]) > 0)
    assert np.all(np.diff(r.ettr[peak:]) < 0)
    assert intervals[peak] == r.optimal_interval_steps[0]


@pytest.mark.parametrize("key, values", [
    ("num_gpus", np.array([8, 64, 480, 1920])),  # 1 → 240 nodes
    ("node_failures_per_day", np.array([0.0025, 0.005, 0.01, 0.015])),
    ("mttr_s", np.array([18.0, 60.0, 120.0, 307.0])),
    ("checkpoint_save_s", np.array([2.0, 10.0, 30.0, 60.0])),
])
def test_ettr_falls_as_the_factor_grows(key, values):
    r = e2e_time(np.full(values.shape, 10.0), **{**BASE, key: values})
    assert np.all(np.diff(r.ettr) < 0)
    assert np.all(np.diff(r.total_time_s) > 0)


# ====================================================================== properties

_inputs = st.fixed_dictionaries({
    "step": st.floats(1e-3, 1e3), "n": st.integers(1, 10**8), "gpus": st.integers(1, 100_000),
    "gpn": st.sampled_from([1, 4, 8, 72]), "lam": st.floats(0.0, 0.1), "mttr": st.floats(0.0, 3600.0),
    "save": st.floats(0.0, 600.0), "init": st.floats(0.0, 3600.0), "interval": st.integers(0, 10_000),
    "frac": st.floats(0.0, 1.0),
})


def _call(x, **over):
    return e2e_time(x["step"], num_steps=x["n"], num_gpus=x["gpus"], gpus_per_node=x["gpn"],
                    node_failures_per_day=x["lam"], mttr_s=x["mttr"], checkpoint_save_s=x["save"], init_s=x["init"],
                    checkpoint_interval_steps=x["interval"], lost_interval_fraction=x["frac"], **over)


@given(_inputs)
def test_ettr_is_in_0_1_and_total_never_below_effective_time(x):
    r = _call(x)
    if r.diverged:
        assert r.ettr == 0.0 and r.total_time_s == math.inf
    else:
        assert 0.0 < r.ettr <= 1.0
        assert r.total_time_s >= r.effective_time_s
        assert r.interruption_time_s >= 0 and r.failures >= 0
    assert 1 <= r.optimal_interval_steps <= max(r.num_steps, 1)
    assert r.checkpoint_interval_steps == (min(x["interval"], x["n"]) or r.optimal_interval_steps)


@given(_inputs)
def test_optimal_interval_is_never_worse_than_a_given_one(x):
    chosen, best = _call(x), _call({**x, "interval": 0})
    assert best.total_time_s <= chosen.total_time_s * (1 + 1e-12) or chosen.diverged


@given(st.lists(_inputs, min_size=1, max_size=8))
def test_vectorised_equals_scalar(rows):
    arr = {k: np.array([r[k] for r in rows]) for k in rows[0]}
    vec = _call(arr)
    for i, x in enumerate(rows):
        one = _call(x)
        for name, value in one.to_dict().items():
            got = np.asarray(getattr(vec, name))[i]
            if isinstance(value, float) and math.isfinite(value):
                assert got == pytest.approx(value, rel=1e-12, abs=1e-300), name
            else:
                assert got == value, name


def test_a_million_candidates_at_once():
    """The tuner's case: one call over a million step times (speed: benchmarks/e2e_benchmark.py)."""
    steps = np.sort(np.random.default_rng(0).uniform(5.0, 50.0, 1_000_000))
    r = e2e_time(steps, **{**BASE, "checkpoint_interval_steps": 0})
    assert r.total_time_s.shape == (1_000_000,) and np.all(r.ettr > 0)
    assert np.all(np.diff(r.total_time_s) >= 0)  # a slower step never finishes sooner
    for i in (0, 123_456, 999_999):
        one = e2e_time(float(steps[i]), **{**BASE, "checkpoint_interval_steps": 0})
        assert r.total_time_s[i] == pytest.approx(one.total_time_s, rel=1e-12)


# ====================================================================== jobs


JOB = {
    "name": "l70",
    "model": {"name": "llama2-70b"},
    "hardware": {"name": "paper-a", "num_gpus": 128},
    "parallel": {"tp": 8, "pp": 8, "micro_batch_size": 1, "global_batch_size": 256, "sequence_length": 4096},
    "training": {"tokens": 1e12},
}
LLAMA2_70B_PARAMS = 68.98e9  # published parameter count (68,976,648,192)


def test_e2e_for_job_predicts_the_step_time_and_applies_the_model(mofa_predictor):
    job = mofa_predictor.job({**JOB, "fault": {"checkpoint_save_s": 4.19, "init_s": 134.41,
                                               "checkpoint_interval_steps": 10}})
    step = mofa_predictor.predict(job)[0].step_time_s
    r = e2e_for_job(job, mofa_predictor)
    assert r.step_time_s == step and r.num_steps == 953675 and r.num_nodes == 16
    assert r.mttr_s == pytest.approx(230.2)
    assert r.ettr == pytest.approx(e2e_time(step, num_steps=953675, num_gpus=128, mttr_s=230.2,
                                            checkpoint_save_s=4.19, init_s=134.41,
                                            checkpoint_interval_steps=10).ettr)


def test_derived_save_and_init_times(mofa_predictor):
    ckpt = LLAMA2_70B_PARAMS * 14  # bf16 weights + fp32 master + Adam m, v
    sync = E.e2e_inputs(mofa_predictor.job(JOB), mofa_predictor.registry)
    assert sync.checkpoint_bytes == pytest.approx(ckpt, rel=1e-3)
    assert sync.checkpoint_save_s == pytest.approx(ckpt / (16 * 2e9), rel=1e-3)  # 16 nodes × 2 GB/s
    assert sync.init_s == pytest.approx(121.09 + 0.832 * 16 + ckpt / (16 * 2e9), rel=1e-3)
    asy = E.e2e_inputs(mofa_predictor.job({**JOB, "fault": {"async_checkpoint": True}}), mofa_predictor.registry)
    assert asy.checkpoint_save_s == pytest.approx(ckpt / 128 / 32e9, rel=1e-3)  # per-GPU shard over D2H
    assert asy.checkpoint_save_source == "derived-async"


def test_job_policy_options_are_read_into_the_policy(mofa_predictor):
    job = mofa_predictor.job({**JOB, "fault": {"policy": "job-restart", "options": {"restart_s": 900}}})
    assert E.e2e_inputs(job, mofa_predictor.registry).mttr_s == 900.0
    # bad policy options fail when the job is read, naming the section
    with pytest.raises(E.ConfigError, match="fault.options.*sum to 1"):
        mofa_predictor.job({**JOB, "fault": {"options": {"pod_probability": 0.9}}})


def test_job_without_tokens_is_a_config_error(mofa_predictor):
    job = mofa_predictor.job({k: v for k, v in JOB.items() if k != "training"})
    with pytest.raises(E.ConfigError, match="training.tokens"):
        e2e_for_job(job, mofa_predictor, step_time_s=10.0)


# ====================================================================== CLI


@pytest.fixture
def run(monkeypatch):
    monkeypatch.delenv("MOFA_DISABLED_PLUGINS", raising=False)
    runner = CliRunner()
    return lambda *args: runner.invoke(cli, ["e2e", *args], catch_exceptions=False)


FLAGS = ["--model", "llama2-70b", "--hardware", "paper-a", "--gpus", "128", "--tp", "8", "--pp", "8",
         "--gbs", "256", "--seq", "4096"]
TABLE5_FLAGS = [*FLAGS, "--tokens", "1e12", "--step-s", "27.83", "--save-s", "4.19", "--init-s", "134.41",
                "--interval", "10", "--failure-rate", "0.005"]


def assert_one_line_error(result, *fragments):
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and "Traceback" not in result.output
    for f in fragments:
        assert f in lines[0], lines[0]


def test_cli_reproduces_table5_first_column(run):
    r = run(*TABLE5_FLAGS, "--format", "json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert abs(out["ettr"] * 100 - 98.49) <= 0.05
    assert out["total_time_s"] == pytest.approx(26947190.75, rel=0.005)
    assert out["num_steps"] == 953675 and out["policy"] == "three-level"


def test_cli_table_shows_the_headline_numbers(run):
    r = run(*TABLE5_FLAGS)
    assert r.exit_code == 0, r.output
    for word in ("ETTR", "98.48", "953,675", "expected failures", "MTTR", "230.2", "optimal interval", "GPU-hours",
                 "total time"):
        assert word in r.output, word


def test_cli_job_file_with_fault_section(run, tmp_path):
    p = tmp_path / "job.toml"
    p.write_text("""
[model]
name = "llama2-70b"
[hardware]
name = "paper-a"
num_gpus = 128
[parallel]
tp = 8
pp = 8
global_batch_size = 256
sequence_length = 4096
[training]
tokens = 1e12
[fault]
policy = "job-restart"
checkpoint_save_s = 4.19
init_s = 134.41
options = { restart_s = 307 }
""")
    r = run(str(p), "--step-s", "27.83", "--format", "json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["mttr_s"] == 307.0 and out["checkpoint_interval_steps"] == out["optimal_interval_steps"]
    # --tokens overrides the file's [training] tokens
    r2 = json.loads(run(str(p), "--step-s", "27.83", "--tokens", "5e11", "--format", "json").output)
    assert r2["num_steps"] == num_steps(5e11, 256, 4096)


def test_cli_sweep_failure_rate_json(run):
    r = run(*TABLE5_FLAGS, "--sweep", "failure_rate=0.0025,0.005,0.01,0.015", "--format", "json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)["rows"]
    assert [row["failure_rate"] for row in rows] == [0.0025, 0.005, 0.01, 0.015]
    assert np.all(np.diff([row["ettr"] for row in rows]) < 0)


def test_cli_sweep_nodes_table_and_plot(run, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "ettr.png"
    r = run(*TABLE5_FLAGS, "--sweep", "nodes=8,16,64,240", "--plot", str(png))
    assert r.exit_code == 0, r.output
    assert "nodes" in r.output and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_plot_without_matplotlib_is_one_line(run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    r = run(*TABLE5_FLAGS, "--sweep", "interval=5,10", "--plot", str(tmp_path / "x.png"))
    assert_one_line_error(r, "matplotlib", "mofa[plot]")


def test_cli_diverged_run_is_reported_not_negative(run):
    r = run(*TABLE5_FLAGS[:-1], "100", "--format", "json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["diverged"] is True and out["ettr"] == 0.0 and out["total_time_s"] is None


@pytest.mark.parametrize("args, fragments", [
    (["--tokens", "1e12", "--failure-rate", "-0.1"], ["--failure-rate", "≥ 0"]),
    (["--tokens", "1e12", "--interval", "0"], ["--interval", "≥ 1"]),
    (["--tokens", "0"], ["--tokens", "> 0"]),
    ([], ["training.tokens", "--tokens"]),
    (["--tokens", "1e12", "--fault-option", "pod_probability=0.7"], ["pod_probability", "sum to 1"]),
    (["--tokens", "1e12", "--policy", "in-memory"], ["fault.policy", "in-memory"]),
    (["--tokens", "1e12", "--save-s", "-2"], ["--save-s"]),
    (["--tokens", "1e12", "--sweep", "speed=1,2"], ["--sweep", "interval, failure_rate, nodes"]),
    (["--tokens", "1e12", "--sweep", "interval=0,10"], ["--sweep interval", "≥ 1"]),
    (["--tokens", "1e12", "--sweep", "nodes=1.5"], ["--sweep nodes", "integer"]),
    (["--tokens", "1e12", "--plot", "x.png"], ["--plot", "--sweep"]),
    (["--tokens", "1e12", "--step-s", "0"], ["--step-s"]),
])
def test_cli_bad_input_is_one_line_and_exit_2(run, args, fragments):
    assert_one_line_error(run(*FLAGS, *args), *fragments)


def test_cli_job_file_probabilities_not_summing_to_one(run, tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('[model]\nname = "llama2-70b"\n[hardware]\nname = "paper-a"\nnum_gpus = 128\n'
                 '[parallel]\ntp = 8\npp = 8\nglobal_batch_size = 256\nsequence_length = 4096\n'
                 '[training]\ntokens = 1e12\n[fault.options]\nprocess_probability = 0.5\n')
    assert_one_line_error(run(str(p), "--step-s", "10"), "bad.toml: fault.options", "sum to 1")


def test_llama3_example_job_uses_metas_failure_rate(mofa_predictor):
    """examples/llama3-405b-e2e.toml (docs/fault-tolerance.md): 419 unexpected interruptions
    in 54 days on 2,048 nodes; at a 6.71 s step (400 TFLOPS/GPU) the three-level ETTR is ~96 %."""
    from pathlib import Path

    job = mofa_predictor.load_job(Path(__file__).resolve().parents[1] / "examples" / "llama3-405b-e2e.toml")
    inputs = E.e2e_inputs(job, mofa_predictor.registry)
    assert inputs.node_failures_per_day == pytest.approx(419 / (2048 * 54), rel=1e-3)
    r = e2e_time(6.71, **inputs.model_kwargs())
    assert r.num_nodes == 2048 and r.num_steps == math.ceil(15.6e12 / (2048 * 8192))
    # failures per day of wall-clock time = 2,048 · λ = 7.76 (Meta: 419 / 54)
    assert r.failures / r.total_days == pytest.approx(419 / 54, rel=1e-3)
    assert 0.95 < r.ettr < 0.97
