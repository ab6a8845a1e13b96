"""FP8 training with Transformer Engine (a cost transform beyond the paper).

**How it relates to ``parallel.precision``.** ``precision = "fp8"`` only tells the operator
provider to price *every* GEMM of the row at the FP8 peak; it changes nothing else. This
feature models the Transformer Engine recipe around it and never double-counts:

- *Time (layer phase).* The layer's GEMMs except the attention core (which stays bf16, as in
  TE's ``DotProductAttention``) are re-priced by the operator provider at ``fp8`` and the
  difference to what the engine priced them at (the row's own precision) is applied to every
  affected layer field::

      Δt_op = t_op(fp8) / efficiency − t_op(row precision)

  so a row that already says ``precision = "fp8"`` gets Δ = 0 from the GEMMs (with
  ``efficiency = 1``) and only the effects below. A GPU without an FP8 entry in
  ``compute.peak_tflops`` is rejected by a constraint. Plus the casts TE adds: each GEMM's
  activation input is quantised in forward (read bf16, write fp8: 3 bytes/element) and its
  output gradient in backward, memory-bound at η_m·BW_hbm. Weight casts happen once per
  step (TE caches the fp8 weights across micro-batches, ``is_first_microbatch``) and are
  neglected. Embedding and LM head stay in the row's precision.
- *Weights (memory phase).* TE keeps the bf16 weights (the optimizer's fp32 master copy is
  unchanged) plus an fp8 copy of each GEMM weight, and on Hopper-style tensor cores (TN
  layout only) an fp8 transposed copy for the backward: ``weights += P_gemm · (1 + 1)`` bytes
  (``transpose_cache = false``: 1 byte). P_gemm: the TP-sharded attention/MLP matrices and the
  local experts, not embeddings or norms.
- *Activations (layer phase, ``fp8_activations``).* TE saves the fp8 cast of a GEMM's input
  for its weight-gradient GEMM instead of the bf16 tensor. With the option on (default), the
  saved GEMM inputs — QKV input, O-projection input, FC1 input, FC2 input, and for MoE the
  dispatched tokens and the expert FC2 input — count 1 byte per element instead of 2.

**Scaling recipe** (``recipe``, Megatron ``--fp8-recipe``). ``delayed`` (Megatron's default:
per-tensor scales from an amax history) and ``tensorwise`` (per-tensor current scaling, "FP8-CS")
cost what is described above. ``mxfp8`` (32-element blocks with E8M0 scales; needs block-scaled
tensor cores, i.e. a profile with an fp4 peak — Blackwell) and ``blockwise`` (1×128 activation and
128×128 weight blocks with fp32 scales, DeepSeek-V3's recipe) scale along the GEMM's reduction
dimension, so the backward GEMMs that use a tensor transposed need a second, column-wise
quantised copy: a cast reads bf16 once and writes both copies, ``2 + 2·(1 + s)`` bytes per element
(``s`` = scale bytes per element: 1/32 for MXFP8, 4/128 for blockwise), and the cached weights are
both orientations (``transpose_cache`` is implied). Every recipe's GEMMs run at the profile's
``fp8_gemm_relative_efficiency`` of the fp8 peak (the roofline applies it to every operator priced
at fp8; B200 fits 0.64), and MXFP8 GEMMs also at the profile's
``mxfp8_gemm_relative_efficiency`` (default 1, fittable by ``mofa calibrate``; Megatron-Bridge
publishes FP8-CS and MXFP8 runs of the same layouts, MXFP8 2–12 % slower, but no shipped profile's
held-out error improves with it — see ``docs/features/memory.md``). Blockwise GEMMs are left at the
fp8 rate (one published row; nothing to fit).

**FP8 primary weights** (``fp8_params``, Megatron ``--fp8-param-gather``; NeMo 2.0's and
Megatron-Bridge's FP8 precision configs set it for the delayed, current-scaling and MXFP8 recipes).
Transformer Engine creates the GEMM weights as FP8 tensors (``fp8_model_init``): the optimizer keeps
its fp32 master copy, and no bf16 copy of those weights is kept (``weights −= 2 · P_gemm`` bytes);
the distributed optimizer all-gathers the updated parameters in FP8, 1 byte per parameter instead of
2 (``distributed_optimizer``'s all-gather, and ``dp_overlap``'s split between its two collectives,
read it). The embedding, the output layer and the norms stay bf16 but are counted at 1 byte in that
all-gather too (a few per cent of its bytes in the smallest models). Megatron-FSDP does not gather
FP8 parameters (NeMo turns it off there): with ``fsdp`` the option is refused.

**torchao's Float8Linear** (torchtitan's ``[quantize.linear.float8]``) differs from Transformer
Engine in three ways the options carry. ``recipe = "rowwise"``: one fp32 scale per row along the
reduction dimension (negligible bytes), so the backward needs the column-wise copy too, and torchao
makes each orientation with its own cast: ``2 · 3`` bytes per element instead of one fused
cast-transpose. Where torchao has published the recipe's speed (``float8_rowwise.toml``: on Hopper,
a compiled LayerNorm → Linear → Sigmoid unit forward and backward, rowwise float8 over bf16, by the
forward's M, K, N) each GEMM instead takes its time at the row's own precision over that measured
speedup, the casts included (none added), on rows whose own precision is the table's bf16::

    t_op = t_op(row precision) / (s(M, K, N) · efficiency)

with ``s`` interpolated in log2 of each size and held at the grid's faces, and a fused MoFa
operator split into the ``nn.Linear`` modules torchao converts (``wq``/``wk``/``wv``, a SwiGLU's
``w1``/``w3``): ``1/s = Σ_i f_i / s(M, K, f_i·N)`` over their shares ``f_i`` of N. Elsewhere the
GEMMs stay at the fp8 rate with the casts above.
``weight_cache = false``: no quantised weight is kept — each GEMM weight (``k·n`` elements) is cast
in every forward and, transposed, in every backward, one orientation each, ``2 + (1 + s)`` bytes per
element per pass, and the weights' memory gains no copy. ``fp8_activations = false``: the bf16
input is saved for the weight gradient; a per-tensor recipe casts it again there, ``3`` bytes per
element in backward (a two-orientation recipe's input cast already counts the column-wise copy).
Those rows' Megatron-LM line is a note: Megatron has no such recipe.
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.batch import PRECISIONS
from mofa_framework.decompose import kv_projections
from mofa_framework.types import Activation, ConstraintResult, CostTransform, option
from mofa_plugins._lowp import REPRICE_BEFORE, needs_format, reprice_gemms, with_weight_copies
from mofa_plugins._rowwise_table import speedup as rowwise_speedup

FP8 = PRECISIONS.index("fp8")
BF16 = PRECISIONS.index("bf16")
#: bytes moved per element by a bf16 → fp8 quantisation kernel
CAST_BYTES = 3.0
#: scaling recipes (Megatron ``--fp8-recipe``) → scale-factor bytes per element of a block-scaled
#: copy (None: per-tensor scales, one fp8 copy per cast)
RECIPES = {"delayed": None, "tensorwise": None, "mxfp8": 1.0 / 32.0, "blockwise": 4.0 / 128.0, "rowwise": 0.0}
#: bytes per element of the bf16 weight copy FP8 primary weights drop
BF16_BYTES = 2.0
#: recipes whose two orientations are quantised by two separate casts (each reads the bf16 tensor
#: and writes one fp8 copy) rather than one fused cast-transpose
SEPARATE_CASTS = ("rowwise",)


@attrs.frozen(kw_only=True)
class Fp8Options:
    efficiency: float = option(1.0, validator=[attrs.validators.gt(0.0), attrs.validators.le(1.0)],
                               doc="fp8 GEMM efficiency relative to the provider's (time = t_fp8 / efficiency)")
    fp8_activations: bool = option(True, doc="save GEMM inputs for backward in fp8 (1 byte) instead of bf16")
    transpose_cache: bool = option(True, doc="keep an fp8 transposed weight copy besides the fp8 weights")
    recipe: str = option("delayed", choices=tuple(RECIPES),
                         doc="scaling recipe (--fp8-recipe): per-tensor delayed or tensorwise (current) scales, "
                             "block-scaled mxfp8 / blockwise (row- and column-wise quantised copies), or "
                             "torchao's rowwise (per-row scales along the reduction dimension)")
    weight_cache: bool = option(True, doc="keep the quantised weights across micro-batches (Transformer Engine); "
                                          "false: each GEMM weight is cast in every forward and again, transposed, in "
                                          "every backward and no copy is kept (torchao's Float8Linear)")
    fp8_params: bool = option(False, doc="GEMM weights kept in FP8 only, no bf16 copy, and all-gathered in FP8 by "
                                         "the distributed optimizer (Megatron --fp8-param-gather)")


def _scale_bytes(rows) -> np.ndarray:
    """Scale-factor bytes per element of a block-scaled copy; NaN for the per-tensor recipes."""
    out = np.full(len(rows.enabled), np.nan)
    for name, s in RECIPES.items():
        if s is not None:
            out = np.where(rows.choice("recipe", name), s, out)
    return out


def layer(state, rows):
    scale = _scale_bytes(rows)
    block = np.isfinite(scale)
    # bf16 (2 B) → fp8 (1 B, plus the column-wise copy's scales when block-scaled)
    saved = np.where(rows.options["fp8_activations"] > 0.5, 1.0 - (1.0 + np.nan_to_num(scale)) / 2.0, 0.0)
    # block-scaled: read bf16 once, write the row- and the column-wise copy with their scales; torchao's
    # rowwise casts each orientation on its own (bf16 read twice)
    cast = np.where(block, 2.0 + 2.0 * (1.0 + np.nan_to_num(scale)), CAST_BYTES)
    separate = np.logical_or.reduce([rows.choice("recipe", r) for r in SEPARATE_CASTS])
    cast = np.where(separate, 2.0 * CAST_BYTES, cast)
    # uncached weights: each pass casts the one orientation its GEMM reads (forward the weight, backward
    # its transpose): bf16 read, fp8 (+ scales) written
    one_orientation = 2.0 + (1.0 + np.nan_to_num(scale))
    weight_cast = np.where(rows.options["weight_cache"] > 0.5, 0.0, one_orientation)
    # a per-tensor recipe's bf16 input saved for the weight gradient is quantised again there; a
    # two-orientation recipe's cast above already counts the column-wise copy the weight gradient reads
    recast = np.where((rows.options["fp8_activations"] > 0.5) | block, 0.0, CAST_BYTES)
    mx = np.where(rows.choice("recipe", "mxfp8"), state.ctx.hardware.efficiency.mxfp8_gemm_relative_efficiency, 1.0)
    measured, tabled = _rowwise_measured(state, rows)
    # torchao's measured rowwise linears include their casts
    cast, weight_cast, recast = (np.where(tabled, 0.0, x) for x in (cast, weight_cast, recast))
    return reprice_gemms(state, FP8, rows.options["efficiency"] * mx, cast, saved, weight_cast_bytes=weight_cast,
                         recast_input_bytes=recast, measured=measured)


def _rowwise_measured(state, rows):
    """(op → the measured rowwise speedup over the row's own precision, NaN elsewhere; the rows it
    prices): torchao's rowwise rows on an architecture with a measured table (``float8_rowwise.toml``)
    whose own precision is the table's baseline, bf16."""
    arch = state.ctx.hardware.compute.architecture
    tabled = (rows.choice("recipe", "rowwise") & (rowwise_speedup(arch, 1024, 1024, 1024) is not None)
              & (np.asarray(state.batch.precision) == BF16))
    if not tabled.any():
        return None, tabled

    def measured(op):
        return np.where(tabled, linear_speedup(arch, state.ctx.model, op), np.nan)
    return measured, tabled


