"""What Megatron-LM / Megatron-Core and Transformer Engine runs do that their tables leave unsaid.

Shared by the measurement readers (``reader_dense``, ``reader_nvidia``): the performance recipe's
features, how layers split over pipeline stages that do not divide them, the interleaving a tuned
run uses when the source does not state it, and how a precision column maps to MoFa's precision
and low-precision GEMM feature.
"""

from __future__ import annotations

import re

import attrs

from mofa_framework.measurements import layout_variants
from mofa_framework.types import MappedRow

from ._bridge_presets import release_key

#: frameworks whose published runs use Megatron-Core's performance recipes
MEGATRON_CORE = re.compile(r"megatron[- ]core|\bmcore\b|\bnemo\b|megatron-bridge", re.I)

#: (pattern in the framework column, generation label): the first that matches names the row's
#: framework generation (``MappedRow.framework``; leave-one-regime-out cross-validation holds each out)
GENERATIONS = (
    (re.compile(r"deepspeed", re.I), "DeepSpeed ZeRO"),
    (re.compile(r"zero-bubble", re.I), "Megatron-LM 2023 (ZeroBubble fork)"),
    (re.compile(r"Megatron-LM \((2021|2022)|PTD-P"), "Megatron-LM 2021–22"),
    (re.compile(r"torchtitan", re.I), "PyTorch FSDP2 (torchtitan)"),
    (re.compile(r"llm-foundry|composer", re.I), "PyTorch FSDP (llm-foundry)"),
    (re.compile(r"megascale", re.I), "MegaScale"),
)


def framework_generation(framework: str, release: str = "") -> str:
    """The generation label of a run's framework column (and release): Megatron-Core-era stacks
    (NeMo, Megatron-Bridge, Megatron-Core) split at 2025, when NeMo 2.0 and Megatron-Bridge
    replaced NeMo 1's launcher; anything else keeps its framework text."""
    for pattern, label in GENERATIONS:
        if pattern.search(framework):
            return label
    if MEGATRON_CORE.search(framework):
        year = re.search(r"\b20(\d\d)\b|\bNeMo (\d\d)\.\d", f"{framework} {release}")
        before = year is not None and int(year.group(1) or year.group(2)) < 25
        return "Megatron-Core ≤ 2024 (NeMo 1)" if before else "Megatron-Core 2025– (NeMo 2, Megatron-Bridge)"
    return framework.strip()[:60]


#: an unstated interleaving factor is searched when plain 1F1B would run fewer than this many
#: micro-batches per pipeline stage beyond the first (bubble (p − 1)/m above 20 %)
UNSTATED_VPP_MIN_RATIO = 4

#: constraints the engine can safely ignore for a row whose stages the reader laid out itself
UNEVEN_STAGES_IGNORED = frozenset({"pp_splits_layers"})


def megatron_core_recipe(tp: int, pp: int, cp: int, full_shard: bool) -> dict[str, dict]:
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


#: NeMo 2.0's performance scripts (NVIDIA/NeMo ``scripts/performance``) reduce gradients in bf16
#: (``recipe.trainer.plugins.grad_reduce_in_fp32 = False``) in every FP8 run since their 2025-02
#: restructuring (81d94d1501: release 25.02), and in every run from the 25.07 refactor on ("bf16 grads for
#: bf16 jobs", 5cb6e3f4fb); Megatron-Bridge's presets (25.09 on) keep that. Earlier runs, NeMo 1's included,
#: used the fp32 reduction (``bf16_mixed()``'s default)
NEMO2_SCRIPTS_SINCE = (25, 2)
BF16_GRADS_ALL_PRECISIONS_SINCE = (25, 7)
NEMO_OR_BRIDGE = re.compile(r"nemo|megatron-bridge", re.I)


def _nemo2_release(framework: str, release: str) -> tuple[int, int] | None:
    """(year, month) of a NeMo / Megatron-Bridge run from NeMo 2.0's performance scripts on (release
    25.02), else None (another stack, an earlier release, or none stated)."""
    key = release_key(release) if NEMO_OR_BRIDGE.search(framework) else None
    return key if key is not None and key >= NEMO2_SCRIPTS_SINCE else None


def bf16_gradient_reduction(framework: str, release: str, precision_text: str) -> bool:
    """Whether a NeMo / Megatron-Bridge performance run reduced its gradients in bf16: an FP8 / FP4 run
    from release 25.02, any run from 25.07 (see :data:`BF16_GRADS_ALL_PRECISIONS_SINCE`); False for
    every other stack and for a row whose release is not stated."""
    key = _nemo2_release(framework, release)
    low_precision = re.search(r"fp8|fp4|float8", precision_text, re.I) is not None
    return key is not None and (low_precision or key >= BF16_GRADS_ALL_PRECISIONS_SINCE)


