"""Megatron's distributed optimizer (paper eqs. [25], [26]; ZeRO-1).

Each data-parallel rank keeps and updates only ``1/D`` of the optimizer state, where D is
the size of the group the parameter's gradient is reduced over (``engine._dp_groups``):
DP×CP for dense parameters, the expert-DP size ``t·c·D/(e·etp)`` for expert parameters.

[25] memory, bytes per parameter held on a GPU (bf16 weights, fp32 gradients, Adam)::

    M = P·(2 + 4) + P·12/D          (18 → 6 + 12/D)

[26] time: the update touches ``P/D`` parameters, and the all-reduce of the gradients
becomes a reduce-scatter of the (fp32) gradients plus an all-gather of the updated bf16
parameters::

    T_opt = RS(P·d_g, D) + AG(P·2, D) + (P/D)·c_upd / BW

Both collectives are priced by the ``mofa_collective_latency`` provider
(``ctx.collective_s``). The exposed DP time is set to the whole DP time; a DP-overlap
feature (``dp_overlap``) runs after this one and hides part of it.

Option ``shard_gradients`` (ZeRO-2; Megatron-Core FSDP's ``optim_grads``, Llama 3's FSDP
without parameter resharding) also keeps only ``1/D`` of the fp32 gradient buffer: each
bucket is reduce-scattered and freed as it completes, so ``M = P·2 + P·(4 + 12)/D``; the
communication is unchanged.

With the ``fp8`` feature's ``fp8_params`` (Megatron ``--fp8-param-gather``) the parameters are
all-gathered in FP8: 1 byte per parameter instead of 2 (:func:`param_gather_bytes`).

Option ``grad_reduce_dtype`` (``fp32`` default: Megatron's fp32 main-grad buffer; ``bf16``:
Megatron-LM ``--grad-reduce-in-bf16``, NeMo's ``grad_sync_dtype = bf16``) sets the dtype of the
gradient buffer and of its reduce-scatter, d_g = 4 or 2 bytes per parameter: the reduce-scatter
moves half the bytes and the (sharded or not) gradient buffer is half the size. fp16 jobs keep
fp16 gradients (d_g = 2) either way.

Options ``exp_avg_dtype`` / ``exp_avg_sq_dtype`` / ``main_params_dtype`` (Megatron-Core's
precision-aware optimizer: ``--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype
bf16 [--main-params-dtype fp16]``, which Megatron-Bridge's DeepSeek and Qwen3-MoE recipes set;
DeepSeek-V3 kept its AdamW moments in BF16, arXiv 2412.19437 §3.3.3) store Adam's first and second
moments in b_m, b_v bytes (fp32 4, fp16/bf16 2, fp8 1) and the master weights in b_w (fp32 4, fp16
2). The state per parameter becomes ``b_w + b_m + b_v`` (12 → 8 with the moments in bf16), sharded
as above, and the update's HBM traffic drops by those tensors' read and write,
``2·(4 − b_w) + 2·(4 − b_m) + 2·(4 − b_v)`` of its 30 bytes per parameter
(``engine.ADAM_BYTES_PER_PARAM``). Its ``--main-grads-dtype bf16`` is ``grad_reduce_dtype = "bf16"``.
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.decompose import ALL_GATHER, REDUCE_SCATTER, Coll
from mofa_framework.engine import ADAM_BYTES_PER_PARAM, _dp_groups, _grad_bytes_per_param, dp_param_groups
from mofa_framework.types import EnvRequirement, MemoryOptimizer, option
from mofa_plugins.fp8 import fp8_param_rows

#: optimizer state bytes per parameter (fp32 master + Adam m + v)
STATE_BYTES = 12.0
#: bytes per parameter of the all-gathered bf16 weights, and of FP8 ones (``fp8`` with ``fp8_params``)
PARAM_BYTES = 2.0
FP8_PARAM_BYTES = 1.0
#: gradient-reduction dtypes: the main-grad dtype (fp32 for bf16 jobs) or bf16
GRAD_REDUCE_DTYPES = ("fp32", "bf16")
#: Adam moment dtypes (Megatron's ``--exp-avg-dtype`` / ``--exp-avg-sq-dtype``) and their bytes
MOMENT_DTYPES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0}
#: master-weight dtypes (``--main-params-dtype``) and their bytes
MASTER_DTYPES = {"fp32": 4.0, "fp16": 2.0}
#: the precision-aware optimizer's options and the Megatron-LM flags that set them (fp32 by default)
PRECISION_AWARE_FLAGS = {"main_params_dtype": "--main-params-dtype", "exp_avg_dtype": "--exp-avg-dtype",
                         "exp_avg_sq_dtype": "--exp-avg-sq-dtype"}


@attrs.frozen(kw_only=True)
class DistributedOptimizerOptions:
    shard_gradients: bool = option(False, search=(False, True),
                                   doc="also shard the fp32 gradient buffer over DP (ZeRO-2 / FSDP optim_grads)")
    grad_reduce_dtype: str = option("fp32", choices=GRAD_REDUCE_DTYPES,
                                    doc="dtype of the gradient buffer and its reduce-scatter (fp32 main grads, or "
                                        "bf16: half the bytes); fp16 jobs reduce fp16 either way")
    exp_avg_dtype: str = option("fp32", choices=tuple(MOMENT_DTYPES),
                                doc="dtype Adam's first moment is stored in (Megatron's precision-aware optimizer, "
                                    "--exp-avg-dtype)")
    exp_avg_sq_dtype: str = option("fp32", choices=tuple(MOMENT_DTYPES),
                                   doc="dtype Adam's second moment is stored in (--exp-avg-sq-dtype)")
    main_params_dtype: str = option("fp32", choices=tuple(MASTER_DTYPES),
                                    doc="dtype of the master weights the optimizer updates (--main-params-dtype)")


def state_tensor_bytes(rows) -> np.ndarray:
    """(3, N): bytes per parameter of the master weights, Adam's first and second moment per row
    (4 each where the feature is off)."""
    out = []
    for name, dtypes in (("main_params_dtype", MASTER_DTYPES), ("exp_avg_dtype", MOMENT_DTYPES),
                         ("exp_avg_sq_dtype", MOMENT_DTYPES)):
        table = np.array(list(dtypes.values()))
        out.append(np.where(rows.enabled, table[np.asarray(rows.options[name]).astype(int)], 4.0))
    return np.stack(out)


def state_scale(rows) -> np.ndarray:
    """Optimizer state bytes per parameter over fp32 Adam's 12: (b_w + b_m + b_v) / 12."""
    return state_tensor_bytes(rows).sum(axis=0) / STATE_BYTES


