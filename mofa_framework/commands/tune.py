"""``mofa tune``: search parallel strategies and features for the best step or E2E time."""

from __future__ import annotations

import csv
import io
import math
import sys
from pathlib import Path

import attrs
import click

from ..cli import (ATTENTION_KERNEL_OPTION, DOCUMENT_LENGTH_OPTION, GBS_OPTION, GPUS_OPTION, NUM_LAYERS_OPTION,
                   POWER_LIMIT_OPTION, SCALEOUT_OPTION, SEQ_OPTION, _emit_json, _fmt_s, load_jobs, pass_state)
from ..config import own_network, with_power_limit, with_scaleout_bandwidth
from ..errors import ConfigError
from ..limits import LIMITS, check, short
from ..tuner import (OBJECTIVES, TuneRequest, job_request, launch_lines, megatron_arguments, megatron_environment,
                     stage_layers, tune)


def _ints(text: str | None, flag: str, minimum: int = 1) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{flag}: expected comma-separated integers, e.g. 1,2,4,8; got {short(text)}") from None
    if not vals or min(vals) < minimum:
        raise ConfigError(f"{flag}: values must be integers ≥ {minimum}, got {short(text)}")
    bound = LIMITS[_FLAG_BOUNDS.get(flag, "parallel.tp")]
    for x in vals:
        try:
            check(bound, flag, x)
        except ValueError as exc:
            raise ConfigError(str(exc).replace(f"'{flag}':", f"{flag}:")) from None
    return vals


#: each --*-values flag's values pass the bound of the parallel size it searches
_FLAG_BOUNDS = {f"--{k}-values": f"parallel.{k}" for k in ("tp", "pp", "vpp", "cp", "ep", "etp")}
_FLAG_BOUNDS["--mbs-values"] = "parallel.micro_batch_size"
_FLAG_BOUNDS["--lighter-ends-values"] = "parallel.first_stage_layers"
_FLAG_BOUNDS["--lighter-last-values"] = "parallel.last_stage_layers"


