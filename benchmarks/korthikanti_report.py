"""Full vs selective recompute against Korthikanti et al. 2022 (Table 5), and activation bytes
per layer against the paper's closed forms.

Reads the Korthikanti rows of ``megatron_selene_a100.csv`` (full recompute without sequence
parallelism vs "present work" = sequence parallel + selective recompute), predicts both with
``features.recompute`` and ``flash_attention = false``, and prints a Markdown table:

    .venv/bin/python benchmarks/korthikanti_report.py [--csv PATH] [--write | --check]

Columns: the measured and predicted iteration times, the full/selective ratio of each and
the ratio's relative error; then the per-layer activation bytes the engine keeps with
TP+SP (no recompute), selective and full recompute vs ``s·b·h/t·(34 + 5·a·s/h)``,
``34·s·b·h/t`` and ``2·s·b·h/t``.
"""

from __future__ import annotations

import argparse
import csv
import os
from pathlib import Path

from mofa_framework.measurements import builtin_data_dir

DEFAULT_CSV = Path(os.environ.get("MOFA_SHARED_DATA") or builtin_data_dir()) / "megatron_selene_a100.csv"

#: Table 5 models → zoo names
MODELS = {"GPT 22B": "gpt-22b", "GPT-3 175B": "gpt3-175b", "MT-NLG 530B": "mt-nlg-530b", "GPT 1T": "gpt-1t"}


def korthikanti_pairs(path: Path = DEFAULT_CSV) -> list[dict]:
    """One dict per model: config and the measured full / selective iteration times (DP = 1 rows)."""
    rows = list(csv.DictReader(path.open()))
    out: dict[str, dict] = {}
    for r in rows:
        if not r["source"].startswith("Korthikanti") or not r["measured_iter_time_s"] or r["dp"] != "1":
            continue
        d = out.setdefault(r["model_name"], {
            "model": MODELS[r["model_name"]], "label": r["model_name"], "num_gpus": int(r["n_gpus"]),
            "tp": int(r["tp"]), "pp": int(r["pp"]), "vpp": int(r["vpp"] or 1), "mbs": int(r["micro_batch"]),
            "gbs": int(r["global_batch"]), "seq": int(r["seq_len"])})
        key = "full" if r["recompute"] == "full" else "selective"
        d[key] = float(r["measured_iter_time_s"])
    return [d for d in out.values() if "full" in d and "selective" in d]


def job_dict(pair: dict, granularity: str) -> dict:
    return {
        "name": f"{pair['model']}-{granularity}",
        "model": {"name": pair["model"]},
        "hardware": {"name": "a100-sxm4-80gb", "num_gpus": pair["num_gpus"]},
        "parallel": {"tp": pair["tp"], "pp": pair["pp"], "vpp": pair["vpp"], "micro_batch_size": pair["mbs"],
                     "global_batch_size": pair["gbs"], "sequence_length": pair["seq"], "flash_attention": False,
                     # Table 5: full recompute without SP, "present work" = SP + selective
                     "sequence_parallel": granularity == "selective", "precision": "fp16"},
        "features": {"recompute": {"granularity": granularity}},
    }


def compare(predictor, pairs: list[dict]) -> list[dict]:
    """Predicted vs measured times, ratios, and per-layer activation bytes vs closed forms."""
    import attrs

    from mofa_framework.config import jobs_to_batch

    out = []
    for pair in pairs:
        full, sel = (predictor.job(job_dict(pair, g)) for g in ("full", "selective"))
        r_full, r_sel = predictor.predict([full, sel])
        # per-layer activations with TP+SP: no recompute, selective, full
        sp = attrs.evolve(full, parallel=attrs.evolve(full.parallel, sequence_parallel=True), features={})
        variants = [sp, attrs.evolve(sp, features={"recompute": sel.features["recompute"]}),
                    attrs.evolve(sp, features={"recompute": full.features["recompute"]})]
        pred = predictor.evaluate(jobs_to_batch(variants, predictor.registry), full.model, full.hardware)
        layer = pred.state.layers["dense"]
        m = full.model
        s, b, h, t, a = pair["seq"], pair["mbs"], m.hidden_size, pair["tp"], m.num_attention_heads
        closed = [s * b * h / t * (34 + 5 * a * s / h), 34 * s * b * h / t, 2 * s * b * h / t]
        out.append({
            **pair, "pred_full": r_full.step_time_s, "pred_selective": r_sel.step_time_s,
            "ratio_measured": pair["full"] / pair["selective"],
            "ratio_predicted": r_full.step_time_s / r_sel.step_time_s,
            "act_bytes": [float(x) for x in layer.act_saved_bytes], "act_closed": closed,
        })
    for row in out:
        row["ratio_error"] = row["ratio_predicted"] / row["ratio_measured"] - 1.0
    return out


def markdown(rows: list[dict]) -> str:
    lines = ["| model | GPUs | TP·PP·v | full s (meas / pred) | selective s (meas / pred) | ratio meas | ratio pred "
             "| ratio error |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['label']} | {r['num_gpus']} | {r['tp']}·{r['pp']}·{r['vpp']} | {r['full']:.2f} / "
                     f"{r['pred_full']:.2f} | {r['selective']:.2f} / {r['pred_selective']:.2f} | "
                     f"{r['ratio_measured']:.3f} | {r['ratio_predicted']:.3f} | {100 * r['ratio_error']:+.1f} % |")
    lines += ["", "| model | TP+SP MB/layer (engine / closed form) | selective | full |", "|---|---|---|---|"]
    for r in rows:
        cells = [f"{e / 1e6:.1f} / {c / 1e6:.1f}" for e, c in zip(r["act_bytes"], r["act_closed"])]
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


DOC = Path(__file__).resolve().parents[1] / "docs" / "features" / "memory.md"
BEGIN, END = "<!-- korthikanti-report:begin -->", "<!-- korthikanti-report:end -->"


def table_parser(description: str, doc: Path) -> argparse.ArgumentParser:
    """The options of a report that writes a generated section of `doc`: ``--write`` and ``--check``
    (for :func:`print_or_write`)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--write", action="store_true", help=f"replace the section between the markers of {doc.name}")
    ap.add_argument("--check", action="store_true", help="exit 1 if that section is out of date")
    return ap


def main(argv=None) -> int:
    ap = table_parser(__doc__.splitlines()[0], DOC)
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    args = ap.parse_args(argv)
    from mofa_framework import Predictor

    md = markdown(compare(Predictor(), korthikanti_pairs(args.csv)))
    return print_or_write(md, DOC, (BEGIN, END), args.write, args.check)


def print_or_write(md: str, doc: Path, markers: tuple[str, str], write: bool, check: bool) -> int:
    """Print `md`; or (``write``) put it between the two markers of `doc`; or (``check``) return 1
    when that section differs from `md`."""
    if not (write or check):
        print(md)
        return 0
    begin, end = markers
    text = doc.read_text()
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    new = f"{head}{begin}\n{md}\n{end}{tail}"
    if check:
        return 0 if new == text else 1
    doc.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
