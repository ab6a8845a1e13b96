"""The command line: listings, versions, and one-line errors with exit status 2."""

import json
import re

import pytest
from click.testing import CliRunner

from mofa_framework import __version__
from mofa_framework.cli import _builtin_commands, cli

_builtin_commands()


@pytest.fixture
def run(monkeypatch):
    monkeypatch.delenv("MOFA_DISABLED_PLUGINS", raising=False)
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(cli, list(args), catch_exceptions=False)
    return invoke


def assert_one_line_error(result, *fragments):
    assert result.exit_code == 2, result.output
    lines = [l for l in result.output.strip().splitlines() if l.strip()]
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output and "Attribute(name=" not in result.output
    for f in fragments:
        assert f in lines[0], lines[0]


def test_version(run):
    r = run("--version")
    assert r.exit_code == 0 and __version__ in r.output


def test_list_plugins_json_lists_every_builtin_as_its_own_entry(run):
    r = run("list-plugins", "--format", "json")
    assert r.exit_code == 0
    rows = {row["name"]: row for row in json.loads(r.output)}
    for name in ("roofline", "collectives", "hardware_zoo", "model_zoo", "schedule_1f1b", "schedule_interleaved",
                 "base_constraints"):
        assert rows[name]["status"] == "builtin"
        assert rows[name]["distribution"] == "mofa"
    assert "register_hardware_profiles" in rows["hardware_zoo"]["hooks"]
    assert "h100-sxm5-80gb" in rows["hardware_zoo"]["provides"]["hardware"]


def test_list_plugins_table(run):
    r = run("list-plugins")
    assert r.exit_code == 0 and "roofline" in r.output and "builtin" in r.output


def test_list_hardware_and_models(run):
    hw = json.loads(run("list-hardware", "--format", "json").output)
    names = {h["name"] for h in hw}
    assert {"a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h800-sxm5-80gb", "h200-sxm-141gb",
            "b200-sxm-180gb", "b300-sxm", "gb200-nvl72", "gb300-nvl72", "mi300x", "paper-a", "paper-b"} <= names
    models = {m["name"]: m for m in json.loads(run("list-models", "--format", "json").output)}
    assert models["llama3.1-405b"]["params_b"] == pytest.approx(405.8, abs=0.5)
    assert models["deepseek-v3"]["active_params_b"] == pytest.approx(37.5, abs=1.0)
    assert "mixtral-8x7b" in run("list-models").output


def test_disable_plugin_flag(run):
    rows = {r["name"]: r for r in json.loads(run("--disable-plugin", "schedule_interleaved", "list-plugins",
                                                 "--format", "json").output)}
    assert rows["schedule_interleaved"]["status"] == "disabled"


FLAGS = ["--model", "llama3-70b", "--hardware", "h100-sxm5-80gb", "--gpus", "64", "--tp", "8", "--pp", "2",
         "--gbs", "64", "--seq", "4096"]


def test_predict_from_flags_json(run):
    r = run("predict", *FLAGS, "--format", "json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    for key in ("step_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "peak_memory_gib",
                "fits_in_memory", "breakdown", "memory_breakdown"):
        assert key in out
    assert sum(out["breakdown"].values()) == pytest.approx(out["step_time_s"])


