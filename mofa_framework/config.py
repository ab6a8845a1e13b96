"""Job files: TOML read by cattrs into frozen attrs classes, unknown keys rejected by path.

A job file has the sections ``[model]``, ``[hardware]``, ``[parallel]``, ``[pipeline]``,
``[features.<plugin>]``, ``[training]`` and ``[fault]`` (see docs/job-file.md). Reading it
yields a :class:`TrainingJob` with every name resolved against the plugin registry; every
problem is a :class:`~mofa_framework.errors.ConfigError` whose one-line message names the key.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

try:  # tomli: the standard library's parser (tomllib came from it), compiled: a profile reads ≈2.5× faster
    import tomli as _toml
except ImportError:  # pragma: no cover - an install without the compiled wheel
    import tomllib as _toml

import attrs
import cattrs
import numpy as np
from attrs import validators as v

from .batch import ATTENTION_KERNELS, PRECISIONS, CandidateBatch, FeatureRows
from .errors import ConfigError, UnknownRecordError
from .limits import INT64_MAX, decode_text, limit, optional, short
from .hf_config import hf_model_fields, read_hf_bytes
from .pipeline_layout import end_stage_layers
from .types import ModelSpec



def _converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)
    # TOML gives ints where floats are meant; accept them, reject strings, booleans, NaN and ±inf
    def float_hook(x, _):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise ValueError(f"expected a number, got {short(x)}")
        try:
            out = float(x)
        except OverflowError:
            raise ValueError(f"expected a number below 1e308, got {short(x)}") from None
        if not math.isfinite(out):
            raise ValueError(f"expected a finite number, got {x!r}")
        return out

    # a count is an integer: `tp = 2.0` is refused rather than silently truncated or accepted
    def int_hook(x, _):
        if isinstance(x, bool) or not isinstance(x, int):
            hint = f" (write {int(x)})" if isinstance(x, float) and x.is_integer() and abs(x) < 1e15 else ""
            raise ValueError(f"expected an integer, got {short(x)}{hint}")
        if abs(x) > INT64_MAX:
            raise ValueError(f"{short(x)} is too large (see docs/bad-inputs.md for each field's bound)")
        return x

    def bool_hook(x, _):
        if not isinstance(x, bool):
            raise ValueError(f"expected true or false, got {x!r}")
        return x

    def str_hook(x, _):
        if not isinstance(x, str):
            raise ValueError(f"expected a string, got {short(x)}")
        return x

    conv.register_structure_hook(float, float_hook)
    conv.register_structure_hook(int, int_hook)
    conv.register_structure_hook(bool, bool_hook)
    conv.register_structure_hook(str, str_hook)
    return conv


converter = _converter()


def _text(exc: BaseException) -> str:
    """The message of an exception: attrs validators raise ``ValueError(msg, attribute, ...)``,
    whose ``str`` would be the whole tuple."""
    if len(exc.args) > 1 and isinstance(exc.args[0], str):
        return exc.args[0]
    return str(exc) or type(exc).__name__


def _format(exc: BaseException, type_) -> str:
    if isinstance(exc, KeyError):
        return "required key is missing"
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return f"unknown key(s) {listing(sorted(map(str, exc.extra_fields)))} (check the spelling; see docs/job-file.md)"
    return _text(exc)


def listing(names, limit: int = 8) -> str:
    """``a, b, c`` — at most `limit` names, then how many more (an error line stays short)."""
    names = [short(n, 40) if not isinstance(n, str) else (n if len(n) <= 40 else n[:39] + "…") for n in names]
    if len(names) <= limit:
        return ", ".join(names)
    return f"{', '.join(names[:limit])}, … and {len(names) - limit:,} more"


def _one_line(exc: Exception, where: str) -> str:
    """`where` is ``<file>`` or ``<file>: <section path>``; a problem's own key path extends it."""
    head, _, base = where.partition(": ")
    if not re.fullmatch(r"[\w.\-]+", base):
        head, base = where, ""

    def at(path: str, text: str) -> str:
        full = ".".join(x for x in (base, path) if x)
        return f"{full}: {text}" if full else text

    if isinstance(exc, cattrs.BaseValidationError):
        msgs = cattrs.transform_error(exc, path="$", format_exception=_format)
        out = []
        for m in msgs:
            text, _, path = m.rpartition(" @ ")
            path = path.removeprefix("$").lstrip(".")
            path = re.sub(r"\['([^']+)'\]", r".\1", path).lstrip(".")
            attr = re.match(r"^'(\w+)':? (.*)$", text)  # an attrs validator names its attribute
            if attr:
                path, text = f"{path}.{attr.group(1)}".lstrip("."), attr.group(2)
            out.append(at(path, text))
        more = f"; … and {len(out) - 3} more problems" if len(out) > 3 else ""
        return f"{head}: " + "; ".join(out[:3]) + more
    text = _text(exc)
    attr = re.match(r"^'(\w+)':? (.*)$", text)
    return f"{head}: " + (at(attr.group(1), attr.group(2)) if attr else at("", text))


