"""The ``mofa`` command line.

Every user error is one line on stderr and exit status 2; no traceback unless ``MOFA_DEBUG=1``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import tomllib
from pathlib import Path

import attrs
import click

from . import __version__
from .errors import ConfigError, MofaError
from .manager import ENV_DISABLED, MofaPluginManager, get_plugin_manager

FORMATS = ("table", "json")


class MofaGroup(click.Group):
    """Turns MoFa errors into one line and exit status 2, everywhere."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except MofaError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(2)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except Exception as exc:  # noqa: BLE001
            if os.environ.get("MOFA_DEBUG"):
                raise
            click.echo(f"internal error: {type(exc).__name__}: {exc} (set MOFA_DEBUG=1 for the traceback and "
                       "please report it)", err=True)
            ctx.exit(1)


@attrs.define
class State:
    disabled: tuple[str, ...] = ()
    strict: bool | None = None
    trace: bool | None = None
    _pm: MofaPluginManager | None = None
    _warned: bool = False

    @property
    def pm(self) -> MofaPluginManager:
        if self._pm is None:
            self._pm = get_plugin_manager(disabled=self.disabled, strict=self.strict, trace=self.trace, fresh=True)
        return self._pm

    def predictor(self):
        from .api import Predictor

        pred = Predictor(pm=self.pm)
        pred.registry  # noqa: B018 - collecting records may mark more plugins failed
        for info in [] if self._warned else self.pm.infos.values():
            if info.status == "failed":  # the rest still works; say once what is missing
                click.echo(f"warning: plugin {info.name!r} is not in use: {info.error} "
                           "(see `mofa list-plugins`; --strict-plugins makes this an error)", err=True)
        self._warned = True
        return pred



pass_state = click.make_pass_decorator(State)


@click.group(cls=MofaGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="mofa")
@click.option("--disable-plugin", "disabled", multiple=True, metavar="NAME",
              help=f"Do not load plugin NAME (repeatable; also ${ENV_DISABLED}, comma-separated).")
@click.option("--strict-plugins", is_flag=True, default=None,
              help="Fail (exit 2) if any plugin fails to load or conflicts (also $MOFA_STRICT_PLUGINS=1).")
@click.option("--trace-plugins", is_flag=True, default=None, help="Trace every hook call to stderr.")
@click.pass_context
def cli(ctx, disabled, strict_plugins, trace_plugins):
    """MoFa: predict, explain and tune LLM pretraining performance."""
    ctx.obj = State(disabled=tuple(disabled), strict=strict_plugins, trace=trace_plugins)


def _emit_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


def _table(rows: list[list[str]], headers: list[str], title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, show_lines=False, header_style="bold")
    for h in headers:
        t.add_column(h, overflow="fold")
    for r in rows:
        t.add_row(*[str(x) for x in r])
    Console(width=max(120, shutil.get_terminal_size((120, 24)).columns)).print(t)


# ---------------------------------------------------------------------- list-*


@cli.command("list-plugins")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@pass_state
def list_plugins(state: State, fmt):
    """Installed plugins: distribution, status, hooks and the records each provides."""
    pm = state.pm
    reg = pm.registry  # collecting records may mark plugins failed
    provides: dict[str, dict[str, list[str]]] = {}
    for (kind, name), plugin in reg.provided_by.items():
        provides.setdefault(plugin, {}).setdefault(kind, []).append(name)
    rows = []
    for name in sorted(pm.infos):
        info = pm.infos[name]
        status = info.status
        if status == "active" and info.builtin:
            status = "builtin"
        rows.append({
            "name": info.name, "distribution": info.distribution, "version": info.version,
            "entry_point": info.entry_point, "status": status, "hooks": pm.plugin_hooks(name),
            "provides": {k: sorted(v) for k, v in provides.get(name, {}).items()}, "error": info.error,
        })
    if fmt == "json":
        _emit_json(rows)
    else:
        _table([[r["name"], r["distribution"], r["version"], r["status"], ", ".join(r["hooks"]) or "—",
                 "; ".join(f"{k}: {', '.join(v) if len(v) <= 4 else f'{len(v)} records'}"
                           for k, v in r["provides"].items()) or "—"] for r in rows],
               ["name", "distribution", "version", "status", "hooks", "provides"])
        click.echo("* wrapper   † tryfirst   ‡ trylast")
        failed = [r for r in rows if r["status"] == "failed"]
        for r in failed:
            click.echo(f"failed: {r['name']}: {r['error']}")
        for p in reg.problems:
            click.echo(f"problem: {p}")
    if pm.strict and any(r["status"] == "failed" for r in rows):
        raise ConfigError("a plugin failed to load (strict mode)")


