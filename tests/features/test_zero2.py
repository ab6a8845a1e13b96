"""Distributed optimizer with gradient sharding (ZeRO-2 / FSDP optim_grads)."""

import pytest

from mofa_framework.decompose import total_params

JOB = {"model": {"name": "llama3-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 32},
       "parallel": {"tp": 2, "pp": 1, "micro_batch_size": 1, "global_batch_size": 32, "sequence_length": 4096}}


def test_shard_gradients_divides_gradient_memory_by_dp(mofa_predictor):
    zero1 = mofa_predictor.predict(mofa_predictor.job({**JOB, "features": {"distributed_optimizer": {}}}))[0]
    zero2 = mofa_predictor.predict(mofa_predictor.job(
        {**JOB, "features": {"distributed_optimizer": {"shard_gradients": True}}}))[0]
    model = mofa_predictor.registry.model("llama3-8b")
    D = 16
    # pp = 1, tp = 2: the one stage holds every parameter, the TP-sharded ones halved
    assert zero1.memory_breakdown["gradients"] * 2**30 > 4 * total_params(model)["total"] / 2 * 0.99
    assert zero2.memory_breakdown["gradients"] == pytest.approx(zero1.memory_breakdown["gradients"] / D, rel=1e-12)
    assert zero2.memory_breakdown["optimizer_states"] == zero1.memory_breakdown["optimizer_states"]
    assert zero2.step_time_s == zero1.step_time_s  # same reduce-scatter + all-gather
    assert zero2.peak_memory_gib < zero1.peak_memory_gib


def test_shard_gradients_megatron_arguments(mofa_predictor):
    feat = mofa_predictor.registry.features["distributed_optimizer"]
    assert feat.megatron_args(feat.options_type()) == ["--use-distributed-optimizer"]
    assert "optim_grads" in feat.megatron_args(feat.options_type(shard_gradients=True))
