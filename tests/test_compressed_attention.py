"""DeepSeek-V4's layer: compressed (and indexed, sparse) attention, a shared K = V head, the grouped
low-rank output projection and hyper-connections — operators, FLOPs, parameters and saved bytes
against values derived by hand from the published configuration (HF ``DeepseekV4Config``: hidden
4096, 64 heads of 512, one K = V head, query latent 1024, window 128, output 8 groups × 1024,
indexer 64 heads of 128 picking 512, 4 residual streams)."""

import csv
from pathlib import Path

import attrs
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mofa_framework.api import Predictor
from mofa_framework.errors import MofaError
from mofa_framework.decompose import (
    Geometry,
    attended_keys,
    layer_operators,
    layer_params,
    mixer_params,
    model_flops_per_sequence,
    pooled_keys,
    saved_activation_bytes,
)
from mofa_framework.stack import BlockSpec
from mofa_framework.types import ModelSpec

REG = Predictor().registry
V4 = REG.model("deepseek-v4-flash")
CSA, HCA, SWA = "sparse_compressed4_attention+moe", "compressed128_attention+moe", "sliding_attention+moe"
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def _g(s=4096.0, t=1.0):
    one = np.ones(1)
    return Geometry(b=one, s=np.array([s]), t=t * one, c=one, e=one, etp=one, dp=one, sp=np.zeros(1, bool),
                    dt=2.0 * one, precision=np.zeros(1, int), flash=np.ones(1, bool))


def _ops(kind, g=None, model=V4):
    return {o.name: o for o in layer_operators(model, g or _g(), kind)}


def _f(x):
    return float(np.asarray(x).ravel()[0])


def test_the_stack_is_two_window_layers_then_alternating_csa_and_hca():
    """compress_ratios = [0, 0, 4, 128, 4, …, 4]: 2 + 21 + 20 = 43 layers."""
    assert V4.kind_counts == {SWA: 2, CSA: 21, HCA: 20}
    assert V4.layer_kinds[:5] == (SWA, SWA, CSA, HCA, CSA) and V4.layer_kinds[-1] == CSA
    assert V4.mtp_kind_counts == {SWA: 1}


def test_pooled_keys_per_query():
    """s = 4096. Ratio 4, top-512: at most min(4096/4, 512) = 512; query i sees min(512, i/4), and
    r·k = 2048 < s, so the mean is 512·(1 − 2048/8192) = 384. Ratio 128: 32 at most, s/(2r) = 16 on
    average. At s = 1024 ≤ r·k the top-k never binds: 1024/8 = 128 on average, 256 at most."""
    csa, hca = V4.block(CSA), V4.block(HCA)
    assert [_f(x) for x in pooled_keys(V4, [4096.0], csa)] == [512.0, 384.0]
    assert [_f(x) for x in pooled_keys(V4, [4096.0], hca)] == [32.0, 16.0]
    assert [_f(x) for x in pooled_keys(V4, [1024.0], csa)] == [256.0, 128.0]


def test_attended_keys_add_the_window_to_the_pooled_keys():
    """The 128-token window keeps 128·(1 − 128/8192) = 126 keys per query on average at s = 4096."""
    assert [_f(x) for x in attended_keys(V4, [4096.0], V4.block(CSA))] == [640.0, 510.0]
    assert [_f(x) for x in attended_keys(V4, [4096.0], V4.block(HCA))] == [160.0, 142.0]
    assert [_f(x) for x in attended_keys(V4, [4096.0], V4.block(SWA))] == [128.0, 126.0]


def test_compressed_sparse_layer_operators():
    """One 4096-token sequence, TP 1:
    - query: 4096 → 1024 latent, 1024 → 64·512 = 32768; one K = V projection 4096 → 512;
    - pooling projections: values and gates of 2 overlapping windows at 512 and at the indexer's 128,
      and 64 head weights: 2·2·(512 + 128) + 64 = 2624 columns; the pooling reads them and writes
      1024 keys of 640: (4096·2·2·640 + 1024·640)·2 bytes = 22,282,240;
    - indexer: query latent 1024 → 64·128 = 8192; scores 2·4096·64·128·(4096/8) = 34,359,738,368;
    - core: 2·4096·510 keys·64 heads·(512 + 512) = 273,804,165,120;
    - output: 8 GEMMs 4096×1024×(32768/8), 2·4096·1024·32768 FLOPs in all, then 8192 → 4096."""
    ops = _ops(CSA)
    shape = lambda o: (_f(o.m), _f(o.n), _f(o.k))  # noqa: E731
    assert shape(ops["q_down_proj"]) == (4096, 1024, 4096)
    assert shape(ops["q_up_proj"]) == (4096, 32768, 1024)
    assert shape(ops["kv_proj"]) == (4096, 512, 4096)
    assert shape(ops["compress_proj"]) == (4096, 2624, 4096)
    assert _f(ops["compress_pool"].bytes) == 22_282_240
    assert shape(ops["index_q_proj"]) == (4096, 8192, 1024)
    assert _f(ops["index_scores"].flops) == 34_359_738_368
    assert _f(ops["core_attention"].flops) == 273_804_165_120
    down = ops["o_down_proj"]
    assert shape(down) == (4096, 1024, 4096) and _f(down.count) == 8
    assert _f(down.flops) == 2 * 4096 * 1024 * 32768
    assert shape(ops["o_up_proj"]) == (4096, 4096, 8192)
    assert "qkv_proj" not in ops and "o_proj" not in ops