def linear_parts(model, op) -> tuple[float, ...]:
    """The output widths of the separate ``nn.Linear`` modules that make up operator `op`, as fractions
    of its N. torchao converts modules, and the Llama-style models it trains (torchtitan, Hugging Face)
    keep the query, key and value projections apart (``wq``, ``wk``, ``wv``) and a gated MLP's gate and
    up projections apart (``w1``, ``w3``), where MoFa prices each fused: ``qkv_proj`` splits by
    heads (a·d_q with an output gate's a·d_q on the query, kv·d per key and value projection) and a
    SwiGLU ``*_fc1`` into two halves. Anything else is one linear."""
    if op.name == "qkv_proj":
        gated = any(model.block(kind).output_gate for kind in model.block_kinds)
        q = model.num_attention_heads * (2.0 if gated else 1.0)
        kv = [float(model.num_kv_heads)] * int(kv_projections(model))
        total = q + sum(kv)
        return tuple(x / total for x in (q, *kv))
    if op.name.endswith("_fc1") and model.activation is Activation.swiglu:
        return (0.5, 0.5)
    return (1.0,)


def linear_speedup(arch: str, model, op) -> np.ndarray:
    """The measured rowwise speedup of operator `op` over bf16: each of its linears (:func:`linear_parts`)
    at its own N, their bf16 times (∝ N) summed over their float8 times."""
    fp8_time = sum(f / rowwise_speedup(arch, op.m, op.k, f * np.asarray(op.n, float)) for f in linear_parts(model, op))
    return 1.0 / fp8_time


