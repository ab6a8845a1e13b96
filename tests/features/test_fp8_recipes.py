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


def test_torchao_float8_casts_weights_every_micro_batch_and_keeps_no_copy(mofa_predictor):
    """torchao's Float8Linear: ``weight_cache = false`` casts each GEMM weight (k·n elements) in every
    forward and again, transposed, in every backward, one orientation per pass (2 B read + 1 B
    written, s ≈ 0), and keeps no fp8 weight; ``rowwise`` makes each orientation of the activations
    and gradients with its own cast, 2·3 bytes per element instead of one fused 2 + 2."""
    def job(**opts):
        return mofa_predictor.job({**BASE, "features": {"fp8": opts}})
    pred = _evaluate(mofa_predictor, [job(recipe="tensorwise"), job(recipe="tensorwise", weight_cache=False),
                                      job(recipe="rowwise"), job(recipe="rowwise", weight_cache=False)])
    L, hw = pred.state.layers["dense"], pred.state.ctx.hardware
    bw = hw.efficiency.memory_efficiency * hw.hbm_bandwidth_bytes_per_s
    weights = 12 * H * H / TP  # QKV 3h², O h², FC1 4h², FC2 4h², over TP
    fwd_elements, bwd_elements = T * H * (2 + 5 / TP), T * H * (2 + 7 / TP)
    close(L.fwd_compute_s[1] - L.fwd_compute_s[0], 3.0 * weights / bw)
    close(L.bwd_input_s[1] - L.bwd_input_s[0], 3.0 * weights / bw)
    close(L.fwd_compute_s[2] - L.fwd_compute_s[0], 3.0 * fwd_elements / bw)  # 6 B against tensorwise's 3
    close(L.bwd_input_s[2] - L.bwd_input_s[0], 3.0 * bwd_elements / bw)
    close(L.fwd_compute_s[3] - L.fwd_compute_s[2], 3.0 * weights / bw)  # one orientation per pass
    close(L.bwd_input_s[3] - L.bwd_input_s[2], 3.0 * weights / bw)
    mem = pred.state.mem
    # tensorwise keeps the fp8 weights and their transpose (2 B per GEMM parameter), rowwise both
    # orientations (2 B); without the cache neither
    for cached, uncached in ((0, 1), (2, 3)):
        close(mem.weights_bytes[1, cached] - mem.weights_bytes[1, uncached], 2.0 * LAYERS_PER_STAGE * weights)
    # the bf16 input saved instead of its fp8 copy is cast again for the weight gradient: 3 B per element
    # (per-tensor); rowwise's input cast already made the column-wise copy, so nothing more
    both = _evaluate(mofa_predictor, [job(recipe="tensorwise"), job(recipe="tensorwise", fp8_activations=False),
                                      job(recipe="rowwise"), job(recipe="rowwise", fp8_activations=False)])
    B = both.state.layers["dense"]
    close(B.bwd_input_s[1] - B.bwd_input_s[0], 3.0 * fwd_elements / bw)
    close(B.fwd_compute_s[1], B.fwd_compute_s[0])
    close(B.bwd_input_s[3], B.bwd_input_s[2])


def test_torchtitan_float8_is_torchao(mofa_predictor):
    """A torchtitan row's float8 is torchao's Float8Linear (no weight cache, bf16 inputs saved), its
    rowwise recipe ``rowwise``; a Megatron row's FP8 stays Transformer Engine's."""
    from mofa_framework.measurements import ReadContext
    from mofa_plugins.reader_dense import map_row

    row = {"row_id": "t", "source": "test", "model_name": "Llama 3.1 8B", "n_layers": "32", "hidden": "4096",
           "n_heads": "32", "n_kv_heads": "8", "ffn_hidden": "14336", "vocab": "128256", "seq_len": "8192",
           "gpu_type": "H100 80GB HBM3 @700W", "n_gpus": "8", "tp": "1", "pp": "1", "micro_batch": "1",
           "global_batch": "8", "derived_iter_time_s": "1"}

    def fp8(fw, text):
        ctx = ReadContext(source="test", registry=mofa_predictor.registry)
        return map_row({**row, "framework": fw, "precision": text}, ctx).job["features"]["fp8"]
    assert fp8("torchtitan", "float8 rowwise") == {"recipe": "rowwise", "weight_cache": False, "fp8_activations": False}
    assert fp8("torchtitan", "float8 (torchao tensorwise, nn.Linear)") == {
        "recipe": "tensorwise", "weight_cache": False, "fp8_activations": False}
    assert fp8("Megatron-LM", "FP8-CS") == {"recipe": "tensorwise"}


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


