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


def test_deepseek_v3_pre_training_hours_are_a_documented_miss(mofa_predictor):
    """DeepSeek-V3 (arXiv 2412.19437, Table 1): pre-training took 2,664K H800 GPU hours for 14.8T
    tokens — 1,543 tokens/s/GPU averaged over the whole run, failures and restarts included, so the
    step-time throughput is at least that. The example maps the report's setup — PP 16 with
    DualPipe, EP 64 over 8 nodes, blockwise FP8, BF16 moments, DeepEP's node-limited dispatch — and
    `mofa e2e` prices the whole run (step time, failures, checkpoints). The H800 profile carries H100
    SXM5's coefficients, fitted on Megatron-Core / NeMo runs; DeepSeek trained with its own stack,
    and the prediction is 12 % under the published GPU hours (2.34 M against 2.664 M;
    docs/validation.md, "H800"). This test pins the miss so a change to it is seen and the doc
    updated: the step throughput above the published average (its lower bound), the whole run
    within 16 % under the report's hours; without DeepEP's dispatch the step is 1.7× slower."""
    from mofa_framework.e2e import e2e_for_job

    published_tps = 14.8e12 / (2664e3 * 3600)
    job = mofa_predictor.load_job(EXAMPLES / "deepseek-v3-h800.toml")
    assert job.schedule == "dualpipe" and "ep_overlap" in job.features
    r = mofa_predictor.predict(job)[0]
    assert r.fits_in_memory
    assert published_tps <= r.tokens_per_s_per_gpu <= 1.25 * published_tps, r.tokens_per_s_per_gpu
    hours = float(e2e_for_job(job, mofa_predictor).gpu_hours)
    assert 0.84 * 2664e3 <= hours <= 0.92 * 2664e3, hours
    plain = mofa_predictor.predict(attrs.evolve(job, features={k: v for k, v in job.features.items()
                                                               if k != "flex_dispatcher"}))[0]
    assert plain.step_time_s > 1.5 * r.step_time_s


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
