"""The README's example output is what `mofa predict` prints today (it goes stale after a refit or a
new cross-validation table, whose residuals draw the band)."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from mofa_framework.cli import cli

ROOT = Path(__file__).resolve().parents[1]


def test_readme_prediction_line_is_current():
    readme = (ROOT / "README.md").read_text()
    shown = re.search(r"^step [0-9.]+ s \(band [^)]*\) · [^\n]*HFU [0-9.]+% ·", readme, re.M)
    assert shown, "README lost its example's step line"
    res = CliRunner().invoke(cli, ["predict", str(ROOT / "examples" / "llama3-405b-h100.toml")],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    line = next(line for line in res.output.splitlines() if line.startswith("step "))
    assert line.startswith(shown.group(0)), (
        f"README shows {shown.group(0)!r}; `mofa predict examples/llama3-405b-h100.toml` prints {line!r}")


def test_readme_python_example_runs(monkeypatch, capsys):
    """Every ```python block of the README runs as written, from the checkout's root (a plugin
    disabled in one Predictor while its job enables it had left the old block failing)."""
    monkeypatch.chdir(ROOT)
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "README lost its Python example"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - the README's own example
    assert capsys.readouterr().out.strip()
