"""Validation against published measurements (``mofa validate``; GitHub issue 7).

Reads the three CSV schemas of the shared measurement set (docs/validation.md):

- *dense* (``megatron_selene_a100.csv``, ``zero_bubble.csv``, ``*_dense.csv``): one row per run,
  architecture in columns, features in words (``recompute``, ``sequence_parallel``, ...);
- *NVIDIA* (``nvidia_megatron_bridge.csv``, ``nemo_*.csv``, ``megatron_core_moe.csv``,
  ``torchtitan.csv``): model by name, parallel sizes, ``step_time_s`` or ``step_time_s_derived``;
- *vTrain* (``vtrain_single_node_a100.csv``): architecture by columns, Megatron-DeepSpeed on one
  A100 node, fp16, full recompute, 1F1B.

Each row becomes a job (:func:`map_rows`); rows that cannot be mapped are kept with the reason
(:class:`SkippedRow`), never dropped. Rows sharing model and hardware are evaluated as one batch
(:func:`prepare` + :func:`predict_prepared`), feasibility is checked row by row, and
:func:`validate` returns a :class:`ValidationResult`: per row measured vs predicted step time,
per source MAPE / p90 / max, Spearman rank correlation of strategies within a model and
top-1 regret.
"""

from __future__ import annotations

import csv
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from .errors import ConfigError, UnknownRecordError
from .types import Activation, ModelSpec

SCHEMAS = ("dense", "nvidia", "vtrain")
_DENSE_KEYS = {"model_name", "n_layers", "hidden", "gpu_type", "n_gpus", "tp", "pp"}
_NVIDIA_KEYS = {"source_id", "model", "gpu_type", "num_gpus", "gbs", "seq_len", "tp", "pp"}
_VTRAIN_KEYS = {"# GPUs", "global batch", "hidden size", "# layers", "iteration time (ms)"}

#: constraints the engine can safely ignore for a source (see :func:`_dense_job`)
_ZB_IGNORED = frozenset({"pp_splits_layers"})
_ZB_SCHEDULES = {"1F1B": "1f1b", "1F1B-I": "interleaved-1f1b", "ZB-1p": "zb-1p", "ZB-2p": "zb-2p", "ZB-V": "zb-v"}


# ====================================================================== records


@attrs.frozen(kw_only=True)
class MappedRow:
    """One measurement turned into a job dict (internal; exposed for calibration)."""

    source: str
    reference: str
    row_id: str
    job: dict
    #: seconds, and the column it came from
    measured_s: float
    target: str
    #: strategy grouping (Spearman / regret); None = not ranked
    group: tuple | None = None
    measured_tflops: float | None = None
    tflops_convention: str = ""
    measured_memory_gib: float | None = None
    #: constraint names the engine may ignore for this row
    ignore_constraints: frozenset[str] = frozenset()
    notes: str = ""
    #: updates to ``job["parallel"]`` for a setting the source leaves unstated, one per candidate
    #: value (None removes a key); :func:`resolve_unstated` keeps one
    variants: tuple[dict, ...] = ()
    #: what the mapping assumed beyond the row (an unstated setting chosen, a column overruled)
    assumptions: str = ""


@attrs.frozen(kw_only=True)
class SkippedRow:
    """A row that was not predicted, and why (unmappable or infeasible)."""

    source: str
    reference: str
    row_id: str
    model: str
    reason: str
    kind: str = "unmappable"  # or "infeasible"


@attrs.frozen(kw_only=True)
class RowResult:
    source: str
    reference: str
    row_id: str
    model: str
    hardware: str
    num_gpus: int
    strategy: str
    target: str
    measured_s: float
    predicted_s: float
    #: predicted / measured − 1
    error: float
    measured_tflops: float | None
    #: the source's own TFLOPS convention applied to the predicted time (= measured FLOPs / predicted time)
    predicted_tflops_source_convention: float | None
    predicted_model_tflops: float
    tflops_convention: str
    measured_memory_gib: float | None
    predicted_memory_gib: float
    fits_in_memory: bool
    group: tuple | None = None
    #: seconds per sequence (ranking key: step time / global batch)
    measured_s_per_seq: float = 0.0
    predicted_s_per_seq: float = 0.0
    #: what the mapping assumed beyond the row (``MappedRow.assumptions``)
    assumptions: str = ""


@attrs.frozen(kw_only=True)
class ErrorStats:
    n: int
    mape: float
    p90: float
    max: float
    #: mean signed error (bias)
    bias: float

    @classmethod
    def of(cls, errors: Sequence[float]) -> ErrorStats:
        e = np.asarray(list(errors), dtype=float)
        if not len(e):
            return cls(n=0, mape=math.nan, p90=math.nan, max=math.nan, bias=math.nan)
        a = np.abs(e)
        return cls(n=len(e), mape=float(a.mean()), p90=float(np.percentile(a, 90)), max=float(a.max()),
                   bias=float(e.mean()))


@attrs.frozen(kw_only=True)
class RankStats:
    """Strategy ranking within groups of ≥ 3 rows (same source, model, hardware, GPU count)."""

    groups: int
    #: Spearman ρ per group key
    spearman: dict[str, float]
    #: top-1 regret per group: measured time/seq of the predicted best ÷ measured best − 1
    regret: dict[str, float]

    @property
    def spearman_mean(self) -> float:
        return float(np.mean(list(self.spearman.values()))) if self.spearman else math.nan

    @property
    def spearman_min(self) -> float:
        return float(min(self.spearman.values())) if self.spearman else math.nan

    @property
    def regret_mean(self) -> float:
        return float(np.mean(list(self.regret.values()))) if self.regret else math.nan

    @property
    def regret_max(self) -> float:
        return float(max(self.regret.values())) if self.regret else math.nan


@attrs.frozen(kw_only=True)
class SourceSummary:
    source: str
    rows: int
    skipped: int
    step_time: ErrorStats
    memory: ErrorStats
    ranking: RankStats
    targets: dict[str, int]


@attrs.frozen(kw_only=True)
class ValidationResult:
    rows: list[RowResult]
    skipped: list[SkippedRow]
    sources: list[SourceSummary]
    overall: SourceSummary

    def to_dict(self) -> dict[str, Any]:
        def summary(s: SourceSummary) -> dict:
            d = attrs.asdict(s)
            d["ranking"].update(spearman_mean=s.ranking.spearman_mean, spearman_min=s.ranking.spearman_min,
                                regret_mean=s.ranking.regret_mean, regret_max=s.ranking.regret_max)
            return d

        return {"overall": summary(self.overall), "sources": [summary(s) for s in self.sources],
                "rows": [attrs.asdict(r) for r in self.rows], "skipped": [attrs.asdict(s) for s in self.skipped]}


# ====================================================================== reading


def read_csv(path: str | Path) -> tuple[str, list[dict]]:
    """(schema, rows) of one measurement file; ConfigError for a missing file or unknown schema."""
    p = Path(path)
    try:
        with p.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            header = set(reader.fieldnames or ())
            rows = list(reader)
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"{p}: cannot read CSV: {exc}") from None
    if _DENSE_KEYS <= header:
        return "dense", rows
    if _NVIDIA_KEYS <= header:
        return "nvidia", rows
    if _VTRAIN_KEYS <= header:
        return "vtrain", rows
    raise ConfigError(f"{p}: unknown schema (expected the dense, NVIDIA or vTrain columns of "
                      "/work/shared/data/README.md)")


def _num(x: str | None) -> float | None:
    if x is None:
        return None
    x = x.strip()
    if re.fullmatch(r"\d{1,3}(,\d{3})+(\.\d*)?", x):  # "1,024": a thousands separator
        x = x.replace(",", "")
    if not x:
        return None
    try:
        return float(x)
    except ValueError:
        return None


def _int(x: str | None, default: int | None = None) -> int | None:
    v = _num(x)
    return default if v is None else int(round(v))


def _short_reference(text: str) -> str:
    return re.split(r"\s*[(,;]", text.strip(), maxsplit=1)[0] or text.strip()


