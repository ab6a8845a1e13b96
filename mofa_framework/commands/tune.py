"""``mofa tune``: search parallel strategies and features for the best step or E2E time."""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

import attrs
import click

from ..cli import _emit_json, _fmt_s, load_jobs, pass_state
from ..errors import ConfigError
from ..limits import LIMITS, check, short
from ..tuner import OBJECTIVES, SearchSpace, TuneRequest, default_space, feature_choices, megatron_arguments, tune


def _ints(text: str | None, flag: str) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{flag}: expected comma-separated integers, e.g. 1,2,4,8; got {short(text)}") from None
    if not vals or min(vals) < 1:
        raise ConfigError(f"{flag}: values must be integers ≥ 1, got {short(text)}")
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


def _names(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(x.strip() for x in text.split(",") if x.strip())


def build_request(state, job_files, flags, *, tp, pp, vpp, cp, ep, etp, mbs_list, schedules, features,
                  objective, top, pareto) -> tuple[TuneRequest, object]:
    """A TuneRequest from a job file (its [search] table) or flags; flags override the file."""
    flags = dict(flags)
    for k in ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs"):
        flags.setdefault(k, None)
    flags.setdefault("schedule", None)
    flags.setdefault("sequence_parallel", None)
    flags.setdefault("features", ())
    if not job_files and not all(flags.get(k) for k in ("model", "hardware", "gpus", "gbs", "seq")):
        raise ConfigError("give a job file, or --model, --hardware, --gpus, --gbs and --seq")
    tokens = flags.pop("tokens", None)
    flash = flags.get("flash_attention")
    if job_files:
        if any(flags.get(k) for k in ("model", "hardware", "gpus", "gbs", "seq", "precision", "moe_load_factor")):
            raise ConfigError("give either a job file or --model/--hardware/--gpus/--gbs/--seq, not both "
                              "(a job file sets moe_load_factor under [model])")
        flags = {k: None if not isinstance(v, tuple) else () for k, v in flags.items()}
    job = load_jobs(state, job_files, {**flags, "tokens": None if job_files else tokens})[0]
    if tokens:
        job = attrs.evolve(job, training=attrs.evolve(job.training, tokens=tokens))
    if flash is not None:  # the flag also overrides a job file's [parallel] flash_attention
        job = attrs.evolve(job, parallel=attrs.evolve(job.parallel, flash_attention=flash))
    reg = state.pm.registry
    srch = job.search
    feats = _names(features) or srch.features
    if feats is None:
        feats = tuple(n for n, f in reg.features.items() if f.tunable)
    # the job's own features are held on even when they are not searched by default (fp8, cuda_graphs, ...)
    feats = tuple(dict.fromkeys((*feats, *job.features)))
    for f in feats:
        reg.feature(f, field="--features")
    base = default_space(reg, job.model, job.hardware, job.num_gpus, job.parallel.sequence_length, features=feats)
    pick = lambda cli_val, file_val, default: cli_val or file_val or default  # noqa: E731
    sched = _names(schedules) or srch.schedules or base.schedules
    for s in sched:
        reg.schedule(s, field="--schedules")
    sched = tuple(reg.schedule(s).name for s in sched)
    space = SearchSpace(
        tp=pick(_ints(tp, "--tp-values"), srch.tp, base.tp), pp=pick(_ints(pp, "--pp-values"), srch.pp, base.pp),
        vpp=pick(_ints(vpp, "--vpp-values"), srch.vpp, base.vpp), cp=pick(_ints(cp, "--cp-values"), srch.cp, base.cp),
        ep=pick(_ints(ep, "--ep-values"), srch.ep, base.ep), etp=pick(_ints(etp, "--etp-values"), srch.etp, base.etp),
        micro_batch_size=pick(_ints(mbs_list, "--mbs-values"), srch.micro_batch_size, base.micro_batch_size),
        schedules=sched,
        # a feature the job enables is fixed on with its options; the others are searched
        features={f: (feature_choices(reg, f, attrs.asdict(job.features[f]), allow_off=False)
                      if f in job.features else base.features[f]) for f in feats},
    )
    e2e = None
    if objective != "step_time":
        from ..e2e import e2e_inputs, e2e_time

        inputs = e2e_inputs(job, reg)
        kwargs = inputs.model_kwargs()
        e2e = lambda step, batch: e2e_time(step, **kwargs).total_time_s  # noqa: E731
    req = TuneRequest(model=job.model, hardware=job.hardware, num_gpus=job.num_gpus,
                      global_batch_size=job.parallel.global_batch_size, sequence_length=job.parallel.sequence_length,
                      precision=job.parallel.precision, space=space, objective=objective, top_k=top, e2e=e2e,
                      pareto=pareto, flash_attention=job.parallel.flash_attention)
    return req, job


def candidate_job(job, cand, reg):
    """`job` run as the tuner's candidate `cand`: its parallel layout, schedule and features."""
    from ..config import ParallelConfig

    names = {f.name for f in attrs.fields(ParallelConfig)}
    parallel = attrs.evolve(job.parallel, **{k: v for k, v in cand.parallel.items() if k in names})
    feats = {n: reg.features[n].options_type(**o) for n, o in cand.features.items()}
    return attrs.evolve(job, parallel=parallel, schedule=cand.schedule, features=feats)


def _row(c, reg) -> dict:
    p = c.parallel
    return {"rank": c.rank, "step_time_s": round(c.step_time_s, 4), "objective": c.objective_value,
            "memory_gib": round(c.peak_memory_gib, 2), "tflops_per_gpu": round(c.model_tflops_per_gpu, 1),
            "mfu": round(c.mfu, 4), "compute_s": round(c.compute_s, 4), "tp": p["tp"], "pp": p["pp"], "vpp": p["vpp"],
            "cp": p["cp"], "ep": p["ep"], "etp": p["etp"], "dp": p["dp"], "mbs": p["micro_batch_size"],
            "schedule": c.schedule, "tp_comm_s": round(c.tp_comm_s, 4), "pp_comm_s": round(c.pp_comm_s, 4),
            "dp_comm_s": round(c.dp_comm_s, 4), "optimizer_s": round(c.optimizer_s, 4),
            "features": ";".join(_feature_label(k, v, reg) for k, v in sorted(c.features.items()))}


def _feature_label(name: str, opts: dict, reg) -> str:
    """`name` or `name(option=value)` for the options that differ from their defaults."""
    if name in reg.features and attrs.has(reg.features[name].options_type):
        defaults = attrs.asdict(reg.features[name].options_type())
        opts = {k: v for k, v in opts.items() if defaults.get(k) != v}
    return f"{name}({','.join(f'{a}={b}' for a, b in opts.items())})" if opts else name


def _print_table(result, req, reg, fmt: str = "table") -> None:
    from rich.table import Table

    from ..cli import console, markdown_table

    con = console(160)
    rows = []
    con.print(f"[bold]{req.model.name}[/] on {req.num_gpus} × {req.hardware.name}, global batch "
              f"{req.global_batch_size}, sequence {req.sequence_length}, objective {req.objective}: "
              f"{result.evaluated:,} candidates evaluated of {result.space_size:,} in the space "
              f"({result.structures_feasible:,}/{result.structures:,} structures feasible), {result.feasible:,} fit, "
              f"{result.elapsed_s:.2f} s ({result.candidates_per_s:,.0f} candidates/s)")
    t = Table(header_style="bold")
    cols = ["rank", "step", "memory GiB", "TFLOPS", "MFU", "compute", "TP", "PP", "VPP", "CP", "EP", "DP", "mbs",
            "schedule", "TP comm", "PP comm", "DP comm", "optimizer", "features"]
    if req.objective != "step_time":
        cols.insert(2, "total" if req.objective == "e2e_time" else "GPU-hours")
    longest = max((len(x) for c in result.best for x in _row(c, reg)["features"].split(";")), default=8)
    for c in cols:
        t.add_column(c, overflow="fold", min_width=min(longest, 48) if c == "features" else None)
    for c in result.best:
        r = _row(c, reg)
        cells = [r["rank"], _fmt_s(c.step_time_s), f"{r['memory_gib']:.1f}", f"{r['tflops_per_gpu']:.0f}",
                 f"{c.mfu:.1%}", _fmt_s(c.compute_s), r["tp"], r["pp"], r["vpp"], r["cp"], r["ep"], r["dp"], r["mbs"],
                 r["schedule"], _fmt_s(c.tp_comm_s), _fmt_s(c.pp_comm_s), _fmt_s(c.dp_comm_s), _fmt_s(c.optimizer_s),
                 r["features"].replace(";", "\n")]
        if req.objective == "e2e_time":
            cells.insert(2, f"{c.objective_value / 86400:.2f} d")
        elif req.objective == "gpu_hours":
            cells.insert(2, f"{c.objective_value:,.0f}")
        rows.append([str(x) for x in cells])
        t.add_row(*rows[-1])
    if fmt == "markdown":
        click.echo(markdown_table(rows, cols))
    else:
        con.print(t)
    if result.pareto:
        con.print("Pareto front (step time vs peak memory): " + ", ".join(
            f"{_fmt_s(c.step_time_s)} @ {c.peak_memory_gib:.1f} GiB" for c in result.pareto))


@click.command("tune")
@click.argument("job_files", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--model", help="Zoo model name, alias, or a HuggingFace config.json.")
@click.option("--hardware", help="Hardware profile name.")
@click.option("--gpus", type=int, help="Number of GPUs.")
@click.option("--gbs", type=int, help="Global batch size (sequences).")
@click.option("--seq", type=int, help="Sequence length.")
@click.option("--precision", type=click.Choice(["bf16", "fp16", "fp8", "fp4"]))
@click.option("--tokens", type=float, help="Tokens to train on (needed by the e2e_time and gpu_hours objectives).")
@click.option("--flash-attention/--no-flash-attention", "flash_attention", default=None,
              help="Fused (flash) attention, the default; --no-flash-attention: unfused (Megatron 2021-22).")
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
@click.option("--top", type=click.IntRange(1, 1000), default=10, show_default=True)
@click.option("--pareto", is_flag=True, help="Also report the Pareto front of step time vs peak memory.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv", "markdown", "megatron"]), default="table",
              show_default=True)