@cli.command("list-hardware")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@pass_state
def list_hardware(state: State, fmt):
    """Hardware profiles: peak TFLOPS, HBM, bandwidths, node size."""
    reg = state.pm.registry
    rows = []
    for name, hw in sorted(reg.hardware.items()):
        rows.append({
            "name": name, "display_name": hw.display_name, "plugin": reg.provided_by.get(("hardware", name)),
            "peak_tflops": dict(hw.compute.peak_tflops), "hbm_gib": hw.memory.hbm_gib,
            "hbm_bandwidth_gbps": hw.memory.hbm_bandwidth_gbps, "gpus_per_node": hw.gpus_per_node,
            "scaleup_domain_gpus": hw.interconnect.scaleup_domain_gpus,
            "scaleup_bandwidth_gbps": hw.interconnect.scaleup_bandwidth_gbps,
            "scaleout_bandwidth_gbps": hw.interconnect.scaleout_bandwidth_gbps, "aliases": list(hw.aliases),
            "source": hw.source,
        })
    if fmt == "json":
        _emit_json(rows)
    else:
        _table([[r["name"], r["peak_tflops"].get("bf16"), r["peak_tflops"].get("fp8", "—"), r["hbm_gib"],
                 r["hbm_bandwidth_gbps"], r["scaleup_domain_gpus"], r["scaleup_bandwidth_gbps"],
                 r["scaleout_bandwidth_gbps"], r["plugin"]] for r in rows],
               ["name", "bf16 TFLOPS", "fp8 TFLOPS", "HBM GiB", "HBM GB/s", "scale-up GPUs", "scale-up GB/s",
                "scale-out GB/s", "plugin"])


@cli.command("list-models")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@pass_state
def list_models(state: State, fmt):
    """Model architectures in the zoo (and from plugins)."""
    from .decompose import total_params

    reg = state.pm.registry
    rows = []
    for name, m in sorted(reg.models.items()):
        counts = total_params(m)
        rows.append({"name": name, "display_name": m.display_name, "plugin": reg.provided_by.get(("models", name)),
                     "params_b": round(counts["total"] / 1e9, 2), "active_params_b": round(counts["active"] / 1e9, 2),
                     **{k: v for k, v in attrs.asdict(m, recurse=False).items()
                        if k not in ("name", "display_name", "notes", "source", "aliases")},
                     "activation": m.activation.value, "aliases": list(m.aliases), "source": m.source})
    if fmt == "json":
        _emit_json(rows)
    else:
        _table([[r["name"], r["params_b"], r["active_params_b"], r["num_layers"], r["hidden_size"],
                 f"{r['num_attention_heads']}/{r['num_kv_heads']}", r["num_experts"] or "—", r["vocab_size"],
                 r["plugin"]] for r in rows],
               ["name", "params (B)", "active (B)", "layers", "hidden", "heads/kv", "experts", "vocab", "plugin"])


# ---------------------------------------------------------------------- predict


def parse_feature_flag(text: str) -> tuple[str, dict]:
    """``NAME[:key=value,...]`` → (name, options); values are read as TOML scalars."""
    name, _, rest = text.partition(":")
    opts: dict = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"--feature {text}: expected key=value after ':', got {item!r}")
        try:
            opts[key.strip()] = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            opts[key.strip()] = value.strip()
    return name.strip(), opts


def job_dict_from_flags(model, hardware, gpus, tp, pp, vpp, cp, ep, etp, mbs, gbs, seq, precision, schedule,
                        sequence_parallel, features, tokens, moe_load_factor=None, flash_attention=None) -> dict:
    if not (model and hardware and gpus and gbs and seq):
        raise ConfigError("give a job file, or --model, --hardware, --gpus, --gbs and --seq")
    model_section = {"config": model} if model.endswith(".json") else {"name": model}
    if moe_load_factor is not None:
        model_section["moe_load_factor"] = moe_load_factor
    par = {k: v for k, v in dict(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, micro_batch_size=mbs,
                                  global_batch_size=gbs, sequence_length=seq, precision=precision,
                                  sequence_parallel=sequence_parallel, flash_attention=flash_attention).items()
           if v is not None}
    data = {"name": "cli", "model": model_section, "hardware": {"name": hardware, "num_gpus": gpus}, "parallel": par}
    if schedule:
        data["pipeline"] = {"schedule": schedule}
    if features:
        data["features"] = dict(parse_feature_flag(f) for f in features)
    if tokens:
        data["training"] = {"tokens": tokens}
    return data


