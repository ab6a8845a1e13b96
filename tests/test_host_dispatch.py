"""The host-dispatch floor of the roofline provider (``EfficiencySpec.host_dispatch_s``).

An operator cannot finish before the host thread has issued its kernels: it takes at least
``kernels × host_dispatch_s``. Small operators become host-bound, large ones are untouched, and
the floor never makes a step faster.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mofa_framework.batch import OP_KINDS, PRECISIONS, OperatorBatch
from mofa_framework.config import jobs_to_batch
from mofa_framework.manager import MofaPluginManager
from mofa_plugins.roofline import operator_seconds

_PM = MofaPluginManager(strict=False)
_PM.load_entrypoints(builtin_only=True)

from mofa_framework import Predictor  # noqa: E402

PRED = Predictor(pm=_PM)
GEMM, ELEMENTWISE = OP_KINDS.index("gemm"), OP_KINDS.index("elementwise")


def _hw(**eff):
    hw = PRED.registry.hardware_profile("h100-sxm5-80gb")
    return attrs.evolve(hw, efficiency=attrs.evolve(hw.efficiency, **eff))


def _ops(flops, nbytes, kind, kernels):
    n = len(flops)
    z = np.zeros(n)
    return OperatorBatch(flops=flops, bytes=nbytes, kind=np.full(n, kind),
                         precision=np.full(n, PRECISIONS.index("bf16")), gemm_m=z, gemm_n=z, gemm_k=z,
                         kernels=np.asarray(kernels, dtype=float))


def test_small_operators_are_host_bound_large_ones_are_not():
    hw = _hw(host_dispatch_s=30e-6, kernel_launch_s=0.0, memory_efficiency=0.8)
    bw = 0.8 * hw.hbm_bandwidth_bytes_per_s
    # a 1 MB norm (≈ 0.4 µs of HBM time) with 3 kernels, and a 10 GB one (≈ 3.7 ms)
    ops = _ops(np.array([0.5e6, 5e9]), np.array([1e6, 1e10]), ELEMENTWISE, [3.0, 3.0])
    t = operator_seconds(ops, hw)
    assert t[0] == pytest.approx(3 * 30e-6)
    assert t[1] == pytest.approx(1e10 / bw)
    # an operator that does nothing is not dispatched
    assert operator_seconds(_ops(np.zeros(1), np.zeros(1), ELEMENTWISE, [5.0]), hw)[0] == 0.0


def test_zero_host_dispatch_is_the_plain_roofline():
    hw0, hw = _hw(host_dispatch_s=0.0), _hw(host_dispatch_s=1e-9)
    ops = _ops(np.array([1e9, 1e12]), np.array([1e6, 1e9]), GEMM, [1.0, 1.0])
    np.testing.assert_array_equal(operator_seconds(ops, hw0), operator_seconds(ops, hw))


def _step(job, host_s):
    batch = jobs_to_batch([job], PRED.registry)
    return PRED.evaluate(batch, job.model, _hw(host_dispatch_s=host_s)).step_time_s[0]


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["llama3-8b", "mixtral-8x7b", "gpt3-175b"]), st.sampled_from([1, 2, 8]),
       st.sampled_from([1, 4]), st.floats(0.0, 2e-4), st.floats(0.0, 2e-4))
def test_more_host_dispatch_time_is_never_faster(model, tp, mbs, a, b):
    job = PRED.job({"model": {"name": model}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 8 * tp},
                    "parallel": {"tp": tp, "pp": 1, "micro_batch_size": mbs, "global_batch_size": 64,
                                 "sequence_length": 2048}})
    lo, hi = sorted((a, b))
    assert _step(job, lo) <= _step(job, hi) * (1 + 1e-12)


def test_fully_host_bound_layer_costs_its_kernel_count():
    """With a host time far above every kernel's GPU time, a layer's forward is Σ kernels × host."""
    from mofa_framework.decompose import Geometry, layer_operators

    job = PRED.job({"model": {"name": "llama3-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 8},
                    "parallel": {"tp": 1, "pp": 1, "micro_batch_size": 1, "global_batch_size": 8,
                                 "sequence_length": 128}})
    batch = jobs_to_batch([job], PRED.registry)
    ops = layer_operators(job.model, Geometry.of(batch), "dense")
    kernels = sum(float(np.asarray(o.kernels)) for o in ops if np.any(np.asarray(o.flops) > 0)
                  or np.any(np.asarray(o.bytes) > 0))
    host = 10e-3  # 10 ms per kernel: nothing in a 128-token layer runs that long on the GPU
    pred = PRED.evaluate(batch, job.model, _hw(host_dispatch_s=host, kernel_launch_s=0.0))
    per_layer = pred.breakdown["compute_fwd"][0] / job.model.num_layers
    # embedding and head run on the same stage: their kernels are host-bound too
    assert per_layer == pytest.approx(kernels * host, rel=0.15)
    assert per_layer >= kernels * host