def structure(data: Any, cls, where: str):
    """`data` into `cls`; any problem becomes a one-line ConfigError starting with `where`."""
    try:
        return converter.structure(data, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        raise ConfigError(_one_line(exc, where)) from None


def evolved(obj, where: str, **changes):
    """``attrs.evolve(obj, **changes)`` with a validator's complaint as a one-line ConfigError
    (a command-line override of a job's value passes the same bounds as the job file)."""
    try:
        return attrs.evolve(obj, **changes)
    except (ValueError, TypeError) as exc:
        raise ConfigError(_one_line(exc, where)) from None


def structure_file(data: Mapping, cls, filename: str):
    return structure(dict(data), cls, filename)


#: environment variables listing the user's own record directories (``os.pathsep``-separated, like
#: ``PATH``); the ``user_profiles`` plugin registers their ``*.toml`` files
HARDWARE_PATH = "MOFA_HARDWARE_PATH"
MODEL_PATH = "MOFA_MODEL_PATH"


def user_directories(variable: str) -> list[Path]:
    """The directories `variable` lists, in order (empty entries skipped); ConfigError for an
    entry that is not a directory."""
    out = []
    for entry in os.environ.get(variable, "").split(os.pathsep):
        if not entry.strip():
            continue
        d = Path(entry).expanduser()
        if not d.is_dir():
            raise ConfigError(f"{variable}: {entry!r} is not a directory (fix or unset {variable})")
        out.append(d)
    return out


def user_toml_files(variable: str) -> list[Path]:
    """Every ``*.toml`` of the directories of `variable`, sorted by name within each."""
    return [p for d in user_directories(variable) for p in sorted(d.glob("*.toml"))]


def shown_path(path) -> str:
    """A path as an error line shows it: at most 120 characters (a 5,000-character path is elided)."""
    text = str(path)
    return text if len(text) <= 120 else f"{text[:50]}…{text[-60:]} ({len(text):,} characters)"


def read_bytes(path: str | Path, what: str = "a job file") -> tuple[bytes, str]:
    """(the file's bytes, its path as shown in messages); ConfigError (one line naming the file) when
    it cannot be read. `what` names what the file should have been ("a job file", "a CSV file")."""
    p = Path(path)
    shown = shown_path(p)
    try:
        return p.read_bytes(), shown
    except FileNotFoundError:
        raise ConfigError(f"{shown}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{shown}: is a directory, not {what}") from None
    except (OSError, ValueError) as exc:  # a symlink loop, a name too long, no permission, a device, a NUL
        raise ConfigError(f"{shown}: cannot read: {getattr(exc, 'strerror', None) or type(exc).__name__}") from None


#: what :func:`toml_loads` raises for malformed text
TOMLDecodeError = _toml.TOMLDecodeError


def toml_loads(text: str) -> dict:
    """TOML text as a dict (the compiled parser where installed); TOMLDecodeError when malformed."""
    return _toml.loads(text)


def read_toml(path: str | Path) -> dict:
    """A TOML file as a dict; ConfigError (one line naming the file) for anything unreadable."""
    return parse_toml(*read_bytes(path))


def parse_toml(data: bytes, where: str) -> dict:
    """TOML bytes as a dict; ConfigError starting with `where` for non-UTF-8 or malformed text."""
    text = decode_text(data, where, "TOML files must be UTF-8: re-save it as UTF-8")
    try:
        return toml_loads(text)
    except TOMLDecodeError as exc:
        raise ConfigError(f"{where}: malformed TOML: {str(exc)[:200]}") from None
    except RecursionError:
        raise ConfigError(f"{where}: malformed TOML: nested too deeply") from None


# ====================================================================== sections


def with_power_limit(hw: HardwareProfile, watts: float, field: str) -> HardwareProfile:
    """`hw` with its GPUs run at `watts` (``compute.power_limit_w``; the TDP means no limit); a
    limit the profile cannot take is one line naming `field`."""
    try:
        watts = float(watts)
    except (TypeError, ValueError):
        raise ConfigError(f"{field} = {watts!r}: give the power limit in watts, e.g. 500") from None
    try:
        if not math.isfinite(watts) or watts <= 0.0:
            raise ValueError(f"compute.power_limit_w = {watts:g} must be a positive number of watts, e.g. 500")
        limit_w = 0.0 if watts == hw.compute.tdp_w else watts
        return attrs.evolve(hw, compute=attrs.evolve(hw.compute, power_limit_w=limit_w))
    except ValueError as exc:
        raise ConfigError(f"{field}: {hw.name}: {exc}") from None


def with_scaleout_bandwidth(hw: HardwareProfile, gbps: float, field: str) -> HardwareProfile:
    """`hw` on another network between its scale-up domains: `gbps` GB/s per GPU, one direction
    (``interconnect.scaleout_bandwidth_gbps``: the node's NICs shared by its GPUs, e.g. 4 × 200 Gb/s
    on 8 GPUs = 12.5); a value out of range is one line naming `field`."""
    try:
        gbps = float(gbps)
    except (TypeError, ValueError):
        raise ConfigError(f"{field} = {gbps!r}: give GB/s per GPU, e.g. 12.5 for 4 × 200 Gb/s NICs on 8 GPUs") from None
    try:
        if not math.isfinite(gbps):
            raise ValueError("interconnect.scaleout_bandwidth_gbps must be a finite number of GB/s per GPU, e.g. 25")
        ic = attrs.evolve(hw.interconnect, scaleout_bandwidth_gbps=gbps)
    except ValueError as exc:
        raise ConfigError(f"{field}: {hw.name}: {exc}") from None
    ratio = gbps / hw.interconnect.scaleout_bandwidth_gbps
    return attrs.evolve(hw, interconnect=ic, collective_profile=rebased_scaleout(hw.collective_profile, ratio))


def own_network(gbps: float, profile: HardwareProfile) -> float:
    """`gbps` (GB/s per GPU between scale-up domains, as a job runs) when it is not `profile`'s own
    (``[hardware] scaleout_bandwidth_gbps`` set), else 0: what results and flags report."""
    return 0.0 if gbps == profile.interconnect.scaleout_bandwidth_gbps else float(gbps)


def rebased_scaleout(points, ratio: float) -> tuple:
    """A ``[[collective_profile]]`` table's scale-out curves as on NICs `ratio` times as fast: each
    point's time keeps its latency-bound part and its bandwidth part scales — ``t' = t + (S·f /
    B_max)·(1/ratio − 1)``, B_max the curve's best bus bandwidth — so in bus bandwidth
    ``1/busbw' = 1/busbw + (1/ratio − 1)/B_max``: large messages run ``ratio`` times as fast,
    small ones as measured. Scale-up points are kept."""
    if ratio == 1.0:
        return tuple(points)
    best: dict[tuple, float] = {}
    for p in points:
        key = (p.kind, p.scope, p.group_size)
        best[key] = max(best.get(key, 0.0), p.busbw_gbps)
    return tuple(p if p.scope != "scaleout" else attrs.evolve(
        p, busbw_gbps=1.0 / (1.0 / p.busbw_gbps + (1.0 / ratio - 1.0) / best[(p.kind, p.scope, p.group_size)]))
        for p in points)


@attrs.frozen(kw_only=True)
class HardwareSection:
    name: str
    num_gpus: int = attrs.field(validator=limit("hardware.num_gpus"))
    #: watts: run the GPUs at this power limit instead of the profile's (``compute.power_limit_w``)
    power_limit_w: float | None = None
    #: GB/s per GPU between scale-up domains instead of the profile's (a cluster with other NICs)
    scaleout_bandwidth_gbps: float | None = None


@attrs.frozen(kw_only=True)
class ParallelConfig:
    """Parallel sizes and batch shape (Megatron's argument meanings)."""

    tp: int = attrs.field(default=1, validator=limit("parallel.tp"))
    pp: int = attrs.field(default=1, validator=limit("parallel.pp"))
    vpp: int = attrs.field(default=1, validator=limit("parallel.vpp"))
    cp: int = attrs.field(default=1, validator=limit("parallel.cp"))
    ep: int = attrs.field(default=1, validator=limit("parallel.ep"))
    #: expert tensor parallel size; 0 = Megatron-Core's default (= tp)
    etp: int = attrs.field(default=0, validator=limit("parallel.etp"))
    micro_batch_size: int = attrs.field(default=1, validator=limit("parallel.micro_batch_size"))
    global_batch_size: int = attrs.field(validator=limit("parallel.global_batch_size"))
    sequence_length: int = attrs.field(validator=limit("parallel.sequence_length"))
    #: None = on whenever tp > 1 (Megatron-Core's recommendation)
    sequence_parallel: bool | None = None
    precision: str = attrs.field(default="bf16", validator=v.in_(PRECISIONS))
    first_stage_layers: int = attrs.field(default=0, validator=limit("parallel.first_stage_layers"))
    last_stage_layers: int = attrs.field(default=0, validator=limit("parallel.last_stage_layers"))
    #: Megatron-Core's ``--pipeline-model-parallel-layout`` (e.g. ``"Et*4|(t*4|)*14tmL"``), read at
    #: resolution into first_stage_layers, last_stage_layers and vpp (:mod:`~mofa_framework.pipeline_layout`)
    pipeline_layout: str = ""
    flash_attention: bool = True
    #: fused-attention kernel (:data:`~mofa_framework.batch.ATTENTION_KERNELS`); "auto" = what a
    #: Megatron-Core-style framework runs on the GPU (cuDNN on Hopper and later, else FlashAttention-2)
    attention_kernel: str = attrs.field(default="auto", validator=v.in_(ATTENTION_KERNELS))
    #: packed sequences: the mean length of the documents packed into each sequence, whose fused
    #: attention (THD, ``cu_seqlens``) keeps to each document; 0 = one document per sequence
    document_length: int = attrs.field(default=0, validator=limit("parallel.document_length"))


@attrs.frozen(kw_only=True)
class PipelineSection:
    #: None = "interleaved-1f1b" when vpp > 1, else "1f1b"
    schedule: str | None = None


@attrs.frozen(kw_only=True)
class TrainingSection:
    #: tokens to train on (for end-to-end time); 0 = not given
    tokens: float = attrs.field(default=0.0, validator=limit("training.tokens"))


@attrs.frozen(kw_only=True)
class FaultSettings:
    """The `[fault]` section: failures, recovery policy and checkpointing (paper §3.4)."""

    policy: str = "three-level"
    #: λ: failures per node per day
    node_failures_per_day: float = attrs.field(default=0.005, validator=limit("fault.node_failures_per_day"))
    #: checkpoint interval in steps; 0 = the optimal interval of eq. [44]
    checkpoint_interval_steps: int = attrs.field(default=0, validator=limit("fault.checkpoint_interval_steps"))
    #: seconds one checkpoint save stalls training; None = derived from size and storage bandwidth
    checkpoint_save_s: float | None = attrs.field(default=None, validator=optional("fault.checkpoint_save_s"))
    #: job initialisation time, seconds; None = derived (checkpoint load + start-up)
    init_s: float | None = attrs.field(default=None, validator=optional("fault.init_s"))
    #: asynchronous checkpointing: only the GPU→host snapshot stalls training
    async_checkpoint: bool = False
    #: bytes one parameter occupies in a checkpoint (bf16 weights + fp32 master + Adam m, v)
    checkpoint_bytes_per_param: float = attrs.field(default=14.0, validator=limit("fault.checkpoint_bytes_per_param"))
    #: job start-up, seconds, and its growth per node (fit to paper Table 5's T_init)
    startup_s: float = attrs.field(default=121.09, validator=limit("fault.startup_s"))
    startup_per_node_s: float = attrs.field(default=0.832, validator=limit("fault.startup_per_node_s"))
    #: options of the chosen policy (read into the policy's options type)
    options: dict[str, Any] = attrs.field(factory=dict)


def _search_values(key: str | None):
    """A `[search]` list: None (the default range) or a non-empty list, each value within `key`'s bound."""

    def validate(inst, attribute, value):
        if value is None:
            return
        if not value:
            raise ValueError(f"'{attribute.name}': an empty list searches nothing: give at least one value, or "
                             "remove the key for the default range")
        if key is not None:
            for x in value:
                limit(key)(inst, attribute, x)

    return validate


@attrs.frozen(kw_only=True)
class SearchSection:
    """`[search]`: the ranges `mofa tune` explores (unset = the default space)."""

    tp: tuple[int, ...] | None = attrs.field(default=None, validator=_search_values("parallel.tp"))
    pp: tuple[int, ...] | None = attrs.field(default=None, validator=_search_values("parallel.pp"))
    vpp: tuple[int, ...] | None = attrs.field(default=None, validator=_search_values("parallel.vpp"))
    cp: tuple[int, ...] | None = attrs.field(default=None, validator=_search_values("parallel.cp"))
    ep: tuple[int, ...] | None = attrs.field(default=None, validator=_search_values("parallel.ep"))
    etp: tuple[int, ...] | None = attrs.field(default=None, validator=_search_values("parallel.etp"))
    micro_batch_size: tuple[int, ...] | None = attrs.field(default=None,
                                                          validator=_search_values("parallel.micro_batch_size"))
    schedules: tuple[str, ...] | None = attrs.field(default=None, validator=_search_values(None))
    #: features to search (each off or on with its options' search values); None = all tunable
    features: tuple[str, ...] | None = attrs.field(default=None, validator=_search_values(None))
    #: layers fewer on the first and last pipeline stage than on the middle ones (0 = default split)
    lighter_ends: tuple[int, ...] | None = attrs.field(default=None,
                                                      validator=_search_values("parallel.first_stage_layers"))
    #: layers fewer on the last pipeline stage than on the first (output layer, loss, MTP modules)
    lighter_last: tuple[int, ...] | None = attrs.field(default=None,
                                                      validator=_search_values("parallel.last_stage_layers"))
    #: GiB of HBM per GPU every configuration must leave free (its peak ≤ HBM − headroom): room for the
    #: allocator's fragmentation and MoFa's memory error; 0 = fill the GPU
    memory_headroom_gib: float = attrs.field(default=0.0, validator=limit("search.memory_headroom_gib"))


@attrs.frozen(kw_only=True)
class JobFile:
    """The raw job file; names are resolved by :func:`resolve_job`."""

    name: str = ""
    model: dict[str, Any]
    hardware: HardwareSection
    parallel: ParallelConfig
    pipeline: PipelineSection = attrs.field(factory=PipelineSection)
    features: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    training: TrainingSection = attrs.field(factory=TrainingSection)
    fault: FaultSettings = attrs.field(factory=FaultSettings)
    search: SearchSection = attrs.field(factory=SearchSection)


@attrs.frozen(kw_only=True)
class TrainingJob:
    """A fully resolved job: records from the registry, options typed, defaults applied."""

    name: str
    model: ModelSpec
    hardware: Any  # HardwareProfile
    num_gpus: int
    parallel: ParallelConfig
    schedule: str
    features: Mapping[str, Any] = attrs.field(factory=dict)
    training: TrainingSection = attrs.field(factory=TrainingSection)
    fault: FaultSettings = attrs.field(factory=FaultSettings)
    search: SearchSection = attrs.field(factory=SearchSection)

    @property
    def dp(self) -> int:
        p = self.parallel
        return self.num_gpus // (p.tp * p.pp * p.cp)

    @property
    def batch_key(self) -> tuple[str, str, float, float]:
        """Jobs with equal keys share a model and a hardware profile as run (its power limit and
        network included), so one candidate batch prices them together."""
        hw = self.hardware
        return repr(self.model), hw.name, float(hw.compute.power_limit_w), float(hw.interconnect.scaleout_bandwidth_gbps)


# ====================================================================== models

def model_from_hf_config(path: str | Path) -> ModelSpec:
    """A :class:`ModelSpec` from a HuggingFace ``config.json`` (:mod:`mofa_framework.hf_config`)."""
    data, shown = read_bytes(path, "a HuggingFace config.json")
    return model_from_hf_dict(read_hf_bytes(data, shown), shown, fallback_name=Path(path).parent.name)


def model_from_hf_dict(cfg: Any, where: str, fallback_name: str = "hf-model") -> ModelSpec:
    """A :class:`ModelSpec` from a parsed config.json; one-line ConfigError for anything unreadable."""
    out = hf_model_fields(cfg, where, fallback_name)
    out["source"] = where
    return structure(out, ModelSpec, where)


def _fewer_layers(base: ModelSpec, data: Mapping[str, Any]) -> dict:
    """A `num_layers` override keeps the first layers of the base's stack: leading dense layers
    are capped at the new count (ModelSpec.with_num_layers)."""
    n = data.get("num_layers")
    if isinstance(n, int) and not isinstance(n, bool) and "first_k_dense_layers" not in data:
        return {"first_k_dense_layers": max(0, min(base.first_k_dense_layers, n))}
    return {}


def resolve_model(section: Mapping[str, Any], registry, where: str) -> ModelSpec:
    data = dict(section)
    name = data.get("name")
    for key in ("name", "config"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ConfigError(f"{where}: model.{key}: expected a string, got {short(data[key])}")
    if "config" in data:  # [model] config = "path/to/config.json"
        base = model_from_hf_config(data.pop("config"))
        data.pop("name", None)
        merged = {**converter.unstructure(base), **_fewer_layers(base, data), **data}
        return structure(merged, ModelSpec, f"{where}: model")
    if name is not None and len(data) == 1:
        return registry.model(name, field=f"{where}: model.name")
    if name is not None:
        try:
            base = registry.model(name, field=f"{where}: model.name")
            merged = {**converter.unstructure(base), **_fewer_layers(base, data), **data, "name": base.name}
        except UnknownRecordError:
            merged = data  # an inline model with a new name
    else:
        merged = {"name": "custom", **data}
    return structure(merged, ModelSpec, f"{where}: model")


# ====================================================================== jobs


def _feature_options(registry, name: str, table: Mapping[str, Any], where: str):
    feat = registry.feature(name, field=f"{where}: features.{name}")
    data = dict(table)
    enabled = data.pop("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{where}: features.{name}.enabled: expected true or false")
    opts = structure(data, feat.options_type, f"{where}: features.{name}")
    return feat.name, enabled, opts


def _with_layout(par: ParallelConfig, model: ModelSpec, where: str) -> ParallelConfig:
    """`par` with its pipeline layout read into end-stage sizes and vpp (the string then cleared: the
    numbers are what the engine and the tuner read); a layout that contradicts a size also given is refused."""
    field = f"{where}: parallel.pipeline_layout"
    first, last, vpp = end_stage_layers(par.pipeline_layout, par.pp, model.num_layers, model.num_mtp_layers, field)
    given = {"first_stage_layers": (par.first_stage_layers, first), "last_stage_layers": (par.last_stage_layers, last),
             "vpp": (par.vpp if par.vpp != 1 else 0, vpp)}
    for name, (stated, implied) in given.items():
        if stated and stated != implied:
            raise ConfigError(f"{field} = {short(par.pipeline_layout)} implies {name} = {implied}, "
                              f"but parallel.{name} = {stated}: give one of them")
    return attrs.evolve(par, first_stage_layers=first if par.pp > 1 else 0, last_stage_layers=last if par.pp > 1 else 0,
                        vpp=vpp, pipeline_layout="")


def resolve_job(raw: JobFile, registry, where: str) -> TrainingJob:
    model = resolve_model(raw.model, registry, where)
    hw = registry.hardware_profile(raw.hardware.name, field=f"{where}: hardware.name")
    if raw.hardware.power_limit_w is not None:
        hw = with_power_limit(hw, raw.hardware.power_limit_w, f"{where}: hardware.power_limit_w")
    if raw.hardware.scaleout_bandwidth_gbps is not None:
        hw = with_scaleout_bandwidth(hw, raw.hardware.scaleout_bandwidth_gbps, f"{where}: hardware.scaleout_bandwidth_gbps")
    par = raw.parallel
    denom = par.tp * par.pp * par.cp
    if raw.hardware.num_gpus % denom:
        raise ConfigError(f"{where}: hardware.num_gpus ({raw.hardware.num_gpus}) must be a multiple of "
                          f"tp × pp × cp = {denom}; change the GPU count or the parallel sizes")
    if par.pipeline_layout:
        par = _with_layout(par, model, where)
    etp = par.etp or (par.tp if model.is_moe else 1)
    sp = par.tp > 1 if par.sequence_parallel is None else par.sequence_parallel
    par = attrs.evolve(par, etp=etp, sequence_parallel=sp)
    sched_name = raw.pipeline.schedule or ("interleaved-1f1b" if par.vpp > 1 else "1f1b")
    sched = registry.schedule(sched_name, field=f"{where}: pipeline.schedule")
    if par.vpp > 1 and not sched.supports_vpp:
        raise ConfigError(f"{where}: pipeline.schedule {sched.name!r} does not interleave, but parallel.vpp = "
                          f"{par.vpp}: set vpp = 1 or choose an interleaving schedule")
    if sched.requires_vpp and par.vpp == 1:
        raise ConfigError(f"{where}: pipeline.schedule {sched.name!r} needs parallel.vpp > 1")
    features = {}
    spelled: dict[str, str] = {}
    for fname, table in raw.features.items():
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where}: features.{fname}: expected a table of options, e.g. [features.{fname}]")
        key, enabled, opts = _feature_options(registry, fname, table, where)
        if key in spelled:  # two spellings (or an alias) of one feature: which one wins is not obvious
            raise ConfigError(f"{where}: features.{spelled[key]} and features.{fname} are the same feature "
                              f"({key}): give it once")
        spelled[key] = fname
        if enabled:
            features[key] = opts
    for fname in features:
        clash = [c for c in registry.features[fname].conflicts if c in features]
        if clash:
            raise ConfigError(f"{where}: features.{fname} cannot be combined with features.{clash[0]}: "
                              "enable only one of them")
    if raw.fault.policy != FaultSettings().policy or raw.fault.options:  # else checked when e2e needs it
        pol = registry.policy(raw.fault.policy, field=f"{where}: fault.policy")
        structure(dict(raw.fault.options), pol.options_type, f"{where}: fault.options")
    return TrainingJob(name=raw.name or Path(where).stem, model=model, hardware=hw, num_gpus=raw.hardware.num_gpus,
                       parallel=par, schedule=sched.name, features=features, training=raw.training, fault=raw.fault,
                       search=raw.search)


def job_from_dict(data: Mapping[str, Any], registry, where: str = "job") -> TrainingJob:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: a job is a table of sections ([model], [hardware], [parallel], ...), "
                          f"got {short(data)}")
    raw = structure(dict(data), JobFile, where)
    return resolve_job(raw, registry, where)


