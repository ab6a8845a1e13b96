"""GEMM latency from a profiled throughput table (paper eq. [1]: t = FLOPs / P_profiled).

When a hardware profile carries ``[[gemm_profile]]`` points (M, N, K, measured TFLOPS, dtype),
GEMM rows of a profiled dtype are priced by a **tile model fitted to that dtype's points**,
corrected towards the measurements near them:

*Tile model* (one GEMM of F = 2·m·n·k FLOPs)::

    t = F / R + t₀        R = R∞ · pad(m, n) · occ(m, n, k) · k / (k + k₀)

- ``pad = m·n / (⌈m/128⌉·⌈n/128⌉·128²)``: the output is cut into 128×128 tiles and a partial
  tile costs a whole one (tile quantisation);
- ``occ = u / (u + c·SMs)`` with ``u = tiles · max(k/256, 1)``: a GEMM with too few work units
  (tiles, split along k as cuBLAS's split-K / stream-K kernels do) leaves SMs idle — the
  smooth form of wave quantisation (``compute.sm_count``; without it occ = 1). Fitted to XLA's
  H100 and B200 tables c comes out ≈ 0: split-K / stream-K hide the waves of those kernels, and a
  hard ``tiles/(⌈tiles/SMs⌉·SMs)`` term fits them worse (17 % vs 8 % MAPE on H100 BF16);
- ``k/(k + k₀)``: the K loop's prologue and epilogue (loading the first tiles, writing the output);
- ``t₀``: launch and tail of one kernel.

R∞, k₀, t₀ and c are fitted per (profile, dtype) by least squares on ln(rate) over the table
(:func:`fit_tile_model`, numpy only, cached; it depends on the points alone, not on the datasheet
peak), so the model is what the table measured — between and beyond the points, in every dtype
of the table — but never faster than the fastest shape measured: past the table the rate
saturates there, not at the fitted asymptote R∞ (a one-point table is a MAMF measurement, the
best shape a search found: Gaudi 3's 1,243 TFLOPS, which the model through it would otherwise
raise to 1,413 at 16384³; B200's XLA table tops at 1,845, the model at 2,080). The operator's
time is then at least its bytes over η_m·BW_hbm (the roofline's memory term: thin GEMMs are
bandwidth bound) and its FLOPs over the format's dense peak (a relative efficiency above 1 never
lifts a table near the peak past it).

*Correction*: at a profiled shape the price is the measurement. The log ratio measured / model is
interpolated by inverse-distance weighting over the nearest points in (log2 m, log2 n, log2 k)
and faded out with distance to the nearest point (``exp(−d²/2)``, d in octaves), so far from
the table the tile model alone speaks.

A training run's GEMMs may not reach a microbenchmark's rate (a full node's sustained clocks
under its power and thermal limits, the framework's fused epilogues): the profile's
``profiled_gemm_relative_efficiency`` (default 1; `mofa calibrate` fits it with a prior at 1, the
one GEMM coefficient step times still set) multiplies the rate of every dtype alike, so the
ratio between dtypes stays the measured one — except what a microbenchmark of one GEMM cannot
see of low-precision training: Transformer Engine's per-tensor scaling (amax reductions, scale
updates), the transposed fp8 copies Hopper's TN-only fp8 GEMMs need, the higher power draw of fp8
tensor cores under a node's sustained power limit. ``fp8_gemm_relative_efficiency`` /
``fp4_gemm_relative_efficiency`` (default 1, fitted with a prior at 1 where fp8 / fp4 rows exist)
scale the fp8 / fp4 tables on top. A regime without step-time rows (bf16 on H100, where nearly
every published row is fp8) is therefore priced at its microbenchmarks, not at what fp8 rows left
over. Each kernel also pays the profile's ``kernel_launch_s`` (default 0: the gaps a training
framework leaves between kernels beyond the microbenchmark's back-to-back launches — the
small-GEMM floor step-time calibration may fit); a GPU run below its rated power
(``compute.power_limit_w``) reaches ``hardware.compute_clock_scale`` of the tables' rate; and an operator takes at least
``kernels × host_dispatch_s`` (the roofline's host floor).

fp16 and bf16 GEMMs run on the tensor cores at one rate: where a table has points of one and not
the other and the profile lists the same dense peak for both (every NVIDIA and AMD datasheet here),
the other is priced from them — an fp16 job on H100 runs at the bf16 table's rate, not at the
roofline's datasheet peak (790 against 659 TFLOPS at 8192³ before).

Every other operator, and GEMMs of a dtype the table lacks, fall through to the next provider
(the roofline). A profile without a table changes nothing.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from pathlib import Path

import numpy as np

from mofa_framework import hookimpl
from mofa_framework.batch import OP_KINDS, PRECISIONS, distinct_rows
from mofa_framework.config import toml_loads

NEIGHBOURS = 4
#: queries per block, to bound the (queries × points) distance matrix
BLOCK = 200_000
#: output tile edge of the tile model
TILE = 128.0
#: reduction length one split-K work unit covers
SPLIT_K = 256.0
#: a table needs this many shapes to fit k₀ and the occupancy term (else they take fixed values)
MIN_SHAPE_POINTS = 20
#: distance (octaves in log2 m, n, k) over which the correction towards a measurement fades
FADE_OCTAVES = 1.0


def interpolate_tflops(points: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """IDW (power 2) over the nearest `NEIGHBOURS` profiled shapes, in log2 space."""
    return _idw(points, values, query)[0]


def _idw(points: np.ndarray, values: np.ndarray, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(IDW of `values` at `query`, squared distance to the nearest point)."""
    out = np.empty(len(query))
    near = np.empty(len(query))
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
        near[lo:lo + BLOCK] = dn.min(axis=1)
    return out, near


