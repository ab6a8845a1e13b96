"""The ``mofa`` command line.

Every user error is one line on stderr and exit status 2; no traceback unless ``MOFA_DEBUG=1``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import click

from . import __version__
from .config import TOMLDecodeError, toml_loads
from .errors import ConfigError, MofaError
from .batch import ATTENTION_KERNELS
from .manager import ENV_DISABLED, MofaPluginManager, get_plugin_manager

FORMATS = ("table", "json", "csv", "markdown")
#: console width when the output is not a terminal: wide enough that no table wraps a cell
PIPE_WIDTH = 10_000
#: share of the HBM below which `mofa predict` calls a fit tight: MoFa's memory error on published peaks
#: (5 % on ZeroBubble's, 12 % on torchtitan's: docs/validation.md, docs/tuning.md *Memory headroom*)
MEMORY_ERROR_SHARE = 0.1


def add_subcommand(cli: click.Group, group: str, command: click.Command) -> None:
    """Add a plugin's `command` to the sub-group `group` of `cli` (from ``mofa_register_commands``):
    :meth:`MofaGroup.add_subcommand`, or the loaded group of a plain click group."""
    if isinstance(cli, MofaGroup):
        cli.add_subcommand(group, command)
    elif group in cli.commands:
        cli.commands[group].add_command(command)


class MofaGroup(click.Group):
    """Turns MoFa errors into one line and exit status 2, everywhere. Commands named in `lazy`
    (name → a function loading it) are imported when first asked for; an added command of the same
    name (a plugin's) comes first."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lazy: dict[str, Callable[[str], click.Command]] = {}

    def list_commands(self, ctx) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx, name: str) -> click.Command | None:
        if name not in self.commands and name in self.lazy:
            self.add_command(self.lazy[name](name), name)
        return super().get_command(ctx, name)

    def add_subcommand(self, group: str, command: click.Command) -> None:
        """Add `command` to the sub-group `group` (a plugin's ``mofa import torchtitan``, from its
        ``mofa_register_commands``): now if the group is loaded, else when it is first asked for,
        so other commands do not import the group's module."""
        if group in self.commands:
            self.commands[group].add_command(command)
            return
        if group in self.lazy:
            load = self.lazy[group]

            def load_with(name):
                loaded = load(name)
                loaded.add_command(command)
                return loaded

            self.lazy[group] = load_with

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except MofaError as exc:
            click.echo(f"error: {one_line(str(exc))}", err=True)
            ctx.exit(2)
        except click.UsageError as exc:  # a flag's value click itself refuses: one line too
            where = exc.ctx.command_path if exc.ctx is not None else "mofa"
            click.echo(f"error: {one_line(exc.format_message())} (see `{where} --help`)", err=True)
            ctx.exit(2)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except BrokenPipeError:  # the reader left (`mofa … | head`): stop quietly, as a SIGPIPE'd tool does
            _silence_stdout()
            ctx.exit(SIGPIPE_STATUS)
        except Exception as exc:  # noqa: BLE001
            if os.environ.get("MOFA_DEBUG"):
                raise
            click.echo(f"internal error: {type(exc).__name__}: {one_line(str(exc))} (set MOFA_DEBUG=1 for the "
                       "traceback and please report it)", err=True)
            ctx.exit(1)


#: the exit status of a command whose output's reader went away (128 + SIGPIPE, as the shell reports
#: a tool the signal stopped)
SIGPIPE_STATUS = 141


def _silence_stdout() -> None:
    """Point stdout at the null device, so the interpreter's last flush of the closed pipe raises
    nothing more (the recipe of Python's signal documentation, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (captured in tests): nothing to silence
        pass


#: the longest error line the CLI prints (a message listing 200,000 keys is cut, not 1.7 MB long)
MAX_ERROR_CHARS = 600


def one_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """`text` on one line, at most `limit` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else f"{text[:limit - 30]}… ({len(text):,} characters in all)"


#: plugin failures seen while assembling the command line (``mofa_register_commands``), by plugin
_COMMAND_FAILURES: dict[str, str] = {}


