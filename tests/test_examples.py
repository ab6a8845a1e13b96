"""The bundled example jobs predict, fit, and land in plausible bands of what was measured."""

from pathlib import Path

import attrs
import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.stem)
def test_every_example_predicts_and_fits(mofa_predictor, path):
    job = mofa_predictor.load_job(path)
    r = mofa_predictor.predict(job)[0]
    assert r.fits_in_memory, f"{path.name}: {r.peak_memory_gib:.1f} GiB"
    assert sum(r.breakdown.values()) == pytest.approx(r.step_time_s)
    assert 0.05 < r.mfu < 0.75


def test_llama3_405b_mfu_in_published_band(mofa_predictor):
    """Llama 3 (arXiv 2407.21783, Table 4): 430 TFLOPS/GPU, 43 % BF16 MFU on 8,192 H100s at
    TP8 PP16 DP64, and 400 TFLOPS/GPU, 41 % on 16,384 at DP128 (38–43 % across its three
    configurations). The examples run it as Meta did (§3.3.2: interleaved 1F1B, end stages one
    layer lighter; the interleaving factor, not published, is the tuner's) with the H100 profile
    fitted on NVIDIA's runs, whose held-out error is ~14 % (docs/validation.md): each prediction
    must stay within 20 % of the measurement — 25 % for the 16,384-GPU example, which runs without
    activation recompute (MoFa's choice: it fits in 73 GiB there; Meta's policy is not published;
    with the 8,192-GPU example's one recomputed layer per chunk it predicts 409 TFLOPS/GPU, 2 %
    from Meta's 400) — and Meta's measured step must lie inside the band MoFa prints for the job."""
    for name, mfu, tflops, tol in (("llama3-405b-h100.toml", 0.43, 430, 0.2), ("llama3-405b-e2e.toml", 0.41, 400, 0.25)):
        r = mofa_predictor.predict(mofa_predictor.load_job(EXAMPLES / name))[0]
        assert mfu * (1 - tol) <= r.mfu <= mfu * (1 + tol), (name, r.mfu)
        assert tflops * (1 - tol) <= r.model_tflops_per_gpu <= tflops * (1 + tol), (name, r.model_tflops_per_gpu)
        measured_s = r.step_time_s * r.model_tflops_per_gpu / tflops
        assert r.step_time_s_low <= measured_s <= r.step_time_s_high, (name, measured_s, r.step_time_s_low)


def test_deepseek_v3_throughput_is_a_documented_miss(mofa_predictor):
    """DeepSeek-V3 (arXiv 2412.19437, Table 1): pre-training took 2,664K H800 GPU hours for 14.8T
    tokens, 1,543 tokens/s/GPU averaged over the whole run (failures and restarts included, so the
    step-time throughput is at least that). The example maps the report's setup — PP 16, EP 64
    over 8 nodes, FP8, ep_overlap for DualPipe's overlap and DeepEP's node-limited dispatch. The
    H800 profile carries H100 SXM5's coefficients (the same die), fitted on Megatron-Core / NeMo
    runs — Transformer Engine's FP8 GEMMs at 0.81 of the cuBLASLt table, a few ms of host time per
    micro-batch; DeepSeek trained with its own stack (DeepGEMM, DualPipe), so the prediction is
    ~18 % under the published lower bound (docs/validation.md, "H800"). This test pins the miss so
    a change to it is seen and the doc updated; without the dispatcher the example is slower still."""
    published = 14.8e12 / (2664e3 * 3600)
    job = mofa_predictor.load_job(EXAMPLES / "deepseek-v3-h800.toml")
    r = mofa_predictor.predict(job)[0]
    assert published * 0.75 <= r.tokens_per_s_per_gpu <= published * 0.85, r.tokens_per_s_per_gpu
    plain = mofa_predictor.predict(attrs.evolve(job, features={k: v for k, v in job.features.items()
                                                               if k != "flex_dispatcher"}))[0]
    assert plain.tokens_per_s_per_gpu < 0.8 * r.tokens_per_s_per_gpu


def test_lora_example_reproduces_nvidias_run(mofa_predictor):
    """Megatron-Bridge's LoRA of Llama 3 70B on 8 H100s (NeMo 26.06 performance summary: 2,643
    tokens/s/GPU, 32 × 4,096 tokens per step → 6.20 s): the example is that job; within 10 %, the
    measurement inside its band, and no weight gradient but the adapters' (under 1 % of the step)."""
    r = mofa_predictor.predict(mofa_predictor.load_job(EXAMPLES / "llama3-70b-lora-h100.toml"))[0]
    measured_s = 32 * 4096 / (2643 * 8)
    assert r.step_time_s == pytest.approx(measured_s, rel=0.10)
    assert r.step_time_s_low <= measured_s <= r.step_time_s_high
    assert r.breakdown["compute_bwd_weight"] < 0.01 * r.step_time_s
    # LoRA's model FLOPs (forward + input gradient of each weight GEMM): at the measured step they give
    # NVIDIA's own 735 TFLOPS/GPU for this row
    assert r.model_tflops_per_gpu * r.step_time_s / measured_s == pytest.approx(735, rel=0.02)
