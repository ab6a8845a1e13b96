"""What the ``mofa import`` plugins for data-parallel stacks (llm-foundry, DeepSpeed) share: the job
they write and the command-line options every importer takes."""

from __future__ import annotations

import click


def data_parallel_job(name: str, model_table: dict, hardware: str, num_gpus: int, *, micro_batch_size: int,
                      global_batch_size: int, sequence_length: int, precision: str, features: dict,
                      **attention) -> dict:
    """A job dict (the TOML job file's shape) of a run that is data parallel over every GPU:
    no tensor, pipeline or context parallelism."""
    par = {"tp": 1, "pp": 1, "cp": 1, "micro_batch_size": micro_batch_size, "global_batch_size": global_batch_size,
           "sequence_length": sequence_length, "precision": precision, **attention}
    return {"name": name, "model": model_table, "hardware": {"name": hardware, "num_gpus": num_gpus},
            "parallel": par, "features": features}


def output_options(f):
    """``--name``, ``-o/--output`` and ``--format`` of an importer command."""
    for opt in reversed([
        click.option("--name", help="The job's name (default: the file's stem)."),
        click.option("-o", "--output", type=click.Path(dir_okay=False), metavar="JOB.toml",
                     help="Write the job file here (default: standard output)."),
        click.option("--format", "fmt", type=click.Choice(["toml", "json"]), default="toml", show_default=True),
    ]):
        f = opt(f)
    return f
