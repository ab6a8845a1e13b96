"""ZeroBubble pipeline schedules (Qi et al. 2023, arXiv 2401.10241; ZB-V: §6 and arXiv 2405.15362).

The backward is split into B (input gradient, on the critical path between stages) and W
(weight gradient, free to move), so W fills the bubbles. On the critical stage, with per
chunk F, B, W and p2p time τ, busy time is ``m·v·(F+B+W)`` and the bubbles are:

- ``zb-h1`` (alias ``zb-1p``, the paper's automatic schedule at 1F1B's memory):
  ``(p−1)(F+B−W)`` — a third of 1F1B's when F = B = W — holding 1F1B's ``min(m, p−j)``
  micro-batches on stage j;
- ``zb-h2`` (alias ``zb-2p``): the handcrafted ``(p−1)·max(F+B−2W, 0)`` at ``m = 2p−1``, zero
  when ``2W ≥ F+B``, and beyond it the paper's automatic schedule (:func:`adaptive_bubble`): one W
  less per further micro-batch, down to the memory floor ``(p−1)·max(B−F, 0)``; it warms up with
  up to ``2(p−j)−1`` forwards on stage j, so the first stage
  holds ``min(m, 2p−1)`` micro-batches — about twice 1F1B's activations. It needs that
  memory headroom: the engine's ``fits_in_memory`` tells. With fewer micro-batches the
  extra warmup forwards run out: the W credit shrinks linearly from 2 (``m ≥ 2p−1``) to
  1 (``m = p``, ZB-H1's bubble);
- ``zb-v`` (vpp = 2, V-shaped placement: stage j holds chunks j and 2p−1−j):
  ``(p−1)·max(F+B−2W, 0)`` with *chunk* times (half of ZB-H2's in stage times) at 1F1B's
  memory: stage j holds ``min(2p, m+j+1, 2m)`` chunks, i.e. ``p`` micro-batches' worth
  once ``m ≥ 2p``, on every stage; same small-m interpolation as ZB-H2.

With unequal stages the ``(p−1)X`` terms become ``Σ_j X_j − X`` over stages (as in 1F1B).
Below m = p there is no steady state for the W credits to fill, and every schedule's time is
floored at the first stage's :func:`critical_path`.
The bubbles of ZB-H2 and ZB-V assume the paper's optimizer post-validation, which lets a
stage start the next step as soon as its own work is done: the step time is the longest
*stage span*, not the makespan of one isolated step. p2p is counted as in 1F1B
(:func:`~mofa_plugins.schedule_1f1b.phase_times`): exposed after each warmup forward and
cooldown backward, and per steady pair as the pipeline phase leaves it; ZB-V moves
twice the p2p traffic of 1F1B (2 chunks).

**Where they run.** The three schedules exist in the sail-sg/zero-bubble-pipeline-parallelism fork
(ZB-H1 also in Megatron-DeepSpeed's pipeline engine), whose ZeroBubble runtime runs Megatron's
legacy GPT model on the local transformer. Each schedule's rule (:func:`fork_feasible`) refuses
what that code base cannot run — Transformer Engine's kernels and FP8, CP, DP overlap, PP 1, the
models and features it lacks, ZB-H2 / ZB-V outside fp16 — so `mofa tune` never recommends a run
nobody can launch (docs/schedules.md, *What the ZeroBubble fork runs*).

``op_order(p, v, m)`` gives each schedule's per-stage op list for
:func:`mofa_framework.simulate.simulate`: ZB-H1 is 1F1B with B and W split and stage j's
W delayed by j; ZB-H2 and ZB-V are found by the paper's greedy heuristic
(:func:`~mofa_framework.simulate.greedy_order`) at unit op times (or given times).
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.batch import ATTENTION_KERNELS, PRECISIONS
from mofa_framework.engine import Inflight, PipelineTimes
from mofa_framework.simulate import greedy_order
from mofa_framework.types import ConstraintResult, PipelineSchedule

from ._attention_kernels import resolve
from .pp_overlap import NO_P2P_OVERLAP, priced_without


def _zb_times(x, n_w, chunks, w_credit, adaptive: bool = False) -> PipelineTimes:
    """Busy, bubble and p2p of a ZeroBubble schedule with `w_credit` W's filling each stage's
    share of the bubble (1: ZB-H1, 2: ZB-H2/ZB-V); `adaptive`: the automatic schedule of ZB-2p
    (:func:`adaptive_bubble`)."""
    work = x.F + x.B + x.W
    total_chunks = x.m * chunks
    busy = total_chunks * work
    fill_f = np.maximum(x.sum_F / chunks - x.F, 0.0)
    fill_b = np.maximum(x.sum_B / chunks - x.B, 0.0)
    fill_w = np.maximum(x.sum_W / chunks - x.W, 0.0)
    bubble = np.maximum(fill_f + fill_b - w_credit * fill_w, 0.0)
    if adaptive:
        bubble = adaptive_bubble(bubble, fill_f, fill_b, x.W, x.m, x.p)
    steady_n = total_chunks - n_w
    pp = 2.0 * n_w * x.p2p_s + steady_n * x.steady_p2p_s
    bubble = np.maximum(bubble, critical_path(x, chunks) - busy - pp)
    bubble_warm = np.minimum(fill_f, bubble)
    warmup = n_w * (x.F + x.p2p_s) + bubble_warm
    steady = steady_n * (work + x.steady_p2p_s)
    cooldown = n_w * (x.B + x.W + x.p2p_s) + (bubble - bubble_warm)
    return PipelineTimes(busy_s=busy, bubble_s=bubble, pp_comm_s=pp, warmup_s=warmup, steady_s=steady,
                         cooldown_s=cooldown)


def critical_path(x, chunks):
    """The least span of a step's first stage. The stage at the end of the route (the last
    chunk) cannot start before micro-batch 0's forward has run down every chunk before it, then
    runs the m forwards and m input-gradient backwards of its chunk, and the last of those runs back
    up every chunk before it, the first stage's W following (a p2p hop between consecutive chunks
    on different stages each way, ``chunks`` = chunks per stage)::

        ΣF + ΣB + (m − 1)·(F + B) + W + 2·(p − 1)·chunks·τ

    Below about m = p the bubble formulas (steady-state W credits) would undercut it."""
    hops = 2.0 * np.maximum(x.p - 1.0, 0.0) * chunks
    return x.sum_F + x.sum_B + (x.m - 1.0) * (x.F + x.B) + x.W + hops * x.p2p_s


def adaptive_bubble(handcrafted, fill_f, fill_b, w, m, p):
    """ZB-2p's bubble as its automatic scheduler leaves it (the paper's §3 heuristic on the profiled
    F, B, W; :func:`~mofa_framework.simulate.greedy_order` with the real times): every micro-batch
    beyond the 2p − 1 of the warmup brings one more W the scheduler can move into the bubble, so the
    handcrafted bubble shrinks by W per micro-batch — down to a floor the memory limit sets: the
    first stage may run only 2p − 1 forwards before micro-batch 0's input gradient has come back up
    the pipeline, ``(p − 1)·(B − F)`` later when B > F (``fill_b − fill_f`` with unequal stages)::

        bubble = max(fill_b − fill_f, handcrafted − W·max(m − (2p − 1), 0))

    Against the simulator over random F, B, W (p 4–32, m up to 8(2p − 1)): mean |error| 0.6 % of the
    busy time, against 3.1 % for the handcrafted form (tests/test_schedules.py)."""
    floor = np.maximum(fill_b - fill_f, 0.0)
    return np.maximum(floor, handcrafted - w * np.maximum(m - (2.0 * p - 1.0), 0.0))


def _credit(x):
    """W credit 1 at m = p rising to 2 at m ≥ 2p−1 (the extra warmup forwards that fill)."""
    return 1.0 + np.clip((x.m - x.p) / np.maximum(x.p - 1.0, 1.0), 0.0, 1.0)


# ------------------------------------------------------------------------------ ZB-H1

def time_h1(x) -> PipelineTimes:
    return _zb_times(x, np.minimum(x.m, x.p - 1.0), 1.0, 1.0)


def inflight_h1(x) -> Inflight:
    return Inflight(first=np.minimum(x.m, x.p), mid=np.minimum(x.m, np.maximum(x.p - 1.0, 1.0)),
                    last=np.minimum(x.m, 1.0))


def op_order_h1(p: int, v: int, m: int) -> list[list[tuple[str, int, int]]]:
    """1F1B's order with B and W split; stage j runs the W of micro-batch i after B of i+j."""
    out = []
    for s in range(p):
        n_w = min(m, p - s - 1)
        ops = [("F", i, 0) for i in range(n_w)]
        w_next = 0
        for i in range(m):
            if n_w + i < m:
                ops.append(("F", n_w + i, 0))
            ops.append(("B", i, 0))
            if i - s >= 0:
                ops.append(("W", i - s, 0))
                w_next = i - s + 1
        ops += [("W", i, 0) for i in range(w_next, m)]
        out.append(ops)
    return out


