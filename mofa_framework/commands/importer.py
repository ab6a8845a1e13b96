"""``mofa import megatron|nemo``: a job file from the arguments a training run was launched with."""

from __future__ import annotations

from pathlib import Path

import click

from ..cli import pass_state, report_import, source_text
from ..errors import ConfigError
from ..megatron import read_source, to_toml, with_environment_findings


def _import(state, kind: str, source: str, hardware, gpus, model, name, output, fmt) -> None:
    text, where = source_text(source)
    predictor = state.predictor()
    res = read_source(text, predictor.registry, kind=kind, hardware=hardware, num_gpus=gpus, model=model,
                      name=name or (Path(source).stem if where not in ("standard input", "the command line")
                                    else kind))
    job = predictor.job(res.job, name=f"{where} (as imported)")  # the job must load, or nothing is written
    res = with_environment_findings(res, job, predictor.registry)
    report_import(res)
    origin = Path(where).name if where not in ("standard input", "the command line") else where
    header = [f"imported by `mofa import {kind}` from {origin}", *(f"note: {n}" for n in res.notes)]
    if res.unknown:
        header.append(f"unknown flags (not read): {' '.join(res.unknown)}")
    write_imported_job(res.job, header, output, fmt)


def write_imported_job(job: dict, header: list[str], output: Path | None, fmt: str) -> None:
    """An imported job as TOML (`header` as its comments) or JSON, to `output` or standard output
    (shared with the plugins that add ``mofa import`` sub-commands)."""
    if fmt == "json":
        import json

        body = json.dumps(job, indent=2) + "\n"
    else:
        body = to_toml(job, header)
    if output is None:
        click.echo(body, nl=False)
        return
    try:
        Path(output).write_text(body)
    except OSError as exc:
        raise ConfigError(f"-o {output}: cannot write: {exc}") from None
    click.echo(f"wrote {output}", err=True)


def run_plugin_import(ctx: click.Context, source: str, kind: str, read, output: Path | None, fmt: str) -> None:
    """What a plugin's ``mofa import KIND SOURCE`` does: read SOURCE (a file, '-' or the text
    itself), call ``read(text, registry, stem) -> (job, notes, summary)`` (stem: the file's, the
    default job name), load the job (or write nothing), say on stderr what was read (`summary`) and
    assumed (`notes`), and write it with those as its header."""
    from ..api import Predictor
    from ..cli import State

    state = ctx.find_object(State)
    predictor = state.predictor() if state is not None else Predictor()
    text, where = source_text(source)
    stem = Path(where).stem if where not in ("standard input", "the command line") else kind
    job, notes, summary = read(text, predictor.registry, stem)
    predictor.job(job, name=f"{where} (as imported)")
    click.echo(f"{kind}: {summary}", err=True)
    for n in notes:
        click.echo(f"  note: {n}", err=True)
    origin = Path(where).name if where not in ("standard input", "the command line") else where
    write_imported_job(job, [f"imported by `mofa import {kind}` from {origin}", *(f"note: {n}" for n in notes)],
                       output, fmt)


def _common(f):
    for opt in reversed([
        click.argument("source"),
        click.option("--hardware", help="Hardware profile (the arguments do not say; see mofa list-hardware)."),
        click.option("--gpus", type=click.IntRange(min=1), help="GPUs (default: the launcher's nproc × nodes)."),
        click.option("--model", help="Zoo model or HuggingFace config.json, instead of matching the shape."),
        click.option("--name", help="The job's name (default: the file's stem)."),
        click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), metavar="JOB.toml",
                     help="Write the job file here (default: standard output)."),
        click.option("--format", "fmt", type=click.Choice(["toml", "json"]), default="toml", show_default=True),
    ]):
        f = opt(f)
    return f


@click.group("import")
def import_cmd():
    """Write a MoFa job from a Megatron-LM launch, a NeMo / Megatron-Bridge config or (plugins) a
    torchtitan train config, an llm-foundry YAML, a DeepSpeed or an Accelerate config."""


#: SOURCE may be the arguments themselves in quotes ("--tensor-model-parallel-size 8 ..."): a token
#: click does not know as an option is the argument, not an error
ARGUMENTS_IN_QUOTES = {"ignore_unknown_options": True}


@import_cmd.command("megatron", context_settings=ARGUMENTS_IN_QUOTES)
@_common
@pass_state
def import_megatron(state, source, hardware, gpus, model, name, output, fmt):
    """A job from a Megatron-LM launch script or argument list (SOURCE: a file, '-', or the
    arguments in quotes).

    Variables, arrays, defaults and line continuations of the script are evaluated; the
    torchrun line gives the GPU count. The model's shape is matched against the zoo. Unknown
    flags are listed, not fatal; flags that change nothing MoFa models are named as ignored.
    """
    _import(state, "megatron", source, hardware, gpus, model, name, output, fmt)


@import_cmd.command("nemo", context_settings=ARGUMENTS_IN_QUOTES)
@_common
@pass_state
def import_nemo(state, source, hardware, gpus, model, name, output, fmt):
    """A job from a NeMo / Megatron-Bridge config: YAML (NeMo 1 or a dumped ConfigContainer),
    a printed NeMo 2.0 recipe (``key=value`` trees) or ``model.key=value`` overrides."""
    _import(state, "nemo", source, hardware, gpus, model, name, output, fmt)
