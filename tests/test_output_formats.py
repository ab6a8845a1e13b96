"""Output that reads well: memory per pipeline stage in predict, tables that survive a pipe
(csv / markdown on every command that prints one, unwrapped cells), and plot paths reported
as written."""

from __future__ import annotations

import csv
import io
import json

import pytest
from click.testing import CliRunner

from mofa_framework.api import Predictor
from mofa_framework.cli import _builtin_commands, cli, markdown_table

_builtin_commands()
H100 = "h100-sxm5-80gb"
JOB = ["--model", "llama3-70b", "--hardware", H100, "--gpus", "64", "--tp", "8", "--pp", "4", "--gbs", "32",
       "--seq", "4096"]


@pytest.fixture
def run(monkeypatch):
    monkeypatch.delenv("MOFA_DISABLED_PLUGINS", raising=False)
    runner = CliRunner()
    return lambda *a: runner.invoke(cli, list(a), catch_exceptions=False)


def job(pp, **extra):
    return {"model": {"name": "llama3-70b"}, "hardware": {"name": H100, "num_gpus": 64},
            "parallel": {"tp": 8, "pp": pp, "global_batch_size": 32, "sequence_length": 4096, **extra}}


def test_memory_of_every_stage_and_the_worst_is_the_peak():
    pr = Predictor()
    four, two, one = (pr.predict(pr.job(job(p)))[0] for p in (4, 2, 1))
    assert list(four.stage_memory_gib) == ["first", "mid", "last"]
    assert list(two.stage_memory_gib) == ["first", "last"] and list(one.stage_memory_gib) == ["first"]
    for r in (four, two, one):
        assert max(r.stage_memory_gib.values()) == pytest.approx(r.peak_memory_gib, rel=1e-12)
    # 1F1B: the first stage holds p micro-batches' activations, the last one: it needs the most
    assert four.stage_memory_gib["first"] > four.stage_memory_gib["last"]
    assert four.critical_stage in ("first", "mid", "last")


def test_predict_shows_stage_memory_in_table_json_csv_and_markdown(run):
    table = run("predict", *JOB)
    assert table.exit_code == 0 and "memory per GPU by pipeline stage" in table.output
    assert "worst" in table.output and "mid" in table.output
    out = json.loads(run("predict", *JOB, "--format", "json").output)
    assert set(out["stage_memory_gib"]) == {"first", "mid", "last"}
    rows = list(csv.DictReader(io.StringIO(run("predict", *JOB, "--format", "csv").output)))
    assert len(rows) == 1 and float(rows[0]["step_time_s"]) == pytest.approx(out["step_time_s"], rel=1e-5)
    assert float(rows[0]["memory_mid_gib"]) == pytest.approx(out["stage_memory_gib"]["mid"], rel=1e-5)
    md = run("predict", *JOB, "--format", "markdown").output
    assert "| stage | GiB |" in md and "| component | time | share | from |" in md and "┃" not in md


@pytest.mark.parametrize("command", [["list-hardware"], ["list-models"], ["list-plugins"]])
def test_listings_in_csv_and_markdown(run, command):
    c = run(*command, "--format", "csv")
    assert c.exit_code == 0
    rows = list(csv.reader(io.StringIO(c.output)))
    assert rows[0][0] == "name" and len(rows) > 3 and all(len(r) == len(rows[0]) for r in rows)
    md = run(*command, "--format", "markdown")
    assert md.exit_code == 0 and md.output.startswith("| name |") and "|---|" in md.output


def test_piped_tables_do_not_fold_long_cells(run):
    """A piped `mofa tune` keeps each feature label on one line (it used to fold into
    8-character pieces), and --format markdown / csv give one row per configuration."""
    args = ["tune", "--model", "llama3-8b", "--hardware", H100, "--gpus", "64", "--gbs", "256", "--seq", "8192",
            "--top", "3", "--features", "distributed_optimizer,dp_overlap"]
    out = run(*args).output
    assert "distributed_optimizer(shard_gradients=True)" in out
    md = run(*args, "--format", "markdown").output
    lines = [ln for ln in md.splitlines() if ln.startswith("| ")]
    assert len(lines) == 4 and "distributed_optimizer" in md  # header + 3 rows
    rows = list(csv.DictReader(io.StringIO(run(*args, "--format", "csv").output)))
    assert len(rows) == 3


def test_markdown_table_escapes_cells():
    text = markdown_table([["a|b", "x\ny"]], ["h1", "h2"], title="T")
    assert text.splitlines() == ["**T**", "", "| h1 | h2 |", "|---|---|", "| a\\|b | x<br>y |"]


def test_e2e_and_validate_formats(run):
    e2e = ["e2e", *JOB, "--tokens", "1e12"]
    assert list(csv.reader(io.StringIO(run(*e2e, "--format", "csv").output)))[0] == ["quantity", "value"]
    assert run(*e2e, "--format", "markdown").output.count("| quantity | value |") == 1


def test_e2e_plot_reports_the_file_it_wrote(run, tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "sweep"  # no extension: matplotlib writes sweep.png
    r = run("e2e", *JOB, "--tokens", "1e12", "--sweep", "interval=10,100", "--plot", str(target))
    assert r.exit_code == 0, r.output
    written = tmp_path / "sweep.png"
    assert written.exists() and f"plot written to {written}" in r.output
    r = run("e2e", *JOB, "--tokens", "1e12", "--sweep", "interval=10,100", "--plot", str(tmp_path / "p.svg"),
            "--format", "json")
    assert (tmp_path / "p.svg").exists() and json.loads(r.stdout)["sweep"] == "interval"
