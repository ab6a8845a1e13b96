"""HuggingFace ``config.json`` → the fields of a :class:`~mofa_framework.types.ModelSpec`.

Every common family is read: the Llama/Mistral/Qwen/Gemma/Phi/DeepSeek key set, GPT-2-style
(``n_embd``, ``n_layer``, ``n_head``, ``n_inner``), GPT-NeoX, Falcon (``n_head_kv``,
``multi_query``), OPT (``ffn_dim``), Bloom, MPT (``d_model``, ``expansion_ratio``), DBRX
(``ffn_config``/``attn_config``), multimodal wrappers (``text_config``), and the layer stacks of
Nemotron-H (``hybrid_override_pattern``), Jamba (attention/expert periods), Gemma 2/3 and
GPT-OSS (``layer_types``, sliding-window patterns), Llama 4 (chunked attention, ``no_rope_layers``,
``interleave_moe_layer_step``), Qwen3-Next (gated DeltaNet + gated attention) and Arctic (the
dense residual MLP beside the MoE).

The document is untrusted input: every value is checked for its type and range as it is read,
and any problem is one :class:`~mofa_framework.errors.ConfigError` line naming the key, the
value and the fix. Facts about a family (which MLPs are gated, which norms LayerNorm, which
families tie embeddings by default) are HuggingFace's published ``modeling_*``/``configuration_*``
choices, listed below.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import attrs

from .errors import ConfigError
from .limits import decode_text
from .stack import BUILTIN_BLOCKS, BlockSpec

#: families whose MLP is gated (three matrices: SwiGLU, GeGLU)
GATED = frozenset({
    "llama", "llama4", "llama4_text", "mistral", "mistral3", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "qwen3_next", "gemma", "gemma2", "gemma3", "gemma3_text", "phi3", "phimoe", "deepseek", "deepseek_v2",
    "deepseek_v3", "dbrx", "jamba", "arctic", "grok-1", "grok", "olmo", "olmo2", "olmoe", "granite", "granitemoe",
    "cohere", "cohere2", "internlm2", "baichuan", "gpt_oss", "glm4", "glm4_moe", "exaone", "stablelm",
})
#: families whose MLP has two matrices (GELU, ReLU, squared ReLU)
NON_GATED = frozenset({
    "gpt2", "gpt_neox", "gpt_neo", "gptj", "gpt_bigcode", "codegen", "falcon", "refinedweb", "refinedwebmodel", "opt",
    "bloom", "mpt", "phi", "nemotron", "nemotron_h", "starcoder2",
})
#: families normalised with LayerNorm (the rest: RMSNorm unless the keys say otherwise)
LAYERNORM = frozenset({
    "gpt2", "gpt_neox", "gpt_neo", "gptj", "gpt_bigcode", "codegen", "falcon", "refinedweb", "refinedwebmodel", "opt",
    "bloom", "mpt", "phi", "nemotron", "starcoder2", "dbrx", "cohere", "cohere2", "stablelm",
})
#: families whose configuration class ties the input and output embeddings by default
TIED_BY_DEFAULT = frozenset({
    "gpt2", "gpt_neo", "gpt_bigcode", "opt", "bloom", "mpt", "falcon", "refinedweb", "refinedwebmodel", "gemma",
    "gemma2", "gemma3", "gemma3_text", "grok-1",
})
#: families whose blocks run attention and MLP side by side from one input (GPT-J's residual), with the
#: key that turns it off where the family has one (and its default)
PARALLEL_BLOCK = {"gptj": None, "codegen": None, "cohere": None, "cohere2": None, "phi": None,
                  "gpt_neox": ("use_parallel_residual", True), "stablelm": ("use_parallel_residual", False),
                  "falcon": ("parallel_attn", True), "refinedweb": ("parallel_attn", True),
                  "refinedwebmodel": ("parallel_attn", True)}
#: position embeddings other than RoPE
POSITIONS = {"gpt2": "learned", "gpt_neo": "learned", "gpt_bigcode": "learned", "opt": "learned", "bloom": "alibi",
             "nemotron_h": "none", "jamba": "none"}
#: the largest integer a config may hold for a size
MAX_SIZE = 1 << 24
#: how long a per-layer list may be
MAX_LIST = 1 << 16

_FIX = "fix the config.json, or describe the model in a job file's [model] section (docs/job-file.md)"


class _Cfg:
    """Typed, bounded access to one JSON object of a config (``where`` names the file and key path)."""

    def __init__(self, data: dict, where: str, path: str = ""):
        self.data, self.where, self.path = data, where, path

    def _bad(self, key: str, value: Any, expected: str) -> ConfigError:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return ConfigError(f"{self.where}: {self.path}{key} = {shown}: expected {expected}; {_FIX}")

    def first(self, *keys: str) -> tuple[str | None, Any]:
        for k in keys:
            if self.data.get(k) is not None:
                return k, self.data[k]
        return None, None

    def int(self, *keys: str, default: int | None = None) -> int | None:
        key, value = self.first(*keys)
        if key is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
            raise self._bad(key, value, "a whole number")
        if not 0 <= value <= MAX_SIZE:
            raise self._bad(key, value, f"a whole number from 0 to {MAX_SIZE}")
        return int(value)

    def number(self, *keys: str, default: float | None = None) -> float | None:
        key, value = self.first(*keys)
        if key is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise self._bad(key, value, "a finite number ≥ 0")
        return float(value)

    def bool(self, key: str, default: bool | None = None) -> bool | None:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._bad(key, value, "true or false")
        return value

    def str(self, *keys: str, default: str | None = None) -> str | None:
        key, value = self.first(*keys)
        if key is None:
            return default
        if not isinstance(value, str):
            raise self._bad(key, value, "a string")
        return value

    def list(self, key: str, item: type, count: int | None = None, empty_is_none: bool = False) -> list | None:
        value = self.data.get(key)
        if value is None or (empty_is_none and value == []):
            return None
        kind = {str: "strings", int: "whole numbers"}.get(item, item.__name__)
        what = f"a list of {count} {kind}" if count is not None else f"a list of {kind}"
        if not isinstance(value, list) or not value or len(value) > MAX_LIST:
            raise self._bad(key, value, f"{what} (one per layer)")
        ok = all(isinstance(x, item) and not (item is int and isinstance(x, bool)) for x in value)
        if not ok or (count is not None and len(value) != count):
            raise self._bad(key, value, f"{what} (one per layer)")
        return value

    def obj(self, key: str) -> _Cfg | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self._bad(key, value, "a JSON object {...}")
        return _Cfg(value, self.where, f"{self.path}{key}.")


def read_hf_bytes(data: bytes, where: str) -> dict:
    """The JSON object of a config.json's bytes (ConfigError for anything else)."""
    text = decode_text(data, where, "a HuggingFace config.json is UTF-8 JSON: re-download or re-save it")
    try:
        cfg = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
        raise ConfigError(f"{where}: cannot read HuggingFace config.json: not JSON ({msg}); fix the file") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}: a HuggingFace config.json holds one JSON object {{...}}, got "
                          f"{'null' if cfg is None else type(cfg).__name__}; give the model's config.json")
    return cfg