def load_job(path: str | Path, registry) -> TrainingJob:
    return job_from_dict(read_toml(path), registry, str(path))


# ====================================================================== batches


def _encode_option(value, field) -> float:
    choices = field.metadata.get("choices")
    if choices:
        return float(choices.index(value))
    if isinstance(value, (bool, int, float, np.number)):
        return float(value)
    raise ConfigError(f"option {field.name!r}: a string option must declare its choices")


def encode_features(jobs: list[TrainingJob], registry) -> dict[str, FeatureRows]:
    """Feature flags and option arrays for a list of jobs (every registered feature gets a row set)."""
    out = {}
    used = {name for j in jobs for name in j.features}
    for j in jobs:  # a job built with another registry (a plugin since disabled) is not evaluated without it
        unknown = sorted(set(j.features) - set(registry.features))
        if unknown:
            raise ConfigError(f"{j.name}: features.{unknown[0]}: this predictor has no '{unknown[0]}' feature "
                              "(disabled or not installed); remove it from the job or use a predictor with it")
    for name, feat in registry.features.items():
        if name not in used:
            continue  # absent from the batch = off on every row
        fields = attrs.fields(feat.options_type) if attrs.has(feat.options_type) else ()
        enabled = np.array([name in j.features for j in jobs], dtype=bool)
        options = {}
        default = feat.options_type()
        for f in fields:
            options[f.name] = np.array([
                _encode_option(getattr(j.features.get(name, default), f.name), f) for j in jobs], dtype=np.float64)
        choices = {f.name: f.metadata["choices"] for f in fields if f.metadata.get("choices")}
        out[name] = FeatureRows(enabled=enabled, options=options, choices=choices)
    return out