def warn_failed_plugins(pm: MofaPluginManager) -> None:
    """One warning line per failed plugin, once per command (a plugin that fails in several hooks
    is reported once, with its first failure)."""
    seen: dict[str, str] = dict(_COMMAND_FAILURES)
    for info in pm.infos.values():
        if info.status == "failed":
            seen.setdefault(info.name, info.error)
    for problem in pm.registry.problems:  # e.g. a record of the wrong type: "plugin 'x' returned ..."
        named = re.match(r"plugin '([^']+)'", problem)
        if named:
            seen.setdefault(named.group(1), problem)
    for name, error in seen.items():
        click.echo(f"warning: plugin {name!r} is not (fully) in use: {one_line(error, 300)} "
                   "(see `mofa list-plugins`; --strict-plugins makes this an error)", err=True)


@attrs.define
class State:
    disabled: tuple[str, ...] = ()
    strict: bool | None = None
    trace: bool | None = None
    #: the manager the command line was assembled with (:func:`main`): used when the global options
    #: ask for no other (no plugin disabled, no strictness or tracing asked for), not loaded twice
    assembled: MofaPluginManager | None = None
    _pm: MofaPluginManager | None = None
    _warned: bool = False

    @property
    def pm(self) -> MofaPluginManager:
        if self._pm is None:
            default = not self.disabled and self.strict is None and self.trace is None
            self._pm = self.assembled if default and self.assembled is not None else get_plugin_manager(
                disabled=self.disabled, strict=self.strict, trace=self.trace, fresh=True)
            self._pm.registry  # noqa: B018 - collecting records may mark more plugins failed
            if not self._warned:  # the rest still works; say once what is missing
                warn_failed_plugins(self._pm)
                self._warned = True
        return self._pm

    def predictor(self):
        from .api import Predictor

        return Predictor(pm=self.pm)



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
    assembled = ctx.obj if isinstance(ctx.obj, MofaPluginManager) else None
    ctx.obj = State(disabled=tuple(disabled), strict=strict_plugins, trace=trace_plugins, assembled=assembled)


def _emit_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


def console(min_width: int = 120):
    """A rich console: the terminal's width on a terminal, unbounded when piped (nothing wraps)."""
    from rich.console import Console

    if not sys.stdout.isatty():
        return Console(width=PIPE_WIDTH, soft_wrap=True)
    return Console(width=max(min_width, shutil.get_terminal_size((min_width, 24)).columns))


def markdown_table(rows: list[list], headers: list[str], title: str | None = None) -> str:
    """A GitHub-flavoured Markdown table (cells' ``|`` escaped, line breaks as ``<br>``)."""
    cell = lambda x: str(x).replace("|", "\\|").replace("\n", "<br>")  # noqa: E731
    lines = [f"**{title}**", ""] if title else []
    lines.append("| " + " | ".join(cell(h) for h in headers) + " |")
    lines.append("|" + "|".join("---" for _ in headers) + "|")
    lines += ["| " + " | ".join(cell(x) for x in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def csv_table(rows: list[list], headers: list[str]) -> str:
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(headers)
    w.writerows([[str(x).replace("\n", "; ") for x in r] for r in rows])
    return buf.getvalue()


def _table(rows: list[list[str]], headers: list[str], title: str | None = None, fmt: str = "table") -> None:
    """Print a table as a rich table (``table``), ``csv`` or ``markdown``."""
    if fmt == "csv":
        click.echo(csv_table(rows, headers), nl=False)
        return
    if fmt == "markdown":
        click.echo(markdown_table(rows, headers, title))
        return
    from rich.table import Table

    t = Table(title=title, show_lines=False, header_style="bold")
    for h in headers:
        t.add_column(h, overflow="fold")
    for r in rows:
        t.add_row(*[str(x) for x in r])
    console().print(t)


# ---------------------------------------------------------------------- list-*


@cli.command("list-plugins")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@pass_state
def list_plugins(state: State, fmt):
    """Installed plugins: distribution, status, hooks and the records each provides."""
    state._warned = True  # the listing itself shows every failure
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
               ["name", "distribution", "version", "status", "hooks", "provides"], fmt=fmt)
    if fmt in ("table", "markdown"):
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
                "scale-out GB/s", "plugin"], fmt=fmt)


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
                     "activation": m.activation.value, "aliases": list(m.aliases), "source": m.source,
                     "blocks": {k: attrs.asdict(b) for k, b in m.blocks.items()}, "stack": m.kind_counts})
    if fmt == "json":
        _emit_json(rows)
    else:
        _table([[r["name"], r["params_b"], r["active_params_b"], r["num_layers"], r["hidden_size"],
                 f"{r['num_attention_heads']}/{r['num_kv_heads']}", r["num_experts"] or "—", r["vocab_size"],
                 r["plugin"]] for r in rows],
               ["name", "params (B)", "active (B)", "layers", "hidden", "heads/kv", "experts", "vocab", "plugin"],
               fmt=fmt)


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
            opts[key.strip()] = toml_loads(f"v = {value.strip()}")["v"]
        except TOMLDecodeError:
            opts[key.strip()] = value.strip()
    return name.strip(), opts


