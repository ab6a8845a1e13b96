"""LatentMoE and MTP modules as a layer pattern with shared weights (Nemotron 3 Super / Ultra / 3.5 Nano).

Hand values use Nemotron 3 Super's published shape (Megatron-Bridge's Nemotron3SuperProvider):
h = 4096, E = 512 experts of f = 2688 (top-22, squared-ReLU: two matrices), latent ℓ = 1024, one
shared expert of 5376, MTP = an attention + MoE pair run twice on one set of weights."""

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mofa_framework.api import Predictor
from mofa_framework.config import model_from_hf_dict
from mofa_framework.decompose import (
    GEMM,
    Geometry,
    layer_collectives,
    layer_operators,
    layer_params,
    model_flops_per_sequence,
    mtp_module_params,
    saved_activation_bytes,
    total_params,
)
from mofa_framework.engine import _params_on_stages, stage_layout
from mofa_framework.errors import ConfigError

REG = Predictor().registry
SUPER = REG.model("nemotron-3-super")


def _gemm_flops(model, kind, seq=8192.0):
    g = Geometry.unit([seq])
    return sum(float(np.asarray(o.flops)[0]) for o in layer_operators(model, g, kind)
               if np.all(np.asarray(o.kind) == GEMM))


def test_latent_moe_layer_flops_by_hand():
    """Forward GEMM FLOPs per token of one Super MoE layer: router 2·h·E = 4,194,304; down and up
    projections 2·2·h·ℓ = 16,777,216; 22 experts of two ℓ×f matrices 2·22·2·1024·2688 = 242,221,056;
    the shared expert 2·2·h·5376 = 88,080,384; sum 351,272,960."""
    assert _gemm_flops(SUPER, "moe_mlp") / 8192 == pytest.approx(351_272_960, rel=1e-12)


def test_latent_moe_layer_parameters_by_hand():
    """One Super MoE layer: experts 512·2·1024·2688 = 2,818,572,288 (EP-sharded); router 4096·512 =
    2,097,152, projections 2·4096·1024 = 8,388,608 and the pre-norm 4096 replicated (10,489,856); the
    shared expert 2·4096·5376 = 44,040,192 TP-sharded."""
    p = layer_params(SUPER, "moe_mlp")
    assert p == {"sharded": 44_040_192.0, "replicated": 10_489_856.0, "expert": 2_818_572_288.0}


def test_latent_moe_dispatch_and_saved_bytes_by_hand():
    """EP all-to-all moves the ℓ-wide tokens: T·k·ℓ·2 bytes = 8192·22·1024·2 = 369,098,752 per
    direction (a quarter of a 4096-wide dispatch). Saved for backward: the MoE's input is the block's;
    the dispatched tokens T·k·ℓ·2 = 369,098,752 (not T·k·h·2), fc1 output and activation
    T·k·2·f·2 = 1,937,768,448, the combined latent output T·ℓ·2 = 16,777,216, the fp32 routing
    probabilities 4·T·E = 16,777,216 and the shared expert's 2·T·2·5376 = 176,160,768; with the layer
    input and normed input 2·T·h·2 = 134,217,728: 2,650,800,128."""
    g = Geometry.unit([8192.0])
    a2a = [c for c in layer_collectives(SUPER, g, "moe_mlp") if c.name == "ep_a2a"][0]
    assert float(np.asarray(a2a.bytes)[0]) == 369_098_752
    saved = saved_activation_bytes(SUPER, g, "moe_mlp")
    assert float(np.asarray(saved.total)[0]) == 2_650_800_128


@settings(max_examples=25, deadline=None)
@given(h=st.sampled_from([256, 512, 1024]), k=st.integers(1, 4), f=st.sampled_from([128, 384]),
       seq=st.sampled_from([256.0, 1024.0]), ep=st.sampled_from([1.0, 4.0]))
