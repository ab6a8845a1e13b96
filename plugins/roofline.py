"""Operator latency from the paper's modified roofline (eqs. [1], [17], [19]).

``t = FLOPs / P`` with ``P = min(η·P_peak, η_m · I · BW_hbm)`` and ``I = FLOPs / bytes``.
GEMMs reach η_c of the peak of their numeric format (times ``fp8_gemm_relative_efficiency`` /
``fp4_gemm_relative_efficiency`` at fp8 / fp4),
scaled down for small GEMMs by
``F / (F + F_½)`` (times ``Π x/(x + d½)`` over the GEMM's m, n, k: ``gemm_half_dim``, and for k
``gemm_half_dim_k`` when that is set)
where ``F_½ = gemm_half_efficiency_s · P_peak`` and F is the FLOPs of *one*
GEMM (a grouped expert GEMM of ``count`` equal GEMMs sees each expert's size); fused attention reaches
``attention_efficiency`` of the bf16 peak at head dimension 128, scaled by
``r(d) = [d/(d + d½)] / [128/(128 + d½)]`` for head dimension d (``ops.gemm_k``; d½ =
``attention_half_head_dim``) and capped at the peak — both times ``hardware.compute_clock_scale`` when
the job's GPUs run below their rated power (``compute.power_limit_w``); element-wise kernels are
bandwidth bound. The
coefficients live in the hardware profile's ``[efficiency]`` table. Every operator that
does any work also pays ``kernel_launch_s`` per kernel it launches (``ops.kernels``), and takes at
least as long as the host needs to issue those kernels, ``kernels × host_dispatch_s`` (the CPU
thread that feeds the stream runs ahead of the GPU only while the GPU is the slower of the two:
an operator whose kernels finish faster than the host can dispatch them is host-bound).
"""

from __future__ import annotations

import numpy as np

from mofa_framework import hookimpl
from mofa_framework.batch import OP_KINDS, PRECISIONS


def operator_seconds(ops, hardware) -> np.ndarray:
    eff = hardware.efficiency
    peaks = np.array([hardware.peak_flops_per_s(p) for p in PRECISIONS])
    bf16 = hardware.peak_flops_per_s("bf16")
    bw = eff.memory_efficiency * hardware.hbm_bandwidth_bytes_per_s
    gemm = ops.kind == OP_KINDS.index("gemm")
    # a scan (Mamba-2's SSD) is priced as the fused attention that takes as long
    attention = (ops.kind == OP_KINDS.index("attention")) | (ops.kind == OP_KINDS.index("scan"))
    peak = np.where(gemm, peaks[ops.precision], bf16)
    half = eff.gemm_half_efficiency_s * peak
    one = ops.flops / np.maximum(ops.count, 1.0)  # FLOPs of one GEMM of a group
    # dimensions not ≫ a tile: Π x/(x + d½) over m and n (the output's tiles) and k (the
    # reduction loop, its own d½ when the profile sets one)
    dims = np.ones_like(np.asarray(one, dtype=np.float64))
    d_k = eff.gemm_half_dim_k or eff.gemm_half_dim
    for x, d in ((ops.gemm_m, eff.gemm_half_dim), (ops.gemm_n, eff.gemm_half_dim), (ops.gemm_k, d_k)):
        if d > 0:
            dims = dims * np.where(x > 0, x / (x + d), 1.0)
    # one GEMM takes its work at the dimension-limited rate plus a fixed cost of F½ of peak work,
    # t = (F/Π + F½)/(η·P): a larger GEMM never takes less time
    # (rows without FLOPs keep 1; with a zero F½ they would divide 0 by 0)
    size_eff = np.divide(dims * one, one + dims * half, out=np.ones_like(dims), where=ops.flops > 0)
    d, d_half = np.where(ops.gemm_k > 0, ops.gemm_k, 128.0), eff.attention_half_head_dim
    head = (d / (d + d_half)) / (128.0 / (128.0 + d_half))
    attn_eff = np.minimum(eff.attention_efficiency * head, 1.0)
    fp4 = "fp4" in hardware.compute.peak_tflops  # else fp4 falls back to a wider format's peak
    fp8 = "fp8" in hardware.compute.peak_tflops
    low = np.where(fp4 & (ops.precision == PRECISIONS.index("fp4")), eff.fp4_gemm_relative_efficiency,
                   np.where(fp8 & (ops.precision == PRECISIONS.index("fp8")), eff.fp8_gemm_relative_efficiency, 1.0))
    # tensor-core work runs at the clock the board's power limit allows (1 at its rated power)
    clock = hardware.compute_clock_scale
    rate = clock * np.where(gemm, eff.gemm_efficiency * low * size_eff * peak, np.where(attention, attn_eff * bf16, np.inf))
    compute_s = np.where(ops.flops > 0, ops.flops / rate, 0.0)
    memory_s = ops.bytes / bw
    works = (ops.flops > 0) | (ops.bytes > 0)
    launch = np.where(works, eff.kernel_launch_s * ops.kernels, 0.0)
    host = np.where(works, eff.host_dispatch_s * ops.kernels, 0.0)
    return np.maximum(np.maximum(compute_s, memory_s) + launch, host)


@hookimpl(trylast=True)
def mofa_operator_latency(ops, hardware):
    return operator_seconds(ops, hardware)
