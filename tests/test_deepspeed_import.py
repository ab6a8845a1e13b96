"""DeepSpeed configs in (``mofa import deepspeed``): ZeRO's stage and buckets, Hugging Face's
"auto" fill-ins, offload, the batch arithmetic DeepSpeed enforces, what is refused, the command.

``HF_ZERO3`` is the ZeRO-3 config of Hugging Face's DeepSpeed integration guide (its keys and
values: every batch and bucket size "auto", filled in by the Trainer)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mofa_framework.api import Predictor
from mofa_framework.errors import ConfigError

from mofa_plugins.import_deepspeed import from_deepspeed

H100 = "h100-sxm5-80gb"
HF_ZERO3 = {
    "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True, "sub_group_size": 1e9,
                          "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
                          "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False,
}
RUN = {"model": "llama3.1-8b", "hardware": H100, "num_gpus": 16, "sequence_length": 4096}
#: a Hugging Face model's eager element-wise kernels and fp32 loss (``--torch-compile``: fused, compiled)
HF = {"eager_kernels": {}, "fp32_cross_entropy": {}}


@pytest.fixture(scope="module")
def predictor():
    return Predictor()


def test_hugging_faces_zero3_config(predictor):
    r = from_deepspeed(json.dumps(HF_ZERO3), predictor.registry, **RUN, micro_batch_size=2, global_batch_size=128,
                       precision="bf16", gradient_checkpointing=True)
    zero = r.job["features"]["deepspeed_zero"]
    # the Trainer's fill-ins for hidden 4,096: reduce bucket h² = 16,777,216, prefetch 0.9·h² = 15,099,494
    assert (zero["stage"], zero["overlap_comm"], zero["reduce_bucket_size"], zero["prefetch_bucket_size"]) == (
        3, "on", 16_777_216, 15_099_494)
    assert zero["modules_per_layer"] == 7  # Llama: q, k, v, o, gate, up, down
    two_matrix = from_deepspeed(json.dumps(HF_ZERO3), predictor.registry, **{**RUN, "model": "gpt3-175b"},
                                micro_batch_size=2, global_batch_size=128, precision="bf16")
    assert two_matrix.job["features"]["deepspeed_zero"]["modules_per_layer"] == 4  # qkv, o, fc1, fc2
    assert r.job["features"]["recompute"] == {"granularity": "full"}
    par = r.job["parallel"]
    assert (par["micro_batch_size"], par["global_batch_size"], par["precision"], par["attention_kernel"]) == (
        2, 128, "bf16", "fa2")
    assert predictor.predict(predictor.job(r.job))[0].step_time_s > 0


def test_an_explicit_zero1_config_is_the_hand_written_job(predictor):
    cfg = {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4,
           "fp16": {"enabled": True}, "zero_optimization": {"stage": 1, "reduce_bucket_size": 2e8},
           "data_types": {"grad_accum_dtype": "fp32"}}
    r = from_deepspeed(cfg, predictor.registry, **RUN)
    assert r.job["features"] == {"deepspeed_zero": {"stage": 1, "reduce_bucket_size": 2e8, "grad_accum_dtype": "fp32"},
                                 **HF}
    hand = {"model": {"name": "llama3.1-8b"}, "hardware": {"name": H100, "num_gpus": 16},
            "parallel": {"micro_batch_size": 4, "global_batch_size": 256, "sequence_length": 4096,
                         "precision": "fp16", "attention_kernel": "fa2"},
            "features": {"deepspeed_zero": {"stage": 1, "reduce_bucket_size": 2e8, "grad_accum_dtype": "fp32"}, **HF}}
    ours, theirs = (predictor.predict(predictor.job(j))[0] for j in (r.job, hand))
    assert ours.step_time_s == theirs.step_time_s and ours.peak_memory_gib == theirs.peak_memory_gib


def test_the_batch_from_any_two_and_stage_0(predictor):
    # 256 = micro-batch × 4 accumulation steps × 16 GPUs: the micro-batch is 4
    r = from_deepspeed({"train_batch_size": 256, "gradient_accumulation_steps": 4, "bf16": {"enabled": True}},
                       predictor.registry, **RUN)
    assert (r.job["parallel"]["micro_batch_size"], r.job["parallel"]["global_batch_size"]) == (4, 256)
    assert r.stage == 0 and r.job["features"] == HF  # stage 0: gradients all-reduced after the backward
    r = from_deepspeed({"train_batch_size": 256, "gradient_accumulation_steps": 4, "bf16": {"enabled": True}},
                       predictor.registry, **RUN, torch_compile=True)
    assert r.job["features"] == {"fp32_cross_entropy": {"compiled": True}}


def test_offload(predictor):
    base = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, "bf16": {"enabled": True}}
    r = from_deepspeed({**base, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
                       predictor.registry, **RUN)
    assert r.job["features"] == {"cpu_optimizer": {"shard": True}, "dp_overlap": {}, **HF}
    r = from_deepspeed({**base, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                                      "offload_param": {"device": "cpu"}}}, predictor.registry, **RUN)
    assert r.job["features"] == {"weight_offload": {"optimizer": "cpu"}, **HF}
    for job in (r.job,):
        assert predictor.predict(predictor.job(job))[0].step_time_s > 0


@pytest.mark.parametrize("cfg, kw, match", [
    (HF_ZERO3, {"global_batch_size": 128, "precision": "bf16"}, "--micro-batch-size"),
    (HF_ZERO3, {"micro_batch_size": 2, "global_batch_size": 128}, "--precision"),
    ({"train_micro_batch_size_per_gpu": 2}, {}, "fp32 training"),
    ({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}, "fp16": {"enabled": True}}, {}, "both enabled"),
    ({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}, "zero_optimization": {"stage": 4}}, {},
     "expected 0, 1, 2 or 3"),
    ({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
      "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}, {}, "host-memory offload only"),
    ({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
      "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}, {}, "at stage 3 only"),
    ({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
      "zero_optimization": {"offload_optimizer": {"device": "cpu"}}}, {}, "needs stage 1, 2 or 3"),
    ({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}}, {},
     "multiple of 32"),
    ({"train_batch_size": 128, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "bf16": {"enabled": True}}, {}, "DeepSpeed refuses this config"),
    ({"train_micro_batch_size_per_gpu": -2, "bf16": {"enabled": True}}, {}, "expected a positive integer"),
    ("[1, 2", {}, "not JSON"),
    ({"train_micro_batch_size_per_gpu": 2, "bf16": True}, {}, "DeepSpeed bf16 True: expected a table"),
    ({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}, "zero_optimization": "3"}, {},
     "DeepSpeed zero_optimization '3': expected a table"),
    ({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
      "zero_optimization": {"stage": 3, "offload_param": "cpu"}}, {},
     "zero_optimization.offload_param 'cpu': expected a table"),
])
def test_what_cannot_be_priced_is_one_line(predictor, cfg, kw, match):
    src = cfg if isinstance(cfg, str) else json.dumps(cfg)
    with pytest.raises(ConfigError, match=match) as e:
        from_deepspeed(src, predictor.registry, **RUN, **kw)
    assert "\n" not in str(e.value)


def test_the_command(mofa_cli, tmp_path):
    cli = mofa_cli
    src = tmp_path / "ds_config_zero3.json"
    src.write_text(json.dumps(HF_ZERO3))
    out = tmp_path / "job.toml"
    args = ["import", "deepspeed", str(src), "--model", "llama3.1-8b", "--hardware", H100, "--gpus", "16",
            "--seq-length", "4096", "--micro-batch-size", "2", "--global-batch-size", "128", "--precision", "bf16"]
    r = CliRunner().invoke(cli, [*args, "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_text().startswith("# imported by `mofa import deepspeed` from ds_config_zero3.json")
    p = CliRunner().invoke(cli, ["predict", str(out), "--format", "json"])
    assert p.exit_code == 0, p.output
    assert json.loads(p.stdout)["parallel"]["micro_batch_size"] == 2
    r = CliRunner().invoke(cli, [a for a in args if a not in ("--model", "llama3.1-8b")])
    assert r.exit_code == 2 and "--model" in r.output and "Traceback" not in r.output
