"""``mofa e2e``: end-to-end training time, failures, checkpointing and ETTR (paper §3.4, §4.2)."""

from __future__ import annotations

import math
from pathlib import Path

import attrs
import click
import numpy as np

from ..cli import _emit_json, _table, job_options, load_jobs, pass_state
from ..e2e import E2EInputs, E2EResult, e2e_inputs, e2e_time
from ..config import TOMLDecodeError, evolved, toml_loads
from ..errors import ConfigError
from ..limits import LIMITS, check
from ._figure import figure, written_path

#: --sweep factor → (e2e_time keyword, parser, minimum, strict, label)
SWEEP_FACTORS = {
    "interval": ("checkpoint_interval_steps", int, 1, False, "checkpoint interval (steps)"),
    "failure_rate": ("node_failures_per_day", float, 0.0, False, "failures per node per day"),
    "nodes": ("num_gpus", int, 1, False, "nodes"),
    "recovery_time": ("mttr_s", float, 0.0, False, "MTTR (s)"),
    "save_time": ("checkpoint_save_s", float, 0.0, False, "checkpoint save time (s)"),
}


#: --sweep factor → the job-file field whose bound its values pass
SWEEP_BOUNDS = {"interval": "fault.checkpoint_interval_steps", "failure_rate": "fault.node_failures_per_day",
                "nodes": "hardware.num_gpus", "recovery_time": "fault.init_s", "save_time": "fault.checkpoint_save_s"}


def parse_sweep(text: str) -> tuple[str, list[float]]:
    """``FACTOR=v1,v2,...`` → (factor, values); ConfigError names the problem."""
    factor, eq, rest = text.partition("=")
    factor = factor.strip().replace("-", "_")
    if not eq or factor not in SWEEP_FACTORS:
        raise ConfigError(f"--sweep {text}: expected FACTOR=v1,v2,... with FACTOR one of "
                          f"{', '.join(SWEEP_FACTORS)}")
    _, kind, minimum, _, _ = SWEEP_FACTORS[factor]
    values = []
    for item in filter(None, (x.strip() for x in rest.split(","))):
        try:
            x = float(item)
        except ValueError:
            raise ConfigError(f"--sweep {factor}: {item!r} is not a number") from None
        if not math.isfinite(x) or x < minimum or (kind is int and not x.is_integer()):
            what = "an integer" if kind is int else "a number"
            raise ConfigError(f"--sweep {factor}: values must be {what} ≥ {minimum:g}, got {item}")
        try:
            check(LIMITS[SWEEP_BOUNDS[factor]], factor, kind(x))
        except ValueError as exc:
            raise ConfigError(f"--sweep {str(exc).replace(repr(factor) + ':', factor + ':')}") from None
        values.append(kind(x))
    if not values:
        raise ConfigError(f"--sweep {factor}: give at least one value, e.g. {factor}=1,2,4")
    return factor, values


def _fault_option(text: str) -> tuple[str, object]:
    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        raise ConfigError(f"--fault-option {text}: expected KEY=VALUE, e.g. pod_probability=0.5")
    try:
        val = toml_loads(f"v = {value.strip()}")["v"]
    except TOMLDecodeError:
        val = value.strip()
    return key.strip(), val


def apply_overrides(job, *, tokens, interval, failure_rate, save_s, init_s, policy, async_checkpoint, fault_options):
    """The job with the command line's end-to-end flags applied; ConfigError on bad values."""
    if tokens is not None:
        if not (tokens > 0 and math.isfinite(tokens)):
            raise ConfigError(f"--tokens must be > 0, got {tokens:g}")
        job = attrs.evolve(job, training=evolved(job.training, "--tokens: training", tokens=float(tokens)))
    changes: dict = {}
    if interval is not None:
        if interval < 1:
            raise ConfigError(f"--interval must be ≥ 1 step, got {interval} (leave it out for the optimal interval)")
        changes["checkpoint_interval_steps"] = interval
    for flag, key, value in (("--failure-rate", "node_failures_per_day", failure_rate),
                             ("--save-s", "checkpoint_save_s", save_s), ("--init-s", "init_s", init_s)):
        if value is not None:
            if not (value >= 0 and math.isfinite(value)):
                raise ConfigError(f"{flag} must be a number ≥ 0, got {value:g}")
            changes[key] = float(value)
    if policy is not None:
        changes["policy"] = policy
    if async_checkpoint is not None:
        changes["async_checkpoint"] = async_checkpoint
    if fault_options:
        changes["options"] = {**job.fault.options, **dict(_fault_option(o) for o in fault_options)}
    if changes:
        job = attrs.evolve(job, fault=evolved(job.fault, "command line: fault", **changes))
    return job