def _precision(text: str) -> tuple[str, str | None, dict]:
    """(parallel.precision, the low-precision GEMM feature or None, its options) for a source's
    precision column.

    Transformer Engine runs GEMMs in FP8 / NVFP4 and the attention core and everything else in
    bf16: the ``fp8`` / ``nvfp4`` feature on a bf16 row. The FP8 scaling recipe the column names
    becomes the ``fp8`` feature's ``recipe``: MXFP8 / FP8-MX → ``mxfp8``, FP8-CS (per-tensor current
    scaling) and torchtitan's float8 tensorwise → ``tensorwise``, FP8 blockwise → ``blockwise``;
    a bare "FP8" keeps the default (``delayed``, Megatron's default recipe)."""
    t = text.lower()
    if "nvfp4" in t or "fp4" in t:
        return "bf16", "nvfp4", {}
    if "fp8" in t or "float8" in t:
        if "mx" in t:
            return "bf16", "fp8", {"recipe": "mxfp8"}
        if "blockwise" in t:
            return "bf16", "fp8", {"recipe": "blockwise"}
        if "fp8-cs" in t or "current scaling" in t or "tensorwise" in t:
            return "bf16", "fp8", {"recipe": "tensorwise"}
        return "bf16", "fp8", {}
    if "fp16" in t and "bf16" not in t:
        return "fp16", None, {}
    return "bf16", None, {}


def _lookup_model(registry, name: str):
    for cand in (name, re.sub(r"\s*\(.*?\)\s*", " ", name).strip()):
        try:
            return registry.model(cand)
        except UnknownRecordError:
            continue
    return None


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _lookup_hw(registry, name: str):
    """The profile a source's GPU description names: by profile name or alias, else by reading it.

    Sources describe one GPU many ways ("H100 80GB HBM3 @700W", "NVIDIA A100 80GB (Selene)"). Read:
    the GPU family is a token equal to the first word of a profile's name (``h100``, ``a100``,
    ``gb200``); within the family a stated form factor (``pcie``) or memory size (``80GB``) picks
    the profile, else the one the bare family name is an alias of. No family token: unknown.
    """
    for cand in (name.strip(), re.sub(r"\s*[(@,].*$", "", name).strip()):
        try:
            return registry.hardware_profile(cand)
        except UnknownRecordError:
            continue
    words = _tokens(name)
    families: dict[str, list] = defaultdict(list)
    for hw in registry.hardware.values():
        families[hw.name.split("-")[0]].append(hw)
    hits = [f for f in families if f in words]
    if len(hits) != 1:
        return None
    members = families[hits[0]]
    if "pcie" in words or any(w.startswith("sxm") for w in words):  # the form factor, when stated
        members = [hw for hw in members if ("pcie" in _tokens(hw.name)) == ("pcie" in words)] or members
    gb = re.search(r"(\d+)\s*gb\b", name.lower())
    if gb:
        size = [hw for hw in members if abs(hw.memory.hbm_gib - float(gb.group(1))) <= 0.06 * float(gb.group(1))]
        members = size or members
    if len(members) == 1:
        return members[0]
    try:
        default = registry.hardware_profile(hits[0])
    except UnknownRecordError:
        return None
    return default if default in members else None


# ====================================================================== mapping


#: frameworks whose published runs use Megatron-Core's performance recipes
_MEGATRON_CORE = re.compile(r"megatron[- ]core|\bmcore\b|\bnemo\b|megatron-bridge", re.I)


def _megatron_core_recipe(tp: int, pp: int, cp: int, full_shard: bool) -> dict[str, dict]:
    """What Megatron-Core's performance recipes (NeMo, Megatron-Bridge, the Megatron-Core README
    runs) turn on: SP with TP (the engine's default), the distributed optimizer (or Megatron-FSDP),
    overlapped gradient reduce / parameter gather, TP comm overlap, PP p2p overlap, CP ring overlap."""
    feats: dict[str, dict] = {"fsdp" if full_shard else "distributed_optimizer": {}, "dp_overlap": {}}
    if tp > 1:
        feats["tp_overlap"] = {}
    if pp > 1:
        feats["pp_overlap"] = {}
    if cp > 1:
        feats["cp_overlap"] = {}
    return feats


def _uneven_pipeline(num_layers: int, pp: int, vpp: int) -> dict[str, int]:
    """Stage sizes when pp·vpp does not divide the layers.

    Megatron-Core's ``account_for_embedding/loss_in_pipeline_split`` (and Megatron-DeepSpeed's
    ``type:transformer|embedding`` partitioning, BLOOM's 70 layers on 12 stages) count the
    embedding and the loss as a layer each: the end stages hold one layer fewer. Other splits are
    left to the engine (its default: the remainder on the end stages), with the divisibility check
    relaxed.
    """
    if (num_layers + 2) % (pp * vpp) == 0:
        ends = (num_layers + 2) // pp - 1
        return {"first_stage_layers": ends, "last_stage_layers": ends}
    return {}


#: an unstated interleaving factor is searched when plain 1F1B would run fewer than this many
#: micro-batches per pipeline stage beyond the first (bubble (p − 1)/m above 20 %)
UNSTATED_VPP_MIN_RATIO = 4

#: a source's FLOPs convention, recognised from its ``flops_convention`` text
_HFU_EQ3 = re.compile(r"eq\.?\s*3|96\s*\*\s*b", re.I)
_MODEL_FLOPS = re.compile(r"eq\.?\s*7|72\s*\*\s*b|12\s*\*?\s*[·.]?\s*l|attention|model flops|\bmfu\b|palm|chowdhery",
                          re.I)
#: 6·N·D with no attention term (Kaplan / Chinchilla): N the GEMM weights, D the tokens
_SIX_N = re.compile(r"\b6\s*[*·]?\s*n\s*[*·]?\s*d?\b", re.I)


