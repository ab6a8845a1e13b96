"""The profiled-table provider: measured GEMM throughput interpolated by shape."""

import attrs
import numpy as np
import pytest

from mofa_framework.batch import OP_KINDS, PRECISIONS, OperatorBatch
from mofa_framework.config import jobs_to_batch
from mofa_framework.types import GemmPoint
from mofa_plugins.profiled_gemm import interpolate_tflops, profiled_seconds

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
    hw = attrs.evolve(hw, gemm_profile=(GemmPoint(m=4096, n=4096, k=4096, tflops=600.0),))
    o = ops([4096, 4096], [4096, 4096], [4096, 4096])
    o = attrs.evolve(o, kind=np.array([GEMM, OP_KINDS.index("elementwise")]))
    default = np.array([1.0, 2.0])
    t = profiled_seconds(o, hw, default)
    assert t[0] == pytest.approx(2 * 4096**3 / 600e12)
    assert t[1] == 2.0
    # a profile without a table changes nothing
    assert profiled_seconds(o, mofa_predictor.registry.hardware_profile("h100-sxm5-80gb"), default) is default


def test_table_in_a_profile_changes_the_prediction(mofa_predictor):
    from mofa_framework.decompose import GEMM, Geometry, layer_operators

    job = mofa_predictor.job({"model": {"name": "llama3-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 8},
                              "parallel": {"tp": 8, "global_batch_size": 8, "sequence_length": 4096}})
    batch = jobs_to_batch([job], mofa_predictor.registry)
    flat = attrs.evolve(job.hardware, gemm_profile=tuple(
        GemmPoint(m=m, n=n, k=k, tflops=100.0) for m in (1024, 8192) for n in (512, 8192) for k in (512, 8192)))
    pred = mofa_predictor.evaluate(batch, job.model, flat)
    # every GEMM now runs at exactly 100 TFLOPS: a layer's weight-gradient time is its GEMM FLOPs / 1e14
    ops = layer_operators(job.model, Geometry.of(batch), "dense")
    gemm_flops = sum(float(np.asarray(o.flops)[0]) for o in ops if np.all(np.asarray(o.kind) == GEMM))
    assert pred.state.layers["dense"].bwd_weight_s[0] == pytest.approx(gemm_flops / 100e12, rel=1e-9)