def hf_model_fields(cfg: dict, where: str, fallback_name: str = "hf-model") -> dict:
    """ModelSpec fields (file units, ready for cattrs) from a config.json object."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}: a HuggingFace config.json holds one JSON object {{...}}")
    outer = _Cfg(cfg, where)
    c = outer.obj("text_config") or outer.obj("llm_config") or outer
    mt = (c.str("model_type") or outer.str("model_type") or "").lower()
    out: dict[str, Any] = {}
    attn, ffn_cfg = c.obj("attn_config"), c.obj("ffn_config")  # DBRX, MPT
    out["num_layers"] = _num_layers(c, mt)
    h = out["hidden_size"] = _required(c, "hidden_size", "n_embd", "n_embed", "d_model")
    heads = out["num_attention_heads"] = _required(c, "num_attention_heads", "n_head", "n_heads", "num_heads")
    kv = c.int("num_key_value_heads", "num_kv_heads", "n_head_kv", "num_query_groups")
    if kv is None and attn is not None:
        kv = attn.int("kv_n_heads")
    if kv is None and c.bool("multi_query"):
        kv = 1  # Falcon-7B's multi-query attention
    out["num_kv_heads"] = kv or heads
    dbrx_ffn = ffn_cfg.int("ffn_hidden_size") if ffn_cfg else None
    ffn = c.int("intermediate_size_mlp") or c.int("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", "d_ff")
    if ffn is None and c.number("expansion_ratio") is not None:  # MPT
        ffn = int(c.number("expansion_ratio") * h)
    out["ffn_hidden_size"] = ffn or dbrx_ffn or 4 * h
    vocab_keys = ("vocab_size", "padded_vocab_size", "n_vocab")
    out["vocab_size"] = _required(c if c.first(*vocab_keys)[0] else outer, *vocab_keys)
    for key, field in (("head_dim", "head_dim"), ("attention_head_dim", "head_dim"), ("kv_channels", "head_dim"),
                       ("max_position_embeddings", "max_sequence_length"), ("n_positions", "max_sequence_length"),
                       ("max_seq_len", "max_sequence_length"), ("seq_length", "max_sequence_length"),
                       ("n_ctx", "max_sequence_length")):
        value = c.int(key)
        if value is not None and field not in out:
            out[field] = value
    tied = c.bool("tie_word_embeddings", outer.bool("tie_word_embeddings"))
    out["tied_embeddings"] = (mt in TIED_BY_DEFAULT) if tied is None else tied
    out["activation"] = _activation(c, mt)
    out["normalization"] = ("layernorm" if mt in LAYERNORM or ("layer_norm_eps" in c.data and "rms_norm_eps" not in
                                                                  c.data) else "rmsnorm")
    out["position_embedding"] = POSITIONS.get(mt, "alibi" if attn is not None and attn.bool("alibi") else "rope")
    if mt in PARALLEL_BLOCK:
        key = PARALLEL_BLOCK[mt]
        out["parallel_attention_mlp"] = True if key is None else bool(c.bool(key[0], key[1]))
    _moe(c, mt, out, ffn_cfg, dbrx_ffn)
    _mla_and_mtp(c, out)
    _recurrent(c, mt, out)
    _stack(c, mt, out)
    stem = outer.str("_name_or_path") or mt or fallback_name
    out["name"] = re.sub(r"[^a-z0-9.\-]+", "-", stem.lower()).strip("-.")[:100] or "hf-model"
    if not out["name"][0].isalnum():
        out["name"] = "hf-" + out["name"]
    return out


#: Nemotron-H's layers_block_type / mtp_layers_block_type names, as Megatron-Core's hybrid symbols
NEMOTRON_H_BLOCKS = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}


def _nemotron_h_pattern(c: _Cfg, key: str) -> str | None:
    """A Nemotron-H ``layers_block_type``-style list (Nemotron 3 Ultra's config has no
    hybrid_override_pattern and a null num_hidden_layers) as the hybrid pattern, or None."""
    types = c.list(key, str, empty_is_none=True)
    if types is None:
        return None
    unknown = sorted({t for t in types if t not in NEMOTRON_H_BLOCKS})
    if unknown:
        raise c._bad(key, unknown[0], f"layer types from {', '.join(NEMOTRON_H_BLOCKS)}")
    return "".join(NEMOTRON_H_BLOCKS[t] for t in types)


def _num_layers(c: _Cfg, mt: str) -> int:
    keys = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
    if mt == "nemotron_h" and c.first(*keys)[0] is None:
        pattern = c.str("hybrid_override_pattern") or _nemotron_h_pattern(c, "layers_block_type")
        if pattern:
            return len(pattern)
    return _required(c, *keys)


def _required(c: _Cfg, *keys: str) -> int:
    value = c.int(*keys)
    if value is None:
        raise ConfigError(f"{c.where}: no {' / '.join(c.path + k for k in keys)} key: the config.json does not say "
                          f"the model's size; {_FIX}")
    return value


def _activation(c: _Cfg, mt: str) -> str:
    if mt in GATED:
        return "swiglu"
    if mt in NON_GATED:
        return "gelu"
    act = (c.str("hidden_act", "activation_function", "mlp_hidden_act", "hidden_activation") or "silu").lower()
    return "gelu" if ("gelu" in act and "glu" not in mt) or "relu" in act else "swiglu"


def _moe(c: _Cfg, mt: str, out: dict, ffn_cfg: _Cfg | None, dbrx_ffn: int | None) -> None:
    experts = c.int("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
    top = c.int("num_experts_per_tok", "moe_top_k", "num_selected_experts", "top_k")
    if ffn_cfg is not None:
        experts = experts or ffn_cfg.int("moe_num_experts")
        top = top or ffn_cfg.int("moe_top_k")
    if not experts:
        return
    out["num_experts"] = experts
    out["experts_per_token"] = top or 0
    if mt.startswith("llama4"):  # the experts' width is intermediate_size; the dense layers' intermediate_size_mlp
        out["moe_ffn_hidden_size"] = c.int("intermediate_size") or out["ffn_hidden_size"]
        out["num_shared_experts"] = 1
    else:
        out["moe_ffn_hidden_size"] = c.int("moe_intermediate_size") or dbrx_ffn or out["ffn_hidden_size"]
    shared = c.int("n_shared_experts", "num_shared_experts")
    if shared:
        out["num_shared_experts"] = shared
    width = c.int("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size")
    if c.bool("parallel_attn_mlp_res"):  # Arctic: a dense residual MLP of hidden_size beside the MoE (a shared expert)
        width = out["hidden_size"]
    if width:
        out["shared_expert_ffn_hidden_size"] = width
    groups, group_top = c.int("n_group"), c.int("topk_group")
    if groups:
        out["moe_router_num_groups"] = groups
        out["moe_router_group_topk"] = group_top or 0
    first = c.int("first_k_dense_replace")
    if first:
        out["first_k_dense_layers"] = first


def _mla_and_mtp(c: _Cfg, out: dict) -> None:
    for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        value = c.int(key)
        if value:
            out[key] = value
    mtp = c.int("num_nextn_predict_layers")
    if mtp:
        out["num_mtp_layers"] = mtp
        # Nemotron 3's MTP modules are an attention + MoE pair (mtp_hybrid_override_pattern "*E")
        pattern = c.str("mtp_hybrid_override_pattern") or _nemotron_h_pattern(c, "mtp_layers_block_type")
        if pattern:
            out["mtp_layer_pattern"] = pattern
    latent = c.int("moe_latent_size")
    if latent:
        out["moe_latent_size"] = latent


def _recurrent(c: _Cfg, mt: str, out: dict) -> None:
    for key, field in (("ssm_state_size", "mamba_state_size"), ("mamba_d_state", "mamba_state_size"),
                       ("mamba_num_heads", "mamba_num_heads"), ("mamba_head_dim", "mamba_head_dim"),
                       ("n_groups", "mamba_num_groups"), ("mamba_n_groups", "mamba_num_groups"),
                       ("conv_kernel", "mamba_conv_kernel"), ("mamba_d_conv", "mamba_conv_kernel"),
                       ("mamba_chunk_size", "mamba_chunk_size"), ("expand", "mamba_expand"),
                       ("mamba_expand", "mamba_expand"), ("linear_num_key_heads", "linear_num_key_heads"),
                       ("linear_num_value_heads", "linear_num_value_heads"),
                       ("linear_key_head_dim", "linear_key_head_dim"),
                       ("linear_value_head_dim", "linear_value_head_dim"),
                       ("linear_conv_kernel_dim", "linear_conv_kernel")):
        value = c.int(key)
        if value and field not in out:
            out[field] = value
    if mt == "nemotron_h" and c.int("chunk_size"):
        out["mamba_chunk_size"] = c.int("chunk_size")
    rank = c.data.get("mamba_dt_rank")
    if rank is not None and rank != "auto":
        out["mamba_dt_rank"] = c.int("mamba_dt_rank")


def _stack(c: _Cfg, mt: str, out: dict) -> None:
    """The layer stack: a pattern when the layers differ beyond first_k_dense_layers' dense-then-MoE."""
    n = out["num_layers"]
    pattern = c.str("hybrid_override_pattern")
    if pattern is None and mt == "nemotron_h":
        pattern = _nemotron_h_pattern(c, "layers_block_type")
    if pattern is not None:  # Nemotron-H: Megatron-Core's hybrid symbols, one per layer
        bad = sorted(set(pattern) - set("M*-E"))
        if len(pattern) != n or bad:
            raise c._bad("hybrid_override_pattern", pattern, f"{n} symbols from 'M', '*', '-', 'E' (one per layer)")
        out["layer_pattern"] = pattern
        if "E" not in pattern:  # MoE defaults of the configuration class, unused by this stack
            for key in ("num_experts", "experts_per_token", "moe_ffn_hidden_size", "num_shared_experts",
                        "shared_expert_ffn_hidden_size", "moe_router_num_groups", "moe_router_group_topk"):
                out.pop(key, None)
        out.pop("first_k_dense_layers", None)
        return
    mixers = _mixers(c, mt, n)
    attention = _attention_types(c, mt, n, out)
    ffns = _ffns(c, mt, n, out)
    gate = mt == "qwen3_next"  # Qwen3-Next's full-attention layers gate their output
    blocks = [BlockSpec(mixer=m, attention=a if m == "attention" else "model", output_gate=gate and m == "attention",
                        ffn=f) for m, a, f in zip(mixers, attention, ffns)]
    if mt == "deepseek_v4":
        blocks, mtp = _deepseek_v4(c, n, out, ffns)
        symbols = _write_pattern(blocks + mtp, out, len(blocks))
        if mtp:
            out["mtp_layer_pattern"] = "".join(symbols[b] for b in mtp)
        return
    uniform_mixer = all(b.mixer == "attention" and b.attention == "model" and not b.output_gate for b in blocks)
    if uniform_mixer and _legacy_moe(ffns, out):
        return
    _write_pattern(blocks, out)