def fp8_primary_weights(framework: str, release: str, recipe: str) -> bool:
    """Whether a NeMo / Megatron-Bridge FP8 performance run kept its weights in FP8 (``fp8_param_gather``):
    their precision configs ``bf16_with_fp8_mixed`` (delayed), ``bf16_with_fp8_current_scaling_mixed``
    and ``bf16_with_mxfp8_mixed`` set it, the blockwise (sub-channel) one does not; for runs of NeMo
    2.0's performance scripts (release 25.02 on) and Megatron-Bridge's. The caller leaves Megatron-FSDP
    rows out (NeMo turns it off there)."""
    return recipe != "blockwise" and _nemo2_release(framework, release) is not None


def uneven_pipeline(num_layers: int, pp: int, vpp: int) -> dict[str, int]:
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


def searched_layout(row: dict, ctx, map_row, model, hw, *, num_gpus: int, cp: int, gbs: int, mbs: int,
                    skip, blank: tuple[str, ...] = ()):
    """A row that states no TP (nor, maybe, PP): the reader's own mapping of the row at each layout
    it could have run (:func:`~mofa_framework.measurements.layout_variants`, a stated PP kept; the
    `blank` columns, which a stated TP would have to agree with, emptied), as ``variants`` that
    ``validate.resolve_unstated`` settles to the fastest that fits. MoFa chose the layout, so the
    row is predicted, never fitted. Candidates are uninterleaved (their own unstated-interleaving
    variants are dropped)."""
    pp = int(ctx.count(row, "pp")) if ctx.text(row, "pp") else None
    cands = [map_row({**row, **dict.fromkeys(blank, ""), "tp": str(t), "pp": str(q)}, ctx)
             for t, q in layout_variants(model, hw, num_gpus, cp, gbs, mbs) if pp in (None, q)]
    cands = [m for m in cands if isinstance(m, MappedRow)]
    if not cands:
        return skip(f"{'TP' if pp else 'TP/PP'} not stated, and no layout of {num_gpus} GPUs at CP {cp} divides the "
                    f"global batch {gbs} into at least one micro-batch of {mbs} per pipeline stage")
    keys = set().union(*(m.job["parallel"] for m in cands))  # a key one candidate lacks is removed (None)
    variants = tuple({**{k: m.job["parallel"].get(k) for k in keys}, "features": m.job["features"]} for m in cands)
    first = cands[0]
    return attrs.evolve(first, variants=variants, fit=False,
                        ignore_constraints=frozenset().union(*(m.ignore_constraints for m in cands)),
                        assumptions="; ".join(filter(None, (first.assumptions,
                                                            "the layout is MoFa's choice: not for fitting"))))


def vpp_variants(num_layers: int, pp: int, lowest: int = 1) -> tuple[dict, ...]:
    """``MappedRow.variants`` for an unstated interleaving: every factor from `lowest` that splits
    the layers over ``pp`` stages (evenly, or with the end stages a layer short)."""
    return tuple({"vpp": v, "first_stage_layers": None, "last_stage_layers": None,
                  **uneven_pipeline(num_layers, pp, v)}
                 for v in range(lowest, (num_layers + 2) // pp + 1)
                 if num_layers % (pp * v) == 0 or uneven_pipeline(num_layers, pp, v))


def precision(text: str) -> tuple[str, str | None, dict]:
    """(parallel.precision, the low-precision GEMM feature or None, its options) for a source's
    precision column.

    Transformer Engine runs GEMMs in FP8 / NVFP4 and the attention core and everything else in
    bf16: the ``fp8`` / ``nvfp4`` feature on a bf16 row. The FP8 scaling recipe the column names
    becomes the ``fp8`` feature's ``recipe``: MXFP8 / FP8-MX → ``mxfp8``, FP8-CS (per-tensor current
    scaling) and torchtitan's float8 tensorwise → ``tensorwise``, FP8 blockwise → ``blockwise``, torchao's
    float8 rowwise → ``rowwise``;
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
        if "rowwise" in t:
            return "bf16", "fp8", {"recipe": "rowwise"}
        return "bf16", "fp8", {}
    if "fp16" in t and "bf16" not in t:
        return "fp16", None, {}
    return "bf16", None, {}


#: a note that the run is a reduced-layer proxy of the named model, and the layer count it ran
_PROXY = re.compile(r"proxy|reduced[- ]layer|fewer layers|layers? reduced|truncated to", re.I)
_PROXY_LAYERS = re.compile(r"(\d+)[- ]layers?\b|\blayers?\s*[=:]?\s*(\d+)|num[_-]layers\s*[=:]?\s*(\d+)", re.I)


def proxy_layers(text: str, full_layers: int) -> int | None | str:
    """A reduced-layer proxy run's layer count from a row's notes (or model name): the one layer
    count the text states other than the full model's `full_layers`; ``""`` when the text says the
    run is a proxy but not (unambiguously) how many layers it ran; None when it is not a proxy."""
    if not _PROXY.search(text):
        return None
    counts = {int(next(g for g in m.groups() if g)) for m in _PROXY_LAYERS.finditer(text)} - {full_layers}
    counts = {c for c in counts if 0 < c < full_layers}
    return counts.pop() if len(counts) == 1 else ""
