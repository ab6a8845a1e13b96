"""Reader of the dense schema (the ``reader_dense`` plugin).

One row per run with the architecture in columns (``n_layers``, ``hidden``, ``n_heads``, ...), the
layout (``tp``, ``pp``, ``vpp``, ``cp``, ``micro_batch``, ``global_batch``), features in words
(``recompute``, ``sequence_parallel``, ``distributed_optimizer``, ``pp_schedule``) and the measured
or derived iteration time, a throughput or a utilisation (``NOTES-dense-schema.md`` of the shared
set). The files: Narayanan 2021 / Korthikanti 2022 on Selene, ZeroBubble, llm-foundry, torchtitan
and the ``*_dense.csv`` twins of NVIDIA's tables. What it knows, by the ``framework`` column:

- Megatron-LM 2021–22 and Megatron-DeepSpeed ran unfused attention; a run that names DeepSpeed's
  ZeRO stage runs the ``deepspeed_zero`` plugin at that stage (a 2021 ZeRO-3 run with DeepSpeed
  2021's stage-3 defaults, :func:`deepspeed_2021`); DeepSpeed's pipeline engine cannot interleave;
- the ZeroBubble fork: its schedules (1F1B, interleaved, ZB-1p / ZB-2p / ZB-V) with the end stages
  one layer lighter, in fp16 where the precision is not stated (its scripts pass ``--fp16``, and its
  optimizer post-validation, which the ZB-2p and ZB-V runs use, asserts it);
- torchtitan: float8 through torchao (``fp8`` with ``weight_cache`` and ``fp8_activations`` off; its
  "rowwise" recipe as ``rowwise``); FSDP2 under a pipeline keeps parameters gathered and gradients unsharded in fp32
  (the distributed optimizer, ZeRO-1); an FSDP rank with no stated micro-batch runs its whole
  batch at once, a pipeline from before 2025-04-07 splits it into ``pp`` micro-batches, and an
  interleaved one builds two stages per rank; its "selective layer" AC is full recompute of every
  other block (``selective_ac_option = "2"``), its "selective op" the per-op policy;
- PyTorch-FSDP frameworks (llm-foundry / Composer, torchtitan) run eager element-wise kernels
  (``eager_kernels``) unless the row says ``torch.compile`` ran; a ``mixed_precision=PURE`` row
  reduce-scatters its gradients in bf16; FSDP's ``SHARD_GRAD_OP`` is ``fsdp`` without resharding
  after forward;
- Megatron-Core-era frameworks (NeMo, Megatron-Bridge) and MegaScale: their recipe's overlaps;
- the FLOPs convention a ``flops_convention`` text names (Narayanan's eq. 3, model FLOPs with
  attention, 6ND — or any registered convention by name), to turn a TFLOPS or MFU into a time;
- a ``throughput_unit`` that is not a rate ("M tokens per batch") is not read as one.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from mofa_framework import hookimpl
from mofa_framework.measurements import ReadContext
from mofa_framework.types import MappedRow, MeasurementReader, ModelSpec, SkippedRow

from ._frameworks import attention_kernel, loss_features, memory_counter, torch_cp_features, torchtitan_repeats_kv
from ._megatron import (
    MEGATRON_CORE,
    UNEVEN_STAGES_IGNORED,
    UNSTATED_VPP_MIN_RATIO,
    framework_generation,
    megatron_core_recipe,
    precision,
    proxy_layers,
    searched_layout,
    uneven_pipeline,
    vpp_variants,
)

COLUMNS = ("model_name", "n_layers", "hidden", "gpu_type", "n_gpus", "tp", "pp")
ZB_SCHEDULES = {"1F1B": "1f1b", "1F1B-I": "interleaved-1f1b", "ZB-1p": "zb-1p", "ZB-2p": "zb-2p", "ZB-V": "zb-v"}

#: a source's FLOPs convention, recognised from its ``flops_convention`` text
_HFU_EQ3 = re.compile(r"eq\.?\s*3|96\s*\*\s*b", re.I)
_MODEL_FLOPS = re.compile(r"eq\.?\s*7|72\s*\*\s*b|12\s*\*?\s*[·.]?\s*l|attention|model flops|\bmfu\b|palm|chowdhery",
                          re.I)
#: 6·N·D with no attention term (Kaplan / Chinchilla): N the GEMM weights, D the tokens
_SIX_N = re.compile(r"\b6\s*[*·]?\s*n\s*[*·]?\s*d?\b", re.I)
_SCALE = {"k": 1e3, "thousand": 1e3, "m": 1e6, "million": 1e6, "b": 1e9, "billion": 1e9}


def short_reference(text: str) -> str:
    return re.split(r"\s*[(,;]", text.strip(), maxsplit=1)[0] or text.strip()


def throughput_rate(unit: str) -> tuple[str, bool, float] | str | None:
    """What a ``throughput_unit`` measures: (``tokens`` | ``samples``, per GPU?, scale) for a rate
    of tokens or samples; a reason (str) when it counts tokens or samples but is not a rate
    ("M tokens per batch"); None when it is no token or sample count at all (FLOP/s)."""
    u = unit.strip().lower()
    kind = "tokens" if ("token" in u or "wps" in u) else "samples" if ("sample" in u or "seq" in u) else None
    if kind is None:
        return None
    if not re.search(r"/\s*s(ec(ond)?)?\b|\bper\s+s(ec(ond)?)?\b|\bwps\b|\btps\b", u):
        return f"throughput_unit {unit.strip()!r} is not a rate (no per-second)"
    lead = re.match(r"([a-z]+)\b", u)
    scale = _SCALE.get(lead.group(1), 1.0) if lead else 1.0
    return kind, re.search(r"\bgpu\b", u) is not None, scale


def _convention_name(ctx: ReadContext, text: str) -> str | None:
    """The registered convention a ``flops_convention`` text names: by name, else recognised."""
    if text and text.strip().lower() in {*ctx.registry.flops_conventions, *(
            a.lower() for c in ctx.registry.flops_conventions.values() for a in c.aliases)}:
        return ctx.registry.flops_convention(text.strip()).name
    if _HFU_EQ3.search(text):
        return "megatron-2021"
    if _MODEL_FLOPS.search(text):
        return "palm"
    if _SIX_N.search(text):
        return "6nd"
    return None


def target(r: dict, ctx: ReadContext, model: ModelSpec, bf16_peak_tflops: float | None = None
           ) -> tuple[float, str] | str:
    """A dense-schema row's step time and where it came from, or why there is none.

    In order: the measured, then the derived iteration time; else the published throughput
    (tokens or samples per second, per GPU or in all); else the utilisation the source reports,
    through the FLOPs convention its ``flops_convention`` text names: Narayanan's eq. 3 from the
    TFLOPS (it counts the recompute forward), model FLOPs with full attention (Korthikanti eq. 7,
    the 6N + 12·l·h·s of MegaScale / PaLM / torchtitan) or 6·N·D from the MFU or the model TFLOPS.
    An MFU whose peak the row does not state is taken against `bf16_peak_tflops` (the GPU's dense
    BF16 peak, the usual denominator), and the target column says so.
    """
    for col in ("measured_iter_time_s", "derived_iter_time_s"):
        if (t := ctx.number(r, col)) is not None:
            return t, col
    n, gbs, seq = ctx.count(r, "n_gpus"), ctx.count(r, "global_batch"), ctx.count(r, "seq_len")
    value, unit = ctx.number(r, "throughput_value"), ctx.text(r, "throughput_unit")
    rate = throughput_rate(unit) if value else None
    not_rate = rate if isinstance(rate, str) else ""
    if isinstance(rate, tuple):
        kind, per_gpu, scale = rate
        work = gbs * (seq if kind == "tokens" else 1)
        return work / (value * scale * (n if per_gpu else 1)), f"throughput_value ({unit})"
    text = ctx.text(r, "flops_convention")
    conv = _convention_name(ctx, text)
    tflops, peak, mfu = (ctx.number(r, c) for c in ("measured_tflops_per_gpu", "peak_tflops_used", "mfu_pct"))
    peak_note = ""
    if mfu and not peak and bf16_peak_tflops:
        peak, peak_note = bf16_peak_tflops, f", peak {bf16_peak_tflops:g} assumed"
    vocab = ctx.count(r, "vocab", model.vocab_size)
    full = attrs.evolve(model, vocab_size=vocab)
    # a count that includes the recompute forward converts the TFLOPS only (the MFU is model FLOPs)
    counts_recompute = conv is not None and ctx.registry.flops_convention(conv).counts_recompute
    if conv and (tflops or (mfu and peak and not counts_recompute)):
        rate_tflops, col = (tflops, "measured_tflops_per_gpu") if tflops else (mfu / 100.0 * peak, f"mfu_pct{peak_note}")
        flops = ctx.step_flops(conv, full, gbs, seq)
        if isinstance(flops, str):
            return f"only TFLOPS / MFU, and {flops}"
        return flops / (rate_tflops * 1e12 * n), f"{col} ({conv} FLOPs)"
    if tflops or mfu:
        return (f"{not_rate + '; ' if not_rate else ''}only TFLOPS / MFU, under a FLOPs convention MoFa does "
                f"not recognise ({text[:60]!r})")
    return f"{not_rate}, and no TFLOPS or MFU" if not_rate else "no measured or derived iteration time"


def deepspeed_stage(fw: str, dopt: str) -> int | None:
    """The DeepSpeed ZeRO stage a row names ("DeepSpeed ZeRO-3", "Megatron-DeepSpeed, ZeRO stage 1",
    ``--zero-stage 2``), or None for a run that is not DeepSpeed's ZeRO."""
    text = f"{fw} {dopt}".lower()
    if "deepspeed" not in text:
        return None
    m = re.search(r"zero[- _]?(?:stage)?[- _=]*([123])\b", text)
    return int(m.group(1)) if m else None