#: DeepSeek-V4's ratio whose layers run the lightning indexer over overlapping windows (HF's
#: ``DeepseekV4Attention``: an indexer where ``compress_ratio == 4``)
V4_INDEXED_RATIO = 4


def _deepseek_v4(c: _Cfg, n: int, out: dict, ffns: list[str]) -> tuple[list[BlockSpec], list[BlockSpec]]:
    """DeepSeek-V4's blocks from ``compress_ratios`` (one per layer, then one per MTP layer: 0 =
    the window alone, else compressed attention; indexed at ratio 4) and its attention fields."""
    mtp = out.get("num_mtp_layers", 0)
    ratios = c.list("compress_ratios", int)
    if ratios is None or len(ratios) < n or any(r < 0 or r == 1 for r in ratios):
        raise c._bad("compress_ratios", c.data.get("compress_ratios"),
                     f"{n} (+ {mtp} MTP) whole numbers, 0 (window only) or ≥ 2 (tokens pooled into one key)")
    if not out.get("sliding_window"):
        raise c._bad("sliding_window", c.data.get("sliding_window"), "the local window (> 0) every layer attends")
    for key, field in (("o_lora_rank", "o_lora_rank"), ("o_groups", "o_groups"), ("index_topk", "index_topk"),
                       ("index_n_heads", "index_num_heads"), ("index_head_dim", "index_head_dim"),
                       ("hc_mult", "hyper_connections")):
        value = c.int(key)
        if value:
            out[field] = value
    out["kv_shared"] = True
    out.pop("qk_rope_head_dim", None)  # a share of head_dim here, not MLA's separate RoPE key
    out.pop("first_k_dense_layers", None)

    def block(r: int) -> BlockSpec:
        if not r:
            return BlockSpec(attention="sliding", ffn="moe")
        return BlockSpec(attention="compressed", compress_ratio=r, indexed=r == V4_INDEXED_RATIO, ffn="moe")

    layers = [block(r) if f == "moe" else attrs.evolve(block(r), ffn="dense") for r, f in zip(ratios, ffns)]
    return layers, [block(r) for r in ratios[n:n + mtp]]


