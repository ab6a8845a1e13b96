"""FLOPs conventions (the ``flops_conventions`` plugin): each published count checked against a
value derived by hand from its source, and against the sources' own TFLOPS where a table gives
both TFLOPS and a step time."""

from __future__ import annotations

import csv
import statistics

import attrs
import pytest

from mofa_framework.measurements import ReadContext, builtin_data_dir
from mofa_framework.types import ModelSpec
from mofa_plugins.flops_conventions import (
    megatron_2021_flops,
    megatron_core_flops,
    nemo_flops,
    palm_flops,
    six_nd_flops,
)

#: a small GPT: h 1024, 2 layers, 16 heads (d 64), MLP 4h with GELU, vocabulary 1000
GPT = ModelSpec(name="gpt-test", num_layers=2, hidden_size=1024, num_attention_heads=16, num_kv_heads=16,
                ffn_hidden_size=4096, vocab_size=1000, activation="gelu")
B, S = 4, 2048


def test_six_nd_counts_every_gemm_weight_six_times_per_token():
    """N = per layer 4h² (Q, K, V, O) + 8h² (two 4h-wide MLP GEMMs), plus the output layer h·V."""
    h, L, V = 1024, 2, 1000
    N = L * (4 * h * h + 8 * h * h) + h * V
    assert six_nd_flops(GPT, B, S) == pytest.approx(6 * N * B * S, rel=1e-15)


def test_palm_adds_the_attention_scores_over_the_whole_sequence():
    """PaLM App. B: 6N + 12·L·H·Q·T per token (H·Q = 16·64 = h); Korthikanti eq. 7 for GPT:
    72·B·s·L·h²·(1 + s/6h + V/12hL)."""
    h, L, V = 1024, 2, 1000
    N = L * 12 * h * h + h * V
    assert palm_flops(GPT, B, S) == pytest.approx((6 * N + 12 * L * 16 * 64 * S) * B * S, rel=1e-15)
    eq7 = 72 * B * S * L * h * h * (1 + S / (6 * h) + V / (12 * h * L))
    assert palm_flops(GPT, B, S) == pytest.approx(eq7, rel=1e-12)


def test_megatron_2021_eq3_is_model_flops_plus_one_recomputed_forward_of_the_layers():
    """Narayanan eq. 3, 96·B·s·L·h²·(1 + s/6h + V/16Lh): the layers' model FLOPs × 4/3 (one more
    forward), the output layer's 6·B·s·h·V once."""
    h, L, V = 1024, 2, 1000
    eq3 = 96 * B * S * L * h * h * (1 + S / (6 * h) + V / (16 * L * h))
    assert megatron_2021_flops(GPT, B, S) == pytest.approx(eq3, rel=1e-15)
    layers = 72 * B * S * L * h * h * (1 + S / (6 * h))
    assert megatron_2021_flops(GPT, B, S) == pytest.approx(4 / 3 * layers + 6 * B * S * h * V, rel=1e-12)
    with pytest.raises(ValueError, match="dense GPT"):
        megatron_2021_flops(attrs.evolve(GPT, num_experts=8, experts_per_token=2, moe_ffn_hidden_size=1024), B, S)


def test_megatron_core_counts_gqa_moe_and_causal_attention(mofa_predictor):
    """Megatron-LM num_floating_point_operations for Qwen3-235B-A22B (h 4096, 94 layers, 64 query
    heads of 128, 4 KV groups, 128 experts top-8 of width 1536, V 151936) at s 4096, per token ÷ 6:
    attention 4096·(8192 + 2·512) + 8192·4096/2·2 + 8192·4096 = 104,857,600 per layer; MLP
    4096·3·(1536·8) = 150,994,944 per layer; logits 4096·151,936 = 622,329,856."""
    m = mofa_predictor.registry.model("qwen3-235b-a22b")
    per_token = 6 * (94 * (104_857_600 + 150_994_944) + 622_329_856)
    assert per_token == 148_034_813_952
    assert megatron_core_flops(m, 1, 4096) == pytest.approx(per_token * 4096, rel=1e-15)