# ------------------------------------------------------------------------------ ZB-H2

def time_h2(x) -> PipelineTimes:
    return _zb_times(x, np.minimum(x.m, 2.0 * (x.p - 1.0)), 1.0, _credit(x), adaptive=True)


def inflight_h2(x) -> Inflight:
    def stage(j):
        return np.minimum(x.m, np.maximum(2.0 * (x.p - j) - 1.0, 1.0))
    return Inflight(first=stage(0.0), mid=stage(np.minimum(1.0, x.p - 1.0)), last=stage(x.p - 1.0))


def op_order_h2(p: int, v: int, m: int, F=1.0, B=1.0, W=1.0) -> list[list[tuple[str, int, int]]]:
    """Greedy order with stage j holding at most 2(p−j)−1 micro-batches."""
    return greedy_order(p=p, v=1, m=m, limit=lambda s: 2 * (p - s) - 1, F=F, B=B, W=W)


# ------------------------------------------------------------------------------ ZB-V

def v_route(p: int):
    """V-shaped placement: chunk 0 runs down stages 0..p−1, chunk 1 back up p−1..0."""
    hops = [(s, 0) for s in range(p)] + [(s, 1) for s in reversed(range(p))]
    return lambda mb: hops


def time_v(x) -> PipelineTimes:
    return _zb_times(x, np.minimum(x.m * x.v, 2.0 * x.p - 1.0), x.v, _credit(x))


