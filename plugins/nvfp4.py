"""NVFP4 training with Transformer Engine (a cost transform beyond the paper).

NVIDIA's recipe (arXiv 2509.25149; TE's ``NVFP4BlockScaling``, Megatron ``--fp4-format e2m1
--fp4-recipe nvfp4``): the linear layers' GEMMs — forward, data-gradient and weight-gradient —
run on the FP4 tensor cores with 16-element blocks scaled by E4M3 factors (plus one FP32 scale per
tensor); attention, norms, embedding and LM head stay bf16, and the last layers of the network may
stay bf16 entirely (``--num-layers-at-end-in-bf16``; the paper keeps ≈ 15 %).

- *Time (layer phase).* As ``fp8`` (``plugins/_lowp.py``): the GEMMs except the attention core are
  re-priced by the operator provider at ``fp4`` (whose rate carries the profile's
  ``fp4_gemm_relative_efficiency``), ``Δt = t(fp4)/efficiency − t(row precision)``, plus the
  quantisation casts: a GEMM input is read in bf16 once for its amax (NVFP4's per-tensor FP32
  scale is the tensor's current amax; Transformer Engine has no delayed NVFP4 scaling), then read
  again and written twice in NVFP4, row- and column-wise (the weight-gradient GEMM needs the
  transposed blocks; its inputs also get the 16×16 random Hadamard transform, fused into the same
  kernel), ``2 + 2 + 2·(0.5 + 1/16) = 5.125`` bytes per element in forward and again for the
  output gradient in backward. Weight casts
  happen once per step and are neglected. The bf16 layers at the end are left as they are: every
  effect is scaled by the quantised share ``1 − bf16_layers_at_end / num_layers`` of the layers
  (**choice**: spread evenly over the stages; in a pipeline they sit on the last one).
- *Weights (memory phase).* Row- and column-wise NVFP4 copies of each GEMM weight besides the
  bf16 one: ``2·(0.5 + 1/16) = 1.125`` bytes per GEMM parameter (quantised share).
- *Activations.* The column-wise NVFP4 copy (0.5625 bytes per element) of a GEMM's input is saved
  for its weight gradient instead of the bf16 tensor.

Rows need an ``fp4`` entry in the profile's ``compute.peak_tflops``; ``fp8`` and ``nvfp4`` are
exclusive.
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.batch import PRECISIONS
from mofa_framework.limits import MAX_LAYERS, between
from mofa_framework.types import ConstraintResult, CostTransform, option
from mofa_plugins._lowp import REPRICE_BEFORE, needs_format, reprice_gemms, with_weight_copies

FP4 = PRECISIONS.index("fp4")
#: bytes per element of an NVFP4 block: 4 bits plus one E4M3 scale per 16 elements
NVFP4_BYTES = 0.5 + 1.0 / 16.0
#: quantisation per GEMM input: read bf16 for the amax, read it again, write row- and column-wise NVFP4
CAST_BYTES = 2.0 + 2.0 + 2.0 * NVFP4_BYTES
#: share of a saved bf16 GEMM input's bytes the column-wise NVFP4 copy saves
SAVED_FRACTION = 1.0 - NVFP4_BYTES / 2.0


@attrs.frozen(kw_only=True)
class Nvfp4Options:
    efficiency: float = option(1.0, validator=[attrs.validators.gt(0.0), attrs.validators.le(1.0)],
                               doc="NVFP4 GEMM efficiency relative to the provider's (time = t_fp4 / efficiency)")
    bf16_layers_at_end: int = option(0, validator=between(0, MAX_LAYERS, integer=True),
                                     doc="last transformer layers kept entirely in bf16 (--num-layers-at-end-in-bf16)")


def _share(state, rows) -> np.ndarray:
    layers = float(state.ctx.model.num_layers)
    return np.clip(1.0 - rows.options["bf16_layers_at_end"] / layers, 0.0, 1.0)


def layer(state, rows):
    return reprice_gemms(state, FP4, rows.options["efficiency"], CAST_BYTES, SAVED_FRACTION, _share(state, rows))


def memory(state, rows):
    return with_weight_copies(state, 2.0 * NVFP4_BYTES * _share(state, rows))


@hookimpl
def mofa_candidate_constraints(batch, model, hardware):
    yield from needs_format(batch, hardware, "nvfp4", "fp4", "FP4")
    rows = batch.feature("nvfp4")
    if rows.enabled.any():
        tail = rows.options["bf16_layers_at_end"]
        yield ConstraintResult(
            name="nvfp4_bf16_layers", feasible=~rows.enabled | (tail <= model.num_layers),
            reason=f"features.nvfp4.bf16_layers_at_end exceeds the model's {model.num_layers} layers: "
                   f"choose at most {model.num_layers}")


def megatron_args(options) -> list[str]:
    out = ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]
    if options is not None and options.bf16_layers_at_end:
        out += ["--first-last-layers-bf16", "--num-layers-at-end-in-bf16", str(options.bf16_layers_at_end)]
    return out


def from_megatron(args):
    """``--fp4-format`` turns it on; ``--first-last-layers-bf16 --num-layers-at-end-in-bf16 N`` keeps
    the last N layers in bf16."""
    if args.value("--fp4-format") is None:
        return None
    args.value("--fp4-recipe")
    keep = args.has("--first-last-layers-bf16")
    n = args.number("--num-layers-at-end-in-bf16", 0)
    return {"bf16_layers_at_end": n} if keep and n else {}


FEATURE = CostTransform(
    name="nvfp4",
    description="NVFP4 GEMMs with Transformer Engine (NVIDIA's recipe): GEMMs at the fp4 peak, attention "
                "and norms bf16, row- and column-wise block-scaled casts, NVFP4 weight copies and saved inputs",
    equation="Δt = Σ_GEMM t(fp4)/η − t(row precision) + casts (5.125 B/element); M_w += P_gemm·1.125",
    megatron_args=megatron_args,
    from_megatron=from_megatron,
    options_type=Nvfp4Options,
    layer=layer,
    memory=memory,
    gemm_precision="fp4",
    before=REPRICE_BEFORE,
    conflicts=("fp8",),
    applies=lambda batch, model, hardware: np.full(len(batch), "fp4" in hardware.compute.peak_tflops),
    tunable=False,  # numerics are the user's choice: `mofa tune --features ...,nvfp4` searches it
    may_reduce_compute=True,
)


@hookimpl
def mofa_register_cost_transforms():
    return [FEATURE]
