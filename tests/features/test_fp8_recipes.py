"""FP8 scaling recipes (``features.fp8.recipe``): expected values derived here by hand."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from click.testing import CliRunner

from mofa_framework.cli import _builtin_commands, cli
from mofa_framework.config import jobs_to_batch

_builtin_commands()

# GPT-3 175B on GB300: TP 8, PP 8 (12 layers per stage), flash attention
BASE = {"model": {"name": "gpt3-175b"}, "hardware": {"name": "gb300-nvl72", "num_gpus": 128},
        "parallel": {"tp": 8, "pp": 8, "micro_batch_size": 1, "global_batch_size": 64, "sequence_length": 2048,
                     "flash_attention": True}}
LAYERS_PER_STAGE = 12
T, H, TP = 2048.0, 12288.0, 8.0


def _job(pred, recipe=None, hardware="gb300-nvl72"):
    feats = {"fp8": {} if recipe is None else {"recipe": recipe}}
    return pred.job({**BASE, "hardware": {**BASE["hardware"], "name": hardware}, "features": feats})


def _evaluate(pred, jobs, hardware=None):
    return pred.evaluate(jobs_to_batch(jobs, pred.registry), jobs[0].model, hardware or jobs[0].hardware)


def close(a, b, rel=1e-9):
    np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=rel, atol=1e-12)


def test_block_scaled_recipes_write_two_copies_with_scales(mofa_predictor):
    """delayed / tensorwise: one fp8 copy per cast (3 B per element). mxfp8 / blockwise: the
    row- and the column-wise copy with their scales, 2 + 2·(1 + s) bytes per element."""
    recipes = [None, "delayed", "tensorwise", "mxfp8", "blockwise"]
    pred = _evaluate(mofa_predictor, [_job(mofa_predictor, r) for r in recipes])
    L, hw = pred.state.layers["dense"], pred.state.ctx.hardware
    bw = hw.efficiency.memory_efficiency * hw.hbm_bandwidth_bytes_per_s
    fwd_elements = T * H * (2 + 5 / TP)  # GEMM inputs: QKV T·h, O T·h/t, FC1 T·h, FC2 T·4h/t
    bwd_elements = T * H * (2 + 7 / TP)  # output gradients: QKV T·3h/t, O T·h, FC1 T·4h/t, FC2 T·h
    for i in (1, 2):  # the default is Megatron's delayed recipe; tensorwise costs the same
        close(L.fwd_compute_s[i], L.fwd_compute_s[0])
        close(L.act_saved_bytes[i], L.act_saved_bytes[0])
    for i, s in ((3, 1 / 32), (4, 4 / 128)):
        extra = 2 + 2 * (1 + s) - 3.0
        close(L.fwd_compute_s[i] - L.fwd_compute_s[0], extra * fwd_elements / bw)
        close(L.bwd_input_s[i] - L.bwd_input_s[0], extra * bwd_elements / bw)
        close(L.bwd_weight_s[i], L.bwd_weight_s[0])
        # the saved column-wise copy carries its scales: (1 + s) bytes instead of 1
        close(L.act_saved_bytes[i] - L.act_saved_bytes[0], s * T * H / TP * 7)
        # weights: fp8 + transposed copy (2 B) → row- and column-wise block-scaled copies, 2·(1 + s) B
        mem = pred.state.mem
        close(mem.weights_bytes[1, i] - mem.weights_bytes[1, 0], 2 * s * LAYERS_PER_STAGE * 12 * H * H / TP)


def test_mxfp8_gemm_relative_efficiency_slows_only_mxfp8_gemms(mofa_predictor):
    hw = mofa_predictor.registry.hardware_profile("gb300-nvl72")
    slow = attrs.evolve(hw, efficiency=attrs.evolve(hw.efficiency, mxfp8_gemm_relative_efficiency=0.5))
    jobs = [_job(mofa_predictor, "mxfp8"), _job(mofa_predictor, "tensorwise")]
    base, half = _evaluate(mofa_predictor, jobs, hw), _evaluate(mofa_predictor, jobs, slow)
    Lb, Lh = base.state.layers["dense"], half.state.layers["dense"]
    # per-tensor fp8 rows do not see it
    close(Lh.bwd_weight_s[1], Lb.bwd_weight_s[1])
    # weight-gradient time is GEMMs only: at half the rate it is the fp8 GEMM time once more
    # (attention has no weight gradient; its bf16 core is untouched)
    fp8_bwd_w = Lb.bwd_weight_s[0]
    close(Lh.bwd_weight_s[0], 2.0 * fp8_bwd_w)
    assert half.step_time_s[0] > base.step_time_s[0]


def test_fp8_gemm_relative_efficiency_slows_every_fp8_gemm_and_nothing_else(mofa_predictor):
    """The profile's fp8 rate applies to every recipe's GEMMs (MXFP8's own factor stacks on it);
    a bf16 job, and the bf16 attention core of an fp8 one, do not see it."""
    hw = mofa_predictor.registry.hardware_profile("gb300-nvl72")
    # no per-kernel launch or host floor: a GEMM's time is then its compute time alone
    hw = attrs.evolve(hw, efficiency=attrs.evolve(hw.efficiency, kernel_launch_s=0.0, host_dispatch_s=0.0))
    slow = attrs.evolve(hw, efficiency=attrs.evolve(hw.efficiency, fp8_gemm_relative_efficiency=0.5))
    bf16 = mofa_predictor.job({**BASE, "features": {}})
    jobs = [_job(mofa_predictor, "delayed"), _job(mofa_predictor, "mxfp8"), bf16]
    base, half = _evaluate(mofa_predictor, jobs, hw), _evaluate(mofa_predictor, jobs, slow)
    Lb, Lh = base.state.layers["dense"], half.state.layers["dense"]
    for i in (0, 1):  # weight-gradient time is fp8 GEMMs only: twice as long at half the rate
        close(Lh.bwd_weight_s[i], 2.0 * Lb.bwd_weight_s[i])
    close(half.step_time_s[2], base.step_time_s[2])
    close(Lh.fwd_compute_s[2], Lb.fwd_compute_s[2])


def test_mxfp8_needs_block_scaled_tensor_cores():
    res = CliRunner().invoke(cli, ["predict", "--model", "gpt3-175b", "--hardware", "h100-sxm5-80gb",
                                   "--gpus", "128", "--tp", "8", "--pp", "8", "--gbs", "64", "--seq", "2048",
                                   "--feature", "fp8:recipe=mxfp8"])
    assert res.exit_code == 2, res.output
    assert res.output.strip().count("\n") == 0
    assert "recipe = 'mxfp8'" in res.output and "tensorwise" in res.output
    # the per-tensor recipes run on Hopper; mxfp8 on Blackwell
    ok = CliRunner().invoke(cli, ["predict", "--model", "gpt3-175b", "--hardware", "h100-sxm5-80gb", "--gpus", "128",
                                  "--tp", "8", "--pp", "8", "--gbs", "64", "--seq", "2048", "--feature", "fp8:recipe=tensorwise"])
    assert ok.exit_code == 0, ok.output
    bad = CliRunner().invoke(cli, ["predict", "--model", "gpt3-175b", "--hardware", "gb300-nvl72", "--gpus", "128",
                                   "--tp", "8", "--pp", "8", "--gbs", "64", "--seq", "2048", "--feature", "fp8:recipe=mx"])
    assert bad.exit_code == 2 and bad.output.strip().count("\n") == 0 and "recipe" in bad.output


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise", "mxfp8", "blockwise"])
def test_recipe_reaches_megatron_arguments(mofa_predictor, recipe):
    from mofa_plugins.fp8 import FEATURE, Fp8Options

    assert FEATURE.megatron_args(Fp8Options(recipe=recipe))[-2:] == ["--fp8-recipe", recipe]


@pytest.mark.parametrize("text, recipe", [("MXFP8", "mxfp8"), ("FP8-MX (MXFP8 32x32)", "mxfp8"),
                                          ("FP8-CS (per-tensor current scaling)", "tensorwise"),
                                          ("float8 tensorwise", "tensorwise"),
                                          ("FP8 blockwise (128x128 W / 1x128 act)", "blockwise"), ("FP8", None)])
def test_sources_precision_column_sets_the_recipe(text, recipe):
    from mofa_plugins._megatron import precision as _precision

    precision, feature, options = _precision(text)
    assert (precision, feature) == ("bf16", "fp8")
    assert options.get("recipe") == recipe
