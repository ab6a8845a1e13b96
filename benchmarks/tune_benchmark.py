"""Tuner speed: candidates evaluated per second and wall time (issue 6's benchmark).

    python benchmarks/tune_benchmark.py            # prints a Markdown table
    python benchmarks/tune_benchmark.py --repeat 3 # best of 3 runs per case

Every installed feature is in the space (each off, or on with each of its options' search
values; fp8 included), with every schedule and the default parallel ranges.
"""

from __future__ import annotations

import argparse
import platform
import time

from mofa_framework import Predictor
from mofa_framework.tuner import TuneRequest, default_space, tune

CASES = [
    ("llama3.1-405b", "h100-sxm5-80gb", 8192, 2048, 8192),
    ("llama3.1-405b", "h100-sxm5-80gb", 16384, 2048, 8192),
    ("deepseek-v3", "h800-sxm5-80gb", 2048, 15360, 4096),
]


def run(repeat: int) -> list[dict]:
    predictor = Predictor()
    reg = predictor.registry
    features = [n for n, f in reg.features.items() if f.tunable or n == "fp8"]
    rows = []
    for model_name, hw_name, gpus, gbs, seq in CASES:
        model, hw = reg.model(model_name), reg.hardware_profile(hw_name)
        space = default_space(reg, model, hw, gpus, seq, features=features)
        req = TuneRequest(model=model, hardware=hw, num_gpus=gpus, global_batch_size=gbs, sequence_length=seq,
                          space=space, precision="bf16")
        best = None
        for _ in range(repeat):
            t0 = time.perf_counter()
            result = tune(predictor, req)
            wall = time.perf_counter() - t0
            if best is None or wall < best[0]:
                best = (wall, result)
        wall, result = best
        top = result.best[0] if result.best else None
        rows.append({
            "case": f"{model_name} on {gpus:,} × {hw_name}", "space": result.space_size,
            "evaluated": result.evaluated, "wall_s": wall, "per_s": result.evaluated / wall,
            "best": (f"TP{top.parallel['tp']} PP{top.parallel['pp']} VPP{top.parallel['vpp']} CP{top.parallel['cp']} "
                     f"EP{top.parallel['ep']} mbs{top.parallel['micro_batch_size']} {top.schedule}, "
                     f"{top.step_time_s:.2f} s" if top else "none feasible"),
        })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    rows = run(args.repeat)
    print(f"Machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}; "
          f"best of {args.repeat} runs\n")
    print("| case | space (candidates) | evaluated after exact pruning | wall time | candidates/s | best |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['space']:,} | {r['evaluated']:,} | {r['wall_s']:.2f} s | {r['per_s']:,.0f} | "
              f"{r['best']} |")


if __name__ == "__main__":
    main()