def test_megatron_core_counts_mla_dense_first_layers_shared_experts_and_mtp(mofa_predictor):
    """DeepSeek-V3 (h 7168, 61 layers: 3 dense of 18432, 58 MoE top-8 of 2048 + 1 shared; MLA q-LoRA
    1536, kv-LoRA 512, 128 heads, qk 128 + rope 64, v 128; V 129280; one MTP layer) at s 4096, per
    token ÷ 6: MLA 1536·(7168 + 128·192 + 1) + 512·(7168 + 128·256 + 1) + 7168·64 + 128·128·7168
    + 4096·128·192/2 + 4096·128·128/2 = 270,993,408 per layer, 62 layers with the MTP one; MLP
    7168·3·18432 = 396,361,728 per dense layer and per MoE layer (2048·(8 + 1) = 18432), 3 + 59;
    MTP projection 3·7168 + 2·7168²; logits 7168·129280·2."""
    m = mofa_predictor.registry.model("deepseek-v3")
    assert m.num_mtp_layers == 1
    attn = 1536 * (7168 + 128 * 192 + 1) + 512 * (7168 + 128 * 256 + 1) + 7168 * 64 + 128 * 128 * 7168 \
        + 4096 * 128 * 192 // 2 + 4096 * 128 * 128 // 2
    assert attn == 270_993_408
    per_token = 6 * (62 * attn + 62 * 396_361_728 + (3 * 7168 + 2 * 7168 ** 2) + 7168 * 129280 * 2)
    assert megatron_core_flops(m, 1, 4096) == pytest.approx(per_token * 4096, rel=1e-15)


def test_nemo_mixtral_formula_and_what_it_does_not_define(mofa_predictor):
    """NeMo's mixtral: B·s·L·h²·(12 + 12·g/a + 18·k·f/h + 12·s/h + 6·V/(L·h)); Mixtral 8x7B: L 32,
    h 4096, a 32, g 8, top-2 experts of 14336, V 32000. NeMo's DeepSeek-V3 formula is not
    implemented (MLA raises), nor its MoE count for shared experts or dense-first layers."""
    m = mofa_predictor.registry.model("mixtral-8x7b")
    L, h, s = 32, 4096, 4096
    want = 2 * s * L * h * h * (12 + 12 * 8 / 32 + 18 * 2 * 14336 / h + 12 * s / h + 6 * 32000 / (L * h))
    assert nemo_flops(m, 2, s) == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match="DeepSeek-V3"):
        nemo_flops(mofa_predictor.registry.model("deepseek-v3"), 1, 4096)


def _both(path):
    """Rows that publish a step time (or tokens/s) and model TFLOPS, for pretraining."""
    for r in csv.DictReader(path.open()):
        t = r["step_time_s"] or r["step_time_s_derived"]
        if t and r["model_tflops_per_gpu"] and r["gbs"] and r["seq_len"] and "pretrain" in r["task"].lower():
            yield r, float(t), float(r["model_tflops_per_gpu"]), int(r["num_gpus"])


@pytest.mark.parametrize("path, convention, models", [
    ("megatron_core_moe.csv", megatron_core_flops, {"qwen3-235b-a22b"}),
    ("nvidia_megatron_bridge.csv", megatron_core_flops,
     {"llama3-8b", "llama3-70b", "llama3.1-405b", "qwen3-235b-a22b", "qwen3-30b-a3b", "deepseek-v3", "kimi-k2",
      "nemotron-3-nano"}),
    ("nemo_2407.csv", nemo_flops, {"llama3-8b", "llama3-70b", "gpt3-175b", "nemotron-4-340b"}),
])
def test_each_source_reports_tflops_under_its_convention(mofa_predictor, path, convention, models):
    """The source's TFLOPS × GPUs × step time equals the convention's count (median within 0.3 %,
    per model): Megatron-Core's model zoo and Megatron-Bridge count as Megatron-LM does, NeMo 24.07
    as NeMo's flops_formulas."""
    ctx = ReadContext(source="t", registry=mofa_predictor.registry)
    ratios: dict[str, list[float]] = {}
    for r, t, tflops, n in _both(builtin_data_dir() / path):
        m = ctx.model(r["model"])
        if m is not None and m.name in models:
            ratios.setdefault(m.name, []).append(convention(m, int(r["gbs"]), int(r["seq_len"])) / (tflops * 1e12 * n * t))
    assert set(ratios) == models
    for name, rs in ratios.items():
        assert statistics.median(rs) == pytest.approx(1.0, abs=0.003), name


