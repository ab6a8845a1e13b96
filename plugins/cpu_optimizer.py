"""CPU optimizer (paper eqs. [27], [28]; ZeRO-Offload, Megatron-Core ``--optimizer-cpu-offload``).

The fp32 master weights and the Adam moments leave the GPU; the GPU keeps its bf16 weights
and gradients. Each step the gradients go device→host, the CPU runs Adam, and the new
parameters come back host→device.

[27] memory, per GPU (P = parameters this GPU updates: ``P_local/D`` with ``shard = true``,
``P_local`` otherwise)::

    M_gpu  = P_local·(2 + d_g)             (optimizer states: 0)
    M_host = P·(12 + d_g)                  (fp32 master + m + v, and the fp32 gradient copy)

[28] time, added to ``opt.host_s`` (the GPU update time becomes 0)::

    T_host = T_d2h + P / (R_cpu / G) + 2·P / BW_h2d,    T_d2h = P·d_g / BW_d2h

with R_cpu = ``hardware.host.cpu_optimizer_params_per_s`` (one node's CPUs, shared by its G
GPUs). With ``overlap = true`` the D2H copy runs during the backward pass and only
``max(0, β·T_d2h − α·T_bwd)`` stays exposed (T_bwd = the critical stage's backward time per
step, α/β the profile's contention coefficients).

**Choice** (``shard``, default true): like ZeRO-Offload and Megatron-Core's CPU offload (which
runs inside the distributed optimizer), each DP rank updates only its ``1/D`` shard, so DP
communication becomes reduce-scatter + all-gather as in [26]. That is why this feature
conflicts with ``distributed_optimizer``: it already includes its sharding. ``shard = false``
is the paper's literal reading (every DP rank updates all its parameters after an
all-reduce); at DP = 1 (the paper's Table 7 case) both readings agree.

Host memory must fit: ``M_host ≤ cpu_memory_gib / gpus_per_node`` per GPU, checked by a
candidate constraint (``mofa predict`` reports it, ``mofa tune`` prunes). The check covers
the optimizer's own host bytes, not other host users such as activation offload.
"""

from __future__ import annotations

import types

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.decompose import Geometry
from mofa_framework.engine import _dp_groups, _grad_bytes_per_param, _params_on_stages, stage_layout
from mofa_framework.types import ConstraintResult, MemoryOptimizer, option
from mofa_framework.units import GIB

from .distributed_optimizer import STATE_BYTES, dp_sizes, local_params, shard_fraction, sharded_dp_comm_s


@attrs.frozen(kw_only=True)
class CpuOptimizerOptions:
    overlap: bool = option(False, doc="copy gradients device→host during the backward pass "
                                      "(only what the backward cannot hide is exposed)")
    shard: bool = option(True, doc="each DP rank updates only its 1/D shard (ZeRO-Offload); false = "
                                   "all-reduce and update every local parameter")


def _updated_params(state, rows):
    p_dense, p_expert = local_params(state)
    d_dense, d_expert = dp_sizes(state)
    shard = rows.options["shard"] > 0.5
    return np.where(shard, p_dense / d_dense + p_expert / d_expert, p_dense + p_expert), shard


def optimizer(state, rows):
    hw, opt = state.ctx.hardware, state.opt
    gb = _grad_bytes_per_param(state.batch)
    params, shard = _updated_params(state, rows)
    t_d2h = params * gb / hw.d2h_bandwidth_bytes_per_s
    t_h2d = params * 2.0 / hw.h2d_bandwidth_bytes_per_s
    t_cpu = params / (hw.host.cpu_optimizer_params_per_s / hw.gpus_per_node)
    pipe = state.pipe
    t_bwd = pipe.m * pipe.v * (pipe.B + pipe.W)
    eff = hw.efficiency
    hidden = np.maximum(eff.contention_comm * t_d2h - eff.contention_compute * t_bwd, 0.0)
    d2h_exposed = np.where(rows.options["overlap"] > 0.5, hidden, t_d2h)
    comm = np.where(shard, sharded_dp_comm_s(state), opt.dp_comm_s)
    exposed = np.where(shard, comm, opt.dp_exposed_s)
    new = attrs.evolve(opt, dp_comm_s=comm, dp_exposed_s=exposed, update_s=np.zeros_like(opt.update_s),
                       host_s=opt.host_s + d2h_exposed + t_cpu + t_h2d)
    return attrs.evolve(state, opt=new)


