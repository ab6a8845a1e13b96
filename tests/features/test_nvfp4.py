"""NVFP4 training (Transformer Engine's NVFP4 recipe): expected values derived here by hand."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from mofa_framework.config import jobs_to_batch
from mofa_framework.errors import ConfigError
from mofa_framework.testing.contract import assert_same_row

# GPT-3 175B on GB300: TP 8, PP 8 (12 layers per stage), flash attention
BASE = {"model": {"name": "gpt3-175b"}, "hardware": {"name": "gb300-nvl72", "num_gpus": 128},
        "parallel": {"tp": 8, "pp": 8, "micro_batch_size": 1, "global_batch_size": 64, "sequence_length": 2048,
                     "flash_attention": True}}
LAYERS_PER_STAGE = 12


def _job(pred, features=None, precision="bf16"):
    return pred.job({**BASE, "parallel": {**BASE["parallel"], "precision": precision}, "features": features or {}})


def _evaluate(pred, jobs, hardware=None):
    return pred.evaluate(jobs_to_batch(jobs, pred.registry), jobs[0].model, hardware or jobs[0].hardware)


def close(a, b, rel=1e-9):
    np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=rel, atol=1e-12)


def test_nvfp4_casts_weights_and_saved_inputs(mofa_predictor):
    jobs = [_job(mofa_predictor, {"nvfp4": {}}, precision="fp4"), _job(mofa_predictor, None, precision="fp4"),
            _job(mofa_predictor, {"nvfp4": {}}), _job(mofa_predictor)]
    pred = _evaluate(mofa_predictor, jobs)
    L, hw = pred.state.layers["dense"], pred.state.ctx.hardware
    T, h, t = 2048.0, 12288.0, 8.0
    bw = hw.efficiency.memory_efficiency * hw.hbm_bandwidth_bytes_per_s
    # read bf16 for the amax, read it again, write row- and column-wise NVFP4 (+ E4M3 scales)
    per_element = 2 + 2 + 2 * (0.5 + 1 / 16)
    cast_f = per_element * T * h * (2 + 5 / t) / bw  # inputs of QKV (T·h), O (T·h/t), FC1 (T·h), FC2 (T·4h/t)
    cast_b = per_element * T * h * (2 + 7 / t) / bw  # output grads: QKV T·3h/t, O T·h, FC1 T·4h/t, FC2 T·h
    # precision = "fp4" already prices the GEMMs at fp4: the feature adds only the casts
    close(L.fwd_compute_s[0], L.fwd_compute_s[1] + cast_f)
    close(L.bwd_input_s[0], L.bwd_input_s[1] + cast_b)
    close(L.bwd_weight_s[0], L.bwd_weight_s[1])
    # on a bf16 row it gives the same layer (attention stays bf16 either way), faster than bf16
    close(L.fwd_compute_s[2], L.fwd_compute_s[0])
    assert L.fwd_compute_s[2] < L.fwd_compute_s[3]
    # saved GEMM inputs: QKV, FC1, O (2·T·h/t bytes each) + FC2 (2·T·4h/t), kept as 0.5625-byte copies
    close(L.act_saved_bytes[3] - L.act_saved_bytes[2], (1 - 0.5625 / 2) * 2 * T * h / t * 7)
    # row- + column-wise NVFP4 weight copies: 1.125 bytes per GEMM parameter (12·h²/t per layer)
    mem = pred.state.mem
    close(mem.weights_bytes[1, 2] - mem.weights_bytes[1, 3], 1.125 * LAYERS_PER_STAGE * 12 * h * h / t)


def test_bf16_layers_at_end_scale_every_effect(mofa_predictor):
    """96 layers, 24 of them bf16: a quarter of the layers keep their bf16 cost."""
    jobs = [_job(mofa_predictor, {"nvfp4": {"bf16_layers_at_end": 24}}), _job(mofa_predictor, {"nvfp4": {}}),
            _job(mofa_predictor)]
    pred = _evaluate(mofa_predictor, jobs)
    L = pred.state.layers["dense"]
    close(L.fwd_compute_s[0] - L.fwd_compute_s[2], 0.75 * (L.fwd_compute_s[1] - L.fwd_compute_s[2]))
    close(L.act_saved_bytes[0] - L.act_saved_bytes[2], 0.75 * (L.act_saved_bytes[1] - L.act_saved_bytes[2]))
    mem = pred.state.mem
    close(mem.weights_bytes[1, 0] - mem.weights_bytes[1, 2], 0.75 * (mem.weights_bytes[1, 1] - mem.weights_bytes[1, 2]))


def test_fp4_gemm_relative_efficiency_slows_only_fp4_gemms(mofa_predictor):
    jobs = [_job(mofa_predictor, {"nvfp4": {}}), _job(mofa_predictor, {"fp8": {}}), _job(mofa_predictor)]
    hw = mofa_predictor.registry.hardware_profile("gb300-nvl72")
    slow = attrs.evolve(hw, efficiency=attrs.evolve(hw.efficiency, fp4_gemm_relative_efficiency=0.5))
    fast = attrs.evolve(hw, efficiency=attrs.evolve(hw.efficiency, fp4_gemm_relative_efficiency=1.0))
    a, b = _evaluate(mofa_predictor, jobs, slow), _evaluate(mofa_predictor, jobs, fast)
    assert a.step_time_s[0] > b.step_time_s[0]
    assert a.step_time_s[1] == b.step_time_s[1] and a.step_time_s[2] == b.step_time_s[2]


def test_off_rows_bit_identical(mofa_predictor):
    on, off = _job(mofa_predictor, {"nvfp4": {}}), _job(mofa_predictor)
    both, alone = _evaluate(mofa_predictor, [on, off]), _evaluate(mofa_predictor, [off])
    assert_same_row(both, 1, alone, 0)
    assert both.step_time_s[0] < alone.step_time_s[0]


def test_needs_fp4_hardware_and_excludes_fp8(mofa_predictor):
    h100 = {**BASE, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 128}, "features": {"nvfp4": {}}}
    with pytest.raises(ConfigError, match="FP4"):
        mofa_predictor.predict(mofa_predictor.job(h100))
    with pytest.raises(ConfigError, match="fp8"):
        mofa_predictor.predict(_job(mofa_predictor, {"nvfp4": {}, "fp8": {}}))
    with pytest.raises(ConfigError, match="bf16_layers_at_end"):
        mofa_predictor.predict(_job(mofa_predictor, {"nvfp4": {"bf16_layers_at_end": 97}}))  # 96 layers


def test_megatron_arguments(mofa_predictor):
    feat = mofa_predictor.registry.features["nvfp4"]
    opts = feat.options_type(bf16_layers_at_end=12)
    assert feat.megatron_args(opts) == ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4", "--first-last-layers-bf16",
                                        "--num-layers-at-end-in-bf16", "12"]
    assert feat.megatron_args(feat.options_type()) == ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]