def inflight_v(x) -> Inflight:
    def stage(j):
        return np.minimum(np.minimum(2.0 * x.p, x.m + j + 1.0), 2.0 * x.m) / 2.0
    return Inflight(first=stage(0.0), mid=stage(np.maximum(x.p - 2.0, 0.0)), last=stage(x.p - 1.0))


def op_order_v(p: int, v: int, m: int, F=1.0, B=1.0, W=1.0) -> list[list[tuple[str, int, int]]]:
    """Greedy order on the V route, stage j holding at most 2p chunks (1F1B's memory)."""
    if v != 2:
        raise ValueError("zb-v runs exactly 2 chunks per stage (vpp = 2)")
    return greedy_order(p=p, v=2, m=m, limit=lambda s: 2 * p, route=v_route(p), F=F, B=B, W=W)


FORK = "sail-sg/zero-bubble-pipeline-parallelism fork"
#: how the fork's ZeroBubble runtime must be started (docs/zero-bubble/pipeline_parallel_runtime.md
#: at 39f2c18, 2025-05-07: "the current codebase does not support transformer-engine"; its
#: zero-bubble-v0.1.0 tag of 2024-11 asserts ``--transformer-impl local`` for zero bubble): Megatron's
#: legacy GPT model on the local transformer, whose attention is FlashAttention-2 (``--use-flash-attn``)
#: and whose ``validate_arguments`` (megatron/core/zbpp_utils.py) asserts untied embeddings
FORK_RUNTIME = ("--use-legacy-models --transformer-impl local --enable-zb-runtime --untie-embeddings-and-output-weights "
                "--use-flash-attn")