def memory(state, rows):
    mem = state.mem
    d_dense, d_expert = dp_sizes(state)
    frac = shard_fraction(mem.dense_params, mem.expert_params, d_dense[None, :], d_expert[None, :])
    frac = np.where(rows.options["shard"][None, :] > 0.5, frac, 1.0)
    host = mem.host_bytes + (mem.optimizer_bytes + mem.grads_bytes) * frac
    return attrs.evolve(state, mem=attrs.evolve(mem, optimizer_bytes=np.zeros_like(mem.optimizer_bytes),
                                                host_bytes=host))


def params_per_rank(batch, model):
    """(P, P/D) per stage, arrays (3, N), from the batch alone (constraints see no engine state): the
    parameters each GPU holds, and its 1/D share (dense over DP×CP, experts over expert-DP)."""
    g = Geometry.of(batch)
    (d_size, _), (e_size, _) = _dp_groups(types.SimpleNamespace(geometry=g), batch)
    dense, expert = _params_on_stages(model, batch, stage_layout(model, batch))
    return dense + expert, dense / d_size + expert / e_size


def host_bytes_per_gpu(batch, model) -> np.ndarray:
    """The CPU optimizer's host bytes per GPU on the worst stage (as in [27])."""
    full, sharded = params_per_rank(batch, model)
    rows = batch.feature("cpu_optimizer")
    shard = rows.options.get("shard", np.ones(len(batch))) > 0.5
    per_rank = np.where(shard[None, :], sharded, full)
    return per_rank.max(axis=0) * (STATE_BYTES + _grad_bytes_per_param(batch))


def where_on(batch, rows, fn) -> np.ndarray:
    """``fn(batch)`` (one number per row) computed on the rows where the feature is on only, 0
    elsewhere: a tuner's leaves carry every feature choice, and the rows without it need nothing."""
    on = np.flatnonzero(rows.enabled)
    if len(on) == len(batch):
        return fn(batch)
    out = np.zeros(len(batch))
    if len(on):
        out[on] = fn(batch.take(on))
    return out


def host_memory_check(feature: str, rows, need, hardware, what: str, fix: str) -> ConstraintResult:
    """Rows where `feature` is on must fit `need` host bytes per GPU in the node's memory per GPU."""
    have = hardware.host.cpu_memory_gib * GIB / hardware.gpus_per_node
    worst = float(np.max(np.where(rows.enabled, need, 0.0))) / GIB
    return ConstraintResult(
        name=f"{feature}_host_memory", feasible=~rows.enabled | (need <= have),
        reason=(f"features.{feature} needs up to {worst:.1f} GiB of host memory per GPU ({what}) but {hardware.name} "
                f"has {have / GIB:.1f} GiB per GPU (host.cpu_memory_gib / gpus_per_node): {fix}"))


@hookimpl
def mofa_candidate_constraints(batch, model, hardware):
    rows = batch.feature("cpu_optimizer")
    if rows.enabled.any():
        yield host_memory_check("cpu_optimizer", rows, where_on(batch, rows, lambda b: host_bytes_per_gpu(b, model)),
                                hardware,
                                "fp32 master weights, Adam states and gradients",
                                "use more GPUs, shard = true, or the distributed optimizer")


def megatron_args(options) -> list[str]:
    """Megatron-Core runs its CPU offload inside the distributed optimizer (the sharded case)."""
    out = ["--use-distributed-optimizer"] if options.shard else []
    out += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0"]
    return out + (["--overlap-cpu-optimizer-d2h-h2d"] if options.overlap else [])


def from_megatron(args):
    """``--optimizer-cpu-offload`` (sharded when the distributed optimizer is on; overlapped with
    ``--overlap-cpu-optimizer-d2h-h2d``). MoFa offloads the whole update: a fraction below 1
    (``--optimizer-offload-fraction``) is read as 1."""
    if not args.has("--optimizer-cpu-offload"):
        return None
    args.number("--optimizer-offload-fraction", 1.0, float)
    return {"shard": args.has("--use-distributed-optimizer"), "overlap": args.has("--overlap-cpu-optimizer-d2h-h2d")}


FEATURE = MemoryOptimizer(
    name="cpu_optimizer",
    description="keep fp32 master weights and Adam states in host memory and run the update on the CPU "
                "(ZeRO-Offload / --optimizer-cpu-offload): D2H gradients, CPU Adam, H2D parameters",
    equation="[27],[28]",
    megatron_args=megatron_args,
    from_megatron=from_megatron,
    options_type=CpuOptimizerOptions,
    optimizer=optimizer,
    memory=memory,
    before=("dp_overlap",),
    conflicts=("distributed_optimizer",),
    lowers_memory=("optimizer_states",),  # to host memory (which it raises)
)


@hookimpl
def mofa_register_memory_optimizers():
    return [FEATURE]
