"""Published runs kept OUTSIDE ../shared/data and outside every fit: an honest external check.

``tests/data/external_runs.csv`` (plain schema, docs/validation.md "the plain schema") holds the
fully specified public runs of Llama 3 405B (arXiv 2407.21783 Table 4), MT-NLG 530B (arXiv
2201.11990 sec. 2.4), BLOOM 176B (BigScience model card, arXiv 2211.05100), the Megatron-Core
r0.8.0 README's weak-scaling table and DeepSeek-V3's pre-training (arXiv 2412.19437: DualPipe on
2,048 H800s, its step from the GPU-hours per trillion tokens); each row cites its paper/README and table, and its ``notes``
say which values the source does not state (inferred). Models the zoo lacks (the README's GPT
sizes) are in ``tests/data/external_models`` (read through MOFA_MODEL_PATH, as a user's own would be);
BLOOM 176B is a zoo model.

The MAPE bound is a loose ratchet, NOT a target: no profile may be fitted to these rows. Today
(2026-11-27, shipped profiles, after dp_overlap's Megatron-Core buckets) 16 rows give MAPE 13.9 %,
max 38.7 % (15.3 % / 59.5 % before)
(``benchmarks/external_runs_report.py`` prints the per-row table); lower the bounds when a
physical fix brings the numbers down. 2026-11-29: 17 rows with DeepSeek-V3 (−26 %: see
docs/validation.md). Cost: one `mofa validate` of 17 rows (~1 s).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from click.testing import CliRunner

import mofa_framework.cli as mofa_cli

DATA = Path(__file__).parent / "data"
CSV = DATA / "external_runs.csv"
MODELS = DATA / "external_models"
MAPE_BOUND = 0.16  # today 0.139 + margin
MAX_BOUND = 0.45  # today 0.387 + margin


def _validate() -> dict:
    mofa_cli._builtin_commands()
    res = CliRunner().invoke(mofa_cli.cli, ["validate", str(CSV), "--format", "json"],
                             env={"MOFA_MODEL_PATH": str(MODELS)})
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _csv_rows() -> list[dict]:
    with CSV.open(newline="") as f:
        return list(csv.DictReader(f))


def test_every_external_row_cites_its_source_and_says_what_is_inferred():
    rows = _csv_rows()
    assert len(rows) == 17 and len({r["row_id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["reference"].strip() and "Inferred" in r["notes"], r["row_id"]
        assert (r["step_time_s"] or r["model_tflops_per_gpu"]), r["row_id"]


def test_external_runs_are_all_predicted_within_the_ratchet():
    out = _validate()
    predicted = {r["row_id"] for r in out["rows"]}
    assert not out["skipped"], out["skipped"]
    assert predicted == {r["row_id"] for r in _csv_rows()}
    errors = [abs(r["predicted_s"] / r["measured_s"] - 1) for r in out["rows"]]
    mape = sum(errors) / len(errors)
    assert mape <= MAPE_BOUND, f"external MAPE {mape:.3f} > {MAPE_BOUND} (a regression on unseen runs)"
    assert max(errors) <= MAX_BOUND, f"external max error {max(errors):.3f} > {MAX_BOUND}"


# ---------------------------------------------------------------------- NeMo 2.0's own tables

NEMO2_CSV = DATA / "external_nemo2.csv"
#: a loose ratchet, NOT a target (no profile may be fitted to these rows): 2026-11-29, 19 rows, MAPE
#: 9.0 %, max 23.0 % after the per-step constant was bounded and NeMo 2.0's bf16 gradient reduction and FP8
#: weights read (19.5 % / 60.8 % before; 10.9 % / 23.4 % before the FP8 weights); tightened after the GB200 rows
#: ran the CUDA graphs of NeMo's recommended configurations (7.3 % / 16.1 %)
NEMO2_MAPE_BOUND = 0.10
NEMO2_MAX_BOUND = 0.22


def test_nemo2_tables_are_predicted_as_nvidia_rows_within_the_ratchet():
    """The NeMo Framework 25.02–25.07 performance summaries (docs.nvidia.com; B200, GB200, H100, FP8),
    read by the NVIDIA-schema reader as NVIDIA's own tables are: the step time from tokens/s per GPU,
    the recipe's features, bf16 gradient reduction (the performance scripts' FP8 runs). Every row
    cites its page and says what is inferred, and its stated GA agrees with GBS / (DP × MBS)."""
    with NEMO2_CSV.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 19 and len({r["source_id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["source"].startswith("https://docs.nvidia.com/") and "Inferred" in r["notes"], r["source_id"]
        dp = int(r["num_gpus"]) // (int(r["tp"]) * int(r["pp"]) * int(r["cp"]))
        assert int(r["gbs"]) == int(r["ga"]) * dp * int(r["mbs"]), r["source_id"]
    mofa_cli._builtin_commands()
    res = CliRunner().invoke(mofa_cli.cli, ["validate", str(NEMO2_CSV), "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert not out["skipped"] and {r["row_id"] for r in out["rows"]} == {r["source_id"] for r in rows}
    assert all(r["target"] == "tokens_per_sec_per_gpu" for r in out["rows"])
    errors = [abs(r["predicted_s"] / r["measured_s"] - 1) for r in out["rows"]]
    mape = sum(errors) / len(errors)
    assert mape <= NEMO2_MAPE_BOUND, f"NeMo 2.0 external MAPE {mape:.3f} > {NEMO2_MAPE_BOUND}"
    assert max(errors) <= NEMO2_MAX_BOUND, f"NeMo 2.0 external max error {max(errors):.3f} > {NEMO2_MAX_BOUND}"


def test_the_documented_external_tables_are_current():
    """docs/validation.md's external tables are what benchmarks/external_runs_report.py prints with the
    shipped profiles (regenerate with --write after a refit). Run as its own process: the script puts
    the README's GPT sizes on MOFA_MODEL_PATH, which a registry loaded earlier in this process would miss
    and which must not leak into other tests."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "external_runs_report.py"
    res = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