def test_torchao_float8_has_no_megatron_recipe_and_says_so():
    """torchao's rowwise scaling or uncached weights are no Megatron-LM recipe: one note, no flags."""
    from mofa_plugins.fp8 import FEATURE, Fp8Options

    for opts in (Fp8Options(recipe="rowwise"), Fp8Options(recipe="tensorwise", weight_cache=False)):
        (line,) = FEATURE.megatron_args(opts)
        assert line.startswith("# fp8 as torchao's Float8Linear") and "--fp8-recipe" not in line


@pytest.mark.parametrize("text, recipe", [("MXFP8", "mxfp8"), ("FP8-MX (MXFP8 32x32)", "mxfp8"),
                                          ("FP8-CS (per-tensor current scaling)", "tensorwise"),
                                          ("float8 tensorwise", "tensorwise"), ("float8 rowwise", "rowwise"),
                                          ("FP8 blockwise (128x128 W / 1x128 act)", "blockwise"), ("FP8", None)])
def test_sources_precision_column_sets_the_recipe(text, recipe):
    from mofa_plugins._megatron import precision as _precision

    precision, feature, options = _precision(text)
    assert (precision, feature) == ("bf16", "fp8")
    assert options.get("recipe") == recipe


def test_fp8_params_drop_the_bf16_weight_copy_and_gather_one_byte_per_parameter(mofa_predictor):
    """``fp8_params`` (Megatron --fp8-param-gather). Memory: the bf16 copy of every GEMM weight goes,
    2 B × 12·h²/t per layer (QKV 3h², O h², FC1 4h², FC2 4h² on TP 8). Communication: the distributed
    optimizer's all-gather moves 1 byte per parameter instead of 2, so with DP the DP time falls by
    exactly half of its all-gather; the reduce-scatter is unchanged. Here DP 2 (TP 8 × PP 8 × 2 = 128)."""
    def job(params):
        return mofa_predictor.job({**BASE, "features": {"fp8": {"fp8_params": params}, "distributed_optimizer": {}}})

    pred = _evaluate(mofa_predictor, [job(False), job(True)])
    mem = pred.state.mem
    close(mem.weights_bytes[1, 0] - mem.weights_bytes[1, 1], 2.0 * LAYERS_PER_STAGE * 12 * H * H / TP)
    # with the distributed optimizer, DP time = RS(4 B/param) + AG(2 B or 1 B /param): the all-gather
    # of the same group and sizes, halved in bytes (its latency term aside, which these sizes dwarf)
    from mofa_plugins import distributed_optimizer as dopt

    comm_bf16, comm_fp8 = pred.state.opt.dp_comm_s
    assert comm_fp8 < comm_bf16
    assert dopt.param_gather_bytes(pred.batch).tolist() == [2.0, 1.0]


def test_fp8_params_reach_megatron_and_need_transformer_engines_weights(tmp_path):
    """Exported as --fp8-param-gather; with torchao's rowwise recipe (no FP8 weight tensors), or with
    Megatron-FSDP (which gathers no FP8 parameters), the job is refused in one line naming the option
    and the fix."""
    from mofa_plugins.fp8 import Fp8Options, megatron_args

    assert megatron_args(Fp8Options(fp8_params=True))[-1] == "--fp8-param-gather"
    assert "--fp8-param-gather" not in megatron_args(Fp8Options())
    path = tmp_path / "job.toml"
    path.write_text('[model]\nname = "gpt3-175b"\n[hardware]\nname = "gb300-nvl72"\nnum_gpus = 128\n'
                    '[parallel]\ntp = 8\npp = 8\nmicro_batch_size = 1\nglobal_batch_size = 64\n'
                    'sequence_length = 2048\n[features.fp8]\nrecipe = "rowwise"\nfp8_params = true\n')
    res = CliRunner().invoke(cli, ["predict", str(path)])
    assert res.exit_code == 2 and "fp8_params" in res.output and len(res.output.strip().splitlines()) == 1, res.output
    path.write_text(path.read_text().replace('recipe = "rowwise"\n', "").replace("[features.fp8]", "[features.fsdp]\n[features.fp8]"))
    res = CliRunner().invoke(cli, ["predict", str(path)])
    assert res.exit_code == 2 and "Megatron-FSDP" in res.output and len(res.output.strip().splitlines()) == 1, res.output
