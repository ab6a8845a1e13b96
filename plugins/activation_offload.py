"""Asynchronous activation offloading (paper eqs. [33]–[35]).

Each layer's saved activations S go device→host while the next layer runs its forward, and
come back host→device while the following layer (in backward order) runs its backward.
Per offloaded layer and micro-batch::

    [33] T_fwd' = max(α_d2h · S/BW_d2h, β · T_fwd)
    [34] T_bwd' = max(α_h2d · S/BW_h2d, β · T_bwd)

α (transfer) and β (compute) are the slow-downs each suffers while both run; by default the
hardware profile's contention coefficients (``contention_comm``, ``contention_compute``),
overridable by the options. The increase ``T' − T`` goes into the layer's
``offload_exposed_fwd_s`` / ``offload_exposed_bwd_s`` (the ``offload`` breakdown entry).

**Part of the layers** (a share q of the stage's activations, [35] below): Transformer Engine's
offload handler (``AsyncDoubleBufferGroupOffloadHandler``, what Megatron-Core's
``--cpu-offloading-num-layers N`` runs) spreads the N copies evenly over the stage's L layers — the
copy of the k-th offloaded layer must be done by layer ⌊L/N⌋·(k+1) (its ``layer_window_map``), so
each copy has a window of L/N layers' compute to hide behind, and the reloads mirror it in
backward. [33] over one window of w = 1/q layers — the copy slows the layer it starts beside by β,
as in [33], and may run on past the window's other w − 1 layers — per layer::

    T_fwd' = max(q · α_d2h · S/BW_d2h, (1 + q·(β − 1)) · T_fwd)        (and [34] alike)

which is [33] itself when every layer is offloaded (q = 1), hides a copy up to 1/q times longer
than one layer's compute when only some are, and never exposes more than q times [33]'s increase.

[35] memory: only the layers in flight stay on the GPU — ``resident_layers`` per model
chunk and micro-batch in flight (default 2: the layer computing and the one being copied).
With L_j layers on stage j, v chunks and a fraction f of layers offloaded, the share of a
stage's activations that leaves the GPU is::

    q_j = f · (1 − min(1, resident_layers·v / L_j))
    M_act' = (1 − q_j)·M_act,        M_host += q_j·M_act

The per-layer time uses the largest q of any stage (**choice**: layer costs are per layer kind, not
per stage, so every stage pays the same exposure; the stage with the most layers has the largest q
and, holding the most compute, is the one the step waits on — the first stage's q, the memory-critical
one, would price that stage's copies over too long a window when the end stages are lighter). The offloaded
bytes are whatever earlier features left in the saved activations (run after recompute,
memfine and fp8).

**Where it runs** (:func:`feasible`): the handler priced here is Megatron-Core's whole-layer CPU
offloading, which its ``TransformerConfig`` allows only at PP 1 and without activation
recomputation; a job asking for either is refused, and ``mofa tune`` never offers them (before
2026-11-30 it did: the best configurations of DeepSeek-V3 on 2,048 H800s and Kimi-K2 offloaded at
PP 2–4, which Megatron-Core refuses when it builds the model). The per-stage shares above are kept
general (a third party's offloading at PP > 1 may reuse them); at PP 1 the stage is the model.
Megatron-Core's per-module ``--fine-grained-activation-offloading`` (2026-01, with
``--activation-offload-fraction`` since 2026-07) runs at PP > 1 but offloads module inputs — for a
dense layer not the MLP's own activations — and is not priced here.
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.limits import MAX_FACTOR, MAX_LAYERS, between
from mofa_framework.types import ConstraintResult, MemoryOptimizer, option


@attrs.frozen(kw_only=True)
class ActivationOffloadOptions:
    fraction: float = option(1.0, validator=[attrs.validators.gt(0.0), attrs.validators.le(1.0)],
                             search=(0.25, 0.5, 1.0), doc="fraction of the layers whose activations are offloaded")
    resident_layers: int = option(2, validator=between(1, MAX_LAYERS, integer=True),
                                  doc="layers per chunk and micro-batch in flight that stay on the GPU")
    alpha_d2h: float = option(0.0, validator=between(0.0, MAX_FACTOR),
                              doc="α of [33]; 0 = the profile's contention_comm")
    alpha_h2d: float = option(0.0, validator=between(0.0, MAX_FACTOR),
                              doc="α of [34]; 0 = the profile's contention_comm")
    beta: float = option(0.0, validator=between(0.0, MAX_FACTOR),
                         doc="β of [33][34]; 0 = the profile's contention_compute")


def offloaded_share(state, rows) -> np.ndarray:
    """q_j of [35] per stage: array (3, N)."""
    lay = state.layout
    kept = rows.options["resident_layers"] * state.batch.vpp
    resident = np.minimum(1.0, kept[None, :] / np.maximum(lay.total, 1.0))
    return rows.options["fraction"][None, :] * (1.0 - resident)


def _coeff(value, default):
    return np.where(value > 0, value, default)


def layer(state, rows):
    hw = state.ctx.hardware
    eff = hw.efficiency
    a_d2h = _coeff(rows.options["alpha_d2h"], eff.contention_comm)
    a_h2d = _coeff(rows.options["alpha_h2d"], eff.contention_comm)
    beta = _coeff(rows.options["beta"], eff.contention_compute)
    q = offloaded_share(state, rows).max(axis=0)  # the stage with the most layers (see the docstring)
    slowed = 1.0 + q * (beta - 1.0)  # β on one layer of each window of 1/q (Transformer Engine's spread)
    out = {}
    for kind, c in state.layers.items():
        t_fwd = c.fwd_s
        t_bwd = c.bwd_input_total_s + c.bwd_weight_s
        t_d2h = c.act_saved_bytes / hw.d2h_bandwidth_bytes_per_s
        t_h2d = c.act_saved_bytes / hw.h2d_bandwidth_bytes_per_s
        # [33]/[34] over the window of 1/q layers each copy is spread across
        extra_f = np.maximum(q * a_d2h * t_d2h, slowed * t_fwd) - t_fwd
        extra_b = np.maximum(q * a_h2d * t_h2d, slowed * t_bwd) - t_bwd
        out[kind] = attrs.evolve(c, offload_exposed_fwd_s=c.offload_exposed_fwd_s + np.maximum(extra_f, 0.0),
                                 offload_exposed_bwd_s=c.offload_exposed_bwd_s + np.maximum(extra_b, 0.0))
    return attrs.evolve(state, layers=out)


def memory(state, rows):
    mem = state.mem
    q = offloaded_share(state, rows)
    moved = mem.activations_bytes * q
    return attrs.evolve(state, mem=attrs.evolve(mem, activations_bytes=mem.activations_bytes - moved,
                                                host_bytes=mem.host_bytes + moved))


def feasible(batch, rows) -> ConstraintResult:
    """Megatron-Core's whole-layer CPU offloading (the handler this prices) runs only without a
    pipeline and without activation recomputation: its ``TransformerConfig`` raises "Currently there
    is no support for Pipeline parallelism with CPU offloading" and "CPU offloading does not work when
    activation recomputation is enabled" when the model is built, after the arguments have passed."""
    recompute = np.asarray(batch.feature("recompute").enabled, bool)
    ok = ~np.asarray(rows.enabled, bool) | ((np.asarray(batch.pp) == 1) & ~recompute)
    return ConstraintResult(
        name="cpu_offloading", feasible=ok,
        reason="features.activation_offload is Megatron-Core's whole-layer CPU offloading, which runs only at "
               "parallel.pp = 1 and without features.recompute (its TransformerConfig refuses either when the "
               "model is built): use pp = 1 and drop recompute, or drop activation_offload")