def jobs_to_batch(jobs: list[TrainingJob], registry) -> CandidateBatch:
    """One batch for jobs that share a model and hardware profile."""
    col = lambda f: [f(j) for j in jobs]  # noqa: E731
    return CandidateBatch(
        tp=col(lambda j: j.parallel.tp), pp=col(lambda j: j.parallel.pp), vpp=col(lambda j: j.parallel.vpp),
        cp=col(lambda j: j.parallel.cp), ep=col(lambda j: j.parallel.ep), etp=col(lambda j: j.parallel.etp),
        dp=col(lambda j: j.dp), micro_batch_size=col(lambda j: j.parallel.micro_batch_size),
        global_batch_size=col(lambda j: j.parallel.global_batch_size),
        sequence_length=col(lambda j: j.parallel.sequence_length),
        sequence_parallel=col(lambda j: j.parallel.sequence_parallel),
        precision=col(lambda j: PRECISIONS.index(j.parallel.precision)),
        schedule=col(lambda j: registry.schedule_code(j.schedule)),
        first_stage_layers=col(lambda j: j.parallel.first_stage_layers),
        last_stage_layers=col(lambda j: j.parallel.last_stage_layers),
        flash_attention=col(lambda j: j.parallel.flash_attention),
        attention_kernel=col(lambda j: ATTENTION_KERNELS.index(j.parallel.attention_kernel)),
        document_length=col(lambda j: j.parallel.document_length),
        features=encode_features(jobs, registry),
    )
