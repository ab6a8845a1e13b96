"""Tuner speed and memory (issue 15's targets), each case in its own process.

    python benchmarks/tune_benchmark.py                  # the Markdown table of docs/tuning.md
    python benchmarks/tune_benchmark.py --tree ../other  # the same cases against another checkout
    python benchmarks/tune_benchmark.py --case deepseek-v3

Every case searches `mofa tune`'s default space (every tunable feature, every schedule, the
default parallel ranges). The machine is shared, so times are given as CPU time (user + system,
of the whole process or of the search alone: `resource.getrusage`, `time.process_time`) and as
wall time; CPU time is what the targets are checked against. Peak memory is the process's
maximum resident set. The first row is one `mofa tune` process, start-up included.

Evaluator throughput, two ways. The evaluator itself (the ``flat-`` cases): every candidate of a
sub-space that passes every rule (``tuner.every_candidate``, what brute force prices), in its batches
(whole structures of 262,144 rows before the feature rules, tens of thousands after), priced by
``Predictor.evaluate`` — the cost function that one prediction and a search
share — in candidates per CPU-second of ``evaluate`` alone (building the batches is not counted, nor an
untimed warm-up on the first structure's rows: first-call costs). And
the search without bounds (the ``exhaustive-`` cases, ``pareto=True``): the leaves it evaluates, which
exclude the variants that change nothing, per CPU-second of search; for the full searches, the
candidates the search settled (evaluated, or ruled out by an exact bound) per CPU-second of search.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

#: (name, model, hardware, GPUs, global batch, sequence): the issue's jobs at their usual scales
SEARCHES = [
    ("deepseek-v3", "deepseek-v3", "h800-sxm5-80gb", 2048, 15360, 4096),
    ("kimi-k2", "kimi-k2", "h800-sxm5-80gb", 2048, 16384, 4096),
    ("qwen3-235b", "qwen3-235b-a22b", "h100-sxm5-80gb", 1024, 1024, 4096),
    ("gpt-oss-120b", "gpt-oss-120b", "h100-sxm5-80gb", 1024, 1024, 4096),
    ("mixtral-8x22b", "mixtral-8x22b", "h100-sxm5-80gb", 512, 1024, 4096),
    ("llama3.1-405b-8k", "llama3.1-405b", "h100-sxm5-80gb", 8192, 2048, 8192),
]
CLI_CASE = ("llama3.1-405b-16k-cli", "llama3.1-405b", "h100-sxm5-80gb", 16384, 2048, 8192)
#: exhaustive sub-spaces for the evaluator's throughput: (name, model, hardware, GPUs, gbs, seq, narrowing)
EXHAUSTIVE = [
    ("dense: llama3.1-405b, TP 8, PP 16", "llama3.1-405b", "h100-sxm5-80gb", 16384, 2048, 8192,
     {"tp": (8,), "pp": (16,)}),
    ("MoE: deepseek-v3, TP 2, PP 8, EP 64", "deepseek-v3", "h800-sxm5-80gb", 2048, 15360, 4096,
     {"tp": (2,), "pp": (8,), "ep": (64,), "etp": (1,)}),
]
#: the installed package names whose folders differ (pyproject's package-dir): another checkout's are
#: linked under these names, else its plugins would run on this checkout's profiles and models
TREE_PACKAGES = {"mofa_plugins": "plugins", "mofa_hardware_profiles": "hardware_profiles", "mofa_model_zoo": "model_zoo"}
CASES = ([c[0] for c in (CLI_CASE, *SEARCHES)] + [f"exhaustive-{i}" for i in range(len(EXHAUSTIVE))]
         + [f"flat-{i}" for i in range(len(EXHAUSTIVE))])


# ---------------------------------------------------------------------- one case (child process)


def _request(spec, narrow=None, pareto=False):
    import attrs

    from mofa_framework import Predictor
    from mofa_framework.tuner import TuneRequest, default_space

    _, model_name, hw_name, gpus, gbs, seq = spec[:6]
    predictor = Predictor()
    reg = predictor.registry
    model, hw = reg.model(model_name), reg.hardware_profile(hw_name)
    space = default_space(reg, model, hw, gpus, seq)
    if narrow:
        space = attrs.evolve(space, **narrow)
    return predictor, TuneRequest(model=model, hardware=hw, num_gpus=gpus, global_batch_size=gbs,
                                  sequence_length=seq, space=space, pareto=pareto)


def _best(p: dict, schedule: str, step_time_s: float, mfu: float) -> str:
    """The table's "best" cell for a layout `p` (a candidate's ``parallel``)."""
    return (f"TP{p['tp']} PP{p['pp']} VPP{p['vpp']} CP{p['cp']} EP{p['ep']} mbs{p['micro_batch_size']} "
            f"{schedule}, {step_time_s:.2f} s, MFU {mfu:.1%}")


def _summary(result, cpu_s: float, wall_s: float) -> dict:
    top = result.best[0] if result.best else None
    return {"search_cpu_s": cpu_s, "search_wall_s": wall_s, "space": result.space_size, "evaluated": result.evaluated,
            "ruled_out": getattr(result, "skipped_by_bound", 0), "floored": getattr(result, "floored", 0),
            "best": _best(top.parallel, top.schedule, top.step_time_s, top.mfu) if top else "none feasible"}


def run_case(name: str) -> dict:
    if name == CLI_CASE[0]:  # the whole `mofa tune` command; the parent times the process
        from mofa_framework.cli import main

        _, model, hw, gpus, gbs, seq = CLI_CASE
        sys.argv = ["mofa", "tune", "--model", model, "--hardware", hw, "--gpus", str(gpus), "--gbs", str(gbs),
                    "--seq", str(seq), "--format", "json", "--no-progress"]
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main()
        d = json.loads(out.getvalue())
        b = d["best"][0]
        p = b["parallel"]
        return {"space": d["space_size"], "evaluated": d["evaluated"], "ruled_out": d.get("skipped_by_bound", 0),
                "floored": d.get("ruled_out_by_memory_floor", 0),
                "search_wall_s": d["elapsed_s"],
                "best": f"TP{p['tp']} PP{p['pp']} VPP{p['vpp']} CP{p['cp']} mbs{p['micro_batch_size']} "
                        f"{b['schedule']}, {b['step_time_s']:.2f} s, MFU {b['mfu']:.1%}"}
    from mofa_framework.tuner import tune

    if name.startswith("flat-"):
        spec = EXHAUSTIVE[int(name.split("-")[1])]
        return _flat(*_request(spec, spec[6]))
    if name.startswith("exhaustive-"):
        spec = EXHAUSTIVE[int(name.split("-")[1])]
        predictor, req = _request(spec, spec[6], pareto=True)
    else:
        predictor, req = _request(next(c for c in SEARCHES if c[0] == name))
    c0, w0 = time.process_time(), time.perf_counter()
    result = tune(predictor, req)
    return _summary(result, time.process_time() - c0, time.perf_counter() - w0)


def _flat(predictor, req) -> dict:
    """Every candidate that passes the rules, priced batch by batch; only ``evaluate`` is timed."""
    import numpy as np

    from mofa_framework.tuner import _parallel_of, every_candidate

    n, cpu, wall, best = 0, 0.0, 0.0, (np.inf, "none feasible")
    schedules = list(predictor.registry.schedules)
    warm = True
    for batch, structure in every_candidate(predictor, req, chunk_rows=FLAT_ROWS):
        if warm:  # first-call costs (lazy imports, the registry's caches) on one structure's rows, untimed
            rows = np.flatnonzero(structure[1] == 0)
            predictor.evaluate(batch.take(rows), req.model, req.hardware)
            warm = False
        c0, w0 = time.process_time(), time.perf_counter()
        pred = predictor.evaluate(batch, req.model, req.hardware, structure=structure)
        cpu, wall = cpu + time.process_time() - c0, wall + time.perf_counter() - w0
        n += len(batch)
        step = np.where(pred.fits_in_memory, pred.step_time_s, np.inf)
        i = int(np.argmin(step))
        if step[i] < best[0]:
            best = (float(step[i]), _best(_parallel_of(batch, i), schedules[int(batch.schedule[i])], float(step[i]),
                                          float(pred.mfu[i])))
    return {"search_cpu_s": cpu, "search_wall_s": wall, "space": req.space.size, "evaluated": n, "ruled_out": 0,
            "floored": 0, "best": best[1]}


#: rows per batch of the flat- cases: larger batches share more rows per layer and pipeline group, and
#: their memory grows with them (at 2^19 rows the MoE case passed 1 GiB, no faster)
FLAT_ROWS = 1 << 18


# ---------------------------------------------------------------------- the table (parent)


def measure(name: str, tree: Path | None, timeout_s: float | None = None) -> dict:
    """Run one case in a fresh process; add its whole-process CPU time, wall time and peak RSS
    (or, past `timeout_s` of wall time, stop it and say how far it got)."""
    env = dict(os.environ)
    if tree is not None:  # another checkout: its core, plugins, hardware profiles and models
        shim = Path(os.environ.get("TMPDIR", "/tmp")) / f"mofa-bench-{os.getpid()}"
        shim.mkdir(exist_ok=True)
        for package, folder in TREE_PACKAGES.items():
            link = shim / package
            if not link.exists():
                link.symlink_to(tree.resolve() / folder)
        env["PYTHONPATH"] = os.pathsep.join([str(tree.resolve()), str(shim)])
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # start-up as installed (cached bytecode)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--run-case", name], env=env,
                            stdout=subprocess.PIPE, cwd=str(tree) if tree else None, start_new_session=True)
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read()))
    reader.start()
    while True:  # reap the child ourselves: os.wait4 gives its resource usage
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if timeout_s is not None and time.perf_counter() - t0 > timeout_s:
            os.killpg(proc.pid, signal.SIGKILL)  # the case and any worker processes it forked
            _, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.01)
    wall = time.perf_counter() - t0
    reader.join()
    out = b"".join(chunks) if status == 0 else b""
    if not out and status:
        if timeout_s is None or wall < timeout_s:
            raise RuntimeError(f"case {name} failed (status {status})")
        return {"space": 0, "evaluated": 0, "ruled_out": 0, "search_wall_s": wall, "process_cpu_s":
                usage.ru_utime + usage.ru_stime, "process_wall_s": wall, "peak_mib": usage.ru_maxrss / 1024,
                "best": f"stopped after {wall:.0f} s of wall time (timeout)"}
    row = json.loads(out)
    row.update(process_cpu_s=usage.ru_utime + usage.ru_stime, process_wall_s=wall, peak_mib=usage.ru_maxrss / 1024)
    return row


def _label(name: str) -> str:
    if name == CLI_CASE[0]:
        _, model, hw, gpus, *_ = CLI_CASE
        return f"`mofa tune` {model} on {gpus:,} × {hw} (one process, start-up included)"
    if name.startswith("exhaustive-"):
        return "search without bounds, " + EXHAUSTIVE[int(name.split("-")[1])][0] + " (every candidate, no bound)"
    if name.startswith("flat-"):
        return ("evaluator itself (`Predictor.evaluate`), " + EXHAUSTIVE[int(name.split("-")[1])][0]
                + ": every candidate that passes the rules")
    _, model, hw, gpus, gbs, seq = next(c for c in SEARCHES if c[0] == name)
    return f"{model} on {gpus:,} × {hw}, gbs {gbs:,}, seq {seq:,}"


def table(rows: dict[str, dict]) -> str:
    lines = ["| case | space | evaluated | ruled out by bounds | CPU s (process / search) | wall s (process / search) "
             "| candidates / CPU-s | peak MiB | best |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        search_cpu = r.get("search_cpu_s")
        # decided: evaluated, or ruled out by an exact bound (not in the exhaustive cases, which have
        # none) or by a node's memory floor (over memory without an evaluation)
        settled = r["evaluated"] + r.get("floored", 0) + (0 if name.startswith("exhaustive-") else r["ruled_out"])
        rate = f"{settled / search_cpu / 1e6:.2f} M" if search_cpu else "–"
        cpu = f"{r['process_cpu_s']:.2f} / " + (f"{search_cpu:.2f}" if search_cpu else "–")
        wall = f"{r['process_wall_s']:.2f} / {r['search_wall_s']:.2f}"
        floored = f" (+{r['floored']:,} over memory by their node's floor)" if r.get("floored") else ""
        lines.append(f"| {_label(name)} | {r['space']:,} | {r['evaluated']:,}{floored} | {r['ruled_out']:,} | {cpu} | {wall} | "
                     f"{rate} | {r['peak_mib']:.0f} | {r['best']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", choices=CASES, help="run only these cases")
    ap.add_argument("--tree", type=Path, help="measure another checkout of MoFa (e.g. the main branch)")
    ap.add_argument("--timeout", type=float, help="stop a case after this many seconds of wall time")
    ap.add_argument("--run-case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run_case:
        print(json.dumps(run_case(args.run_case)))
        return
    rows = {name: measure(name, args.tree, args.timeout) for name in (args.case or CASES)}
    load = os.getloadavg()[0]
    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores, load {load:.1f}; "
          f"{platform.python_implementation()} {platform.python_version()}\n")
    print(table(rows))


if __name__ == "__main__":
    main()
