"""`mofa tune` on every zoo model at its usual scales: which models tune in about a second (issue 15).

    python benchmarks/zoo_tune_survey.py                        # every model, H100s, two scales
    python benchmarks/zoo_tune_survey.py --model qwen3-235b-a22b --hardware a100-sxm4-80gb --gpus 32

Each case is one search of the default space in its own process (``mofa tune``'s default space,
every feature and schedule), timed as CPU seconds of the search alone (``time.process_time``)
and stopped after ``--timeout`` seconds of wall time. Without ``--gpus`` a model runs at two
scales: the smallest power-of-two GPU count (at least 8) whose HBM holds its training states at
16 bytes per parameter within half of each GPU's memory, and eight times that; the global batch
is that GPU count (at least 64), a quarter of it from 1,024 GPUs on (at least 256); the sequence
is 4,096. Prints a Markdown table, slowest first, and a one-line summary.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from mofa_framework.errors import ConfigError
from tune_benchmark import _request, _summary

#: training state bytes per parameter (bf16 weights and gradients, fp32 master weights and Adam moments)
STATE_BYTES_PER_PARAM = 16.0
SEQUENCE = 4096


def usual_gpus(total_params: float, hbm_bytes: float) -> int:
    """The smallest power of two (at least 8) whose GPUs hold the states within half their HBM."""
    need = total_params * STATE_BYTES_PER_PARAM / (0.5 * hbm_bytes)
    return max(8, 2 ** math.ceil(math.log2(max(need, 1.0))))


def usual_batch(gpus: int) -> int:
    return max(256, gpus // 4) if gpus >= 1024 else max(64, gpus)


def run_case(model: str, hardware: str, gpus: int, gbs: int, timeout_s: float) -> dict:
    """One search in a fresh process (this script with ``--run-case``), stopped after `timeout_s`."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--run-case", model, hardware, str(gpus), str(gbs)]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"search_cpu_s": None, "evaluated": None, "best": f"stopped after {timeout_s:.0f} s of wall time"}
    if out.returncode:
        raise RuntimeError(f"{model} on {gpus} × {hardware} failed: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def search(model: str, hardware: str, gpus: int, gbs: int) -> dict:
    """The search itself (child process): tune_benchmark's request and summary."""
    from mofa_framework.tuner import tune

    predictor, req = _request((model, model, hardware, gpus, gbs, SEQUENCE))
    c0, w0 = time.process_time(), time.perf_counter()
    return _summary(tune(predictor, req), time.process_time() - c0, time.perf_counter() - w0)


def cases(args) -> list[tuple[str, int, int]]:
    from mofa_framework import Predictor
    from mofa_framework.decompose import total_params

    reg = Predictor().registry
    hbm = reg.hardware_profile(args.hardware).hbm_bytes
    out = []
    for name in args.model or sorted(reg.models):
        scales = args.gpus or [usual_gpus(total_params(reg.model(name))["total"], hbm)]
        if not args.gpus:
            scales.append(scales[0] * 8)
        out += [(name, g, args.gbs or usual_batch(g)) for g in scales]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="only these zoo models (default: every one)")
    ap.add_argument("--hardware", default="h100-sxm5-80gb")
    ap.add_argument("--gpus", type=int, action="append", help="these GPU counts instead of the two usual scales")
    ap.add_argument("--gbs", type=int, help="global batch (default: from the GPU count)")
    ap.add_argument("--timeout", type=float, default=120.0, help="wall seconds per case")
    ap.add_argument("--run-case", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run_case:
        model, hardware, gpus, gbs = args.run_case
        print(json.dumps(search(model, hardware, int(gpus), int(gbs))))
        return
    if any(g < 1 for g in args.gpus or ()) or (args.gbs is not None and args.gbs < 1) or args.timeout <= 0:
        ap.error("--gpus, --gbs and --timeout must be positive")
    try:
        todo = cases(args)
    except ConfigError as exc:  # an unknown model or hardware profile: one line, exit 2
        ap.error(str(exc))
    rows = [(m, g, b, run_case(m, args.hardware, g, b, args.timeout)) for m, g, b in todo]
    rows.sort(key=lambda r: -(r[3]["search_cpu_s"] if r[3]["search_cpu_s"] is not None else math.inf))
    print(f"| model | GPUs ({args.hardware}) | gbs | search CPU s | leaves evaluated | best |\n|---|---|---|---|---|---|")
    for m, g, b, r in rows:
        cpu = f"{r['search_cpu_s']:.2f}" if r["search_cpu_s"] is not None else "–"
        ev = f"{r['evaluated']:,}" if r["evaluated"] is not None else "–"
        print(f"| {m} | {g:,} | {b:,} | {cpu} | {ev} | {r['best']} |")
    done = [r[3]["search_cpu_s"] for r in rows if r[3]["search_cpu_s"] is not None]
    med = f"median {sorted(done)[len(done) // 2]:.2f} s, max {max(done):.2f} s" if done else "none finished"
    print(f"\n{len(rows)} searches, {len(rows) - len(done)} stopped; search CPU under 1 s: "
          f"{sum(c < 1 for c in done)}, under 2 s: {sum(c < 2 for c in done)}, {med}")


if __name__ == "__main__":
    main()
