"""The profiled-table provider: measured GEMM throughput interpolated by shape."""

import attrs
import numpy as np
import pytest

from mofa_framework.batch import OP_KINDS, PRECISIONS, OperatorBatch
from mofa_framework.config import jobs_to_batch
from mofa_framework.types import GemmPoint
from mofa_plugins.profiled_gemm import fit_tile_model, interpolate_tflops, model_tflops, profiled_seconds, tile_model_tflops

GEMM = OP_KINDS.index("gemm")
BF16 = PRECISIONS.index("bf16")


def ops(m, n, k, kind=GEMM, precision=BF16):
    m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
    return OperatorBatch(flops=2 * m * n * k, bytes=2 * (m * k + k * n + m * n), kind=np.full(len(m), kind),
                         precision=np.full(len(m), precision), gemm_m=m, gemm_n=n, gemm_k=k)


def test_exact_at_profiled_shapes_and_between_neighbours():
    pts = np.log2(np.array([[1024, 1024, 1024], [8192, 8192, 8192]], dtype=float))
    vals = np.array([300.0, 700.0])
    q = np.log2(np.array([[1024, 1024, 1024], [8192, 8192, 8192], [2896, 2896, 2896]], dtype=float))
    out = interpolate_tflops(pts, vals, q)
    assert out[0] == 300.0 and out[1] == 700.0
    assert 300.0 < out[2] < 700.0
    # the geometric midpoint is equidistant in log space: the mean
    mid = interpolate_tflops(pts, vals, np.log2(np.array([[2**11.5, 2**11.5, 2**11.5]])))
    assert mid[0] == pytest.approx(500.0)


def test_provider_prices_gemms_from_table_and_leaves_others(mofa_predictor):
    hw = mofa_predictor.registry.hardware_profile("h100-sxm5-80gb")
    # the microbenchmark's rate itself (no training-run factor)
    hw = attrs.evolve(hw, gemm_profile=(GemmPoint(m=4096, n=4096, k=4096, tflops=600.0),),
                      efficiency=attrs.evolve(hw.efficiency, profiled_gemm_relative_efficiency=1.0, kernel_launch_s=0.0,
                                              host_dispatch_s=0.0))
    o = ops([4096, 4096], [4096, 4096], [4096, 4096])
    o = attrs.evolve(o, kind=np.array([GEMM, OP_KINDS.index("elementwise")]))
    default = np.array([1.0, 2.0])
    t = profiled_seconds(o, hw, default)
    assert t[0] == pytest.approx(2 * 4096**3 / 600e12)
    assert t[1] == 2.0
    # a profile without a table changes nothing
    bare = attrs.evolve(hw, gemm_profile=())
    assert profiled_seconds(o, bare, default) is default


