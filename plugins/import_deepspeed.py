"""DeepSpeed configs as MoFa jobs: ``mofa import deepspeed ds_config.json --model NAME``.

A DeepSpeed config (the ``ds_config.json`` of the DeepSpeed engine, of Hugging Face's Trainer /
Accelerate and of most fine-tuning stacks) says how a data-parallel run shards and offloads its
model state and how large its batches are, not the model, the GPUs or the sequence: those come from
the command line (``--model`` a zoo name or a HuggingFace ``config.json``, ``--hardware``, ``--gpus``,
``--seq-length``). This plugin reads the config and writes the job MoFa prices:

| DeepSpeed | MoFa |
|---|---|
| ``zero_optimization.stage`` 1–3 | ``deepspeed_zero`` (its ``overlap_comm``, ``contiguous_gradients``, ``reduce_bucket_size``, ``allgather_bucket_size``, ``use_multi_rank_bucket_allreduce``, ``stage3_prefetch_bucket_size``, ``stage3_max_live_parameters``, ``stage3_max_reuse_distance``); stage 0: plain data parallelism, gradients all-reduced after the backward |
| ``offload_param.device: cpu`` (stage 3) | ``weight_offload`` (ZeRO-Infinity), the update on the CPU with ``offload_optimizer`` and on the GPU without |
| ``offload_optimizer.device: cpu`` alone (stage 1–3) | ``cpu_optimizer`` (ZeRO-Offload, each rank updating its shard) |
| ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``, ``train_batch_size`` | the batch (any two give the third; data parallel over every GPU) |
| ``bf16.enabled`` / ``fp16.enabled`` | the precision; ``data_types.grad_accum_dtype: fp32`` at stage 1 |

Hugging Face's ``"auto"`` values are the Trainer's fill-ins: the batch from ``--micro-batch-size`` /
``--global-batch-size`` (the Trainer's arguments), the precision from ``--precision``, and the ZeRO
bucket sizes from the model as ``transformers.integrations.deepspeed`` sets them (``reduce_bucket_size``
= h², ``stage3_prefetch_bucket_size`` = 0.9·h²). A stage-3 layer is gathered module by module: 7
modules for a gated-MLP model with separate Q, K, V (Hugging Face's Llama family), 4 otherwise. Whether
the model checkpoints its activations is the training script's (``--gradient-checkpointing``: full
recompute); its attention is PyTorch SDPA's FlashAttention-2 unless ``--attention-kernel`` says, and
a Hugging Face model's element-wise kernels run eager and its loss on fp32 logits (``eager_kernels``,
``fp32_cross_entropy``) unless ``--torch-compile``. NVMe
offload, fp32 training and a value DeepSpeed does not have are one line naming the key and the fix.

Python API: :func:`from_deepspeed` (a parsed config or its JSON text) → :class:`DeepSpeedImport`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs
import click

from mofa_framework import hookimpl
from mofa_framework.errors import ConfigError
from mofa_framework.types import Activation

from ._imports import (ATTENTION_KERNELS, ImportedJob, check_batch_splits, hugging_face_job, named_model, output_options,
                       script_options, section)

#: DeepSpeed's keys → the ``deepspeed_zero`` options they set (stage 3's under their own names)
ZERO_OPTIONS = {"overlap_comm": "overlap_comm", "contiguous_gradients": "contiguous_gradients",
                "reduce_bucket_size": "reduce_bucket_size", "allgather_bucket_size": "allgather_bucket_size",
                "use_multi_rank_bucket_allreduce": "use_multi_rank_bucket_allreduce",
                "stage3_prefetch_bucket_size": "prefetch_bucket_size",
                "stage3_max_live_parameters": "max_live_parameters",
                "stage3_max_reuse_distance": "max_reuse_distance"}
#: Hugging Face's fill-in of an "auto" bucket size, as a multiple of hidden² (transformers'
#: ``HfTrainerDeepSpeedConfig.trainer_config_finalize``)
AUTO_BUCKETS = {"reduce_bucket_size": 1.0, "stage3_prefetch_bucket_size": 0.9}


@attrs.frozen(kw_only=True)
class DeepSpeedImport(ImportedJob):
    """A job read from a DeepSpeed config, and what the reading assumed."""

    #: ``zero_optimization.stage`` (0: none)
    stage: int


def parse_source(text: str) -> dict:
    """A DeepSpeed config: JSON (a file's text)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"DeepSpeed config: not JSON ({exc.msg} at line {exc.lineno}); give a ds_config.json "
                          "file or '-'") from None
    if not isinstance(data, Mapping):
        raise ConfigError("DeepSpeed config: expected a JSON object (zero_optimization, train_batch_size, ...)")
    return dict(data)


def _auto(value) -> bool:
    return isinstance(value, str) and value.lower() == "auto"


