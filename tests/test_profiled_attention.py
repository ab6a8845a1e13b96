"""The `profiled_attention` provider: fused attention priced from ``[[attention_profile]]``
(plugins/profiled_attention.py); values derived here by hand."""

import attrs
import numpy as np
import pytest

from mofa_framework.batch import OP_KINDS, PRECISIONS, OperatorBatch
from mofa_framework.types import AttentionPoint
from mofa_plugins import _attention_kernels
from mofa_plugins.profiled_attention import attention_seconds

ATT = OP_KINDS.index("attention")
F = 1e12


def attn(head_dim, keys_per_query, kind=ATT):
    n = len(head_dim)
    return OperatorBatch(flops=np.full(n, F), bytes=np.zeros(n), kind=np.full(n, kind),
                         precision=np.full(n, PRECISIONS.index("bf16")), gemm_m=np.full(n, 8192.0),
                         gemm_n=np.asarray(keys_per_query, float), gemm_k=np.asarray(head_dim, float))


@pytest.fixture
def hw(mofa_predictor, monkeypatch):
    # the table's own mechanics: no published kernel curves (those are tested in test_attention_kernels)
    monkeypatch.setattr(_attention_kernels, "table", lambda: _attention_kernels.KernelTable(
        prior_architecture="none", points=(), auto={"default": "fa2"}))
    h = mofa_predictor.registry.hardware_profile("h100-sxm5-80gb")
    eff = attrs.evolve(h.efficiency, attention_half_head_dim=64.0, profiled_attention_relative_efficiency=1.0,
                       kernel_launch_s=0.0, host_dispatch_s=0.0)
    return attrs.evolve(h, efficiency=eff)


def point(tflops, direction="fwd", head_dim=128, seq=8192, causal=False):
    return AttentionPoint(head_dim=head_dim, seq_len=seq, causal=causal, tflops=tflops, direction=direction)


def test_exact_at_the_point_and_moved_by_the_head_dim_law(hw):
    h = attrs.evolve(hw, attention_profile=(point(400.0),))
    # causal keys per query s/2 = 4096 → seq 8192, head dim 128: the point itself, one pass serves both
    t = attention_seconds(attn([128, 64], [4096, 4096]), h, np.zeros(2))
    assert t[0] == pytest.approx(F / 400e12, rel=1e-12)
    # head dim 64: r(64)/r(128) = (64/128)/(128/192) = 0.75 → 300 TFLOPS
    assert t[1] == pytest.approx(F / 300e12, rel=1e-12)


def test_both_passes_weighted_by_the_engines_backward_factor(hw):
    # forward 400, backward 200 TFLOPS: the engine multiplies the forward time by 2.5 for the
    # backward, so the forward is priced at (F/400 + 2.5·F/200)/3.5
    h = attrs.evolve(hw, attention_profile=(point(400.0), point(200.0, "bwd")))
    t = attention_seconds(attn([128], [4096]), h, np.zeros(1))[0]
    assert t == pytest.approx((F / 400e12 + 2.5 * F / 200e12) / 3.5, rel=1e-12)
    assert t * 3.5 == pytest.approx(F / 400e12 + 2.5 * F / 200e12, rel=1e-12)


def test_causal_points_preferred_and_relative_efficiency_scales(hw):
    h = attrs.evolve(hw, attention_profile=(point(400.0), point(250.0, causal=True)),
                     efficiency=attrs.evolve(hw.efficiency, profiled_attention_relative_efficiency=2.0))
    t = attention_seconds(attn([128], [4096]), h, np.zeros(1))[0]
    assert t == pytest.approx(F / 500e12, rel=1e-12)


def test_other_operators_and_profiles_without_a_table_fall_through(hw):
    default = np.array([3.0])
    assert attention_seconds(attn([128], [4096], kind=OP_KINDS.index("gemm")),
                             attrs.evolve(hw, attention_profile=(point(400.0),)), default)[0] == 3.0
    assert attention_seconds(attn([128], [4096]), attrs.evolve(hw, attention_profile=()), default) is default


def test_ssd_scan_takes_the_fa2_tables_time_without_the_frameworks_attention_multipliers(hw):
    """A scan (Mamba-2's SSD, priced at its attention-equivalent work at 2·n = 2048 keys, head dim 64)
    runs at the FlashAttention-2 table's rate: 400 TFLOPS at d 128 → 300 at d 64 (the head-dimension
    law), whatever profiled_attention_relative_efficiency says (3 here) — and never faster than its
    bytes at the profile's memory bandwidth."""
    from mofa_plugins.profiled_attention import scan_seconds

    scan = OP_KINDS.index("scan")
    h = attrs.evolve(hw, attention_profile=(point(400.0),),
                     efficiency=attrs.evolve(hw.efficiency, profiled_attention_relative_efficiency=3.0))
    t = scan_seconds(attn([64], [1024], kind=scan), h, np.zeros(1))[0]
    assert t == pytest.approx(F / 300e12, rel=1e-12)
    heavy = attrs.evolve(attn([64], [1024], kind=scan), bytes=np.array([1e13]))
    bw = h.efficiency.memory_efficiency * h.hbm_bandwidth_bytes_per_s
    assert scan_seconds(heavy, h, np.zeros(1))[0] == pytest.approx(1e13 / bw, rel=1e-12)
    # an attention operator is untouched by the scan pricing
    assert scan_seconds(attn([64], [1024]), h, np.array([7.0]))[0] == 7.0