def test_size_flags_take_the_job_file_names_too(run):
    """--num-gpus, --global-batch-size, --sequence-length and --micro-batch-size (the job file's keys)
    are the same flags as --gpus, --gbs, --seq and --mbs, in predict and in tune (with --top-k for --top)."""
    long = ["--model", "llama3-70b", "--hardware", "h100-sxm5-80gb", "--num-gpus", "64", "--tp", "8", "--pp", "2",
            "--global-batch-size", "64", "--sequence-length", "4096"]
    short, named = (json.loads(run("predict", *f, "--mbs", "1", "--format", "json").output) for f in (FLAGS, long))
    assert named == short
    assert json.loads(run("predict", *long, "--micro-batch-size", "1", "--format", "json").output) == short
    space = ["--model", "llama3-70b", "--hardware", "h100-sxm5-80gb", "--tp-values", "8", "--pp-values", "2",
             "--vpp-values", "1", "--cp-values", "1", "--mbs-values", "1", "--format", "json"]
    tuned = [json.loads(run("tune", *space, *f).output)["best"]
             for f in (["--gpus", "64", "--gbs", "64", "--seq", "4096", "--top", "2"],
                       ["--num-gpus", "64", "--global-batch-size", "64", "--sequence-length", "4096", "--top-k", "2"])]
    assert tuned[0] == tuned[1] and len(tuned[0]) == 2


def test_predict_table_and_jsonl(run, tmp_path):
    job = tmp_path / "j.toml"
    job.write_text('[model]\nname = "llama3-8b"\n[hardware]\nname = "h100-sxm5-80gb"\nnum_gpus = 8\n'
                   '[parallel]\ntp = 2\nglobal_batch_size = 32\nsequence_length = 4096\n')
    r = run("predict", str(job), str(job), "--format", "jsonl")
    assert r.exit_code == 0 and len(r.output.strip().splitlines()) == 2
    t = run("predict", str(job))
    assert "MFU" in t.output and "step time breakdown" in t.output


def test_predict_says_how_much_hbm_is_left(run):
    """The memory verdict gives the free GiB (HBM − peak) and calls a fit with less than a tenth of the
    HBM left tight (MoFa's memory error on published peaks is 5–12 %): Mixtral 8×22B at TP 4, PP 1,
    EP 8, offloading a quarter of its layers, peaks at 79.2 of 80 GiB."""
    loose = run("predict", "--model", "llama3-8b", "--hardware", "h100-sxm5-80gb", "--gpus", "8", "--gbs", "32",
                "--seq", "4096", "--tp", "4")
    peak = float(re.search(r"peak memory ([0-9.]+) / 80 GiB", loose.output).group(1))
    assert f"(fits, {80 - peak:.1f} GiB free)" in loose.output
    tight = run("predict", "--model", "mixtral-8x22b", "--hardware", "h100-sxm5-80gb", "--gpus", "512", "--tp", "4",
                "--pp", "1", "--ep", "8", "--etp", "2", "--mbs", "4", "--gbs", "1024", "--seq", "4096",
                "--sequence-parallel", "--feature", "fsdp:reshard_after_forward=false",
                "--feature", "activation_offload:fraction=0.25")
    assert tight.exit_code == 0, tight.output
    assert "GiB free — within the memory estimate's error" in tight.output


@pytest.mark.parametrize("args, fragments", [
    (["--tp", "3"], ["parallel", "tp"]),
    (["--tp", "8", "--gpus", "60"], ["num_gpus", "tp × pp × cp"]),
    (["--pp", "64", "--tp", "1"], ["parallel.pp", "num_layers"]),
    (["--gbs", "65"], ["global_batch_size"]),
    (["--model", "llama9-1t"], ["model.name", "list-models"]),
    (["--hardware", "h900"], ["hardware.name", "list-hardware"]),
    (["--tp", "0"], ["parallel", "tp"]),
    (["--gbs", "-4"], ["global_batch_size"]),
    (["--schedule", "nonesuch"], ["pipeline.schedule"]),
    (["--vpp", "2", "--schedule", "1f1b"], ["does not interleave"]),
    (["--feature", "no_such_feature"], ["features.no_such_feature"]),
    (["--feature", "recompute:granularity=partial"], ["features.recompute.granularity", "must be in"]),
])
def test_predict_bad_input_is_one_line_exit_2(run, args, fragments):
    flags = list(FLAGS)
    for i in range(0, len(args), 2):
        if args[i] in flags:
            flags[flags.index(args[i]) + 1] = args[i + 1]
        else:
            flags += args[i:i + 2]
    assert_one_line_error(run("predict", *flags), *fragments)