def update_scale(rows) -> np.ndarray:
    """The update's HBM bytes over fp32 Adam's 30: each state tensor is read and written in its bytes."""
    saved = 2.0 * (4.0 - state_tensor_bytes(rows)).sum(axis=0)
    return (ADAM_BYTES_PER_PARAM - saved) / ADAM_BYTES_PER_PARAM


def reduce_grad_bytes(batch) -> np.ndarray:
    """d_g per row as reduced: the main-grad bytes, or 2 where the distributed optimizer (or
    ``fsdp``) reduces gradients in bf16."""
    gb = _grad_bytes_per_param(batch)
    for name in ("distributed_optimizer", "fsdp"):
        rows = batch.feature(name)
        if "grad_reduce_dtype" in rows.options:
            gb = np.where(rows.enabled & rows.choice("grad_reduce_dtype", "bf16"), 2.0, gb)
    return gb


def param_gather_bytes(batch) -> np.ndarray:
    """Bytes per parameter of the all-gathered parameters: 2 (bf16), 1 where the weights are FP8
    tensors (``fp8`` with ``fp8_params``)."""
    return np.where(fp8_param_rows(batch), FP8_PARAM_BYTES, PARAM_BYTES)


def dp_sizes(state):
    """(D_dense, D_expert) as float arrays over the batch."""
    (d_size, _), (e_size, _) = _dp_groups(state.ctx, state.batch)
    n = len(state.batch)
    return (np.broadcast_to(np.asarray(d_size, dtype=np.float64), (n,)),
            np.broadcast_to(np.asarray(e_size, dtype=np.float64), (n,)))


