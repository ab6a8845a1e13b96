"""Reader of the NVIDIA schema (the ``reader_nvidia`` plugin).

Model by name (a zoo model), parallel sizes ``tp, pp, cp, vp, ep, etp, dp``, ``gbs``, ``mbs``,
``seq_len``, and ``step_time_s`` or ``step_time_s_derived`` (= gbs·seq_len / tokens/s in all);
``notes`` carry what the run turned on. The files: Megatron-Bridge performance summaries
(``nvidia_megatron_bridge.csv``), NeMo 24.07 and long-context tables, the Megatron-Core MoE model
zoo (``megatron_core_moe.csv``) and torchtitan's tables. What it knows:

- Megatron-Core's performance recipe (distributed optimizer or Megatron-FSDP, overlapped gradient
  reduce and parameter gather, TP / PP / CP comm overlap), Transformer Engine's precisions;
- the features the Megatron-Core model zoo's notes state (``recompute=full``,
  ``recompute=norm, act``, ``+1f1b overlap``, the dispatcher), Megatron-Bridge's presets
  (``_bridge_presets``) and its MoE recipes' expert TP of 1;
- pipeline layouts: one the notes state ("PP layout Et|(tt|)*30L") and Megatron-Bridge's DeepSeek-V3
  and Kimi-K2 layouts (``bridge_layout``: the last stage light, holding the MTP module and the loss),
  as ``parallel.pipeline_layout``;
- TFLOPS-only rows: NeMo's tables under NeMo's FLOPs formula, Megatron-Core's under
  Megatron-LM's count (the ``flops_conventions`` plugin);
- reduced-layer proxy runs: the layer count their notes state, as a ``[model] num_layers`` override;
- fine-tuning rows: SFT priced as pretraining of the same layout (NVIDIA packs SFT sequences to the
  stated length), LoRA with the ``lora`` feature at NVIDIA's recipe (rank 32 on the QKV projection);
- rows the source flags as a known performance regression are listed, not predicted.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from mofa_framework import hookimpl
from mofa_framework.measurements import ReadContext
from mofa_framework.types import MappedRow, MeasurementReader, SkippedRow

from ._bridge_presets import GUIDE_STEPS, PRESETS, bridge_layout, guide_features
from ._frameworks import attention_kernel, loss_features, memory_counter
from ._megatron import (
    UNEVEN_STAGES_IGNORED,
    UNSTATED_VPP_MIN_RATIO,
    bf16_gradient_reduction,
    fp8_primary_weights,
    framework_generation,
    megatron_core_recipe,
    precision,
    proxy_layers,
    searched_layout,
    uneven_pipeline,
    vpp_variants,
)

COLUMNS = ("source_id", "model", "gpu_type", "num_gpus", "gbs", "seq_len", "tp", "pp")

#: words the Megatron-Core MoE model zoo's notes use for --recompute-modules
NOTE_MODULES = {"norm": "layernorm", "layernorm": "layernorm", "act": "moe_act", "moe_act": "moe_act",
                "shared_expert": "shared_experts", "shared_experts": "shared_experts", "up_proj": "mla_up_proj",
                "mla_up_proj": "mla_up_proj", "mlp": "mlp", "moe": "moe", "core_attn": "core_attn"}


def flops_convention(framework: str, model) -> str | None:
    """The FLOPs count a framework's TFLOPS column uses, or None where MoFa does not know it.

    NeMo's tables use NeMo's ``flops_formulas``; the Megatron-Core model zoo Megatron-LM's
    ``num_floating_point_operations``, and so does Megatron-Bridge: its rows that publish both
    tokens/s and TFLOPS agree with that count to 0.1 % (median) for Llama 3, Qwen3, DeepSeek-V3 and
    Kimi-K2, but not for GPT-OSS (26 % fewer FLOPs: its sliding-window layers are counted otherwise),
    so a windowed model gets none (``tests/test_flops_conventions.py``).
    """
    fw = framework.lower()
    if "nemo" in fw and "bridge" not in fw:
        return "nemo"
    if re.search(r"megatron[- ]core|\bmcore\b|megatron-bridge", fw) and not model.sliding_window:
        return "megatron-core"
    return None


def _note_features(notes: str, model, ep: int) -> dict[str, dict]:
    """Features the notes state: recompute (full or modules), 1F1B EP overlap, the dispatcher."""
    feats: dict[str, dict] = {}
    nlow = notes.lower()
    if re.search(r"recompute\s*=\s*full", nlow):
        feats["recompute"] = {"granularity": "full"}
    else:
        # "recompute=norm, act[, shared_expert]": Megatron-Core --recompute-modules
        listed = re.search(r"recompute\s*=\s*([a-z_ ,]*)", nlow)
        mods = {NOTE_MODULES[w.strip()] for w in (listed.group(1).split(",") if listed else ())
                if w.strip() in NOTE_MODULES}
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
    return feats


def _guide_step_features(notes: str) -> dict[str, dict]:
    """A Megatron-Core MoE model-zoo row that is a step of the DeepSeek-V3 GB200 guide's history
    ("optimization step: <name>"): the recompute modules and CUDA graphs the guide gives for it. The
    step is the row's name in the guide's table; the two "CPU-side optimization" steps are told apart
    by the dispatcher the row states (DeepEP before, HybridEP after the shared experts' capture)."""
    m = re.search(r"optimi[sz]ation step:\s*([^;]+)", notes, re.I)
    if not m:
        return {}
    name = m.group(1).strip().lower()
    known = [i for i, s in enumerate(GUIDE_STEPS) if name.startswith(s)]
    if not known:
        return {}
    # the longest name that fits ("cuda graphs capture shared expert", not "cuda graphs"); of the two
    # "cpu-side optimization" steps, the one after the switch to HybridEP when the row says HybridEP
    longest = max(len(GUIDE_STEPS[i]) for i in known)
    known = [i for i in known if len(GUIDE_STEPS[i]) == longest]
    return guide_features(known[-1] if "hybridep" in notes.lower() else known[0])


#: NVIDIA's published LoRA runs adapt the fused QKV projection at rank 32: NeMo 1's
#: ``peft.lora_tuning`` (``target_modules: [attention_qkv]``, ``adapter_dim: 32``) and
#: Megatron-Bridge's performance scripts (``cfg.peft.target_modules = ["linear_qkv"]`` over
#: ``LoRA(dim=32)``, scripts/performance/configs/llama/llama3_llm_finetune.py)
NVIDIA_LORA = {"rank": 32, "targets": "qkv"}
#: NVIDIA's fine-tuning runs (SFT and LoRA) train on SQuAD packed to the sequence length with
#: per-document attention (NeMo's packed-sequence SFT; Megatron-Bridge ``default_squad_config(...,
#: packed_sequence=True)``, THD ``cu_seqlens``). A SQuAD v1.1 example is ≈ 210 tokens: the training
#: split is 79.3 MB for 87,599 examples (the dataset card), ≈ 906 bytes each, of which ≈ 850 are the
#: context, question and answer text at ≈ 4.2 bytes per Llama token (≈ 200 tokens), plus NeMo's prompt
#: template and the BOS/EOS tokens
NVIDIA_FINETUNE_DOCUMENT_LENGTH = 210


def fine_tuning(task: str) -> str | None:
    """The row's task: ``pretrain`` (also when not stated), ``sft`` (full-parameter fine-tuning,
    priced as pretraining of the same layout: NVIDIA's SFT rows pack sequences to the stated length),
    ``lora``, or None for another (unsupported) task."""
    t = re.sub(r"[^a-z]", "", task.lower())
    if not t or "pretrain" in t:
        return "pretrain"
    if "lora" in t or "peft" in t:  # "LoRA", "PEFT (LoRA)": NVIDIA's parameter-efficient runs are LoRA
        return "lora"
    if "sft" in t or "finetun" in t:  # "SFT", "Fine-tuning", "full fine-tune"
        return "sft"
    return None


def _target(r: dict, ctx: ReadContext, model, fw: str, num_gpus: int, gbs, seq) -> tuple[float, str] | str:
    """The measured or derived step time, else one from the throughput (tokens/s per GPU or in total:
    exact, the global batch's tokens over the rate), else from the TFLOPS under the framework's
    convention."""
    for col in ("step_time_s", "step_time_s_derived"):
        if (t := ctx.number(r, col)) is not None:
            return t, col
    per_gpu, total = ctx.number(r, "tokens_per_sec_per_gpu"), ctx.number(r, "total_tokens_per_sec")
    if gbs and seq and (per_gpu or total):
        return (gbs * seq / (per_gpu * num_gpus), "tokens_per_sec_per_gpu") if per_gpu else (
            gbs * seq / total, "total_tokens_per_sec")
    tflops = ctx.number(r, "model_tflops_per_gpu")
    conv = flops_convention(fw, model)
    if tflops and conv:
        if not (gbs and seq):  # a step's FLOPs do not depend on the layout, which may be unstated
            return "only model TFLOPS, and the run's global batch or sequence length is not stated"
        flops = ctx.step_flops(conv, model, gbs, seq)
        if isinstance(flops, str):
            return f"only model TFLOPS, and {flops}, so no step time can be derived"
        return flops / (tflops * 1e12 * num_gpus), f"model_tflops_per_gpu ({conv} FLOPs)"
    if not seq and (ctx.number(r, "tokens_per_sec_per_gpu") or ctx.number(r, "total_tokens_per_sec")):
        return "tokens/s only, and no sequence length stated, so no step time"
    if not gbs and (ctx.number(r, "tokens_per_sec_per_gpu") or ctx.number(r, "total_tokens_per_sec")):
        return "tokens/s only, and no global batch stated, so no step time"
    if tflops:
        return ("only model TFLOPS, under a FLOPs convention MoFa does not implement for this source "
                f"({fw or 'framework not stated'}), so no step time can be derived")
    return "no step time, throughput or TFLOPS stated"


def map_row(r: dict, ctx: ReadContext) -> MappedRow | SkippedRow:
    fw = ctx.text(r, "framework")
    ref = f"{fw} {ctx.text(r, 'release')}".strip()
    rid = ctx.text(r, "source_id")
    name = ctx.text(r, "model")
    skip = lambda reason: SkippedRow(source=ctx.source, reference=ref, row_id=rid, model=name, reason=reason)  # noqa: E731
    notes = ctx.text(r, "notes")
    low = (notes + " " + name).lower()
    if "performance regression" in low and "known issue" in low:
        return skip("the source flags this measurement as a known performance regression (a software bug, "
                    "fixed in a later release), not the hardware's speed")
    task = fine_tuning(ctx.text(r, "task"))
    if task is None:
        return skip(f"task {ctx.text(r, 'task')!r} is neither pretraining nor SFT / LoRA fine-tuning")
    fsdp = ctx.text(r, "fsdp").lower()
    # Megatron-FSDP (optim_grads_params) / torchtitan FSDP2: the `fsdp` feature
    full_shard = fsdp not in ("", "0", "off", "no", "n") or "torchtitan" in fw.lower()
    model = ctx.model(name)
    if model is None:
        return skip(f"unknown model {name!r} (not in the model zoo)")
    model_section: dict[str, Any] = {"name": model.name}
    proxy = proxy_layers(f"{notes} {name}", model.num_layers)
    if proxy == "":
        return skip("reduced-layer proxy run (notes say so) whose layer count the row does not state")
    if proxy:
        try:
            model = attrs.evolve(model, num_layers=proxy)
        except ValueError as exc:
            return skip(f"reduced-layer proxy run of {proxy} layers: {exc.args[0] if exc.args else exc}")
        model_section["num_layers"] = proxy
    if not ctx.text(r, "gpu_type"):
        return skip("gpu_type not stated")
    hw = ctx.gpu(ctx.text(r, "gpu_type"))
    if hw is None:
        return skip(f"unknown GPU {ctx.text(r, 'gpu_type')!r}")
    num_gpus = ctx.count(r, "num_gpus")
    tp, pp, cp = ctx.count(r, "tp", 1), ctx.count(r, "pp", 1), ctx.count(r, "cp", 1)
    gbs, seq = ctx.count(r, "gbs"), ctx.count(r, "seq_len")
    stated_dp = ctx.count(r, "dp")
    if not num_gpus:
        return skip("num_gpus not stated")
    layout_note = ""
    measured_col = ctx.number(r, "step_time_s") or ctx.number(r, "step_time_s_derived")
    if measured_col is None and ctx.text(r, "tp") and stated_dp and tp * pp * cp * stated_dp != num_gpus:
        # NeMo's B200 long-sequence table: its TP·PP·CP·DP is a quarter of its GPU count. The stated
        # layout is used; the per-GPU TFLOPS, hence the error, do not depend on which one is wrong
        layout_note = (f"stated layout tp·pp·cp·dp = {tp * pp * cp * stated_dp} GPUs, not the {num_gpus} "
                       "listed: predicted on the stated layout")
        num_gpus = tp * pp * cp * stated_dp
    timed = _target(r, ctx, model, fw, num_gpus, gbs, seq)
    if isinstance(timed, str):
        return skip(timed)
    if task != "pretrain" and timed[1] == "model_tflops_per_gpu":
        return skip(f"{task.upper()} row with only model TFLOPS: NVIDIA counts fine-tuning FLOPs over the packed "
                    "documents (and LoRA without weight gradients), not the pretraining convention MoFa derives "
                    "step times with")
    measured, target = timed
    if not ctx.text(r, "precision"):
        return skip("precision not given")
    vpp, ep = ctx.count(r, "vp", 1), ctx.count(r, "ep", 1)
    etp = ctx.count(r, "etp", 0, minimum=0)
    mbs = ctx.count(r, "mbs", 1)
    if not (gbs and seq):
        return skip("gbs or seq_len missing")
    if not ctx.text(r, "tp"):
        # no TP stated (NeMo's long-sequence tables: "the most performant model- and data-parallel
        # config without CP", "TP/PP not stated"): the layout a tuned run would use, a stated PP kept;
        # a stated DP belongs to the unstated layout
        return searched_layout(r, ctx, map_row, model, hw, num_gpus=num_gpus, cp=cp, gbs=gbs, mbs=mbs, skip=skip,
                               blank=("dp",))
    if not etp and model.is_moe and ep > 1:
        # ETP not stated: Megatron-Bridge's MoE recipes and the Megatron-Core MoE model zoo set
        # --expert-tensor-parallel-size 1 (every model-zoo row that states it says 1), and where
        # Megatron-Core's default (= tp) cannot fold with the EP size the run must have
        etp = 1
    prec, lowp, lowp_options = precision(ctx.text(r, "precision"))
    par = {"tp": tp, "pp": pp, "vpp": vpp, "cp": cp, "ep": ep, "etp": etp, "micro_batch_size": mbs,
           "global_batch_size": gbs, "sequence_length": seq, "precision": prec,
           "attention_kernel": attention_kernel(fw, ctx.text(r, "release"))}
    ignore: frozenset[str] = frozenset()
    L = model.num_layers
    if pp > 1 and L % (pp * vpp):
        par.update(uneven_pipeline(L, pp, vpp))
        ignore = UNEVEN_STAGES_IGNORED
    variants: tuple[dict, ...] = ()
    dp = num_gpus // (tp * pp * cp)
    if (pp > 1 and ctx.text(r, "vp").lower() in ("", "n/a") and dp
            and 0 < gbs // (dp * mbs) < UNSTATED_VPP_MIN_RATIO * (pp - 1)):
        # the interleaving is not given and plain 1F1B would idle a fifth of the step or more: the
        # dense schema's rule (a tuned run interleaves), resolved by `validate.resolve_unstated`
        variants = vpp_variants(L, pp)
        ignore = UNEVEN_STAGES_IGNORED
    layout, layout_source = _pipeline_layout(notes, ctx.source, model, pp, vpp)
    layout_assumed = ""
    if layout and not variants:
        par["pipeline_layout"] = layout
        ignore = frozenset()
        if layout_source:
            layout_assumed = f"pipeline layout {layout} from {layout_source}"
    feats = megatron_core_recipe(tp, pp, cp, full_shard)
    if bf16_gradient_reduction(fw, ctx.text(r, "release"), ctx.text(r, "precision")):
        shard = "fsdp" if full_shard else "distributed_optimizer"
        feats[shard] = {**feats[shard], "grad_reduce_dtype": "bf16"}
    if lowp:
        feats[lowp] = dict(lowp_options)
    if lowp == "fp8" and not full_shard and fp8_primary_weights(fw, ctx.text(r, "release"),
                                                                lowp_options.get("recipe", "delayed")):
        feats["fp8"]["fp8_params"] = True
    feats.update(_note_features(notes, model, ep))
    feats.update(_guide_step_features(notes))
    feats.update(loss_features(fw, f"{notes} {ctx.text(r, 'release')} {ctx.text(r, 'source')}"))
    if task == "lora":
        feats["lora"] = dict(NVIDIA_LORA)
    if task in ("sft", "lora"):
        par["document_length"] = NVIDIA_FINETUNE_DOCUMENT_LENGTH
    layout = {"tp": tp, "pp": pp, "vpp": vpp, "cp": cp, "ep": ep, "mbs": mbs, "gbs": gbs, "fsdp": full_shard}
    unmodelled = ""
    for recipe in PRESETS:
        if recipe.matches(model.name, hw.name, ctx.text(r, "precision"), layout, ctx.text(r, "release"),
                          ctx.text(r, "source")):
            feats.update({k: dict(v) for k, v in recipe.features.items()})
            unmodelled = unmodelled or recipe.unmodelled
    job = {"model": model_section, "hardware": {"name": hw.name, "num_gpus": num_gpus}, "parallel": par,
           "features": feats}
    # a step of the source's optimisation history (Megatron-Core's DeepSeek-V3 on GB200: 13 steps of one
    # configuration, 494 -> 970 TFLOPS) measures its software's progress: predicted, never fitted to
    history = re.search(r"optimi[sz]ation step", notes, re.I) is not None
    assumed = "; ".join(filter(None, (layout_note, layout_assumed,
                                      f"reduced-layer proxy: {proxy} layers" if proxy else "",
                                      "a step of the source's optimisation history: not for fitting" if history
                                      else "",
                                      f"ran {unmodelled}, which MoFa does not price: not for fitting"
                                      if unmodelled else "")))
    group = (ctx.source, model.name, hw.name, num_gpus, seq, ctx.text(r, "precision"), task)
    return MappedRow(source=ctx.source, reference=ref, row_id=rid, job=job, measured_s=measured, target=target,
                     group=group, measured_tflops=ctx.number(r, "model_tflops_per_gpu"),
                     tflops_convention="model FLOPs (NVIDIA)", measured_memory_gib=ctx.number(r, "peak_mem_gib"),
                     memory_counter=memory_counter(fw, notes),
                     notes=notes[:200], assumptions=assumed, ignore_constraints=ignore, variants=variants,
                     fit=not (history or unmodelled), framework=framework_generation(fw, ctx.text(r, "release")))


def _pipeline_layout(notes: str, source: str, model, pp: int, vpp: int) -> tuple[str, str]:
    """The row's ``--pipeline-model-parallel-layout`` and where it comes from ("" when its notes state
    it, "PP layout Et|(tt|)*30L"), else, for Megatron-Bridge's DeepSeek-V3 and Kimi-K2 runs, the one
    its recipes set (:func:`bridge_layout`)."""
    stated = re.search(r"PP layout\s+([EtmL|()*\d,]+)", notes)
    if stated:
        return stated.group(1).rstrip(","), ""
    if source == "nvidia_megatron_bridge" and pp > 1:
        return bridge_layout(model.name, pp, vpp, model.num_mtp_layers)
    return "", ""


READER = MeasurementReader(
    name="nvidia", description="NVIDIA schema: model by name, parallel sizes, step_time_s or step_time_s_derived "
                               "(Megatron-Bridge, NeMo, the Megatron-Core MoE model zoo, torchtitan tables)",
    columns=frozenset(COLUMNS), map_row=map_row, row_id_column="source_id", model_column="model",
    sources=("NVIDIA-NeMo/Megatron-Bridge performance summaries", "NeMo 24.07 performance tables",
             "Megatron-Core MoE model zoo", "torchtitan"))


@hookimpl
def mofa_register_measurement_readers():
    return [READER]
