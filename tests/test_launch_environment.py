"""The environment a Megatron-LM launch of a tuned configuration needs (``tuner.megatron_environment``).

Megatron-LM (d98e8a6, ``megatron/training/arguments.py``) asserts ``CUDA_DEVICE_MAX_CONNECTIONS=1``
with tensor or context parallelism on devices of major version below 10, unless Megatron-FSDP or the
MoE all-to-all overlap is on, and asserts Megatron-FSDP runs with it anything but 1. The expected
values below are those rules applied by hand to each configuration."""

import json

import attrs
import pytest
from click.testing import CliRunner

from mofa_framework import Predictor
from mofa_framework.cli import _builtin_commands, cli
from mofa_framework.tuner import (MAX_CONNECTIONS, LaunchEnvironment, compose_environment, core_environment,
                                  feature_choices, megatron_context, megatron_environment)
from mofa_framework.types import EnvRequirement, Feature

ONE = EnvRequirement(name=MAX_CONNECTIONS, value="1", reason="core rule")
NOT_ONE = EnvRequirement(name=MAX_CONNECTIONS, value="1", equal=False, reason="fsdp rule")
ASK_32 = EnvRequirement(name=MAX_CONNECTIONS, value="32", required=False, reason="overlap wish")


def test_the_core_requirement_alone_is_printed():
    env = compose_environment([ONE], [])
    assert env.to_dict() == {MAX_CONNECTIONS: "1"}
    assert env.shell() == [f"export {MAX_CONNECTIONS}=1"]
    assert env.notes == ()


def test_a_feature_forbidding_the_core_value_unsets_it_and_says_the_core_gave_way():
    env = compose_environment([ONE], [("fsdp", NOT_ONE)])
    assert env.to_dict() == {MAX_CONNECTIONS: None}
    assert env.shell() == [f"unset {MAX_CONNECTIONS}"]
    assert env.reasons[MAX_CONNECTIONS] == "fsdp: fsdp rule"
    assert len(env.notes) == 1 and "fsdp overrides the core's 1" in env.notes[0]


def test_a_value_asked_beside_a_forbidden_one_is_set_with_both_reasons():
    env = compose_environment([ONE], [("ep_overlap", ASK_32), ("fsdp", NOT_ONE)])
    assert env.to_dict() == {MAX_CONNECTIONS: "32"}
    assert env.reasons[MAX_CONNECTIONS] == "ep_overlap: overlap wish; fsdp: fsdp rule"


def test_a_required_value_beats_a_recommended_one_whatever_the_order():
    required_7 = EnvRequirement(name=MAX_CONNECTIONS, value="7", reason="needs 7")
    env = compose_environment([], [("a", ASK_32), ("b", required_7)])
    assert env.to_dict() == {MAX_CONNECTIONS: "7"}
    assert env.notes == (f"{MAX_CONNECTIONS}=32 (a: overlap wish) left out: 7 kept",)


def test_a_value_a_feature_forbids_is_left_out_with_a_note():
    env = compose_environment([], [("a", EnvRequirement(name=MAX_CONNECTIONS, value="1", reason="x")),
                                   ("b", NOT_ONE)])
    assert env.to_dict() == {MAX_CONNECTIONS: None}
    assert env.notes == (f"{MAX_CONNECTIONS}=1 (a) left out: b cannot run with it",)


def test_requirements_validate_their_fields():
    with pytest.raises(ValueError):
        EnvRequirement(name="NOT A NAME", value="1")
    with pytest.raises(TypeError):
        EnvRequirement(name="X", value=1)
    bad = Feature(name="bad_env", description="returns strings", megatron_env=lambda o: ["X=1"])
    with pytest.raises(TypeError, match="bad_env"):
        bad.megatron_env_requirements(None, None)


@pytest.fixture(scope="module")
def tuned():
    """A tuned dense candidate (Llama 3 70B, 64 H100s) and an MoE one (Qwen3-30B-A3B, 32 H100s)."""
    p = Predictor()
    out = {}
    for key, model, gpus, gbs in (("dense", "llama3-70b", 64, 64), ("moe", "qwen3-30b-a3b", 32, 256)):
        job = p.job({"model": {"name": model}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": gpus},
                     "parallel": {"global_batch_size": gbs, "sequence_length": 4096}})
        out[key] = (p.registry.model(model), p.tune(job, top_k=1).best[0])
    return out