def _mixers(c: _Cfg, mt: str, n: int) -> list[str]:
    types = c.list("layer_types", str, n) if mt in ("qwen3_next",) else None
    if types is not None:
        return ["gated_deltanet" if t == "linear_attention" else "attention" for t in types]
    if mt == "qwen3_next":
        every = c.int("full_attention_interval", default=4) or 4
        return ["attention" if (i + 1) % every == 0 else "gated_deltanet" for i in range(n)]
    if mt == "jamba":
        period, offset = c.int("attn_layer_period", default=1) or 1, c.int("attn_layer_offset", default=0)
        return ["attention" if i % period == offset else "mamba" for i in range(n)]
    return ["attention"] * n


def _attention_types(c: _Cfg, mt: str, n: int, out: dict) -> list[str]:
    window = c.int("sliding_window")
    if window and c.bool("use_sliding_window", True) is not False:
        out["sliding_window"] = window
    chunk = c.int("attention_chunk_size")
    types = c.list("layer_types", str, n)
    if types is not None:
        names = {"full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "chunked",
                 "linear_attention": "model", "attention": "full"}
        unknown = sorted({t for t in types if t not in names})
        if unknown:
            raise c._bad("layer_types", unknown[0], f"one of {', '.join(map(repr, names))} per layer")
        kinds = [names[t] for t in types]
        if "sliding" in kinds and not out.get("sliding_window"):
            raise c._bad("sliding_window", c.data.get("sliding_window"), "the window (> 0) of its sliding_attention layers")
        if "chunked" in kinds:
            if not chunk:
                raise c._bad("attention_chunk_size", chunk, "the chunk (> 0) of its chunked_attention layers")
            out["attention_chunk_size"] = chunk
        return kinds
    if mt.startswith("llama4") and chunk:
        out["attention_chunk_size"] = chunk
        every = c.int("no_rope_layer_interval", default=4) or 4  # [] or absent: HF's default interval
        rope = c.list("no_rope_layers", int, n, empty_is_none=True) or [int((i + 1) % every != 0) for i in range(n)]
        return ["chunked" if r else "full" for r in rope]
    if out.get("sliding_window") and mt in ("gemma2", "gemma3", "gemma3_text"):
        every = 2 if mt == "gemma2" else c.int("sliding_window_pattern", "_sliding_window_pattern", default=6) or 6
        return ["sliding" if (i + 1) % every else "full" for i in range(n)]
    return ["model"] * n