def memory(state, rows):
    scale = _scale_bytes(rows)
    # block-scaled: both orientations always; per-tensor: the transposed copy if cached
    copies = np.where(np.isfinite(scale) | (rows.options["transpose_cache"] > 0.5), 2.0, 1.0)
    copies = np.where(rows.options["weight_cache"] > 0.5, copies, 0.0)  # cast when used, none kept
    # FP8 primary weights: the bf16 copy of each GEMM weight is not kept
    bf16_copy = np.where(rows.options["fp8_params"] > 0.5, BF16_BYTES, 0.0)
    return with_weight_copies(state, (1.0 + np.nan_to_num(scale)) * copies - bf16_copy)


def fp8_param_rows(batch) -> np.ndarray:
    """Rows whose GEMM weights are FP8 tensors (``fp8`` on with ``fp8_params``)."""
    rows = batch.feature("fp8")
    if "fp8_params" not in rows.options:
        return np.zeros(len(batch), bool)
    return np.asarray(rows.enabled, bool) & (np.asarray(rows.options["fp8_params"]) > 0.5)


@hookimpl
def mofa_candidate_constraints(batch, model, hardware):
    yield from needs_format(batch, hardware, "fp8", "fp8", "FP8")
    rows = batch.feature("fp8")
    if rows.enabled.any() and "fp8_params" in rows.options:
        fp8_params = fp8_param_rows(batch)
        torchao = rows.choice("recipe", "rowwise") | (np.asarray(rows.options["weight_cache"]) < 0.5)
        yield ConstraintResult(
            name="fp8_params_needs_te_weights", feasible=~(fp8_params & torchao),
            reason="features.fp8.fp8_params = true needs Transformer Engine's FP8 weights (recipe delayed, "
                   "tensorwise, mxfp8 or blockwise with weight_cache = true): set fp8_params = false")
        yield ConstraintResult(
            name="fp8_params_not_with_fsdp", feasible=~(fp8_params & np.asarray(batch.feature("fsdp").enabled, bool)),
            reason="features.fp8.fp8_params = true with features.fsdp: Megatron-FSDP gathers no FP8 parameters "
                   "(NeMo turns fp8_param_gather off under it): set fp8_params = false")
    if rows.enabled.any() and "fp4" not in hardware.compute.peak_tflops:
        yield ConstraintResult(
            name="fp8_mxfp8_tensor_cores", feasible=~(rows.enabled & rows.choice("recipe", "mxfp8")),
            reason=f"features.fp8.recipe = 'mxfp8' needs block-scaled (MX) tensor cores, which "
                   f"{hardware.name} lacks: use recipe 'tensorwise' or 'delayed'")