def _sharding(fw: str, dopt: str, pp: int) -> tuple[bool, bool, bool]:
    """(ZeRO-2-like sharding, full sharding, FSDP kept gathered under a pipeline) of a run that is not
    DeepSpeed's ZeRO, from the framework and the ``distributed_optimizer`` text."""
    # ZeRO-3 / FSDP: the `fsdp` feature; an FSDP that keeps the parameters gathered (Llama 3's:
    # "ZeRO-2-like", sharding optimizer states and gradients) is the distributed optimizer
    zero2 = re.search(r"zero-?2|not reshard|no reshard", dopt) is not None
    gathered = not zero2 and _gathered_under_pipeline(fw, dopt, pp)
    full_shard = not zero2 and not gathered and ("zero-3" in dopt or "fsdp" in dopt or "zero-3" in fw.lower())
    return zero2, full_shard, gathered


def _torchao(fw: str, precision_text: str) -> bool:
    """FP8 through torchao's Float8Linear (torchtitan's float8 converter), not Transformer Engine: no
    quantised weight kept across micro-batches, bf16 inputs saved for the weight gradient (the
    ``fp8`` feature's ``weight_cache`` and ``fp8_activations`` off)."""
    return "torchtitan" in fw.lower() or "torchao" in precision_text.lower()


