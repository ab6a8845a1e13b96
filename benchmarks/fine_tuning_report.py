"""Per-row step-time error on NVIDIA's published fine-tuning runs (SFT and LoRA) in ``../shared/data``
(NeMo 24.07's Llama 2 rows, Megatron-Bridge's Llama 3 70B rows), predicted with the shipped profiles.

    .venv/bin/python benchmarks/fine_tuning_report.py [--write | --check]

Prints a Markdown table (task, GPU, layout, measured and predicted step time, signed error and the
breakdown's weight-gradient share), then MAPE per task and GPU. ``--write`` replaces the table
between the ``fine-tuning`` markers of ``docs/features/fine-tuning.md``; ``--check`` exits 1 when
it is stale.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "features" / "fine-tuning.md"
BEGIN, END = "<!-- fine-tuning:begin -->", "<!-- fine-tuning:end -->"
FILES = ("nemo_2407.csv", "nvidia_megatron_bridge.csv")


def fine_tuning_rows():
    """(mapped rows, validation rows) of the SFT and LoRA rows of :data:`FILES`."""
    from mofa_framework.api import Predictor
    from mofa_framework.measurements import builtin_data_dir, map_files
    from mofa_framework.validate import validate

    files = [builtin_data_dir() / f for f in FILES]
    mapped, _, _ = map_files(files, Predictor().registry)
    tuned = {m.row_id: m for m in mapped if m.job["parallel"].get("document_length")}
    return tuned, [r for r in validate(files).rows if r.row_id in tuned]


def _task(m) -> str:
    return "LoRA" if "lora" in m.job["features"] else "SFT"


def markdown(mapped: dict, rows) -> str:
    lines = ["| row | task | model | GPU | GPUs | TP/PP/VPP | precision | measured s | predicted s | error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    groups = defaultdict(list)
    for r in sorted(rows, key=lambda r: (mapped[r.row_id].job["hardware"]["name"], _task(mapped[r.row_id]), r.row_id)):
        m = mapped[r.row_id]
        par, hw = m.job["parallel"], m.job["hardware"]
        err = r.predicted_s / r.measured_s - 1
        groups[(_task(m), hw["name"])].append(abs(err))
        lines.append(f"| {r.row_id} | {_task(m)} | {m.job['model']['name']} | {hw['name']} | {hw['num_gpus']} "
                     f"| {par.get('tp', 1)}/{par.get('pp', 1)}/{par.get('vpp', 1)} "
                     f"| {'fp8' if 'fp8' in m.job['features'] else par.get('precision', 'bf16')} "
                     f"| {r.measured_s:.3f} | {r.predicted_s:.3f} | {100 * err:+.1f} % |")
    lines += ["", "| task | GPU | rows | MAPE | max |", "|---|---|---|---|---|"]
    for (task, gpu), errs in sorted(groups.items()):
        lines.append(f"| {task} | {gpu} | {len(errs)} | {100 * np.mean(errs):.1f} % | {100 * max(errs):.1f} % |")
    allerr = [e for v in groups.values() for e in v]
    lines += ["", f"{len(allerr)} rows, none skipped: MAPE {100 * np.mean(allerr):.1f} %, "
                  f"max {100 * max(allerr):.1f} % (shipped profiles, in-sample: these rows are in the fits)."]
    return "\n".join(lines)


def main(argv=None) -> int:
    from korthikanti_report import table_parser

    args = table_parser(__doc__.splitlines()[0], DOC).parse_args(argv)
    mapped, rows = fine_tuning_rows()
    if len(rows) != len(mapped):
        raise SystemExit(f"rows not predicted: {sorted(set(mapped) - {r.row_id for r in rows})}")
    from korthikanti_report import print_or_write

    return print_or_write(markdown(mapped, rows), DOC, (BEGIN, END), args.write, args.check)


if __name__ == "__main__":
    raise SystemExit(main())