def _int(cfg: Mapping, key: str, given: int | None, flag: str) -> int | None:
    """A batch key: the config's integer, the command line's for "auto" (or absent), None if neither."""
    value = cfg.get(key)
    if value is None or _auto(value):
        return given
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"DeepSpeed {key} {value!r}: expected a positive integer, or auto with {flag} N")
    return value


def _batch(cfg: Mapping, gpus: int, micro: int | None, global_: int | None) -> tuple[int, int]:
    """(micro-batch, global batch): any two of micro-batch, accumulation and global batch give the third."""
    mbs = _int(cfg, "train_micro_batch_size_per_gpu", micro, "--micro-batch-size")
    gbs = _int(cfg, "train_batch_size", global_, "--global-batch-size")
    gas = _int(cfg, "gradient_accumulation_steps", None, "--global-batch-size")
    if mbs is None and gbs and gas:
        mbs, rest = divmod(gbs, gas * gpus)
        if rest or not mbs:
            raise ConfigError(f"DeepSpeed train_batch_size {gbs} is not gradient_accumulation_steps {gas} × {gpus} GPUs "
                              "× a micro-batch: give train_micro_batch_size_per_gpu")
    if mbs is None:
        raise ConfigError("DeepSpeed train_micro_batch_size_per_gpu is not given (or auto): give --micro-batch-size N")
    if gbs is None:
        gbs = mbs * (gas or 1) * gpus
    check_batch_splits(gbs, mbs, gpus, "DeepSpeed train_batch_size")
    if gas is not None and gbs != mbs * gas * gpus:
        raise ConfigError(f"DeepSpeed train_batch_size {gbs} != train_micro_batch_size_per_gpu {mbs} × "
                          f"gradient_accumulation_steps {gas} × {gpus} GPUs: DeepSpeed refuses this config")
    return mbs, gbs


def _precision(cfg: Mapping, given: str | None) -> str:
    on = {p: section(cfg, p, "DeepSpeed").get("enabled", False) for p in ("bf16", "fp16")}
    if any(_auto(v) for v in on.values()):
        if given is None:
            raise ConfigError("DeepSpeed bf16/fp16 enabled: auto (the Trainer's --bf16 / --fp16 decide): give "
                              "--precision bf16 or fp16")
        return given
    if on["bf16"] is True and on["fp16"] is True:
        raise ConfigError("DeepSpeed bf16 and fp16 are both enabled: DeepSpeed refuses that; enable one")
    chosen = "bf16" if on["bf16"] is True else "fp16" if on["fp16"] is True else given
    if chosen is None:
        raise ConfigError("DeepSpeed config enables neither bf16 nor fp16 (fp32 training, which MoFa does not model): "
                          "enable one, or give --precision bf16|fp16")
    return chosen


def _offload(zero: Mapping, key: str) -> bool:
    device = str(section(zero, key, "DeepSpeed zero_optimization").get("device", "none")).lower()
    if device == "nvme":
        raise ConfigError(f"DeepSpeed zero_optimization.{key}.device nvme: MoFa prices host-memory offload only "
                          "(device cpu)")
    if device not in ("none", "cpu"):
        raise ConfigError(f"DeepSpeed zero_optimization.{key}.device {device!r}: expected none, cpu or nvme")
    return device == "cpu"


def _zero_options(zero: Mapping, stage: int, hidden: int, gated: bool, notes: list[str]) -> dict:
    out: dict[str, Any] = {"stage": stage}
    for key, option in ZERO_OPTIONS.items():
        value = zero.get(key)
        if value is None:
            continue
        if _auto(value):
            if key not in AUTO_BUCKETS:
                continue  # the engine's default
            value = int(AUTO_BUCKETS[key] * hidden * hidden)
            notes.append(f"zero_optimization.{key} auto: {value:,} elements, as Hugging Face's Trainer fills it")
        if option == "overlap_comm":
            value = "on" if value else "off"
        elif isinstance(value, bool) and option not in ("contiguous_gradients", "use_multi_rank_bucket_allreduce"):
            raise ConfigError(f"DeepSpeed zero_optimization.{key} {value!r}: expected a number")
        out[option] = value
    if stage == 3:
        out["modules_per_layer"] = 7 if gated else 4
    return out


