"""torchao's measured float8 rowwise speedups (``plugins/float8_rowwise.toml``): expected values read
from the published table (pytorch/ao docs/static/fp8-rowwise-perf.png) and derived here by hand."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from mofa_framework.config import jobs_to_batch
from mofa_framework.decompose import GEMM, Geometry, layer_operators
from mofa_framework.engine import Context, price_operators
from mofa_plugins._rowwise_table import RowwiseTable, speedup, table
from mofa_plugins.fp8 import linear_parts, linear_speedup


def close(a, b, rel=1e-9):
    np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=rel, atol=1e-12)


@pytest.mark.parametrize("m, k, n, published", [(1024, 1024, 1024, 0.42), (4096, 8192, 16384, 1.07),
                                                (8192, 2048, 8192, 1.01), (32768, 32768, 32768, 1.52),
                                                (16384, 32768, 32768, 1.72), (2048, 32768, 32768, 0.99)])
def test_grid_points_are_the_published_values(m, k, n, published):
    close(speedup("hopper", m, k, n), published)


def test_between_grid_points_linear_in_log2_of_each_size():
    # N = 2^12.5 between 4096 (0.91) and 8192 (1.01) at M 4096, K 8192
    close(speedup("hopper", 4096, 8192, 2 ** 12.5), 0.96)
    # K = 2^11.5 between 2048 (1.01) and 4096 (1.13) at M 8192, N 8192
    close(speedup("hopper", 8192, 2 ** 11.5, 8192), 1.07)
    # the centre of the first cube: the mean of its eight corners
    corners = [0.42, 0.42, 0.40, 0.38, 0.43, 0.43, 0.38, 0.45]
    close(speedup("hopper", 2 ** 10.5, 2 ** 10.5, 2 ** 10.5), sum(corners) / 8)


def test_outside_the_grid_held_at_the_nearest_face():
    # a Llama 3.1 70B key projection at TP 8: 131,072 tokens, K 8192, N 128 → (32768, 8192, 1024)
    close(speedup("hopper", 131072, 8192, 128), 0.63)
    close(speedup("hopper", 512, 512, 512), 0.42)


def test_only_the_measured_architecture_has_a_table():
    assert table().architecture == "hopper"
    for arch in ("ampere", "blackwell", "cdna3", ""):
        assert speedup(arch, 4096, 4096, 4096) is None


def test_a_malformed_table_is_refused():
    good = table()
    with pytest.raises(ValueError, match="grid of shape"):
        RowwiseTable(architecture="hopper", source="x", m=good.m, k=good.k, n=good.n, speedup=good.speedup[:5])
    with pytest.raises(ValueError, match="increasing"):
        RowwiseTable(architecture="hopper", source="x", m=(2048, 1024), k=(1, 2), n=(1, 2),
                     speedup=[[[1, 1], [1, 1]], [[1, 1], [1, 1]]])
    with pytest.raises(ValueError, match="> 0"):
        RowwiseTable(architecture="hopper", source="x", m=(1, 2), k=(1, 2), n=(1, 2),
                     speedup=[[[1, 1], [1, 0]], [[1, 1], [1, 1]]])


def _op(model, name, m, k, n):
    g = _geometry(model, tp=8)
    ops = {o.name: o for kind in model.block_kinds for o in layer_operators(model, g, kind)}
    return attrs.evolve(ops[name], m=np.float64(m), k=np.float64(k), n=np.float64(n))


def _geometry(model, tp):
    from mofa_framework import Predictor

    p = Predictor()
    job = p.job({"model": {"name": model.name}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 64},
                 "parallel": {"tp": tp, "micro_batch_size": 1, "global_batch_size": 8, "sequence_length": 8192}})
    return Geometry.of(jobs_to_batch([job], p.registry))


def test_fused_projections_split_into_the_linears_torchao_converts(mofa_predictor):
    reg = mofa_predictor.registry
    llama, gpt3 = reg.model("llama3.1-70b"), reg.model("gpt3-175b")
    # 64 query heads, 8 key and 8 value heads
    assert linear_parts(llama, _op(llama, "qkv_proj", 1, 1, 1)) == (0.8, 0.1, 0.1)
    assert linear_parts(llama, _op(llama, "mlp_fc1", 1, 1, 1)) == (0.5, 0.5)  # SwiGLU's gate and up
    assert linear_parts(llama, _op(llama, "o_proj", 1, 1, 1)) == (1.0,)
    assert linear_parts(gpt3, _op(gpt3, "mlp_fc1", 1, 1, 1)) == (1.0,)  # GELU: one linear


def test_a_split_operator_sums_its_linears_float8_times(mofa_predictor):
    llama = mofa_predictor.registry.model("llama3.1-70b")
    # QKV at TP 8: N = 1280 = 1024 (queries) + 128 + 128, every part held at N = 1024 → 0.63
    close(linear_speedup("hopper", llama, _op(llama, "qkv_proj", 131072, 8192, 1280)), 0.63)
    # FC1 at TP 8: two linears of N = 3584 = 2^11.807, between 2048 (0.87) and 4096 (1.11)
    s = 0.87 + 0.24 * np.log2(3584 / 2048)
    close(linear_speedup("hopper", llama, _op(llama, "mlp_fc1", 32768, 8192, 7168)), s)


def test_rowwise_on_hopper_prices_each_gemm_at_its_measured_speedup(mofa_predictor):
    """torchtitan's rowwise float8 (weights cast every pass, bf16 inputs saved) on an H100: each GEMM
    but the attention core takes its bf16 time over the measured speedup, the casts included —
    ``Δt = Σ t_bf16·(1/s − 1)`` in forward, by each GEMM's backward multiples in backward."""
    base = {"model": {"name": "llama3.1-70b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 64},
            "parallel": {"tp": 8, "micro_batch_size": 4, "global_batch_size": 32, "sequence_length": 8192,
                         "sequence_parallel": True}}
    jobs = [mofa_predictor.job({**base, "features": f}) for f in (
        {}, {"fp8": {"recipe": "rowwise", "weight_cache": False, "fp8_activations": False}})]
    model, hw = jobs[0].model, jobs[0].hardware
    pred = mofa_predictor.evaluate(jobs_to_batch(jobs, mofa_predictor.registry), model, hw)
    L = pred.state.layers["dense"]
    batch = jobs_to_batch(jobs[:1], mofa_predictor.registry)
    ctx = Context(model=model, hardware=hw, geometry=Geometry.of(batch), pm=mofa_predictor.pm)
    ops = [o for o in layer_operators(model, ctx.geometry, "dense") if np.all(np.asarray(o.kind) == GEMM)
           and o.group != "core_attn"]
    times = price_operators(ctx, ops)
    delta = [t[0] * (1.0 / linear_speedup("hopper", model, o)[0] - 1.0) for o, t in zip(ops, times)]
    close(L.fwd_compute_s[1] - L.fwd_compute_s[0], sum(delta))
    close(L.bwd_input_s[1] - L.bwd_input_s[0], sum(d * float(np.ravel(o.bwd_input)[0]) for d, o in zip(delta, ops)))
    close(L.bwd_weight_s[1] - L.bwd_weight_s[0], sum(d * float(np.ravel(o.bwd_weight)[0]) for d, o in zip(delta, ops)))


def test_the_table_prices_bf16_rows_only(mofa_predictor, monkeypatch):
    """The speedups are over bf16: a row whose own precision is already fp8 keeps the fp8-rate pricing
    (as on an architecture without a table), while its bf16 twin moves."""
    import mofa_plugins.fp8 as fp8

    base = {"model": {"name": "llama3.1-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 8},
            "parallel": {"micro_batch_size": 2, "global_batch_size": 16, "sequence_length": 8192},
            "features": {"fp8": {"recipe": "rowwise"}}}
    jobs = [mofa_predictor.job({**base, "parallel": {**base["parallel"], "precision": p}}) for p in ("fp8", "bf16")]

    def layers():
        batch = jobs_to_batch(jobs, mofa_predictor.registry)
        return mofa_predictor.evaluate(batch, jobs[0].model, jobs[0].hardware).state.layers["dense"].fwd_compute_s

    with_table = layers()
    monkeypatch.setattr(fp8, "rowwise_speedup", lambda *a, **k: None)
    without = layers()
    close(with_table[0], without[0])
    assert abs(with_table[1] - without[1]) > 1e-6
