"""Hugging Face Accelerate configs as MoFa jobs: ``mofa import accelerate config.yaml --model NAME``.

``accelerate config`` writes a YAML (``default_config.yaml``) that ``accelerate launch`` runs a
training script under: how many processes (GPUs), the mixed precision, and the distribution —
PyTorch FSDP (``fsdp_config``), DeepSpeed (``deepspeed_config`` or ``deepspeed_config_file``) or
plain DDP. The model, the sequence and the batch are the script's: ``--model``, ``--seq-length``,
``--micro-batch-size`` (and ``--gradient-accumulation-steps`` or ``--global-batch-size``) give them.

| Accelerate | MoFa |
|---|---|
| ``num_processes`` (every machine's) | the GPUs (``--gpus`` overrides, noted) |
| ``mixed_precision`` | ``bf16``, ``fp16``; ``fp8`` → ``fp8`` on a bf16 job; ``no`` (fp32) refused |
| ``distributed_type: FSDP``, ``fsdp_sharding_strategy`` (a name, or 1–5 as older configs number them) | ``FULL_SHARD`` → ``fsdp``; ``SHARD_GRAD_OP`` → ``fsdp`` kept gathered to the backward; ``HYBRID_SHARD`` as ``FULL_SHARD`` over every GPU (noted); ``NO_SHARD`` → DDP; FSDP2's ``fsdp_reshard_after_forward: false`` alike |
| ``fsdp_offload_params: true`` | ``weight_offload`` (parameters, gradients and the update on the host) |
| ``fsdp_activation_checkpointing: true`` | full ``recompute`` (``--gradient-checkpointing`` too) |
| ``distributed_type: DEEPSPEED`` | ``mofa import deepspeed``'s reading of ``deepspeed_config`` (``zero_stage``, ``offload_optimizer_device``, ``offload_param_device``, ``gradient_accumulation_steps``) or of the JSON ``deepspeed_config_file`` names |
| ``distributed_type: MULTI_GPU`` | DDP: ``dp_overlap`` |

Every data-parallel run gets ``dp_overlap`` beside FSDP; the attention is PyTorch SDPA's
FlashAttention-2 unless ``--attention-kernel`` says; a Hugging Face model's element-wise kernels run
eager and its loss on fp32 logits (``eager_kernels``, ``fp32_cross_entropy``) unless
``--torch-compile``. Python API: :func:`from_accelerate`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs
import click

from mofa_framework import hookimpl
from mofa_framework.errors import ConfigError

from ._imports import (FSDP_STRATEGIES, ImportedJob, check_batch_splits, fsdp_features, hugging_face_job, load_yaml,
                       named_model, output_options, script_options, section)
from .import_deepspeed import from_deepspeed

PRECISIONS = {"bf16": ("bf16", None), "fp16": ("fp16", None), "fp8": ("bf16", "fp8")}
#: Accelerate's ``deepspeed_config`` keys → DeepSpeed's config (``DeepSpeedPlugin``)
DEEPSPEED_KEYS = {"zero_stage": ("zero_optimization", "stage"),
                  "offload_optimizer_device": ("zero_optimization", "offload_optimizer", "device"),
                  "offload_param_device": ("zero_optimization", "offload_param", "device"),
                  "gradient_accumulation_steps": ("gradient_accumulation_steps",)}


@attrs.frozen(kw_only=True)
class AccelerateImport(ImportedJob):
    """A job read from an Accelerate config, and what the reading assumed."""

    #: ``distributed_type``
    distribution: str


def parse_source(text: str) -> dict:
    data = load_yaml(text, "Accelerate config", "give the file accelerate config wrote")
    if not isinstance(data, Mapping) or "distributed_type" not in data:
        raise ConfigError("Accelerate config: no distributed_type; give the YAML `accelerate config` writes "
                          "(distributed_type, num_processes, mixed_precision, fsdp_config / deepspeed_config)")
    return dict(data)


def _gpus(cfg: Mapping, given: int | None, notes: list[str]) -> int:
    n = cfg.get("num_processes")
    if given:
        if isinstance(n, int) and n != given:
            notes.append(f"--gpus {given} overrides num_processes {n}")
        return given
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"Accelerate num_processes {n!r}: expected the number of GPUs (every machine's), or give "
                          "--gpus N")
    return n


def _precision(cfg: Mapping) -> tuple[str, str | None]:
    mp = str(cfg.get("mixed_precision", "no")).lower()
    if mp not in PRECISIONS:
        raise ConfigError(f"Accelerate mixed_precision {mp!r}: MoFa prices bf16, fp16 and fp8 (fp32 training is not "
                          "modelled)")
    return PRECISIONS[mp]


def _fsdp_features(fsdp: Mapping, notes: list[str]) -> dict:
    value = fsdp.get("fsdp_sharding_strategy", "FULL_SHARD")
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= len(FSDP_STRATEGIES):
        value = FSDP_STRATEGIES[value - 1]  # Accelerate numbers them from 1, in torch's order
    if fsdp.get("fsdp_offload_params"):
        notes.append("fsdp_offload_params: priced as weight_offload (parameters, gradients and the Adam update on the "
                     "host)")
        return {"weight_offload": {"optimizer": "cpu"}}
    feats = fsdp_features(value, what="Accelerate fsdp_config.fsdp_sharding_strategy", notes=notes,
                          reshard=fsdp.get("fsdp_reshard_after_forward") is not False)
    if feats and str(fsdp.get("fsdp_backward_prefetch", "BACKWARD_PRE")).upper() not in ("BACKWARD_PRE", "NONE"):
        notes.append(f"fsdp_backward_prefetch {fsdp['fsdp_backward_prefetch']}: priced as BACKWARD_PRE (the next "
                     "layer's gather ahead of its backward)")
    return feats


def _deepspeed_dict(cfg: Mapping) -> dict:
    """Accelerate's ``deepspeed_config`` as a DeepSpeed config (or the JSON its config file holds)."""
    ds = section(cfg, "deepspeed_config", "Accelerate")
    path = ds.get("deepspeed_config_file")
    if path:
        try:
            import json

            return json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"Accelerate deepspeed_config.deepspeed_config_file {path}: cannot read it as JSON "
                              f"({type(exc).__name__}); give the path from where you run mofa") from None
    out: dict = {}
    for key, where in DEEPSPEED_KEYS.items():
        if key not in ds:
            continue
        node = out
        for k in where[:-1]:
            node = node.setdefault(k, {})
        node[where[-1]] = ds[key]
    return out