def local_params(state):
    """(dense, expert) parameters on the busiest stage, recovered from the gradient bytes."""
    gb = _grad_bytes_per_param(state.batch)
    return state.opt.dense_grad_bytes / gb, state.opt.expert_grad_bytes / gb


def sharded_dp_comm_s(state) -> np.ndarray:
    """Reduce-scatter of the gradients + all-gather of the parameters (bf16, or FP8), dense and expert groups."""
    ctx, batch = state.ctx, state.batch
    gb, pb = reduce_grad_bytes(batch), param_gather_bytes(batch)
    total = np.zeros(len(batch))
    for label, params, size, stride in dp_param_groups(ctx, batch, *local_params(state)):
        rs = lambda b: Coll(name=f"dp_{label}_grad_rs", parallel="dp", kind=REDUCE_SCATTER,  # noqa: E731
                            bytes=params * b, group_size=size, stride=stride)
        ag = lambda b: Coll(name=f"dp_{label}_param_ag", parallel="dp", kind=ALL_GATHER,  # noqa: E731
                            bytes=params * b, group_size=size, stride=stride)
        # a group with nothing to reduce (no expert parameters) costs nothing, not a latency
        total = total + np.where(params > 0, _by_bytes(ctx, rs, gb) + _by_bytes(ctx, ag, pb), 0.0)
    return total


def _by_bytes(ctx, coll, per_param: np.ndarray) -> np.ndarray:
    """``ctx.collective_s(coll(b))`` for each row's bytes per parameter ``b``. The parameter counts and
    groups depend on the structure only, so each distinct ``b`` is priced once per structure in a
    tuning search; ``b`` itself comes from feature options (the gradient dtype, FP8 weights), which rows
    of one structure may not share."""
    out = np.zeros(len(per_param))
    for b in np.unique(per_param):
        out = np.where(per_param == b, ctx.collective_s(coll(float(b)), per_structure=True), out)
    return out


def shard_fraction(dense, expert, d_dense, d_expert):
    """(dense/D_d + expert/D_e) / (dense + expert): the share of the state one rank keeps."""
    tot = dense + expert
    return np.where(tot > 0, (dense / d_dense + expert / d_expert) / np.where(tot > 0, tot, 1.0), 1.0)


def optimizer(state, rows):
    p_dense, p_expert = local_params(state)
    d_dense, d_expert = dp_sizes(state)
    frac = shard_fraction(p_dense, p_expert, d_dense, d_expert)
    comm = sharded_dp_comm_s(state)
    opt = attrs.evolve(state.opt, dp_comm_s=comm, dp_exposed_s=comm,
                       update_s=state.opt.update_s * frac * update_scale(rows))
    return attrs.evolve(state, opt=opt)


def memory(state, rows):
    mem = state.mem
    d_dense, d_expert = dp_sizes(state)
    frac = shard_fraction(mem.dense_params, mem.expert_params, d_dense[None, :], d_expert[None, :])
    grads = mem.grads_bytes * (reduce_grad_bytes(state.batch) / _grad_bytes_per_param(state.batch))[None, :]
    grads = np.where(rows.options["shard_gradients"][None, :] > 0.5, grads * frac, grads)
    states = mem.optimizer_bytes * frac * state_scale(rows)[None, :]
    return attrs.evolve(state, mem=attrs.evolve(mem, optimizer_bytes=states, grads_bytes=grads))


#: Megatron-FSDP as current Megatron-LM starts it: ``--use-megatron-fsdp`` (``--use-custom-fsdp`` until
#: 2025-08, now deprecated) with the checkpoint format it asserts since 2026-04 ("Megatron-FSDP requires
#: the `fsdp_dtensor` checkpointing format", megatron/training/arguments.py)
MEGATRON_FSDP = ("--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor")
#: the environment Megatron-FSDP asserts ("FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset.",
#: megatron/training/arguments.py): a launch exporting 1 for tensor parallelism stops there
MEGATRON_FSDP_ENV = EnvRequirement(name="CUDA_DEVICE_MAX_CONNECTIONS", value="1", equal=False,
                                   reason="Megatron-FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset (validate_args)")