def _names(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(x.strip() for x in text.split(",") if x.strip())


def build_request(state, job_files, flags, *, tp, pp, vpp, cp, ep, etp, mbs_list, schedules, features,
                  objective, top, pareto, lighter_ends=None, lighter_last=None,
                  time_budget=None, memory_headroom=None) -> tuple[TuneRequest, object]:
    """A TuneRequest from a job file (its [search] table) or flags; flags override the file."""
    flags = dict(flags)
    num_layers = flags.pop("num_layers", None)  # applies to a job file too
    for k in ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs"):
        flags.setdefault(k, None)
    flags.setdefault("schedule", None)
    flags.setdefault("sequence_parallel", None)
    flags.setdefault("features", ())
    if not job_files and not all(flags.get(k) for k in ("model", "hardware", "gpus", "gbs", "seq")):
        raise ConfigError("give a job file, or --model, --hardware, --gpus, --gbs and --seq")
    tokens = flags.pop("tokens", None)
    flash = flags.get("flash_attention")
    kernel = flags.pop("attention_kernel", None)
    doc_len = flags.pop("document_length", None)
    power_w = flags.pop("power_limit_w", None)
    net = flags.pop("scaleout_bandwidth_gbps", None)
    if job_files:
        if any(flags.get(k) for k in ("model", "hardware", "gpus", "gbs", "seq", "precision", "moe_load_factor")):
            raise ConfigError("give either a job file or --model/--hardware/--gpus/--gbs/--seq, not both "
                              "(a job file sets moe_load_factor under [model])")
        flags = {k: None if not isinstance(v, tuple) else () for k, v in flags.items()}
    job = load_jobs(state, job_files, {**flags, "tokens": None if job_files else tokens, "num_layers": num_layers})[0]
    if tokens:
        job = attrs.evolve(job, training=attrs.evolve(job.training, tokens=tokens))
    if flash is not None:  # the flag also overrides a job file's [parallel] flash_attention
        job = attrs.evolve(job, parallel=attrs.evolve(job.parallel, flash_attention=flash))
    if kernel is not None:  # likewise [parallel] attention_kernel
        job = attrs.evolve(job, parallel=attrs.evolve(job.parallel, attention_kernel=kernel))
    if doc_len is not None:  # and [parallel] document_length
        job = attrs.evolve(job, parallel=attrs.evolve(job.parallel, document_length=doc_len))
    if power_w is not None:  # likewise [hardware] power_limit_w
        job = attrs.evolve(job, hardware=with_power_limit(job.hardware, power_w, "--power-limit-w"))
    if net is not None:  # and [hardware] scaleout_bandwidth_gbps
        job = attrs.evolve(job, hardware=with_scaleout_bandwidth(job.hardware, net, "--scaleout-bandwidth-gbps"))
    values = {"tp": _ints(tp, "--tp-values"), "pp": _ints(pp, "--pp-values"), "vpp": _ints(vpp, "--vpp-values"),
              "cp": _ints(cp, "--cp-values"), "ep": _ints(ep, "--ep-values"), "etp": _ints(etp, "--etp-values"),
              "micro_batch_size": _ints(mbs_list, "--mbs-values"),
              "lighter_ends": _ints(lighter_ends, "--lighter-ends-values", minimum=0),
              "lighter_last": _ints(lighter_last, "--lighter-last-values", minimum=0)}
    req = job_request(job, state.pm.registry, features=_names(features) or None, schedules=_names(schedules),
                      values={k: v for k, v in values.items() if v}, objective=objective, top_k=top, pareto=pareto,
                      time_budget_s=time_budget, memory_headroom_gib=memory_headroom,
                      fields=("--features", "--schedules"))
    return req, job


def candidate_job(job, cand, reg):
    """`job` run as the tuner's candidate `cand`: its parallel layout, schedule and features."""
    from ..config import ParallelConfig

    names = {f.name for f in attrs.fields(ParallelConfig)}
    parallel = attrs.evolve(job.parallel, **{k: v for k, v in cand.parallel.items() if k in names})
    feats = {n: reg.features[n].options_type(**o) for n, o in cand.features.items()}
    return attrs.evolve(job, parallel=parallel, schedule=cand.schedule, features=feats)


def _layers(c, model) -> str:
    """`PP` or `PP (first/middle/last)` when the end stages hold fewer layers."""
    p = c.parallel
    first, mid, last = stage_layers(model.num_layers, p["pp"], p["first_stage_layers"], p["last_stage_layers"])
    even = p["pp"] == 1 or (first, last) == ((mid, mid) if p["pp"] > 2 else (first, first))
    return str(p["pp"]) if even else f"{p['pp']} ({first}/{mid}/{last})" if p["pp"] > 2 else f"{p['pp']} ({first}/{last})"


def _variants(c, reg) -> str:
    """What the equivalent variants of a row differ in: each feature on in some but not all of them
    (or with other options)."""
    if not c.variants:
        return ""
    sets = [dict(c.features), *[dict(v) for v in c.variants]]
    names = sorted({n for f in sets for n in f})
    differ = [n for n in names if len({repr(f.get(n)) for f in sets}) > 1]
    schedules = list(dict.fromkeys((c.schedule, *c.variant_schedules)))
    if len(schedules) > 1:
        differ.insert(0, "schedule " + "/".join(schedules))
    return f"≡ {len(c.variants)} more: " + ", ".join(differ)


def _row(c, reg) -> dict:
    p = c.parallel
    row = {"rank": c.rank, "step_time_s": round(c.step_time_s, 4), "step_time_s_low": round(c.step_time_s_low, 4),
           "step_time_s_high": round(c.step_time_s_high, 4), "within_band_of_best": c.within_band_of_best,
           "objective": c.objective_value,
           "memory_gib": round(c.peak_memory_gib, 2), "tflops_per_gpu": round(c.model_tflops_per_gpu, 1),
           "mfu": round(c.mfu, 4), "compute_s": round(c.compute_s, 4), "tp": p["tp"], "pp": p["pp"], "vpp": p["vpp"],
           "cp": p["cp"], "ep": p["ep"], "etp": p["etp"], "dp": p["dp"], "mbs": p["micro_batch_size"],
           "first_stage_layers": p["first_stage_layers"], "last_stage_layers": p["last_stage_layers"],
           "schedule": c.schedule, "tp_comm_s": round(c.tp_comm_s, 4), "pp_comm_s": round(c.pp_comm_s, 4),
           "dp_comm_s": round(c.dp_comm_s, 4), "optimizer_s": round(c.optimizer_s, 4),
           "features": ";".join(_feature_label(k, v, reg) for k, v in sorted(c.features.items())),
           "equivalent_variants": len(c.variants)}
    if c.ettr is not None:
        row.update(checkpoint_interval_steps=c.checkpoint_interval_steps, ettr=round(c.ettr, 4))
    return row


def _feature_label(name: str, opts: dict, reg) -> str:
    """`name` or `name(option=value)` for the options that differ from their defaults."""
    if name in reg.features and attrs.has(reg.features[name].options_type):
        defaults = attrs.asdict(reg.features[name].options_type())
        opts = {k: v for k, v in opts.items() if defaults.get(k) != v}
    return f"{name}({','.join(f'{a}={b}' for a, b in opts.items())})" if opts else name


def _headline(result, req) -> str:
    floored = f"{result.floored:,} over memory by their node's floor, " if result.floored else ""
    what = (f"{result.evaluated:,} candidates evaluated, {result.skipped_by_bound:,} ruled out by bounds, {floored}of "
            f"{result.space_size:,} in the space ({result.structures_feasible:,}/{result.structures:,} structures "
            f"feasible), {result.feasible:,} fit"
            + (f" leaving {result.memory_headroom_gib:g} GiB of HBM free" if result.memory_headroom_gib else "")
            + f", {result.elapsed_s:.2f} s")
    if not result.proven_optimal:
        what += (f" — TIME BUDGET REACHED: the best found so far, not proven optimal "
                 f"({result.unexplored:,} candidates not explored)")
    return what


def _print_table(result, req, reg, fmt: str = "table") -> None:
    from rich.table import Table

    from ..cli import console, markdown_table

    con = console(170)
    rows = []
    hw = req.hardware
    net = own_network(hw.interconnect.scaleout_bandwidth_gbps, reg.hardware_profile(hw.name))
    run = (f" at {hw.compute.power_limit_w:g} W" if hw.compute.power_limit_w else "") + (
        f", {net:g} GB/s per GPU between nodes" if net else "")
    con.print(f"[bold]{req.model.name}[/] on {req.num_gpus} × {req.hardware.name}{run}, global batch "
              f"{req.global_batch_size}, sequence {req.sequence_length}, objective {req.objective}: "
              + _headline(result, req))
    t = Table(header_style="bold")
    cols = ["rank", "step", "band", "memory GiB", "TFLOPS", "MFU", "compute", "TP", "PP (layers)", "VPP", "CP", "EP", "DP",
            "mbs", "schedule", "TP comm", "PP comm", "DP comm", "optimizer", "features"]
    e2e = req.objective != "step_time"
    if e2e:
        cols[3:3] = ["total" if req.objective == "e2e_time" else "GPU-hours", "ckpt every", "ETTR"]
    longest = max((len(x) for c in result.best for x in _row(c, reg)["features"].split(";")), default=8)
    for c in cols:
        t.add_column(c, overflow="fold", min_width=min(longest, 48) if c == "features" else None)
    for c in result.best:
        r = _row(c, reg)
        feats = r["features"].replace(";", "\n") + (f"\n[dim]{_variants(c, reg)}[/]" if c.variants else "")
        rank = f"{r['rank']} ≈" if c.within_band_of_best and c.rank > 1 else r["rank"]
        band = (f"{_fmt_s(c.step_time_s_low)}–{_fmt_s(c.step_time_s_high)}"
                if math.isfinite(c.step_time_s_low) else "–")
        cells = [rank, _fmt_s(c.step_time_s), band, f"{r['memory_gib']:.1f}", f"{r['tflops_per_gpu']:.0f}",
                 f"{c.mfu:.1%}", _fmt_s(c.compute_s), r["tp"], _layers(c, req.model), r["vpp"], r["cp"], r["ep"],
                 r["dp"], r["mbs"], r["schedule"], _fmt_s(c.tp_comm_s), _fmt_s(c.pp_comm_s), _fmt_s(c.dp_comm_s),
                 _fmt_s(c.optimizer_s), feats]
        if e2e:
            total = f"{c.objective_value / 86400:.2f} d" if req.objective == "e2e_time" else f"{c.objective_value:,.0f}"
            cells[3:3] = [total, f"{c.checkpoint_interval_steps:,.0f} steps" if c.checkpoint_interval_steps else "–",
                          f"{c.ettr:.3f}" if c.ettr is not None else "–"]
        rows.append([str(x) for x in cells])
        t.add_row(*rows[-1])
    if fmt == "markdown":
        click.echo(markdown_table(rows, cols))
    else:
        con.print(t)
    if any(c.within_band_of_best and c.rank > 1 for c in result.best):
        con.print("≈: inside rank 1's band and rank 1 inside its own: the prediction cannot tell them apart")
    for flag in result.best[0].extrapolation if result.best else ():
        con.print(f"outside the calibrated regimes: {flag}")
    if result.pareto:
        con.print("Pareto front (step time vs peak memory): " + ", ".join(
            f"{_fmt_s(c.step_time_s)} @ {c.peak_memory_gib:.1f} GiB" for c in result.pareto))


class _ProgressLine:
    """One line on stderr every few seconds (for logs and pipes): evaluated, ruled out, best, ETA."""

    def __init__(self, every_s: float = 3.0):
        self.every_s, self.next_s = every_s, every_s

    def __call__(self, p) -> None:
        if p.elapsed_s < self.next_s:
            return
        self.next_s = p.elapsed_s + self.every_s
        best = "none yet" if p.best is None else f"{p.best:.4g}"
        eta = "?" if p.eta_s is None else f"{p.eta_s:.0f} s"
        click.echo(f"mofa tune: {p.evaluated:,} evaluated, {p.skipped:,} ruled out by bounds of {p.total:,} "
                   f"({p.fraction:.0%}), best {best}, {p.elapsed_s:.0f} s elapsed, ETA {eta}{memory_note(p)}",
                   err=True)


def memory_note(p) -> str:
    """What a memory-tight search is doing while its best stands still (empty otherwise)."""
    if not p.memory_tight:
        return ""
    return f"; memory-tight: {p.feasible:,} of {p.reached:,} leaves reached fit (--time-budget returns the best so far)"


@click.command("tune")
@click.argument("job_files", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--model", help="Zoo model name, alias, or a HuggingFace config.json.")
@click.option("--hardware", help="Hardware profile name.")
@GPUS_OPTION
@GBS_OPTION
@SEQ_OPTION
@click.option("--precision", type=click.Choice(["bf16", "fp16", "fp8", "fp4"]))
@click.option("--tokens", type=float, help="Tokens to train on (needed by the e2e_time and gpu_hours objectives).")
@click.option("--flash-attention/--no-flash-attention", "flash_attention", default=None,
              help="Fused (flash) attention, the default; --no-flash-attention: unfused (Megatron 2021-22).")
@ATTENTION_KERNEL_OPTION
@DOCUMENT_LENGTH_OPTION
@POWER_LIMIT_OPTION
@SCALEOUT_OPTION
@click.option("--moe-load-factor", type=float, metavar="F",
              help="MoE routing imbalance: the busiest EP rank's token-expert pairs over the mean (default 1).")
@click.option("--tp-values", "tp", help="TP sizes to try, e.g. 1,2,4,8 (default: powers of two in a scale-up domain).")
@click.option("--pp-values", "pp")
@click.option("--vpp-values", "vpp")
@click.option("--cp-values", "cp")
@click.option("--ep-values", "ep")
@click.option("--etp-values", "etp")
@click.option("--mbs-values", "mbs_list")
@click.option("--schedules", help="Schedules to try, comma-separated (default: every installed schedule).")
@click.option("--features", help="Features to search, comma-separated (default: every tunable installed feature).")
@click.option("--objective", type=click.Choice(OBJECTIVES), default="step_time", show_default=True)
@click.option("--top", "--top-k", "top", type=click.IntRange(1, 1000), default=10, show_default=True,
              help="Configurations to list.")
@click.option("--pareto", is_flag=True, help="Also report the Pareto front of step time vs peak memory.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv", "markdown", "megatron"]), default="table",
              show_default=True)