def _gathered_under_pipeline(fw: str, dopt: str, pp: int) -> bool:
    """torchtitan's FSDP2 under a pipeline: the schedule keeps each stage's parameters gathered
    (``set_reshard_after_backward(False)``, ``reshard_after_forward`` off) and its gradients
    unreduced until the last micro-batch's backward (``set_requires_gradient_sync(False)``), and
    FSDP2 accumulates those unsharded gradients in its reduce dtype (``to_accumulated_grad_if_needed``:
    fp32, torchtitan's ``mixed_precision_reduce``). So one gather and one reduce-scatter per step, a
    full fp32 gradient buffer and sharded optimizer states: the distributed optimizer (ZeRO-1), not
    ZeRO-2 — whose gradient shards would leave out the stage's whole fp32 gradient buffer."""
    return "torchtitan" in fw.lower() and "fsdp" in dopt and pp > 1


def _model_section(r: dict, ctx: ReadContext, name: str) -> tuple[dict, ModelSpec] | str:
    """The job's ``[model]``: the zoo model with what the row states differently, else an inline
    GPT model from the architecture columns."""
    model = ctx.model(name)
    if model is not None:
        # the zoo model, with what the row states differently (MegaScale's "175B" has 128 heads
        # and a 64,000 vocabulary, GPT-3's 96 and 51,200)
        stated = {"num_layers": ctx.count(r, "n_layers"), "hidden_size": ctx.count(r, "hidden"),
                  "num_attention_heads": ctx.count(r, "n_heads"), "num_kv_heads": ctx.count(r, "n_kv_heads"),
                  "vocab_size": ctx.count(r, "vocab")}
        if not model.is_moe:
            stated["ffn_hidden_size"] = ctx.count(r, "ffn_hidden")
        if stated["vocab_size"] and abs(stated["vocab_size"] / model.vocab_size - 1) < 0.025:
            stated["vocab_size"] = None  # the tokenizer's size vs the zoo's padded one (50,257 → 51,200)
        if not stated["num_layers"]:
            proxy = proxy_layers(f"{ctx.text(r, 'notes')} {name}", model.num_layers)
            if proxy == "":
                return "reduced-layer proxy run (notes say so) whose layer count the row does not state"
            stated["num_layers"] = proxy or None
        overrides = {k: v for k, v in stated.items() if v and v != getattr(model, k)}
        try:
            return {"name": model.name, **overrides}, (attrs.evolve(model, **overrides) if overrides else model)
        except ValueError as exc:
            return f"the architecture columns do not describe a model: {exc.args[0] if exc.args else exc}"
    h, L, a = ctx.count(r, "hidden"), ctx.count(r, "n_layers"), ctx.count(r, "n_heads")
    if not (h and L and a):
        return f"unknown model {name!r} and no architecture columns"
    ffn = ctx.count(r, "ffn_hidden", 4 * h)
    section = {"name": "csv-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-"),
               "num_layers": L, "hidden_size": h, "num_attention_heads": a,
               "num_kv_heads": ctx.count(r, "n_kv_heads", a), "ffn_hidden_size": ffn,
               "vocab_size": ctx.count(r, "vocab", 51200), "activation": "gelu" if ffn == 4 * h else "swiglu"}
    if ffn == 4 * h:  # the GPT block (GPT-2/3, Megatron's GPT, MPT): LayerNorm, learned positions
        section.update(normalization="layernorm", position_embedding="learned", tied_embeddings=True)
    try:
        return section, ModelSpec(**section)
    except ValueError as exc:
        return f"the architecture columns do not describe a model: {exc.args[0] if exc.args else exc}"