def megatron_args(options) -> list[str]:
    extra = ["--grad-reduce-in-bf16"] if options is not None and options.grad_reduce_dtype == "bf16" else []
    low = [(flag, getattr(options, name)) for name, flag in PRECISION_AWARE_FLAGS.items()
           if options is not None and getattr(options, name) != "fp32"]
    if low:
        extra += ["--use-precision-aware-optimizer", *(x for pair in low for x in pair)]
    if options is not None and options.shard_gradients:
        return [*MEGATRON_FSDP, "--data-parallel-sharding-strategy", "optim_grads", *extra]
    return ["--use-distributed-optimizer", *extra]


def _moment_args(args) -> dict:
    """The precision-aware optimizer's master-weight and moment dtypes, read only under
    ``--use-precision-aware-optimizer`` (Megatron ignores them without it); fp32 ones are left out."""
    if not args.has("--use-precision-aware-optimizer"):
        return {}
    got = {name: args.value(flag, "fp32") for name, flag in PRECISION_AWARE_FLAGS.items()}
    return {k: v for k, v in got.items() if v != "fp32"}


def from_megatron(args):
    """``--use-distributed-optimizer`` (ZeRO-1), or Megatron-FSDP with ``--data-parallel-sharding-strategy
    optim_grads`` (ZeRO-2: ``shard_gradients``); not with FSDP's ``optim_grads_params`` (the ``fsdp``
    feature) or the CPU optimizer (the ``cpu_optimizer`` feature, which shards by itself)."""
    dist = args.has("--use-distributed-optimizer")
    fsdp = args.has("--use-custom-fsdp") | args.has("--use-megatron-fsdp")
    args.has("--ckpt-format")  # Megatron-FSDP's checkpoint format (fsdp_dtensor): no cost to price
    strategy = args.value("--data-parallel-sharding-strategy", "optim_grads_params")
    # the gradient buffer in bf16: --grad-reduce-in-bf16, or the precision-aware optimizer's bf16 main grads
    bf16_main = args.has("--use-precision-aware-optimizer") and args.value("--main-grads-dtype", "fp32") == "bf16"
    dtype = "bf16" if args.has("--grad-reduce-in-bf16") or bf16_main else "fp32"
    if args.has("--optimizer-cpu-offload"):
        return None
    if fsdp:
        return {"shard_gradients": strategy == "optim_grads", "grad_reduce_dtype": dtype, **_moment_args(args)} if (
            strategy in ("optim", "optim_grads")) else None
    return {"grad_reduce_dtype": dtype, **_moment_args(args)} if dist else None


FEATURE = MemoryOptimizer(
    name="distributed_optimizer",
    description="shard fp32 master weights and Adam states over the data-parallel group (Megatron "
                "--use-distributed-optimizer, ZeRO-1): 18 → 6 + 12/D bytes per parameter; gradients are "
                "reduce-scattered and bf16 parameters all-gathered",
    equation="[25],[26]",
    megatron_args=megatron_args,
    # Megatron-FSDP (shard_gradients) asserts the environment; the distributed optimizer needs none
    megatron_env=lambda options: [MEGATRON_FSDP_ENV] if options is not None and options.shard_gradients else [],
    from_megatron=from_megatron,
    options_type=DistributedOptimizerOptions,
    optimizer=optimizer,
    memory=memory,
    before=("dp_overlap",),
    conflicts=("cpu_optimizer",),
    lowers_memory=("optimizer_states", "gradients"),  # sharded over DP; bf16 or sharded gradient buffers
    applies=lambda batch, model, hardware: (batch.dp * batch.cp > 1) | (
        (batch.tp * batch.cp * batch.dp > batch.ep * batch.etp) if model.is_moe else False),
)


@hookimpl
def mofa_register_memory_optimizers():
    return [FEATURE]