#: the features the fork runs beside its schedules, and the settings of their options it has (each
#: option's allowed values; an option not listed may take any). Any other feature is refused: the
#: legacy model on the local transformer has no Transformer Engine (FP8 / FP4 GEMMs, TP comm
#: overlap), no context parallelism ("not supported in legacy models"), none of Megatron-Core's
#: later flags (Megatron-FSDP, the CPU optimizer, activation offloading, CUDA graphs, recompute
#: modules, the precision-aware optimizer); and it keeps DP's gradient reduce out of the step
#: (``WeightGradStore.is_supported`` turns the B/W split off with ``--overlap-grad-reduce``, and with
#: the distributed optimizer ``validate_arguments`` asserts both DP overlaps off)
FORK_FEATURES = {
    "distributed_optimizer": {"shard_gradients": (False,), "grad_reduce_dtype": ("fp32",),
                              "exp_avg_dtype": ("fp32",), "exp_avg_sq_dtype": ("fp32",), "main_params_dtype": ("fp32",)},
    "recompute": {"granularity": ("selective", "full"), "moe_act": (False,), "layernorm": (False,),
                  "mla_up_proj": (False,), "mlp": (False,), "moe": (False,), "shared_experts": (False,)},
    "pp_overlap": {},  # the fork's default (--no-overlap-p2p-communication turns it off)
    "eager_kernels": {},
    "fp32_cross_entropy": {},
    "kernel_scaling": {},
}
#: features whose rows run a ZeroBubble schedule in another code base, which the fork's rule leaves
#: to that feature's own rules: DeepSpeed's pipeline engine runs ZB-H1 in Megatron-DeepSpeed
#: (``--enable-zbh1-pipeline``)
OTHER_CODE_BASES = ("deepspeed_zero",)
def _p2p_flag(context) -> str:
    """The fork overlaps the pipeline's sends and receives by default (Megatron-LM's behaviour since
    2023-10): a configuration priced without ``pp_overlap`` turns it off."""
    return f" {NO_P2P_OVERLAP}" if priced_without(context) else ""


def fork_model_reason(model) -> str:
    """Why the fork's legacy GPT model cannot be `model`, with the fix ("" when it can): a plain
    decoder of attention and dense MLP layers with untied embeddings."""
    plain = all(b.mixer == "attention" and b.attention in ("model", "full") and b.ffn == "dense" and not b.output_gate
                for b in model.block_kinds.values())
    other = "use 1f1b or interleaved-1f1b"
    if model.is_moe:
        return f"its legacy GPT model has only Megatron's 2023 Switch MLP (top-1 sinkhorn routing), not the MoE layer " \
               f"MoFa prices: {other}"
    if model.is_mla or model.sliding_window or model.num_mtp_layers or not plain:
        return f"its legacy GPT model is attention + dense MLP only (no MLA, windowed attention, Mamba or MTP " \
               f"layers): {other}"
    if model.tied_embeddings:
        return f"it asserts --untie-embeddings-and-output-weights, and this model ties its embeddings: untie them " \
               f"(the model's tied_embeddings = false), or {other}"
    return ""


def _option_ok(rows, option: str, allowed: tuple) -> np.ndarray:
    """Rows whose `option` takes one of the `allowed` values (a categorical by name, others by value)."""
    if option in rows.choices:
        return np.logical_or.reduce([rows.choice(option, a) for a in allowed])
    try:
        values = np.asarray(rows.options[option], dtype=np.float64)
    except KeyError:  # an option this version of the feature does not have
        return np.ones(len(rows.enabled), bool)
    return np.isin(values, [float(a) for a in allowed])


def _layout_causes(batch, model, hardware, post_validation: bool, v_shape: bool) -> list[tuple[np.ndarray, str]]:
    """(rows, why and fix) the fork cannot run for their model, layout, precision or kernel."""
    n, precision = len(batch), np.asarray(batch.precision)
    kernel = resolve(np.asarray(batch.attention_kernel), hardware.compute.architecture)
    out = [(np.asarray(batch.vpp) != 2, "zb-v runs exactly two chunks per stage (--zero-bubble-v-schedule makes "
                                        "them): set parallel.vpp = 2")] if v_shape else []
    out += [
        (np.full(n, bool(fork_model_reason(model))), fork_model_reason(model)),
        (np.asarray(batch.pp) < 2, "it asserts pipeline parallelism for zero bubble: set parallel.pp ≥ 2, or use 1f1b"),
        (np.asarray(batch.cp) > 1, "its legacy model has no context parallelism: set parallel.cp = 1"),
        (~np.isin(precision, [PRECISIONS.index("bf16"), PRECISIONS.index("fp16")]),
         "FP8 / FP4 GEMMs need Transformer Engine, which it does not run: set parallel.precision = 'bf16' or 'fp16'"),
    ]
    if post_validation:
        out.append((precision != PRECISIONS.index("fp16"),
                    "this schedule's zero bubble needs its optimizer post-validation "
                    "(--enable-optimizer-post-validation), which it asserts only with --fp16: set parallel.precision "
                    "= 'fp16', or use zb-h1"))
    out.append((np.asarray(batch.flash_attention, bool) & (kernel != ATTENTION_KERNELS.index("fa2")),
                "its local transformer's attention is FlashAttention-2 (--use-flash-attn): set "
                "parallel.attention_kernel = 'fa2'"))
    return out


