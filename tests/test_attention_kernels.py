"""The attention kernel as a job property (``[parallel] attention_kernel``): published kernel curves
(plugins/attention_kernels.toml, from the FlashAttention-3 paper's Fig. 5-6 bars on H100) move the
profile's FlashAttention-2 point to the job's kernel, sequence and causal mask. Expected values are
the TOML's bars, combined by hand."""

import subprocess
import sys

import attrs
import numpy as np
import pytest

from mofa_framework.batch import ATTENTION_KERNELS, OP_KINDS, PRECISIONS, OperatorBatch
from mofa_framework.errors import ConfigError
from mofa_plugins import _attention_kernels
from mofa_plugins._attention_kernels import multiplier, resolve, table
from mofa_plugins._frameworks import attention_kernel
from mofa_plugins.profiled_attention import attention_seconds

K = {k: ATTENTION_KERNELS.index(k) for k in ATTENTION_KERNELS}


def m(kernel, s, direction="fwd", arch="hopper", d=128, s_ref=8192.0, causal_ref=False):
    return multiplier(np.array([K[kernel]]), arch, direction, np.array([float(d)]), np.array([float(s)]),
                      s_ref, causal_ref)[0]


def test_fa2_causal_at_the_profiled_sequence():
    # FA2 forward, head dim 128, 8K: causal 333 over non-causal 370 (the table measured non-causal)
    assert m("fa2", 8192) == pytest.approx(333 / 370)


def test_short_sequences_run_below_the_asymptotic_rate():
    # causal 512 tokens: 191 over the 8K non-causal point 370; half way in log2 between 2K and 4K: the mean
    assert m("fa2", 512) == pytest.approx(191 / 370)
    assert m("fa2", 2 ** 11.5) == pytest.approx((298 + 319) / 2 / 370)
    # past the largest published sequence (16K: causal 335, unmasked 370) the gap to the unmasked
    # rate closes as 16K/s: at 64K a quarter of it is left
    assert m("fa2", 65536) == pytest.approx((370 - (370 - 335) * 16384 / 65536) / 370)
    assert m("fa2", 2 ** 20) == pytest.approx((370 - 35 / 64) / 370)
    # an unmasked curve is held flat there
    assert m("fa2", 65536, causal_ref=False, s_ref=65536.0) == pytest.approx(m("fa2", 65536) * 370 / 370)


def test_causal_tail_on_a_causal_only_architecture():
    # Blackwell's curves are causal only, to 128K; the unmasked rate they tend to is the causal rate
    # times H100's FA2 full-over-causal forward ratio — at 128K, H100's 16K gap (370 vs 335) closed to
    # 1/8 (370 over 365.6) — held flat past 128K; so at 1M the causal rate has closed 7/8 of that gap
    t = table()
    c128 = _attention_kernels.curve(t, "blackwell", "cudnn", "fwd", True, [128], [131072.0])[0]
    c1m = _attention_kernels.curve(t, "blackwell", "cudnn", "fwd", True, [128], [2.0 ** 20])[0]
    gap = c128 * (370 / (370 - 35 * 16384 / 131072) - 1)  # the derived unmasked rate at 128K, less c128
    assert c1m == pytest.approx(c128 + gap * (1 - 131072 / 2 ** 20))


def test_cudnn_and_fa3_forward_and_backward():
    assert m("cudnn", 4096) == pytest.approx(518 / 370)
    assert m("fa3", 16384) == pytest.approx(616 / 370)
    # backward published without the mask: cuDNN's non-causal backward (499 at 4K) times its forward's
    # causal-over-full ratio at 4K (518/609), over FA2's non-causal backward at 8K (318)
    assert m("cudnn", 4096, "bwd") == pytest.approx(499 * 518 / 609 / 318)


def test_nearest_published_head_dim():
    # head dim 96 is nearer 128 than 64 in log2 (0.415 against 0.585); 48 takes 64's bars
    assert m("fa2", 8192, d=96) == pytest.approx(333 / 370)
    assert m("fa2", 8192, d=48) == pytest.approx(295 / 322)  # 64: causal 295 over non-causal 322


def test_unpublished_kernels_and_architectures_fall_back_to_fa2():
    # FA3 has no Blackwell curve: FA2's; an architecture without curves takes hopper's FA2 shape, every kernel
    assert m("fa3", 4096, arch="blackwell") == m("fa2", 4096, arch="blackwell")
    assert m("cudnn", 4096, arch="cdna3") == pytest.approx(319 / 370)
    # a table of several sequences keeps its own shape: s_ref = s, only the mask and kernel move it
    assert m("fa2", 1024, s_ref=1024.0, causal_ref=True) == pytest.approx(1.0)
    assert m("cudnn", 1024, s_ref=1024.0, causal_ref=True) == pytest.approx(410 / 260)