def megatron_args(options) -> list[str]:
    o = options if options is not None else Fp8Options()
    if o.recipe == "rowwise" or not o.weight_cache:
        weights = ", weights cast every micro-batch" if not o.weight_cache else ""
        return [f"# fp8 as torchao's Float8Linear ({o.recipe} scaling{weights}): no Megatron-LM recipe does this; "
                "torchtitan's --quantize.linear.float8.recipe_name"]
    return ["--fp8-format", "hybrid", "--fp8-recipe", o.recipe, *(["--fp8-param-gather"] if o.fp8_params else [])]


def from_megatron(args):
    """``--fp8-format`` (hybrid or e4m3) turns it on; ``--fp8-recipe`` is the scaling recipe
    (Megatron's default: delayed); ``--fp8-param-gather`` keeps the weights in FP8 (``fp8_params``)."""
    fmt = args.value("--fp8-format")
    recipe = args.value("--fp8-recipe", "delayed")
    if fmt is None:
        return None
    params = {"fp8_params": True} if args.has("--fp8-param-gather") else {}
    return {"recipe": recipe, **params} if recipe in RECIPES else params


FEATURE = CostTransform(
    name="fp8",
    description="FP8 GEMMs with Transformer Engine: GEMMs at the fp8 peak (attention stays bf16), cast "
                "kernels, fp8 weight (+ transpose) caches, fp8-saved GEMM inputs",
    equation="Δt = Σ_GEMM t(fp8)/η − t(row precision) + casts; M_w += P_gemm·(1+1)",
    megatron_args=megatron_args,
    from_megatron=from_megatron,
    options_type=Fp8Options,
    layer=layer,
    memory=memory,
    gemm_precision="fp8",
    before=REPRICE_BEFORE,
    applies=lambda batch, model, hardware: np.full(len(batch), "fp8" in hardware.compute.peak_tflops),
    tunable=False,  # numerics are the user's choice: `mofa tune --features ...,fp8` searches it
    may_reduce_compute=True,
)


@hookimpl
def mofa_register_cost_transforms():
    return [FEATURE]