# ====================================================================== the tile model


def tile_model_tflops(m, n, k, *, rate_tflops: float, k0: float, t0_s: float, occupancy: float,
                      sm_count: int) -> np.ndarray:
    """TFLOPS of one m×n×k GEMM under the tile model (module docstring), without the HBM floor."""
    m, n, k = (np.asarray(x, dtype=np.float64) for x in (m, n, k))
    tiles = np.ceil(m / TILE) * np.ceil(n / TILE)
    pad = m * n / (tiles * TILE * TILE)
    if sm_count > 0 and occupancy > 0:
        units = tiles * np.maximum(k / SPLIT_K, 1.0)
        occ = units / (units + occupancy * sm_count)
    else:
        occ = 1.0
    rate = rate_tflops * 1e12 * pad * occ * k / (k + k0)
    flops = 2.0 * m * n * k
    return flops / (flops / rate + t0_s) / 1e12


_K0 = np.concatenate([[0.0], np.geomspace(4.0, 4096.0, 16)])
_T0 = np.concatenate([[0.0], np.geomspace(2.5e-7, 3.2e-5, 15)])
_OCC = np.array([0.0, 0.02, 0.1, 0.5, 2.0])
#: R∞ relative to the fastest measured point
_RATE = np.geomspace(0.8, 2.5, 97)


#: the fits of the built-in profiles' tables, computed ahead (``python tests/test_gemm_fit_table.py``):
#: a process pricing a profiled GEMM reads its fit instead of spending ~0.1 s on the grid search
FIT_TABLE = Path(__file__).with_name("gemm_tile_fits.toml")


def fit_key(shapes: tuple[tuple[float, float, float, float], ...], sm_count: int) -> str:
    """What a fit depends on: the points, the SM count, the grids and the code of the fit and the
    model (a change to any of them makes a shipped fit miss, and the fit is then computed)."""
    h = hashlib.sha256(repr((shapes, sm_count, MIN_SHAPE_POINTS, TILE, SPLIT_K)).encode())
    for grid in (_K0, _T0, _OCC, _RATE):
        h.update(grid.tobytes())
    h.update(inspect.getsource(_grid_fit).encode())
    h.update(inspect.getsource(tile_model_tflops).encode())
    return h.hexdigest()


