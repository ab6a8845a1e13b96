"""Faster kernels and faster collectives: paper eqs. [17] and [18].

[17] ``P' = β·P``: a better GEMM/attention implementation multiplies the compute throughput
of the layer's operators by β ≥ 1 (option ``compute_factor``), so every layer compute time
is divided by β: forward, backward-input, backward-weight, recompute and the per-group
times overlap features hide communication behind (TP GEMMs, attention, experts). No kernel
beats the peak: per layer and pass, β is capped at ``T·peak/FLOPs`` (the pass's FLOPs at the
peak of the format its GEMMs run in; backward: twice the forward's FLOPs), so MFU stays ≤ 1
whatever β is given.

[18] ``B' = γ·B``: a better collective algorithm multiplies the bandwidth by γ ≥ 1 (option
``bandwidth_factor``). **Choice**: the whole collective time is divided by γ, its latency
term included (the engine keeps one time per collective, not its α-β split), so this is
an upper bound on the gain for small, latency-bound messages. It applies to the layer's
TP/CP/EP communication (layer phase), the pipeline p2p τ (pipeline phase; the paper models
PP bandwidth enhancement the same way, via [3]) and the DP gradient/parameter collectives
(optimizer phase).

Scope: layer-level, as in the paper — the embedding and LM-head operators, the optimizer
update and host (PCIe) transfers are not scaled. The transform runs before the overlap
strategies (they must see the scaled times) and after ``fp8``, ``distributed_optimizer`` and ``cpu_optimizer``
(which re-price the kernels / DP collectives it scales). Memory is unchanged.
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.batch import PRECISIONS
from mofa_framework.engine import mfu_precision
from mofa_framework.types import CostTransform, option
from mofa_plugins._overlap import _at_least_one, opt

#: LayerCosts fields that are compute times (divided by β)
COMPUTE_FIELDS = ("fwd_compute_s", "bwd_input_s", "bwd_weight_s", "recompute_s", "tp_gemm_fwd_s", "tp_gemm_bwd_s",
                  "attn_fwd_s", "attn_bwd_s", "expert_fwd_s", "expert_bwd_s", "qkv_attn_fwd_s")
#: LayerCosts fields that are collective times, total and exposed (divided by γ)
COMM_FIELDS = ("tp_fwd_s", "tp_bwd_s", "cp_fwd_s", "cp_bwd_s", "ep_fwd_s", "ep_bwd_s",
               "tp_exposed_fwd_s", "tp_exposed_bwd_s", "cp_exposed_fwd_s", "cp_exposed_bwd_s",
               "ep_exposed_fwd_s", "ep_exposed_bwd_s")


@attrs.frozen(kw_only=True)
class KernelScalingOptions:
    compute_factor: float = option(1.0, validator=_at_least_one,
                                   doc="β ≥ 1 of [17]: layer compute throughput multiplier (times ÷ β)")
    bandwidth_factor: float = option(1.0, validator=_at_least_one,
                                     doc="γ ≥ 1 of [18]: collective bandwidth multiplier (collective times ÷ γ)")


def _capped(beta, seconds, flops, peak):
    """β, capped so that `seconds` / β still runs `flops` no faster than the peak: faster kernels
    cannot beat the tensor cores (``compute_factor = 10`` would otherwise give MFU > 1)."""
    room = np.divide(np.asarray(seconds, dtype=np.float64) * peak, flops, out=np.full(len(peak), np.inf),
                     where=np.asarray(flops) > 0)
    return np.clip(room, 1.0, beta)


def layer(state, rows):
    beta = opt(rows, "compute_factor", 1.0)
    gamma = opt(rows, "bandwidth_factor", 1.0)
    hw = state.ctx.hardware
    peaks = np.array([hw.peak_flops_per_s(p) for p in PRECISIONS])
    peak = peaks[mfu_precision(state.batch, hw, state.ctx.pm.registry)]

    def scale(c):
        # per pass: forward runs fwd_flops, backward twice that, recompute its own FLOPs
        b_fwd = _capped(beta, c.fwd_compute_s, c.fwd_flops, peak)
        b_bwd = _capped(beta, np.asarray(c.bwd_input_s) + c.bwd_weight_s, 2.0 * np.asarray(c.fwd_flops), peak)
        b_rec = _capped(beta, c.recompute_s, c.recompute_flops, peak)
        div = {f: b_bwd if ("bwd" in f) else b_rec if f == "recompute_s" else b_fwd for f in COMPUTE_FIELDS}
        kw = {f: np.asarray(getattr(c, f)) / div[f] for f in COMPUTE_FIELDS}
        kw.update({f: np.asarray(getattr(c, f)) / gamma for f in COMM_FIELDS})
        return attrs.evolve(c, **kw)

    return attrs.evolve(state, layers={k: scale(c) for k, c in state.layers.items()})


def pipeline(state, rows):
    gamma = opt(rows, "bandwidth_factor", 1.0)
    p = state.pipe
    return attrs.evolve(state, pipe=attrs.evolve(p, p2p_s=p.p2p_s / gamma, steady_p2p_s=p.steady_p2p_s / gamma))


def optimizer(state, rows):
    gamma = opt(rows, "bandwidth_factor", 1.0)
    o = state.opt
    return attrs.evolve(state, opt=attrs.evolve(o, dp_comm_s=o.dp_comm_s / gamma, dp_exposed_s=o.dp_exposed_s / gamma))


FEATURE = CostTransform(
    name="kernel_scaling",
    description="faster kernels (compute ÷ β) and collective algorithms (communication ÷ γ)",
    equation="[17] P' = β·P; [18] B' = γ·B",
    options_type=KernelScalingOptions,
    layer=layer, pipeline=pipeline, optimizer=optimizer,
    after=("fp8", "distributed_optimizer", "cpu_optimizer"),
    tunable=False,  # a what-if (faster kernels / collectives), not a choice made at launch
    may_reduce_compute=True,
    before=("tp_overlap", "cp_overlap", "ep_overlap", "pp_overlap", "dp_overlap", "activation_offload"),
)


@hookimpl
def mofa_register_cost_transforms():
    return [FEATURE]