def from_accelerate(source: str | Mapping, registry, *, model: str | None, hardware: str | None,
                    num_gpus: int | None, sequence_length: int | None, micro_batch_size: int | None,
                    global_batch_size: int | None = None, gradient_accumulation_steps: int = 1,
                    gradient_checkpointing: bool = False, attention_kernel: str = "fa2", torch_compile: bool = False,
                    name: str = "accelerate") -> AccelerateImport:
    """A job from an Accelerate config (its YAML text, or the parsed dict) and the script's settings."""
    cfg = parse_source(source) if isinstance(source, str) else dict(source)
    notes: list[str] = []
    gpus = _gpus(cfg, num_gpus, notes)
    kind = str(cfg["distributed_type"]).upper()
    precision, lowp = _precision(cfg)
    if kind == "DEEPSPEED":
        ds = _deepspeed_dict(cfg)
        ds.setdefault(precision, {"enabled": True})
        if micro_batch_size:
            ds["train_micro_batch_size_per_gpu"] = micro_batch_size
        if global_batch_size is None:
            ds.setdefault("gradient_accumulation_steps", gradient_accumulation_steps)
        res = from_deepspeed(ds, registry, model=model, hardware=hardware, num_gpus=gpus,
                             sequence_length=sequence_length, global_batch_size=global_batch_size,
                             precision=precision, gradient_checkpointing=gradient_checkpointing,
                             attention_kernel=attention_kernel, torch_compile=torch_compile, name=name)
        if lowp:
            res.job["features"][lowp] = {}
        return AccelerateImport(job=res.job, distribution=kind, notes=tuple(notes) + res.notes)
    if kind not in ("FSDP", "MULTI_GPU", "NO"):
        raise ConfigError(f"Accelerate distributed_type {kind!r}: MoFa reads FSDP, DEEPSPEED, MULTI_GPU and NO")
    model_table, _ = named_model(registry, model, "an Accelerate config")
    if not hardware:
        raise ConfigError("an Accelerate config does not name the hardware: give --hardware NAME (see mofa "
                          "list-hardware)")
    registry.hardware_profile(hardware, field="--hardware")
    if not sequence_length:
        raise ConfigError("an Accelerate config does not give the sequence length (the script's): give --seq-length N")
    if not micro_batch_size:
        raise ConfigError("an Accelerate config does not give the batch (the script's): give --micro-batch-size N")
    gbs = global_batch_size or micro_batch_size * gradient_accumulation_steps * gpus
    check_batch_splits(gbs, micro_batch_size, gpus, "--global-batch-size")
    fsdp = section(cfg, "fsdp_config", "Accelerate")
    feats = _fsdp_features(fsdp, notes) if kind == "FSDP" else {}
    if gpus > 1 and "weight_offload" not in feats:  # weight_offload reduces its own gradients
        feats["dp_overlap"] = {}
    if lowp:
        feats[lowp] = {}
    checkpointing = gradient_checkpointing or bool(fsdp.get("fsdp_activation_checkpointing"))
    job = hugging_face_job(name, model_table, hardware, gpus, features=feats, gradient_checkpointing=checkpointing,
                           torch_compile=torch_compile, attention_kernel=attention_kernel,
                           micro_batch_size=micro_batch_size, global_batch_size=gbs, sequence_length=sequence_length,
                           precision=precision)
    return AccelerateImport(job=job, distribution=kind, notes=tuple(notes))


