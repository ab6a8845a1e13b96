"""Expert-parallel all-to-all overlap: paper eq. [22].

DualPipe (DeepSeek-V3) and Megatron's combined 1F1B A2A overlap pair the forward of one
micro-batch with the backward of another on the same MoE layer: the forward compute hides
the backward's all-to-alls (dispatch + combine, and the expert-TP gather/scatter) and the
backward compute hides the forward's. Per MoE layer, with the two pairs i::

    T = Σ_i max(α·comp_i, β·a2a_i)
      = max(α·F_comp, β·a2a_bwd) + max(α·B_comp, β·a2a_fwd)

**Which compute hides it** (option ``hide_with``):

- ``layer`` (default, the paper's wording "the computation of the forward pass"): the
  whole MoE layer's compute of that pass — attention, router, shared and routed experts
  (F_comp = ``fwd_compute_s``, B_comp = ``bwd_input_s + bwd_weight_s``);
- ``experts``: only the routed-expert GEMMs (``expert_fwd_s``, ``expert_bwd_s``) — a
  conservative reading for when attention is busy hiding TP/CP communication.

The compute is already counted in the compute components, so the exposed EP communication
becomes ``max(α·F_comp, β·a2a_bwd) − F_comp`` in the forward and ``max(α·B_comp, β·a2a_fwd)
− B_comp`` in the backward (including the contention slowdown of the compute). With
α = β = 1 each is ``max(0, a2a − comp) ≤ a2a``: never slower than no overlap. It applies
to every micro-batch (the steady-state pairing of [22]; warmup/cooldown micro-batches
without a partner are not treated separately).

Dense layers and rows with no EP communication (``ep == etp == 1``, or a dense model) are
left unchanged: a no-op, not an infeasible row. Memory is unchanged (the extra in-flight
micro-batch of DualPipe is the schedule's business).
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.types import ConstraintResult, EnvRequirement, OverlapStrategy, option
from mofa_plugins._overlap import ContentionOptions, contention

HIDE_WITH = ("layer", "experts")


@attrs.frozen(kw_only=True)
class EpOverlapOptions(ContentionOptions):
    hide_with: str = option("layer", choices=HIDE_WITH,
                            doc="compute that hides the other pass's all-to-all: the whole MoE layer, or the experts")


def layer(state, rows):
    out = dict(state.layers)
    for kind in state.ctx.model.moe_kinds:  # none on a dense model: nothing to overlap
        moe = state.layers[kind]
        alpha, beta = contention(state, rows)
        experts = (rows.choice("hide_with", "experts") if "hide_with" in rows.options
                   else np.zeros(len(rows.enabled), bool))
        f_comp = np.where(experts, moe.expert_fwd_s, moe.fwd_compute_s)
        b_comp = np.where(experts, moe.expert_bwd_s, moe.bwd_input_s + moe.bwd_weight_s)
        a2a_f, a2a_b = moe.ep_fwd_s, moe.ep_bwd_s
        applies = (a2a_f + a2a_b) > 0
        exp_f = np.maximum(alpha * f_comp, beta * a2a_b) - f_comp
        exp_b = np.maximum(alpha * b_comp, beta * a2a_f) - b_comp
        out[kind] = attrs.evolve(moe, ep_exposed_fwd_s=np.where(applies, exp_f, moe.ep_exposed_fwd_s),
                                 ep_exposed_bwd_s=np.where(applies, exp_b, moe.ep_exposed_bwd_s))
    return attrs.evolve(state, layers=out)


def feasible(batch, rows) -> ConstraintResult:
    """Megatron-Core's A2A overlap (``--overlap-moe-expert-parallel-comm``) refuses full recompute and
    recompute of the whole MoE layer (its ``TransformerConfig``: "disable full recomputation when
    enabling overlap_moe_expert_parallel_comm", "disable moe in recompute_modules ...")."""
    rec = batch.feature("recompute")
    full = np.asarray(rec.enabled, bool) & (rec.choice("granularity", "full") if "granularity" in rec.options
                                            else False)
    moe = np.asarray(rec.enabled, bool) & (np.asarray(rec.options["moe"]) > 0.5 if "moe" in rec.options else False)
    bad = np.asarray(rows.enabled, bool) & (full | moe)
    return ConstraintResult(
        name="ep_overlap_recompute", feasible=~bad,
        reason="features.ep_overlap (Megatron-Core's --overlap-moe-expert-parallel-comm) refuses full recompute and "
               "recompute of the whole MoE layer (features.recompute granularity = \"full\" or moe = true): use "
               "selective recompute without moe, or drop ep_overlap")


def unpaired_schedule_rule(schedule: str):
    """A schedule's rule for rows of a schedule that never runs one micro-batch's forward beside
    another's backward on a pipeline (plain 1F1B, GPipe): at PP > 1 there is nothing for the A2A
    overlap to pair, and Megatron-Core asserts a virtual pipeline with it ("If enabling EP A2A
    overlap, virtual_pipeline_model_parallel_size must be specified when pipeline_model_parallel_size
    > 1")."""
    def rule(batch, rows) -> ConstraintResult:
        bad = np.asarray(rows, bool) & np.asarray(batch.feature("ep_overlap").enabled, bool) & (np.asarray(batch.pp) > 1)
        return ConstraintResult(
            name="ep_overlap_unpaired", feasible=~bad,
            reason=f"features.ep_overlap at parallel.pp > 1 needs a schedule that pairs micro-batches: Megatron-Core "
                   f"overlaps the MoE all-to-all only in the interleaved schedule (vpp > 1), not in {schedule}: use "
                   "interleaved-1f1b or drop ep_overlap")
    return rule


def from_megatron(args):
    """On with ``--overlap-moe-expert-parallel-comm``; ``--delay-wgrad-compute``, which Megatron-LM takes
    only beside it, is what the overlap prices anyway (the backward's weight gradients hide the
    forward's all-to-alls) and is read as part of it."""
    args.has("--delay-wgrad-compute")
    return {} if args.has("--overlap-moe-expert-parallel-comm") else None


#: the A2A overlap as Megatron-Core's MoE guide configures it (``megatron/core/transformer/moe/README.md``,
#: "EP A2A Overlap": ``--overlap-moe-expert-parallel-comm --delay-wgrad-compute``), as the
#: Megatron-MoE-ModelZoo's and Megatron-Bridge's launches the feature is calibrated on run it
MEGATRON_ARGS = ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]


