"""Distributed optimizer with Adam's moments in lower precision (Megatron-Core's precision-aware
optimizer: ``--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``)."""

import pytest

from mofa_framework.decompose import total_params
from mofa_framework.megatron import MegatronArgs, parse_flags

JOB = {"model": {"name": "llama3.1-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 64},
       "parallel": {"tp": 1, "pp": 1, "micro_batch_size": 1, "global_batch_size": 64, "sequence_length": 4096}}


def _predict(pred, **opts):
    return pred.predict(pred.job({**JOB, "features": {"distributed_optimizer": opts}}))[0]


def test_bf16_moments_hold_8_of_12_state_bytes_and_touch_22_of_30(mofa_predictor):
    """fp32 Adam keeps 4 (master) + 4 (m) + 4 (v) bytes per parameter, sharded over DP 64; with m and v
    in bf16 it keeps 4 + 2 + 2 = 8. The update reads and writes each moment: 30 bytes per parameter
    (master 8, m 8, v 8, gradient 4, parameter 2) become 30 − 2·2 − 2·2 = 22."""
    fp32 = _predict(mofa_predictor)
    bf16 = _predict(mofa_predictor, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
    params = total_params(mofa_predictor.registry.model("llama3.1-8b"))["total"]
    assert fp32.memory_breakdown["optimizer_states"] * 2**30 == pytest.approx(12.0 * params / 64, rel=1e-3)
    assert bf16.memory_breakdown["optimizer_states"] == pytest.approx(
        fp32.memory_breakdown["optimizer_states"] * 8.0 / 12.0, rel=1e-12)
    assert bf16.breakdown["optimizer"] == pytest.approx(fp32.breakdown["optimizer"] * 22.0 / 30.0, rel=1e-12)
    assert bf16.memory_breakdown["gradients"] == fp32.memory_breakdown["gradients"]  # main grads stay fp32


def test_one_moment_in_fp8(mofa_predictor):
    """exp_avg in fp8 (1 byte), exp_avg_sq fp32: 4 + 1 + 4 = 9 of 12 bytes; 30 − 2·3 = 24 of 30."""
    fp32 = _predict(mofa_predictor)
    one = _predict(mofa_predictor, exp_avg_dtype="fp8")
    assert one.memory_breakdown["optimizer_states"] == pytest.approx(
        fp32.memory_breakdown["optimizer_states"] * 9.0 / 12.0, rel=1e-12)
    assert one.breakdown["optimizer"] == pytest.approx(fp32.breakdown["optimizer"] * 24.0 / 30.0, rel=1e-12)


def test_fp16_master_weights(mofa_predictor):
    """--main-params-dtype fp16 with bf16 moments: 2 + 2 + 2 = 6 of 12 state bytes; the update reads and
    writes master and moments in 2 bytes: 30 − 2·2 − 2·2 − 2·2 = 18 of 30."""
    fp32 = _predict(mofa_predictor)
    low = _predict(mofa_predictor, main_params_dtype="fp16", exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
    assert low.memory_breakdown["optimizer_states"] == pytest.approx(
        fp32.memory_breakdown["optimizer_states"] * 6.0 / 12.0, rel=1e-12)
    assert low.breakdown["optimizer"] == pytest.approx(fp32.breakdown["optimizer"] * 18.0 / 30.0, rel=1e-12)


def _args(words):
    return MegatronArgs(flags=parse_flags(words), parallel={"pp": 1, "vpp": 1, "cp": 1})


def test_megatron_arguments_round_trip(mofa_predictor):
    feat = mofa_predictor.registry.features["distributed_optimizer"]
    opts = feat.options_type(exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
    args = feat.megatron_args(opts)
    assert args == ["--use-distributed-optimizer", "--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16",
                    "--exp-avg-sq-dtype", "bf16"]
    assert feat.from_megatron(_args(args)) == {"grad_reduce_dtype": "fp32", "exp_avg_dtype": "bf16",
                                                            "exp_avg_sq_dtype": "bf16"}
    # Megatron reads the dtypes only under --use-precision-aware-optimizer
    assert feat.from_megatron(_args(["--use-distributed-optimizer", "--exp-avg-dtype", "bf16"])) == {
        "grad_reduce_dtype": "fp32"}
    assert feat.megatron_args(feat.options_type()) == ["--use-distributed-optimizer"]
    # its bf16 main grads are MoFa's bf16 gradient buffer (and reduction)
    grads = _args(["--use-distributed-optimizer", "--use-precision-aware-optimizer", "--main-grads-dtype", "bf16"])
    assert feat.from_megatron(grads) == {"grad_reduce_dtype": "bf16"}
    master = feat.megatron_args(feat.options_type(main_params_dtype="fp16"))
    assert master == ["--use-distributed-optimizer", "--use-precision-aware-optimizer", "--main-params-dtype", "fp16"]
    assert feat.from_megatron(_args(master)) == {"grad_reduce_dtype": "fp32", "main_params_dtype": "fp16"}


def test_an_unknown_moment_dtype_is_one_line(mofa_predictor):
    from mofa_framework.errors import ConfigError

    with pytest.raises(ConfigError, match=r"features\.distributed_optimizer\.exp_avg_dtype.*fp64"):
        mofa_predictor.job({**JOB, "features": {"distributed_optimizer": {"exp_avg_dtype": "fp64"}}})


def test_a_bridge_config_states_torch_dtypes(mofa_predictor):
    """Megatron-Bridge's OptimizerConfig holds torch dtypes (its DeepSeek recipes:
    ``exp_avg_dtype = torch.bfloat16``): `mofa import nemo` reads them as Megatron's names."""
    from mofa_framework.megatron import read_source

    text = ("model:\n  tensor_model_parallel_size: 1\n  seq_length: 4096\n"
            "train:\n  global_batch_size: 64\n  micro_batch_size: 1\n"
            "optimizer:\n  use_distributed_optimizer: true\n  use_precision_aware_optimizer: true\n"
            "  exp_avg_dtype: torch.bfloat16\n  exp_avg_sq_dtype: torch.bfloat16\n  main_params_dtype: torch.float32\n")
    res = read_source(text, mofa_predictor.registry, kind="nemo", hardware="h100-sxm5-80gb", num_gpus=64,
                      model="llama3.1-8b")
    assert res.job["features"]["distributed_optimizer"] == {"grad_reduce_dtype": "fp32", "exp_avg_dtype": "bf16",
                                                            "exp_avg_sq_dtype": "bf16"}