def _flash(fw: str, notes: str, old_megatron: bool) -> bool:
    # Megatron 2021–22, the ZeroBubble fork and DeepSpeed's GPT runs (Megatron-DeepSpeed) ran unfused
    flash = not (old_megatron or "deepspeed" in fw.lower())
    said = re.search(r"(no|without|unfused|not)?[\s-]*flash[\s-]?att", f"{fw} {notes}", re.I)
    if said:  # what the row says wins
        flash = not said.group(1)
    return flash


def _eager(fw: str, notes: str) -> bool:
    """Whether a PyTorch-FSDP framework (llm-foundry / Composer, torchtitan) ran its element-wise ops
    as eager kernels: unless the row says ``torch.compile`` ran (both frameworks' default is off)."""
    if not re.search(r"pytorch|torchtitan|composer", fw, re.I):
        return False
    text = f"{fw} {notes}".lower()
    if re.search(r"compile\s*(off|=\s*false|disabled)", text):
        return True
    return re.search(r"(torch\.compile|training\.compile)(?!\s+setting not stated)", text) is None


def _fsdp_options(notes: str) -> dict:
    """The gradient reduce-scatter dtype an FSDP row's notes state: Composer's ``mixed_precision=PURE``
    reduces in bf16 (``DEFAULT``, and torchtitan's default ``mixed_precision_reduce``, in fp32)."""
    if re.search(r"mixed_precision\s*=\s*pure|reduce_dtype\s*=\s*(bf16|bfloat16)", notes, re.I):
        return {"grad_reduce_dtype": "bf16"}
    return {}


#: torchtitan's ``activation_checkpoint.selective_ac_option`` default when a row says "selective layer"
#: without the number: ``"2"``, checkpoint every other transformer block (``config_manager.py``)
TORCHTITAN_AC_EVERY = 2


