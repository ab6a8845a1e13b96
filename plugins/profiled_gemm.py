"""GEMM latency from a profiled throughput table (paper eq. [1]: t = FLOPs / P_profiled).

When a hardware profile carries ``[[gemm_profile]]`` points (M, N, K, measured TFLOPS,
dtype), GEMM rows of that dtype are priced by interpolating the measured throughput in
log-shape space — inverse-distance weighting over the nearest points in
(log2 M, log2 N, log2 K), exact at a profiled shape — and every other operator falls
through to the next provider (the roofline). A profile without a table changes nothing.
"""

from __future__ import annotations

import numpy as np

from mofa_framework import hookimpl
from mofa_framework.batch import OP_KINDS, PRECISIONS

NEIGHBOURS = 4
#: queries per block, to bound the (queries × points) distance matrix
BLOCK = 200_000


def interpolate_tflops(points: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """IDW (power 2) over the nearest `NEIGHBOURS` profiled shapes, in log2 space."""
    out = np.empty(len(query))
    k = min(NEIGHBOURS, len(points))
    for lo in range(0, len(query), BLOCK):
        q = query[lo:lo + BLOCK]
        d2 = ((q[:, None, :] - points[None, :, :]) ** 2).sum(axis=2)
        idx = np.argpartition(d2, k - 1, axis=1)[:, :k] if k < len(points) else np.broadcast_to(
            np.arange(len(points)), (len(q), len(points)))
        dn = np.take_along_axis(d2, idx, axis=1)
        w = 1.0 / np.maximum(dn, 1e-12)
        exact = dn < 1e-12
        w = np.where(exact.any(axis=1, keepdims=True), exact.astype(float), w)
        out[lo:lo + BLOCK] = (w * values[idx]).sum(axis=1) / w.sum(axis=1)
    return out


def profiled_seconds(ops, hardware, default: np.ndarray) -> np.ndarray:
    table = hardware.gemm_profile
    if not table:
        return default
    out = np.array(default, dtype=np.float64, copy=True)
    gemm = (ops.kind == OP_KINDS.index("gemm")) & (ops.flops > 0) & (ops.gemm_m > 0)
    for dtype in {p.dtype for p in table}:
        pts = [p for p in table if p.dtype == dtype]
        rows = gemm & (ops.precision == PRECISIONS.index(dtype)) if dtype in PRECISIONS else np.zeros(len(ops), bool)
        if not rows.any():
            continue
        points = np.log2(np.array([[p.m, p.n, p.k] for p in pts], dtype=np.float64))
        values = np.array([p.tflops for p in pts], dtype=np.float64)
        q = np.log2(np.stack([ops.gemm_m[rows], ops.gemm_n[rows], ops.gemm_k[rows]], axis=1))
        out[rows] = ops.flops[rows] / (interpolate_tflops(points, values, q) * 1e12)
    return out


@hookimpl(wrapper=True)
def mofa_operator_latency(ops, hardware):
    default = yield
    return profiled_seconds(ops, hardware, default)
