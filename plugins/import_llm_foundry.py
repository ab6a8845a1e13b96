"""llm-foundry training YAMLs as MoFa jobs: ``mofa import llm-foundry CONFIG.yaml``.

MosaicML's llm-foundry (Composer on PyTorch FSDP) describes a run by one YAML
(``scripts/train/yamls/pretrain/*.yaml``): the model, the batch, the precision and an
``fsdp_config``; the GPU count is the launcher's. This plugin reads it — a file or ``-`` for
standard input — and writes the job MoFa prices, with the same knowledge of llm-foundry the dense
measurement reader applies to its published benchmark table (``reader_dense``), so what is
validated is what is imported:

| llm-foundry | MoFa |
|---|---|
| ``model.name: mpt_causal_lm`` with ``d_model``, ``n_heads``, ``n_layers``, ``expansion_ratio``, ``vocab_size`` | an inline model: GELU MLP (``ffn_config.ffn_type: mptglu`` gated), LayerNorm, learned positions (``attn_config.rope``: RoPE; ``alibi``: none), tied embeddings (``tie_word_embeddings``, default true), ``kv_n_heads`` with grouped-query attention; named after the zoo model of that shape if there is one |
| ``model.name: hf_causal_lm`` with ``pretrained_model_name_or_path`` | the zoo model of that name (``--model`` for others) |
| ``model.attn_config.attn_impl`` | ``triton`` → the Triton FlashAttention (``attention_kernel = "triton"``), ``flash`` (MPT's default) → FlashAttention-2, ``torch`` → unfused; a Hugging Face model: FlashAttention-2 (``use_flash_attention_2``, or PyTorch SDPA's flash backend) |
| ``global_train_batch_size``, ``device_train_microbatch_size`` (``auto``: give ``--micro-batch-size``), ``max_seq_len`` | the batch; data parallel over every GPU |
| ``precision`` | ``amp_bf16`` → bf16, ``amp_fp16`` → fp16, ``amp_fp8`` → bf16 with ``fp8`` (Transformer Engine's layers) |
| ``fsdp_config.sharding_strategy`` | ``FULL_SHARD`` (default) → ``fsdp``; ``SHARD_GRAD_OP`` → ``fsdp`` keeping each unit gathered to its backward; ``HYBRID_SHARD`` priced as ``FULL_SHARD`` over every GPU (noted); ``NO_SHARD`` → DDP |
| ``fsdp_config.mixed_precision`` | ``PURE`` → gradients reduced in bf16; ``DEFAULT`` in fp32 |
| ``fsdp_config.activation_checkpointing``, ``activation_cpu_offload`` | full ``recompute``; ``activation_offload`` |
| ``compile_config`` absent (Composer's default) | ``eager_kernels``; every data-parallel run gets ``dp_overlap`` |
| ``loss_fn: torch_crossentropy`` | ``fp32_cross_entropy`` (the fused default keeps Megatron-like loss memory) |

OmegaConf interpolations (``${variables.max_seq_len}``, ``${max_seq_len}``) are resolved first. A
value MoFa cannot price (fp32 training, ``tp_config``'s FFN-only tensor parallelism, a batch that does
not divide over the GPUs) is one line naming the key, the value and the fix.

Python API: :func:`from_llm_foundry` (a parsed config or its text) → :class:`LlmFoundryImport`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import click

from mofa_framework import hookimpl
from mofa_framework.errors import ConfigError, UnknownRecordError

from ._frameworks import attention_kernel
from ._imports import (ImportedJob, check_batch_splits, data_parallel_job, fsdp_features, load_yaml, named_model,
                       number, output_options, section)

FRAMEWORK = "llm-foundry (Composer, PyTorch FSDP)"
#: ``precision`` → (MoFa precision, low-precision feature)
PRECISIONS = {"amp_bf16": ("bf16", None), "bf16": ("bf16", None), "amp_fp16": ("fp16", None),
              "fp16": ("fp16", None), "amp_fp8": ("bf16", "fp8")}
#: ``attn_config.attn_impl`` → the job's attention fields
ATTENTION = {"triton": {"flash_attention": True, "attention_kernel": attention_kernel("llm-foundry")},
             "flash": {"flash_attention": True, "attention_kernel": "fa2"},
             "torch": {"flash_attention": False}}
#: nesting depth of ``${...}`` references resolved before a cycle is assumed
MAX_INTERPOLATION_DEPTH = 16


@attrs.frozen(kw_only=True)
class LlmFoundryImport(ImportedJob):
    """A job read from an llm-foundry YAML, and what the reading assumed."""

    #: the zoo model whose shape or name the config gives (None: an inline model)
    model_match: str | None


# ---------------------------------------------------------------------- reading the source


def parse_source(text: str) -> dict:
    """An llm-foundry YAML as a dict, its ``${...}`` interpolations resolved."""
    return _checked(load_yaml(text, "llm-foundry config", "give a training YAML file or '-'"))


def _checked(data) -> dict:
    """A parsed config with a model section, its interpolations resolved."""
    if not isinstance(data, Mapping) or not isinstance(data.get("model"), Mapping):
        raise ConfigError("llm-foundry config: no model section; give a training YAML (model:, "
                          "global_train_batch_size:, fsdp_config:, ...)")
    return _resolve(data, data, 0)


def _resolve(node, root: Mapping, depth: int):
    if isinstance(node, Mapping):
        return {k: _resolve(v, root, depth) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, root, depth) for v in node]
    if not isinstance(node, str) or "${" not in node:
        return node
    if depth > MAX_INTERPOLATION_DEPTH:
        raise ConfigError(f"llm-foundry config: {node!r}: interpolations nest deeper than "
                          f"{MAX_INTERPOLATION_DEPTH} (a cycle?)")
    whole = re.fullmatch(r"\$\{([\w.]+)\}", node.strip())
    if whole:  # the value itself (a number stays a number)
        return _resolve(_lookup(root, whole.group(1), node), root, depth + 1)
    return re.sub(r"\$\{([\w.]+)\}", lambda m: str(_resolve(_lookup(root, m.group(1), node), root, depth + 1)), node)


def _lookup(root: Mapping, path: str, where: str):
    node: Any = root
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise ConfigError(f"llm-foundry config: {where!r} refers to {path}, which the config does not set")
        node = node[part]
    return node


# ---------------------------------------------------------------------- the model


def _mpt(m: Mapping, notes: list[str]) -> dict:
    """The inline model of an ``mpt_causal_lm`` section (MPTConfig's defaults where it is silent)."""
    need = [k for k in ("d_model", "n_heads", "n_layers") if not isinstance(m.get(k), int)]
    if need:
        raise ConfigError(f"llm-foundry model: {', '.join(need)} not given as integers: an mpt_causal_lm needs "
                          "d_model, n_heads and n_layers")
    h, heads, layers = m["d_model"], m["n_heads"], m["n_layers"]
    attn = section(m, "attn_config", "llm-foundry model")
    ffn_cfg = section(m, "ffn_config", "llm-foundry model")
    gated = str(ffn_cfg.get("ffn_type", "mptmlp")) == "mptglu"
    ffn = (number(ffn_cfg["ffn_hidden_size"], "llm-foundry model.ffn_config.ffn_hidden_size", int)
           if ffn_cfg.get("ffn_hidden_size") is not None
           else int(number(m.get("expansion_ratio", 4), "llm-foundry model.expansion_ratio") * h))
    kv = number(attn.get("kv_n_heads", heads), "llm-foundry model.attn_config.kv_n_heads", int) \
        if attn.get("attn_type") == "grouped_query_attention" else heads
    pos = "rope" if attn.get("rope") else ("none" if attn.get("alibi") else "learned")
    if m.get("learned_pos_emb") is False and pos == "learned":
        pos = "none"
    norm = "rmsnorm" if "rms" in str(m.get("norm_type", "low_precision_layernorm")) else "layernorm"
    if attn.get("sliding_window_size", -1) not in (-1, None):
        notes.append(f"attn_config.sliding_window_size {attn['sliding_window_size']} is not priced: full attention")
    return {"num_layers": layers, "hidden_size": h, "num_attention_heads": heads, "num_kv_heads": kv,
            "ffn_hidden_size": ffn, "vocab_size": number(m.get("vocab_size", 50368), "llm-foundry model.vocab_size", int),
            "activation": "swiglu" if gated else "gelu", "normalization": norm, "position_embedding": pos,
            "tied_embeddings": bool(m.get("tie_word_embeddings", True))}


def _hf_name(m: Mapping, registry) -> str:
    """The zoo model an ``hf_causal_lm`` section names by its Hub id (the registry drops the organisation)."""
    name = str(m.get("pretrained_model_name_or_path") or "")
    if not name:
        raise ConfigError("llm-foundry model: hf_causal_lm without pretrained_model_name_or_path: name the model "
                          "with --model NAME (see mofa list-models)")
    try:
        return registry.model(name).name
    except UnknownRecordError:
        raise ConfigError(f"llm-foundry model: pretrained_model_name_or_path {name!r} is no zoo model: give --model "
                          "NAME (see mofa list-models) or a HuggingFace config.json") from None


def _model(cfg: Mapping, registry, model: str | None, name: str, notes: list[str]) -> tuple[dict, str | None]:
    """([model] table, the zoo model it names or None)."""
    if model is not None:
        table, _ = named_model(registry, model, "the config")
        return table, table.get("name")
    m = cfg["model"]
    kind = str(m.get("name", ""))
    if kind == "hf_causal_lm":
        zoo = _hf_name(m, registry)
        return {"name": zoo}, zoo
    if kind != "mpt_causal_lm":
        raise ConfigError(f"llm-foundry model.name {kind!r}: MoFa reads mpt_causal_lm and hf_causal_lm; give "
                          "--model NAME for another")
    fields = _mpt(m, notes)
    from mofa_framework.megatron import match_model

    matches = match_model(fields, registry.models)
    if matches:
        return {"name": matches[0]}, matches[0]
    slug = re.sub(r"[^a-z0-9.\-]+", "-", name.lower()).strip("-.") or "llm-foundry"
    return {"name": f"{slug}-model", **fields}, None


# ---------------------------------------------------------------------- the run


def _batch(cfg: Mapping, gpus: int, micro: int | None) -> tuple[int, int]:
    gbs = cfg.get("global_train_batch_size")
    if not isinstance(gbs, int) or gbs < 1:
        raise ConfigError(f"llm-foundry global_train_batch_size {gbs!r}: expected a positive integer (sequences "
                          "per optimizer step)")
    mbs = micro if micro is not None else cfg.get("device_train_microbatch_size", cfg.get("device_train_batch_size"))
    if mbs == "auto":
        raise ConfigError("llm-foundry device_train_microbatch_size auto: Composer picks it at run time; give "
                          "--micro-batch-size N (sequences per GPU and micro-batch)")
    if not isinstance(mbs, int) or mbs < 1:
        raise ConfigError(f"llm-foundry device_train_microbatch_size {mbs!r}: expected a positive integer or auto")
    check_batch_splits(gbs, mbs, gpus, "llm-foundry global_train_batch_size")
    return mbs, gbs


def _sequence(cfg: Mapping) -> int:
    seq = cfg.get("max_seq_len", cfg["model"].get("max_seq_len"))
    if not isinstance(seq, int) or seq < 1:
        raise ConfigError(f"llm-foundry max_seq_len {seq!r}: expected a positive integer (tokens per sequence)")
    return seq


def _attention(m: Mapping) -> dict:
    if str(m.get("name")) == "hf_causal_lm":  # FlashAttention-2, or PyTorch SDPA's flash backend (FA2 too)
        return dict(ATTENTION["flash"])
    impl = str(section(m, "attn_config", "llm-foundry model").get("attn_impl", "flash"))  # MPTConfig's default
    if impl not in ATTENTION:
        raise ConfigError(f"llm-foundry model.attn_config.attn_impl {impl!r}: expected one of {', '.join(ATTENTION)}")
    return dict(ATTENTION[impl])


def _features(cfg: Mapping, gpus: int, notes: list[str]) -> tuple[dict, str]:
    """(features, precision)."""
    prec = str(cfg.get("precision", "amp_bf16"))
    if prec not in PRECISIONS:
        raise ConfigError(f"llm-foundry precision {prec!r}: MoFa prices {', '.join(PRECISIONS)} (fp32 training is "
                          "not modelled)")
    precision, lowp = PRECISIONS[prec]
    feats: dict[str, dict] = {}
    fsdp = section(cfg, "fsdp_config", "llm-foundry") if cfg.get("fsdp_config") is not None else None
    if fsdp is not None:
        feats.update(fsdp_features(fsdp.get("sharding_strategy", "FULL_SHARD"), notes=notes,
                                   what="llm-foundry fsdp_config.sharding_strategy",
                                   reduce_bf16=str(fsdp.get("mixed_precision", "DEFAULT")).upper() == "PURE"))
    if fsdp and fsdp.get("device_mesh"):
        notes.append(f"fsdp_config.device_mesh {fsdp['device_mesh']} is not priced: sharding over every GPU")
    if fsdp and fsdp.get("activation_checkpointing"):
        feats["recompute"] = {"granularity": "full"}
    if fsdp and fsdp.get("activation_cpu_offload"):
        feats["activation_offload"] = {}
    if lowp:
        feats[lowp] = {}
    if str(cfg.get("loss_fn", "")) == "torch_crossentropy":
        feats["fp32_cross_entropy"] = {}
    if "compile_config" not in cfg:
        feats["eager_kernels"] = {}
    if gpus > 1:
        feats["dp_overlap"] = {}
    return feats, precision


def from_llm_foundry(source: str | Mapping, registry, *, hardware: str | None, num_gpus: int | None,
                     model: str | None = None, micro_batch_size: int | None = None,
                     name: str = "llm-foundry") -> LlmFoundryImport:
    """A job from an llm-foundry training YAML (its text, or the parsed dict)."""
    cfg = parse_source(source) if isinstance(source, str) else _checked(source)
    if not hardware:
        raise ConfigError("the hardware is not in an llm-foundry config: give --hardware NAME (see mofa list-hardware)")
    registry.hardware_profile(hardware, field="--hardware")
    if not num_gpus:
        raise ConfigError("the GPU count is not in an llm-foundry config (the launcher sets it): give --gpus N")
    if section(cfg, "tp_config", "llm-foundry").get("tensor_parallel_degree", 1) not in (1, None):
        raise ConfigError(f"llm-foundry tp_config {cfg['tp_config']}: its tensor parallelism shards the FFN only, "
                          "which MoFa does not model: remove tp_config (FSDP only)")
    notes: list[str] = []
    model_table, match = _model(cfg, registry, model, name, notes)
    mbs, gbs = _batch(cfg, num_gpus, micro_batch_size)
    feats, precision = _features(cfg, num_gpus, notes)
    job = data_parallel_job(name, model_table, hardware, num_gpus, micro_batch_size=mbs, global_batch_size=gbs,
                            sequence_length=_sequence(cfg), precision=precision, features=feats,
                            **_attention(cfg["model"]))
    return LlmFoundryImport(job=job, model_match=match, notes=tuple(notes))


# ---------------------------------------------------------------------- the command


@click.command("llm-foundry")
@click.argument("source")
@click.option("--hardware", help="Hardware profile (an llm-foundry config does not say; see mofa list-hardware).")
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs (the launcher's world size).")
@click.option("--model", help="Zoo model or HuggingFace config.json, instead of the config's model section.")
@click.option("--micro-batch-size", type=click.IntRange(min=1),
              help="Sequences per GPU and micro-batch (needed when device_train_microbatch_size is auto).")
@output_options
@click.pass_context
def llm_foundry_cmd(ctx, source, hardware, gpus, model, micro_batch_size, name, output, fmt):
    """A job from an llm-foundry training YAML (SOURCE: a file or '-').

    The model comes from the model section (an MPT shape or a Hugging Face name), the batch from
    global_train_batch_size and device_train_microbatch_size, sharding and recompute from
    fsdp_config; what the reading assumed is printed on stderr and kept in the file's header.
    """
    from mofa_framework.commands.importer import run_plugin_import

    def read(text, registry, stem):
        res = from_llm_foundry(text, registry, hardware=hardware, num_gpus=gpus, model=model,
                               micro_batch_size=micro_batch_size, name=name or stem)
        what = f"the zoo model {res.model_match}" if res.model_match else f"an inline model {res.job['model']['name']}"
        return res.job, res.notes, what

    run_plugin_import(ctx, source, "llm-foundry", read, Path(output) if output else None, fmt)


@hookimpl
def mofa_register_commands(cli):
    """``mofa import llm-foundry``: added to the ``import`` group (lazily, as the command line loads it)."""
    from mofa_framework.cli import add_subcommand

    add_subcommand(cli, "import", llm_foundry_cmd)