def _recompute(rec: str, fw: str = "", num_layers: int = 0) -> dict | None:
    rec = rec.lower()
    if rec.startswith("full"):
        return {"granularity": "full"}
    if rec.startswith("selective") and "torchtitan" in fw.lower() and re.search(r"\blayer\b", rec):
        # torchtitan's selective *layer* AC wraps every n-th block in a full checkpoint (n = the
        # option's integer, default 2): full recompute of L/n of a stage's L layers, not Megatron's selective
        n = int(m.group(1)) if (m := re.search(r"every\s*(\d+)", rec)) else TORCHTITAN_AC_EVERY
        return {"granularity": "full", "num_layers": max(-(-num_layers // n), 1)} if num_layers else None
    if rec.startswith("selective"):
        # torchtitan's selective AC: per-op unless it says per layer (its Llama 3 configs set
        # selective_ac_option = "op": every other matmul's output saved, the rest re-run)
        if re.search(r"\bop\b|per-op", rec) or ("torchtitan" in fw.lower() and "layer" not in rec):
            return {"granularity": "op"}
        return {"granularity": "selective"}
    return None


def deepspeed_2021(stage: int, source: str) -> dict:
    """DeepSpeed's stage-3 behaviour of a 2021 run (v0.3.13, March 2021, to v0.4.4): gradients all-reduced
    bucket by bucket (``contiguous_gradients`` defaulted to false at stage 3 until v0.4.5); every
    submodule's parameter fetch synchronised the whole device (``torch.cuda.synchronize()`` in
    ``fetch_sub_module``), so the gradient reduction on its side stream hid behind nothing
    (``overlap_comm`` off in effect); and the parameter gathers did not overlap compute either: each
    parameter's all-gather synchronised the device first ("the async version is not async at all",
    DeepSpeed PR #1188, Oct 2021) and an off-by-one in the sub-module trace skipped the prefetches
    (DeepSpeed issue #1069, "significant zero-3 slowdown compared to zero-2", fixed mid-2021):
    ``prefetch_bucket_size = 0``."""
    if stage != 3 or re.search(r"\b2021\b", source) is None:
        return {}
    return {"contiguous_gradients": False, "overlap_comm": "off", "prefetch_bucket_size": 0}


def _cp_form(features: dict, cp: int, text: str) -> None:
    """The context-parallel form a row states: DeepSpeed-Ulysses or ``cp_comm_type a2a`` is the
    all-to-all form (``cp_a2a``); ``all_gather`` (Llama 3's all-gather-based CP) gathers the ring's
    bytes without hiding them (no ``cp_overlap``); otherwise the recipe's ring stands."""
    if cp <= 1:
        return
    t = text.lower()
    if re.search(r"ulysses|cp[-_ ]comm[-_ ]type\W*a2a\b", t):
        features.pop("cp_overlap", None)
        features["cp_a2a"] = {}
    elif re.search(r"cp[-_ ]comm[-_ ]type\W*all[-_]?gather|all[-_ ]gather[- ]based (context|cp)", t):
        features.pop("cp_overlap", None)


#: frameworks whose runs choose a TP (an FSDP or ZeRO-3 run without one has none)
MEGATRON_FAMILY = re.compile(r"megatron|nemo|megascale|ptd-p", re.I)
TORCHTITAN = re.compile(r"torchtitan", re.I)
#: the model chunks a torchtitan rank builds for a looped (interleaved) schedule when the run sets no
#: split points (``generate_split_points``; ``pipeline_parallel_layers_per_stage`` since then)
TORCHTITAN_STAGES_PER_RANK = 2
#: torchtitan split a rank's batch into ``pp`` micro-batches by default (``pipeline_parallel_microbatches``)
#: until pytorch/torchtitan#1073 made the default a micro-batch of one sequence
TORCHTITAN_MICROBATCH_SIZE_SINCE = "2025-04-07"
#: a torchtitan release date as rows give it: "torchtitan 9dec370 (2024-12-26)", "torchtitan (2024-12, …)"
_RELEASE_DATE = re.compile(r"torchtitan\b[^;,]*?\b(\d{4})-(\d{2})(?:-(\d{2}))?", re.I)


def _release(fw: str, notes: str) -> str | None:
    """The torchtitan release date a row gives (``YYYY-MM-DD``; a month alone counts as its first
    day), or None."""
    found = _RELEASE_DATE.search(notes) or _RELEASE_DATE.search(fw)
    return None if found is None else "{}-{}-{}".format(*found.groups("01"))


def _unstated_micro_batch(fw: str, notes: str, full_shard: bool, pp: int, local_batch: int) -> int:
    """The micro-batch a row that does not state one ran: FSDP frameworks (torchtitan, llm-foundry)
    run a rank's whole batch (``local_batch``) at once when there is no pipeline; a torchtitan
    pipeline from before ``TORCHTITAN_MICROBATCH_SIZE_SINCE`` (the release date its notes or
    framework give, ``torchtitan 9dec370 (2024-12-26)``; a month alone counts as its first day)
    splits it into ``pp`` micro-batches; otherwise 1 (Megatron's default, torchtitan's since)."""
    if not local_batch:
        return 1
    if pp == 1:
        return local_batch if full_shard else 1
    release = _release(fw, notes)
    old = release is not None and release < TORCHTITAN_MICROBATCH_SIZE_SINCE
    if TORCHTITAN.search(fw) and old and local_batch % pp == 0:
        return local_batch // pp
    return 1


def map_row(r: dict, ctx: ReadContext) -> MappedRow | SkippedRow:
    ref = short_reference(ctx.text(r, "source"))
    rid = ctx.text(r, "row_id") or str(ctx.index + 1)
    name = ctx.text(r, "model_name")
    fw = ctx.text(r, "framework")
    dopt = ctx.text(r, "distributed_optimizer").lower()
    pp = ctx.count(r, "pp", 1)
    ds_stage = deepspeed_stage(fw, dopt)
    zero2, full_shard, gathered = (False, ds_stage == 3, False) if ds_stage else _sharding(fw, dopt, pp)
    if ds_stage:
        ref += f" (DeepSpeed ZeRO-{ds_stage})"
    skip = lambda reason: SkippedRow(source=ctx.source, reference=ref, row_id=rid, model=name or "?", reason=reason)  # noqa: E731
    if not name:
        return skip("model_name not stated")
    hw = ctx.gpu(ctx.text(r, "gpu_type"))
    if hw is None:
        return skip(f"unknown GPU {ctx.text(r, 'gpu_type')!r}")
    section = _model_section(r, ctx, name)
    if isinstance(section, str):
        return skip(section)
    model_section, spec = section
    n_gpus, gbs, seq = ctx.count(r, "n_gpus"), ctx.count(r, "global_batch"), ctx.count(r, "seq_len")
    missing = [c for c, x in (("n_gpus", n_gpus), ("global_batch", gbs), ("seq_len", seq)) if not x]
    if missing:
        return skip(f"{', '.join(missing)} not stated")
    timed = target(r, ctx, spec, hw.peak_flops_per_s("bf16") / 1e12)
    if isinstance(timed, str):
        return skip(timed)
    measured, tcol = timed
    if not ctx.text(r, "tp") and MEGATRON_FAMILY.search(fw) and not (full_shard or ds_stage):
        return searched_layout(r, ctx, map_row, spec, hw, num_gpus=ctx.count(r, "n_gpus"), cp=ctx.count(r, "cp", 1),
                               gbs=ctx.count(r, "global_batch"), mbs=ctx.count(r, "micro_batch", 1), skip=skip)
    tp = ctx.count(r, "tp", 1)
    vpp, cp = ctx.count(r, "vpp", 1), ctx.count(r, "cp", 1)
    prec, lowp, lowp_options = precision(ctx.text(r, "precision"))
    if "zero-bubble" in fw and lowp is None and "bf16" not in ctx.text(r, "precision").lower():
        # the fork's scripts train in fp16 (examples/pretrain_zero_bubble.sh: --fp16 unless FP32), and its
        # optimizer post-validation, which its ZB-2p / ZB-V runs use, asserts --fp16 (zbpp_utils.py)
        prec = "fp16"
    sched_text = ctx.text(r, "pp_schedule")
    notes = ctx.text(r, "notes")
    old_megatron = any(k in fw for k in ("Megatron-LM (2021", "Megatron-LM (2022", "PTD-P", "zero-bubble"))
    dp = max(n_gpus // (tp * pp * cp), 1)
    mbs = ctx.count(r, "micro_batch")
    if mbs is None:
        mbs = _unstated_micro_batch(fw, notes, full_shard, pp, gbs // dp if gbs % dp == 0 else 0)
    par: dict[str, Any] = {"tp": tp, "pp": pp, "vpp": vpp, "cp": cp, "micro_batch_size": mbs,
                           "global_batch_size": gbs, "sequence_length": seq,
                           "precision": prec, "flash_attention": _flash(fw, notes, old_megatron),
                           "attention_kernel": attention_kernel(fw)}
    sp = ctx.text(r, "sequence_parallel").lower()
    if sp.startswith("y"):
        par["sequence_parallel"] = True
    elif sp.startswith("n") and sp != "n/a":
        par["sequence_parallel"] = False
    job: dict[str, Any] = {"model": model_section, "hardware": {"name": hw.name, "num_gpus": n_gpus},
                           "parallel": par, "features": {}}
    ignore: frozenset[str] = frozenset()
    if "zero-bubble" in fw and sched_text in ZB_SCHEDULES:  # ZeroBubble: end stages hold one layer fewer
        L = spec.num_layers
        ends = (L + 2) // pp - 1 if pp > 2 else L // pp
        par.update(first_stage_layers=ends, last_stage_layers=ends)
        job["pipeline"] = {"schedule": ZB_SCHEDULES[sched_text]}
        ignore = UNEVEN_STAGES_IGNORED
    elif pp > 1 and spec.num_layers % (pp * vpp):
        par.update(uneven_pipeline(spec.num_layers, pp, vpp))
        ignore = UNEVEN_STAGES_IGNORED
    variants: tuple[dict, ...] = ()
    microbatches = gbs // (dp * mbs)
    sched = sched_text.lower()
    says_interleaved = "interleav" in sched and "not stated" not in sched
    says_plain = re.fullmatch(r"\s*1f1b\s*", sched) is not None or "gpipe" in sched
    # DeepSpeed's pipeline engine (Megatron-DeepSpeed: BLOOM, MT-NLG) has no interleaved schedule
    can_interleave = "zero-bubble" not in fw and "deepspeed" not in fw.lower()
    if pp > 1 and not ctx.text(r, "vpp") and says_interleaved and TORCHTITAN.search(fw):
        # torchtitan's looped schedules build two stages per rank unless told otherwise
        par.update(vpp=TORCHTITAN_STAGES_PER_RANK, **uneven_pipeline(spec.num_layers, pp, TORCHTITAN_STAGES_PER_RANK))
        ignore = UNEVEN_STAGES_IGNORED
    elif pp > 1 and not ctx.text(r, "vpp") and can_interleave and (
            says_interleaved or (not says_plain and 0 < microbatches < UNSTATED_VPP_MIN_RATIO * (pp - 1))):
        # the factor is not stated, and the schedule says interleaved, or says nothing while plain
        # 1F1B would idle a fifth of the step or more (a tuned run interleaves): every factor that
        # splits the layers, resolved by `validate.resolve_unstated` to the fastest
        variants = vpp_variants(spec.num_layers, pp, 2 if says_interleaved else 1)
        ignore = UNEVEN_STAGES_IGNORED
    if (rec := _recompute(ctx.text(r, "recompute"), fw, spec.num_layers // pp)) is not None:
        job["features"]["recompute"] = rec
    assumed = ""
    megascale = "megascale" in fw.lower() and "baseline" not in fw.lower()
    if (MEGATRON_CORE.search(fw) or megascale) and not re.match(r"no\b|n$|none", dopt):
        # a Megatron-Core-era run: its recipe, unless the row says otherwise ("DDP (dist. optimizer
        # not stated)" does not); the data-parallel sharding the row states refines it below.
        # MegaScale (arXiv 2402.15627 §3.2) overlaps the same three: the DP gather/reduce-scatter
        # with the first/last micro-batch, PP send/receive, and TP/SP collectives fused with GEMMs
        job["features"].update(megatron_core_recipe(tp, pp, cp, full_shard))
        if megascale:
            # §3.1: attention and MLP side by side (the parallel transformer block): one TP gather and
            # one reduce-scatter per layer
            model_section["parallel_attention_mlp"] = True
            assumed = ("MegaScale: its DP, PP and TP overlaps and its parallel transformer block applied; its "
                       "sliding-window attention and LAMB are not modelled")
    _cp_form(job["features"], cp, f"{fw} {notes}")
    torch_cp = torch_cp_features(fw, cp, repeat_kv=torchtitan_repeats_kv(_release(fw, notes)))
    if torch_cp:  # PyTorch's context_parallel, not Transformer Engine's ring
        job["features"].pop("cp_overlap", None)
        job["features"].update(torch_cp)
    if ds_stage:
        # DeepSpeed's own ZeRO (the `deepspeed_zero` plugin: its buckets, its overlap_comm defaults)
        # replaces Megatron's distributed optimizer and DDP overlap, and runs none of what the plugin
        # conflicts with (Megatron-Core's overlaps, DeepEP, CUDA graphs); its CP is DeepSpeed-Ulysses
        for other in getattr(ctx.registry.features.get("deepspeed_zero"), "conflicts", ()):
            job["features"].pop(other, None)
        if cp > 1:
            job["features"]["cp_a2a"] = {}
        job["features"]["deepspeed_zero"] = {"stage": ds_stage, **deepspeed_2021(ds_stage, ctx.text(r, "source"))}
    elif zero2 and "shard_grad_op" in dopt.replace(" ", "_"):
        # PyTorch FSDP's SHARD_GRAD_OP: each unit gathered in forward and kept to its backward (no
        # second gather), gradients reduce-scattered per unit and micro-batch: fsdp without reshard
        job["features"]["fsdp"] = dict(_fsdp_options(notes), reshard_after_forward=False)
    elif zero2:
        job["features"]["distributed_optimizer"] = {"shard_gradients": True}
    elif gathered:
        job["features"]["distributed_optimizer"] = {}
    elif full_shard:
        job["features"]["fsdp"] = _fsdp_options(notes)
    elif dopt.startswith("y") or "zero-1" in dopt or "distributed" in dopt and not dopt.startswith("ddp"):
        job["features"]["distributed_optimizer"] = {}
    if lowp == "fp8" and _torchao(fw, ctx.text(r, "precision")):
        lowp_options = {**lowp_options, "weight_cache": False, "fp8_activations": False}
    if lowp:
        job["features"][lowp] = lowp_options
    job["features"].update(loss_features(fw, f"{notes} {ctx.text(r, 'source_ref')}"))
    if _eager(fw, notes):
        job["features"]["eager_kernels"] = {}
    if dp > 1 and ("DDP-impl torch" in notes or not old_megatron) and not ds_stage:
        job["features"]["dp_overlap"] = {}  # torch DDP buckets overlap the all-reduce with backward
    if model_section.get("num_layers") and spec.num_layers != ctx.count(r, "n_layers", spec.num_layers):
        assumed = "; ".join(filter(None, (assumed, f"reduced-layer proxy: {spec.num_layers} layers")))
    # Narayanan et al. 2021 Table 2: DeepSpeed's 2021 ZeRO-3 stopped scaling (1,536 GPUs as slow as 768;
    # 11-22 % slower than DeepSpeed 2021's pattern at the profile's ring bandwidth): predicted, never fitted to
    stalled = ds_stage == 3 and re.search(r"\b2021\b", ctx.text(r, "source")) is not None
    if stalled:
        assumed = "; ".join(filter(None, (assumed, "DeepSpeed's 2021 ZeRO-3 runs stopped scaling: not for fitting")))
    return MappedRow(source=ctx.source, reference=ref, row_id=rid, job=job, measured_s=measured, target=tcol,
                     group=(ctx.source, name, hw.name, n_gpus, seq),
                     measured_tflops=ctx.number(r, "measured_tflops_per_gpu"),
                     tflops_convention=ctx.text(r, "flops_convention")[:60],
                     measured_memory_gib=ctx.number(r, "measured_memory_gb", unit_ok=True),
                     memory_counter=memory_counter(fw, notes),
                     ignore_constraints=ignore, notes=notes[:200], variants=variants, assumptions=assumed,
                     fit=not stalled, framework=framework_generation(fw, ctx.text(r, "source")))


READER = MeasurementReader(
    name="dense", description="dense schema: architecture in columns, features in words, iteration time, "
                              "throughput or utilisation (NOTES-dense-schema.md)",
    columns=frozenset(COLUMNS), map_row=map_row, row_id_column="row_id", model_column="model_name",
    sources=("Narayanan et al. 2021", "Korthikanti et al. 2022", "ZeroBubble (Qi et al. 2023)", "llm-foundry",
             "torchtitan", "MegaScale", "NeMo / Megatron-Bridge dense twins"))


@hookimpl
def mofa_register_measurement_readers():
    return [READER]