def from_deepspeed(source: str | Mapping, registry, *, model: str | None, hardware: str | None, num_gpus: int | None,
                   sequence_length: int | None, micro_batch_size: int | None = None,
                   global_batch_size: int | None = None, precision: str | None = None,
                   gradient_checkpointing: bool = False, attention_kernel: str = "fa2", torch_compile: bool = False,
                   name: str = "deepspeed") -> DeepSpeedImport:
    """A job from a DeepSpeed config (its JSON text, or the parsed dict) and what it does not say."""
    cfg = parse_source(source) if isinstance(source, str) else dict(source)
    model_table, spec = named_model(registry, model, "a DeepSpeed config")
    if not hardware:
        raise ConfigError("a DeepSpeed config does not name the hardware: give --hardware NAME (see mofa list-hardware)")
    registry.hardware_profile(hardware, field="--hardware")
    if not num_gpus:
        raise ConfigError("a DeepSpeed config does not give the GPU count: give --gpus N")
    if not sequence_length:
        raise ConfigError("a DeepSpeed config does not give the sequence length: give --seq-length N")
    if attention_kernel not in ATTENTION_KERNELS:
        raise ConfigError(f"--attention-kernel {attention_kernel}: expected one of {', '.join(ATTENTION_KERNELS)}")
    notes: list[str] = []
    zero = section(cfg, "zero_optimization", "DeepSpeed")
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise ConfigError(f"DeepSpeed zero_optimization.stage {stage!r}: expected 0, 1, 2 or 3")
    params, optim = _offload(zero, "offload_param"), _offload(zero, "offload_optimizer")
    if params and stage != 3:
        raise ConfigError(f"DeepSpeed zero_optimization.offload_param at stage {stage}: DeepSpeed offloads parameters "
                          "at stage 3 only")
    if optim and not stage:
        raise ConfigError("DeepSpeed zero_optimization.offload_optimizer at stage 0: ZeRO-Offload needs stage 1, 2 "
                          "or 3")
    mbs, gbs = _batch(cfg, num_gpus, micro_batch_size, global_batch_size)
    feats: dict[str, dict] = {}
    if params:
        feats["weight_offload"] = {"optimizer": "cpu" if optim else "gpu"}
        notes.append("offload_param: priced as ZeRO-Infinity's weight offload (weight_offload); the stage-3 bucket "
                     "settings are not read")
    elif optim:
        feats["cpu_optimizer"] = {"shard": True}
        if num_gpus > 1:
            feats["dp_overlap"] = {}
        notes.append("offload_optimizer: priced as ZeRO-Offload (cpu_optimizer) with the gradients reduced as they "
                     "are ready; DeepSpeed's bucket settings are not read")
    elif stage:
        zopts = _zero_options(zero, stage, spec.hidden_size, spec.activation is Activation.swiglu, notes)
        accum = str(section(cfg, "data_types", "DeepSpeed").get("grad_accum_dtype", "")).lower()
        if accum == "fp32" and stage == 1:
            zopts["grad_accum_dtype"] = "fp32"
        feats["deepspeed_zero"] = zopts
    job = hugging_face_job(name, model_table, hardware, num_gpus, features=feats,
                           gradient_checkpointing=gradient_checkpointing, torch_compile=torch_compile,
                           attention_kernel=attention_kernel, micro_batch_size=mbs, global_batch_size=gbs,
                           sequence_length=sequence_length, precision=_precision(cfg, precision))
    return DeepSpeedImport(job=job, stage=stage, notes=tuple(notes))


# ---------------------------------------------------------------------- the command


@click.command("deepspeed")
@click.argument("source")
@script_options("Zoo model or HuggingFace config.json (a DeepSpeed config does not name it).")
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs (the launcher's world size).")
@click.option("--micro-batch-size", type=click.IntRange(min=1),
              help="Sequences per GPU and micro-batch, for train_micro_batch_size_per_gpu auto.")
@click.option("--global-batch-size", type=click.IntRange(min=1), help="Sequences per step, for train_batch_size auto.")
@click.option("--precision", type=click.Choice(["bf16", "fp16"]), help="For bf16/fp16 enabled: auto.")
@output_options
@click.pass_context
def deepspeed_cmd(ctx, source, model, hardware, gpus, seq_length, micro_batch_size, global_batch_size, precision,
                  gradient_checkpointing, attention_kernel, torch_compile, name, output, fmt):
    """A job from a DeepSpeed config (SOURCE: a ds_config.json file or '-') and the model, GPUs and
    sequence length it does not give.

    ZeRO's stage and buckets, parameter and optimizer offload, the batch and the precision come from
    the config; what the reading assumed is printed on stderr and kept in the file's header.
    """
    from pathlib import Path

    from mofa_framework.commands.importer import run_plugin_import

    def read(text, registry, stem):
        res = from_deepspeed(text, registry, model=model, hardware=hardware, num_gpus=gpus, sequence_length=seq_length,
                             micro_batch_size=micro_batch_size, global_batch_size=global_batch_size,
                             precision=precision, gradient_checkpointing=gradient_checkpointing,
                             attention_kernel=attention_kernel, torch_compile=torch_compile, name=name or stem)
        return res.job, res.notes, f"ZeRO stage {res.stage}, the model {res.job['model'].get('name') or model}"

    run_plugin_import(ctx, source, "deepspeed", read, Path(output) if output else None, fmt)


@hookimpl
def mofa_register_commands(cli):
    """``mofa import deepspeed``: added to the ``import`` group (lazily, as the command line loads it)."""
    from mofa_framework.cli import add_subcommand

    add_subcommand(cli, "import", deepspeed_cmd)