def _ffns(c: _Cfg, mt: str, n: int, out: dict) -> list[str]:
    if not out.get("num_experts"):
        return ["dense"] * n
    if mt.startswith("llama4"):
        layers = [] if c.data.get("moe_layers") == [] else c.list("moe_layers", int)
        step = c.int("interleave_moe_layer_step", default=1) or 1
        moe = set(layers) if layers is not None else set(range(step - 1, n, step))
        return ["moe" if i in moe else "dense" for i in range(n)]
    if mt == "jamba":
        period, offset = c.int("expert_layer_period", default=1) or 1, c.int("expert_layer_offset", default=0)
        return ["moe" if i % period == offset else "dense" for i in range(n)]
    step = c.int("decoder_sparse_step", "moe_layer_frequency", "moe_layer_freq", default=1) or 1
    dense_only = set(c.list("mlp_only_layers", int, empty_is_none=True) or [])
    first = out.get("first_k_dense_layers", 0)
    if mt == "arctic" or mt.startswith("qwen"):  # MoE where (i + 1) % step == 0 (HF's modeling code)
        return ["moe" if i >= first and (i + 1) % step == 0 and i not in dense_only else "dense" for i in range(n)]
    # DeepSeek's moe_layer_freq, Megatron's --moe-layer-freq: MoE where i % step == 0
    return ["moe" if i >= first and i % step == 0 and i not in dense_only else "dense" for i in range(n)]