def _opts_text(opts: dict) -> str:
    return ",".join(f"{k}={v!r}" for k, v in opts.items()) or "no options"


def job_dict_from_flags(model, hardware, gpus, tp, pp, vpp, cp, ep, etp, mbs, gbs, seq, precision, schedule,
                        sequence_parallel, features, tokens, moe_load_factor=None, flash_attention=None,
                        attention_kernel=None, power_limit_w=None, document_length=None, pipeline_layout=None,
                        scaleout_bandwidth_gbps=None, first_stage_layers=None, last_stage_layers=None) -> dict:
    if not (model and hardware) or None in (gpus, gbs, seq):  # 0 or -1 reach the bounds, which name them
        raise ConfigError("give a job file, or --model, --hardware, --gpus, --gbs and --seq")
    model_section = {"config": model} if model.endswith(".json") else {"name": model}
    if moe_load_factor is not None:
        model_section["moe_load_factor"] = moe_load_factor
    par = {k: v for k, v in dict(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, micro_batch_size=mbs,
                                  global_batch_size=gbs, sequence_length=seq, precision=precision,
                                  sequence_parallel=sequence_parallel, flash_attention=flash_attention,
                                  attention_kernel=attention_kernel, document_length=document_length,
                                  pipeline_layout=pipeline_layout, first_stage_layers=first_stage_layers,
                                  last_stage_layers=last_stage_layers).items()
           if v is not None}
    data = {"name": "cli", "model": model_section, "hardware": {"name": hardware, "num_gpus": gpus}, "parallel": par}
    if power_limit_w is not None:
        data["hardware"]["power_limit_w"] = power_limit_w
    if scaleout_bandwidth_gbps is not None:
        data["hardware"]["scaleout_bandwidth_gbps"] = scaleout_bandwidth_gbps
    if schedule:
        data["pipeline"] = {"schedule": schedule}
    if features:
        data["features"] = {}
        for text in features:
            name, opts = parse_feature_flag(text)
            if name in data["features"] and data["features"][name] != opts:
                raise ConfigError(f"--feature {name} is given twice with different options "
                                  f"({_opts_text(data['features'][name])} and {_opts_text(opts)}): give it once")
            data["features"][name] = opts
    if tokens:
        data["training"] = {"tokens": tokens}
    return data


#: ``--num-layers N``: the model's first N layers (a reduced-layer proxy run); applies to job files too
NUM_LAYERS_OPTION = click.option("--num-layers", type=click.IntRange(1, 1 << 20), metavar="N",
                                 help="Run the model with its first N layers (proxy runs; job files too).")


#: ``--attention-kernel``: the fused-attention implementation (``[parallel] attention_kernel``)
ATTENTION_KERNEL_OPTION = click.option(
    "--attention-kernel", "attention_kernel", type=click.Choice(ATTENTION_KERNELS),
    help="Fused-attention kernel: auto (default: cuDNN on Hopper and later, else FlashAttention-2, as "
         "Megatron-Core runs), fa2, fa3, cudnn, triton ([parallel] attention_kernel; docs/profiling.md).")


#: ``--document-length``: packed sequences' mean document length (``[parallel] document_length``)
DOCUMENT_LENGTH_OPTION = click.option(
    "--document-length", "document_length", type=click.IntRange(min=0), metavar="TOKENS",
    help="Sequences packed from documents of this mean length (SFT with packing): fused attention keeps to each "
         "document (THD, cu_seqlens). 0 / not given: one document per sequence ([parallel] document_length).")


def with_num_layers(jobs: list, n: int | None) -> list:
    """The jobs with their models cut to `n` layers (``--num-layers``)."""
    if n is None:
        return jobs
    try:
        return [attrs.evolve(j, model=j.model.with_num_layers(n)) for j in jobs]
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"--num-layers {n}: {exc.args[0] if exc.args else exc}") from None