def _json_safe(obj):
    """inf/nan → null: strict JSON has no Infinity (``diverged`` says why a total is missing)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(x) for k, x in obj.items()}
    if isinstance(obj, list):
        return [_json_safe(x) for x in obj]
    return obj


def _days(x: float) -> str:
    return "∞ (diverged)" if not math.isfinite(x) else f"{x:,.2f}"


def _pct(x: float, diverged: bool) -> str:
    return "0 (diverged)" if diverged else f"{x:.4%}"


def _bytes(n: float) -> str:
    """A checkpoint's size in TB, or GB below 0.1 TB (a LoRA checkpoint holds only its adapters)."""
    return f"{n / 1e12:.2f} TB" if n >= 1e11 else f"{n / 1e9:.2f} GB"


def _summary_rows(inputs: E2EInputs, r: E2EResult, fits: bool | None) -> list[list[str]]:
    fit_note = "  (does NOT fit in memory)" if fits is False else ""
    rows = [
        ["step time", f"{r.step_time_s:.3f} s{fit_note}"],
        ["steps (N_step)", f"{r.num_steps:,}"],
        ["nodes", f"{r.num_nodes:,} × {inputs.gpus_per_node} GPUs"],
        ["failure rate", f"{r.node_failures_per_day:g} per node per day"],
        ["expected failures", "∞" if r.diverged else f"{r.failures:,.1f}"],
        ["MTTR", f"{r.mttr_s:.1f} s ({inputs.policy})"],
        ["checkpoint save", f"{r.checkpoint_save_s:.3f} s ({inputs.checkpoint_save_source}; "
                            f"checkpoint {_bytes(inputs.checkpoint_bytes)})"],
        ["init", f"{r.init_s:.1f} s ({inputs.init_source})"],
        ["checkpoint interval", f"{r.checkpoint_interval_steps:,} steps"
                                + (" (optimal)" if inputs.checkpoint_interval_steps == 0 else "")],
        ["optimal interval", f"{r.optimal_interval_steps:,} steps"],
        ["ETTR", _pct(r.ettr, r.diverged)],
        ["effective time", f"{_days(r.effective_time_s / 86400)} days"],
        ["interruptions", f"{_days(r.interruption_time_s / 86400)} days (init {r.init_s / 86400:.3f}, recovery "
                          f"{_days(r.recovery_time_s / 86400)}, checkpoints {_days(r.checkpoint_time_s / 86400)})"],
        ["total time", f"{_days(r.total_days)} days"],
        ["GPU-hours", "∞" if r.diverged else f"{r.gpu_hours:,.0f}"],
    ]
    return rows


def _sweep(inputs: E2EInputs, step_s: float, factor: str, values: list) -> E2EResult:
    key = SWEEP_FACTORS[factor][0]
    kwargs = inputs.model_kwargs()
    arr = np.asarray(values, dtype=np.float64)
    kwargs[key] = arr * inputs.gpus_per_node if factor == "nodes" else arr
    return e2e_time(np.full(len(values), step_s), **kwargs)


def _plot(path: Path, factor: str, values: list, r: E2EResult, title: str) -> None:
    with figure(path) as (_, ax):
        ax.plot(values, np.asarray(r.ettr) * 100.0, marker="o")
        ax.set_xlabel(SWEEP_FACTORS[factor][4])
        ax.set_ylabel("ETTR (%)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)


@click.command("e2e")
@click.argument("job_files", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
@job_options
@click.option("--interval", type=int, help="Checkpoint interval in steps (default: [fault] or the optimal, eq. [44]).")
@click.option("--failure-rate", type=float, help="Failures per node per day (λ).")
@click.option("--save-s", type=float, help="Seconds one checkpoint save stalls training.")
@click.option("--init-s", type=float, help="Job initialisation time, seconds.")
@click.option("--policy", help="Fault-recovery policy (three-level, job-restart, ...).")
@click.option("--async-checkpoint/--sync-checkpoint", default=None,
              help="Only the GPU→host snapshot stalls training (derived save time).")
@click.option("--fault-option", "fault_options", multiple=True, metavar="KEY=VALUE",
              help="An option of the fault policy, e.g. pod_probability=0.5 (repeatable).")
@click.option("--step-s", type=float, help="Use this step time instead of predicting it.")
@click.option("--sweep", "sweep", metavar="FACTOR=v1,v2,...",
              help=f"Vary one factor: {', '.join(SWEEP_FACTORS)} (others held constant).")
@click.option("--plot", "plot", type=click.Path(dir_okay=False, path_type=Path),
              help="With --sweep: draw ETTR against the factor into FILE.png (needs matplotlib).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv", "markdown"]), default="table",
              show_default=True)