def _legacy_moe(ffns: list[str], out: dict) -> bool:
    """Whether first_k_dense_layers alone (MoE from there on) says where the MoE layers are."""
    if "moe" not in ffns:
        return True
    first = ffns.index("moe")
    if all(f == "moe" for f in ffns[first:]):
        out["first_k_dense_layers"] = first
        return True
    return False


def _write_pattern(blocks: list[BlockSpec], out: dict, layers: int | None = None) -> dict[BlockSpec, str]:
    """``layer_pattern`` (and ``blocks``) spelling the first `layers` of `blocks` (all by default;
    the rest are MTP layers that need symbols only): built-in symbols where they fit, letters for
    the rest; a stack that repeats one unit is written ``(unit)count``. Returns each block's symbol."""
    out.pop("first_k_dense_layers", None)
    known = {b: s for s, b in BUILTIN_BLOCKS.items()}
    symbols, custom = [], {}
    letters = iter("abcdefghijklmnopqrstuvwyz")
    for b in blocks:
        if b not in known:
            known[b] = next(letters)
            custom[known[b]] = {k: v for k, v in attrs.asdict(b).items()
                                if k in ("mixer", "attention", "output_gate", "ffn") or v}
        symbols.append(known[b])
    text = "".join(symbols[:layers])
    symbols = symbols[:layers]
    for period in range(1, len(text) // 2 + 1):
        if len(text) % period == 0 and text == text[:period] * (len(text) // period):
            unit = text[:period]
            text = f"{unit}{len(symbols)}" if period == 1 else f"({unit}){len(text) // period}"
            break
    out["layer_pattern"] = text
    if custom:
        out["blocks"] = custom
    return known