def job_options(f):
    """The flags that describe a job without a file (shared by predict, e2e and tune)."""
    opts = [
        click.option("--model", help="Zoo model name, alias, or a HuggingFace config.json."),
        click.option("--hardware", help="Hardware profile name (see `mofa list-hardware`)."),
        click.option("--gpus", type=int, help="Number of GPUs."),
        click.option("--tp", type=int), click.option("--pp", type=int), click.option("--vpp", type=int),
        click.option("--cp", type=int), click.option("--ep", type=int), click.option("--etp", type=int),
        click.option("--mbs", type=int, help="Micro-batch size."),
        click.option("--gbs", type=int, help="Global batch size (sequences)."),
        click.option("--seq", type=int, help="Sequence length."),
        click.option("--precision", type=click.Choice(["bf16", "fp16", "fp8", "fp4"])),
        click.option("--schedule", help="Pipeline schedule (see `mofa list-plugins`)."),
        click.option("--sequence-parallel/--no-sequence-parallel", default=None),
        click.option("--flash-attention/--no-flash-attention", default=None,
                     help="Fused (flash) attention kernels, the default; --no-flash-attention prices the unfused "
                          "core attention of Megatron 2021-22 runs, keeping the s×s scores ([parallel] "
                          "flash_attention)."),
        click.option("--feature", "features", multiple=True, metavar="NAME[:key=value,...]",
                     help="Enable a feature plugin with options (repeatable)."),
        click.option("--tokens", type=float, help="Tokens to train on (end-to-end time)."),
        click.option("--moe-load-factor", type=float, metavar="F",
                     help="MoE routing imbalance: the busiest EP rank's token-expert pairs over the mean "
                          "(default 1, balanced; the model's moe_load_factor)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def load_jobs(state: State, files, flags: dict) -> list:
    predictor = state.predictor()
    jobs = [predictor.load_job(p) for p in files]
    if any(v not in (None, (), False) for v in flags.values()) or not files:
        if files:
            raise ConfigError("give either job files or job flags (--model ...), not both")
        jobs.append(predictor.job(job_dict_from_flags(**flags), name="cli"))
    return jobs


def _fmt_s(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


def print_prediction(r) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=110)
    p = r.parallel
    head = (f"[bold]{r.job}[/]: {r.model} on {r.num_gpus} × {r.hardware} — TP{p['tp']} PP{p['pp']} VPP{p['vpp']} "
            f"CP{p['cp']} EP{p['ep']} DP{p['dp']}, mbs {p['micro_batch_size']}, gbs {p['global_batch_size']}, "
            f"seq {p['sequence_length']}, {p['precision']}, schedule {r.schedule}, "
            f"features: {', '.join(r.features) or 'none'}")
    con.print(head)
    fit = "[green]fits[/]" if r.fits_in_memory else "[red]does NOT fit[/]"
    con.print(f"step {_fmt_s(r.step_time_s)} · {r.tokens_per_s_per_gpu:,.0f} tokens/s/GPU · "
              f"{r.model_tflops_per_gpu:.0f} model TFLOPS/GPU · MFU {r.mfu:.1%} · HFU {r.hfu:.1%} · "
              f"peak memory {r.peak_memory_gib:.1f} / {r.hbm_gib:.0f} GiB ({fit})")
    t = Table(title="step time breakdown (critical pipeline stage)", header_style="bold")
    t.add_column("component")
    t.add_column("time", justify="right")
    t.add_column("share", justify="right")
    t.add_column("from")
    for k, v in r.breakdown.items():
        if abs(v) > 0:
            t.add_row(k, _fmt_s(v), f"{v / r.step_time_s:.1%}", r.provenance.get(k, ""))
    t.add_row("[bold]step[/]", f"[bold]{_fmt_s(r.step_time_s)}[/]", "100%", "")
    m = Table(title="memory per GPU (worst stage)", header_style="bold")
    m.add_column("component")
    m.add_column("GiB", justify="right")
    for k, v in r.memory_breakdown.items():
        if abs(v) > 0 and k != "host":
            m.add_row(k, f"{v:.2f}")
    m.add_row("[bold]peak[/]", f"[bold]{r.peak_memory_gib:.2f}[/]")
    if r.memory_breakdown.get("host"):
        m.add_row("host (CPU, not in peak)", f"{r.memory_breakdown['host']:.2f}")
    con.print(t)
    con.print(m)
    ph = r.pipeline_phases
    con.print(f"pipeline phases: warmup {_fmt_s(ph['warmup'])}, steady {_fmt_s(ph['steady'])}, "
              f"cooldown {_fmt_s(ph['cooldown'])}")


@cli.command()
@click.argument("job_files", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
@job_options
@click.option("--format", "fmt", type=click.Choice(["table", "json", "jsonl"]), default="table", show_default=True)
@pass_state
def predict(state: State, job_files, fmt, **flags):
    """Predict step time, throughput, MFU and memory for JOB_FILES (or a job given by flags)."""
    jobs = load_jobs(state, job_files, flags)
    results = state.predictor().predict(jobs)
    if fmt == "json":
        _emit_json([r.to_dict() for r in results] if len(results) > 1 else results[0].to_dict())
    elif fmt == "jsonl":
        for r in results:
            click.echo(json.dumps(r.to_dict(), default=str))
    else:
        for r in results:
            print_prediction(r)


def assemble() -> click.Group:
    """The CLI with commands from plugins (``mofa_register_commands``) added."""
    pm = get_plugin_manager(fresh=True)
    try:
        pm.hook.mofa_register_commands(cli=cli)
    except Exception as exc:  # noqa: BLE001 - a broken plugin must not take the CLI down
        click.echo(f"warning: a plugin failed to add commands: {type(exc).__name__}: {exc}", err=True)
    return cli


@functools.cache
def _builtin_commands() -> None:
    from .commands import register_builtin_commands

    register_builtin_commands(cli)


def main() -> None:
    _builtin_commands()
    assemble()(prog_name="mofa")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