def _env(mofa_predictor, model, cand, hardware, **change):
    reg = mofa_predictor.registry
    return megatron_environment(model, attrs.evolve(cand, **change), reg, reg.hardware_profile(hardware))


@pytest.mark.parametrize("hardware, tp, cp, expected", [
    ("h100-sxm5-80gb", 8, 1, {MAX_CONNECTIONS: "1"}),   # Hopper, tensor parallelism: asserted
    ("a100-sxm4-80gb", 1, 2, {MAX_CONNECTIONS: "1"}),   # Ampere, context parallelism: asserted
    ("mi300x", 8, 1, {MAX_CONNECTIONS: "1"}),           # gfx942 reports major 9 under ROCm
    ("b200-sxm-180gb", 8, 1, {}),                       # Blackwell: no requirement
    ("h100-sxm5-80gb", 1, 1, {}),                       # no TP, no CP: none
])
def test_the_core_rule_by_architecture_and_parallelism(mofa_predictor, tuned, hardware, tp, cp, expected):
    model, cand = tuned["dense"]
    par = {**cand.parallel, "tp": tp, "cp": cp}
    env = _env(mofa_predictor, model, cand, hardware, parallel=par, features={"distributed_optimizer": {}})
    assert env.to_dict() == expected
    assert env.notes == ()


def test_megatron_fsdp_unsets_the_variable_on_hopper_with_tensor_parallelism(mofa_predictor, tuned):
    model, cand = tuned["dense"]
    par = {**cand.parallel, "tp": 8, "cp": 1}
    for features in ({"fsdp": {}}, {"distributed_optimizer": {"shard_gradients": True}}):
        env = _env(mofa_predictor, model, cand, "h100-sxm5-80gb", parallel=par, features=features)
        assert env.to_dict() == {MAX_CONNECTIONS: None}, features
        assert "Megatron-FSDP asserts" in env.reasons[MAX_CONNECTIONS]
        assert len(env.notes) == 1  # the core's 1 gave way


def test_the_moe_all_to_all_overlap_asks_for_more_queues_and_an_sm_margin(mofa_predictor, tuned):
    model, cand = tuned["moe"]
    par = {**cand.parallel, "tp": 2, "cp": 1}
    env = _env(mofa_predictor, model, cand, "h100-sxm5-80gb", parallel=par,
               features={"ep_overlap": {}, "fsdp": {}})
    assert env.to_dict() == {MAX_CONNECTIONS: "32", "NVTE_BWD_LAYERNORM_SM_MARGIN": "20",
                             "NVTE_FWD_LAYERNORM_SM_MARGIN": "20"}
    assert env.reasons[MAX_CONNECTIONS].startswith("ep_overlap:") and "fsdp:" in env.reasons[MAX_CONNECTIONS]


def test_every_feature_setting_gives_typed_requirements(mofa_predictor, tuned):
    """Every option setting the tuner can try of every feature with ``megatron_env`` returns
    EnvRequirement records with a reason (a user reads why)."""
    reg = mofa_predictor.registry
    model, cand = tuned["moe"]
    context = megatron_context(model, cand, reg.hardware_profile("h100-sxm5-80gb"))
    seen = 0
    for name, feat in reg.features.items():
        if feat.megatron_env is None:
            continue
        for opts in feature_choices(reg, name):
            if opts is None:
                continue
            obj = feat.options_type(**opts) if attrs.has(feat.options_type) else None
            for req in feat.megatron_env_requirements(obj, context):
                assert isinstance(req, EnvRequirement) and req.reason, (name, opts, req)
                seen += 1
    assert seen >= 3  # fsdp, Megatron-FSDP's distributed optimizer, ep_overlap's three


