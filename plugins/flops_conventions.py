"""How published sources count a training step's FLOPs (the ``flops_conventions`` plugin).

A source that reports only TFLOPS per GPU or MFU gives a step time once its FLOPs count is known:
``t = F(model, B, s) / (TFLOPS · GPUs)``. Each function below is one published count of a step of
``B`` sequences of ``s`` tokens, with ``h`` the hidden size, ``L`` the layers, ``V`` the
vocabulary, ``a`` the attention heads, ``g`` the KV heads, ``d`` the head dimension, ``f`` the MLP
width, and ``N`` the weights of every GEMM a token passes through (attention projections, the MLP
— for an MoE its top-k routed and its shared experts — and the output layer, not the input
embedding):

- :func:`six_nd_flops` — ``6·N·B·s`` (Kaplan et al. 2020; Chinchilla): no attention term.
- :func:`palm_flops` — ``6·N + 6·L·a·s·(d_qk + d_v)`` per token (PaLM, Chowdhery et al. 2022
  App. B: ``6N + 12·L·H·Q·T``; Korthikanti et al. 2022 eq. 7; MegaScale, torchtitan, llm-foundry):
  model FLOPs with the attention scores over the whole sequence (no causal halving).
- :func:`megatron_2021_flops` — Narayanan et al. 2021 eq. 3, ``96·B·s·L·h²·(1 + s/6h + V/16Lh)``:
  model FLOPs plus the recomputed forward of full activation recompute (GPT models).
- :func:`megatron_core_flops` — Megatron-LM's ``num_floating_point_operations``
  (``megatron/training/training.py``), what Megatron-Core logs as TFLOP/s/GPU: causal attention
  (``s/2``), GQA, MLA, MoE (dense-first layers, top-k routed and shared experts), MTP layers;
  for a stack with Mamba-2 or gated DeltaNet layers its per-layer hybrid count
  (:func:`megatron_core_layer_flops`).
- :func:`nemo_flops` — NeMo's ``nemo/utils/flops_formulas.py`` (``gpt3``, ``llama2``/``llama3``,
  ``nemotron``, ``mixtral``), what NeMo's performance tables report as model TFLOP/s/GPU: full
  attention (``4·s·h`` per token and layer), projections sized by ``h``.

Each function's test in ``tests/test_flops_conventions.py`` checks a value derived by hand.
"""

from __future__ import annotations

from mofa_framework import hookimpl
from mofa_framework.types import Activation, FlopsConvention, ModelSpec


def _transformer_only(model: ModelSpec, convention: str) -> None:
    """Every convention here counts transformer layers (attention then an MLP or MoE): a stack with
    other layers (Mamba, linear attention, a lone MLP) has no count in it, so none is made up."""
    other = sorted(k for k, b in model.block_kinds.items() if not b.is_attention or b.ffn == "none")
    if other:
        raise ValueError(f"the {convention} count covers transformer layers only; this model's stack also has "
                         f"{', '.join(other)} layers")


def _mlp_mats(model: ModelSpec) -> int:
    """GEMMs of one MLP: gated (SwiGLU) three, plain two."""
    return 3 if model.activation is Activation.swiglu else 2


def attention_weights(model: ModelSpec) -> float:
    """Weights of one layer's attention projections (Q, K, V, output; MLA's down/up projections)."""
    h, a = model.hidden_size, model.num_attention_heads
    if model.is_mla:
        qk, rope, v = model.qk_head_dim, model.qk_rope_head_dim, model.v_head_dim
        q = h * model.q_lora_rank + model.q_lora_rank * a * qk if model.q_lora_rank else h * a * qk
        kv = h * (model.kv_lora_rank + rope) + model.kv_lora_rank * a * (qk - rope + v)
        return float(q + kv + a * v * h)
    d, g = model.kv_channels, model.num_kv_heads
    return float(h * a * d + 2 * h * g * d + a * d * h)