def _feature_causes(batch) -> list[tuple[np.ndarray, str]]:
    """(rows, why and fix) with a feature the fork lacks, or one of its options at a value it lacks."""
    out = []
    for name in sorted(batch.features):
        f = batch.feature(name)
        on = np.asarray(f.enabled, bool)
        if not on.any() or name in OTHER_CODE_BASES:
            continue
        if name not in FORK_FEATURES:
            out.append((on, f"it has no {name}: turn features.{name} off"))
            continue
        out += [(on & ~_option_ok(f, option, allowed),
                 f"it runs features.{name} only with {option} = {' or '.join(map(repr, allowed))}")
                for option, allowed in FORK_FEATURES[name].items()]
    return out


def fork_feasible(post_validation: bool, v_shape: bool = False):
    """The schedule's rule: what the fork runs (:data:`FORK_RUNTIME`) — for ZB-V two chunks per stage
    (``--zero-bubble-v-schedule`` makes them), a pipeline (``validate_arguments`` asserts pp > 1 for
    zero bubble), no context parallelism, GEMMs in bf16 or fp16 (fp16 only where the schedule's
    zero bubble needs the fork's optimizer post-validation, which asserts ``--fp16``),
    FlashAttention-2, the model the legacy GPT code builds (:func:`fork_model_reason`), and only
    :data:`FORK_FEATURES`. Rows with a feature of :data:`OTHER_CODE_BASES` on pass (that code base's
    rules apply). The detail names each refused row's first cause and its fix."""

    def rule(batch, rows, model, hardware):
        causes = _layout_causes(batch, model, hardware, post_validation, v_shape) + _feature_causes(batch)
        elsewhere = np.logical_or.reduce([np.asarray(batch.feature(f).enabled, bool) for f in OTHER_CODE_BASES])
        bad = np.logical_or.reduce([m for m, _ in causes]) & rows & ~elsewhere

        def detail(i: int) -> str:
            return next(f": {why}" for m, why in causes if m[i])

        return ConstraintResult(name="zb_fork", feasible=~bad, detail=detail,
                                reason=f"the ZeroBubble schedules run in the {FORK} (Megatron's legacy GPT model on "
                                       "the local transformer, no Transformer Engine), which cannot run this "
                                       "configuration")
    return rule


#: the fork (Megatron-LM of 2024) has no --decoder-first/last-pipeline-num-layers: it splits the
#: layers evenly, or with ``--allow-padding-num-layers`` pads them to a multiple of pp and takes the
#: k padded layers off chunks -1, 0, 1, … in its chunk order (``get_offset`` in
#: megatron/legacy/model/transformer.py at 39f2c18): the last stage then the first (ZB-H1/H2), or
#: rank 0's two V chunks (ZB-V, whose chunk order runs down the ranks and back up: rank 0 holds
#: the embedding and the loss). The paper's own runs are such splits ("first & last stage hold one
#: fewer layer", ../shared/data/zero_bubble.csv)
END_STAGES_REASON = ("parallel.first_stage_layers / last_stage_layers ({given}): the ZeroBubble schedules run in "
                     f"the {FORK}, which splits the layers evenly or pads them (--allow-padding-num-layers: "
                     "{padded}) and cannot place these end stages: remove them, or use 1f1b / interleaved-1f1b")


def padded_end_stages(num_layers: int, pp, v_shape: bool):
    """(first, last, valid): the end stages the fork places — an even split (k = −L mod pp = 0), or
    what ``--allow-padding-num-layers`` gives where its k padded layers leave the middle stages
    alike (k = 1 or 2): the last stage one layer fewer, then the first too. Under ZB-V the fork
    takes them off rank 0, which holds the embedding and the loss; MoFa prices the head on the
    last stage, so the same sizes stand for it there, and the fork's two equal chunks per stage
    need an even number of layers per stage."""
    pp = np.asarray(pp)
    k = (-num_layers) % np.maximum(pp, 1)
    mid = (num_layers + k) // np.maximum(pp, 1)
    first, last = np.where(k == 2, mid - 1, mid), mid - 1
    first, last = np.where(k == 0, mid, first), np.where(k == 0, mid, last)
    ok = (k <= 2) & (pp >= 2) & (last >= 1)
    return first, last, ok & (mid % 2 == 0) if v_shape else ok