#: ``--power-limit-w``: the GPUs' power limit (``[hardware] power_limit_w``)
POWER_LIMIT_OPTION = click.option(
    "--power-limit-w", "power_limit_w", type=float, metavar="WATTS",
    help="Run the GPUs at this power limit (nvidia-smi -pl), e.g. 500 on a 700 W H100: tensor-core work slows "
         "to the clock the limit allows ([hardware] power_limit_w; default: the profile's).")


#: ``--scaleout-bandwidth-gbps``: the network between scale-up domains (``[hardware] scaleout_bandwidth_gbps``)
SCALEOUT_OPTION = click.option(
    "--scaleout-bandwidth-gbps", "scaleout_bandwidth_gbps", type=float, metavar="GBPS",
    help="GB/s per GPU between nodes (scale-up domains), one direction: the node's NICs over its GPUs, e.g. 12.5 "
         "for 4 × 200 Gb/s on 8 GPUs ([hardware] scaleout_bandwidth_gbps; default: the profile's).")


#: ``--first-stage-layers`` / ``--last-stage-layers``: uneven end stages (``[parallel] first_stage_layers`` /
#: ``last_stage_layers``, Megatron's --decoder-first/last-pipeline-num-layers)
STAGE_LAYERS_OPTIONS = tuple(
    click.option(f"--{end}-stage-layers", f"{end}_stage_layers", type=int, metavar="N",
                 help=f"Transformer layers on the {end} pipeline stage (Megatron's --decoder-{end}-pipeline-num-layers); "
                      f"the other stages split the rest evenly ([parallel] {end}_stage_layers; default: an even split).")
    for end in ("first", "last"))


#: the job's size flags, each also under its job-file key (``[hardware] num_gpus``, ``[parallel]
#: global_batch_size`` ...) so a flag spelled as the file spells it is accepted
GPUS_OPTION = click.option("--gpus", "--num-gpus", "gpus", type=int, help="Number of GPUs.")
GBS_OPTION = click.option("--gbs", "--global-batch-size", "gbs", type=int, help="Global batch size (sequences).")
SEQ_OPTION = click.option("--seq", "--sequence-length", "seq", type=int, help="Sequence length.")
MBS_OPTION = click.option("--mbs", "--micro-batch-size", "mbs", type=int, help="Micro-batch size.")