def test_heavily_compressed_layer_has_no_indexer():
    """Ratio 128: disjoint windows (values and gates at 512: 1024 columns), every pooled key attended."""
    ops = _ops(HCA)
    assert _f(ops["compress_proj"].n) == 1024
    assert not {"index_q_proj", "index_scores", "index_topk"} & set(ops)
    assert _f(ops["core_attention"].flops) == 2 * 4096 * 142 * 64 * 1024


def test_tensor_parallelism_shards_heads_and_output_groups_not_the_pooling():
    """TP 2: the query heads and the 8 output groups split (4 down-projection GEMMs per rank, the up
    projection's input 8192/2); the one K = V head, the pooling and the indexer stay whole."""
    one, two = _ops(CSA), _ops(CSA, _g(t=2.0))
    assert _f(two["q_up_proj"].n) == 32768 / 2 and _f(two["o_up_proj"].k) == 4096
    assert _f(two["o_down_proj"].count) == 4 and _f(two["o_down_proj"].flops) == _f(one["o_down_proj"].flops) / 2
    for name in ("kv_proj", "compress_proj", "index_q_proj", "index_scores", "q_down_proj"):
        assert _f(two[name].flops) == _f(one[name].flops), name


def test_attention_parameters():
    """Sharded over TP: q_up 1024·32768 + o_down 32768·1024 + o_up 8192·4096 = 100,663,296.
    Replicated: q_down 4096·1024 and its norm 1024, the shared K = V head 4096·512; the pooling
    2·2·4096·512 + 2·4·512 (position bias) + 512 (norm) and the indexer's 2·2·4096·128 + 2·4·128 +
    128; its query 1024·8192 and head weights 4096·64: 25,434,752 (ratio 128, one window:
    4,195,328 + 2,097,152 + 2·4096·512 + 128·512 + 512 = 10,552,832)."""
    assert mixer_params(V4, V4.block(CSA)) == (100_663_296, 25_434_752.0)
    assert mixer_params(V4, V4.block(HCA)) == (100_663_296, 10_552_832.0)


def test_hyper_connections_cost_memory_passes_saved_streams_and_parameters():
    """n = 4 streams against a plain residual (n = 1), per layer of two sublayers at T = 4096:
    - traffic: (3n − 1) = 11 more hidden-size passes per sublayer: 11·2·4096·4096·2 bytes;
    - saved: the second sublayer's 4 streams and both sublayers' outputs plus the first mixed input,
      (4 + 2 + 1)·4096·4096·2 bytes; full recompute keeps the 4 streams (4× the layer input);
    - parameters: per sublayer 4·4096·4·6 + 24 + 3 = 393,243, twice per layer."""
    plain = attrs.evolve(V4, hyper_connections=1)
    g = _g()
    extra = _f(_ops(CSA, g)["residual_norm"].bytes) - _f(_ops(CSA, g, plain)["residual_norm"].bytes)
    assert extra == 11 * 2 * 4096 * 4096 * 2
    hc, base = saved_activation_bytes(V4, g, CSA), saved_activation_bytes(plain, g, CSA)
    assert _f(hc.other) - _f(base.other) == 7 * 4096 * 4096 * 2
    assert _f(hc.layer_input) == 4 * _f(base.layer_input)
    assert layer_params(V4, CSA)["replicated"] - layer_params(plain, CSA)["replicated"] == 2 * 393_243


def test_model_flops_match_nvidias_published_count():
    """Megatron-Bridge's DeepSeek-V4 Flash rows publish model TFLOPS and tokens/s per GPU at
    s = 4096: their ratio is NVIDIA's FLOPs per token (≈ 90.9 G). MoFa's count (3 × forward, the
    attention's keys as attended) agrees within 1.5 %."""
    rows = [r for r in csv.DictReader(open(DATA / "nvidia_megatron_bridge.csv"))
            if r["model"] == "DeepSeekV4 Flash"]
    assert len(rows) == 2
    ours = 3.0 * _f(model_flops_per_sequence(V4, np.array([4096.0]))) / 4096
    for r in rows:
        theirs = float(r["model_tflops_per_gpu"]) * 1e12 / float(r["tokens_per_sec_per_gpu"])
        assert abs(ours / theirs - 1.0) < 0.015, (ours, theirs)


@pytest.mark.parametrize("bad, fragment", [
    (dict(attention="compressed"), "compress_ratio ≥ 2"),
    (dict(attention="sliding", compress_ratio=4), "attention = 'compressed' only"),
    (dict(attention="full", indexed=True), "attention = 'compressed' only"),
    (dict(attention="compressed", compress_ratio=True), "whole number"),
])
def test_block_rules(bad, fragment):
    with pytest.raises(ValueError, match=fragment):
        BlockSpec(**bad)


