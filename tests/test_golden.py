"""Golden values: published FLOPs formulas, Korthikanti et al.'s activation closed forms, and
the textbook pipeline bubble."""

import csv

import numpy as np
import pytest

from mofa_framework.config import jobs_to_batch
from mofa_framework.measurements import builtin_data_dir
from mofa_framework.decompose import model_flops_per_sequence, total_params

DATA = builtin_data_dir()  # the shipped copy of ../shared/data (tests/test_measurement_data.py)


def test_gpt3_175b_model_flops_match_megatron_formula(mofa_predictor):
    """Korthikanti et al. eq. 7 / Narayanan eq. 3 without recompute: 72·B·L·s·h²·(1 + s/6h + V/12hL)."""
    m = mofa_predictor.registry.model("gpt3-175b")
    B, L, s, h, V = 1536, m.num_layers, 2048, m.hidden_size, m.vocab_size
    expected = 72 * B * L * s * h**2 * (1 + s / (6 * h) + V / (12 * h * L))
    ours = 3 * model_flops_per_sequence(m, np.array([s]))[0] * B
    assert ours == pytest.approx(expected, rel=1e-9)


def test_gpt3_175b_step_flops_through_prediction(mofa_predictor):
    job = mofa_predictor.job({"model": {"name": "gpt3-175b"}, "hardware": {"name": "a100-sxm4-80gb", "num_gpus": 768},
                              "parallel": {"tp": 8, "pp": 12, "global_batch_size": 1536, "sequence_length": 2048}})
    r = mofa_predictor.predict(job)[0]
    m = job.model
    expected = 72 * 1536 * 96 * 2048 * m.hidden_size**2 * (1 + 2048 / (6 * m.hidden_size) + m.vocab_size / (12 * m.hidden_size * 96))
    assert r.model_tflops_per_gpu * 1e12 * r.step_time_s * 768 == pytest.approx(expected, rel=1e-9)


def test_llama3_405b_flops_are_6NT_plus_attention(mofa_predictor):
    m = mofa_predictor.registry.model("llama3.1-405b")
    h, L, a, g, f, V = m.hidden_size, m.num_layers, m.num_attention_heads, m.num_kv_heads, m.ffn_hidden_size, m.vocab_size
    d = h // a
    n_matmul = L * (h * a * d + 2 * h * g * d + a * d * h + 3 * h * f) + V * h  # linear layers incl. LM head
    s = 8192
    per_token = 6 * n_matmul + 12 * L * s * h  # PaLM/Chowdhery: 6N + attention (full square)
    ours = 3 * model_flops_per_sequence(m, np.array([s]))[0] / s
    assert ours == pytest.approx(per_token, rel=1e-9)
    # Llama 3 paper: 3.8e25 FLOPs for 405B on 15.6T tokens, the 6·N·T part
    assert 6 * n_matmul * 15.6e12 == pytest.approx(3.8e25, rel=0.02)
    assert total_params(m)["total"] == pytest.approx(405.8e9, rel=0.005)


def _korthikanti_rows():
    rows = list(csv.DictReader(open(DATA / "megatron_selene_a100.csv")))
    return [r for r in rows if r["source"].startswith("Korthikanti") and r["recompute"] in ("full",)]