def active_gemm_weights(model: ModelSpec) -> float:
    """``N``: the GEMM weights one token passes through, all layers plus the output layer."""
    _transformer_only(model, "6·N·D / PaLM")
    h, mats = model.hidden_size, _mlp_mats(model)
    dense = mats * h * model.ffn_hidden_size
    moe = mats * h * model.moe_ffn_hidden_size * (model.experts_per_token + model.num_shared_experts)
    mlp = model.num_dense_layers * dense + model.num_moe_layers * moe
    return model.num_layers * attention_weights(model) + mlp + h * model.vocab_size


def six_nd_flops(model: ModelSpec, global_batch_size: int, sequence_length: int) -> float:
    """``6·N·D``: forward (2) and backward (4) FLOPs per weight per token, no attention scores."""
    return 6.0 * active_gemm_weights(model) * global_batch_size * sequence_length


def palm_flops(model: ModelSpec, global_batch_size: int, sequence_length: int) -> float:
    """PaLM's model FLOPs: ``6·N`` plus ``6·L·a·s·(d_qk + d_v)`` per token for QKᵀ and AV over the
    whole sequence (``12·L·H·Q·T`` when the query and value head dimensions are equal)."""
    s, a = sequence_length, model.num_attention_heads
    scores = 6.0 * model.num_layers * a * s * (model.qk_head_dim + model.v_dim)
    return (6.0 * active_gemm_weights(model) + scores) * global_batch_size * s


def megatron_2021_flops(model: ModelSpec, global_batch_size: int, sequence_length: int) -> float:
    """Narayanan et al. 2021 eq. 3 (GPT: ``4h`` MLP, full attention): ``96·B·s·L·h²·(1 + s/6h + V/16Lh)``,
    model FLOPs plus one recomputed forward."""
    if model.is_moe or model.is_mla:
        raise ValueError("Narayanan's eq. 3 counts dense GPT layers only")
    _transformer_only(model, "Narayanan eq. 3")
    h, L, s, V = model.hidden_size, model.num_layers, sequence_length, model.vocab_size
    return 96.0 * global_batch_size * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))


def _megatron_core_attention(model: ModelSpec, s: int) -> float:
    """Megatron-LM's per-token forward attention GEMMs of one layer ÷ 2 (the causal score products
    counted over half the sequence)."""
    h, a = model.hidden_size, model.num_attention_heads
    if model.is_mla:
        nope, rope, v = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
        q = (model.q_lora_rank * (h + a * (nope + rope) + 1) if model.q_lora_rank
             else h * a * (nope + rope))
        kv = model.kv_lora_rank * (h + a * (nope + v) + 1) + h * rope
        return q + kv + a * v * h + s * a * (nope + rope) / 2 + s * a * v / 2
    q = model.kv_channels * a
    kv = model.kv_channels * model.num_kv_heads
    return h * (q + 2 * kv) + q * s / 2 * 2 + q * h


def _recurrent(model: ModelSpec) -> bool:
    return any(b.mixer in ("mamba2", "gated_deltanet") for b in model.block_kinds.values())


def _mamba2_count(model: ModelSpec) -> float:
    """Megatron-LM's ``mamba_layer_flops`` per token: in_proj ``2h·(2·d_in + 2GN + H)``, scan
    ``7·d_in·N``, out_proj ``2·d_in·h``, with ``d_in = 2h`` whatever the heads (Megatron's choice:
    Nemotron 3 Nano's 64 heads of 64 are 4,096 channels, counted as 5,376)."""
    h, n, g = model.hidden_size, model.mamba_state_size, model.mamba_num_groups
    d_in = 2 * h
    heads = model.mamba_num_heads or d_in // model.mamba_head_dim
    return 2.0 * h * (2 * d_in + 2 * g * n + heads) + 7.0 * d_in * n + 2.0 * d_in * h