def test_malformed_toml_is_one_line(run, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[parallel\ntp = 8\n")
    assert_one_line_error(run("predict", str(bad)), "bad.toml", "malformed TOML")


def test_misspelled_key_names_its_path(run, tmp_path):
    job = tmp_path / "typo.toml"
    job.write_text('[model]\nname = "llama3-8b"\n[hardware]\nname = "h100-sxm5-80gb"\nnum_gpus = 8\n'
                   '[parallel]\ntp_size = 2\nglobal_batch_size = 32\nsequence_length = 4096\n')
    assert_one_line_error(run("predict", str(job)), "parallel", "tp_size")


def test_wrong_type_names_its_path(run, tmp_path):
    job = tmp_path / "type.toml"
    job.write_text('[model]\nname = "llama3-8b"\n[hardware]\nname = "h100-sxm5-80gb"\nnum_gpus = "eight"\n'
                   '[parallel]\nglobal_batch_size = 32\nsequence_length = 4096\n')
    assert_one_line_error(run("predict", str(job)), "hardware.num_gpus")


def test_missing_file(run):
    assert_one_line_error(run("predict", "/nonexistent/job.toml"), "no such file")


def test_strict_mode_turns_plugin_failure_into_exit_2(run, mofa_fake_distribution):
    mofa_fake_distribution("broken", "0.1", {"broken_cli": "broken_cli"}, {"broken_cli": "import nope_nope\n"})
    r = run("list-plugins", "--format", "json")
    assert r.exit_code == 0
    assert {x["name"]: x for x in json.loads(r.output)}["broken_cli"]["status"] == "failed"
    assert run("list-hardware").exit_code == 0
    r = run("--strict-plugins", "list-plugins")
    assert r.exit_code == 2 and "broken_cli" in r.output


def test_broken_plugin_warns_once_and_predict_still_works(mofa_fake_distribution):
    mofa_fake_distribution("broken", "0.1", {"broken_warn": "broken_warn"}, {"broken_warn": "import nope_nope\n"})
    r = CliRunner().invoke(cli, ["predict", *FLAGS, "--format", "json"], catch_exceptions=False)
    assert r.exit_code == 0
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "broken_warn" in warnings[0]
    assert json.loads(r.stdout)["step_time_s"] > 0


def test_no_flash_attention_flag_reproduces_the_job_file(run, tmp_path):
    """Issue 18: a flag-only run can now price the unfused attention of Megatron 2021-22 runs (Korthikanti
    et al.'s GPT 22B, TP 8, selective recompute) exactly as the job file with flash_attention = false does."""
    flags = ["--model", "gpt-22b", "--hardware", "a100-sxm4-80gb", "--gpus", "8", "--tp", "8", "--mbs", "4",
             "--gbs", "4", "--seq", "2048", "--precision", "fp16", "--feature", "recompute:granularity=selective"]
    job = tmp_path / "j.toml"
    job.write_text('[model]\nname = "gpt-22b"\n[hardware]\nname = "a100-sxm4-80gb"\nnum_gpus = 8\n'
                   '[parallel]\ntp = 8\nmicro_batch_size = 4\nglobal_batch_size = 4\nsequence_length = 2048\n'
                   'precision = "fp16"\nflash_attention = false\n[features.recompute]\ngranularity = "selective"\n')
    out = {name: json.loads(r.output) for name, r in [
        ("file", run("predict", str(job), "--format", "json")),
        ("off", run("predict", *flags, "--no-flash-attention", "--format", "json")),
        ("on", run("predict", *flags, "--flash-attention", "--format", "json")),
        ("default", run("predict", *flags, "--format", "json"))]}
    assert out["off"]["step_time_s"] == out["file"]["step_time_s"]
    assert out["off"]["peak_memory_gib"] == out["file"]["peak_memory_gib"]
    assert out["default"]["step_time_s"] == out["on"]["step_time_s"] != out["off"]["step_time_s"]
    for cmd in ("e2e", "tune"):
        assert "--no-flash-attention" in run(cmd, "--help").output
    tune = ["tune", "--model", "gpt-22b", "--hardware", "a100-sxm4-80gb", "--gpus", "8", "--gbs", "4", "--seq", "2048",
            "--precision", "fp16", "--tp-values", "8", "--pp-values", "1", "--mbs-values", "4", "--features", "recompute",
            "--top", "1", "--format", "json", "--no-progress"]
    best = {f: json.loads(run(*tune, f).output)["best"][0] for f in ("--flash-attention", "--no-flash-attention")}
    assert best["--no-flash-attention"]["step_time_s"] > best["--flash-attention"]["step_time_s"]


def test_builtin_commands_load_when_asked_for_and_help_lists_them(run):
    """The built-ins are named, not imported, until a command runs (or --help lists them): each
    name loads the command of that name."""
    from mofa_framework.commands import COMMANDS, load_command

    for name in COMMANDS:
        assert load_command(name).name == name
    listed = run("--help").output
    assert all(f"  {name} " in listed for name in COMMANDS)


def test_a_command_imports_no_other_builtin_commands_module(tmp_path):
    """`mofa tune` does not import `validate`'s, `e2e`'s or the importer's modules (start-up time)."""
    import subprocess
    import sys

    code = ("import sys; from mofa_framework.cli import main\n"
            "sys.argv = ['mofa', 'tune', '--model', 'llama3-8b', '--hardware', 'h100', '--gpus', '8', '--gbs', '8',\n"
            "            '--seq', '2048', '--tp-values', '1', '--pp-values', '1', '--format', 'json', '--no-progress']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('mofa_framework.commands.')), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["best"]
    assert out.stderr.strip().splitlines()[-1] == "['mofa_framework.commands.tune']"


def test_main_loads_the_plugins_once_unless_the_global_options_ask_for_other_ones(monkeypatch, capsys):
    """`mofa CMD` assembles the command line and runs the command with one plugin manager; with
    --disable-plugin the command gets its own, without that plugin."""
    import mofa_framework.cli as c
    from mofa_framework.manager import MofaPluginManager

    loads = []
    real = MofaPluginManager.load_entrypoints
    monkeypatch.setattr(MofaPluginManager, "load_entrypoints", lambda self, *a, **k: (loads.append(self),
                                                                                       real(self, *a, **k))[1])
    monkeypatch.delenv("MOFA_DISABLED_PLUGINS", raising=False)

    def main(*args):
        loads.clear()
        monkeypatch.setattr("sys.argv", ["mofa", *args])
        with pytest.raises(SystemExit) as exit_:
            c.main()
        assert exit_.value.code == 0
        return json.loads(capsys.readouterr().out)

    plugins = {p["name"]: p["status"] for p in main("list-plugins", "--format", "json")}
    assert len(loads) == 1 and plugins["zero_bubble"] != "disabled"
    plugins = {p["name"]: p["status"] for p in main("--disable-plugin", "zero_bubble", "list-plugins", "--format",
                                                    "json")}
    assert len(loads) == 2 and plugins["zero_bubble"] == "disabled"


def test_python_dash_m_runs_the_command_line(tmp_path):
    """`python -m mofa_framework` and `python -m mofa_framework.cli` run `mofa` (a command in its own
    module included: it must see the imported CLI's state, not the __main__ copy's)."""
    import subprocess
    import sys

    args = ["tune", "--model", "llama3-8b", "--hardware", "h100", "--gpus", "8", "--gbs", "8", "--seq", "2048",
            "--tp-values", "1", "--pp-values", "1", "--format", "json", "--no-progress"]
    for module in ("mofa_framework", "mofa_framework.cli"):
        out = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=tmp_path)
        assert out.returncode == 0 and json.loads(out.stdout)["best"], out.stderr