def megatron_env(options) -> list[EnvRequirement]:
    """More than one hardware queue, so the all-to-alls run beside the other micro-batch's compute
    (the MoE guide's requirement; at 1 the streams serialise and nothing is hidden), and the SM margin
    the normalisation kernels leave to them: what Megatron-MoE-ModelZoo's ``A2A_OVERLAP=1`` exports."""
    zoo = "Megatron-MoE-ModelZoo's A2A-overlap launch (sbatch_benchmarking.sh)"
    return [EnvRequirement(name="CUDA_DEVICE_MAX_CONNECTIONS", value="32", required=False,
                           reason="the MoE A2A overlap needs more than one hardware queue (Megatron-Core MoE "
                                  "README); " + zoo + " sets 32"),
            *(EnvRequirement(name=f"NVTE_{d}_LAYERNORM_SM_MARGIN", value="20", required=False,
                             reason="SMs the normalisation kernels leave to the overlapped all-to-alls: " + zoo)
              for d in ("FWD", "BWD"))]


FEATURE = OverlapStrategy(
    name="ep_overlap",
    description="forward compute of one micro-batch hides another's backward all-to-all, and vice versa",
    equation="[22] T = Σ_i max(α·comp_i, β·a2a_i)",
    options_type=EpOverlapOptions,
    layer=layer,
    applies=lambda batch, model, hardware: (batch.ep > 1) & model.is_moe,
    megatron_args=lambda o: list(MEGATRON_ARGS),
    megatron_env=megatron_env,
    feasible=feasible,
    from_megatron=from_megatron,
)


@hookimpl
def mofa_register_overlap_strategies():
    return [FEATURE]