def _job(tp, ep=8, gpus=128):
    pred = Predictor()
    return pred, pred.job({"model": {"name": "deepseek-v4-flash"}, "hardware": {"name": "gb300-nvl72", "num_gpus": gpus},
                           "parallel": {"tp": tp, "ep": ep, "global_batch_size": 2048, "sequence_length": 4096,
                                        "precision": "fp8"}})


def test_tensor_parallelism_must_divide_the_output_groups_not_the_shared_head():
    """One K = V head never blocks TP (it is replicated); the 8 output groups cap it at 8."""
    for tp in (2, 8):
        pred, job = _job(tp)
        assert pred.predict(job)[0].step_time_s > 0
    pred, job = _job(16, gpus=256)
    with pytest.raises(MofaError, match=r"model\.o_groups \(8\)"):
        pred.predict(job)


def test_the_published_rows_predict_within_their_band():
    """Megatron-Bridge's two DeepSeek-V4 Flash rows (NeMo 26.08, 128 GPUs, EP 64, MXFP8), never fitted:
    MoFa predicts 11–13 % fast; both measured steps lie inside the predicted band."""
    from mofa_framework.measurements import map_files
    from mofa_framework.validate import resolve_unstated

    pred = Predictor()
    mapped, _, _ = map_files([DATA / "nvidia_megatron_bridge.csv"], pred.registry)
    rows = [m for m in resolve_unstated(mapped, pred) if m.job["model"]["name"] == "deepseek-v4-flash"]
    assert len(rows) == 2
    for m in rows:
        r = pred.predict(pred.job(m.job, name=m.row_id))[0]
        assert 0.80 < r.step_time_s / m.measured_s < 1.0, (m.row_id, r.step_time_s, m.measured_s)
        assert r.step_time_s_low <= m.measured_s <= r.step_time_s_high


def test_model_rules():
    base = attrs.asdict(V4, recurse=False)
    with pytest.raises(ValueError, match="index_topk"):
        ModelSpec(**{**base, "index_topk": 0})
    with pytest.raises(ValueError, match="o_groups"):
        ModelSpec(**{**base, "o_groups": 7})
    with pytest.raises(ValueError, match="o_lora_rank"):
        ModelSpec(**{**base, "o_lora_rank": 0})


@given(s=st.integers(1, 1 << 21), r=st.sampled_from([2, 4, 16, 128]), k=st.integers(1, 4096))
def test_pooled_keys_never_exceed_their_bounds(s, r, k):
    """The mean a query attends is at most the most any query sees and at most s/(2r); the top-k caps both."""
    m = attrs.evolve(V4, index_topk=k)
    for indexed in (True, False):
        block = BlockSpec(attention="compressed", compress_ratio=r, indexed=indexed, ffn="moe")
        width, mean = (_f(x) for x in pooled_keys(m, [float(s)], block))
        assert 0.0 <= mean <= s / (2.0 * r) + 1e-9
        assert mean <= width + 1.0  # query i sees ⌊i/r⌋; the mean counts i/r
        if indexed:
            assert width <= k and mean <= k


def test_up_projection_recompute_drops_the_low_rank_querys_q():
    """Megatron-Core's ``mla_up_proj`` recompute on DeepSeek-V4 (no MLA latent): the query up
    projection's output, 64·512 per token, 4096·32768·2 bytes, and the GEMM that re-makes it."""
    from mofa_framework.decompose import module_operators, module_saved_bytes

    assert _f(module_saved_bytes(V4, _g(), CSA, "mla_up_proj")) == 4096 * 32768 * 2
    assert [o.name for o in module_operators(V4, _g(), CSA, "mla_up_proj")] == ["q_up_proj"]


def test_an_mtp_module_may_use_a_kind_the_stack_lacks():
    """DeepSeek-V4 Pro's stack is compressed attention only, its MTP layer window-only: that kind is
    priced (it is in ``block_kinds``) with no layer of the stack, and model FLOPs count it once per
    module — one window-only layer more than the stack's 30 + 31 layers."""
    pro = REG.model("deepseek-v4-pro")
    assert pro.kind_counts == {HCA: 31, CSA: 30} and pro.mtp_kind_counts == {SWA: 1}
    assert SWA in pro.block_kinds and SWA not in pro.kind_counts
    assert pro.executed_kind_counts == {HCA: 31, CSA: 30, SWA: 1}
    assert V4.executed_kind_counts == {SWA: 3, CSA: 21, HCA: 20}  # Flash's MTP layer is one of its window layers
    s = np.array([4096.0])
    no_mtp = attrs.evolve(pro, num_mtp_layers=0, mtp_layer_pattern="")
    g = Geometry.unit(s)
    swa_layer = sum(_f(o.flops) for o in layer_operators(pro, g, SWA) if np.all(np.asarray(o.kind) == 0))
    head = 2.0 * 4096 * pro.hidden_size * pro.vocab_size
    assert _f(model_flops_per_sequence(pro, s)) == pytest.approx(_f(model_flops_per_sequence(no_mtp, s)) + swa_layer
                                                                 + head)