def offloaded_layers(fraction: float, layers: int) -> int:
    """Megatron-Core's ``--cpu-offloading-num-layers`` for offloading `fraction` of a rank's `layers`:
    at least one, at most all but the last (its ``TransformerConfig`` requires N < num_layers)."""
    return int(min(max(round(fraction * layers), 1), max(layers - 1, 1)))


def megatron_args(options, context) -> list[str]:
    """``--cpu-offloading-num-layers N`` (N of :func:`offloaded_layers` over the model's layers: the
    feature runs only at PP 1, :func:`feasible`). Megatron-LM has no ``--cpu-offloading`` flag: N > 0
    turns ``cpu_offloading`` on (``megatron/training/arguments.py``, since 2025-10; the config field
    has no argument of its own), so the flag would stop the run at argument parsing."""
    return ["--cpu-offloading-num-layers", str(offloaded_layers(options.fraction, context.model.num_layers))]


def from_megatron(args):
    """``--cpu-offloading-num-layers N`` (N > 0) offloads N of the ``--num-layers`` (PP 1, as
    Megatron-Core requires), read as that fraction; N = 0 (Megatron's default) offloads nothing and
    the feature is off. A ``--cpu-offloading`` beside it (NeMo's config name; no Megatron-LM flag) is
    read as understood and changes nothing. Without ``--num-layers`` (the model named otherwise) N is
    read as all but the last layer (fraction 1)."""
    args.has("--cpu-offloading")
    n = args.number("--cpu-offloading-num-layers", 0)
    if n <= 0:
        return None
    layers = args.number("--num-layers", 0)
    return {"fraction": min(1.0, n / layers)} if layers else {}


FEATURE = MemoryOptimizer(
    name="activation_offload",
    description="asynchronously offload each layer's activations to host memory during the next layer's "
                "forward and prefetch them during backward",
    equation="[33]-[35]",
    megatron_args=megatron_args,
    from_megatron=from_megatron,
    options_type=ActivationOffloadOptions,
    layer=layer,
    adds_time_only=True,  # trades time for memory: never makes a layer faster
    memory=memory,
    feasible=feasible,
    after=("recompute", "memfine", "fp8", "kernel_scaling", "tp_overlap", "cp_overlap", "ep_overlap"),
)


@hookimpl
def mofa_register_memory_optimizers():
    return [FEATURE]
