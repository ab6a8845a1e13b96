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
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.batch import PRECISIONS
from mofa_framework.types import CostTransform, option
from mofa_plugins._lowp import needs_format, reprice_gemms, with_weight_copies

FP8 = PRECISIONS.index("fp8")
#: bytes moved per element by a bf16 → fp8 quantisation kernel
CAST_BYTES = 3.0


@attrs.frozen(kw_only=True)
class Fp8Options:
    efficiency: float = option(1.0, validator=[attrs.validators.gt(0.0), attrs.validators.le(1.0)],
                               doc="fp8 GEMM efficiency relative to the provider's (time = t_fp8 / efficiency)")
    fp8_activations: bool = option(True, doc="save GEMM inputs for backward in fp8 (1 byte) instead of bf16")
    transpose_cache: bool = option(True, doc="keep an fp8 transposed weight copy besides the fp8 weights")


def layer(state, rows):
    saved = np.where(rows.options["fp8_activations"] > 0.5, 0.5, 0.0)  # bf16 (2 B) → fp8 (1 B)
    return reprice_gemms(state, FP8, rows.options["efficiency"], CAST_BYTES, saved)


def memory(state, rows):
    return with_weight_copies(state, 1.0 + np.where(rows.options["transpose_cache"] > 0.5, 1.0, 0.0))


@hookimpl
def mofa_candidate_constraints(batch, model, hardware):
    yield from needs_format(batch, hardware, "fp8", "fp8", "FP8")


def megatron_args(options) -> list[str]:
    return ["--fp8-format", "hybrid"]


FEATURE = CostTransform(
    name="fp8",
    description="FP8 GEMMs with Transformer Engine: GEMMs at the fp8 peak (attention stays bf16), cast "
                "kernels, fp8 weight (+ transpose) caches, fp8-saved GEMM inputs",
    equation="Δt = Σ_GEMM t(fp8)/η − t(row precision) + casts; M_w += P_gemm·(1+1)",
    megatron_args=megatron_args,
    options_type=Fp8Options,
    layer=layer,
    memory=memory,
    before=("kernel_scaling", "recompute", "memfine", "activation_offload", "tp_overlap", "cp_overlap",
            "ep_overlap"),
    applies=lambda batch, model, hardware: np.full(len(batch), "fp8" in hardware.compute.peak_tflops),
    tunable=False,  # numerics are the user's choice: `mofa tune --features ...,fp8` searches it
    may_reduce_compute=True,
)


@hookimpl
def mofa_register_cost_transforms():
    return [FEATURE]
