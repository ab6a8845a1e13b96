"""Per-row step-time error on published runs kept outside ``../shared/data`` (an external check,
never a fit target), predicted with the shipped profiles: ``tests/data/external_runs.csv`` (plain
schema; Llama 3 405B, MT-NLG 530B, BLOOM 176B, the Megatron-Core README's weak-scaling table) and
``tests/data/external_nemo2.csv`` (NVIDIA schema, read as ``reader_nvidia`` reads NVIDIA's own
tables: the NeMo Framework 25.02–25.07 performance summaries on B200, GB200 and H100).

    .venv/bin/python benchmarks/external_runs_report.py [--write | --check]

Prints a Markdown table (measured and predicted step time, signed error, and the layout
columns the misses are read against: GPUs, TP/PP/DP, micro-batches per DP rank, precision,
framework), then MAPE / p90 / max, one table per file. ``--write`` replaces the tables between the
``external-runs`` and ``external-nemo2`` markers of ``docs/validation.md``; ``--check`` exits 1 when
either is stale.
Models the zoo lacks (BLOOM, the README's GPT sizes) are read from
``tests/data/external_models`` through ``MOFA_MODEL_PATH``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "tests" / "data" / "external_runs.csv"
NEMO2_CSV = ROOT / "tests" / "data" / "external_nemo2.csv"
MODELS = ROOT / "tests" / "data" / "external_models"
DOC = ROOT / "docs" / "validation.md"
BEGIN, END = "<!-- external-runs:begin -->", "<!-- external-runs:end -->"
#: (file, its markers in docs/validation.md)
TABLES = ((CSV, (BEGIN, END)), (NEMO2_CSV, ("<!-- external-nemo2:begin -->", "<!-- external-nemo2:end -->")))


def predict_rows(csv_path: Path = CSV):
    """The validation result of the external file (every row must map; the caller checks)."""
    os.environ["MOFA_MODEL_PATH"] = os.pathsep.join(filter(None, [str(MODELS), os.environ.get("MOFA_MODEL_PATH")]))
    from mofa_framework.validate import validate

    return validate([csv_path])


def _layout(job: dict) -> tuple[int, int, int, int, int]:
    par, n = job["parallel"], job["hardware"]["num_gpus"]
    tp, pp, cp = par.get("tp", 1), par.get("pp", 1), par.get("cp", 1)
    dp = n // (tp * pp * cp)
    micro = par["global_batch_size"] // (dp * par.get("micro_batch_size", 1))
    return tp, pp, cp, dp, micro


def _gemm_format(job: dict) -> str:
    """The format the row's GEMMs run in (a bf16 row with the ``fp8`` feature runs them in fp8)."""
    feats = job.get("features", {})
    return "fp8" if "fp8" in feats else "fp4" if "nvfp4" in feats else job["parallel"].get("precision", "bf16")


def markdown(result, mapped: dict) -> str:
    lines = ["| row | framework | GPUs | TP/PP/CP/DP | micro-batches | precision | measured s | predicted s | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result.rows:
        job, framework = mapped[r.row_id].job, mapped[r.row_id].framework
        tp, pp, cp, dp, micro = _layout(job)
        err = r.predicted_s / r.measured_s - 1
        lines.append(f"| {r.row_id} | {framework} | {job['hardware']['num_gpus']:,} | {tp}/{pp}/{cp}/{dp} | {micro} "
                     f"| {_gemm_format(job)} | {r.measured_s:.2f} | {r.predicted_s:.2f} "
                     f"| {100 * err:+.1f} % |")
    errs = np.array([abs(r.predicted_s / r.measured_s - 1) for r in result.rows])
    lines.append("")
    lines.append(f"{len(errs)} rows, none skipped: MAPE {100 * errs.mean():.1f} %, "
                 f"p90 {100 * np.quantile(errs, 0.9):.1f} %, max {100 * errs.max():.1f} %.")
    return "\n".join(lines)


def main(argv=None) -> int:
    from korthikanti_report import print_or_write, table_parser
    from mofa_framework.api import Predictor
    from mofa_framework.measurements import map_files

    args = table_parser(__doc__.splitlines()[0], DOC).parse_args(argv)
    status = 0
    for path, markers in TABLES:
        result = predict_rows(path)
        if result.skipped:
            raise SystemExit(f"{path.name}: rows not predicted: {[(s.row_id, s.reason) for s in result.skipped]}")
        mapped, _, _ = map_files([path], Predictor().registry, None, None)
        md = markdown(result, {m.row_id: m for m in mapped})
        status |= print_or_write(md, DOC, markers, args.write, args.check)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