def fork_end_stages(v_shape: bool):
    """The schedules' ``end_stages`` rule: explicit end stages only as the fork's padding places them."""
    def rule(batch, rows, num_layers):
        first, last, ok = padded_end_stages(num_layers, batch.pp, v_shape)
        same = ok & (batch.first_stage_layers == first) & (batch.last_stage_layers == last)
        bad = np.flatnonzero(rows & ~same)
        i = int(bad[0]) if len(bad) else 0
        padded = (f"{first[i]} / {last[i]} on {batch.pp[i]} stages" if ok[i] else
                  f"not with {num_layers} layers on {batch.pp[i]} stages")
        given = f"{batch.first_stage_layers[i]} / {batch.last_stage_layers[i]}"
        return ConstraintResult(name="zb_fork_end_stages", feasible=same,
                                reason=END_STAGES_REASON.format(given=given, padded=padded))
    return rule


def _padding_note(model, parallel, v_shape: bool) -> list[str]:
    """The fork's --allow-padding-num-layers where its split needs it (the layers not a multiple of pp)."""
    L, pp = model.num_layers, parallel["pp"]
    if pp < 2 or L % pp == 0:
        return []
    where = "rank 0's two V chunks, where the embedding and the loss are" if v_shape else \
        "the last stage, then the first"
    return [f"# {FORK}: --allow-padding-num-layers ({L} layers padded to {L + (-L) % pp}; the padding comes "
            f"off {where})"]


def fork_arguments(flags: str):
    """ZB-H1 / ZB-H2 in the sail-sg fork: its runtime's flags and the schedule's (and
    ``--no-overlap-p2p-communication`` where the configuration was priced without PP overlap, the
    fork's default), and the padding that places a split whose layers are not a multiple of pp (no
    layout arguments: the fork has none)."""
    def args(model, parallel, context) -> list[str]:
        return [f"# {FORK}: {FORK_RUNTIME} {flags}{_p2p_flag(context)}", *_padding_note(model, parallel, v_shape=False)]
    return args


def _pending_backward(args) -> float:
    """The fork's ``--zero-bubble-max-pending-backward`` over pp ("auto", its default: the adaptive
    memory limit, taken as ZB-2p's headroom)."""
    text = args.value("--zero-bubble-max-pending-backward", "auto")
    pp = max(int(args.parallel.get("pp", 1)), 1)
    try:
        return float(text) / pp
    except ValueError:
        return 2.0


def from_megatron_h1(args) -> bool:
    """``--enable-zero-bubble`` with at most pp pending backwards (the fork's README: 1 × pp is ZB1P),
    or Megatron-DeepSpeed's ``--enable-zbh1-pipeline`` (ZB-H1 in DeepSpeed's pipeline engine)."""
    deepspeed = args.has("--enable-zbh1-pipeline")
    return deepspeed or (args.has("--enable-zero-bubble") and not args.has("--zero-bubble-v-schedule")
                         and _pending_backward(args) < 2.0)


def from_megatron_h2(args) -> bool:
    """``--enable-zero-bubble`` with 2 × pp pending backwards (ZB2P), or the adaptive default."""
    return (args.has("--enable-zero-bubble") and not args.has("--zero-bubble-v-schedule")
            and _pending_backward(args) >= 2.0)


def megatron_args_v(model, parallel, context) -> list[str]:
    """ZB-V in the sail-sg fork: ``--zero-bubble-v-schedule`` splits every stage into its two V
    chunks itself (no virtual-pipeline arguments); its bubble assumes optimizer post-validation.
    Layers not a multiple of pp need ``--allow-padding-num-layers`` (the padding off rank 0)."""
    return [f"# {FORK}: {FORK_RUNTIME} --zero-bubble-v-schedule --enable-optimizer-post-validation"
            f"{_p2p_flag(context)} (two V-shaped chunks per stage; no virtual-pipeline arguments)",
            *_padding_note(model, parallel, v_shape=True)]