def _gdn_count(model: ModelSpec) -> float:
    """Megatron-LM's gated DeltaNet count per token: 2·(in_proj ``h·(2·Hk·dk + 2·Hv·dv + 2Hv)``,
    conv1d ``K·(2·Hk·dk + Hv·dv)``, delta rule ``4·Hv·dv²``, out_proj ``h·Hv·dv``)."""
    h, qk = model.hidden_size, model.linear_num_key_heads * model.linear_key_head_dim
    hv, dv = model.linear_num_value_heads, model.linear_value_head_dim
    return 2.0 * (h * (2 * qk + 2 * hv * dv + 2 * hv) + model.linear_conv_kernel * (2 * qk + hv * dv)
                  + 4 * hv * dv * dv + h * hv * dv)


def _layer_count(model: ModelSpec, block, s: int) -> float:
    """Forward FLOPs per token of one layer, Megatron-LM's hybrid terms: its mixer (attention: the
    projections, an output gate's columns and the causal scores; Mamba-2; gated DeltaNet) plus its
    MLP (``2·h·f·(3|2)``) or MoE (top-k routed and shared experts; LatentMoE's experts at the
    latent width ℓ, ``2·ℓ·f_e·(3|2)·k``, plus its down and up projections ``2·2·h·ℓ``)."""
    h, mats = model.hidden_size, _mlp_mats(model)
    if block.mixer == "attention":
        if block.attention not in ("model", "full") or model.sliding_window or model.is_mla:
            raise ValueError("Megatron-Core's hybrid count has full attention only (no window, chunk or MLA)")
        gate = h * model.kv_channels * model.num_attention_heads if block.output_gate else 0
        mixer = 2.0 * (_megatron_core_attention(model, s) + gate)
    else:
        mixer = {"none": 0.0, "mamba2": _mamba2_count(model), "gated_deltanet": _gdn_count(model)}.get(block.mixer)
        if mixer is None:
            raise ValueError(f"Megatron-Core counts no {block.mixer} layer")
    ffn = {"none": 0, "dense": model.ffn_hidden_size, "moe": model.shared_expert_ffn}[block.ffn]
    routed = 0.0
    if block.ffn == "moe":  # routed experts at their width (LatentMoE: ℓ, plus the h↔ℓ projections)
        routed = 2.0 * model.expert_width * mats * model.moe_ffn_hidden_size * model.experts_per_token
        routed += 4.0 * h * model.moe_latent_size
    return mixer + 2.0 * h * mats * ffn + routed


def megatron_core_layer_flops(model: ModelSpec, global_batch_size: int, sequence_length: int) -> float:
    """Megatron-LM's ``num_floating_point_operations`` for a stack with Mamba-2 or gated DeltaNet
    layers (its ``hybrid_flops``; the transformer path's linear-attention term is the same per
    layer): ``3·B·s·[Σ_layers (mixer + ffn) + 2·h·V·(1 + n_mtp)]``, each MTP module its layers
    (``mtp_layer_pattern``, else one of the stack's last kind; no norms or projection, as the
    hybrid count has none), run n_mtp times whether or not the modules share weights."""
    s, blocks = sequence_length, model.block_kinds
    layers = sum(n * _layer_count(model, blocks[k], s) for k, n in model.executed_kind_counts.items())
    logits = 2.0 * model.hidden_size * model.vocab_size * (1 + model.num_mtp_layers)
    return 3.0 * global_batch_size * s * (layers + logits)


def megatron_core_flops(model: ModelSpec, global_batch_size: int, sequence_length: int) -> float:
    """Megatron-LM's ``num_floating_point_operations`` for a transformer (not hybrid) model:
    ``6·B·s·[h·(3|2)·(f·L_dense + (k·f_e + f_shared)·L_moe) + L·attn + MTP + h·V·(1 + n_mtp)]``,
    MTP layers counted as extra layers of the last layer's kind plus their norms and projection.
    A stack with Mamba-2 or gated DeltaNet layers: :func:`megatron_core_layer_flops`."""
    if _recurrent(model):
        return megatron_core_layer_flops(model, global_batch_size, sequence_length)
    _transformer_only(model, "Megatron-Core")
    h, s, mats = model.hidden_size, sequence_length, _mlp_mats(model)
    mtp = model.num_mtp_layers
    last_is_moe = model.mtp_kind in model.moe_kinds  # MTP layers repeat the stack's last kind
    dense_layers = model.num_dense_layers + (0 if last_is_moe else mtp)
    moe_layers = model.num_moe_layers + (mtp if last_is_moe else 0)
    shared = model.num_shared_experts * model.moe_ffn_hidden_size
    mlp = h * mats * (model.ffn_hidden_size * dense_layers
                      + (model.moe_ffn_hidden_size * model.experts_per_token + shared) * moe_layers)
    attn = (model.num_layers + mtp) * _megatron_core_attention(model, s)
    mtp_proj = mtp * (3 * h + 2 * h * h)
    logits = h * model.vocab_size * (1 + mtp)
    return 6.0 * global_batch_size * s * (mlp + attn + mtp_proj + logits)


