"""Fused-attention latency from a profiled kernel table (``[[attention_profile]]``).

When a hardware profile carries ``[[attention_profile]]`` points (head dimension, sequence length,
causal, dtype, pass, TFLOPS counting the FLOPs the causal mask keeps), fused-attention operators
are priced from them instead of the roofline's ``attention_efficiency``:

- the operator is a causal decoder's self-attention (``ops.gemm_n`` keys per query on average,
  half the sequence for a full causal mask: ``seq = 2·n``; ``ops.gemm_k`` the head dimension);
  causal points are used when the table has them, else the non-causal ones (a causal kernel skips
  the masked tiles, so its rate per kept FLOP is close to the full square's; the table says which
  it measured);
- the rate at (d, s) is the inverse-distance-weighted mean over the points in (log2 d, log2 s),
  each point's rate moved to the query's head dimension by the roofline's head-dimension law
  ``r(d) = d/(d + d½)`` (``attention_half_head_dim``; FlashAttention-3's d = 64 / 128 / 256 ratios):
  a table measured at one head dimension prices the others, and at a profiled point the price is
  the measurement;
- the engine prices an operator's backward as ``ATTENTION_BWD_FACTOR`` (2.5) × its forward time,
  so with both passes in the table the forward is priced at the pass-weighted time
  ``(F/R_fwd + 2.5·F/R_bwd) / 3.5`` — the forward + backward total is the measured one; with one
  pass only, that pass's rate serves both;
- ``profiled_attention_relative_efficiency`` (default 1) scales the table: the kernel a framework
  runs (cuDNN's fused attention in Transformer Engine, FlashAttention-3) may be another than the
  one profiled (FlashAttention-2 in the shipped tables); `mofa calibrate` fits it with a prior at 1;
- a GPU run below its rated power (``compute.power_limit_w``) runs the kernel at
  ``hardware.compute_clock_scale`` of the table's rate.

A profile without the table, or an operator whose dtype the table lacks, falls through to the
next provider.
"""

from __future__ import annotations

import numpy as np

from mofa_framework import hookimpl
from mofa_framework.batch import ATTENTION_KERNELS, OP_KINDS, PRECISIONS
from mofa_framework.decompose import ATTENTION_BWD_FACTOR

from ._attention_kernels import multiplier, resolve


def _head_law(d, d_half: float):
    d = np.asarray(d, dtype=np.float64)
    return d / (d + d_half) if d_half > 0 else np.ones_like(d)


def pass_tflops(points, head_dim, seq_len, d_half: float) -> np.ndarray:
    """IDW (power 2, in log2 head dim and log2 sequence) of the points' rates, each moved to the
    query's head dimension by ``r(d)``; exact at a profiled (d, s)."""
    pd = np.array([p.head_dim for p in points], dtype=np.float64)
    ps = np.array([p.seq_len for p in points], dtype=np.float64)
    pr = np.array([p.tflops for p in points], dtype=np.float64)
    d = np.asarray(head_dim, dtype=np.float64)[:, None]
    s = np.asarray(seq_len, dtype=np.float64)[:, None]
    moved = pr[None, :] * _head_law(d, d_half) / _head_law(pd[None, :], d_half)
    d2 = (np.log2(d) - np.log2(pd[None, :])) ** 2 + (np.log2(s) - np.log2(ps[None, :])) ** 2
    w = 1.0 / np.maximum(d2, 1e-12)
    exact = d2 < 1e-12
    w = np.where(exact.any(axis=1, keepdims=True), exact.astype(float), w)
    return (w * moved).sum(axis=1) / w.sum(axis=1)