def test_table_in_a_profile_changes_the_prediction(mofa_predictor):
    from mofa_framework.decompose import GEMM, Geometry, layer_operators

    job = mofa_predictor.job({"model": {"name": "llama3-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 8},
                              "parallel": {"tp": 8, "global_batch_size": 8, "sequence_length": 4096}})
    batch = jobs_to_batch([job], mofa_predictor.registry)
    ops = layer_operators(job.model, Geometry.of(batch), "dense")
    shapes = {(float(np.asarray(o.m).ravel()[0]), float(np.asarray(o.n).ravel()[0]), float(np.asarray(o.k).ravel()[0]))
              for o in ops if np.all(np.asarray(o.kind) == GEMM)}
    # a table measured at exactly the layer's GEMM shapes, 100 TFLOPS each
    flat = attrs.evolve(job.hardware, gemm_profile=tuple(
        GemmPoint(m=int(m), n=int(n), k=int(k), tflops=100.0) for m, n, k in shapes),
        efficiency=attrs.evolve(job.hardware.efficiency, profiled_gemm_relative_efficiency=1.0, kernel_launch_s=0.0,
                                host_dispatch_s=0.0))
    pred = mofa_predictor.evaluate(batch, job.model, flat)
    # every GEMM now runs at exactly 100 TFLOPS: a layer's weight-gradient time is its GEMM FLOPs / 1e14
    gemm_flops = sum(float(np.asarray(o.flops)[0]) for o in ops if np.all(np.asarray(o.kind) == GEMM))
    assert pred.state.layers["dense"].bwd_weight_s[0] == pytest.approx(gemm_flops / 100e12, rel=1e-9)


# ====================================================================== the tile model


def test_tile_model_by_hand():
    """t = F/R + t₀, R = R∞·pad·occ·k/(k + k₀) (plugins/profiled_gemm.py docstring), by hand:
    m = 200, n = 256, k = 512: tiles ⌈200/128⌉·⌈256/128⌉ = 4, pad = 200·256/(4·128²) = 0.78125;
    occupancy units 4·512/256 = 8, occ = 8/(8 + 0.5·10) = 8/13; k/(k + k₀) = 512/(512 + 512) = 0.5.
    R = 100 TFLOPS · 0.78125 · 8/13 · 0.5 = 24.0385 TFLOPS; F = 2·200·256·512 = 52,428,800;
    t = F/R + 1 µs = 2.18104 µs + 1 µs = 3.18104 µs; rate = F / t = 16.4817 TFLOPS."""
    r = tile_model_tflops([200], [256], [512], rate_tflops=100.0, k0=512.0, t0_s=1e-6, occupancy=0.5, sm_count=10)
    R = 100e12 * 0.78125 * (8 / 13) * 0.5
    F = 2 * 200 * 256 * 512
    assert r[0] == pytest.approx(F / (F / R + 1e-6) / 1e12, rel=1e-12)
    assert r[0] == pytest.approx(16.4817, rel=1e-4)
    # no SM count: no occupancy term
    r0 = tile_model_tflops([200], [256], [512], rate_tflops=100.0, k0=512.0, t0_s=0.0, occupancy=0.5, sm_count=0)
    assert r0[0] == pytest.approx(100 * 0.78125 * 0.5, rel=1e-12)


def test_fit_recovers_a_tile_model_it_generated():
    truth = dict(rate_tflops=800.0, k0=64.0, t0_s=4e-6, occupancy=0.0)
    grid = [(m, n, k) for m in (256, 1024, 4096) for n in (256, 1024, 4096) for k in (256, 1024, 4096)]
    y = tile_model_tflops(*np.array(grid, float).T, **truth, sm_count=132)
    fit = fit_tile_model(tuple((m, n, k, t) for (m, n, k), t in zip(grid, y)), 132)
    pred = tile_model_tflops(*np.array(grid, float).T, **fit, sm_count=132)
    assert np.max(np.abs(pred / y - 1)) < 0.03
    assert fit["rate_tflops"] == pytest.approx(800.0, rel=0.03)


def test_table_is_exact_at_its_points_and_the_model_beyond(mofa_predictor):
    """The shipped H100 table: exact at a measured shape; far beyond the table the tile model
    alone (no correction), never above the fastest measured shape, and the large-GEMM rate is
    the microbenchmarks' ~0.78-0.80 of the 989 TFLOPS bf16 peak (XLA 4096³: 780; MAMF best
    shape: 794.5)."""
    hw = mofa_predictor.registry.hardware_profile("h100-sxm5-80gb")
    pts = [p for p in hw.gemm_profile if p.dtype == "bf16"]
    p = pts[7]
    assert model_tflops(pts, hw, [p.m], [p.n], [p.k])[0] == pytest.approx(p.tflops, rel=1e-9)
    fit = fit_tile_model(tuple((float(q.m), float(q.n), float(q.k), float(q.tflops)) for q in pts), hw.compute.sm_count)
    far = model_tflops(pts, hw, [65536], [65536], [65536])[0]
    tile = tile_model_tflops([65536], [65536], [65536], **fit, sm_count=hw.compute.sm_count)[0]
    assert far == pytest.approx(min(tile, max(q.tflops for q in pts)), rel=1e-6)
    big = model_tflops(pts, hw, [8192], [13312], [16384])[0]  # Llama 3 405B's gate/up GEMM at TP 8
    assert 0.74 * 989 < big < 0.82 * 989
    # fp8 reaches a smaller fraction of its (2x) peak than bf16 does of its own (cuBLASLt 16384³: 1377/1979)
    f8 = [q for q in hw.gemm_profile if q.dtype == "fp8"]
    assert model_tflops(f8, hw, [8192], [13312], [16384])[0] / 1979 < big / 989


def test_never_faster_than_the_fastest_measured_shape(mofa_predictor):
    """A one-point table is a MAMF measurement: the best shape a search over shapes found (Gaudi 3:
    1,243 TFLOPS bf16 at 16384×4096×768). The tile model fitted through it rises towards its
    asymptote with k (k/(k + 64): 1,413 TFLOPS at 16384³ before the cap); priced, no shape exceeds
    the measured best, and shapes the model puts below it keep the model's rate."""
    hw = mofa_predictor.registry.hardware_profile("gaudi3")
    pts = [p for p in hw.gemm_profile if p.dtype == "bf16"]
    assert len(pts) == 1 and pts[0].tflops == 1243.0
    rates = model_tflops(pts, hw, [16384, 8192, 65536, 2048], [16384, 8192, 65536, 2048], [16384, 8192, 65536, 2048])
    assert list(rates[:3]) == [1243.0, 1243.0, 1243.0]
    assert rates[3] < 1243.0
    for name in ("h100-sxm5-80gb", "b200-sxm-180gb", "gb200-nvl72", "mi300x"):
        hw = mofa_predictor.registry.hardware_profile(name)
        for dtype in {p.dtype for p in hw.gemm_profile}:
            pts = [p for p in hw.gemm_profile if p.dtype == dtype]
            dims = np.array([256.0, 1024, 4096, 16384, 65536])
            m, n, k = (a.ravel() for a in np.meshgrid(dims, dims, dims))
            assert model_tflops(pts, hw, m, n, k).max() <= max(p.tflops for p in pts), (name, dtype)


def test_repeated_shapes_are_priced_once_and_alike(mofa_predictor):
    """Pricing distinct shapes once (the candidates' GEMMs repeat) changes no number: a batch of
    repeated and interleaved shapes gets, row by row, what each shape gets alone."""
    hw = mofa_predictor.registry.hardware_profile("h100-sxm5-80gb")
    pts = [p for p in hw.gemm_profile if p.dtype == "bf16"]
    m, n, k = [4096, 512, 4096, 8192, 512], [1024, 2048, 1024, 1024, 2048], [4096, 256, 4096, 4096, 256]
    together = model_tflops(pts, hw, m, n, k)
    alone = [model_tflops(pts, hw, [a], [b], [c])[0] for a, b, c in zip(m, n, k)]
    assert together == pytest.approx(alone, rel=1e-12)
    assert together[0] == together[2] and together[1] == together[4] and together[0] != together[3]


def test_no_table_point_is_above_the_dense_peak(mofa_predictor):
    for hw in mofa_predictor.registry.hardware.values():
        for p in hw.gemm_profile:
            assert p.tflops <= hw.compute.peak_tflops.get(p.dtype, hw.compute.peak_tflops["bf16"]), (hw.name, p)


def test_a_relative_efficiency_above_one_never_lifts_a_gemm_past_the_peak(mofa_predictor):
    """Gaudi 2's one bf16 point reads 418.7 TFLOPS at 14336×15360×2048, 0.969 of its 432 TFLOPS
    peak. With ``profiled_gemm_relative_efficiency = 1.1`` (the top of `mofa calibrate`'s range)
    the table would price that shape at 460.6 TFLOPS, 1.066 × the peak; the provider holds it at
    the peak: its 2·14336·15360·2048 = 9.019e11 FLOPs take 9.019e11 / 432e12 = 2.088 ms, not 1.958."""
    hw = mofa_predictor.registry.hardware_profile("gaudi2")
    best = max((q for q in hw.gemm_profile if q.dtype == "bf16"), key=lambda q: q.tflops)
    assert best.tflops / hw.compute.peak_tflops["bf16"] > 1 / 1.1
    fast = attrs.evolve(hw, efficiency=attrs.evolve(hw.efficiency, profiled_gemm_relative_efficiency=1.1))
    o = ops([best.m], [best.n], [best.k])
    t = profiled_seconds(o, fast, np.zeros(1))[0]
    assert t == pytest.approx(2.088e-3, rel=1e-3)
    assert t == pytest.approx(2.0 * best.m * best.n * best.k / (hw.compute.peak_tflops["bf16"] * 1e12), rel=1e-12)


def test_fp8_factor_scales_only_fp8_gemms(mofa_predictor):
    hw = mofa_predictor.registry.hardware_profile("h100-sxm5-80gb")
    o = ops([8192, 8192], [8192, 8192], [8192, 8192])
    o = attrs.evolve(o, precision=np.array([BF16, PRECISIONS.index("fp8")]))
    hw = attrs.evolve(hw, efficiency=attrs.evolve(hw.efficiency, kernel_launch_s=0.0, host_dispatch_s=0.0))
    one = attrs.evolve(hw, efficiency=attrs.evolve(hw.efficiency, fp8_gemm_relative_efficiency=1.0))
    half = attrs.evolve(hw, efficiency=attrs.evolve(hw.efficiency, fp8_gemm_relative_efficiency=0.5))
    t1, t2 = profiled_seconds(o, one, np.zeros(2)), profiled_seconds(o, half, np.zeros(2))
    assert t2[0] == t1[0]  # bf16 untouched
    assert t2[1] == pytest.approx(2 * t1[1], rel=1e-12)


def test_fp16_takes_the_bf16_table_at_an_equal_peak_and_only_then(mofa_predictor):
    """fp16 and bf16 run on the tensor cores at one rate (equal datasheet peaks): a profile that
    measured only bf16 prices an fp16 GEMM from the bf16 table, by hand 2·4096³ / 600 TFLOPS =
    0.229 ms. Before, fp16 fell through to the roofline at the datasheet peak (H100: 790 against the
    bf16 table's 659 TFLOPS at 8192³). Its own fp16 points win; a different fp16 peak keeps it off
    the bf16 table (the roofline's default)."""
    hw = mofa_predictor.registry.hardware_profile("h100-sxm5-80gb")
    hw = attrs.evolve(hw, gemm_profile=(GemmPoint(m=4096, n=4096, k=4096, tflops=600.0),),
                      efficiency=attrs.evolve(hw.efficiency, profiled_gemm_relative_efficiency=1.0, kernel_launch_s=0.0,
                                              host_dispatch_s=0.0))
    fp16 = PRECISIONS.index("fp16")
    o = attrs.evolve(ops([4096, 4096], [4096, 4096], [4096, 4096]), precision=np.array([BF16, fp16]))
    default = np.array([1.0, 1.0])
    t = profiled_seconds(o, hw, default)
    assert t[0] == t[1] == pytest.approx(2 * 4096**3 / 600e12)
    assert t[1] == pytest.approx(0.229e-3, rel=2e-3)
    own = attrs.evolve(hw, gemm_profile=hw.gemm_profile + (GemmPoint(m=4096, n=4096, k=4096, tflops=400.0,
                                                                     dtype="fp16"),))
    assert profiled_seconds(o, own, default)[1] == pytest.approx(2 * 4096**3 / 400e12)
    peaks = {**hw.compute.peak_tflops, "fp16": 2.0 * hw.compute.peak_tflops["bf16"]}
    other = attrs.evolve(hw, compute=attrs.evolve(hw.compute, peak_tflops=peaks))
    assert profiled_seconds(o, other, default)[1] == 1.0


def test_an_fp16_job_on_h100_costs_what_its_bf16_twin_costs_in_gemms(mofa_predictor):
    """The shipped H100 profile measured bf16 only: the same job in fp16 and bf16 gets the same
    forward and backward compute (its gradients may differ: bf16 reduces them in fp32)."""
    base = {"model": {"name": "llama3-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 8},
            "parallel": {"tp": 1, "pp": 1, "micro_batch_size": 1, "global_batch_size": 64, "sequence_length": 4096}}
    got = {}
    for prec in ("bf16", "fp16"):
        job = {**base, "parallel": {**base["parallel"], "precision": prec}}
        got[prec] = mofa_predictor.predict(mofa_predictor.job(job))[0].breakdown
    for k in ("compute_fwd", "compute_bwd_input", "compute_bwd_weight"):
        assert got["fp16"][k] == pytest.approx(got["bf16"][k], rel=1e-12), k