def test_latent_equal_to_hidden_is_plain_moe_plus_two_projections(h, k, f, seq, ep):
    """LatentMoE with ℓ = h routes, dispatches and computes its experts exactly as the plain MoE; what
    it adds is its two h×h projections: 2h² parameters, 2·2·h² FLOPs per token, T·h saved elements."""
    plain = attrs.evolve(SUPER, name="plain", hidden_size=h, num_attention_heads=8, head_dim=32,
                         num_experts=8, experts_per_token=k, moe_ffn_hidden_size=f, shared_expert_ffn_hidden_size=f,
                         moe_latent_size=0, mamba_num_heads=2 * h // 64)
    latent = attrs.evolve(plain, name="latent", moe_latent_size=h)
    g = attrs.evolve(Geometry.unit([seq]), e=np.array([ep]))
    ops_p = {o.name: o for o in layer_operators(plain, g, "moe_mlp")}
    ops_l = {o.name: o for o in layer_operators(latent, g, "moe_mlp")}
    assert set(ops_l) - set(ops_p) == {"latent_down_proj", "latent_up_proj"}
    for name, o in ops_p.items():
        assert np.array_equal(np.asarray(o.flops), np.asarray(ops_l[name].flops)), name
        assert np.array_equal(np.asarray(o.bytes), np.asarray(ops_l[name].bytes)), name
    proj = sum(float(np.asarray(ops_l[n].flops)[0]) for n in ("latent_down_proj", "latent_up_proj"))
    assert proj == 2 * 2 * h * h * seq
    for cp, cl in zip(layer_collectives(plain, g, "moe_mlp"), layer_collectives(latent, g, "moe_mlp")):
        assert np.array_equal(np.asarray(cp.bytes), np.asarray(cl.bytes)), cp.name
    pp, pl = layer_params(plain, "moe_mlp"), layer_params(latent, "moe_mlp")
    assert pl["expert"] == pp["expert"] and pl["sharded"] == pp["sharded"]
    assert pl["replicated"] - pp["replicated"] == 2 * h * h
    sp, sl = saved_activation_bytes(plain, g, "moe_mlp"), saved_activation_bytes(latent, g, "moe_mlp")
    assert float(np.asarray(sl.total - sp.total)[0]) == 2.0 * seq * h


def test_latent_moe_checks():
    with pytest.raises(ValueError, match="moe_latent_size .* must not exceed hidden_size"):
        attrs.evolve(SUPER, moe_latent_size=8192)
    with pytest.raises(ValueError, match="MoE models only"):
        attrs.evolve(REG.model("llama3-8b"), moe_latent_size=1024)
    with pytest.raises(ValueError, match="the stack does not have"):  # a stack without a pattern: its kinds only
        attrs.evolve(REG.model("deepseek-v3"), mtp_layer_pattern="*")
    # a patterned stack prices an MTP module's own kinds (DeepSeek-V4 Pro's window-only MTP layer)
    own = attrs.evolve(SUPER, mtp_layer_pattern="-")
    assert own.mtp_kind_counts == {"mlp": 1} and "mlp" in own.block_kinds and "mlp" not in own.kind_counts
    with pytest.raises(ValueError, match="num_mtp_layers is 0"):
        attrs.evolve(SUPER, num_mtp_layers=0)
    with pytest.raises(ValueError, match="^mtp_layer_pattern uses undefined symbol"):  # names its own key
        attrs.evolve(SUPER, mtp_layer_pattern="*Q")


def test_mtp_modules_are_priced_as_their_pattern_run_num_mtp_layers_times():
    """Model FLOPs: each of the two MTP modules adds one attention and one MoE layer and one more LM
    head (2·h·V per token), whether or not the modules share weights."""
    no_mtp = attrs.evolve(SUPER, num_mtp_layers=0, mtp_layer_pattern="", mtp_shared_weights=False)
    s = 8192.0
    diff = float(model_flops_per_sequence(SUPER, [s])[0] - model_flops_per_sequence(no_mtp, [s])[0])
    g = Geometry.unit([s])
    layer = lambda kind: sum(float(np.asarray(o.flops)[0]) for o in layer_operators(SUPER, g, kind)  # noqa: E731
                             if np.all(np.asarray(o.kind) == GEMM) or o.name == "ssd_scan")
    expected = 2 * (layer("attention") + layer("moe_mlp")) + 2 * 2.0 * s * 4096 * 131072
    assert diff == pytest.approx(expected, rel=1e-12)


def test_shared_mtp_weights_are_held_once_on_the_last_stage():
    """Parameters of one MTP module: its attention layer (35,651,584 + norm 4096), its MoE layer
    (2,873,102,336), the [embedding; hidden] projection 2h² = 33,554,432 and three norms 3h = 12,288:
    2,942,324,736. Super shares them between its two modules: the last stage holds them once; two
    unshared modules hold them twice."""
    mp = mtp_module_params(SUPER)
    assert sum(mp.values()) == 2_942_324_736
    from mofa_framework.config import jobs_to_batch, job_from_dict

    def last_stage(model):
        job = job_from_dict({"model": {"name": "nemotron-3-super"}, "hardware": {"name": "gb300-nvl72", "num_gpus": 2},
                             "parallel": {"pp": 2, "global_batch_size": 8, "sequence_length": 4096}}, REG)
        batch = jobs_to_batch([job], REG)
        dense, expert = _params_on_stages(model, batch, stage_layout(model, batch))
        return float(dense[2][0] + expert[2][0])

    unshared = attrs.evolve(SUPER, mtp_shared_weights=False)
    assert last_stage(SUPER) - last_stage(attrs.evolve(SUPER, num_mtp_layers=0, mtp_layer_pattern="",
                                                      mtp_shared_weights=False)) == pytest.approx(sum(mp.values()))
    assert last_stage(unshared) - last_stage(SUPER) == pytest.approx(sum(mp.values()))


def test_nemotron_3_parameter_counts_against_nvidia():
    """Ultra: 550B total, 55B active (NVIDIA, arXiv 2606.15007), active counted without the input
    embedding's lookup (1.07B): ours 549.3B and 54.99B. Super: 120B total and 12B active as NVIDIA
    writes them (arXiv 2604.12374), figures with a trailing zero and a whole unit: ours 120.67B and
    12.23B. MTP weights are not in these totals (they are counted apart, as DeepSeek counts them)."""
    ultra = total_params(REG.model("nemotron-3-ultra"))
    assert ultra["total"] == pytest.approx(550e9, rel=0.005)
    assert ultra["active"] - 131072 * 8192 == pytest.approx(55e9, rel=0.005)
    sup = total_params(SUPER)
    assert abs(sup["total"] - 120e9) <= 1e9 and abs(sup["active"] - 131072 * 4096 - 12e9) <= 0.5e9


SUPER_HF = {
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": 4096,
    "num_hidden_layers": 88, "hybrid_override_pattern": SUPER.layer_pattern, "num_attention_heads": 32,
    "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 2688, "mamba_num_heads": 128,
    "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 128, "conv_kernel": 4, "chunk_size": 128,
    "n_routed_experts": 512, "num_experts_per_tok": 22, "moe_intermediate_size": 2688,
    "moe_shared_expert_intermediate_size": 5376, "n_shared_experts": 1, "moe_latent_size": 1024,
    "num_nextn_predict_layers": 1, "mtp_hybrid_override_pattern": "*E", "vocab_size": 131072,
    "mlp_hidden_act": "relu2", "rms_norm_eps": 1e-05, "tie_word_embeddings": False}


def test_nemotron_h_config_with_latent_moe_and_mtp_imports():
    """The HF config names one MTP module ("*E"); the zoo's pretraining entry runs it twice on
    shared weights (Megatron's --mtp-num-layers 2 --mtp-use-repeated-layer): same weights, same stack."""
    m = model_from_hf_dict(SUPER_HF, "super/config.json")
    assert m.moe_latent_size == 1024 and m.mtp_kind_counts == {"attention": 1, "moe_mlp": 1}
    assert m.layer_kinds == SUPER.layer_kinds and total_params(m) == total_params(SUPER)
    assert mtp_module_params(m) == mtp_module_params(SUPER)


def test_nemotron_h_layers_block_type_list_without_num_hidden_layers():
    """Nemotron 3 Ultra's config.json has num_hidden_layers null and lists layers_block_type (and
    mtp_layers_block_type); written as the zoo entry's stack, it imports to the zoo's model."""
    ultra = REG.model("nemotron-3-ultra")
    names = {"mamba2": "mamba", "moe_mlp": "moe", "attention": "attention"}
    cfg = {**SUPER_HF, "hidden_size": 8192, "num_hidden_layers": None, "num_attention_heads": 64,
           "intermediate_size": 5120, "mamba_num_heads": 256, "moe_intermediate_size": 5120,
           "moe_shared_expert_intermediate_size": 10240, "moe_latent_size": 2048,
           "layers_block_type": [names[k] for k in ultra.layer_kinds],
           "mtp_layers_block_type": ["attention", "moe"]}
    del cfg["hybrid_override_pattern"], cfg["mtp_hybrid_override_pattern"]
    m = model_from_hf_dict(cfg, "ultra/config.json")
    assert m.num_layers == 108 and m.layer_kinds == ultra.layer_kinds
    assert total_params(m) == total_params(ultra)
    with pytest.raises(ConfigError, match="layers_block_type"):
        model_from_hf_dict({**cfg, "layers_block_type": ["mamba", "gru"]}, "bad/config.json")


def test_ssd_scan_priced_as_fa2_at_the_published_crossover():
    """Nemotron 3 Nano's SSD (H = 64 heads of P = 64, N = 128, G = 8, Q = 128): its FLOPs per token
    stay 2·(Q·G·N + Q·H·P + 2·H·P·N) = 2·(131,072 + 524,288 + 1,048,576) = 3,407,872; it is priced as
    causal attention over L* = 2048 keys (n = 1024 keys per query), H·2·P·L* = 16,777,216 per token."""
    from mofa_framework.decompose import SCAN

    nano = REG.model("nemotron-3-nano")
    g = Geometry.unit([8192.0])
    op = [o for o in layer_operators(nano, g, "mamba2") if o.name == "ssd_scan"][0]
    assert op.kind == SCAN and float(np.asarray(op.n)[0]) == 1024 and op.k == 64
    assert float(np.asarray(op.flops)[0]) == 8192 * 3_407_872
    assert float(np.asarray(op.priced_flops)[0]) == 8192 * 16_777_216


@pytest.mark.parametrize("row, tflops, step_s, gpus, model", [
    ("MB-CUR-013", 831, 6.649, 64, "nemotron-3-super"), ("MB-CUR-014", 864, 6.4, 64, "nemotron-3-super"),
    ("MB-ARC-013", 598, 9.309, 64, "nemotron-3-super"),
    ("MB-CUR-017", 1281, 2.306, 256, "nemotron-3-ultra"), ("MB-CUR-018", 923, 3.241, 256, "nemotron-3-ultra"),
    ("MB-CUR-012", 807, 18.286, 8, "nemotron-3.5-nano"), ("MB-CUR-011", 901, 13.128, 8, "nemotron-3-nano"),
])
def test_megatron_core_count_matches_the_bridge_rows_tflops(row, tflops, step_s, gpus, model):
    """Megatron-Bridge publishes both tokens/s and TFLOPS for these rows (nvidia_megatron_bridge.csv,
    gbs·8192 tokens a step): TFLOPS × step time × GPUs is its FLOPs count per step. Megatron-Core's
    hybrid count with the latent experts, their projections and the two MTP modules ("*E", twice)
    gives it within 2 %: the rows' two columns scatter that much for one model (Super 0.998-1.005,
    Ultra 0.983-0.995), as much as Nemotron 3 Nano's, which has neither a latent nor MTP (0.988)."""
    from mofa_plugins.flops_conventions import megatron_core_flops

    gbs = {"nemotron-3-ultra": 256}.get(model, 512)
    ours = megatron_core_flops(REG.model(model), gbs, 8192)
    assert ours == pytest.approx(tflops * 1e12 * step_s * gpus, rel=0.02), row