def job_options(f):
    """The flags that describe a job without a file (shared by predict, e2e and tune)."""
    opts = [
        click.option("--model", help="Zoo model name, alias, or a HuggingFace config.json."),
        click.option("--hardware", help="Hardware profile name (see `mofa list-hardware`)."),
        GPUS_OPTION,
        click.option("--tp", type=int), click.option("--pp", type=int), click.option("--vpp", type=int),
        click.option("--cp", type=int), click.option("--ep", type=int), click.option("--etp", type=int),
        MBS_OPTION, GBS_OPTION, SEQ_OPTION,
        click.option("--precision", type=click.Choice(["bf16", "fp16", "fp8", "fp4"])),
        click.option("--schedule", help="Pipeline schedule (see `mofa list-plugins`)."),
        click.option("--sequence-parallel/--no-sequence-parallel", default=None),
        click.option("--flash-attention/--no-flash-attention", default=None,
                     help="Fused (flash) attention kernels, the default; --no-flash-attention prices the unfused "
                          "core attention of Megatron 2021-22 runs, keeping the s×s scores ([parallel] "
                          "flash_attention)."),
        ATTENTION_KERNEL_OPTION,
        DOCUMENT_LENGTH_OPTION,
        click.option("--pipeline-layout", "pipeline_layout", metavar="LAYOUT",
                     help="Megatron-Core's --pipeline-model-parallel-layout, e.g. 'Et*4|(t*4|)*14tmL': the layers "
                          "of each pipeline stage, read into the end-stage sizes and --vpp ([parallel] "
                          "pipeline_layout; docs/schedules.md)."),
        STAGE_LAYERS_OPTIONS[0], STAGE_LAYERS_OPTIONS[1],
        POWER_LIMIT_OPTION,
        SCALEOUT_OPTION,
        click.option("--feature", "features", multiple=True, metavar="NAME[:key=value,...]",
                     help="Enable a feature plugin with options (repeatable)."),
        click.option("--tokens", type=float, help="Tokens to train on (end-to-end time)."),
        click.option("--moe-load-factor", type=float, metavar="F",
                     help="MoE routing imbalance: the busiest EP rank's token-expert pairs over the mean "
                          "(default 1, balanced; the model's moe_load_factor)."),
        NUM_LAYERS_OPTION,
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def load_jobs(state: State, files, flags: dict) -> list:
    predictor = state.predictor()
    flags = dict(flags)
    num_layers = flags.pop("num_layers", None)
    jobs = [predictor.load_job(p) for p in files]
    if any(v not in (None, (), False) for v in flags.values()) or not files:
        if files:
            raise ConfigError("give either job files or job flags (--model ...), not both")
        jobs.append(predictor.job(job_dict_from_flags(**flags), name="cli"))
    return with_num_layers(jobs, num_layers)


#: the smallest step-time component the table shows: below it `_fmt_s` would print 0.0 ms (or -0.0 ms
#: for a rounding residual such as a schedule's busy time minus the sum of its parts)
_SHOWN_S = 0.05e-3


def _fmt_s(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


def _prediction_tables(r) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, headers, rows) of the breakdown, the memory per stage and the memory breakdown."""
    bd = [[k, _fmt_s(v), f"{v / r.step_time_s:.1%}", r.provenance.get(k, "")]
          for k, v in r.breakdown.items() if abs(v) >= _SHOWN_S]
    bd.append(["step", _fmt_s(r.step_time_s), "100%", ""])
    stages = [[name, f"{gib:.2f}", "worst" if abs(gib - r.peak_memory_gib) < 1e-9 else ""]
              for name, gib in r.stage_memory_gib.items()]
    mem = [[k, f"{v:.2f}"] for k, v in r.memory_breakdown.items() if abs(v) > 0 and k != "host"]
    mem.append(["peak", f"{r.peak_memory_gib:.2f}"])
    if r.memory_breakdown.get("host"):
        mem.append(["host (CPU, not in peak)", f"{r.memory_breakdown['host']:.2f}"])
    return [(f"step time breakdown (critical pipeline stage: {r.critical_stage})", ["component", "time", "share",
                                                                                   "from"], bd),
            ("memory per GPU by pipeline stage (incl. reserved)", ["stage", "GiB", ""], stages),
            ("memory per GPU (worst stage)", ["component", "GiB"], mem)]


def band_text(r) -> str:
    """" (band 13.8–16.0 s)" for a result with a band, else ""."""
    import math

    if not (math.isfinite(r.step_time_s_low) and math.isfinite(r.step_time_s_high)):
        return ""
    return f" (band {_fmt_s(r.step_time_s_low)}–{_fmt_s(r.step_time_s_high)})"


def sensitivity_rows(sens) -> list[list[str]]:
    return [[s.parameter, f"{s.value:.4g}", f"{s.elasticity:+.3f}"] for s in sens]


SENSITIVITY_HEADERS = ["parameter", "value", "∂ ln step / ∂ ln parameter"]
#: rows of the --sensitivity table (JSON carries every parameter)
SENSITIVITY_TOP = 8


def _prediction_head(r) -> tuple[str, str]:
    p = r.parallel
    run = (f" at {r.power_limit_w:g} W" if r.power_limit_w else "") + (
        f", {r.scaleout_bandwidth_gbps:g} GB/s per GPU between nodes" if r.scaleout_bandwidth_gbps else "")
    head = (f"{r.job}: {r.model} on {r.num_gpus} × {r.hardware}{run} — TP{p['tp']} PP{p['pp']} VPP{p['vpp']} "
            f"CP{p['cp']} EP{p['ep']} DP{p['dp']}, mbs {p['micro_batch_size']}, gbs {p['global_batch_size']}, "
            f"seq {p['sequence_length']}, {p['precision']}, schedule {r.schedule}, "
            f"features: {', '.join(r.features) or 'none'}")
    free = r.hbm_gib - r.peak_memory_gib
    # MoFa's memory error on published peaks is 5-12 % (docs/validation.md): say when the room is inside it
    tight = " — within the memory estimate's error; mofa tune --memory-headroom-gib keeps room" \
        if free < MEMORY_ERROR_SHARE * r.hbm_gib else ""
    fit = f"fits, {free:.1f} GiB free{tight}" if r.fits_in_memory else "does NOT fit"
    tok = f"{r.tokens_per_s_per_gpu:,.0f}" if r.tokens_per_s_per_gpu >= 10 else f"{r.tokens_per_s_per_gpu:.3g}"
    # MFU/HFU are against the peak of the format the GEMMs run in; say so when that is not bf16
    of = f" (of the {r.mfu_precision} peak; {r.mfu_bf16_peak:.1%} of bf16's)" if r.mfu_precision != "bf16" else ""
    line = (f"step {_fmt_s(r.step_time_s)}{band_text(r)} · {tok} tokens/s/GPU · "
            f"{r.model_tflops_per_gpu:.0f} model TFLOPS/GPU · MFU {r.mfu:.1%}{of} · HFU {r.hfu:.1%} · "
            f"peak memory {r.peak_memory_gib:.1f} / {r.hbm_gib:.0f} GiB"
            + (f", host {r.host_memory_gib:.1f} / {r.host_gib_per_gpu:.0f} GiB per GPU" if r.host_memory_gib > 0 else "")
            + f" ({fit})")
    for flag in r.extrapolation:
        line += f"\noutside the calibrated regimes: {flag}"
    if r.mfu > 1:
        line += ("\nnote: MFU counts attention as the full s×s square (Megatron's convention); the fused causal "
                 "kernels execute about half of it, so at long sequences MFU can exceed 100 %")
    return head, line


def print_prediction(r, fmt: str = "table") -> None:
    head, line = _prediction_head(r)
    ph = r.pipeline_phases
    phases = (f"pipeline phases: warmup {_fmt_s(ph['warmup'])}, steady {_fmt_s(ph['steady'])}, "
              f"cooldown {_fmt_s(ph['cooldown'])}")
    if fmt == "markdown":
        click.echo(f"### {head}\n\n{line}\n")
        for title, headers, rows in _prediction_tables(r):
            click.echo(markdown_table(rows, headers, title))
        click.echo(phases)
        return
    from rich.table import Table

    con = console(110)
    bold = lambda x: x.replace(f"{r.job}:", f"[bold]{r.job}[/]:", 1)  # noqa: E731
    con.print(bold(head), markup=True, highlight=False)
    con.print(line.replace("(fits)", "([green]fits[/])").replace("(does NOT fit)", "([red]does NOT fit[/])"))
    for title, headers, rows in _prediction_tables(r):
        t = Table(title=title, header_style="bold")
        for h in headers:
            t.add_column(h, justify="left" if h in ("component", "stage", "from", "") else "right")
        for row in rows:
            t.add_row(*[f"[bold]{x}[/]" if row[0] in ("step", "peak") else x for x in row])
        con.print(t)
    con.print(phases)


def prediction_csv(results) -> str:
    """One row per job: the headline numbers, every breakdown component and the memory per stage."""
    comps = list(dict.fromkeys(k for r in results for k in r.breakdown))
    mems = list(dict.fromkeys(k for r in results for k in r.memory_breakdown))
    head = ["job", "model", "hardware", "num_gpus", "tp", "pp", "vpp", "cp", "ep", "dp", "micro_batch_size",
            "global_batch_size", "sequence_length", "precision", "schedule", "features", "step_time_s",
            "step_time_s_low", "step_time_s_high", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "hfu", "peak_memory_gib", "fits_in_memory",
            "critical_stage", "memory_first_gib", "memory_mid_gib", "memory_last_gib",
            *(f"{k}_s" for k in comps), *(f"memory_{k}_gib" for k in mems)]
    rows = []
    for r in results:
        p = r.parallel
        rows.append([r.job, r.model, r.hardware, r.num_gpus, p["tp"], p["pp"], p["vpp"], p["cp"], p["ep"], p["dp"],
                     p["micro_batch_size"], p["global_batch_size"], p["sequence_length"], p["precision"],
                     r.schedule, ";".join(r.features), f"{r.step_time_s:.6g}", f"{r.step_time_s_low:.6g}",
                     f"{r.step_time_s_high:.6g}", f"{r.tokens_per_s_per_gpu:.6g}",
                     f"{r.model_tflops_per_gpu:.6g}", f"{r.mfu:.6g}", f"{r.hfu:.6g}", f"{r.peak_memory_gib:.6g}",
                     r.fits_in_memory, r.critical_stage,
                     *(f"{r.stage_memory_gib[k]:.6g}" if k in r.stage_memory_gib else "" for k in ("first", "mid",
                                                                                                     "last")),
                     *(f"{r.breakdown.get(k, 0.0):.6g}" for k in comps),
                     *(f"{r.memory_breakdown.get(k, 0.0):.6g}" for k in mems)])
    return csv_table(rows, head)


def source_text(source: str) -> tuple[str, str]:
    """(text, where): the file `source` names, standard input for ``-``, else `source` itself
    (arguments or a config given on the command line)."""
    if source == "-":
        return sys.stdin.read(), "standard input"
    path = Path(source)
    try:
        is_file = "\n" not in source and path.is_file()
    except OSError:  # e.g. a whole argument list is too long a file name
        is_file = False
    if is_file:
        try:
            return path.read_text(), str(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read: {exc}") from None
    if not source.lstrip().startswith("-") and "=" not in source and "\n" not in source:
        raise ConfigError(f"{source}: no such file (give a launch script or config file, '-' for standard input, "
                          "or the arguments themselves in quotes)")
    return source, "the command line"


def _megatron_job(state: State, source: str, flags: dict):
    """A job from ``--megatron-args`` (an argument string, or the path of a launch script)."""
    from .megatron import read_source, with_environment_findings

    others = [k for k, v in flags.items() if k not in ("model", "hardware", "gpus") and v not in (None, (), False)]
    if others:
        raise ConfigError(f"--megatron-args gives the job; only --hardware, --gpus and --model go with it "
                          f"(got --{others[0].replace('_', '-')})")
    text, _ = source_text(source)
    predictor = state.predictor()
    res = read_source(text, predictor.registry, kind="megatron", hardware=flags.get("hardware"),
                      num_gpus=flags.get("gpus"), model=flags.get("model"), name="megatron")
    job = predictor.job(res.job, name=res.job["name"])
    report_import(with_environment_findings(res, job, predictor.registry))
    return job


def report_import(res) -> None:
    """What became of the Megatron arguments, on stderr."""
    model = res.job["model"].get("name", "?")
    kind = "the zoo model" if res.model_match else ("an inline model" if "num_layers" in res.job["model"]
                                                     else "the model")
    click.echo(f"megatron: {kind} {model}; {len(res.used)} flags used, {len(res.ignored)} ignored "
               f"(change nothing MoFa models)", err=True)
    if res.ignored:
        click.echo(f"  ignored: {' '.join(res.ignored)}", err=True)
    if res.unknown:
        click.echo(f"  unknown (not read): {' '.join(res.unknown)}", err=True)
    for n in res.notes:
        click.echo(f"  note: {n}", err=True)


def write_trace_outputs(predictor, job, trace_path: Path | None, plot_path: Path | None, all_stages: bool) -> None:
    """``--trace FILE.json`` and ``--plot-timeline FILE.png`` of one job."""
    from .trace import build, timeline_events, write

    pred = predictor._evaluate_jobs([job])
    tr = build(pred, 0, registry=predictor.registry, all_stages=all_stages, name=job.name)
    if trace_path is not None:
        write(tr, trace_path)
        click.echo(f"trace written to {trace_path} (open it in https://ui.perfetto.dev or chrome://tracing)",
                   err=True)
    if plot_path is not None:
        from .commands._figure import written_path
        from .simulate import draw_timeline

        out = written_path(plot_path)
        try:
            draw_timeline(timeline_events(tr), out, stages=tr["otherData"]["stages_shown"],
                          title=f"{job.name}: {job.schedule}, pp {job.parallel.pp}, vpp {job.parallel.vpp} "
                                "(F blue, B green, W red)")
        except ImportError:
            raise ConfigError("--plot-timeline needs matplotlib: pip install 'mofa[plot]'") from None
        except OSError as exc:
            raise ConfigError(f"--plot-timeline {plot_path}: cannot write: {exc}") from None
        click.echo(f"timeline written to {out}", err=True)


@cli.command()
@click.argument("job_files", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
@job_options
@click.option("--megatron-args", "megatron_args", metavar="ARGS|SCRIPT",
              help="Read the job from Megatron-LM arguments (quoted) or a launch script's path; with --hardware "
                   "and --gpus (unless its torchrun line says), optionally --model.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "jsonl", "csv", "markdown", "megatron"]),
              default="table", show_default=True,
              help="megatron: each job as a Megatron-LM launch — notes, its environment and its arguments.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE.json",
              help="Also write the step as a Chrome trace-event timeline (open in ui.perfetto.dev).")
@click.option("--all-stages", is_flag=True, help="With --trace/--plot-timeline: every pipeline stage, not only "
                                                 "the first, a middle and the last.")
@click.option("--plot-timeline", "plot_timeline", type=click.Path(dir_okay=False, path_type=Path),
              metavar="FILE.png", help="Also draw the pipeline timeline (needs matplotlib).")
@click.option("--sensitivity", is_flag=True,
              help="Also list the hardware-profile parameters the step time depends on most "
                   "(∂ ln step / ∂ ln parameter; JSON: every parameter).")
@pass_state
def predict(state: State, job_files, fmt, megatron_args, trace_path, all_stages, plot_timeline, sensitivity,
            **flags):
    """Predict step time, throughput, MFU and memory for JOB_FILES (or a job given by flags)."""
    if megatron_args is not None:
        if job_files:
            raise ConfigError("give either job files or --megatron-args, not both")
        jobs = [_megatron_job(state, megatron_args, flags)]
    else:
        jobs = load_jobs(state, job_files, flags)
    if (trace_path or plot_timeline) and len(jobs) != 1:
        raise ConfigError("--trace and --plot-timeline draw one job: give a single job")
    if sensitivity and fmt == "megatron":
        raise ConfigError("--sensitivity lists coefficients in a table, JSON or CSV; --format megatron writes "
                          "launch lines: drop one of them")
    predictor = state.predictor()
    results = predictor.predict(jobs)
    sens = predictor.sensitivity(jobs) if sensitivity else None
    if trace_path or plot_timeline:
        write_trace_outputs(predictor, jobs[0], trace_path, plot_timeline, all_stages)
    dicts = [{**r.to_dict(), **({"sensitivity": [attrs.asdict(x) for x in sens[i]]} if sens else {})}
             for i, r in enumerate(results)]
    if fmt == "megatron":
        for job in jobs:
            _echo_launch(job, predictor.registry, header=len(jobs) > 1)
    elif fmt == "json":
        _emit_json(dicts if len(results) > 1 else dicts[0])
    elif fmt == "jsonl":
        for d in dicts:
            click.echo(json.dumps(d, default=str))
    elif fmt == "csv":
        click.echo(prediction_csv(results), nl=False)
        if sens:
            click.echo(csv_table([[r.job, *row] for r, s in zip(results, sens) for row in sensitivity_rows(s)],
                                 ["job", "parameter", "value", "elasticity"]), nl=False)
    else:
        for i, r in enumerate(results):
            print_prediction(r, fmt)
            if sens:
                _table(sensitivity_rows(sens[i][:SENSITIVITY_TOP]), SENSITIVITY_HEADERS,
                       title="sensitivity of the step time (largest first)", fmt=fmt)


def _echo_launch(job, registry, header: bool) -> None:
    """A job as a Megatron-LM launch (:func:`mofa_framework.tuner.megatron_launch`)."""
    from .tuner import LaunchConfig, megatron_launch

    if header:
        click.echo(f"# job: {job.name}")
    click.echo("\n".join(megatron_launch(job.model, LaunchConfig.of_job(job, registry), registry, job.hardware)))


def assemble() -> click.Group:
    """The CLI with commands from plugins (``mofa_register_commands``) added. A plugin that fails
    to add its commands is named in the command's warning (once, with its other failures)."""
    return _assemble()[0]


def _assemble() -> tuple[click.Group, MofaPluginManager | None]:
    """:func:`assemble`, and the manager it loaded (None when a MOFA_* variable is bad)."""
    try:
        pm = get_plugin_manager(fresh=True)
    except MofaError:  # a bad MOFA_* variable: the command itself reports it (one line, exit 2)
        return cli, None
    for impl in reversed(pm.hook.mofa_register_commands.get_hookimpls()):
        try:
            impl.function(cli=cli)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not take the CLI down
            _COMMAND_FAILURES.setdefault(impl.plugin_name, f"plugin {impl.plugin_name!r} failed to add commands: "
                                                            f"{type(exc).__name__}: {exc}")
    return cli, pm


@functools.cache
def _builtin_commands() -> None:
    from .commands import register_builtin_commands

    register_builtin_commands(cli)


def main() -> None:
    _builtin_commands()
    group, pm = _assemble()
    group(prog_name="mofa", obj=pm)  # the commands' State reuses `pm` (see State.assembled)


if __name__ == "__main__":  # pragma: no cover - `python -m mofa_framework.cli`: run the imported module's
    from mofa_framework.cli import main as _main  # CLI, not this __main__ copy (its commands use the former's State)

    sys.exit(_main())
