"""Fully sharded data parallelism: ZeRO-3, PyTorch FSDP/FSDP2, Megatron-Core custom FSDP
(``optim_grads_params``).

Parameters, gradients and optimizer states are all sharded over the data-parallel group D the
parameter's gradient is reduced over (``engine._dp_groups``: DP×CP for dense parameters, the
expert-DP size ``t·c·D/(e·etp)`` for expert parameters). Before a layer runs, its parameters are
all-gathered; after its backward, its gradients are reduce-scattered.

Memory, bytes per GPU (P = parameters the GPU holds after TP/PP/EP sharding, P_ℓ = one layer's,
d_g = gradient bytes: 4 with fp32 main grads, 2 with fp16 or ``grad_reduce_dtype = "bf16"``)::

    M = P·(2 + d_g + 12)/D  +  (1 + prefetch)·P_ℓ·2  +  P_r·2  +  max(P_ℓ, P_r)·d_g

— the sharded weights, gradients and Adam states (18/D bytes/parameter with fp32 grads), the
gathered bf16 parameters of the running layer and of the ``prefetch`` layers gathered ahead, the
root unit's P_r parameters outside the layers (embedding, output layer, MTP heads on the stage),
which stay gathered from the forward to the backward (FSDP2 does not reshard the root module after
forward: it is gathered again at once for backward), and the largest unit's unsharded gradient
before it is reduce-scattered.
With ``reshard_after_forward = false`` (ZeRO-2-like, FSDP2's ``reshard_after_forward=False``) the
gathered parameters stay until the backward pass, so the weights are not sharded (P·2) and the
backward all-gather is skipped.

Time, per layer and micro-batch (gradients stay sharded, so each micro-batch's gradient of the
layer is reduce-scattered)::

    C_fwd = AG(P_ℓ·2, D)                         forward: gather the parameters
    C_bwd = AG(P_ℓ·2, D)·[reshard] + RS(P_ℓ·d_g, D)    backward: gather again, scatter gradients

dense and expert parameters each over their own group, priced by the collective provider. With
``prefetch ≥ 1`` layer i+1's gather (and layer i+1's reduce-scatter in backward) runs while layer i
computes, so as in every overlap (``_overlap``) the exposed part per pass is::

    E_fwd = max(α·F_ℓ, β·C_fwd) − F_ℓ            E_bwd = max(α·(B_ℓ+R_ℓ+W_ℓ), β·C_bwd) − (B_ℓ+R_ℓ+W_ℓ)

(α, β the contention coefficients; R_ℓ the recomputed forward, which runs inside the layer's backward
with its parameters already gathered, so it hides the backward's collectives too; ``prefetch = 0``:
E = C, nothing hidden). They go into the
layer's ``dp_exposed_fwd_s`` / ``dp_exposed_bwd_s`` (the ``dp_layer_comm`` breakdown entry) and so
into the pipeline's F and B. **Choice**: the first layer's gather of each pass has no previous
layer to hide behind; that one layer per stage and micro-batch is neglected.

Per step (optimizer phase): the parameters outside the transformer layers (embedding, LM head,
MTP heads) are reduce-scattered and all-gathered once, as by the distributed optimizer, and the
Adam update touches ``P/D`` parameters. The per-step gradient all-reduce of the base model is gone.
``dp_overlap`` (which runs after this) hides that small remainder like the distributed optimizer's.

Rows that train none of the model's weights (``Feature.frozen_weights``: ``lora``) gather the
frozen layers exactly as above but reduce-scatter no gradient of theirs and hold no unsharded one.

Conflicts with ``distributed_optimizer`` (it is its ZeRO-1/2 special case) and ``cpu_optimizer``.
Runs after ``fp8``, ``kernel_scaling``, ``memfine`` and ``recompute`` (the overlap sees their compute
times); **choice**:
``kernel_scaling``'s bandwidth factor γ does not reach the collectives priced here.
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.decompose import ALL_GATHER, REDUCE_SCATTER, Coll, layer_params
from mofa_framework.engine import _grad_bytes_per_param, dp_param_groups, frozen_weight_rows, params_on_stages, stage_picker
from mofa_framework.limits import MAX_LAYERS, between
from mofa_framework.types import MemoryOptimizer, option
from mofa_plugins._overlap import ContentionOptions, contention, opt
from mofa_plugins.distributed_optimizer import GRAD_REDUCE_DTYPES, MEGATRON_FSDP, MEGATRON_FSDP_ENV, dp_sizes, shard_fraction

#: bytes per parameter of the all-gathered bf16 weights
PARAM_BYTES = 2.0


@attrs.frozen(kw_only=True)
class FsdpOptions(ContentionOptions):
    reshard_after_forward: bool = option(
        True, search=(True, False),
        doc="free the gathered parameters after the forward and gather them again in backward (ZeRO-3); "
            "false keeps them until the backward (less communication, unsharded weights)")
    prefetch: int = option(1, validator=between(0, MAX_LAYERS, integer=True),
                           doc="layers gathered ahead of the running one (0 = no overlap of the gathers)")
    grad_reduce_dtype: str = option("fp32", choices=GRAD_REDUCE_DTYPES,
                                    doc="gradient reduce-scatter and sharded-gradient dtype (fp32 main grads, "
                                        "or bf16); fp16 jobs reduce fp16 either way")


def grad_bytes(batch, rows) -> np.ndarray:
    """d_g per row: the main-grad bytes, or 2 where the gradients are reduced in bf16."""
    gb = _grad_bytes_per_param(batch)
    if "grad_reduce_dtype" in rows.options:
        gb = np.where(rows.enabled & rows.choice("grad_reduce_dtype", "bf16"), 2.0, gb)
    return gb


def reduced_grad_bytes(state, rows) -> np.ndarray:
    """d_g of the gradients each row reduce-scatters: 0 where a feature freezes the model's weights
    (``Feature.frozen_weights``: LoRA's adapters, a fraction of a per cent of the parameters, are
    left out), else :func:`grad_bytes`."""
    return np.where(frozen_weight_rows(state.batch, state.ctx.pm.registry), 0.0, grad_bytes(state.batch, rows))


def layer_shards(state, kind: str):
    """(dense, expert) parameters of one layer of `kind` on one GPU (after TP / EP×ETP)."""
    lp = layer_params(state.ctx.model, kind)
    b = state.batch
    dense = lp["sharded"] / b.tp.astype(np.float64) + lp["replicated"]
    expert = lp["expert"] / (b.ep * b.etp).astype(np.float64)
    return dense, expert


def layer_groups(state, kind: str):
    """(label, parameters, group size, stride) of one layer's dense and expert parameters on one GPU
    and the data-parallel group each is sharded over; a group with no parameters on any row (a dense
    layer's experts) is left out — its collectives would cost nothing."""
    n = len(state.batch)
    dense, expert = (np.broadcast_to(np.asarray(p, dtype=np.float64), (n,)) for p in layer_shards(state, kind))
    yield from dp_param_groups(state.ctx, state.batch, dense, expert)


def layer_gather_s(state, kind: str, prefix: str = "fsdp", pieces=None) -> np.ndarray:
    """Seconds to all-gather one layer's bf16 parameters over their DP groups (dense and expert),
    in one collective, or in `pieces` equal ones per group (an array over the batch: one per module)."""
    t = np.zeros(len(state.batch))
    k = 1.0 if pieces is None else np.asarray(pieces, dtype=np.float64)
    for label, params, size, stride in layer_groups(state, kind):
        ag = Coll(name=f"{prefix}_{kind}_{label}_ag", parallel="dp", kind=ALL_GATHER,
                  bytes=params * PARAM_BYTES / k, group_size=size, stride=stride)
        t = t + np.where(params > 0, k * state.ctx.collective_s(ag, per_structure=pieces is None), 0.0)
    return t


def layer_comm(state, rows, kind: str):
    """(forward, backward) seconds of one layer's gathers and scatters per micro-batch."""
    gb = reduced_grad_bytes(state, rows)
    reshard = opt(rows, "reshard_after_forward", 1.0) > 0.5
    fwd = layer_gather_s(state, kind)
    bwd = np.where(reshard, fwd, 0.0)
    for label, params, size, stride in layer_groups(state, kind):
        rs = Coll(name=f"fsdp_{kind}_{label}_rs", parallel="dp", kind=REDUCE_SCATTER, bytes=params * gb,
                  group_size=size, stride=stride)
        # the gradient bytes depend on an option: priced per row
        bwd = bwd + np.where((params > 0) & (gb > 0), state.ctx.collective_s(rs), 0.0)
    return fwd, bwd


def layer(state, rows):
    alpha, beta = contention(state, rows)
    hide = opt(rows, "prefetch", 1.0) >= 1.0
    out = {}
    for kind, c in state.layers.items():
        fwd, bwd = layer_comm(state, rows, kind)
        # the backward window includes the recomputed forward (full or selective recompute runs it
        # inside the layer's backward, with the parameters already gathered)
        f_comp, b_comp = c.fwd_compute_s, c.bwd_input_s + c.bwd_weight_s + c.recompute_s
        exp_f = np.where(hide, np.maximum(alpha * f_comp, beta * fwd) - f_comp, fwd)
        exp_b = np.where(hide, np.maximum(alpha * b_comp, beta * bwd) - b_comp, bwd)
        out[kind] = attrs.evolve(c, dp_fwd_s=c.dp_fwd_s + fwd, dp_bwd_s=c.dp_bwd_s + bwd,
                                 dp_exposed_fwd_s=c.dp_exposed_fwd_s + exp_f,
                                 dp_exposed_bwd_s=c.dp_exposed_bwd_s + exp_b)
    return attrs.evolve(state, layers=out)


def _rest_params(state):
    """Dense parameters outside the transformer layers (embedding, head, MTP) on the stage whose
    gradients the engine reduces (the one with the most parameters), and the stage's index."""
    ctx, batch, lay = state.ctx, state.batch, state.layout
    dense, expert = params_on_stages(state)
    worst = np.argmax(dense + expert, axis=0)
    pick = stage_picker(worst)
    in_layers = np.zeros(len(batch))
    in_experts = np.zeros(len(batch))
    for kind, count in lay.counts.items():
        d, e = layer_shards(state, kind)
        n = pick(count)
        in_layers = in_layers + n * d
        in_experts = in_experts + n * e
    return np.maximum(pick(dense) - in_layers, 0.0), np.maximum(pick(expert) - in_experts, 0.0)


def optimizer(state, rows):
    ctx, batch, o = state.ctx, state.batch, state.opt
    gb_main = _grad_bytes_per_param(batch)
    p_dense, p_expert = o.dense_grad_bytes / gb_main, o.expert_grad_bytes / gb_main
    d_dense, d_expert = dp_sizes(state)
    frac = shard_fraction(p_dense, p_expert, d_dense, d_expert)
    rest_d, rest_e = _rest_params(state)
    gb = reduced_grad_bytes(state, rows)
    comm = np.zeros(len(batch))
    for label, params, size, stride in dp_param_groups(ctx, batch, rest_d, rest_e):
        rs = Coll(name=f"fsdp_rest_{label}_rs", parallel="dp", kind=REDUCE_SCATTER, bytes=params * gb,
                  group_size=size, stride=stride)
        ag = Coll(name=f"fsdp_rest_{label}_ag", parallel="dp", kind=ALL_GATHER, bytes=params * PARAM_BYTES,
                  group_size=size, stride=stride)
        comm = comm + np.where(params > 0, np.where(gb > 0, ctx.collective_s(rs), 0.0) + ctx.collective_s(ag), 0.0)
    new = attrs.evolve(o, dp_comm_s=comm, dp_exposed_s=comm, update_s=o.update_s * frac,
                       dense_grad_bytes=rest_d * gb_main, expert_grad_bytes=rest_e * gb_main)
    return attrs.evolve(state, opt=new)


def memory(state, rows):
    mem, batch = state.mem, state.batch
    d_dense, d_expert = dp_sizes(state)
    frac = shard_fraction(mem.dense_params, mem.expert_params, d_dense[None, :], d_expert[None, :])
    gb_main = _grad_bytes_per_param(batch)
    gb = grad_bytes(batch, rows)
    held_gb = reduced_grad_bytes(state, rows)  # no unsharded gradient of frozen weights
    reshard = (opt(rows, "reshard_after_forward", 1.0) > 0.5)[None, :]
    weights = np.where(reshard, mem.weights_bytes * frac, mem.weights_bytes)
    grads = mem.grads_bytes * frac * (gb / gb_main)[None, :]
    # the largest layer type's gathered parameters (running + prefetched) and unsharded gradient
    p_layer = np.zeros(len(batch))
    for kind in state.layers:
        d, e = layer_shards(state, kind)
        p_layer = np.maximum(p_layer, d + e)
    gathered = np.where(reshard[0], (1.0 + opt(rows, "prefetch", 1.0)) * p_layer * PARAM_BYTES, 0.0)
    root = root_params(state)
    # the root unit (embedding, final norm, output layer) stays gathered from its forward to its
    # backward; the unsharded gradient is the larger unit's
    held = np.where(reshard, root * PARAM_BYTES, 0.0) + gathered[None, :] + np.maximum(p_layer[None, :], root) * held_gb[None, :]
    buffers = mem.buffers_bytes + held
    return attrs.evolve(state, mem=attrs.evolve(mem, weights_bytes=weights, grads_bytes=grads,
                                                  optimizer_bytes=mem.optimizer_bytes * frac, buffers_bytes=buffers))


def root_params(state):
    """Parameters outside the transformer layers on each stage (3, N): embedding, output layer, MTP."""
    lay, mem = state.layout, state.mem
    inside = np.zeros_like(mem.dense_params)
    for kind, count in lay.counts.items():
        d, e = layer_shards(state, kind)
        inside = inside + count * (d + e)[None, :]
    return np.maximum(mem.dense_params + mem.expert_params - inside, 0.0)


def megatron_args(options) -> list[str]:
    out = [*MEGATRON_FSDP, "--data-parallel-sharding-strategy", "optim_grads_params"]
    if options is not None and options.grad_reduce_dtype == "bf16":
        out.append("--grad-reduce-in-bf16")
    return out


def from_megatron(args):
    """Megatron-FSDP (``--use-megatron-fsdp``, formerly ``--use-custom-fsdp``) sharding parameters,
    gradients and optimizer states (``--data-parallel-sharding-strategy optim_grads_params``, the
    default), or PyTorch FSDP2 (``--use-torch-fsdp2``)."""
    mfsdp = args.has("--use-custom-fsdp") | args.has("--use-megatron-fsdp")
    args.has("--ckpt-format")  # Megatron-FSDP's checkpoint format (fsdp_dtensor): no cost to price
    torch_fsdp = args.has("--use-torch-fsdp2")
    strategy = args.value("--data-parallel-sharding-strategy", "optim_grads_params")
    bf16 = args.has("--grad-reduce-in-bf16") | (args.value("--megatron-fsdp-grad-comm-dtype") == "bf16")
    if torch_fsdp or (mfsdp and strategy == "optim_grads_params"):
        return {"grad_reduce_dtype": "bf16" if bf16 else "fp32"}
    return None


FEATURE = MemoryOptimizer(
    name="fsdp",
    description="fully shard parameters, gradients and optimizer states over data parallelism (ZeRO-3 / FSDP / "
                "Megatron-FSDP optim_grads_params): 18/D bytes per parameter plus the gathered layers; each "
                "layer's parameters are all-gathered in forward and backward and its gradients reduce-scattered, "
                "overlapped with the neighbouring layer's compute",
    equation="M = P·(2+d_g+12)/D + (1+prefetch)·P_ℓ·2 + P_r·2 + max(P_ℓ,P_r)·d_g;  E = max(α·comp_ℓ, β·(AG_ℓ [+AG_ℓ] + RS_ℓ)) − comp_ℓ",
    options_type=FsdpOptions,
    layer=layer,
    adds_time_only=True,  # trades time for memory: never makes a layer faster
    optimizer=optimizer,
    memory=memory,
    megatron_args=megatron_args,
    megatron_env=lambda options: [MEGATRON_FSDP_ENV],
    from_megatron=from_megatron,
    before=("dp_overlap",),
    after=("fp8", "kernel_scaling", "memfine", "recompute"),
    conflicts=("distributed_optimizer", "cpu_optimizer"),
    applies=lambda batch, model, hardware: (batch.dp * batch.cp > 1) | (
        (batch.tp * batch.cp * batch.dp > batch.ep * batch.etp) if model.is_moe else False),
)


@hookimpl
def mofa_register_memory_optimizers():
    return [FEATURE]
