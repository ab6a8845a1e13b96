"""``mofa import torchtitan``: torchtitan train configs (TOML, or --section.key flags) as MoFa jobs,
mapped as the dense reader maps torchtitan's published runs (``plugins/import_torchtitan.py``)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mofa_framework.cli import _builtin_commands, assemble
from mofa_framework.errors import ConfigError
from mofa_framework.measurements import builtin_data_dir
from mofa_plugins.import_torchtitan import from_torchtitan, parse_source

#: a torchtitan train config of the 2025 layout (the keys of torchtitan's ``job_config.py``), as a
#: user writes one: Llama 3.1 70B, FSDP 32 × TP 8, full AC, compiled, float8 tensorwise
LLAMA3_70B = """
[job]
description = "Llama 3 70B training"

[model]
name = "llama3"
flavor = "70B"
converters = ["float8"]

[optimizer]
name = "AdamW"
lr = 1.5e-4

[training]
local_batch_size = 16
seq_len = 8192
steps = 1000

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 8
pipeline_parallel_degree = 1
context_parallel_degree = 1

[activation_checkpoint]
mode = "full"

[compile]
enable = true
components = ["model", "loss"]

[quantize.linear.float8]
enable_fsdp_float8_all_gather = false
filter_fqns = ["output"]
"""
H100 = "h100-sxm5-80gb"


@pytest.fixture(scope="module")
def cli():
    _builtin_commands()
    return assemble()


def test_the_70b_config_is_the_job_the_reader_maps_for_its_published_run(mofa_predictor):
    """torchtitan's 'Llama3 70b on 256 H100s' row TT-021 (FSDP 32, TP 8, torch.compile, full AC,
    float8 tensorwise, local batch 16) as the reader maps it, and the same run's config imported:
    the same layout, batch and features — what is validated is what is imported."""
    from mofa_framework.validate import map_rows

    (row,) = [m for m in map_rows([builtin_data_dir() / "torchtitan_benchmarks.csv"], mofa_predictor.registry)[0]
              if m.row_id == "TT-021"]
    res = from_torchtitan(LLAMA3_70B, mofa_predictor.registry, hardware=row.job["hardware"]["name"], num_gpus=256)
    job = res.job
    assert job["model"] == row.job["model"] == {"name": "llama3.1-70b"}
    assert job["hardware"] == row.job["hardware"]
    same = ("tp", "pp", "cp", "micro_batch_size", "global_batch_size", "sequence_length", "precision",
            "attention_kernel", "sequence_parallel")
    assert {k: job["parallel"][k] for k in same} == {k: row.job["parallel"][k] for k in same}
    assert job["parallel"]["global_batch_size"] == 16 * 32  # local batch × (256 / TP 8)
    assert job["features"] == row.job["features"]
    assert "model.converters = ['float8']" in res.used
    mofa_predictor.job(job)  # loads and predicts
    assert mofa_predictor.predict(mofa_predictor.job(job))[0].step_time_s > 0


def test_flags_a_pipeline_and_selective_layer_checkpointing():
    """--section.key flags (run_train.sh's overrides); Interleaved1F1B builds two stages per rank;
    FSDP under a pipeline keeps each stage gathered (the distributed optimizer, as the reader maps
    torchtitan's 3D rows); selective AC every 2nd block is full recompute of half a stage's blocks;
    without a pipeline the local batch is the micro-batch, with one pipeline_parallel_microbatch_size."""
    from mofa_framework import Predictor

    reg = Predictor().registry
    flags = ("--model.name llama3 --model.flavor 8B --parallelism.tensor_parallel_degree 2 "
             "--parallelism.pipeline_parallel_degree 4 --parallelism.pipeline_parallel_schedule Interleaved1F1B "
             "--training.local_batch_size 8 --training.seq_len 4096 --activation_checkpoint.mode selective "
             "--activation_checkpoint.selective_ac_option 2 --compile.enable")
    assert parse_source(flags)["compile"] == {"enable": True}
    job = from_torchtitan(flags, reg, hardware=H100, num_gpus=64).job
    p = job["parallel"]
    assert (p["tp"], p["pp"], p["vpp"], p["micro_batch_size"], p["global_batch_size"]) == (2, 4, 2, 1, 8 * 8)
    assert job["pipeline"] == {"schedule": "interleaved-1f1b"}
    f = job["features"]
    assert "distributed_optimizer" in f and "fsdp" not in f and "eager_kernels" not in f
    assert f["recompute"] == {"granularity": "full", "num_layers": 4}  # 32 layers / PP 4 / every 2nd
    flat = from_torchtitan("--model.flavor 8B --training.local_batch_size 3 --activation_checkpoint.mode selective "
                           "--activation_checkpoint.selective_ac_option op --parallelism.fsdp_reshard_after_forward never",
                           reg, hardware=H100, num_gpus=8).job
    assert flat["parallel"]["micro_batch_size"] == 3 and flat["parallel"]["global_batch_size"] == 24
    assert flat["features"]["recompute"] == {"granularity": "op"}
    assert flat["features"]["fsdp"] == {"reshard_after_forward": False}
    assert "eager_kernels" in flat["features"]  # not compiled: eager element-wise kernels
    for mode, want in (("none", None), ("memory_budget", {"granularity": "op"}), ("full", {"granularity": "full"})):
        got = from_torchtitan(f"--model.flavor 8B --activation_checkpoint.mode {mode}", reg, hardware=H100,
                              num_gpus=8).job["features"].get("recompute")
        assert got == want, mode
    assert flat["features"]["fp32_cross_entropy"] == {}  # the loss in fp32, eager
    ddp = from_torchtitan("--model.flavor 8B --parallelism.data_parallel_replicate_degree 8 "
                          "--parallelism.data_parallel_shard_degree 1", reg, hardware=H100).job
    assert ddp["hardware"]["num_gpus"] == 8 and "fsdp" not in ddp["features"] and "dp_overlap" in ddp["features"]


def test_zbv_zero_bubble_is_pytorchs_zb_v_not_the_sail_sg_forks():
    """torchtitan's ZBVZeroBubble is PyTorch pipelining's ScheduleZBVZeroBubble, beside FSDP2 and
    the rest of torchtitan: the `zbv-zero-bubble` schedule (ZB-V's pricing, two stages per rank),
    not `zb-v`, which runs only what the sail-sg fork runs (no DP overlap, no bf16 ZB-V). The job
    predicts, and its Megatron note says it is not Megatron-LM's; `mofa tune` leaves it out of its
    default space."""
    from mofa_framework import Predictor
    from mofa_framework.tuner import default_space

    pred = Predictor()
    reg = pred.registry
    flags = ("--model.name llama3 --model.flavor 8B --parallelism.data_parallel_shard_degree 2 "
             "--parallelism.pipeline_parallel_degree 4 --parallelism.pipeline_parallel_schedule ZBVZeroBubble "
             "--training.local_batch_size 8 --training.seq_len 8192 --compile.enable")
    job = from_torchtitan(flags, reg, hardware=H100, num_gpus=8).job
    assert job["pipeline"] == {"schedule": "zbv-zero-bubble"} and job["parallel"]["vpp"] == 2
    assert {"distributed_optimizer", "dp_overlap"} <= set(job["features"])
    res = pred.predict(pred.job(job))[0]
    zb_v = pred.predict(pred.job({**job, "pipeline": {"schedule": "zb-v"},
                                  "parallel": {**job["parallel"], "precision": "fp16"},
                                  "features": {k: v for k, v in job["features"].items() if k != "dp_overlap"}}))[0]
    assert res.schedule == "zbv-zero-bubble" and res.step_time_s > 0 and zb_v.schedule == "zb-v"
    with pytest.raises(ConfigError, match="sail-sg"):  # the fork's zb-v: no DP overlap, no bf16
        pred.predict(pred.job({**job, "pipeline": {"schedule": "zb-v"}}))
    space = default_space(reg, reg.model("llama3.1-8b"), reg.hardware_profile(H100), 8, 8192)
    assert "zbv-zero-bubble" not in space.schedules and "zb-v" in space.schedules
    note = reg.schedule("zbv-zero-bubble").megatron_args[0]
    assert note.startswith("# not Megatron-LM") and "ZBVZeroBubble" in note


#: a 2024 config (torchtitan's layout until early 2025): degrees under [training] / [experimental],
#: ``batch_size``, ``training.compile``, ``[float8] enable_float8_linear``, micro-batches by count
LLAMA3_405B_2024 = """
[model]
name = "llama3"
flavor = "405B"

[training]
batch_size = 8
seq_len = 8192
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 8
compile = true

[experimental]
context_parallel_degree = 1
pipeline_parallel_degree = 4
pipeline_parallel_microbatches = 4

[activation_checkpoint]
mode = "full"

[float8]
enable_float8_linear = true
"""


def test_a_2024_config_is_read_in_the_2025_layout():
    """The 2024 keys land where the 2025 ones do: TP 8 and PP 4 from [training] / [experimental],
    a rank's batch of 8 split into 4 micro-batches of 2, float8 on, compiled kernels, and the loss in
    fp32 left uncompiled (torchtitan's 2024 train.py)."""
    from mofa_framework import Predictor

    reg = Predictor().registry
    res = from_torchtitan(LLAMA3_405B_2024, reg, hardware=H100, num_gpus=512)
    p, f = res.job["parallel"], res.job["features"]
    assert (p["tp"], p["pp"], p["micro_batch_size"], p["global_batch_size"]) == (8, 4, 2, 8 * 16)
    assert f["fp8"]["recipe"] == "tensorwise" and "eager_kernels" not in f
    assert f["fp32_cross_entropy"] == {} and "distributed_optimizer" in f
    assert any("a 2024 config" in n for n in res.notes)
    Predictor().job(res.job)  # loads


def test_async_tp_and_hsdp_are_named_not_guessed():
    from mofa_framework import Predictor

    reg = Predictor().registry
    res = from_torchtitan("--model.flavor 70B --parallelism.tensor_parallel_degree 8 "
                          "--parallelism.enable_async_tensor_parallel --parallelism.data_parallel_replicate_degree 2",
                          reg, hardware=H100, num_gpus=64)
    assert "tp_overlap" not in res.job["features"]
    assert any("async TP not priced" in n for n in res.notes)
    assert any("HSDP (replicate 2 × shard 4)" in n for n in res.notes)


@pytest.mark.parametrize("source, fragment", [
    ("--model.name llama9", "model.name / model.flavor: 'llama9'"),
    ("--model.flavor 8B --parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule LoopedBFS",
     "pipeline_parallel_schedule: 'LoopedBFS'"),
    ("--model.flavor 8B --parallelism.data_parallel_shard_degree 3", "degrees multiply to 3 GPUs"),
    ("--model.flavor 8B --parallelism.tensor_parallel_degree 0", "tensor_parallel_degree: expected an integer ≥ 1"),
    ("--model.flavor 8B --parallelism.tensor_parallel_degree eight", "got 'eight'"),
    ("--model.flavor 8B --activation_checkpoint.mode sometimes", "activation_checkpoint.mode: 'sometimes'"),
    ("--model.flavor 8B --activation_checkpoint.selective_ac_option twice", "selective_ac_option: 'twice'"),
    ("--model.flavor 8B --training.mixed_precision_param float32", "mixed_precision_param: 'float32'"),
    ("--model.flavor 8B --parallelism.tensor_parallel_degree 3", "not a multiple of replicate × tp × pp × cp = 3"),
    ("--model.flavor 8B --training.seq_len 99999999999", "sequence_length"),
    ("model = [", "not TOML"),
    ("--model.flavor 8B stray", "'stray' is not a --section.key flag"),
    ("training = 3", "training: expected a table"),
    ("[model]\nflavor = '8B'\n[training]\nbatch_size = 'x'", "training.batch_size: expected an integer"),
    ("--model.flavor 8B --training.seq_len 4096 --training.seq_len.x 2", "'seq_len' was given a value of its own"),
])
def test_bad_configs_are_one_line_naming_the_key(cli, source, fragment):
    text = source if source.startswith("--") else None
    r = CliRunner().invoke(cli, ["import", "torchtitan", text or "-", "--hardware", H100, "--gpus", "64"],
                           input=None if text else source)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.exit_code == 2 and len(lines) == 1 and fragment in lines[0], r.output


def test_the_command_writes_a_job_file_that_predicts(cli, tmp_path):
    src = tmp_path / "llama3_70b.toml"
    src.write_text(LLAMA3_70B)
    out = tmp_path / "job.toml"
    r = CliRunner().invoke(cli, ["import", "torchtitan", str(src), "--hardware", H100, "--gpus", "256", "-o", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert text.startswith("# imported by `mofa import torchtitan` from llama3_70b.toml") and 'name = "llama3_70b"' in text
    p = CliRunner().invoke(cli, ["predict", str(out), "--format", "json"])
    assert p.exit_code == 0, p.output
    assert json.loads(p.stdout)["parallel"]["tp"] == 8
    assert CliRunner().invoke(cli, ["import", "torchtitan", str(src), "--gpus", "256"]).exit_code == 2  # no --hardware


def test_a_model_the_flavors_do_not_name_comes_from_model():
    from mofa_framework import Predictor

    reg = Predictor().registry
    job = from_torchtitan("--model.name my_llama --model.flavor 7B", reg, hardware=H100, num_gpus=8,
                          model="llama2-7b").job
    assert job["model"] == {"name": "llama2-7b"}
    with pytest.raises(ConfigError, match="pass --model"):
        from_torchtitan("--model.name my_llama --model.flavor 7B", reg, hardware=H100, num_gpus=8)


def test_megatron_arguments_in_quotes_are_the_source(cli):
    """`mofa import megatron "--tensor-model-parallel-size 8 ..."`: the quoted arguments are SOURCE,
    not an unknown option of the command (they were refused before 2026-11-29)."""
    args = ("--tensor-model-parallel-size 8 --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
            "--seq-length 4096 --micro-batch-size 1 --global-batch-size 64")
    r = CliRunner().invoke(cli, ["import", "megatron", args, "--hardware", H100, "--gpus", "8", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["parallel"]["tp"] == 8
