"""torchtitan training configs as MoFa jobs: ``mofa import torchtitan CONFIG.toml``.

torchtitan (PyTorch's FSDP2 / DTensor training stack) describes a run by a TOML train config
(``torchtitan/models/*/train_configs/*.toml``, 2024–2025) or by ``--section.option value`` flags
(``run_train.sh`` overrides). This plugin reads either — a file, ``-`` for standard input, or the
flags in quotes — and writes the job MoFa prices, with the same knowledge of torchtitan the
dense measurement reader applies to torchtitan's published runs (``reader_dense``), so what is
validated is what is imported:

| torchtitan | MoFa |
|---|---|
| ``model.name`` + ``model.flavor`` (``llama3`` / ``8B``) | the zoo model (:data:`FLAVORS`; ``--model`` for others) |
| ``parallelism.*_degree`` | ``tp``, ``pp``, ``cp``, ``ep``, ``etp``; data parallel = replicate × shard (``-1``: the GPUs left) |
| ``data_parallel_shard_degree`` > 1 | ``fsdp`` (``fsdp_reshard_after_forward``: ``never`` → kept gathered); under a pipeline torchtitan keeps each stage gathered with unreduced gradients: ``distributed_optimizer`` |
| replicate only (DDP) | no sharding; every data-parallel run gets ``dp_overlap`` |
| ``training.local_batch_size`` (``batch_size`` before 2025) | the micro-batch without a pipeline (a rank runs its batch at once); ``pipeline_parallel_microbatch_size`` with one |
| ``training.global_batch_size`` (``-1``: local × data parallel) | ``global_batch_size`` |
| ``pipeline_parallel_schedule`` | ``1F1B`` → ``1f1b``, ``GPipe`` → ``gpipe``, ``Interleaved1F1B`` → ``interleaved-1f1b`` (two stages per rank, or ``pipeline_parallel_layers_per_stage``), ``ZBVZeroBubble`` → ``zbv-zero-bubble`` (ZB-V as PyTorch's pipelining runs it, beside FSDP2 and torchao; not the sail-sg fork's ``zb-v``) |
| ``activation_checkpoint.mode`` | ``full`` → full recompute; ``selective`` with ``op`` → per-op; with ``n`` → full recompute of every n-th block |
| ``compile.enable`` (``training.compile`` before) false | ``eager_kernels``; the loss in fp32 either way (``fp32_cross_entropy``, compiled with ``loss`` among the components) |
| ``model.converters`` with ``float8`` | ``fp8`` as torchao runs it (``quantize.linear.float8.recipe_name``, or ``float8.recipe_name``: tensorwise by default) |
| attention | PyTorch SDPA's FlashAttention-2 backend (``fa2``) |

A 2024 config (parallel degrees under ``[training]`` and ``[experimental]``, ``[float8]
enable_float8_linear``, ``pipeline_parallel_microbatches``) is read in the 2025 layout first
(:func:`modernise`).

**Choices**, each named in the job file's notes when it applies: HSDP (replicate and shard both
> 1) is priced as FSDP over the whole data-parallel group; ``enable_async_tensor_parallel`` is not
priced (torchtitan's own tables measure async TP 9–14 % faster than vanilla TP, less than MoFa's
``tp_overlap`` hides — docs/validation.md —; add ``--feature tp_overlap:method=chunked`` to price
it); ``memory_budget`` activation checkpointing is priced as per-op selective recompute. A value
MoFa cannot price (fp32 parameters, a schedule it has not got, degrees that do not multiply to the
GPUs) is one line naming the key, the value and the fix.

Python API: :func:`from_torchtitan` (a parsed config or its text) → :class:`TorchtitanImport`.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import click

from mofa_framework import hookimpl
from mofa_framework.errors import ConfigError

from ._frameworks import attention_kernel, loss_features, torch_cp_features
from ._megatron import precision as precision_of
from ._megatron import uneven_pipeline
from .reader_dense import TORCHTITAN_AC_EVERY, TORCHTITAN_STAGES_PER_RANK
from .reader_dense import _recompute as reader_recompute
from .torch_cp import ROTATE_METHODS

FRAMEWORK = "torchtitan"

#: torchtitan's (``model.name``, ``model.flavor``) → the zoo model of the same shape
FLAVORS = {
    ("llama3", "1B"): "llama3.2-1b", ("llama3", "3B"): "llama3.2-3b", ("llama3", "8B"): "llama3.1-8b",
    ("llama3", "70B"): "llama3.1-70b", ("llama3", "405B"): "llama3.1-405b",
    ("qwen3", "8B"): "qwen3-8b", ("qwen3", "32B"): "qwen3-32b", ("qwen3", "30B-A3B"): "qwen3-30b-a3b",
    ("qwen3", "235B-A22B"): "qwen3-235b-a22b",
    ("deepseek_v3", "16B"): "deepseek-v2-lite", ("deepseek_v3", "236B"): "deepseek-v2",
    ("deepseek_v3", "671B"): "deepseek-v3-no-mtp",
    ("llama4", "17bx16e"): "llama4-scout", ("llama4", "17bx128e"): "llama4-maverick",
    ("gpt_oss", "20b"): "gpt-oss-20b", ("gpt_oss", "120b"): "gpt-oss-120b",
}
#: torch.distributed.pipelining schedule → (MoFa schedule, stages per rank or None: from the config)
SCHEDULES = {"1f1b": ("1f1b", 1), "gpipe": ("gpipe", 1), "interleaved1f1b": ("interleaved-1f1b", None),
             "zbvzerobubble": ("zbv-zero-bubble", 2)}
#: the converter names that turn on torchao's float8 linears (before and after torchtitan's 2025 rename)
FLOAT8_CONVERTERS = ("float8", "quantize.linear.float8")


@attrs.frozen(kw_only=True)
class TorchtitanImport:
    """A job read from a torchtitan config, and what the reading assumed."""

    #: the job as a dict shaped like the TOML job file
    job: dict
    #: the settings that changed the job, as ``section.key = value``
    used: tuple[str, ...]
    notes: tuple[str, ...]


# ---------------------------------------------------------------------- reading the source


def parse_source(text: str) -> dict:
    """A torchtitan config: TOML text, or ``--section.key value`` / ``--section.key=value`` flags
    (a bare ``--section.flag`` is true)."""
    if text.lstrip().startswith("--"):
        return _parse_flags(text.split())
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"torchtitan config: not TOML ({exc}); give a train config file, '-' for standard "
                          "input, or --section.key value flags in quotes") from None


def _parse_flags(words: list[str]) -> dict:
    out: dict = {}
    i = 0
    while i < len(words):
        w = words[i]
        if not w.startswith("--") or "." not in w:
            raise ConfigError(f"torchtitan flags: {w!r} is not a --section.key flag (e.g. "
                              "--parallelism.tensor_parallel_degree 8)")
        key, sep, value = w[2:].partition("=")
        if not sep:  # --key value, or a bare --key (true)
            nxt = words[i + 1] if i + 1 < len(words) else None
            value, i = ("true", i) if nxt is None or nxt.startswith("--") else (nxt, i + 1)
        node = out
        *path, leaf = key.split(".")
        for p in path:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"torchtitan flags: --{key}: {p!r} was given a value of its own before")
        node[leaf] = _scalar(value)
        i += 1
    return out


def _scalar(value: str) -> Any:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    if value.startswith("[") and value.endswith("]"):
        return [v.strip().strip("'\"") for v in value[1:-1].split(",") if v.strip()]
    return value.strip("'\"")


#: where torchtitan's 2024 configs kept what ``[parallelism]`` holds since 2025
LEGACY_PARALLELISM = ("training", "experimental")
PARALLELISM_KEYS = ("data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
                    "enable_async_tensor_parallel", "pipeline_parallel_degree", "pipeline_parallel_schedule",
                    "pipeline_parallel_microbatches", "context_parallel_degree", "context_parallel_rotate_method",
                    "expert_parallel_degree")


def modernise(cfg: Mapping, notes: list[str]) -> tuple[dict, bool]:
    """A 2024 config in the 2025 layout: the parallel degrees of ``[training]`` and ``[experimental]``
    moved to ``[parallelism]``, ``[float8] enable_float8_linear`` to a ``float8`` converter, and its
    pipeline split into ``pipeline_parallel_microbatches`` micro-batches (default: the PP degree,
    torchtitan's default until pytorch/torchtitan#1073) as a micro-batch size. (config, whether it
    was a 2024 one)."""
    if "parallelism" in cfg:
        return dict(cfg), False
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in cfg.items()}
    par = out.setdefault("parallelism", {})
    for section in LEGACY_PARALLELISM:
        for key in PARALLELISM_KEYS:
            if key in out.get(section, {}):
                par[key] = out[section].pop(key)
    if (out.get("float8") or {}).get("enable_float8_linear"):
        out.setdefault("model", {}).setdefault("converters", ["float8"])
    pp = par.get("pipeline_parallel_degree", 1)
    local = (out.get("training") or {}).get("batch_size")
    if isinstance(pp, int) and pp > 1 and isinstance(local, int) and local > 0:
        n = par.pop("pipeline_parallel_microbatches", pp)
        if isinstance(n, int) and n > 0 and local % n == 0:
            par["pipeline_parallel_microbatch_size"] = local // n
    if par:
        notes.append("a 2024 config: [training] / [experimental] parallel keys read as [parallelism]; its "
                     "train.py did not compile the loss")
    return out, bool(par)


#: the config's tables MoFa reads: each must be a table (``[training]``, not ``training = 3``)
READ_TABLES = ("model", "training", "parallelism", "experimental", "activation_checkpoint", "compile", "float8",
               "quantize")


def _tables(cfg: Mapping) -> Mapping:
    for name in READ_TABLES:
        if name in cfg and not isinstance(cfg[name], Mapping):
            raise ConfigError(f"{name}: expected a table ([{name}] or --{name}.key value), got {cfg[name]!r}")
    return cfg


class _Config:
    """Typed access to a parsed torchtitan config, remembering what was read."""

    def __init__(self, cfg: Mapping):
        self.cfg = cfg
        self.used: list[str] = []

    def get(self, key: str, default=None, *, keep: bool = True):
        node: Any = self.cfg
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return default
            node = node[part]
        if keep:
            self.used.append(f"{key} = {node!r}")
        return node

    def count(self, key: str, default: int, *, minimum: int = 1) -> int:
        v = self.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ConfigError(f"{key}: expected an integer ≥ {minimum}, got {v!r}")
        return v


# ---------------------------------------------------------------------- the mapping


def _model(c: _Config, model: str | None) -> str:
    if model is not None:
        return model
    name, flavor = c.get("model.name", "llama3"), str(c.get("model.flavor", "debugmodel"))
    zoo = FLAVORS.get((name, flavor))
    if zoo is None:
        known = ", ".join(sorted({n for n, _ in FLAVORS}))
        raise ConfigError(f"model.name / model.flavor: {name!r} / {flavor!r} is not a torchtitan model MoFa knows "
                          f"(flavors of {known}; docs/megatron-import.md): pass --model with a zoo model "
                          "(mofa list-models) or a HuggingFace config.json")
    return zoo


def _data_parallel(c: _Config, tp: int, pp: int, cp: int, num_gpus: int | None) -> tuple[int, int, int]:
    """(replicate, shard, GPUs): ``data_parallel_shard_degree = -1`` takes the GPUs left."""
    replicate = c.count("parallelism.data_parallel_replicate_degree", 1)
    shard = c.get("parallelism.data_parallel_shard_degree", -1)
    others = replicate * tp * pp * cp
    if shard == -1:
        if num_gpus is None:
            raise ConfigError("parallelism.data_parallel_shard_degree = -1 takes the GPUs left over: give --gpus")
        if num_gpus % others:
            raise ConfigError(f"--gpus {num_gpus}: not a multiple of replicate × tp × pp × cp = {others}; "
                              "give a GPU count the degrees divide")
        return replicate, num_gpus // others, num_gpus
    shard = c.count("parallelism.data_parallel_shard_degree", 1)
    total = others * shard
    if num_gpus is not None and num_gpus != total:
        raise ConfigError(f"--gpus {num_gpus}: the config's degrees multiply to {total} GPUs (replicate × shard × "
                          f"tp × pp × cp); give --gpus {total} or set data_parallel_shard_degree = -1")
    return replicate, shard, total


def _pipeline(c: _Config, pp: int, num_layers: int, notes: list[str]) -> tuple[dict, dict]:
    """(parallel updates, the job's ``[pipeline]`` table) for the schedule."""
    if pp == 1:
        return {}, {}
    given = str(c.get("parallelism.pipeline_parallel_schedule", "1F1B"))
    known = SCHEDULES.get(given.lower().replace("_", ""))
    if known is None:
        raise ConfigError(f"parallelism.pipeline_parallel_schedule: {given!r} has no MoFa schedule; use one of "
                          f"{', '.join(('1F1B', 'GPipe', 'Interleaved1F1B', 'ZBVZeroBubble'))}")
    name, vpp = known
    if vpp is None:
        per_stage = c.get("parallelism.pipeline_parallel_layers_per_stage")
        if per_stage:
            stages = -(-(num_layers + 2) // int(per_stage))  # the embedding and the output count as a layer
            vpp = max(stages // pp, 1)
        else:
            vpp = TORCHTITAN_STAGES_PER_RANK
    par = {"vpp": vpp, **uneven_pipeline(num_layers, pp, vpp)}
    if name == "interleaved-1f1b" and vpp == 1:
        name = "1f1b"
        notes.append("Interleaved1F1B with one stage per rank is 1F1B")
    return par, {"schedule": name}


def _features(c: _Config, *, tp: int, pp: int, dp: int, shard: int, replicate: int, num_layers: int,
              legacy: bool, notes: list[str]) -> dict:
    feats: dict[str, dict] = {}
    if shard > 1 and pp > 1:
        feats["distributed_optimizer"] = {}  # FSDP2 under a pipeline: gathered stages (reader_dense)
    elif shard > 1:
        reshard = c.get("parallelism.fsdp_reshard_after_forward", "default")
        feats["fsdp"] = {"reshard_after_forward": False} if reshard == "never" else {}
        if replicate > 1:
            notes.append(f"HSDP (replicate {replicate} × shard {shard}) priced as FSDP over all {dp} data-parallel ranks")
    if dp > 1:
        feats["dp_overlap"] = {}
    rec = _recompute(c, pp, num_layers, notes)
    if rec is not None:
        feats["recompute"] = rec
    compiled = bool(c.get("compile.enable", c.get("training.compile", False, keep=False)))
    components = c.get("compile.components", ["model", "loss"], keep=False) if compiled else []
    if "model" not in components:
        feats["eager_kernels"] = {}
    cp = c.count("parallelism.context_parallel_degree", 1)
    if cp > 1:
        # PyTorch's context_parallel; a 2024 config's models repeated K/V before attention
        rotate = str(c.get("parallelism.context_parallel_rotate_method", "allgather"))
        if rotate not in ROTATE_METHODS:
            raise ConfigError(f"parallelism.context_parallel_rotate_method: {rotate!r}; torchtitan's are "
                              f"{', '.join(ROTATE_METHODS)}")
        feats.update(torch_cp_features(FRAMEWORK, cp, repeat_kv=legacy, rotate=rotate))
    # torchtitan's 2024 train.py left the loss uncompiled (reader_dense: loss_features)
    loss_compiled = "loss" in components and not legacy
    feats.update(loss_features(FRAMEWORK, "torch.compile" if loss_compiled else ""))
    given = c.get("model.converters", [])
    converters = [given] if isinstance(given, str) else [str(x) for x in given]
    if any(x in FLOAT8_CONVERTERS for x in converters):
        recipe = str(c.get("quantize.linear.float8.recipe_name") or c.get("float8.recipe_name") or "tensorwise")
        _, lowp, options = precision_of(f"float8 {recipe}")
        feats[lowp] = {**options, "weight_cache": False, "fp8_activations": False}  # torchao's Float8Linear
    elif converters:
        notes.append(f"model.converters {converters}: not priced (MoFa reads torchao's float8 linears)")
    if tp > 1 and c.get("parallelism.enable_async_tensor_parallel", False):
        notes.append("async TP not priced (torchtitan measures it 9-14 % faster than vanilla TP, less than "
                     "tp_overlap hides): add --feature tp_overlap:method=chunked to price it")
    return feats


def _recompute(c: _Config, pp: int, num_layers: int, notes: list[str]) -> dict | None:
    """``[activation_checkpoint]`` as the dense reader reads a torchtitan row's recompute column."""
    mode = str(c.get("activation_checkpoint.mode", "selective"))
    if mode == "memory_budget":
        notes.append("memory_budget activation checkpointing priced as per-op selective recompute")
        mode, text = "selective", "selective op"
    elif mode == "selective":
        option = str(c.get("activation_checkpoint.selective_ac_option", str(TORCHTITAN_AC_EVERY)))
        if option != "op" and not (option.isdigit() and int(option) >= 1):
            raise ConfigError(f"activation_checkpoint.selective_ac_option: {option!r}; use 'op' or a positive "
                              "integer n (every n-th block)")
        text = "selective op" if option == "op" else f"selective layer every {option}"
    elif mode in ("full", "none"):
        text = mode
    else:
        raise ConfigError(f"activation_checkpoint.mode: {mode!r} is not a torchtitan mode; use none, selective, "
                          "full or memory_budget")
    return reader_recompute(text, FRAMEWORK, num_layers // pp)


def from_torchtitan(config: Mapping | str, registry, *, hardware: str, num_gpus: int | None = None,
                    model: str | None = None, name: str = "torchtitan") -> TorchtitanImport:
    """The MoFa job of a torchtitan train config (parsed, or its TOML / flags text) on `hardware`;
    ConfigError naming the key for what MoFa cannot price."""
    notes: list[str] = []
    cfg, legacy = modernise(_tables(parse_source(config) if isinstance(config, str) else config), notes)
    c = _Config(cfg)
    if not hardware:
        raise ConfigError("--hardware: a torchtitan config does not name the GPU; give a profile "
                          "(mofa list-hardware)")
    param = str(c.get("training.mixed_precision_param", "bfloat16"))
    if param != "bfloat16":
        raise ConfigError(f"training.mixed_precision_param: {param!r}; MoFa prices bf16 training with its GEMM "
                          "formats (bf16, fp8): use bfloat16")
    model_name = _model(c, model)
    spec = registry.model(model_name)
    tp = c.count("parallelism.tensor_parallel_degree", 1)
    pp = c.count("parallelism.pipeline_parallel_degree", 1)
    cp = c.count("parallelism.context_parallel_degree", 1)
    ep = c.count("parallelism.expert_parallel_degree", 1)
    etp = c.count("parallelism.expert_tensor_parallel_degree", 1)
    replicate, shard, gpus = _data_parallel(c, tp, pp, cp, num_gpus)
    dp = replicate * shard
    local = c.count("training.local_batch_size" if c.get("training.local_batch_size", keep=False) is not None
                    else "training.batch_size", 8)
    gbs = c.get("training.global_batch_size", -1)
    gbs = local * dp if gbs in (-1, None) else c.count("training.global_batch_size", 1)
    mbs = c.count("parallelism.pipeline_parallel_microbatch_size", 1) if pp > 1 else local
    seq = c.count("training.seq_len", 2048)
    pipe_par, pipeline = _pipeline(c, pp, spec.num_layers, notes)
    feats = _features(c, tp=tp, pp=pp, dp=dp, shard=shard, replicate=replicate, num_layers=spec.num_layers,
                      legacy=legacy, notes=notes)
    par: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "micro_batch_size": mbs, "global_batch_size": gbs,
                           "sequence_length": seq, "precision": "bf16", "attention_kernel": attention_kernel(FRAMEWORK)}
    if ep > 1:
        par.update(ep=ep, etp=etp)
    if tp > 1:
        par["sequence_parallel"] = True  # torchtitan's TP shards the norms' sequence
    par.update(pipe_par)
    job: dict[str, Any] = {"name": name, "model": {"name": model_name},
                           "hardware": {"name": hardware, "num_gpus": gpus}, "parallel": par}
    if pipeline:
        job["pipeline"] = pipeline
    job["features"] = feats
    return TorchtitanImport(job=job, used=tuple(c.used), notes=tuple(notes))


# ---------------------------------------------------------------------- the command


@click.command("torchtitan", context_settings={"ignore_unknown_options": True})  # flags in quotes are SOURCE
@click.argument("source")
@click.option("--hardware", help="Hardware profile (a torchtitan config does not say; see mofa list-hardware).")
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs (needed when data_parallel_shard_degree is -1).")
@click.option("--model", help="Zoo model or HuggingFace config.json, instead of model.name / model.flavor.")
@click.option("--name", help="The job's name (default: the file's stem).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), metavar="JOB.toml",
              help="Write the job file here (default: standard output).")
@click.option("--format", "fmt", type=click.Choice(["toml", "json"]), default="toml", show_default=True)
@click.pass_context
def torchtitan_cmd(ctx, source, hardware, gpus, model, name, output, fmt):
    """A job from a torchtitan train config (SOURCE: a TOML file, '-', or --section.key value
    flags in quotes).

    The model comes from model.name and model.flavor, the layout from [parallelism], the batch
    from [training], recompute from [activation_checkpoint], kernels from [compile], float8 from
    model.converters; what the reading assumed is printed on stderr and kept in the file's header.
    """
    from mofa_framework.commands.importer import run_plugin_import

    def read(text, registry, stem):
        res = from_torchtitan(text, registry, hardware=hardware, num_gpus=gpus, model=model, name=name or stem)
        return res.job, res.notes, f"the zoo model {res.job['model']['name']}; {len(res.used)} settings read"

    run_plugin_import(ctx, source, "torchtitan", read, output, fmt)


@hookimpl
def mofa_register_commands(cli):
    """``mofa import torchtitan``: added to the ``import`` group (lazily, as the command line loads it)."""
    from mofa_framework.cli import add_subcommand

    add_subcommand(cli, "import", torchtitan_cmd)
