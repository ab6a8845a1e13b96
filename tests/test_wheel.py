"""A built wheel (not an editable install) carries the core, the plugins and the data, and a
third-party distribution adds a GPU and a schedule through entry points."""

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.wheel


def _run(*cmd, **kw):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOFA_")}
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True, env=env, **kw)


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", ROOT)
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", tmp / "dist",
         ROOT / "examples" / "plugins" / "mofa-example-thirdparty")
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    wheels = sorted((tmp / "dist").glob("mofa-*.whl"))
    assert wheels, "no mofa wheel built"
    # dependencies come from the package index (or pip's cache); mofa only from the wheel
    _run(py, "-m", "pip", "install", "-q", wheels[0])
    return env_dir, tmp


def test_wheel_has_everything(wheel_env):
    env_dir, tmp = wheel_env
    mofa = env_dir / "bin" / "mofa"
    # run from a directory without the source tree, so only the installed wheel is imported
    out = _run(mofa, "list-plugins", "--format", "json", cwd=tmp)
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    for name in ("roofline", "collectives", "hardware_zoo", "model_zoo", "schedule_1f1b", "schedule_interleaved"):
        assert rows[name]["status"] == "builtin", rows[name]
    where = _run(env_dir / "bin" / "python", "-c", "import mofa_framework, mofa_plugins; print(mofa_framework.__file__, mofa_plugins.__file__)", cwd=tmp)
    assert str(ROOT) not in where.stdout
    hw = json.loads(_run(mofa, "list-hardware", "--format", "json", cwd=tmp).stdout)
    assert len(hw) >= 12
    models = json.loads(_run(mofa, "list-models", "--format", "json", cwd=tmp).stdout)
    assert any(m["name"] == "llama3.1-405b" for m in models)
    pred = json.loads(_run(mofa, "predict", "--model", "llama3-70b", "--hardware", "h100-sxm5-80gb", "--gpus", "64",
                           "--tp", "8", "--pp", "2", "--gbs", "64", "--seq", "4096", "--format", "json", cwd=tmp).stdout)
    assert pred["step_time_s"] > 0
    # the cross-validation table ships in the wheel: the prediction carries its band
    assert 0 < pred["step_time_s_low"] < pred["step_time_s_high"], pred["extrapolation"]


def test_wheel_validates_the_measurements_it_ships(wheel_env):
    """`mofa validate --builtin` in the installed wheel reads the shipped measurements, with their
    reader plugins, from site-packages (no checkout, no ../shared)."""
    env_dir, tmp = wheel_env
    out = json.loads(_run(env_dir / "bin" / "mofa", "validate", "--builtin", "--format", "json", cwd=tmp).stdout)
    assert out["overall"]["rows"] > 1500 and out["overall"]["step_time"]["mape"] < 0.10
    assert {s["source"] for s in out["sources"]} >= {"megatron_selene_a100", "vtrain_single_node_a100"}
    where = _run(env_dir / "bin" / "python", "-c", "from mofa_framework.measurements import builtin_data_dir as d; "
                 "print(d(), (d() / 'microbench' / 'microbench_gemm.csv').is_file())", cwd=tmp).stdout
    assert str(ROOT) not in where and where.strip().endswith("True")


def test_third_party_distribution_adds_gpu_and_schedule(wheel_env):
    env_dir, tmp = wheel_env
    wheels = sorted((tmp / "dist").glob("mofa_example_thirdparty-*.whl"))
    _run(env_dir / "bin" / "python", "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall", wheels[0])
    mofa = env_dir / "bin" / "mofa"
    rows = {r["name"]: r for r in json.loads(_run(mofa, "list-plugins", "--format", "json", cwd=tmp).stdout)}
    assert rows["example_gpu"]["status"] == "active"
    assert rows["example_gpu"]["distribution"] == "mofa-example-thirdparty"
    assert rows["example_gpu"]["provides"] == {"hardware": ["example-h100-nvl16"]}
    assert rows["example_schedule"]["provides"] == {"schedules": ["breadth-first"]}
    pred = json.loads(_run(mofa, "predict", "--model", "gpt3-175b", "--hardware", "example-h100-nvl16", "--gpus", "64",
                           "--tp", "16", "--pp", "4", "--vpp", "2", "--gbs", "64", "--seq", "4096",
                           "--schedule", "breadth-first", "--format", "json", cwd=tmp).stdout)
    assert pred["hardware"] == "example-h100-nvl16" and pred["schedule"] == "breadth-first"
    assert pred["parallel"]["tp"] == 16  # TP 16 stays inside the 16-GPU NVLink domain
    # the installed third-party schedule gets a Perfetto trace in its own op order, with no extra code
    _run(mofa, "predict", "--model", "gpt3-175b", "--hardware", "example-h100-nvl16", "--gpus", "64", "--tp", "16",
         "--pp", "4", "--vpp", "2", "--gbs", "64", "--seq", "4096", "--schedule", "breadth-first",
         "--trace", tmp / "step.json", cwd=tmp)
    trace = json.loads((tmp / "step.json").read_text())
    assert trace["otherData"]["order"] == "schedule 'breadth-first'"
    assert trace["otherData"]["step_time_s"] == pytest.approx(pred["step_time_s"])
