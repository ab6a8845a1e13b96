"""`mofa profile` (plugins/profiler.py): the same code that profiles GPUs, run on the CPU with a
tiny sweep; the written profile must load and predict.

PyTorch is not in the `test` extra (a pinned ``torch`` there would pull the multi-GB CUDA build on
any machine without a local CPU wheel): the test setup installs ``torch==2.13.0`` (a CPU build
from a local file here, see .ci/run). Without it these tests FAIL and say how to install it.
"""

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from mofa_framework.cli import _builtin_commands, assemble

try:
    import torch
except ImportError:  # pragma: no cover - the message is the point
    torch = None


def need_torch():
    if torch is None:
        pytest.fail("PyTorch is missing: `pip install torch==2.13.0` (the CPU build the test setup uses; "
                    "`pip install 'mofa[profile]'` for your GPUs' build)")


@pytest.fixture
def cli():
    _builtin_commands()
    return assemble()


def test_gemm_shapes_by_hand(mofa_predictor):
    """Llama 3 8B (h 4096, 32 heads of 128, 8 KV heads, FFN 14336, SwiGLU) at TP 8, 4096 tokens:
    QKV n = (32·128 + 2·8·128)/8 = 768, k = 4096; output n = 4096, k = 32·128/8 = 512; MLP in
    n = 2·14336/8 = 3584, k = 4096; MLP out n = 4096, k = 14336/8 = 1792; each with its data-
    gradient (m, k, n) and weight-gradient (n, k, m) GEMMs."""
    from mofa_plugins.profiler import gemm_shapes

    shapes = set(gemm_shapes([mofa_predictor.registry.model("llama3-8b")], (8,), (4096,)))
    for fwd in ((4096, 768, 4096), (4096, 4096, 512), (4096, 3584, 4096), (4096, 4096, 1792)):
        m, n, k = fwd
        assert {(m, n, k), (m, k, n), (n, k, m)} <= shapes
    assert len(shapes) == 4 * 3 - 2  # (4096, 4096, 4096) is both QKV's and MLP-in's data gradient... once