def test_triton_on_ampere_from_the_fa2_paper():
    # FA2 paper Fig. 4 (A100, fwd+bwd): causal head dim 64 at 2K, Triton 79 and FA2 140, over the
    # non-causal FA2 bar at the profile's 8K (175); the same bars price the backward
    assert m("triton", 2048, arch="ampere", d=64) == pytest.approx(79 / 175)
    assert m("fa2", 2048, arch="ampere", d=64) == pytest.approx(140 / 175)
    assert m("triton", 2048, "bwd", arch="ampere", d=64) == pytest.approx(79 / 175)
    # head dim 128 against its own non-causal 8K bar (201): Triton 2.3x slower than FA2 at 4K
    assert m("triton", 4096, arch="ampere") == pytest.approx(74 / 201)
    assert m("fa2", 4096, arch="ampere") / m("triton", 4096, arch="ampere") == pytest.approx(173 / 74)


def test_triton_elsewhere_keeps_its_ampere_ratio_to_fa2():
    # ratio_from: Hopper's causal FA2 at 4K, head dim 128 (319, FA3 paper) over the profile's 8K
    # non-causal point (370), times Triton over FA2 on the A100 at the same shape (74 / 173)
    assert m("triton", 4096) == pytest.approx(319 / 370 * 74 / 173)
    # head dim 64 at 2K: Hopper FA2 262 over its 64-dim 8K point 322, times the A100's 79 / 140
    assert m("triton", 2048, d=64) == pytest.approx(262 / 322 * 79 / 140)
    # past both papers' 16K: Hopper's FA2 closes half its gap to 370 at 32K; the A100 ratio of Triton
    # to FA2, both causal curves closing their gaps to their unmasked rates (95 / 203 at 16K, head 128)
    tri = 95 - (95 - 80) / 2
    fa2 = 203 - (203 - 189) / 2
    assert m("triton", 32768) == pytest.approx((370 - 35 / 2) / 370 * tri / fa2)
    assert m("triton", 4096, "bwd") < m("fa2", 4096, "bwd")
    assert table().ratio_from == {"triton": "ampere"}
    # an architecture with no curves of its own keeps the prior (ratio 1): AMD's Triton is another kernel
    assert m("triton", 4096, arch="cdna3") == pytest.approx(319 / 370)


def test_ratio_from_must_name_a_kernel_and_a_published_architecture():
    t = table()
    with pytest.raises(ValueError, match="ratio_from"):
        attrs.evolve(t, ratio_from={"triton": "volta"})
    with pytest.raises(ValueError, match="ratio_from"):
        attrs.evolve(t, ratio_from={"xformers": "ampere"})


def test_blackwell_curves_are_causal_only():
    # cudnn-frontend's B200 benchmark (causal only): cuDNN forward 1171.3 at 8K over FA2's causal 399.9 moved
    # to the unmasked 8K reference by hopper's FA2 forward full-over-causal ratio (370/333)
    assert m("cudnn", 8192, arch="blackwell") == pytest.approx(1171.3 / (399.9 * 370 / 333))
    assert m("cudnn", 4096, "bwd", arch="blackwell") == pytest.approx(701.3 / (318.0 * 370 / 333))
    # Blackwell Ultra (GB300): its own curves, cuDNN forward 1495.7 against FA2 439.9 at 8K
    assert m("cudnn", 8192, arch="blackwell-ultra") == pytest.approx(1495.7 / (439.9 * 370 / 333))
    assert m("fa2", 8192, arch="blackwell") == pytest.approx(333 / 370)


def test_auto_is_the_architectures_kernel():
    codes = np.array([K["auto"], K["fa2"], K["triton"]])
    assert list(resolve(codes, "hopper")) == [K["cudnn"], K["fa2"], K["triton"]]
    assert list(resolve(codes, "blackwell"))[0] == K["cudnn"]
    assert list(resolve(codes, "blackwell-ultra"))[0] == K["cudnn"]
    assert list(resolve(codes, "ampere"))[0] == K["fa2"]
    assert table().auto["default"] == "fa2"


def test_kernel_prices_the_operator(mofa_predictor):
    h = mofa_predictor.registry.hardware_profile("h100-sxm5-80gb")
    h = attrs.evolve(h, efficiency=attrs.evolve(h.efficiency, profiled_attention_relative_efficiency=1.0,
                                                kernel_launch_s=0.0, host_dispatch_s=0.0))
    rate = h.attention_profile[0].tflops * 1e12
    ops = OperatorBatch(flops=np.full(2, 1e12), bytes=np.zeros(2), kind=np.full(2, OP_KINDS.index("attention")),
                        precision=np.full(2, PRECISIONS.index("bf16")), gemm_m=np.full(2, 4096.0),
                        gemm_n=np.full(2, 2048.0), gemm_k=np.full(2, 128.0),
                        attention_kernel=np.array([K["fa2"], K["auto"]]))
    t = attention_seconds(ops, h, np.zeros(2))
    # causal keys 2048 → sequence 4096; FA2 forward 319/370, backward 310·(319/368)/318 (its fwd causal ratio)
    fwd, bwd = 319 / 370, 310 * (319 / 368) / 318
    assert t[0] == pytest.approx((1e12 / (rate * fwd) + 2.5 * 1e12 / (rate * bwd)) / 3.5)
    cf, cb = 518 / 370, 499 * 518 / 609 / 318  # auto on hopper: cuDNN
    assert t[1] == pytest.approx((1e12 / (rate * cf) + 2.5 * 1e12 / (rate * cb)) / 3.5)