def attention_seconds(ops, hardware, default: np.ndarray) -> np.ndarray:
    table = hardware.attention_profile
    if not table:
        return default
    eff = hardware.efficiency
    out = np.array(default, dtype=np.float64, copy=True)
    att = (ops.kind == OP_KINDS.index("attention")) & (ops.flops > 0) & (ops.gemm_k > 0) & (ops.gemm_n > 0)
    for dtype in sorted({p.dtype for p in table} & set(PRECISIONS)):
        # attention runs in bf16 whatever the GEMMs' format (Transformer Engine keeps it there):
        # the bf16 points price fp8 / fp4 rows too
        rows = att & ((ops.precision == PRECISIONS.index(dtype)) | (dtype == "bf16"))
        pts = [p for p in table if p.dtype == dtype]
        causal = [p for p in pts if p.causal] or pts
        if not rows.any():
            continue
        d, s = ops.gemm_k[rows], 2.0 * ops.gemm_n[rows]
        rate = {}
        for direction in ("fwd", "bwd"):
            these = [p for p in causal if p.direction == direction]
            if these:
                rate[direction] = pass_tflops(these, d, s, eff.attention_half_head_dim) * 1e12
        fwd, bwd = rate.get("fwd", rate.get("bwd")), rate.get("bwd", rate.get("fwd"))
        fwd, bwd = (r * kernel_multiplier(ops, rows, causal, hardware, direction, d, s)
                    for r, direction in ((fwd, "fwd"), (bwd, "bwd")))
        flops = ops.flops[rows]
        t = (flops / fwd + ATTENTION_BWD_FACTOR * flops / bwd) / (1.0 + ATTENTION_BWD_FACTOR)
        clock = hardware.compute_clock_scale  # the clock the job's power limit allows (1 at rated power)
        t = t / (eff.profiled_attention_relative_efficiency * clock)
        t = np.maximum(t, flops / (hardware.peak_flops_per_s("bf16") * clock))  # never above the tensor cores' peak
        kernels = np.broadcast_to(ops.kernels, ops.flops.shape)[rows]
        out[rows] = np.maximum(t + eff.kernel_launch_s * kernels, eff.host_dispatch_s * kernels)
        att = att & ~rows
    return out


def kernel_multiplier(ops, rows, points, hardware, direction: str, d, s) -> np.ndarray:
    """The job's kernel against the profiled FlashAttention-2 points, at the operator's sequence and
    causal mask (:func:`mofa_plugins._attention_kernels.multiplier`): a table measured at one sequence
    takes the published shape from there; a table of several sequences keeps its own."""
    codes = resolve(np.broadcast_to(ops.attention_kernel, ops.flops.shape)[rows], hardware.compute.architecture)
    seqs = {p.seq_len for p in points}
    s_ref = float(next(iter(seqs))) if len(seqs) == 1 else s
    return multiplier(codes, hardware.compute.architecture, direction, d, s, s_ref, all(p.causal for p in points))


def scan_seconds(ops, hardware, default: np.ndarray) -> np.ndarray:
    """Scans (Mamba-2's SSD, ``OP_KINDS`` "scan") at the profiled FlashAttention-2 rate of their
    attention-equivalent work (``ops.flops`` at ``2·gemm_n`` keys, head dimension ``gemm_k``): the
    published crossover is against FlashAttention-2, so neither the job's attention kernel nor
    ``profiled_attention_relative_efficiency`` applies; never faster than their bytes."""
    table = hardware.attention_profile
    rows = (ops.kind == OP_KINDS.index("scan")) & (ops.flops > 0) & (ops.gemm_k > 0) & (ops.gemm_n > 0)
    if not table or not rows.any():
        return default
    eff = hardware.efficiency
    pts = [p for p in table if p.dtype == "bf16"] or list(table)
    causal = [p for p in pts if p.causal] or pts
    d, s = ops.gemm_k[rows], 2.0 * ops.gemm_n[rows]
    fa2 = np.full(len(d), ATTENTION_KERNELS.index("fa2"))
    rate = {}
    for direction in ("fwd", "bwd"):
        these = [p for p in causal if p.direction == direction]
        if these:
            seqs = {p.seq_len for p in these}
            s_ref = float(next(iter(seqs))) if len(seqs) == 1 else s
            rate[direction] = (pass_tflops(these, d, s, eff.attention_half_head_dim) * 1e12
                               * multiplier(fa2, hardware.compute.architecture, direction, d, s, s_ref,
                                            all(p.causal for p in these)))
    fwd, bwd = rate.get("fwd", rate.get("bwd")), rate.get("bwd", rate.get("fwd"))
    flops = ops.flops[rows]
    t = (flops / fwd + ATTENTION_BWD_FACTOR * flops / bwd) / (1.0 + ATTENTION_BWD_FACTOR) / hardware.compute_clock_scale
    t = np.maximum(t, ops.bytes[rows] / (eff.memory_efficiency * hardware.hbm_bandwidth_bytes_per_s))
    kernels = np.broadcast_to(ops.kernels, ops.flops.shape)[rows]
    out = np.array(default, dtype=np.float64, copy=True)
    out[rows] = np.maximum(t + eff.kernel_launch_s * kernels, eff.host_dispatch_s * kernels)
    return out


@hookimpl(wrapper=True)
def mofa_operator_latency(ops, hardware):
    default = yield
    return scan_seconds(ops, hardware, attention_seconds(ops, hardware, default))