ZB_H1 = PipelineSchedule(
    name="zb-h1", aliases=("zb-1p", "zb1p"),
    description="ZeroBubble ZB-H1: 1F1B with split backward, bubble (p-1)(F+B-W) at 1F1B's memory",
    time=time_h1, inflight=inflight_h1, supports_vpp=False, equation="ZB-H1 (Qi et al. 2023)",
    min_microbatches=lambda p: p, order=op_order_h1, end_stages=fork_end_stages(v_shape=False),
    megatron_args=fork_arguments("--enable-zero-bubble --zero-bubble-max-pending-backward pp"),
    feasible=fork_feasible(post_validation=False),
    from_megatron=from_megatron_h1,
)
ZB_H2 = PipelineSchedule(
    name="zb-h2", aliases=("zb-2p", "zb2p"),
    description="ZeroBubble ZB-H2: bubble (p-1)(F+B-2W)+ with ~2x 1F1B's activations (2p-1 on stage 0)",
    time=time_h2, inflight=inflight_h2, supports_vpp=False, equation="ZB-H2 (Qi et al. 2023)",
    min_microbatches=lambda p: p, order=op_order_h2, end_stages=fork_end_stages(v_shape=False),
    megatron_args=fork_arguments("--enable-zero-bubble --zero-bubble-max-pending-backward 2·pp "
                                 "--enable-optimizer-post-validation"),
    feasible=fork_feasible(post_validation=True),
    from_megatron=from_megatron_h2,
)
ZB_V = PipelineSchedule(
    name="zb-v", aliases=("zbv",),
    description="ZeroBubble ZB-V: V-shaped 2 chunks per stage, bubble (p-1)(F+B-2W)+ per chunk at 1F1B's memory",
    time=time_v, inflight=inflight_v, supports_vpp=True, requires_vpp=True, equation="ZB-V (Qi et al. 2023, §6)",
    min_microbatches=lambda p: p, order=op_order_v, route=lambda p, v, m: v_route(p),
    feasible=fork_feasible(post_validation=True, v_shape=True),
    end_stages=fork_end_stages(v_shape=True), megatron_args=megatron_args_v,
)


def feasible_torch_v(batch, rows):
    """PyTorch's ScheduleZBVZeroBubble: two stages per rank in a V (pp > 1 the core's rule asks)."""
    return ConstraintResult(name="zbv_torch_two_stages", feasible=np.asarray(batch.vpp) == 2,
                            reason="pipeline.schedule zbv-zero-bubble (PyTorch's ScheduleZBVZeroBubble) runs two stages "
                                   "per rank: set parallel.vpp = 2")


#: ZB-V as PyTorch's pipelining runs it (``torch.distributed.pipelining.ScheduleZBVZeroBubble``,
#: torchtitan's ``pipeline_parallel_schedule = "ZBVZeroBubble"``), beside the framework's own
#: features (FSDP2, torchao's float8, SDPA's attention) — none of the sail-sg fork's limits, nor its
#: padding of the end stages. Priced as ZB-V: it has no optimizer post-validation (torchtitan clips
#: gradients by a norm all-reduced over the pipeline ranks before the optimizer steps), so the
#: longest-stage-span step is optimistic by what the fork's README measures for turning
#: post-validation off (~8 %). Left out of ``mofa tune``'s default space (``searched``): a
#: Megatron-LM search would pair it with Megatron's features.
ZBV_TORCH = attrs.evolve(
    ZB_V, name="zbv-zero-bubble", aliases=("zbvzerobubble",),
    description="ZB-V as PyTorch pipelining runs it (ScheduleZBVZeroBubble; torchtitan's ZBVZeroBubble)",
    feasible=feasible_torch_v, megatron_unsupported={}, end_stages=None, searched=False,
    megatron_args=('# not Megatron-LM: PyTorch pipelining\'s ScheduleZBVZeroBubble (torchtitan: [parallelism] '
                   'pipeline_parallel_schedule = "ZBVZeroBubble")',),
)

#: the op-order generator of each schedule, for :func:`mofa_framework.simulate.simulate`
ORDERS = {"zb-h1": op_order_h1, "zb-h2": op_order_h2, "zb-v": op_order_v, "zbv-zero-bubble": op_order_v}
ROUTES = {"zb-v": v_route, "zbv-zero-bubble": v_route}


def op_order(p: int, v: int, m: int, schedule: str = "zb-h1", **durations):
    """The op order of `schedule` (``zb-h1``, ``zb-h2`` or ``zb-v``)."""
    fn = ORDERS[schedule]
    return fn(p, v, m, **durations) if durations else fn(p, v, m)


@hookimpl
def mofa_register_pipeline_schedules():
    return [ZB_H1, ZB_H2, ZB_V, ZBV_TORCH]