def test_profile_quick_on_cpu_writes_a_profile_that_loads_and_predicts(cli, tmp_path):
    need_torch()
    out = tmp_path / "hw" / "my-cpu.toml"
    out.parent.mkdir()
    r = CliRunner().invoke(cli, ["profile", "--base", "h100-sxm5-80gb", "--name", "my-cpu", "--out", str(out),
                                 "--quick", "--iters", "2", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert "GEMMs" in r.output and str(out) in r.output
    import json
    import tomllib

    from mofa_framework.config import structure_file
    from mofa_framework.types import HardwareProfile

    hw = structure_file(tomllib.loads(out.read_text()), HardwareProfile, str(out))
    assert hw.name == "my-cpu" and hw.gemm_profile and all(p.dtype == "bf16" for p in hw.gemm_profile)
    assert {p.direction for p in hw.attention_profile} == {"fwd", "bwd"} and all(p.causal for p in hw.attention_profile)
    assert 0 < hw.efficiency.memory_efficiency <= 1
    # the host's CPU AdamW, measured here (a CPU has no host link: h2d / d2h stay the base's)
    assert "CPU AdamW" in r.output and hw.host.cpu_optimizer_params_per_s != 2.0e9
    assert 1e5 < hw.host.cpu_optimizer_params_per_s < 1e12
    assert hw.interconnect.h2d_bandwidth_gbps == 51.0 and "no host link on cpu" in hw.notes
    args = ["predict", "--model", "llama3-8b", "--gpus", "8", "--tp", "8", "--gbs", "8", "--seq", "1024",
            "--format", "json"]
    mine = CliRunner().invoke(cli, [*args, "--hardware", "my-cpu"], env={"MOFA_HARDWARE_PATH": str(out.parent)})
    h100 = CliRunner().invoke(cli, [*args, "--hardware", "h100-sxm5-80gb"])
    assert mine.exit_code == 0 and h100.exit_code == 0, mine.output
    step = lambda r: json.loads(r.output)["step_time_s"]  # noqa: E731
    # a CPU's measured GEMMs price the job far slower than the H100's tables
    assert step(mine) > 10 * step(h100)


def test_profile_collectives_with_two_gloo_ranks(tmp_path):
    need_torch()
    out = tmp_path / "two.toml"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        "-m", "mofa_framework.cli", "profile", "--base", "h100-sxm5-80gb", "--name", "my-two",
                        "--out", str(out), "--quick", "--iters", "2", "--device", "cpu"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    import tomllib

    from mofa_framework.config import structure_file
    from mofa_framework.types import HardwareProfile

    hw = structure_file(tomllib.loads(out.read_text()), HardwareProfile, str(out))
    kinds = {p.kind for p in hw.collective_profile}
    assert {"all_reduce", "all_gather", "p2p"} <= kinds
    assert all(p.scope == "scaleup" and p.busbw_gbps > 0 for p in hw.collective_profile)


@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
def test_profile_on_the_gpu(cli, tmp_path):
    out = tmp_path / "gpu.toml"
    r = CliRunner().invoke(cli, ["profile", "--base", "h100-sxm5-80gb", "--name", "my-gpu", "--out", str(out),
                                 "--quick", "--iters", "3"])
    assert r.exit_code == 0, r.output
    assert "cuda" in r.output


def test_profile_without_torch_is_one_line(cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    r = CliRunner().invoke(cli, ["profile", "--base", "h100-sxm5-80gb", "--name", "x", "--out", str(tmp_path / "x.toml")])
    assert r.exit_code == 2
    assert "pip install 'mofa[profile]'" in r.output and "Traceback" not in r.output


def test_a_noisy_backward_timing_cannot_read_above_the_forward(monkeypatch):
    """The attention backward is timed as (forward + backward) − forward; when noise makes the
    difference ≤ 0 it is bounded by the forward time (a fused backward is never shorter), so the
    point reads 2.5 × the forward's TFLOPS, not the 1 ns that wrote 41,943 TFLOPS on a busy host."""
    need_torch()
    import torch

    from mofa_plugins import profiler

    times = iter([1.0, 0.5])  # forward 1 s, then forward + backward "0.5 s"
    monkeypatch.setattr(profiler, "_time", lambda fn, sync, iters: next(times))
    fwd, bwd = profiler.measure_attention(torch, torch.device("cpu"), (8,), (16,), iters=1, batch_heads=1)
    # forward FLOPs 4 · 1 · 16² · 8 / 2 = 4,096 in 1 s; backward 2.5 × 4,096 in the bound of 1 s
    assert fwd["tflops"] == pytest.approx(4096e-12, rel=1e-3) and bwd["tflops"] == pytest.approx(2.5 * 4096e-12, rel=1e-3)


def test_memory_fields_keep_a_slow_device_loadable():
    """A device copy rate against the base's datasheet: 2,000 of 3,350 GB/s is memory_efficiency 0.59701;
    above the datasheet it is 1; under 1 % (a CPU's 3.7 GB/s against an H100's 3,350, 0.0011) a profile
    could not load it (efficiency ≥ 0.01), so the measured rate becomes the bandwidth, reached in full."""
    from mofa_plugins.profiler import memory_fields, set_hbm_bandwidth

    assert memory_fields(2000.0, 3350.0) == (0.59701, None)
    assert memory_fields(4000.0, 3350.0) == (1.0, None)
    assert memory_fields(3.7, 3350.0) == (1.0, 3.7)
    assert memory_fields(33.5, 3350.0) == (0.01, None)
    text = "[memory]\nhbm_gib = 80.0\nhbm_bandwidth_gbps = 3350.0\n"
    assert set_hbm_bandwidth(text, 3.7) == "[memory]\nhbm_gib = 80.0\nhbm_bandwidth_gbps = 3.7\n"


def test_host_link_is_written_under_interconnect():
    """`set_host_link` replaces the two lines where the profile has them and adds them under
    [interconnect] where it does not (a profile on the 32 GB/s defaults); no [interconnect]: an error."""
    from mofa_plugins.profiler import set_host_link

    have = "[interconnect]\nscaleup_domain_gpus = 8\nh2d_bandwidth_gbps = 63.0\nd2h_bandwidth_gbps = 63.0\n"
    assert set_host_link(have, 51.0, 52.004) == ("[interconnect]\nscaleup_domain_gpus = 8\nh2d_bandwidth_gbps = 51.0\n"
                                                 "d2h_bandwidth_gbps = 52.0\n")
    bare = "[interconnect]\nscaleup_domain_gpus = 8\n"
    assert set_host_link(bare, 201.0, 193.0) == ("[interconnect]\nh2d_bandwidth_gbps = 201.0\nd2h_bandwidth_gbps = 193.0\n"
                                                 "scaleup_domain_gpus = 8\n")
    with pytest.raises(ValueError, match="no \\[interconnect\\]"):
        set_host_link("[memory]\nhbm_gib = 80\n", 1.0, 1.0)


def test_host_link_measurement_by_hand(monkeypatch):
    """Pinned copies of 1 GiB timed at 20 ms to the device and 25 ms back read 2³⁰ / 0.020 / 10⁹ =
    53.687 and 42.950 GB/s; a CPU device has no host link (None, the base profile's figures stay)."""
    from types import SimpleNamespace

    from mofa_plugins import profiler

    times = iter([0.020, 0.025])
    monkeypatch.setattr(profiler, "_time", lambda fn, sync, iters: next(times))
    buffers = SimpleNamespace(copy_=lambda other, non_blocking=False: None)
    fake = SimpleNamespace(empty=lambda *a, **k: buffers, float32="float32", cuda=SimpleNamespace(synchronize=None))
    h2d, d2h = profiler.measure_host_link_gbps(fake, SimpleNamespace(type="cuda"), 1 << 30, iters=3)
    assert (h2d, d2h) == (pytest.approx(53.687, abs=1e-3), pytest.approx(42.950, abs=1e-3))
    assert profiler.measure_host_link_gbps(fake, SimpleNamespace(type="cpu"), 1 << 30, iters=3) is None


def test_cpu_adam_rate_and_the_host_table_by_hand(monkeypatch):
    """2²⁰ parameters per AdamW step in 1 ms: 1.048576e9 parameters/s; `set_table_value` replaces a
    key inside its table, adds it under the header, or appends the table."""
    need_torch()
    import torch

    from mofa_plugins import profiler

    monkeypatch.setattr(profiler, "_time", lambda fn, sync, iters: 1e-3)
    assert profiler.measure_cpu_adam_params_per_s(torch, 1 << 20, iters=1) == pytest.approx(1.048576e9, rel=1e-12)
    text = "[host]\ncpu_memory_gib = 2048.0\n\n# note [x]\n[efficiency]\nmemory_efficiency = 0.9\n"
    added = profiler.set_table_value(text, "host", "cpu_optimizer_params_per_s", "7.75e+08")
    assert added.startswith("[host]\ncpu_optimizer_params_per_s = 7.75e+08\ncpu_memory_gib = 2048.0\n")
    again = profiler.set_table_value(added, "host", "cpu_optimizer_params_per_s", "1e+10")
    assert again == added.replace("7.75e+08", "1e+10")
    assert profiler.set_table_value("[memory]\nhbm_gib = 80\n", "host", "k", "3") == "[memory]\nhbm_gib = 80\n\n[host]\nk = 3\n"