@pytest.mark.parametrize("row", _korthikanti_rows(), ids=lambda r: f"{r['model_name']}-{r['n_gpus']}")
@pytest.mark.parametrize("sp", [True, False])
def test_activation_memory_per_layer_matches_korthikanti(mofa_predictor, row, sp):
    """cost-model.md §6: TP+SP s·b·h/t·(34 + 5as/h); TP without SP s·b·h·(10 + 24/t + 5as/(ht))."""
    model = mofa_predictor.registry.model(row["model_name"])
    t, p, v = int(row["tp"]), int(row["pp"]), int(row["vpp"] or 1)
    s, b = int(row["seq_len"]), int(row["micro_batch"])
    job = mofa_predictor.job({
        "model": {"name": row["model_name"]}, "hardware": {"name": "a100-sxm4-80gb", "num_gpus": int(row["n_gpus"])},
        "parallel": {"tp": t, "pp": p, "vpp": v, "micro_batch_size": b, "global_batch_size": int(row["global_batch"]),
                     "sequence_length": s, "sequence_parallel": sp, "flash_attention": False, "precision": "fp16"}})
    batch = jobs_to_batch([job], mofa_predictor.registry)
    pred = mofa_predictor.evaluate(batch, job.model, job.hardware)
    h, a = model.hidden_size, model.num_attention_heads
    if sp:
        expected = s * b * h / t * (34 + 5 * a * s / h)
    else:
        expected = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    assert pred.state.layers["dense"].act_saved_bytes[0] == pytest.approx(expected, rel=1e-12)
    # the first stage holds L/p layers of p·(1 + (p−1)/(p·v)) micro-batches (interleaved 1F1B)
    inflight = p * (1 + (p - 1) / (p * v)) if v > 1 else min(p, int(row["global_batch"]) // b)
    first_stage = model.num_layers // p * expected * inflight
    acts = pred.memory_breakdown["activations"][0]
    assert acts >= first_stage * (1 - 1e-9)


def test_interleaved_bubble_is_textbook_with_zero_p2p(mofa_predictor):
    sched = mofa_predictor.registry.schedules["interleaved-1f1b"]
    from mofa_framework.engine import PipelineInputs

    p, v, m = np.array([4.0, 8.0, 8.0]), np.array([2.0, 4.0, 3.0]), np.array([8.0, 32.0, 64.0])
    F_s, B_s, W_s = np.array([1.0, 2.0, 0.5]), np.array([1.5, 2.5, 0.7]), np.array([0.5, 1.0, 0.4])
    x = PipelineInputs(p=p, v=v, m=m, F=F_s / v, B=B_s / v, W=W_s / v, sum_F=p * F_s, sum_B=p * B_s, sum_W=p * W_s,
                       p2p_s=np.zeros(3), steady_p2p_s=np.zeros(3))
    t = sched.time(x)
    assert t.bubble_s == pytest.approx((p - 1) * (F_s + B_s + W_s) / v)
    assert t.pp_comm_s == pytest.approx(0.0)
    assert t.total_s == pytest.approx(m * (F_s + B_s + W_s) + (p - 1) * (F_s + B_s + W_s) / v)
    assert t.warmup_s + t.steady_s + t.cooldown_s == pytest.approx(t.total_s)


def test_1f1b_bubble_and_p2p(mofa_predictor):
    sched = mofa_predictor.registry.schedules["1f1b"]
    from mofa_framework.engine import PipelineInputs

    one = np.ones(1)
    x = PipelineInputs(p=4 * one, v=one, m=16 * one, F=one, B=one, W=one, sum_F=4 * one, sum_B=4 * one,
                       sum_W=4 * one, p2p_s=0.1 * one, steady_p2p_s=0.2 * one)
    t = sched.time(x)
    assert t.bubble_s[0] == pytest.approx(3 * 3.0)
    # every micro-batch's forward and backward p2p is exposed once: 2·m·τ
    assert t.pp_comm_s[0] == pytest.approx(2 * 16 * 0.1)


def test_static_memory_is_18_bytes_per_parameter_without_sharding(mofa_predictor):
    job = mofa_predictor.job({"model": {"name": "llama3-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 1},
                              "parallel": {"global_batch_size": 1, "sequence_length": 1024}})
    r = mofa_predictor.predict(job)[0]
    params = total_params(job.model)["total"]
    static = r.memory_breakdown["weights"] + r.memory_breakdown["gradients"] + r.memory_breakdown["optimizer_states"]
    assert static * 2**30 == pytest.approx(18 * params, rel=1e-9)