def test_core_environment_reads_tp_and_cp(tuned):
    _, cand = tuned["dense"]
    assert core_environment(attrs.evolve(cand, parallel={**cand.parallel, "tp": 2, "cp": 1}), "hopper") == [
        EnvRequirement(name=MAX_CONNECTIONS, value="1",
                       reason="asserted by Megatron-LM's validate_args with tensor or context parallelism before Blackwell")]
    assert core_environment(attrs.evolve(cand, parallel={**cand.parallel, "tp": 2, "cp": 1}), "blackwell") == []


@pytest.fixture
def run_cli(monkeypatch):
    monkeypatch.delenv("MOFA_DISABLED_PLUGINS", raising=False)
    _builtin_commands()

    def invoke(*args):
        r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return r
    return invoke


def test_mofa_tune_prints_the_environment_in_every_format(run_cli):
    base = ["tune", "--model", "llama3-8b", "--hardware", "h100-sxm5-80gb", "--gpus", "16", "--gbs", "64",
            "--seq", "4096", "--tp-values", "2", "--no-progress"]
    out = run_cli(*base, "--format", "json")
    data = json.loads(out.stdout)
    env = data["megatron_env"]
    assert set(env) == {MAX_CONNECTIONS} and env[MAX_CONNECTIONS] in ("1", None)
    assert data["megatron_env_reasons"][MAX_CONNECTIONS]
    shell = [f"export {MAX_CONNECTIONS}=1"] if env[MAX_CONNECTIONS] == "1" else [f"unset {MAX_CONNECTIONS}"]
    lines = run_cli(*base, "--format", "megatron").stdout.splitlines()
    assert [ln for ln in lines if ln.startswith(("export ", "unset "))] == shell
    assert lines.index(shell[0]) < next(i for i, ln in enumerate(lines) if ln.startswith("--"))
    table = run_cli(*base).stdout
    assert "environment: " + shell[0] in table
    assert isinstance(LaunchEnvironment(settings=env).shell(), list)


def test_a_jobs_launch_is_the_tuned_candidates_launch(tuned):
    """``LaunchConfig.of_job`` of the job a candidate stands for gives the candidate's own Megatron
    line and environment (the round trip `mofa predict --format megatron` relies on)."""
    from mofa_framework.commands.tune import candidate_job
    from mofa_framework.tuner import LaunchConfig, megatron_arguments

    p = Predictor()
    reg = p.registry
    for key, model_name, gpus, gbs in (("dense", "llama3-70b", 64, 64), ("moe", "qwen3-30b-a3b", 32, 256)):
        model, cand = tuned[key]
        job = p.job({"model": {"name": model_name}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": gpus},
                     "parallel": {"global_batch_size": gbs, "sequence_length": 4096}})
        launch = LaunchConfig.of_job(candidate_job(job, cand, reg), reg)
        assert launch.schedule == cand.schedule
        assert megatron_arguments(model, launch, reg, job.hardware) == megatron_arguments(model, cand, reg, job.hardware)
        assert (megatron_environment(model, launch, reg, job.hardware)
                == megatron_environment(model, cand, reg, job.hardware))


def test_mofa_predict_writes_each_job_as_a_megatron_launch(run_cli):
    out = run_cli("predict", "examples/deepseek-v3-h800.toml", "examples/gpt3-175b-a100.toml",
                  "--format", "megatron").stdout.splitlines()
    heads = [i for i, ln in enumerate(out) if ln.startswith("# job: ")]
    assert [out[i] for i in heads] == ["# job: deepseek-v3-2048xh800", "# job: gpt3-175b-768xa100"]
    first = out[heads[0]:heads[1]]
    # DeepSeek-V3's example runs the MoE all-to-all overlap: the environment its launches export
    assert {f"export {MAX_CONNECTIONS}=32", "export NVTE_FWD_LAYERNORM_SM_MARGIN=20"} <= set(first)
    assert "--overlap-moe-expert-parallel-comm \\" in first and "--delay-wgrad-compute \\" in first
    second = out[heads[1]:]
    args = [ln for ln in second if ln.startswith("--")]
    assert args[0] == "--tensor-model-parallel-size 8 \\" and not args[-1].endswith("\\")
    # GPT-3 175B on A100s at TP 8: the core's CUDA_DEVICE_MAX_CONNECTIONS=1 unless a feature waives it
    env = [ln for ln in second if ln.startswith(("export ", "unset "))]
    assert env in ([f"export {MAX_CONNECTIONS}=1"], [f"unset {MAX_CONNECTIONS}"])