def nemo_flops(model: ModelSpec, global_batch_size: int, sequence_length: int) -> float:
    """NeMo's ``flops_formulas``: per token and layer ``6h² + 6h²·g/a`` for the attention
    projections, ``6·h·f·(3 | 2)`` for the MLP (Mixtral: ``f·k`` for its top-k experts) and
    ``12·s·h`` for the attention scores over the whole sequence, plus ``6·h·V``."""
    if model.is_mla:
        raise ValueError("NeMo's DeepSeek-V3 formula is not implemented")
    _transformer_only(model, "NeMo")
    if model.is_moe and (model.num_shared_experts or model.num_dense_layers):
        raise ValueError("NeMo's MoE formula (mixtral) counts only models whose every layer is MoE "
                         "without shared experts")
    h, L, s = model.hidden_size, model.num_layers, sequence_length
    f = model.moe_ffn_hidden_size * model.experts_per_token if model.is_moe else model.ffn_hidden_size
    kv = model.num_kv_heads / model.num_attention_heads
    per_token_layer = 2 * h * (h + 2 * h * kv) + 2 * h * h + 2 * h * f * _mlp_mats(model) + 4 * s * h
    return float(global_batch_size) * s * (3 * L * per_token_layer + 6 * h * model.vocab_size)


@hookimpl
def mofa_register_flops_conventions():
    return [
        FlopsConvention(name="6nd", aliases=("6ND", "six-nd", "kaplan", "chinchilla"), step_flops=six_nd_flops,
                        description="6·N·D: six FLOPs per GEMM weight per token, no attention term",
                        source="Kaplan et al. 2020 (arXiv 2001.08361) §2.1; Hoffmann et al. 2022"),
        FlopsConvention(name="palm", aliases=("model-flops", "korthikanti-eq7", "6n+12lhqt"), step_flops=palm_flops,
                        description="model FLOPs: 6·N plus the attention scores over the whole sequence",
                        source="Chowdhery et al. 2022 (arXiv 2204.02311) App. B; Korthikanti et al. 2022 "
                               "(arXiv 2205.05198) eq. 7"),
        FlopsConvention(name="megatron-2021", aliases=("megatron-eq3", "narayanan-eq3"),
                        step_flops=megatron_2021_flops, counts_recompute=True,
                        description="96·B·s·L·h²·(1 + s/6h + V/16Lh): model FLOPs plus the recomputed forward",
                        source="Narayanan et al. 2021 (arXiv 2104.04473) eq. 3"),
        FlopsConvention(name="megatron-core", aliases=("megatron-lm",), step_flops=megatron_core_flops,
                        description="Megatron-LM's num_floating_point_operations: causal attention, GQA, MLA, "
                                    "MoE, MTP, Mamba-2 and gated DeltaNet layers",
                        source="NVIDIA/Megatron-LM megatron/training/training.py num_floating_point_operations"),
        FlopsConvention(name="nemo", aliases=("nemo-flops-formulas",), step_flops=nemo_flops,
                        description="NeMo's flops_formulas (gpt3, llama2/3, nemotron, mixtral): full attention",
                        source="NVIDIA/NeMo nemo/utils/flops_formulas.py"),
    ]
