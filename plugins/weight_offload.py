"""Weight and optimizer-state offload to host memory (ZeRO-Infinity's ``offload_param`` +
``offload_optimizer`` on CPU memory; ZeRO-Offload and Megatron-Core's ``--optimizer-cpu-offload``
for the update; Calculon's ``weight_offload`` + ``optimizer_offload``).

The model state lives in host DRAM: every GPU's bf16/fp16 weights (2·P), its gradients,
accumulated there (g·P, g = the main-grad bytes: 4 with bf16, 2 with fp16) and the fp32 master
weights and Adam moments (12·P/D: each DP rank keeps and updates its 1/D, as ZeRO does). Only the
layers in flight stay in HBM. P = parameters this GPU holds on a stage (after TP/PP/EP), P_ℓ
one layer's (the largest kind; the embedding/head when larger), D the gradient-reduction group.

**Per layer and micro-batch** (PCIe, or NVLink-C2C on Grace parts; full duplex)::

    forward:   H2D P_ℓ·2                        (the layer's weights, fetched ahead)
    backward:  H2D P_ℓ·2  ∥  D2H P_ℓ·g          (weights again; its gradient back to host)

With ``prefetch`` ≥ 1 the next layer's transfer runs during this layer's compute; as in every
overlap the exposed part is ``max(α·c, β·link) − c`` per pass (α, β the contention coefficients),
into the ``offload`` breakdown entry; ``prefetch = 0``: all exposed. The parameters outside the
layers (embedding, head) stream too, spread over the stage's layers. With ``activation_offload``
on the same rows both share the link: forward ``max(H2D weights, D2H activations)``, backward
``max(H2D weights + H2D activations, D2H gradients)`` (the activations as a share q of each
layer's saved bytes, q from ``activation_offload``), and this feature writes the joint exposure
in place of ``activation_offload``'s — never both.

**Per step** (``optimizer_host``; exposed): gradients reduced over DP go through the GPU (H2D g·P,
reduce-scatter, the engine's collective provider) and the updated shard is all-gathered on the GPU
and written back (D2H 2·P); with D = 1 nothing is staged. The update:

- ``optimizer = "cpu"`` (ZeRO-Offload / -Infinity, Megatron's CPU offload): Adam on the CPU over
  P/D parameters at ``host.cpu_optimizer_params_per_s`` shared by the node's GPUs (as
  ``cpu_optimizer`` [28]); transfers ``H2D g·P_r + 2·P_r/D``, ``D2H g·P_r/D + 2·P_r`` (P_r: the
  parameters reduced over a DP group of more than one rank);
- ``optimizer = "gpu"`` (Calculon's optimizer offload): the states stream through the GPU for a GPU
  Adam over P/D: ``H2D g·P + 12·P/D``, ``D2H 12·P/D + 2·P``, and the GPU update time.

The link time is ``max(H2D/BW_h2d, D2H/BW_d2h)``.

**Memory** per GPU, on every stage (never more than without the feature)::

    HBM:   weights (1 + prefetch)·P_ℓ·2,  gradients 2·P_ℓ·g,  states 0 (cpu) | 2·12·P_ℓ/D (gpu)
    host:  2·P + g·P + 12·P/D

checked against ``host.cpu_memory_gib / gpus_per_node`` (a candidate constraint: ``mofa predict``
says it, ``mofa tune`` prunes); the check counts this feature's host bytes only.

**Choices.** The first layer's fetch of each pass has nothing to hide behind and is neglected (as
in ``fsdp``). Gradients accumulate on the host in full (g·P) and are reduced at the step, not per
micro-batch; the CPU's accumulation adds are not priced.

Conflicts with ``cpu_optimizer`` (the CPU update is this feature's ``optimizer = "cpu"``),
``distributed_optimizer`` (the 1/D sharding is included), ``fsdp`` and ``deepspeed_zero`` (their
parameters are sharded, not offloaded) and ``dp_overlap`` (the gradients are reduced from host at
the step, nothing to overlap). Composes with ``activation_offload`` (one link, above) and
``recompute``.
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.engine import _grad_bytes_per_param, stage_layout
from mofa_framework.limits import MAX_LAYERS, between
from mofa_framework.types import MemoryOptimizer, option
from mofa_plugins._overlap import ContentionOptions, contention, opt
from mofa_plugins.activation_offload import offloaded_share
from mofa_plugins.cpu_optimizer import host_memory_check, params_per_rank, where_on
from mofa_plugins.deepspeed_zero import busiest_stage
from mofa_plugins.distributed_optimizer import STATE_BYTES, dp_sizes, local_params, shard_fraction, sharded_dp_comm_s
from mofa_plugins.fsdp import PARAM_BYTES, _rest_params, layer_shards

UPDATES = ("cpu", "gpu")


@attrs.frozen(kw_only=True)
class WeightOffloadOptions(ContentionOptions):
    prefetch: int = option(1, validator=between(0, MAX_LAYERS, integer=True),
                           doc="layers fetched ahead of the running one (0 = no overlap of the transfers)")
    optimizer: str = option("cpu", choices=UPDATES, search=UPDATES,
                            doc="where Adam runs on the host-resident states: cpu (ZeRO-Offload) or gpu (states "
                                "streamed through the GPU, Calculon's optimizer offload)")


def _unit(state):
    """P_ℓ: parameters of the largest block that is resident while it runs (a layer of any kind, or
    the embedding/head), per GPU."""
    p = np.zeros(len(state.batch))
    for kind in state.layers:
        d, e = layer_shards(state, kind)
        p = np.maximum(p, d + e)
    rest_d, rest_e = _rest_params(state)
    return np.maximum(p, rest_d + rest_e)


def _activation_share(state):
    """(rows, q): where ``activation_offload`` is on, and its offloaded share of the first stage."""
    act = state.batch.feature("activation_offload")
    if not act.enabled.any():
        return act.enabled, np.zeros(len(state.batch))
    return act.enabled, np.where(act.enabled, offloaded_share(state, act)[0], 0.0)


def layer(state, rows):
    hw, batch = state.ctx.hardware, state.batch
    alpha, beta = contention(state, rows)
    g = _grad_bytes_per_param(batch)
    hide = opt(rows, "prefetch", 1.0) >= 1.0
    rest_d, rest_e = _rest_params(state)
    layers = busiest_stage(state)[3]
    act_on, q = _activation_share(state)
    out = {}
    for kind, c in state.layers.items():
        d, e = layer_shards(state, kind)
        p = d + e + (rest_d + rest_e) / layers
        weights_in = p * PARAM_BYTES / hw.h2d_bandwidth_bytes_per_s
        link_f = np.maximum(weights_in, q * c.act_saved_bytes / hw.d2h_bandwidth_bytes_per_s)
        link_b = np.maximum(weights_in + q * c.act_saved_bytes / hw.h2d_bandwidth_bytes_per_s,
                            p * g / hw.d2h_bandwidth_bytes_per_s)
        # the compute windows activation_offload uses, without its own exposure
        f_comp = c.fwd_s - c.offload_exposed_fwd_s
        b_comp = c.bwd_input_total_s - c.offload_exposed_bwd_s + c.bwd_weight_s
        exp_f = np.where(hide, np.maximum(alpha * f_comp, beta * link_f) - f_comp, link_f)
        exp_b = np.where(hide, np.maximum(alpha * b_comp, beta * link_b) - b_comp, link_b)
        out[kind] = attrs.evolve(
            c, offload_exposed_fwd_s=np.where(act_on, 0.0, c.offload_exposed_fwd_s) + exp_f,
            offload_exposed_bwd_s=np.where(act_on, 0.0, c.offload_exposed_bwd_s) + exp_b)
    return attrs.evolve(state, layers=out)


def step_transfer_bytes(state, rows):
    """(H2D, D2H) bytes per step of the gradient staging, the update and the weight write-back."""
    p_dense, p_expert = local_params(state)
    d_dense, d_expert = dp_sizes(state)
    g = _grad_bytes_per_param(state.batch)
    shard = p_dense / d_dense + p_expert / d_expert
    reduced = np.where(d_dense > 1, p_dense, 0.0) + np.where(d_expert > 1, p_expert, 0.0)
    reduced_shard = np.where(d_dense > 1, p_dense / d_dense, 0.0) + np.where(d_expert > 1, p_expert / d_expert, 0.0)
    gpu = opt(rows, "optimizer", 0.0) == UPDATES.index("gpu")
    h2d = np.where(gpu, g * (p_dense + p_expert) + STATE_BYTES * shard, g * reduced + PARAM_BYTES * reduced_shard)
    d2h = np.where(gpu, STATE_BYTES * shard + PARAM_BYTES * (p_dense + p_expert),
                   g * reduced_shard + PARAM_BYTES * reduced)
    return h2d, d2h


def optimizer(state, rows):
    hw, o = state.ctx.hardware, state.opt
    p_dense, p_expert = local_params(state)
    d_dense, d_expert = dp_sizes(state)
    frac = shard_fraction(p_dense, p_expert, d_dense, d_expert)
    h2d, d2h = step_transfer_bytes(state, rows)
    link = np.maximum(h2d / hw.h2d_bandwidth_bytes_per_s, d2h / hw.d2h_bandwidth_bytes_per_s)
    gpu = opt(rows, "optimizer", 0.0) == UPDATES.index("gpu")
    cpu_s = (p_dense + p_expert) * frac / (hw.host.cpu_optimizer_params_per_s / hw.gpus_per_node)
    comm = sharded_dp_comm_s(state)
    new = attrs.evolve(o, dp_comm_s=comm, dp_exposed_s=comm, update_s=np.where(gpu, o.update_s * frac, 0.0),
                       host_s=o.host_s + link + np.where(gpu, 0.0, cpu_s))
    return attrs.evolve(state, opt=new)


def memory(state, rows):
    mem = state.mem
    d_dense, d_expert = dp_sizes(state)
    frac = shard_fraction(mem.dense_params, mem.expert_params, d_dense[None, :], d_expert[None, :])
    unit = _unit(state)[None, :]
    g = _grad_bytes_per_param(state.batch)[None, :]
    gpu = (opt(rows, "optimizer", 0.0) == UPDATES.index("gpu"))[None, :]
    weights = np.minimum(mem.weights_bytes, (1.0 + opt(rows, "prefetch", 1.0))[None, :] * unit * PARAM_BYTES)
    grads = np.minimum(mem.grads_bytes, 2.0 * unit * g)
    states = np.minimum(mem.optimizer_bytes, np.where(gpu, 2.0 * unit * STATE_BYTES * frac, 0.0))
    host = mem.host_bytes + mem.weights_bytes + mem.grads_bytes + mem.optimizer_bytes * frac
    return attrs.evolve(state, mem=attrs.evolve(mem, weights_bytes=weights, grads_bytes=grads,
                                                  optimizer_bytes=states, host_bytes=host))


def host_bytes_per_gpu(batch, model) -> np.ndarray:
    """Host bytes per GPU on the worst stage: 2·P + g·P + 12·P/D."""
    full, sharded = params_per_rank(batch, model)
    return (full * (PARAM_BYTES + _grad_bytes_per_param(batch)) + sharded * STATE_BYTES).max(axis=0)


@hookimpl
def mofa_candidate_constraints(batch, model, hardware):
    rows = batch.feature("weight_offload")
    if rows.enabled.any():
        yield host_memory_check("weight_offload", rows, where_on(batch, rows, lambda b: host_bytes_per_gpu(b, model)),
                                hardware,
                                "weights, gradients and the 1/D share of the fp32 master weights and Adam states",
                                "use more GPUs or more data parallelism")


def applies(batch, model, hardware):
    """Stages with at least three layers (Calculon's rule): with fewer, the layers in flight are
    all of them and no weight memory is freed."""
    total = stage_layout(model, batch).total
    exists = np.stack([np.ones(len(batch), bool), batch.pp > 2, batch.pp > 1])  # first, middle, last
    return np.where(exists, total, np.inf).min(axis=0) >= 3


def megatron_args(options) -> list[str]:
    note = ("# weights and gradients stream from host memory per layer: DeepSpeed ZeRO-Infinity "
            '"offload_param": {"device": "cpu"} (Megatron-LM has no parameter offload)')
    if options.optimizer == "cpu":
        return ["--use-distributed-optimizer", "--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0", note]
    return [note, "# optimizer states stream through the GPU for the update (no Megatron-LM equivalent)"]


FEATURE = MemoryOptimizer(
    name="weight_offload",
    description="keep weights, gradients and the optimizer states in host memory (ZeRO-Infinity style): each "
                "layer's weights are fetched ahead of its forward and backward and its gradients sent back, "
                "Adam runs on the CPU or streams the states through the GPU",
    equation="HBM = (1+prefetch)·2P_ℓ + 2g·P_ℓ [+ 24P_ℓ/D]; host = (2+g)·P + 12P/D; "
             "E = max(α·c, β·max(H2D, D2H)) − c per layer and pass",
    options_type=WeightOffloadOptions,
    layer=layer,
    adds_time_only=True,  # only adds exposed transfers to a layer (≥ 0): never makes one faster
    optimizer=optimizer,
    memory=memory,
    applies=applies,
    megatron_args=megatron_args,
    after=("recompute", "memfine", "fp8", "kernel_scaling", "tp_overlap", "cp_overlap", "ep_overlap",
           "activation_offload"),
    conflicts=("cpu_optimizer", "distributed_optimizer", "fsdp", "deepspeed_zero", "dp_overlap"),
)


@hookimpl
def mofa_register_memory_optimizers():
    return [FEATURE]