def test_environment_findings_hold_a_launchs_exports_against_the_line():
    from mofa_framework.tuner import environment_findings

    fsdp = compose_environment([ONE], [("fsdp", NOT_ONE)])
    stop = environment_findings(fsdp, {MAX_CONNECTIONS: "1"})
    assert len(stop) == 1 and "exports CUDA_DEVICE_MAX_CONNECTIONS=1 against fsdp: fsdp rule" in stop[0]
    assert "stops there before its first step" in stop[0]
    assert environment_findings(fsdp, {}) == []                       # unset, as needed
    assert environment_findings(fsdp, {MAX_CONNECTIONS: "8"}) == []   # anything but 1
    core = compose_environment([ONE], [])
    assert environment_findings(core, {MAX_CONNECTIONS: "1", "TP": "8"}) == []
    missing = environment_findings(core, {})
    assert len(missing) == 1 and "does not set CUDA_DEVICE_MAX_CONNECTIONS; the line needs 1" in missing[0]
    wrong = environment_findings(core, {MAX_CONNECTIONS: "32"})
    assert len(wrong) == 1 and "needs 1" in wrong[0] and "stops" in wrong[0]
    overlap = compose_environment([], [("ep_overlap", ASK_32)])  # recommended only: slower, not stopped
    slow = environment_findings(overlap, {MAX_CONNECTIONS: "1"})
    assert len(slow) == 1 and "stops" not in slow[0] and "MoFa prices" in slow[0]


SCRIPT = """#!/bin/bash
{export}
TP=2
torchrun --nproc_per_node 8 --nnodes 4 pretrain_gpt.py \\
  --tensor-model-parallel-size $TP --pipeline-model-parallel-size 1 --sequence-parallel \\
  --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 14336 \\
  --group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm \\
  --position-embedding-type rope --untie-embeddings-and-output-weights --seq-length 8192 \\
  --micro-batch-size 1 --global-batch-size 128 --bf16 {optimizer}
"""
FSDP_FLAGS = "--use-megatron-fsdp --ckpt-format fsdp_dtensor --data-parallel-sharding-strategy optim_grads_params"


@pytest.mark.parametrize("export, optimizer, finding", [
    ("export CUDA_DEVICE_MAX_CONNECTIONS=1", FSDP_FLAGS, "exports CUDA_DEVICE_MAX_CONNECTIONS=1 against fsdp"),
    ("", "--use-distributed-optimizer", "does not set CUDA_DEVICE_MAX_CONNECTIONS; the line needs 1"),
    ("export CUDA_DEVICE_MAX_CONNECTIONS=1", "--use-distributed-optimizer", None),
    ("", FSDP_FLAGS, None),
])
def test_mofa_import_notes_a_launch_environment_the_line_cannot_run_in(tmp_path, run_cli, export, optimizer, finding):
    script = tmp_path / "launch.sh"
    script.write_text(SCRIPT.format(export=export, optimizer=optimizer))
    r = run_cli("import", "megatron", str(script), "--hardware", "h100-sxm5-80gb")
    env_notes = [ln for ln in r.stderr.splitlines() if "CUDA_DEVICE_MAX_CONNECTIONS" in ln]
    if finding is None:
        assert env_notes == []
    else:
        assert len(env_notes) == 1 and finding in env_notes[0]
        assert finding in r.stdout  # the written job's header carries the note too
    # an argument list carries no environment: nothing to hold against
    args = SCRIPT.format(export="", optimizer=optimizer).split("pretrain_gpt.py", 1)[1].replace("\\\n", " ")
    r2 = run_cli("import", "megatron", args.replace("$TP", "2"), "--hardware", "h100-sxm5-80gb", "--gpus", "32")
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in r2.stderr