@functools.cache
def _shipped_fits() -> dict[str, dict[str, float]]:
    if not FIT_TABLE.is_file():
        return {}
    with FIT_TABLE.open("rb") as f:
        return {row["key"]: {k: float(row[k]) for k in ("rate_tflops", "k0", "t0_s", "occupancy")}
                for row in toml_loads(f.read().decode()).get("fit", [])}


@functools.lru_cache(maxsize=128)
def fit_tile_model(shapes: tuple[tuple[float, float, float, float], ...], sm_count: int) -> dict[str, float]:
    """The tile model's fit to the points (:func:`_grid_fit`), read from :data:`FIT_TABLE` when it
    holds one for exactly these inputs."""
    shipped = _shipped_fits().get(fit_key(shapes, sm_count))
    return dict(shipped) if shipped is not None else _grid_fit(shapes, sm_count)


def _grid_fit(shapes: tuple[tuple[float, float, float, float], ...], sm_count: int) -> dict[str, float]:
    """R∞ (TFLOPS), k₀, t₀, c of the tile model fitted to ``(m, n, k, tflops)`` points: least
    squares on ln(rate) over a grid of (k₀, t₀, c, R∞). It depends on the points alone (not on the
    profile's peak or bandwidth). A table of fewer than ``MIN_SHAPE_POINTS`` points does not
    constrain the shape terms (Azure's A100 table has 8 shapes, none with k < 768): it fits R∞ and
    t₀ only, with k₀ = 64 and c = 0 (what the 125-shape XLA tables give: k₀ 0-64, c ≈ 0); a
    one-point table fits R∞ alone (t₀ = 4 µs)."""
    data = np.array(shapes, dtype=np.float64)
    m, n, k, y = data.T
    if len(data) >= MIN_SHAPE_POINTS:
        grids = (_K0, _T0, _OCC)
    else:
        grids = (np.array([64.0]), _T0 if len(data) > 1 else np.array([4e-6]), np.array([0.0]))
    rates = _RATE * y.max()
    flops = 2.0 * m * n * k
    best = (np.inf, 0.0, 0.0, 0.0, 0.0)
    for k0 in grids[0]:
        for c in grids[2]:
            # the work term at R∞ = 1 TFLOPS; t = work/R∞ + t₀ for every R∞ and t₀ at once
            unit = flops / (tile_model_tflops(m, n, k, rate_tflops=1.0, k0=k0, t0_s=0.0, occupancy=c,
                                              sm_count=sm_count) * 1e12)
            for t0 in grids[1]:
                t = unit[None, :] / rates[:, None] + t0
                e = np.log(flops[None, :] / t / 1e12 / y[None, :])
                cost = (e * e).sum(axis=1)
                i = int(np.argmin(cost))
                if cost[i] < best[0]:
                    best = (float(cost[i]), float(rates[i]), float(k0), float(t0), float(c))
    _, rate, k0, t0, c = best
    return {"rate_tflops": rate, "k0": k0, "t0_s": t0, "occupancy": c}


# ====================================================================== the provider


def _distinct(m, n, k) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (m, n, k) rows (candidates repeat a handful of shapes, each priced once) and
    the index of each input's row among them (1-D sorts only: ``np.unique(axis=0)`` is 10× slower)."""
    table = np.stack([np.asarray(x, dtype=np.float64).ravel() for x in (m, n, k)], axis=1)
    first, back = distinct_rows(table)
    return table[first], back