@pytest.mark.parametrize("model, count", [
    (m, c) for m in ("nemotron-h-8b", "qwen3-next-80b-a3b", "jamba-v0.1")
    for c in (six_nd_flops, palm_flops, megatron_core_flops, nemo_flops)
    if not (c is megatron_core_flops and m != "jamba-v0.1")])
def test_stacks_with_non_transformer_layers_have_no_count(mofa_predictor, model, count):
    """These counts are of attention + MLP layers: a Mamba / gated DeltaNet / lone-MLP layer is
    refused (the row is listed as not predictable) rather than counted as a transformer layer.
    Megatron-Core counts Mamba-2 and gated DeltaNet layers (below), not Mamba-1 (Jamba)."""
    with pytest.raises(ValueError, match="transformer layers only"):
        count(mofa_predictor.registry.model(model), 1, 4096)


def test_megatron_core_hybrid_count_of_nemotron_3_nano(mofa_predictor):
    """Megatron-LM's hybrid_flops (training.py) for Nemotron 3 Nano (h 2688; 6 attention layers of
    32 heads × 128, 2 KV groups; 23 Mamba-2 layers of 64 heads, 8 groups, state 128; 23 MoE layers
    of top-6 × 1856 + a shared 1856·2 = 3712, squared ReLU; V 131072) at s 8192, forward per token:
    attention 4·(4096·2688 + 256·2688) + 2·8192·4096 = 113,901,568; Mamba-2 with Megatron's
    d_in = 2h = 5376: 2·2688·(10752 + 2048 + 64) + 7·5376·128 + 2·5376·2688 = 102,875,136; MoE
    4·2688·(6·1856 + 3712) = 159,645,696; logits 2·2688·131072 = 704,643,072; all × 3."""
    m = mofa_predictor.registry.model("nemotron-3-nano")
    per_token = 3 * (6 * 113_901_568 + 23 * 102_875_136 + 23 * 159_645_696 + 704_643_072)
    assert per_token == 22_278_094_848
    assert megatron_core_flops(m, 2, 8192) == pytest.approx(2 * 8192 * per_token, rel=1e-15)


def test_megatron_core_counts_gated_deltanet_and_gated_attention(mofa_predictor):
    """Qwen3-Next-80B-A3B (h 2048; 36 gated DeltaNet layers of 16 q/k heads × 128 and 32 v heads ×
    128, conv 4; 12 gated attention layers of 16 heads × 256, 2 KV; 48 MoE layers of top-10 × 512 +
    shared 512, SwiGLU; V 151936) at s 4096, forward per token: DeltaNet 2·(2048·12352 + 4·8192 +
    4·32·128² + 2048·4096) = 71,630,848; attention 2·(2048·5120 + 4096·2048) + gate 2·2048·4096 +
    2·4096·4096 = 88,080,384; MoE 2·2048·3·5632 = 69,206,016; logits 2·2048·151936; all × 3."""
    m = mofa_predictor.registry.model("qwen3-next-80b-a3b")
    per_token = 3 * (36 * 71_630_848 + 12 * 88_080_384 + 48 * 69_206_016 + 2 * 2048 * 151_936)
    assert megatron_core_flops(m, 1, 4096) == pytest.approx(4096 * per_token, rel=1e-15)


def test_megatron_core_counts_an_interleaved_moe_stack_by_its_layers(mofa_predictor):
    """Llama 4 Maverick (h 5120, 48 layers alternating dense MLP 16384 and MoE top-1 of 8192 + a
    shared 8192; 40 query heads of 128, 8 KV) at s 8192, per token ÷ 6: attention
    5120·(5120 + 2·1024) + 5120·8192/2·2 + 5120·5120 = 104,857,600 per layer; MLP 5120·3·16384 =
    251,658,240 per dense layer, 5120·3·(8192 + 8192) = 251,658,240 per MoE layer; logits
    5120·202,048."""
    m = mofa_predictor.registry.model("llama4-maverick")
    assert (m.num_dense_layers, m.num_moe_layers) == (24, 24)
    per_token = 6 * (48 * (104_857_600 + 251_658_240) + 5120 * 202_048)
    assert megatron_core_flops(m, 1, 8192) == pytest.approx(per_token * 8192, rel=1e-15)
