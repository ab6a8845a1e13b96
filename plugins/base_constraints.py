"""The structural rules every Megatron-style configuration must satisfy (paper §4.1).

Each rule is a feasibility mask over the batch with a one-line reason naming the field and
the fix; `mofa predict` reports the first failing rule of a job as an error, `mofa tune`
prunes the rows.
"""

from __future__ import annotations

import numpy as np

from mofa_framework import hookimpl
from mofa_framework.batch import PRECISIONS
from mofa_framework.engine import layers_per_stage_valid, stage_sizes, stages_hold_layers
from mofa_framework.types import ConstraintResult

#: these rules read the batch's sizes, shape and precision, never its features: a search checks
#: them once per structure (``mofa_candidate_constraints``)
MOFA_CONSTRAINTS_READ_FEATURES = False


@hookimpl
def mofa_candidate_constraints(batch, model, hardware):
    t, c, e, etp, dp = batch.tp, batch.cp, batch.ep, batch.etp, batch.dp
    s, b, gbs = batch.sequence_length, batch.micro_batch_size, batch.global_batch_size
    heads_ok = model.num_attention_heads % t == 0
    split_kv = not (model.is_mla or model.kv_shared)  # MLA's latent and a shared K = V head are replicated
    if split_kv:
        heads_ok &= model.num_kv_heads % t == 0
    if model.o_lora_rank:
        heads_ok &= model.o_groups % t == 0
    yield ConstraintResult(
        name="tp_divides_heads", feasible=heads_ok,
        reason=f"parallel.tp must divide model.num_attention_heads ({model.num_attention_heads})"
               + (f" and model.num_kv_heads ({model.num_kv_heads})" if split_kv else "")
               + (f" and model.o_groups ({model.o_groups})" if model.o_lora_rank else "")
               + ": choose a smaller power of two",
        detail=_values(tp=t))
    yield from _recurrent_heads(model, t)
    ffn = model.moe_ffn_hidden_size if model.is_moe and not model.num_dense_layers else model.ffn_hidden_size
    yield ConstraintResult(name="tp_divides_ffn", feasible=ffn % t == 0,
                           reason=f"parallel.tp must divide model.ffn_hidden_size ({ffn})", detail=_values(tp=t))
    sizes = stage_sizes(model, batch)
    held = stages_hold_layers(model, batch, sizes)
    valid = layers_per_stage_valid(model, batch, sizes, held)
    explicit = (batch.first_stage_layers > 0) | (batch.last_stage_layers > 0)
    yield ConstraintResult(
        name="pp_splits_layers", feasible=valid,
        reason=f"parallel.pp × parallel.vpp must split model.num_layers ({model.num_layers}) into whole chunks",
        detail=lambda i: ": " + (_end_stage_reason(model, batch, i) if explicit[i] else
                                 "choose pp/vpp dividing it, or set parallel.first_stage_layers / last_stage_layers"))
    yield ConstraintResult(
        name="stages_hold_layers", feasible=held,
        reason=f"parallel.pp must place model.num_layers ({model.num_layers}) with every stage holding a layer",
        detail=lambda i: _unplaceable_values(batch, sizes, i))
    yield ConstraintResult(
        name="vpp_needs_pp", feasible=(batch.vpp == 1) | (batch.pp > 1),
        reason="parallel.vpp > 1 interleaves pipeline stages and needs parallel.pp > 1: set vpp = 1")
    yield ConstraintResult(
        name="gbs_divisible", feasible=(gbs % (dp * b) == 0) & (gbs >= dp * b),
        reason="parallel.global_batch_size must be a multiple of data-parallel size × micro_batch_size "
               "(data-parallel size = num_gpus / (tp·pp·cp))",
        detail=lambda i: _gbs_values(int(gbs[i]), int(dp[i]), int(b[i])))
    yield ConstraintResult(
        name="cp_divides_sequence", feasible=np.where(c > 1, s % (2 * c) == 0, True),
        reason="parallel.sequence_length must be divisible by 2 × parallel.cp (load-balanced causal ring attention)",
        detail=_values(sequence_length=s, cp=c))
    yield ConstraintResult(
        name="sp_divides_sequence", feasible=np.where(batch.sequence_parallel & (t > 1), (s // c) % t == 0, True),
        reason="parallel.sequence_length / cp must be divisible by parallel.tp with sequence_parallel",
        detail=_values(sequence_length=s, cp=c, tp=t))
    for fmt in ("fp8", "fp4"):  # a format the GPU has no tensor cores for (as features.fp8 / nvfp4 check)
        rows = batch.precision == PRECISIONS.index(fmt)
        if rows.any() and fmt not in hardware.compute.peak_tflops:
            yield ConstraintResult(
                name=f"precision_needs_{fmt}_hardware", feasible=~rows,
                reason=f"parallel.precision = {fmt!r} needs {fmt.upper()} tensor cores, but {hardware.name} lists "
                       f"no {fmt} in compute.peak_tflops ({', '.join(sorted(hardware.compute.peak_tflops))}): "
                       "choose another precision or GPU")
    if model.is_moe:
        ok = (model.num_experts % e == 0) & ((t * c * dp) % (e * etp) == 0)
        yield ConstraintResult(
            name="ep_divides_experts", feasible=ok,
            reason=f"parallel.ep must divide model.num_experts ({model.num_experts}) and ep × etp must divide "
                   "tp × cp × data-parallel size", detail=lambda i: _ep_values(model, batch, i))
    else:
        yield ConstraintResult(name="ep_needs_moe", feasible=(e == 1) & (etp <= t),
                               reason="parallel.ep > 1 needs an MoE model (num_experts > 0): set ep = 1")


def _values(**fields):
    """A rule's ``detail``: row i's values of `fields` (batch arrays), `` (here tp 3)``."""
    return lambda i: " (here " + ", ".join(f"{k} {int(v[i])}" for k, v in fields.items()) + ")"


def _gbs_values(gbs: int, dp: int, b: int) -> str:
    """One row's numbers for the global-batch rule, and the nearest global batches that work."""
    unit = dp * b
    below, above = gbs // unit * unit, (gbs // unit + 1) * unit
    near = f"{below} or {above}" if below > 0 else f"{above}"
    return (f": here {gbs} against data-parallel size {dp} × micro-batch {b} = {unit}; use a global batch "
            f"of {near}, or change the GPU count or micro-batch")


def _ep_values(model, batch, i: int) -> str:
    """Row `i`'s numbers for the expert-parallel rule: what it asked for and what a pipeline stage holds."""
    e, etp, t, c, dp = (int(x[i]) for x in (batch.ep, batch.etp, batch.tp, batch.cp, batch.dp))
    return (f" (here ep {e} × etp {etp} = {e * etp} against tp {t} × cp {c} × dp {dp} = {t * c * dp} GPUs per "
            f"pipeline stage{'' if model.num_experts % e == 0 else f'; {model.num_experts} experts'}): "
            f"choose an ep dividing both")


def _end_stage_reason(model, batch, i: int) -> str:
    """Why row `i`'s explicit end-stage sizes do not place every layer exactly once."""
    L, p, f, last = model.num_layers, int(batch.pp[i]), int(batch.first_stage_layers[i]), int(batch.last_stage_layers[i])
    given = f"first_stage_layers = {f}, last_stage_layers = {last}"
    if p == 1:
        return (f"parallel.{given} need parallel.pp > 1 (one stage holds all {L} layers): remove them")
    if p == 2:
        return (f"parallel.{given}: with pp = 2 the two stages must hold all {L} layers of the model "
                f"(first + last = {L}); set both, or neither for a balanced split")
    return (f"parallel.{given}: the {p - 2} middle stages must share the other {L} − first − last layers equally "
            f"(at least one each, a multiple of vpp): change the end-stage sizes or pp")


def _recurrent_heads(model, t):
    """TP shards a recurrent mixer's heads (and Mamba-2's B/C groups): t must divide them."""
    mixers = model.mixers
    if "mamba2" in mixers:
        h, g = model.mamba_heads, model.mamba_num_groups
        yield ConstraintResult(name="tp_divides_mamba_heads", feasible=(h % t == 0) & (g % t == 0),
                               reason=f"parallel.tp must divide the Mamba-2 heads ({h}) and model.mamba_num_groups "
                                      f"({g}): choose a smaller tp")
    if mixers & {"gated_deltanet", "linear_attention"}:
        hk, hv = model.linear_num_key_heads, model.linear_num_value_heads
        yield ConstraintResult(name="tp_divides_linear_heads", feasible=(hk % t == 0) & (hv % t == 0),
                               reason=f"parallel.tp must divide model.linear_num_key_heads ({hk}) and "
                                      f"linear_num_value_heads ({hv}): choose a smaller tp")


def _unplaceable_values(batch, sizes: np.ndarray, i: int) -> str:
    """Row `i`'s split of the layers that leaves a stage empty (`sizes`: stage_sizes), and the fix."""
    first, mid, last = (int(x) for x in sizes[:, i])
    return (f" (here pp = {int(batch.pp[i])}: the split would put {first} / {mid} / {last} on the first / each "
            "middle / the last stage): choose a pp dividing the layers, or set parallel.first_stage_layers / "
            "last_stage_layers")