def vpp_variants(num_layers: int, pp: int, lowest: int = 1) -> tuple[dict, ...]:
    """``MappedRow.variants`` for an unstated interleaving: every factor from `lowest` that splits
    the layers over ``pp`` stages (evenly, or with the end stages a layer short)."""
    return tuple({"vpp": v, "first_stage_layers": None, "last_stage_layers": None,
                  **_uneven_pipeline(num_layers, pp, v)}
                 for v in range(lowest, (num_layers + 2) // pp + 1)
                 if num_layers % (pp * v) == 0 or _uneven_pipeline(num_layers, pp, v))


def megatron_eq3_flops(model: ModelSpec, global_batch_size: int, sequence_length: int, vocab_size: int) -> float:
    """Narayanan et al. 2021 eq. 3, ``96·B·s·l·h²·(1 + s/6h + V/16lh)``: model FLOPs plus the
    recompute forward (hardware-FLOPs-like); Megatron 2021, Megatron-DeepSpeed (BLOOM, MT-NLG)."""
    h, L, s = model.hidden_size, model.num_layers, sequence_length
    return 96.0 * global_batch_size * s * L * h * h * (1 + s / (6 * h) + vocab_size / (16 * L * h))


def _dense_target(r: dict, model: ModelSpec, bf16_peak_tflops: float | None = None) -> tuple[float, str] | str:
    """A dense-schema row's step time and where it came from, or why there is none.

    In order: the measured, then the derived iteration time; else the published throughput
    (tokens or samples per second, per GPU or in all); else the utilisation the source reports,
    through its FLOPs convention when MoFa knows it: model FLOPs with full attention (Korthikanti
    eq. 7, 6N + 12·l·h·s of MegaScale / PaLM / torchtitan, NeMo, Megatron-Core — one formula,
    ``nemo_model_flops``) from the MFU or the model TFLOPS, Megatron's eq. 3 from the TFLOPS. An
    MFU whose peak the row does not state is taken against `bf16_peak_tflops` (the GPU's dense
    BF16 peak, the usual denominator), and the target column says so.
    """
    for col in ("measured_iter_time_s", "derived_iter_time_s"):
        if (t := _num(r.get(col))) is not None:
            return t, col
    n, gbs, seq = _int(r.get("n_gpus")), _int(r.get("global_batch")), _int(r.get("seq_len"))
    value, unit = _num(r.get("throughput_value")), r.get("throughput_unit", "").lower()
    if value and ("token" in unit or "wps" in unit or "sample" in unit):
        per_gpu = "gpu" in unit
        work = gbs * (seq if ("token" in unit or "wps" in unit) else 1)
        return work / (value * (n if per_gpu else 1)), f"throughput_value ({r.get('throughput_unit', '').strip()})"
    conv = r.get("flops_convention", "")
    vocab = _int(r.get("vocab"), model.vocab_size) or model.vocab_size
    tflops, peak = _num(r.get("measured_tflops_per_gpu")), _num(r.get("peak_tflops_used"))
    mfu = _num(r.get("mfu_pct"))
    peak_note = ""
    if mfu and not peak and bf16_peak_tflops:
        peak, peak_note = bf16_peak_tflops, f", peak {bf16_peak_tflops:g} assumed"
    full = attrs.evolve(model, vocab_size=vocab)
    if tflops and _HFU_EQ3.search(conv):
        return (megatron_eq3_flops(model, gbs, seq, vocab) / (tflops * 1e12 * n),
                "measured_tflops_per_gpu (Megatron eq. 3)")
    with_attention = _MODEL_FLOPS.search(conv) is not None
    if (with_attention or _SIX_N.search(conv)) and (tflops or (mfu and peak)):
        rate, col = (tflops, "measured_tflops_per_gpu") if tflops else (mfu / 100.0 * peak, f"mfu_pct{peak_note}")
        if with_attention:
            return nemo_model_flops(full, gbs, seq) / (rate * 1e12 * n), f"{col} (model FLOPs)"
        # 6·N·D: the same count without the attention scores
        return nemo_model_flops(full, gbs, seq, attention_scores=False) / (rate * 1e12 * n), f"{col} (6ND)"
    if tflops or mfu:
        return f"only TFLOPS / MFU, under a FLOPs convention MoFa does not recognise ({conv[:60]!r})"
    return "no measured or derived iteration time"


def _dense_job(r: dict, registry, source: str, hw=None) -> MappedRow | SkippedRow:
    ref = _short_reference(r.get("source", ""))
    rid = r.get("row_id", "")
    name = r["model_name"]
    fw = r.get("framework", "")
    dopt = r.get("distributed_optimizer", "").lower()
    # DeepSpeed's ZeRO-3 (Narayanan Table 2), not an FSDP "ZeRO-3-like" sharding (torchtitan's FSDP2)
    deepspeed_zero3 = "deepspeed" in fw.lower() and "zero-3" in (dopt + fw.lower())
    if deepspeed_zero3:
        ref += " (DeepSpeed ZeRO-3)"
    skip = lambda reason: SkippedRow(source=source, reference=ref, row_id=rid, model=name, reason=reason)  # noqa: E731
    # ZeRO-3 / FSDP: the `fsdp` feature; an FSDP that keeps the parameters gathered (Llama 3's:
    # "ZeRO-2-like", sharding optimizer states and gradients) is the distributed optimizer
    zero2 = re.search(r"zero-?2|not reshard|no reshard", dopt) is not None
    # torchtitan under a pipeline: FSDP2 keeps the parameters unsharded and the gradients
    # unreduced across micro-batches (reshard_after_forward off, gradient sync on the last
    # micro-batch only): one gather and one reduce-scatter per step, as ZeRO-2
    zero2 = zero2 or ("torchtitan" in fw.lower() and "fsdp" in dopt and (_int(r.get("pp"), 1) or 1) > 1)
    full_shard = not zero2 and ("zero-3" in dopt or "fsdp" in dopt or "zero-3" in fw.lower())
    if deepspeed_zero3:
        # Narayanan et al. Table 2's comparison runs: 1,536 GPUs took as long as 768, so their time is
        # set by DeepSpeed's 2021 implementation, not by the hardware MoFa models (its `fsdp` plugin
        # is Megatron-Core FSDP with prefetched all-gathers)
        return skip("DeepSpeed ZeRO-3 (2021): does not scale with its bandwidth (1,536 GPUs as slow as 768); "
                    "MoFa's fsdp plugin models Megatron-Core FSDP, not this implementation")
    hw = hw or _lookup_hw(registry, r["gpu_type"])
    if hw is None:
        return skip(f"unknown GPU {r['gpu_type']!r}")
    model = _lookup_model(registry, name)
    model_section: dict[str, Any]
    if model is not None:
        # the zoo model, with what the row states differently (MegaScale's "175B" has 128 heads
        # and a 64,000 vocabulary, GPT-3's 96 and 51,200)
        stated = {"num_layers": _int(r.get("n_layers")), "hidden_size": _int(r.get("hidden")),
                  "num_attention_heads": _int(r.get("n_heads")), "num_kv_heads": _int(r.get("n_kv_heads")),
                  "vocab_size": _int(r.get("vocab"))}
        if not model.is_moe:
            stated["ffn_hidden_size"] = _int(r.get("ffn_hidden"))
        if stated["vocab_size"] and abs(stated["vocab_size"] / model.vocab_size - 1) < 0.025:
            stated["vocab_size"] = None  # the tokenizer's size vs the zoo's padded one (50,257 → 51,200)
        overrides = {k: v for k, v in stated.items() if v and v != getattr(model, k)}
        model_section = {"name": model.name, **overrides}
        model = attrs.evolve(model, **overrides) if overrides else model
    else:
        h, L, a = _int(r["hidden"]), _int(r["n_layers"]), _int(r["n_heads"])
        if not (h and L and a):
            return skip(f"unknown model {name!r} and no architecture columns")
        ffn = _int(r.get("ffn_hidden"), 4 * h)
        model_section = {"name": "csv-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-"),
                         "num_layers": L, "hidden_size": h, "num_attention_heads": a,
                         "num_kv_heads": _int(r.get("n_kv_heads"), a), "ffn_hidden_size": ffn,
                         "vocab_size": _int(r.get("vocab"), 51200),
                         "activation": "gelu" if ffn == 4 * h else "swiglu"}
    missing = [c for c in ("n_gpus", "global_batch", "seq_len") if not _int(r.get(c))]
    if missing:
        return skip(f"{', '.join(missing)} not stated")
    spec = model if model is not None else ModelSpec(**model_section)
    timed = _dense_target(r, spec, hw.peak_flops_per_s("bf16") / 1e12)
    if isinstance(timed, str):
        return skip(timed)
    measured, target = timed
    tp, pp = _int(r["tp"], 1), _int(r["pp"], 1)
    vpp, cp = _int(r.get("vpp"), 1) or 1, _int(r.get("cp"), 1) or 1
    precision, lowp, lowp_options = _precision(r.get("precision", ""))
    sched_text = r.get("pp_schedule", "")
    flash = True
    old_megatron = any(k in fw for k in ("Megatron-LM (2021", "Megatron-LM (2022", "PTD-P", "zero-bubble"))
    if old_megatron or "Megatron-DeepSpeed" in fw:
        flash = False  # Megatron 2021–22 (and the ZeroBubble fork) ran the unfused core attention
    said = re.search(r"(no|without|unfused|not)?[\s-]*flash[\s-]?att", f"{fw} {r.get('notes', '')}", re.I)
    if said:  # what the row says wins
        flash = not said.group(1)
    n_gpus, gbs = _int(r["n_gpus"]), _int(r["global_batch"])
    dp = max(n_gpus // (tp * pp * cp), 1)
    mbs = _int(r.get("micro_batch"))
    if mbs is None:
        # not stated: FSDP frameworks (torchtitan) run a rank's whole batch at once when there is no
        # pipeline; Megatron's default is 1
        mbs = gbs // dp if full_shard and pp == 1 and gbs and gbs % dp == 0 else 1
    par: dict[str, Any] = {"tp": tp, "pp": pp, "vpp": vpp, "cp": cp, "micro_batch_size": mbs,
                           "global_batch_size": gbs, "sequence_length": _int(r["seq_len"]),
                           "precision": precision, "flash_attention": flash}
    sp = r.get("sequence_parallel", "").strip().lower()
    if sp.startswith("y"):
        par["sequence_parallel"] = True
    elif sp.startswith("n") and sp != "n/a":
        par["sequence_parallel"] = False
    job: dict[str, Any] = {"model": model_section, "hardware": {"name": hw.name, "num_gpus": _int(r["n_gpus"])},
                           "parallel": par, "features": {}}
    ignore: frozenset[str] = frozenset()
    if "zero-bubble" in fw and sched_text in _ZB_SCHEDULES:  # ZeroBubble: end stages hold one layer fewer
        L = _int(r["n_layers"])
        mid = (L + 2) // pp
        ends = mid - 1 if pp > 2 else L // pp
        par.update(first_stage_layers=ends, last_stage_layers=ends)
        job["pipeline"] = {"schedule": _ZB_SCHEDULES[sched_text]}
        ignore = _ZB_IGNORED
    elif pp > 1 and spec.num_layers % (pp * vpp):
        par.update(_uneven_pipeline(spec.num_layers, pp, vpp))
        ignore = _ZB_IGNORED
    variants: tuple[dict, ...] = ()
    microbatches = gbs // (dp * mbs) if gbs else 0
    sched = sched_text.lower()
    says_interleaved = "interleav" in sched and "not stated" not in sched
    says_plain = re.fullmatch(r"\s*1f1b\s*", sched) is not None or "gpipe" in sched
    # DeepSpeed's pipeline engine (Megatron-DeepSpeed: BLOOM, MT-NLG) has no interleaved schedule
    can_interleave = "zero-bubble" not in fw and "deepspeed" not in fw.lower()
    if pp > 1 and not r.get("vpp", "").strip() and can_interleave and (
            says_interleaved or (not says_plain and 0 < microbatches < UNSTATED_VPP_MIN_RATIO * (pp - 1))):
        # the factor is not stated, and the schedule says interleaved, or says nothing while plain
        # 1F1B would idle a fifth of the step or more (a tuned run interleaves): every factor that
        # splits the layers, resolved by `resolve_unstated` to the fastest
        variants = vpp_variants(spec.num_layers, pp, 2 if says_interleaved else 1)
        ignore = _ZB_IGNORED
    rec = r.get("recompute", "").lower()
    if rec.startswith("full"):
        job["features"]["recompute"] = {"granularity": "full"}
    elif rec.startswith("selective"):
        job["features"]["recompute"] = {"granularity": "selective"}
    assumed = ""
    megascale = "megascale" in fw.lower() and "baseline" not in fw.lower()
    if (_MEGATRON_CORE.search(fw) or megascale) and not re.match(r"no\b|n$|none", dopt):
        # a Megatron-Core-era run: its recipe, unless the row says otherwise ("DDP (dist. optimizer
        # not stated)" does not); the data-parallel sharding the row states refines it below.
        # MegaScale (arXiv 2402.15627 §3.2) overlaps the same three: the DP gather/reduce-scatter
        # with the first/last micro-batch, PP send/receive, and TP/SP collectives fused with GEMMs
        job["features"].update(_megatron_core_recipe(tp, pp, cp, full_shard))
        if megascale:
            assumed = ("MegaScale: its DP, PP and TP overlaps applied; its parallel transformer block, "
                       "sliding-window attention and LAMB are not modelled")
    if zero2:
        job["features"]["distributed_optimizer"] = {"shard_gradients": True}
    elif full_shard:
        job["features"]["fsdp"] = {}
    elif dopt.startswith("y") or "zero-1" in dopt or "distributed" in dopt and not dopt.startswith("ddp"):
        job["features"]["distributed_optimizer"] = {}
    if lowp:
        job["features"][lowp] = lowp_options
    notes = r.get("notes", "")
    if dp > 1 and ("DDP-impl torch" in notes or not old_megatron):
        job["features"]["dp_overlap"] = {}  # torch DDP buckets overlap the all-reduce with backward
    group = (source, name, hw.name, _int(r["n_gpus"]), _int(r["seq_len"]))
    mem = _num(r.get("measured_memory_gb"))
    return MappedRow(source=source, reference=ref, row_id=rid, job=job, measured_s=measured, target=target,
                     group=group, measured_tflops=_num(r.get("measured_tflops_per_gpu")),
                     tflops_convention=r.get("flops_convention", "")[:60], measured_memory_gib=mem,
                     ignore_constraints=ignore, notes=notes[:200], variants=variants, assumptions=assumed)


#: words the Megatron-Core MoE model zoo's notes use for --recompute-modules
_NOTE_MODULES = {"norm": "layernorm", "layernorm": "layernorm", "act": "moe_act", "moe_act": "moe_act",
                 "shared_expert": "shared_experts", "shared_experts": "shared_experts", "up_proj": "mla_up_proj",
                 "mla_up_proj": "mla_up_proj", "mlp": "mlp", "moe": "moe", "core_attn": "core_attn"}


@attrs.frozen(kw_only=True)
class BridgeRecipe:
    """Settings of a Megatron-Bridge performance preset (``scripts/performance/configs``) that a
    row's table does not state, applied to the rows whose model, GPU, precision and layout match.

    ``layout`` keys: tp, pp, vpp, ep, mbs, gbs (all given must equal the row's); ``precision``:
    substrings of the row's precision column (any one must occur), empty = any. A layout-matched
    setting is used only if every preset version read agrees on it for that layout.
    """

    models: tuple[str, ...]
    gpus: tuple[str, ...]  # profile name prefixes; empty = any GPU
    features: dict
    source: str
    precision: tuple[str, ...] = ()
    layout: dict = attrs.field(factory=dict)

    def matches(self, model: str, hw: str, precision: str, layout: dict) -> bool:
        return (model in self.models and (not self.gpus or hw.startswith(self.gpus))
                and (not self.precision or any(p in precision for p in self.precision))
                and all(layout.get(k) == v for k, v in self.layout.items()))


_MB = "NVIDIA-NeMo/Megatron-Bridge"
_DSV3 = ("deepseek-v3", "deepseek-v3-no-mtp")
_FLEX = {"flex_dispatcher": {}}
_FLEX_DEEPEP = {"flex_dispatcher": {"backend": "deepep"}}
#: TE per-module CUDA graphs (--cuda-graph-scope attn moe_router moe_preprocess / moe_router moe_preprocess)
_GRAPHS_ATTN_ROUTER = {"scope": "per_module", "attn": True, "mlp": False, "moe_router": True, "moe_preprocess": True}
_GRAPHS_ROUTER = {"scope": "per_module", "attn": False, "mlp": False, "moe_router": True, "moe_preprocess": True}
#: the two Qwen3 preset versions read (older configs/qwen3 layout, newer configs/qwen) and the GPT-OSS one
_QWEN3_PRESETS = (f"{_MB}@0fa501acee1ebfe3d1ab8088b638e2089d800df6 scripts/performance/configs/qwen3/workload_base_configs.py"
                  " and @01b2977e518f0a58ec870daba2fb2c04d76a91b2 scripts/performance/configs/qwen/qwen3_workload_base_configs.py")
_GPT_OSS_PRESET = f"{_MB}@07eea52d4523a69fc8975cef34938d61ae13f9e2 scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py"
#: Megatron-Bridge performance presets the tables do not state (read at the commits cited)
BRIDGE_RECIPES: tuple[BridgeRecipe, ...] = (
    # token dispatcher: the DeepSeek-V3 recipe selects the flex dispatcher (HybridEP) on every GPU
    BridgeRecipe(models=_DSV3, gpus=(), features=_FLEX,
                 source=f"{_MB}@355cef457010f70533a5c83f1ed97899d0e0af43 src/megatron/bridge/recipes/deepseek/deepseek_v3.py"),
    # Qwen3: flex for every 30B row and for 235B on GB300/GB200/B300 (alltoall on B200/H100)
    BridgeRecipe(models=("qwen3-30b-a3b",), gpus=(), features=_FLEX,
                 source=f"{_MB}@05c0c90fbbf69c7bd57ee93c32f28b840f31484f scripts/performance/configs/qwen/qwen3_llm_pretrain.py"),
    BridgeRecipe(models=("qwen3-235b-a22b",), gpus=("gb300", "gb200", "b300"), features=_FLEX,
                 source=f"{_MB}@05c0c90fbbf69c7bd57ee93c32f28b840f31484f scripts/performance/configs/qwen/qwen3_llm_pretrain.py"),
    # 1F1B all-to-all overlap (moe_a2a_overlap) and recompute modules of layout-matched presets
    BridgeRecipe(models=("qwen3-235b-a22b",), gpus=("h100",), features={"ep_overlap": {}},
                 layout={"tp": 2, "pp": 8, "vpp": 4, "ep": 32, "mbs": 1},
                 source=f"{_MB}@01b2977e518f0a58ec870daba2fb2c04d76a91b2 and @f29a269f8728ff9075f88a226f92e554196a7e41 "
                        "scripts/performance/configs/qwen/qwen3_workload_base_configs.py"),
    BridgeRecipe(models=_DSV3, gpus=("h100",), layout={"tp": 2, "pp": 8, "vpp": 4, "ep": 64, "gbs": 8192},
                 features={**_FLEX_DEEPEP, "ep_overlap": {},
                           "recompute": {"granularity": "selective", "mla_up_proj": True, "mlp": True}},
                 source=f"{_MB}@013284246bc0714e406c8a519b8686b7e50628ec scripts/performance/configs/deepseek/"
                        "deepseek_llm_pretrain.py (deepseek_v3_h100_1024gpus_*_config)"),
    BridgeRecipe(models=_DSV3, gpus=("b200",), precision=("MX",), layout={"tp": 1, "pp": 8, "vpp": 2, "ep": 32},
                 features={**_FLEX_DEEPEP, "ep_overlap": {},
                           "recompute": {"granularity": "selective", "mla_up_proj": True, "mlp": True}},
                 source=f"{_MB}@042641823051ce167c52b0ae289941a227c11535 scripts/performance/configs/deepseek/"
                        "deepseek_workload_base_configs.py (B200 FP8-MX V2)"),
    BridgeRecipe(models=_DSV3, gpus=("gb300",), precision=("MX",), layout={"tp": 1, "pp": 2, "vpp": 8, "ep": 32, "mbs": 1},
                 features={"ep_overlap": {}},
                 source=f"{_MB}@042641823051ce167c52b0ae289941a227c11535 scripts/performance/configs/deepseek/"
                        "deepseek_workload_base_configs.py (GB300 FP8-MX)"),
    BridgeRecipe(models=_DSV3, gpus=("gb300",), layout={"tp": 1, "pp": 2, "vpp": 8, "ep": 32, "mbs": 2},
                 features={"recompute": {"granularity": "selective", "mla_up_proj": True}},
                 source=f"{_MB}@042641823051ce167c52b0ae289941a227c11535 and @f0e2c37e3f82c57f9d0e95aa8ae98b3470a91107 "
                        "scripts/performance/configs/deepseek/deepseek_workload_base_configs.py (GB300 FP8-CS)"),
    BridgeRecipe(models=_DSV3, gpus=("gb200",), precision=("MX",), layout={"tp": 1, "pp": 4, "vpp": 4, "ep": 64, "mbs": 1},
                 features={"ep_overlap": {}, "recompute": {"granularity": "selective", "mla_up_proj": True}},
                 source=f"{_MB}@042641823051ce167c52b0ae289941a227c11535 scripts/performance/configs/deepseek/"
                        "deepseek_workload_base_configs.py (GB200 FP8-MX)"),
    BridgeRecipe(models=_DSV3, gpus=("b200", "b300"), layout={"tp": 1, "pp": 16, "ep": 8, "mbs": 1},
                 features={"recompute": {"granularity": "selective", "mla_up_proj": True}},
                 source=f"{_MB}@042641823051ce167c52b0ae289941a227c11535 and @f0e2c37e3f82c57f9d0e95aa8ae98b3470a91107 "
                        "scripts/performance/configs/deepseek/deepseek_workload_base_configs.py (B200 V1, older B300)"),
    BridgeRecipe(models=("gpt-oss-120b",), gpus=("gb300", "gb200", "b300"), precision=("MX",),
                 layout={"tp": 1, "pp": 1, "mbs": 4, "gbs": 1280}, features={"ep_overlap": {}},
                 source=f"{_MB}@07eea52d4523a69fc8975cef34938d61ae13f9e2 scripts/performance/configs/gpt_oss/"
                        "gpt_oss_workload_base_configs.py (FP8-MX V2)"),
    BridgeRecipe(models=("gpt-oss-120b",), gpus=("gb200", "b200"), precision=("BF16",),
                 layout={"tp": 1, "pp": 1, "mbs": 4, "gbs": 1280},
                 features={"recompute": {"granularity": "selective", "layernorm": True, "moe_act": True}},
                 source=f"{_MB}@07eea52d4523a69fc8975cef34938d61ae13f9e2 and @1e7adfa90b18d15594c049ed3ca3554096495594 "
                        "scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py (BF16 V2)"),
    BridgeRecipe(models=("gpt-oss-120b",), gpus=("h100",), layout={"tp": 1, "pp": 4, "ep": 8, "mbs": 1},
                 features={"recompute": {"granularity": "selective", "layernorm": True, "moe_act": True}},
                 source=f"{_MB}@07eea52d4523a69fc8975cef34938d61ae13f9e2 and @1e7adfa90b18d15594c049ed3ca3554096495594 "
                        "scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py (H100)"),
    # CUDA graphs (cuda_graph_impl / cuda_graph_scope): Qwen3 presets capture graphs in every version read
    # (the older configs/qwen3 layout the full iteration, the newer one per module); the scope both
    # cover is applied. DeepSeek-V3 is left out: the oldest version read sets no graphs on GB200/B200.
    BridgeRecipe(models=("qwen3-30b-a3b",), gpus=("gb200",), precision=("MX",), layout={"mbs": 4},
                 features={"cuda_graphs": _GRAPHS_ROUTER}, source=f"{_QWEN3_PRESETS} (GB200 FP8_MX)"),
    BridgeRecipe(models=("qwen3-30b-a3b",), gpus=("gb200",), precision=("CS", "BF16"), layout={"mbs": 4},
                 features={"cuda_graphs": _GRAPHS_ATTN_ROUTER}, source=f"{_QWEN3_PRESETS} (GB200 BF16 / FP8_CS)"),
    BridgeRecipe(models=("qwen3-30b-a3b",), gpus=("b200",), features={"cuda_graphs": _GRAPHS_ATTN_ROUTER},
                 source=f"{_QWEN3_PRESETS} (B200, every precision)"),
    BridgeRecipe(models=("qwen3-30b-a3b",), gpus=("gb300", "b300"), layout={"mbs": 8},
                 features={"cuda_graphs": _GRAPHS_ROUTER},
                 source=f"{_QWEN3_PRESETS} (GB300 MBS 8; B300 only in the newer)"),
    BridgeRecipe(models=("qwen3-235b-a22b",), gpus=("gb200",), layout={"tp": 1, "pp": 8, "ep": 32},
                 features={"cuda_graphs": _GRAPHS_ATTN_ROUTER},
                 source=f"{_QWEN3_PRESETS} (GB200 V2, newer only; the older PP8 EP8 GBS1024 layout graphs the full "
                        "iteration)"),
    # GPT-OSS (one version read): the full iteration for MXFP8 on GB300/GB200, per module for BF16 on GB300
    # and for both precisions on B300
    BridgeRecipe(models=("gpt-oss-120b",), gpus=("gb300", "gb200"), precision=("MX",),
                 layout={"tp": 1, "pp": 1, "mbs": 4, "gbs": 1280}, features={"cuda_graphs": {}},
                 source=f"{_GPT_OSS_PRESET} (FP8-MX V2: full_iteration)"),
    BridgeRecipe(models=("gpt-oss-120b",), gpus=("gb300",), precision=("BF16",), layout={"tp": 1, "pp": 1, "mbs": 4},
                 features={"cuda_graphs": _GRAPHS_ATTN_ROUTER}, source=f"{_GPT_OSS_PRESET} (GB300 BF16)"),
    BridgeRecipe(models=("gpt-oss-120b",), gpus=("b300",), layout={"tp": 1, "pp": 1, "mbs": 4},
                 features={"cuda_graphs": _GRAPHS_ATTN_ROUTER}, source=f"{_GPT_OSS_PRESET} (B300 BF16 / FP8_MX)"),
)


def nemo_model_flops(model: ModelSpec, global_batch_size: int, sequence_length: int,
                     attention_scores: bool = True) -> float:
    """A step's model FLOPs as NeMo counts them, for a dense model.

    NeMo's ``flops_formulas`` (``gpt3``, ``llama2``, ``llama3``, ``nemotron``): per token and
    layer, the forward is ``2h(h + 2h·g/a) + 2h² + 2h·f·(3 gated | 2 plain) + 4·s·h`` (the
    attention score and value products over the *whole* sequence: no causal halving), times 3
    for forward and backward, plus ``6·h·V`` for the output layer. NeMo's performance tables
    divide this by the step time and the GPUs to report model TFLOPS per GPU. Without the
    ``attention_scores`` term it is ``6·N·D`` (N the GEMM weights, D the tokens).
    """
    h, L, s = model.hidden_size, model.num_layers, sequence_length
    kv = model.num_kv_heads / model.num_attention_heads
    mlp_mats = 3 if model.activation is Activation.swiglu else 2
    per_token_layer = (2 * h * (h + 2 * h * kv) + 2 * h * h + 2 * h * model.ffn_hidden_size * mlp_mats
                       + (4 * s * h if attention_scores else 0))
    return float(global_batch_size) * s * (3 * L * per_token_layer + 6 * h * model.vocab_size)


def _nvidia_job(r: dict, registry, source: str, hw=None) -> MappedRow | SkippedRow:
    ref = f"{r.get('framework', '')} {r.get('release', '')}".strip()
    rid = r.get("source_id", "")
    name = r["model"]
    skip = lambda reason: SkippedRow(source=source, reference=ref, row_id=rid, model=name, reason=reason)  # noqa: E731
    notes = r.get("notes", "")
    low = (notes + " " + name).lower()
    if "proxy" in low or "reduced-layer" in low or "reduced layer" in low:
        return skip("reduced-layer proxy run (notes say so); the model's layer count is not the zoo's")
    if "performance regression" in low and "known issue" in low:
        return skip("the source flags this measurement as a known performance regression (a software bug, "
                    "fixed in a later release), not the hardware's speed")
    task = r.get("task", "").strip().lower()
    if task and "pretrain" not in task.replace("-", ""):
        return skip(f"task {r.get('task')!r} is fine-tuning, not pretraining")
    fsdp = r.get("fsdp", "").strip().lower()
    fw = r.get("framework", "")
    # Megatron-FSDP (optim_grads_params) / torchtitan FSDP2: the `fsdp` feature
    full_shard = fsdp not in ("", "0", "off", "no", "n") or "torchtitan" in fw.lower()
    model = _lookup_model(registry, name)
    if model is None:
        return skip(f"unknown model {name!r} (not in the model zoo)")
    hw = hw or _lookup_hw(registry, r["gpu_type"])
    if hw is None:
        return skip(f"unknown GPU {r['gpu_type']!r}")
    measured, target = _num(r.get("step_time_s")), "step_time_s"
    if measured is None:
        measured, target = _num(r.get("step_time_s_derived")), "step_time_s_derived"
    tflops = _num(r.get("model_tflops_per_gpu"))
    num_gpus = _int(r["num_gpus"])
    tp, pp, cp = _int(r.get("tp"), 1) or 1, _int(r.get("pp"), 1) or 1, _int(r.get("cp"), 1) or 1
    gbs, seq = _int(r.get("gbs")), _int(r.get("seq_len"))
    stated_dp = _int(r.get("dp"))
    layout_note = ""
    if measured is None and r.get("tp", "").strip() and stated_dp and tp * pp * cp * stated_dp != num_gpus:
        # NeMo's B200 long-sequence table: its TP·PP·CP·DP is a quarter of its GPU count. The stated
        # layout is used; the per-GPU TFLOPS, hence the error, do not depend on which one is wrong
        layout_note = (f"stated layout tp·pp·cp·dp = {tp * pp * cp * stated_dp} GPUs, not the {num_gpus} "
                       "listed: predicted on the stated layout")
        num_gpus = tp * pp * cp * stated_dp
    if measured is None and tflops and "nemo" in fw.lower():
        if model.is_moe:
            return skip("only model TFLOPS, and NeMo's FLOPs formula for this MoE model is not implemented, "
                        "so no step time can be derived")
        if not (r.get("tp", "").strip() and gbs and seq):
            return skip("only model TFLOPS, and the run's TP/PP/CP layout, global batch or sequence length "
                        "is not stated")
        # NeMo reports model TFLOPS under its own, published FLOPs formula: the step time follows
        measured = nemo_model_flops(model, gbs, seq) / (tflops * 1e12 * num_gpus)
        target = "model_tflops_per_gpu (NeMo FLOPs formula)"
    if measured is None:
        seq_missing = not seq and (_num(r.get("tokens_per_sec_per_gpu")) or _num(r.get("total_tokens_per_sec")))
        return skip("tokens/s only, and no sequence length stated, so no step time" if seq_missing else
                    "no step time (measured or derived); only model TFLOPS, under a FLOPs convention MoFa "
                    "does not implement for this source, so no step time can be derived")
    if not r.get("precision", "").strip():
        return skip("precision not given")
    vpp, ep = _int(r.get("vp"), 1) or 1, _int(r.get("ep"), 1) or 1
    etp = _int(r.get("etp"), 0) or 0
    mbs = _int(r.get("mbs"), 1) or 1
    if not (gbs and seq and num_gpus):
        return skip("gbs, seq_len or num_gpus missing")
    if not etp and model.is_moe and ep > 1:
        # ETP not stated: Megatron-Bridge's MoE recipes and the Megatron-Core MoE model zoo set
        # --expert-tensor-parallel-size 1 (every model-zoo row that states it says 1), and where
        # Megatron-Core's default (= tp) cannot fold with the EP size the run must have
        etp = 1
    precision, lowp, lowp_options = _precision(r["precision"])
    par = {"tp": tp, "pp": pp, "vpp": vpp, "cp": cp, "ep": ep, "etp": etp, "micro_batch_size": mbs,
           "global_batch_size": gbs, "sequence_length": seq, "precision": precision}
    ignore: frozenset[str] = frozenset()
    L = model.num_layers
    if pp > 1 and L % (pp * vpp):
        par.update(_uneven_pipeline(L, pp, vpp))
        ignore = _ZB_IGNORED
    variants: tuple[dict, ...] = ()
    dp = num_gpus // (tp * pp * cp)
    if (pp > 1 and r.get("vp", "").strip().lower() in ("", "n/a") and dp
            and 0 < gbs // (dp * mbs) < UNSTATED_VPP_MIN_RATIO * (pp - 1)):
        # the interleaving is not given and plain 1F1B would idle a fifth of the step or more: the
        # dense schema's rule (a tuned run interleaves), resolved by `resolve_unstated`
        variants = vpp_variants(L, pp)
        ignore = _ZB_IGNORED
    feats = _megatron_core_recipe(tp, pp, cp, full_shard)
    if lowp:
        feats[lowp] = dict(lowp_options)
    # what the notes state the run used (Megatron-Core MoE model zoo: "recompute=full",
    # "+1f1b overlap" = --overlap-moe-expert-parallel-comm with the combined 1F1B schedule)
    nlow = notes.lower()
    if re.search(r"recompute\s*=\s*full", nlow):
        feats["recompute"] = {"granularity": "full"}
    else:
        # "recompute=norm, act[, shared_expert]": Megatron-Core --recompute-modules
        listed = re.search(r"recompute\s*=\s*([a-z_ ,]*)", nlow)
        mods = {_NOTE_MODULES[w.strip()] for w in (listed.group(1).split(",") if listed else ())
                if w.strip() in _NOTE_MODULES}
        if mods:
            feats["recompute"] = {"granularity": "selective", **dict.fromkeys(sorted(mods), True)}
    if "1f1b overlap" in nlow and model.is_moe and ep > 1:
        feats["ep_overlap"] = {}
    # "dispatcher=DeepEP" / "HybridEP": Megatron-Core's flex token dispatcher ("A2A": alltoall)
    # ("dispatcher=DeepEP", "dispatcher DeepEP", "HybridEP dispatcher"; a stated other dispatcher wins)
    stated = re.search(r"dispatcher\s*[=:]?\s*([a-z0-9]+)", nlow)
    disp = (stated.group(1) if stated and stated.group(1) in ("deepep", "hybridep", "alltoall", "a2a", "allgather")
            else (re.search(r"\b(deepep|hybridep)\b", nlow) or [None, None])[1])
    if disp in ("deepep", "hybridep") and model.is_moe and ep > 1:
        feats["flex_dispatcher"] = {"backend": disp}
    if source == "nvidia_megatron_bridge" and model.is_moe and ep > 1:
        layout = {"tp": tp, "pp": pp, "vpp": vpp, "ep": ep, "mbs": mbs, "gbs": gbs}
        for recipe in BRIDGE_RECIPES:
            if recipe.matches(model.name, hw.name, r["precision"], layout):
                feats.update({k: dict(v) for k, v in recipe.features.items()})
    job = {"model": {"name": model.name}, "hardware": {"name": hw.name, "num_gpus": num_gpus}, "parallel": par,
           "features": feats}
    mem = _num(r.get("peak_mem_gib"))
    group = (source, model.name, hw.name, num_gpus, seq, r["precision"].strip())
    return MappedRow(source=source, reference=ref, row_id=rid, job=job, measured_s=measured, target=target,
                     group=group, measured_tflops=_num(r.get("model_tflops_per_gpu")),
                     tflops_convention="model FLOPs (NVIDIA)", measured_memory_gib=mem, notes=notes[:200],
                     assumptions=layout_note, ignore_constraints=ignore, variants=variants)


#: Megatron-DeepSpeed's GPT-2 vocabulary (50,257) padded to a multiple of 128
VTRAIN_VOCAB = 50304


def _vtrain_job(r: dict, registry, source: str, index: int, hw=None) -> MappedRow | SkippedRow:
    h, a, L = int(r["hidden size"]), int(r["attention heads"]), int(r["# layers"])
    seq, n = int(r["sequence length"]), int(r["# GPUs"])
    tp, dp, pp = int(r["tensor parallelism"]), int(r["data parallelism"]), int(r["pipeline parallelism"])
    name = f"vtrain-h{h}-a{a}-l{L}"
    if tp * dp * pp != n:
        return SkippedRow(source=source, reference="vTrain", row_id=str(index + 1), model=name,
                          reason=f"tp·dp·pp = {tp * dp * pp} ≠ # GPUs = {n}")
    model = {"name": name, "num_layers": L, "hidden_size": h, "num_attention_heads": a, "num_kv_heads": a,
             "ffn_hidden_size": 4 * h, "vocab_size": VTRAIN_VOCAB, "activation": "gelu",
             "normalization": "layernorm", "position_embedding": "learned"}
    par = {"tp": tp, "pp": pp, "micro_batch_size": int(r["micro batch"]), "global_batch_size": int(r["global batch"]),
           "sequence_length": seq, "sequence_parallel": False, "precision": "fp16", "flash_attention": False}
    job = {"model": model, "hardware": {"name": hw.name if hw else "a100-sxm4-80gb", "num_gpus": n}, "parallel": par,
           "pipeline": {"schedule": "1f1b"}, "features": {"recompute": {"granularity": "full"}}}
    if dp > 1:
        job["features"]["dp_overlap"] = {}
    return MappedRow(source=source, reference="vTrain", row_id=str(index + 1), job=job,
                     measured_s=float(r["iteration time (ms)"]) / 1e3, target="iteration time (ms)",
                     group=(source, name, n, seq))


def map_rows(paths: Iterable[str | Path], registry, hardware: str | None = None
             ) -> tuple[list[MappedRow], list[SkippedRow]]:
    """Every row of every file: mapped to a job, or skipped with the reason. With `hardware`
    (a profile name or alias) every row runs on that profile, whatever GPU it names."""
    hw = registry.hardware_profile(hardware, field="--hardware") if hardware else None
    mapped: list[MappedRow] = []
    skipped: list[SkippedRow] = []
    for path in paths:
        schema, rows = read_csv(path)
        source = Path(path).stem
        for i, r in enumerate(rows):
            try:
                if schema == "dense":
                    out = _dense_job(r, registry, source, hw)
                elif schema == "nvidia":
                    out = _nvidia_job(r, registry, source, hw)
                else:
                    out = _vtrain_job(r, registry, source, i, hw)
            except (KeyError, ValueError, TypeError) as exc:
                out = SkippedRow(source=source, reference="", row_id=str(i + 1), model="?",
                                 reason=f"malformed row: {type(exc).__name__}: {exc}")
            (mapped if isinstance(out, MappedRow) else skipped).append(out)
    return mapped, skipped


# ====================================================================== prediction


@attrs.frozen(kw_only=True, eq=False)
class PreparedGroup:
    """Feasible rows sharing model + hardware, as one batch (re-evaluable with other efficiencies)."""

    model: Any
    hardware: Any
    batch: Any
    rows: list[int]  # indices into the mapped list
    jobs: list[Any]


def prepare(mapped: Sequence[MappedRow], predictor) -> tuple[list[PreparedGroup], list[SkippedRow]]:
    """Resolve jobs, check feasibility, and group feasible rows into batches."""
    from .config import jobs_to_batch
    from .errors import MofaError

    infeasible: list[SkippedRow] = []
    groups: dict[tuple, list[tuple[int, Any]]] = defaultdict(list)
    for i, m in enumerate(mapped):
        try:
            job = predictor.job(m.job, name=f"{m.source}:{m.row_id}")
        except MofaError as exc:
            infeasible.append(SkippedRow(source=m.source, reference=m.reference, row_id=m.row_id,
                                         model=str(m.job["model"].get("name")), reason=str(exc), kind="infeasible"))
            continue
        groups[(repr(job.model), job.hardware.name)].append((i, job))
    out: list[PreparedGroup] = []
    for members in groups.values():
        jobs = [j for _, j in members]
        model, hw = jobs[0].model, jobs[0].hardware
        batch = jobs_to_batch(jobs, predictor.registry)
        ok = np.ones(len(jobs), dtype=bool)
        reasons: dict[int, str] = {}
        for c in predictor.constraints(batch, model, hw):
            bad = ~np.asarray(c.feasible, bool)
            for k in np.flatnonzero(bad & ok):
                if c.name in mapped[members[k][0]].ignore_constraints:
                    continue
                ok[k] = False
                reasons[k] = f"{c.name}: {c.reason}"
        for k, reason in reasons.items():
            m = mapped[members[k][0]]
            infeasible.append(SkippedRow(source=m.source, reference=m.reference, row_id=m.row_id,
                                         model=model.name, reason=reason, kind="infeasible"))
        keep = [members[k] for k in np.flatnonzero(ok)]
        if not keep:
            continue
        kjobs = [j for _, j in keep]
        out.append(PreparedGroup(model=model, hardware=hw, batch=jobs_to_batch(kjobs, predictor.registry),
                                 rows=[i for i, _ in keep], jobs=kjobs))
    return out, infeasible


def predict_prepared(groups: Sequence[PreparedGroup], predictor, hardware_override: dict | None = None,
                     n_rows: int | None = None) -> dict[str, np.ndarray]:
    """Arrays over the mapped rows (NaN where not predicted): step time, model TFLOPS, memory, fit.

    ``hardware_override`` maps a profile name to a replacement :class:`HardwareProfile`
    (calibration evaluates the same batches with other efficiency coefficients).
    """
    n = n_rows if n_rows is not None else (max((max(g.rows) for g in groups), default=-1) + 1)
    out = {k: np.full(n, np.nan) for k in ("step_s", "model_tflops", "memory_gib", "fits")}
    for g in groups:
        hw = (hardware_override or {}).get(g.hardware.name, g.hardware)
        pred = predictor.evaluate(g.batch, g.model, hw)
        idx = np.asarray(g.rows)
        out["step_s"][idx] = pred.step_time_s
        out["model_tflops"][idx] = pred.model_tflops_per_gpu
        out["memory_gib"][idx] = pred.peak_memory_gib
        out["fits"][idx] = np.asarray(pred.fits_in_memory, float)
    return out


def _strategy(job: dict) -> str:
    p = job["parallel"]
    bits = [f"TP{p.get('tp', 1)}", f"PP{p.get('pp', 1)}"]
    if p.get("vpp", 1) > 1:
        bits.append(f"v{p['vpp']}")
    if p.get("cp", 1) > 1:
        bits.append(f"CP{p['cp']}")
    if p.get("ep", 1) > 1:
        bits.append(f"EP{p['ep']}")
    bits.append(f"mbs{p.get('micro_batch_size', 1)}")
    bits.append(f"gbs{p['global_batch_size']}")
    sched = job.get("pipeline", {}).get("schedule")
    if sched and sched not in ("1f1b",):
        bits.append(sched)
    rec = job.get("features", {}).get("recompute")
    if rec:
        bits.append(f"rc-{rec['granularity']}")
    return " ".join(bits)


def row_results(mapped: Sequence[MappedRow], arrays: dict[str, np.ndarray]) -> list[RowResult]:
    out = []
    for i, m in enumerate(mapped):
        t = arrays["step_s"][i]
        if not np.isfinite(t):
            continue
        gbs = m.job["parallel"]["global_batch_size"]
        out.append(RowResult(
            source=m.source, reference=m.reference, row_id=m.row_id, model=str(m.job["model"]["name"]),
            hardware=m.job["hardware"]["name"], num_gpus=m.job["hardware"]["num_gpus"], strategy=_strategy(m.job),
            target=m.target, measured_s=m.measured_s, predicted_s=float(t), error=float(t / m.measured_s - 1.0),
            measured_tflops=m.measured_tflops,
            predicted_tflops_source_convention=(m.measured_tflops * m.measured_s / float(t)
                                                if m.measured_tflops else None),
            predicted_model_tflops=float(arrays["model_tflops"][i]), tflops_convention=m.tflops_convention,
            measured_memory_gib=m.measured_memory_gib, predicted_memory_gib=float(arrays["memory_gib"][i]),
            fits_in_memory=bool(arrays["fits"][i] > 0.5), group=m.group,
            measured_s_per_seq=m.measured_s / gbs, predicted_s_per_seq=float(t) / gbs, assumptions=m.assumptions))
    return out


# ====================================================================== statistics


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's ρ with average ranks for ties."""
    def ranks(v):
        v = np.asarray(v, float)
        order = np.argsort(v, kind="mergesort")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for val in np.unique(v):  # average ties
            sel = v == val
            if sel.sum() > 1:
                r[sel] = r[sel].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def rank_stats(rows: Sequence[RowResult], min_size: int = 3) -> RankStats:
    groups: dict[tuple, list[RowResult]] = defaultdict(list)
    for r in rows:
        if r.group is not None:
            groups[r.group].append(r)
    rho: dict[str, float] = {}
    regret: dict[str, float] = {}
    for key, members in groups.items():
        if len(members) < min_size:
            continue
        name = " / ".join(str(k) for k in key[1:])
        meas = [r.measured_s_per_seq for r in members]
        pred = [r.predicted_s_per_seq for r in members]
        s = spearman(meas, pred)
        if not math.isnan(s):
            rho[name] = s
        regret[name] = float(meas[int(np.argmin(pred))] / min(meas) - 1.0)
    return RankStats(groups=len(regret), spearman=rho, regret=regret)


def from_sources(row, texts: Iterable[str]) -> bool:
    """Whether the row's source (file stem) or reference contains one of `texts` (case-insensitive):
    the ``--source`` filter and the ``--hold-out`` split."""
    keys = [t.lower() for t in texts]
    return any(k in row.source.lower() or k in row.reference.lower() for k in keys)


#: what ``group_errors`` can group predicted rows by
GROUP_KEYS = ("source", "reference", "model", "hardware", "num_gpus")


def group_keys(text: str) -> list[str]:
    """``--by`` text ("model,hardware") as grouping keys; ConfigError naming the valid ones."""
    keys = [k.strip() for k in text.split(",") if k.strip()]
    if not keys or any(k not in GROUP_KEYS for k in keys):
        raise ConfigError(f"--by {text or '(nothing)'}: group by one or more of {', '.join(GROUP_KEYS)}")
    return keys


@attrs.frozen(kw_only=True)
class GroupErrors:
    """The step-time error of the predicted rows sharing `key` (values of the grouping fields)."""

    key: tuple
    step_time: ErrorStats
    #: this group's share of the summed |error| of all rows: where the error is
    share_of_error: float


def group_errors(rows: Sequence[RowResult], by: Sequence[str]) -> list[GroupErrors]:
    """Rows grouped by the fields `by` (of :data:`GROUP_KEYS`), largest summed |error| first."""
    by = group_keys(",".join(by))
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        groups[tuple(getattr(r, k) for k in by)].append(r.error)
    total = sum(abs(e) for errs in groups.values() for e in errs) or 1.0
    out = [GroupErrors(key=k, step_time=ErrorStats.of(v), share_of_error=sum(map(abs, v)) / total)
           for k, v in groups.items()]
    return sorted(out, key=lambda g: -g.share_of_error)


def summarize(source: str, rows: Sequence[RowResult], skipped: Sequence[SkippedRow]) -> SourceSummary:
    mem = [r.predicted_memory_gib / r.measured_memory_gib - 1.0 for r in rows if r.measured_memory_gib]
    targets: dict[str, int] = defaultdict(int)
    for r in rows:
        targets[r.target] += 1
    return SourceSummary(source=source, rows=len(rows), skipped=len(skipped),
                         step_time=ErrorStats.of([r.error for r in rows]), memory=ErrorStats.of(mem),
                         ranking=rank_stats(rows), targets=dict(targets))


def resolve_unstated(mapped: Sequence[MappedRow], predictor) -> list[MappedRow]:
    """Settle each row's unstated setting (its ``variants``) to what a tuned run would use.

    Every candidate is predicted and the fastest is kept. Memory does not decide: the sources that
    leave the interleaving unstated leave recompute and sequence parallelism unstated too (Llama 3,
    the Megatron-Core README), so the mapped job's memory is not the run's. The choice is made
    once, with the predictor's current profiles, and written into the row's notes.
    """
    todo = [i for i, m in enumerate(mapped) if m.variants]
    out = list(mapped)
    if not todo:
        return out
    trial: list[MappedRow] = []
    owner: list[tuple[int, dict]] = []
    for i in todo:
        m = mapped[i]
        for v in m.variants:
            par = {**m.job["parallel"], **v}
            par = {k: x for k, x in par.items() if x is not None}
            trial.append(attrs.evolve(m, job={**m.job, "parallel": par}, variants=()))
            owner.append((i, v))
    groups, _ = prepare(trial, predictor)
    arrays = predict_prepared(groups, predictor, n_rows=len(trial))
    for i in todo:
        ks = [k for k, (j, _) in enumerate(owner) if j == i and np.isfinite(arrays["step_s"][k])]
        if not ks:
            continue
        best = min(ks, key=lambda k: arrays["step_s"][k])
        note = f"interleaving not stated: vpp {owner[best][1]['vpp']}, the fastest of {len(ks)} predicted"
        out[i] = attrs.evolve(trial[best], assumptions="; ".join(filter(None, (mapped[i].assumptions, note))))
    return out


def validate(paths: Iterable[str | Path], predictor=None, sources: Iterable[str] | None = None,
             hardware: str | None = None) -> ValidationResult:
    """Map, predict and score every row of the CSV files at `paths`.

    ``sources`` keeps only rows whose source (file stem) or reference contains one of the
    given strings (case-insensitive). ``hardware`` predicts every row on that profile instead
    of the GPU the row names (see :func:`map_rows`).
    """
    from .api import Predictor

    predictor = predictor or Predictor()
    mapped, skipped = map_rows(paths, predictor.registry, hardware)
    if sources:
        mapped = [m for m in mapped if from_sources(m, sources)]
        skipped = [s for s in skipped if from_sources(s, sources)]
    mapped = resolve_unstated(mapped, predictor)
    groups, infeasible = prepare(mapped, predictor)
    skipped = skipped + infeasible
    rows = row_results(mapped, predict_prepared(groups, predictor, n_rows=len(mapped)))
    by_source: dict[str, list[RowResult]] = defaultdict(list)
    for r in rows:
        by_source[r.source].append(r)
    skipped_by: dict[str, list[SkippedRow]] = defaultdict(list)
    for s in skipped:
        skipped_by[s.source].append(s)
    names = list(dict.fromkeys([m.source for m in mapped] + [s.source for s in skipped]))
    summaries = [summarize(n, by_source[n], skipped_by[n]) for n in names]
    return ValidationResult(rows=rows, skipped=skipped, sources=summaries, overall=summarize("overall", rows, skipped))
