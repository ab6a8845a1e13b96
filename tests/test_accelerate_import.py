"""Hugging Face Accelerate configs in (``mofa import accelerate``): FSDP (names and the older
numbers), its offload and checkpointing, DeepSpeed through ``mofa import deepspeed``'s reading, DDP,
what is refused, the command.

``FSDP_CONFIG`` is the single-node FSDP example of Accelerate's documentation (``accelerate config``'s
output: its keys and values, the process count aside)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mofa_framework.api import Predictor
from mofa_framework.errors import ConfigError

from mofa_plugins.import_accelerate import from_accelerate

H100 = "h100-sxm5-80gb"
FSDP_CONFIG = """
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_cpu_ram_efficient_loading: true
  fsdp_forward_prefetch: false
  fsdp_offload_params: false
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_sync_module_states: true
  fsdp_use_orig_params: true
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 8
rdzv_backend: static
same_network: true
use_cpu: false
"""
SCRIPT = {"model": "qwen2.5-7b", "hardware": H100, "num_gpus": None, "sequence_length": 4096, "micro_batch_size": 2}
HF = {"eager_kernels": {}, "fp32_cross_entropy": {}}


@pytest.fixture(scope="module")
def predictor():
    return Predictor()


def test_an_fsdp_config(predictor):
    r = from_accelerate(FSDP_CONFIG, predictor.registry, **SCRIPT, gradient_accumulation_steps=4)
    assert r.distribution == "FSDP" and r.job["hardware"]["num_gpus"] == 8  # num_processes
    # 2 sequences × 4 accumulation steps × 8 GPUs
    assert (r.job["parallel"]["micro_batch_size"], r.job["parallel"]["global_batch_size"]) == (2, 64)
    assert r.job["features"] == {"fsdp": {}, "dp_overlap": {}, **HF}
    assert predictor.predict(predictor.job(r.job))[0].step_time_s > 0


@pytest.mark.parametrize("change, features", [
    ("fsdp_sharding_strategy: FULL_SHARD", {"fsdp": {}, "dp_overlap": {}}),
    ("fsdp_sharding_strategy: 2", {"fsdp": {"reshard_after_forward": False}, "dp_overlap": {}}),  # SHARD_GRAD_OP
    ("fsdp_sharding_strategy: NO_SHARD", {"dp_overlap": {}}),
    ("fsdp_offload_params: true", {"weight_offload": {"optimizer": "cpu"}}),
    ("fsdp_forward_prefetch: false\n  fsdp_activation_checkpointing: true",
     {"fsdp": {}, "dp_overlap": {}, "recompute": {"granularity": "full"}}),
])
def test_fsdp_settings(predictor, change, features):
    text = FSDP_CONFIG
    if change.startswith("fsdp_sharding_strategy"):
        text = text.replace("fsdp_sharding_strategy: FULL_SHARD", change)
    elif change.startswith("fsdp_offload_params"):
        text = text.replace("fsdp_offload_params: false", change)
    else:
        text = text.replace("fsdp_forward_prefetch: false", change)
    r = from_accelerate(text, predictor.registry, **SCRIPT)
    assert r.job["features"] == {**features, **HF}
    predictor.predict(predictor.job(r.job))


def test_deepspeed_through_its_importer(predictor):
    text = """
distributed_type: DEEPSPEED
deepspeed_config:
  gradient_accumulation_steps: 2
  offload_optimizer_device: none
  offload_param_device: none
  zero3_init_flag: true
  zero_stage: 2
mixed_precision: fp16
num_processes: 16
"""
    r = from_accelerate(text, predictor.registry, **SCRIPT)
    assert r.distribution == "DEEPSPEED"
    assert r.job["features"]["deepspeed_zero"] == {"stage": 2}
    assert (r.job["parallel"]["precision"], r.job["parallel"]["global_batch_size"]) == ("fp16", 64)  # 2 × 2 × 16
    r = from_accelerate(text.replace("offload_optimizer_device: none", "offload_optimizer_device: cpu"),
                        predictor.registry, **SCRIPT)
    assert "cpu_optimizer" in r.job["features"]


def test_plain_ddp_and_the_gpu_count(predictor):
    r = from_accelerate("distributed_type: MULTI_GPU\nmixed_precision: bf16\nnum_processes: 4\n", predictor.registry,
                        **{**SCRIPT, "num_gpus": 8})
    assert r.job["hardware"]["num_gpus"] == 8 and any("overrides num_processes 4" in n for n in r.notes)
    assert r.job["features"] == {"dp_overlap": {}, **HF}


@pytest.mark.parametrize("change, kw, match", [
    ("mixed_precision: bf16", {}, "fp32 training is not modelled"),
    ("distributed_type: FSDP", {}, "MoFa reads FSDP, DEEPSPEED"),
    ("fsdp_sharding_strategy: FULL_SHARD", {}, "fsdp_sharding_strategy 'SOMETIMES'"),
    ("num_processes: 8", {}, "num_processes"),
    ("", {"micro_batch_size": None}, "--micro-batch-size"),
    ("", {"model": None}, "--model"),
    ("", {"global_batch_size": 100}, "multiple of 16"),
    ("fsdp_config:\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP", {}, "Accelerate fsdp_config 3: expected a table"),
])
def test_what_cannot_be_priced_is_one_line(predictor, change, kw, match):
    bad = {"mixed_precision: bf16": "mixed_precision: 'no'", "distributed_type: FSDP": "distributed_type: TPU",
           "fsdp_sharding_strategy: FULL_SHARD": "fsdp_sharding_strategy: SOMETIMES",
           "num_processes: 8": "num_processes: many", "": "",
           "fsdp_config:\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP": "fsdp_config: 3\nunused:\n  x: 1"}[change]
    with pytest.raises(ConfigError, match=match) as e:
        from_accelerate(FSDP_CONFIG.replace(change, bad) if change else FSDP_CONFIG, predictor.registry,
                        **{**SCRIPT, **kw})
    assert "\n" not in str(e.value)


def test_the_command(mofa_cli, tmp_path):
    src = tmp_path / "fsdp.yaml"
    src.write_text(FSDP_CONFIG)
    out = tmp_path / "job.toml"
    args = ["import", "accelerate", str(src), "--model", "qwen2.5-7b", "--hardware", H100, "--seq-length", "4096",
            "--micro-batch-size", "2", "--gradient-checkpointing"]
    r = CliRunner().invoke(mofa_cli, [*args, "-o", str(out)])
    assert r.exit_code == 0, r.output
    p = CliRunner().invoke(mofa_cli, ["predict", str(out), "--format", "json"])
    assert p.exit_code == 0, p.output
    assert "recompute" in json.loads(p.stdout)["features"]
    r = CliRunner().invoke(mofa_cli, [a for a in args if a != "--micro-batch-size" and a != "2"])
    assert r.exit_code == 2 and "--micro-batch-size" in r.output and "Traceback" not in r.output