# ---------------------------------------------------------------------- the command


@click.command("accelerate")
@click.argument("source")
@script_options("Zoo model or HuggingFace config.json (the training script's).")
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs, instead of num_processes.")
@click.option("--micro-batch-size", type=click.IntRange(min=1), help="Sequences per GPU and micro-batch.")
@click.option("--gradient-accumulation-steps", type=click.IntRange(min=1), default=1, show_default=True,
              help="Micro-batches per optimizer step.")
@click.option("--global-batch-size", type=click.IntRange(min=1), help="Sequences per step, instead of the product.")
@output_options
@click.pass_context
def accelerate_cmd(ctx, source, model, hardware, gpus, seq_length, micro_batch_size, gradient_accumulation_steps,
                   global_batch_size, gradient_checkpointing, attention_kernel, torch_compile, name, output, fmt):
    """A job from a Hugging Face Accelerate config (SOURCE: the YAML `accelerate config` wrote, or '-')
    and the training script's model, sequence and batch.

    The GPUs, precision and FSDP or DeepSpeed settings come from the config; what the reading
    assumed is printed on stderr and kept in the file's header.
    """
    from mofa_framework.commands.importer import run_plugin_import

    def read(text, registry, stem):
        res = from_accelerate(text, registry, model=model, hardware=hardware, num_gpus=gpus, sequence_length=seq_length,
                              micro_batch_size=micro_batch_size, global_batch_size=global_batch_size,
                              gradient_accumulation_steps=gradient_accumulation_steps,
                              gradient_checkpointing=gradient_checkpointing, attention_kernel=attention_kernel,
                              torch_compile=torch_compile, name=name or stem)
        return res.job, res.notes, f"{res.distribution} on {res.job['hardware']['num_gpus']} GPUs, the model {model}"

    run_plugin_import(ctx, source, "accelerate", read, Path(output) if output else None, fmt)


@hookimpl
def mofa_register_commands(cli):
    """``mofa import accelerate``: added to the ``import`` group (lazily, as the command line loads it)."""
    from mofa_framework.cli import add_subcommand

    add_subcommand(cli, "import", accelerate_cmd)