@click.option("--trace-best", "trace_best", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE.json",
              help="Also write the best configuration's step as a Chrome trace-event timeline (ui.perfetto.dev).")
@click.option("--lighter-ends-values", "lighter_ends",
              help="Layers fewer on the first and last pipeline stage than on the middle ones, e.g. 0,1 "
                   "(default 0,1: Megatron's split, and one layer lighter where that divides).")
@click.option("--lighter-last-values", "lighter_last",
              help="Layers fewer on the last pipeline stage than on the first (its output layer, loss and MTP "
                   "modules), e.g. 0,3 (default 0 to 1 + 2 × the model's MTP modules).")
@click.option("--time-budget", type=click.FloatRange(min=0.0, min_open=True), metavar="SECONDS",
              help="Stop after SECONDS and print the best found so far (labelled: not proven optimal); with "
                   "nothing that fits yet, dive for one for at most as long again (10 s at least).")
@click.option("--memory-headroom-gib", "memory_headroom", type=click.FloatRange(min=0.0), metavar="GIB",
              help="HBM per GPU every configuration must leave free, for the allocator's fragmentation and the "
                   "memory estimate's error (default: the job's [search] memory_headroom_gib, else 0).")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on a terminal, a line on stderr every few seconds otherwise (default: on).")
@NUM_LAYERS_OPTION
@pass_state
def tune_cmd(state, job_files, model, hardware, gpus, gbs, seq, precision, tokens, flash_attention, attention_kernel,
             document_length, power_limit_w, scaleout_bandwidth_gbps, moe_load_factor, tp,
             pp, vpp, cp, ep, etp, mbs_list, schedules, features, objective, top, pareto, fmt, trace_best, lighter_ends,
             lighter_last, time_budget, memory_headroom, progress, num_layers=None):
    """Find the best parallel strategy and features for a model, GPUs and global batch.

    Searches TP × PP × VPP × CP × EP × ETP × micro-batch × schedule × every feature's
    options, prunes with every plugin's constraints and the paper's rules, and prints the
    top configurations with the paper's Table 6 columns (or Megatron-LM arguments).
    """
    flags = dict(model=model, hardware=hardware, gpus=gpus, gbs=gbs, seq=seq, precision=precision, tokens=tokens,
                 moe_load_factor=moe_load_factor, flash_attention=flash_attention, num_layers=num_layers,
                 attention_kernel=attention_kernel, power_limit_w=power_limit_w, document_length=document_length,
                 scaleout_bandwidth_gbps=scaleout_bandwidth_gbps)
    if len(job_files) > 1:
        raise ConfigError("mofa tune takes one job file")
    req, job = build_request(state, list(job_files), {k: v for k, v in flags.items()},
                             tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, mbs_list=mbs_list, schedules=schedules,
                             features=features, objective=objective, top=top, pareto=pareto,
                             lighter_ends=lighter_ends, lighter_last=lighter_last, time_budget=time_budget,
                             memory_headroom=memory_headroom)
    if progress is False:
        result = tune(state.predictor(), req)
    elif sys.stderr.isatty():
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        with Progress("[progress.description]{task.description}", BarColumn(), TextColumn("{task.fields[what]}"),
                      TimeElapsedColumn(), TimeRemainingColumn(), transient=True) as bar:
            task = bar.add_task("searching", total=1.0, what="")

            def show(p):
                best = "" if p.best is None else f", best {p.best:.4g}"
                tight = f", memory-tight: {p.feasible:,} of {p.reached:,} fit" if p.memory_tight else ""
                bar.update(task, completed=p.fraction, what=f"{p.evaluated:,} evaluated, "
                                                            f"{p.skipped:,} ruled out{best}{tight}")
            result = tune(state.predictor(), req, progress=show)
    else:
        result = tune(state.predictor(), req, progress=_ProgressLine())
    if not result.best:
        raise ConfigError(result.why_empty())
    reg = state.pm.registry
    if trace_best is not None:
        from ..cli import write_trace_outputs

        write_trace_outputs(state.predictor(), candidate_job(job, result.best[0], reg), trace_best, None, False)
    if not result.proven_optimal and fmt not in ("table", "markdown"):
        click.echo(f"mofa tune: time budget reached after {result.elapsed_s:.1f} s: the best found so far, not proven "
                   f"optimal ({result.unexplored:,} candidates not explored)", err=True)
    line, notes = megatron_arguments(req.model, result.best[0], reg, req.hardware)
    env = megatron_environment(req.model, result.best[0], reg, req.hardware)
    if fmt == "json":
        _emit_json({"model": req.model.name, "hardware": req.hardware.name, "num_gpus": req.num_gpus,
                    "power_limit_w": float(req.hardware.compute.power_limit_w),
                    "scaleout_bandwidth_gbps": own_network(req.hardware.interconnect.scaleout_bandwidth_gbps,
                                                           reg.hardware_profile(req.hardware.name)), "objective": req.objective,
                    "evaluated": result.evaluated, "feasible": result.feasible,
                    "space_size": result.space_size, "elapsed_s": result.elapsed_s,
                    "candidates_per_s": result.candidates_per_s, "removed_by": result.removed_by,
                    "skipped_by_bound": result.skipped_by_bound, "ruled_out_by_memory_floor": result.floored,
                    "proven_optimal": result.proven_optimal,
                    "memory_headroom_gib": result.memory_headroom_gib,
                    "unexplored": result.unexplored,
                    "best": [c.to_dict() for c in result.best], "pareto": [c.to_dict() for c in result.pareto],
                    "megatron_args": line, "megatron_env": env.to_dict(), "megatron_env_reasons": dict(env.reasons),
                    "megatron_notes": notes + list(env.notes)})
    elif fmt == "csv":
        rows = [_row(c, reg) for c in result.best]
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
        click.echo(buf.getvalue(), nl=False)
    elif fmt == "megatron":
        click.echo("\n".join(launch_lines(line, notes, env)))
    else:
        _print_table(result, req, reg, fmt)
        click.echo("Megatron-LM: " + " ".join(line) + "".join(f"\n  note: {n}" for n in notes))
        if env.settings:
            click.echo("environment: " + "; ".join(env.shell())
                       + "".join(f"\n  {k}: {env.reasons[k]}" for k in sorted(env.settings))
                       + "".join(f"\n  note: {n}" for n in env.notes))