@pass_state
def e2e(state, job_files, interval, failure_rate, save_s, init_s, policy, async_checkpoint, fault_options, step_s,
        sweep, plot, fmt, **flags):
    """End-to-end time of JOB_FILES: expected failures, MTTR, optimal checkpoint interval, ETTR,
    total days and GPU-hours (paper §3.4, eqs. [36]-[44])."""
    # --tokens applies to job files too (load_jobs rejects files + job flags), so take it out
    tokens, flags["tokens"] = flags["tokens"], None
    if plot is not None and sweep is None:
        raise ConfigError("--plot draws a sweep: give --sweep FACTOR=v1,v2,... too")
    if step_s is not None and not (step_s > 0 and math.isfinite(step_s)):
        raise ConfigError(f"--step-s must be > 0, got {step_s:g}")
    sweep_spec = parse_sweep(sweep) if sweep is not None else None
    jobs = load_jobs(state, job_files, flags)
    if sweep_spec and len(jobs) != 1:
        raise ConfigError("--sweep takes exactly one job")
    jobs = [apply_overrides(j, tokens=tokens, interval=interval, failure_rate=failure_rate, save_s=save_s,
                            init_s=init_s, policy=policy, async_checkpoint=async_checkpoint,
                            fault_options=fault_options) for j in jobs]
    predictor = state.predictor()
    inputs = [e2e_inputs(j, predictor.registry) for j in jobs]
    if step_s is None:
        preds = predictor.predict(jobs)
        steps, fits = [p.step_time_s for p in preds], [p.fits_in_memory for p in preds]
    else:
        steps, fits = [step_s] * len(jobs), [None] * len(jobs)

    if sweep_spec:
        factor, values = sweep_spec
        job, inp, st = jobs[0], inputs[0], steps[0]
        r = _sweep(inp, st, factor, values)
        rows = [{factor: v, **{k: vals[i] for k, vals in r.to_dict().items()}} for i, v in enumerate(values)]
        if plot is not None:
            _plot(plot, factor, values, r, f"{job.name}: ETTR vs {SWEEP_FACTORS[factor][4]}")
        if fmt == "json":
            _emit_json(_json_safe({"job": job.name, "policy": inp.policy, "sweep": factor, "rows": rows}))
        else:
            show_interval = factor != "interval"
            _table([[f"{v:g}", *([f"{row['checkpoint_interval_steps']:,}"] if show_interval else []),
                     "∞" if row["diverged"] else f"{row['failures']:,.1f}", _pct(row["ettr"], row["diverged"]),
                     _days(row["total_days"]), "∞" if row["diverged"] else f"{row['gpu_hours']:,.0f}"]
                    for v, row in zip(values, rows)],
                   [SWEEP_FACTORS[factor][4], *(["interval (steps)"] if show_interval else []), "failures", "ETTR",
                    "total days", "GPU-hours"],
                   title=f"{job.name}: sweep of {factor} (step {st:.3f} s, others held constant)", fmt=fmt)
        if plot is not None:
            click.echo(f"plot written to {written_path(plot)}", err=fmt in ("json", "csv"))
        return

    results = [e2e_time(st, **inp.model_kwargs()) for st, inp in zip(steps, inputs)]
    if fmt == "json":
        out = [{"job": j.name, "policy": inp.policy, "tokens": j.training.tokens,
                "checkpoint_bytes": inp.checkpoint_bytes, "checkpoint_save_source": inp.checkpoint_save_source,
                "init_source": inp.init_source, "fits_in_memory": fit, **r.to_dict()}
               for j, inp, r, fit in zip(jobs, inputs, results, fits)]
        _emit_json(_json_safe(out if len(out) > 1 else out[0]))
        return
    for j, inp, r, fit in zip(jobs, inputs, results, fits):
        _table(_summary_rows(inp, r, fit), ["quantity", "value"],
               title=f"{j.name}: {j.model.name} on {j.num_gpus} × {j.hardware.name}, {j.training.tokens:.4g} tokens",
               fmt=fmt)