def test_job_property_reaches_the_prediction(mofa_predictor):
    base = {"model": {"name": "llama3-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 8},
            "parallel": {"global_batch_size": 64, "sequence_length": 8192}}
    steps = {}
    for k in ("fa2", "cudnn", "fa3"):
        job = mofa_predictor.job({**base, "parallel": {**base["parallel"], "attention_kernel": k}})
        r = mofa_predictor.predict([job])[0]
        assert r.parallel["attention_kernel"] == k
        steps[k] = r.step_time_s
    assert steps["fa2"] > steps["cudnn"] > steps["fa3"]  # 8K causal: FA3 616-602 > cuDNN 529-539 > FA2
    with pytest.raises(ConfigError, match="attention_kernel"):
        mofa_predictor.job({**base, "parallel": {**base["parallel"], "attention_kernel": "fa4"}})


def test_cli_flag_and_bad_value():
    args = [sys.executable, "-m", "mofa_framework.cli", "predict", "--model", "llama3-8b", "--hardware",
            "h100-sxm5-80gb", "--gpus", "8", "--gbs", "64", "--seq", "8192", "--format", "json"]
    out = subprocess.run([*args, "--attention-kernel", "fa3"], capture_output=True, text=True)
    assert out.returncode == 0 and '"attention_kernel": "fa3"' in out.stdout
    bad = subprocess.run([*args, "--attention-kernel", "fa4"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--attention-kernel" in bad.stderr and "Traceback" not in bad.stderr


def test_readers_infer_the_kernel_from_the_framework():
    assert attention_kernel("Composer / llm-foundry (PyTorch FSDP)") == "triton"
    assert attention_kernel("torchtitan (2024-12, torch 1963fc8)") == "fa2"
    assert attention_kernel("Megatron-Bridge / NeMo 26.02") == "auto"
    # Meta's 2024 PyTorch-native stack (Llama 3): FlashAttention-2, SDPA's only flash kernel then
    assert attention_kernel("Meta Llama 3 stack 2024") == "fa2"
    assert attention_kernel("metaseq (OPT, 2022)") == "auto" and attention_kernel("Megatron-LM 2021") == "auto"


@pytest.mark.parametrize("framework, release, kernel", [
    ("NeMo", "NeMo 24.03.01.framework", "fa2"),          # the long-context runs' container
    ("NeMo (1.0/Megatron)", "NeMo 24.07", "fa2"),        # the NVIDIA schema: release in its own column
    ("NeMo 24.07 (Megatron-Core)", "", "fa2"),           # the dense schema: release in the framework text
    ("NeMo", "NeMo 24.01", "fa2"),
    ("NeMo", "NeMo 24.09", "auto"),                      # the launcher's 24.09 dropped NVTE_FUSED_ATTN=0
    ("NeMo 2.0", "NeMo 25.04.rc2", "auto"),
    ("Megatron-Bridge", "25.09", "auto"),
])
def test_nemo_launcher_2024_releases_ran_flash_attention_2(framework, release, kernel):
    """NeMo Framework Launcher 24.01–24.07's ``launcher_scripts/conf/config.yaml`` sets
    ``NVTE_FUSED_ATTN: 0`` ("Disable cudnn FA until we've tested it more"), so Transformer Engine ran
    flash-attn 2 on H100 instead of the cuDNN attention it otherwise prefers there."""
    assert attention_kernel(framework, release) == kernel


def test_nvidia_reader_reads_the_kernel_from_the_release(mofa_predictor):
    from mofa_framework.measurements import builtin_data_dir, map_files

    mapped, _, _ = map_files([builtin_data_dir() / "nemo_long_context.csv"], mofa_predictor.registry)
    kernel = {m.row_id: m.job["parallel"]["attention_kernel"] for m in mapped}
    assert kernel["NEMO-LONGSEQ-016"] == kernel["NEMO-LONGSEQ-032"] == "fa2"   # NeMo 24.03 on H100
    assert kernel["NEMO-LONGSEQ-001"] == kernel["NEMO-LONGSEQ-015"] == "auto"  # NeMo 25.04 on B200