@click.option("--trace-best", "trace_best", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE.json",
              help="Also write the best configuration's step as a Chrome trace-event timeline (ui.perfetto.dev).")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
@pass_state
def tune_cmd(state, job_files, model, hardware, gpus, gbs, seq, precision, tokens, flash_attention, moe_load_factor, tp,
             pp, vpp, cp, ep, etp, mbs_list, schedules, features, objective, top, pareto, fmt, trace_best, progress):
    """Find the best parallel strategy and features for a model, GPUs and global batch.

    Searches TP × PP × VPP × CP × EP × ETP × micro-batch × schedule × every feature's
    options, prunes with every plugin's constraints and the paper's rules, and prints the
    top configurations with the paper's Table 6 columns (or Megatron-LM arguments).
    """
    flags = dict(model=model, hardware=hardware, gpus=gpus, gbs=gbs, seq=seq, precision=precision, tokens=tokens,
                 moe_load_factor=moe_load_factor, flash_attention=flash_attention)
    if len(job_files) > 1:
        raise ConfigError("mofa tune takes one job file")
    req, job = build_request(state, list(job_files), {k: v for k, v in flags.items()},
                             tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, mbs_list=mbs_list, schedules=schedules,
                             features=features, objective=objective, top=top, pareto=pareto)
    show = sys.stderr.isatty() if progress is None else progress
    if show:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), transient=True) as bar:
            task = bar.add_task("searching", total=None)
            result = tune(state.predictor(), req, progress=lambda d, t: bar.update(task, completed=d, total=t))
    else:
        result = tune(state.predictor(), req)
    if not result.best:
        raise ConfigError(result.why_empty())
    reg = state.pm.registry
    if trace_best is not None:
        from ..cli import write_trace_outputs

        write_trace_outputs(state.predictor(), candidate_job(job, result.best[0], reg), trace_best, None, False)
    if fmt == "json":
        _emit_json({"model": req.model.name, "hardware": req.hardware.name, "num_gpus": req.num_gpus,
                    "objective": req.objective, "evaluated": result.evaluated, "feasible": result.feasible,
                    "space_size": result.space_size, "elapsed_s": result.elapsed_s,
                    "candidates_per_s": result.candidates_per_s, "removed_by": result.removed_by,
                    "best": [c.to_dict() for c in result.best], "pareto": [c.to_dict() for c in result.pareto],
                    "megatron_args": megatron_arguments(req.model, result.best[0], reg)[0],
                    "megatron_notes": megatron_arguments(req.model, result.best[0], reg)[1]})
    elif fmt == "csv":
        rows = [_row(c, reg) for c in result.best]
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
        click.echo(buf.getvalue(), nl=False)
    elif fmt == "megatron":
        args, notes = megatron_arguments(req.model, result.best[0], reg)
        for n in notes:
            click.echo(f"# {n}")
        click.echo(" \\\n".join(args))
    else:
        _print_table(result, req, reg, fmt)
        args, notes = megatron_arguments(req.model, result.best[0], reg)
        click.echo("Megatron-LM: " + " ".join(args) + "".join(f"\n  note: {n}" for n in notes))
