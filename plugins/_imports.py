"""What the ``mofa import`` plugins for data-parallel stacks (llm-foundry, DeepSpeed) share: the job
they write and the command-line options every importer takes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import click

from mofa_framework.errors import ConfigError


@attrs.frozen(kw_only=True)
class ImportedJob:
    """A job an importer read, and what the reading assumed (the importers' results extend it)."""

    #: the job as a dict shaped like the TOML job file
    job: dict
    notes: tuple[str, ...]


def load_yaml(text: str, what: str, hint: str) -> Any:
    """`text` parsed as YAML, or one ConfigError line naming `what` and the `hint`."""
    try:
        import yaml

        return yaml.safe_load(text)
    except ImportError:
        raise ConfigError(f"reading {what} needs PyYAML: pip install pyyaml") from None
    except Exception as exc:  # noqa: BLE001 - yaml's errors span several lines: keep the first
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{what}: not YAML ({first}); {hint}") from None


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


def named_model(registry, model: str | None, what: str):
    """([model] table, ModelSpec) of ``--model``: a zoo name or a HuggingFace ``config.json``; `what`
    (the config that does not name its model) is in the error when it is missing."""
    if not model:
        raise ConfigError(f"{what} does not name the model: give --model NAME (see mofa list-models) or a "
                          "HuggingFace config.json")
    if model.endswith(".json"):
        from mofa_framework.config import model_from_hf_config

        return {"config": model}, model_from_hf_config(model)
    spec = registry.model(model, field="--model")
    return {"name": spec.name}, spec


def hugging_face_features(compiled: bool) -> dict:
    """What a Hugging Face ``transformers`` model runs (the Trainer, Accelerate, DeepSpeed scripts):
    eager element-wise kernels unless ``torch.compile`` fuses them, and its loss on logits upcast to
    fp32 (``ForCausalLMLoss``: ``logits.float()`` then ``cross_entropy``; compiled with the model)."""
    return {"fp32_cross_entropy": {"compiled": True} if compiled else {}, **({} if compiled else {"eager_kernels": {}})}


#: the attention kernels a script's model may run (``[parallel] attention_kernel``)
ATTENTION_KERNELS = ("fa2", "fa3", "cudnn", "triton", "auto")


def hugging_face_job(name: str, model_table: dict, hardware: str, num_gpus: int, *, features: dict,
                     gradient_checkpointing: bool, torch_compile: bool, attention_kernel: str, **batch) -> dict:
    """:func:`data_parallel_job` of a Hugging Face training script: its full recompute
    (``gradient_checkpointing``), the model's kernels and loss (:func:`hugging_face_features`)."""
    features = {**features, **hugging_face_features(torch_compile)}
    if gradient_checkpointing:
        features["recompute"] = {"granularity": "full"}
    return data_parallel_job(name, model_table, hardware, num_gpus, features=features,
                             attention_kernel=attention_kernel, **batch)


def script_options(model_help: str):
    """The options of an importer whose config leaves the training script's settings out: ``--model``,
    ``--hardware``, ``--seq-length``, ``--gradient-checkpointing``, ``--attention-kernel``,
    ``--torch-compile``."""
    def decorate(f):
        for opt in reversed([
            click.option("--model", help=model_help),
            click.option("--hardware", help="Hardware profile (see mofa list-hardware)."),
            click.option("--seq-length", type=click.IntRange(min=1), help="Tokens per sequence."),
            click.option("--gradient-checkpointing", is_flag=True,
                         help="The model recomputes each layer's forward (full recompute)."),
            click.option("--attention-kernel", type=click.Choice(ATTENTION_KERNELS), default="fa2", show_default=True,
                         help="The attention kernel the model runs (PyTorch SDPA's flash backend: fa2)."),
            click.option("--torch-compile", is_flag=True, help="The script compiles the model (fused element-wise "
                                                               "kernels)."),
        ]):
            f = opt(f)
        return f
    return decorate


#: PyTorch FSDP's sharding strategies (``torch.distributed.fsdp.ShardingStrategy``)
FSDP_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")


def fsdp_features(strategy: str, *, what: str, notes: list[str], reduce_bf16: bool = False,
                  reshard: bool = True) -> dict:
    """A PyTorch FSDP sharding strategy as features (without the data-parallel overlap, the caller's):
    ``FULL_SHARD`` → ``fsdp``; ``SHARD_GRAD_OP`` (or `reshard` false: FSDP2's
    ``reshard_after_forward = False``) → ``fsdp`` keeping each unit gathered to its backward; the
    hybrid strategies sharded over every GPU (noted); ``NO_SHARD`` → none (DDP). `reduce_bf16`: the
    gradients reduce-scattered in bf16 (Composer's ``PURE`` mixed precision). `what` names the key."""
    name = str(strategy).upper().lstrip("_")
    if name not in FSDP_STRATEGIES:
        raise ConfigError(f"{what} {strategy!r}: expected one of {', '.join(FSDP_STRATEGIES)}")
    if name == "NO_SHARD":
        return {}
    if name.startswith("HYBRID"):
        notes.append(f"{name} is priced as sharding over every GPU")
    opts: dict = {"grad_reduce_dtype": "bf16"} if reduce_bf16 else {}
    if name in ("SHARD_GRAD_OP", "HYBRID_SHARD_ZERO2") or not reshard:
        opts["reshard_after_forward"] = False
    return {"fsdp": opts}


def check_batch_splits(global_batch: int, micro_batch: int, num_gpus: int, what: str) -> None:
    """One ConfigError line unless the global batch (named `what`) is whole micro-batches on every GPU."""
    if global_batch % (micro_batch * num_gpus):
        raise ConfigError(f"{what} {global_batch} does not split into micro-batches of {micro_batch} on {num_gpus} "
                          f"GPUs: make it a multiple of {micro_batch * num_gpus}")


def section(cfg, key: str, what: str) -> dict:
    """``cfg[key]`` when it is a table (absent or null: empty); one ConfigError line naming the key
    when it is something else: ``what key`` for a config (``DeepSpeed zero_optimization``), ``what.key``
    inside a named section (``llm-foundry model.attn_config``)."""
    value = cfg.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        label = f"{what}.{key}" if " " in what else f"{what} {key}"
        raise ConfigError(f"{label} {value!r}: expected a table of settings")
    return dict(value)


def number(value, where: str, kind=float):
    """`value` as a positive number of `kind` (int or float); one ConfigError line naming `where`."""
    try:
        x = kind(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        x = None
    if x is None or not x > 0 or (kind is int and float(value) != x):
        raise ConfigError(f"{where} {value!r}: expected a positive {'integer' if kind is int else 'number'}")
    return x
