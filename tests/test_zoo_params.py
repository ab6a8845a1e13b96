"""Parameter counts of the zoo's models against the published totals (and active counts for MoE).

A published figure rounded to a unit (“109B”) cannot test finer than half that unit, so a count
passes when it is within 0.5 % of the figure *or* within half its unit. Each row says what the
figure counts: the whole model (``total``), without the embeddings (``non-embedding``), or the
parameters a token activates (``active``: both embeddings included, as Meta, Mistral, Databricks and
Snowflake count; ``active-no-lookup``: without the input embedding's table lookup, as DeepSeek counts)."""

import pytest

from mofa_framework.api import Predictor
from mofa_framework.decompose import total_params

REG = Predictor().registry
B, M = 1e9, 1e6


def _llama4_vision() -> float:
    """Llama 4's vision encoder and projector, from its published vision_config (hidden 1408, 34 layers,
    MLP 5632, 16 heads, 14-pixel patches of 336-pixel images, pixel-shuffle ratio 0.5, projector
    4096 → 4096, then 4096 → the text's 5120): biased attention and MLP, LayerNorms with bias."""
    h, f, layers = 1408, 5632, 34
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    patches = (336 // 14) ** 2 + 1
    encoder = 3 * 14 * 14 * h + h + patches * h + 2 * 2 * h + layers * layer
    adapter = (4 * h) * 4096 + 4096 * 4096  # pixel-shuffle MLP
    return encoder + adapter + 4096 * 5120


def _embedding(m) -> float:
    return m.vocab_size * m.hidden_size * (1 if m.tied_embeddings else 2)


# (model, what, published, unit, source)
PUBLISHED = [
    ("nemotron-h-8b", "total", 8_100_852_736, 1, "safetensors of nvidia/Nemotron-H-8B-Base-8K"),
    ("nemotron-h-47b", "total", 47 * B, B, "Nemotron-H paper / model card: 47B"),
    ("nemotron-h-56b", "total", 56 * B, B, "Nemotron-H paper / model card: 56B"),
    ("nemotron-3-nano", "total", 31.6 * B, 0.1 * B, "Nemotron 3 Nano report (arXiv 2512.20848): 31.6B total"),
    ("nemotron-3-nano", "active", 3.6 * B, 0.1 * B, "the same report: 3.6B active with embeddings"),
    ("nemotron-3-nano", "active-no-lookup", 3.2 * B, 0.1 * B, "the same report: 3.2B active (the input "
     "embedding, a table lookup, not counted)"),
    ("llama4-scout", "total+vision", 109 * B, B, "Meta: 109B total (with the vision encoder)"),
    ("llama4-scout", "active", 17 * B, B, "Meta: 17B active"),
    ("llama4-maverick", "total+vision", 400 * B, B, "Meta: 400B total (with the vision encoder)"),
    ("llama4-maverick", "active", 17 * B, B, "Meta: 17B active"),
    ("qwen3-next-80b-a3b", "total", 79_674_391_296, 1, "safetensors of Qwen3-Coder-Next (the same architecture)"),
    ("qwen3-next-80b-a3b", "active", 3_874_929_408, 1, "the same safetensors, inactive experts left out"),
    ("gemma-7b", "non-embedding", 7_751_248_896, 1, "Gemma report (arXiv 2403.08295), Table 2"),
    ("gemma-7b", "total", 8_537_680_896, 1, "Gemma report, Table 2: 786,432,000 embedding + the above"),
    ("mistral-nemo-12b", "total", 12 * B, B, "Mistral AI: 12B"),
    ("gemma-2-9b", "non-embedding", 8_324_201_984, 1, "Gemma 2 report, Table 1"),
    ("gemma-2-27b", "non-embedding", 26_047_480_320, 1, "Gemma 2 report, Table 1"),
    ("gemma-3-1b", "non-embedding", 698 * M, M, "Gemma 3 report, Table 1"),
    ("gemma-3-27b", "non-embedding", 25_600 * M, M, "Gemma 3 report, Table 1"),
    ("nemotron-4-15b", "non-embedding", 12.5 * B, 0.1 * B, "Nemotron-4 15B paper: 12.5B non-embedding"),
    ("nemotron-4-15b", "total", 15.7 * B, 0.2 * B, "Nemotron-4 15B paper: 3.2B + 12.5B (two rounded terms)"),
    ("grok-1", "non-embedding", 314 * B, B, "xAI: 314B (the non-embedding count; tied embedding 0.8B more)"),
    ("llama3.2-1b", "total", 1_235_814_400, 1, "safetensors of meta-llama/Llama-3.2-1B"),
    ("llama3.2-3b", "total", 3_212_749_824, 1, "safetensors of meta-llama/Llama-3.2-3B"),
    ("mistral-large-2", "total", 122_610_069_504, 1, "safetensors of Mistral-Large-Instruct-2407"),
    ("phi-3-mini", "total", 3_821_079_552, 1, "safetensors of Phi-3-mini-4k-instruct"),
    ("phi-3-medium", "total", 13_960_238_080, 1, "safetensors of Phi-3-medium-4k-instruct"),
    ("phi-4", "total", 14_659_507_200, 1, "safetensors of microsoft/phi-4"),
    ("dbrx", "total", 132 * B, B, "Databricks: 132B total"),
    ("dbrx", "active", 36 * B, B, "Databricks: 36B active"),
    ("snowflake-arctic", "total", 480 * B, B, "Snowflake: 480B total"),
    ("snowflake-arctic", "active", 17 * B, B, "Snowflake: 17B active"),
    ("jamba-v0.1", "total", 52 * B, B, "Jamba paper: 52B total"),
    ("jamba-v0.1", "active", 12 * B, B, "Jamba paper: 12B active"),
    ("deepseek-v3-no-mtp", "total", 671 * B, B, "DeepSeek-V3 report: 671B total"),
    ("deepseek-v3-no-mtp", "active-no-lookup", 37 * B, B, "DeepSeek-V3 report: 37B activated (the input "
     "embedding, a table lookup, not counted)"),
    ("llama3.1-405b", "total", 405.8 * B, 0.1 * B, "Meta: 405B (safetensors 405.8B)"),
    ("mixtral-8x7b", "total", 46.7 * B, 0.1 * B, "Mistral: 46.7B total"),
    ("mixtral-8x7b", "active", 12.9 * B, 0.1 * B, "Mistral: 12.9B active"),
    ("mistral-7b", "total", 7_241_732_096, 1, "safetensors of mistralai/Mistral-7B-v0.1"),
    ("llama-7b", "total", 6.7 * B, 0.1 * B, "LLaMA paper, Table 2: 6.7B"),
    ("llama-13b", "total", 13.0 * B, 0.1 * B, "LLaMA paper, Table 2: 13.0B"),
    ("llama-33b", "total", 32.5 * B, 0.1 * B, "LLaMA paper, Table 2: 32.5B"),
    ("llama-65b", "total", 65.2 * B, 0.1 * B, "LLaMA paper, Table 2: 65.2B"),
    ("opt-175b", "total", 175 * B, B, "OPT paper, Table 1: 175B"),
    ("bloom-176b", "total", 176_247_271_424, 1, "BLOOM model card: 176,247,271,424 parameters"),
    ("deepseek-v4-flash", "total", 284 * B, B, "DeepSeek-V4 Flash model card: 284B total (without the MTP layer)"),
    ("deepseek-v4-flash", "active-no-lookup", 13 * B, B, "the same model card: 13B activated"),
    ("deepseek-v4-pro", "total", 1600 * B, 100 * B, "DeepSeek-V4 Pro model card: 1.6T total (without the MTP layer)"),
    ("deepseek-v4-pro", "active-no-lookup", 49 * B, B, "the same model card: 49B activated"),
    ("deepseek-v2", "total", 236 * B, B, "DeepSeek-V2 paper: 236B total"),
    ("deepseek-v2", "active-no-lookup", 21 * B, B, "DeepSeek-V2 paper: 21B activated per token"),
    ("deepseek-v2-lite", "total", 15.7 * B, 0.1 * B, "DeepSeek-V2 paper, appendix: 15.7B total"),
    ("qwen2.5-7b", "total", 7.61 * B, 0.01 * B, "Qwen2.5 report, Table 1: 7.61B"),
    ("qwen2.5-7b", "non-embedding", 6.53 * B, 0.01 * B, "Qwen2.5 report, Table 1: 6.53B non-embedding"),
    ("qwen2.5-72b", "total", 72.7 * B, 0.1 * B, "Qwen2.5 report, Table 1: 72.7B"),
    ("qwen2.5-72b", "non-embedding", 70.0 * B, 0.1 * B, "Qwen2.5 report, Table 1: 70.0B non-embedding"),
    ("qwen3-8b", "total", 8.2 * B, 0.1 * B, "Qwen3 report, Table 1: 8.2B"),
    ("qwen3-8b", "non-embedding", 6.95 * B, 0.01 * B, "Qwen3 report, Table 1: 6.95B non-embedding"),
    ("qwen3-32b", "total", 32.8 * B, 0.1 * B, "Qwen3 report, Table 1: 32.8B"),
    ("qwen3-32b", "non-embedding", 31.2 * B, 0.1 * B, "Qwen3 report, Table 1: 31.2B non-embedding"),
    ("qwen3-14b", "total", 14.8 * B, 0.1 * B, "Qwen/Qwen3-14B model card: 14.8B"),
    ("qwen3-14b", "non-embedding", 13.2 * B, 0.1 * B, "Qwen/Qwen3-14B model card: 13.2B non-embedding"),
    ("qwen3-1.7b", "total", 1.7 * B, 0.1 * B, "Qwen/Qwen3-1.7B model card: 1.7B"),
    ("qwen3-1.7b", "non-embedding", 1.4 * B, 0.1 * B, "Qwen/Qwen3-1.7B model card: 1.4B non-embedding"),
    ("qwen3-0.6b", "total", 0.6 * B, 0.1 * B, "Qwen/Qwen3-0.6B model card: 0.6B"),
    ("qwen3-0.6b", "non-embedding", 0.44 * B, 0.01 * B, "Qwen/Qwen3-0.6B model card: 0.44B non-embedding"),
    ("qwen2.5-0.5b", "total", 0.49 * B, 0.01 * B, "Qwen/Qwen2.5-0.5B model card: 0.49B"),
    ("qwen2.5-0.5b", "non-embedding", 0.36 * B, 0.01 * B, "Qwen/Qwen2.5-0.5B model card: 0.36B non-embedding"),
    ("olmo-2-13b", "total", 13_716_198_400, 1, "safetensors index of allenai/OLMo-2-1124-13B (54,864,793,600 "
     "bytes of fp32); MoFa counts two of its four norm vectors per layer"),
    ("mistral-small-24b", "total", 23_572_403_200, 1, "the text stack of Mistral Small 3.1/3.2 (the 2501 base's "
     "shape); Mistral AI: 24B"),
    ("gpt-oss-120b", "total", 116.8 * B, 0.1 * B, "OpenAI gpt-oss model card: 116.8B total"),
    ("gpt-oss-120b", "active-no-lookup", 5.1 * B, 0.1 * B, "the same card: 5.1B active (embedding lookup not counted)"),
    ("gpt-oss-20b", "total", 20.9 * B, 0.1 * B, "OpenAI gpt-oss model card: 20.9B total"),
    ("gpt-oss-20b", "active-no-lookup", 3.6 * B, 0.1 * B, "the same card: 3.6B active (embedding lookup not counted)"),
]


@pytest.mark.parametrize("name, what, published, unit, source", PUBLISHED,
                         ids=[f"{r[0]}-{r[1]}" for r in PUBLISHED])
def test_parameter_count_matches_the_published_figure(name, what, published, unit, source):
    m = REG.model(name)
    counts = total_params(m)
    ours = {"total": counts["total"], "active": counts["active"],
            "non-embedding": counts["total"] - _embedding(m),
            "active-no-lookup": counts["active"] - m.vocab_size * m.hidden_size,
            "total+vision": counts["total"] + _llama4_vision()}[what]
    assert abs(ours - published) <= max(0.005 * published, unit / 2), f"{name} {what}: {ours:,.0f} vs {source}"


def test_every_zoo_model_has_a_source_and_a_consistent_stack():
    for name, m in REG.models.items():
        assert m.source, name
        assert len(m.layer_kinds) == m.num_layers
    for name in ("nemotron-h-8b", "nemotron-h-47b", "nemotron-h-56b", "nemotron-3-nano"):  # Megatron's pattern: one symbol a layer
        m = REG.model(name)
        assert len(m.layer_pattern) == m.num_layers


def test_benchmark_spellings_resolve():
    for alias, name in (("Llama3.1 405B", "llama3.1-405b"), ("Nemotron 340B", "nemotron-4-340b"),
                        ("Nemotron4 15b", "nemotron-4-15b"), ("LLAMA4 Maverick 400b", "llama4-maverick"),
                        ("Llama 3.1 70B", "llama3.1-70b"), ("Nemotron_3_Nano", "nemotron-3-nano"),
                        ("Llama 3.3 70B", "llama3.1-70b"), ("GLM4.5 355B", "glm-4.5"), ("GLM 4.5 Air", "glm-4.5-air"),
                        ("Mistral 7B", "mistral-7b"), ("LLaMA 65B", "llama-65b"), ("DeepSeek V2", "deepseek-v2"),
                        ("Qwen2.5 72B", "qwen2.5-72b"), ("Qwen3 32B", "qwen3-32b"), ("OPT 175B", "opt-175b"),
                        # Megatron-Bridge's recipe names (llama31_405b_pretrain_config, gpt_oss_20b_...)
                        ("LLAMA31_405B", "llama3.1-405b"), ("llama31_8b", "llama3.1-8b"), ("GPT_OSS_20B", "gpt-oss-20b"),
                        # NeMo recipe spellings of models of the same shape, and NeMo's other pretraining recipes
                        ("QWEN2_72B", "qwen2.5-72b"), ("Qwen2-7B", "qwen2.5-7b"), ("GEMMA_7B", "gemma-7b"),
                        ("Mistral NeMo 12B", "mistral-nemo-12b"),
                        # Megatron-Bridge's Qwen recipes (qwen3_600m, qwen3_1p7b, qwen25_14b), Hub ids, DeepSeek-V3.1
                        ("qwen3_600m", "qwen3-0.6b"), ("qwen3_1p7b", "qwen3-1.7b"), ("Qwen3 14B", "qwen3-14b"),
                        ("Qwen/Qwen2.5-32B", "qwen2.5-32b"), ("Qwen2.5 1.5B", "qwen2.5-1.5b"), ("OLMo 2 7B", "olmo-2-7b"),
                        ("Mistral Small 3.1", "mistral-small-24b"), ("Gemma 3 12B", "gemma-3-12b"),
                        ("DeepSeek-V3.1-Base", "deepseek-v3")):
        assert REG.model(alias).name == name