def model_tflops(pts, hardware, m, n, k) -> np.ndarray:
    """The tile model fitted to `pts` (one dtype's points), corrected towards the measurements
    near (m, n, k); without the HBM floor."""
    sm = int(getattr(hardware.compute, "sm_count", 0))
    fit = fit_tile_model(tuple((float(p.m), float(p.n), float(p.k), float(p.tflops)) for p in pts), sm)
    points = np.log2(np.array([[p.m, p.n, p.k] for p in pts], dtype=np.float64))
    measured = np.array([p.tflops for p in pts], dtype=np.float64)
    resid = np.log(measured / tile_model_tflops(*np.exp2(points).T, **fit, sm_count=sm))
    shapes, back = _distinct(m, n, k)
    corr, near = _idw(points, resid, np.log2(shapes))
    fade = np.exp(-near / (2.0 * FADE_OCTAVES ** 2))
    rate = tile_model_tflops(*shapes.T, **fit, sm_count=sm) * np.exp(corr * fade)
    # never faster than the fastest shape measured: past the table the model saturates there, not
    # at its fitted asymptote (a one-point MAMF table measures the best shape a search found)
    rate = np.minimum(rate, measured.max())
    return rate[back.ravel()].reshape(np.shape(m))


#: 16-bit formats the tensor cores run at one rate: a table of either prices the other where the
#: profile measured only one and lists the same dense peak for both (NVIDIA and AMD datasheets do)
SAME_RATE = {"fp16": "bf16", "bf16": "fp16"}


#: id(table) -> (the table, its peaks, {precision: points}); the table held so its id stays its own
_BY_PRECISION: dict[int, tuple] = {}


def _tables_by_precision(table, hardware) -> dict[str, list]:
    """{precision: the table points that price it}: each dtype's own points, and for fp16 (bf16)
    without points of its own the other's, when the datasheet gives both the same dense peak."""
    peaks = dict(hardware.compute.peak_tflops)
    hit = _BY_PRECISION.get(id(table))
    if hit is not None and hit[0] is table and hit[1] == peaks:
        return hit[2]
    if len(_BY_PRECISION) > 64:
        _BY_PRECISION.clear()
    out = {}
    for dtype in PRECISIONS:
        pts = [p for p in table if p.dtype == dtype]
        twin = SAME_RATE.get(dtype)
        if not pts and twin and dtype in peaks and peaks.get(twin) == peaks[dtype]:
            pts = [p for p in table if p.dtype == twin]
        if pts:
            out[dtype] = pts
    _BY_PRECISION[id(table)] = (table, peaks, out)
    return out


def profiled_seconds(ops, hardware, default: np.ndarray) -> np.ndarray:
    table = hardware.gemm_profile
    if not table:
        return default
    eff = hardware.efficiency
    out = np.array(default, dtype=np.float64, copy=True)
    gemm = (ops.kind == OP_KINDS.index("gemm")) & (ops.flops > 0) & (ops.gemm_m > 0)
    tables = _tables_by_precision(table, hardware)
    for dtype, pts in tables.items():
        rows = gemm & (ops.precision == PRECISIONS.index(dtype))
        if not rows.any():
            continue
        # a grouped GEMM of `count` equal members: each runs at its own (m, n, k)'s rate
        rate = model_tflops(pts, hardware, ops.gemm_m[rows], ops.gemm_n[rows], ops.gemm_k[rows])
        low = {"fp8": eff.fp8_gemm_relative_efficiency, "fp4": eff.fp4_gemm_relative_efficiency}.get(dtype, 1.0)
        # the tables' rate at the clock the job's power limit allows (hardware.compute_clock_scale)
        clock = hardware.compute_clock_scale
        t = ops.flops[rows] / (rate * 1e12 * eff.profiled_gemm_relative_efficiency * low * clock)
        # never above the tensor cores' peak (a relative efficiency > 1 on a table near the peak)
        t = np.maximum(t, ops.flops[rows] / (hardware.peak_flops_per_s(dtype) * clock))
        # thin GEMMs are bound by HBM bandwidth (the roofline's memory term)
        t = np.maximum(t, ops.bytes[rows] / (eff.memory_efficiency * hardware.hbm_bandwidth_bytes_per_s))
        kernels = np.broadcast_to(ops.kernels, ops.flops.shape)[rows]
        out[rows] = np.maximum(t + eff.kernel_launch_s * kernels, eff.host_dispatch_s * kernels)
    return out


@hookimpl(wrapper=True)
def mofa_operator_latency(ops, hardware):
    default = yield
    return profiled_seconds(ops, hardware, default)
