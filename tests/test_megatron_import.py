"""Megatron-LM / NeMo arguments in: the launch-script reader, the flag mapping through the
registry (each feature's ``from_megatron``), zoo matching, the CLI, and the round trip from
``mofa tune --format megatron`` back to the same prediction.

The launch scripts under tests/data/megatron/ were written for these tests after the flag
lists of Megatron-LM's public examples (examples/gpt3, examples/llama, examples/mixtral and the
DeepSeek-V3 scripts); the expected values below are read off those flags by hand.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import attrs
import pytest
from click.testing import CliRunner

from mofa_framework import hookimpl
from mofa_framework.api import Predictor
from mofa_framework.cli import _builtin_commands, cli
from mofa_framework.errors import ConfigError
from mofa_framework.launch_script import launcher_gpus, read_script
from mofa_framework.megatron import (MegatronArgs, flags_from_config, from_args, match_model, parse_flags,
                                     read_source, to_toml)
from mofa_framework.types import MegatronContext

from mofa_plugins import schedule_1f1b

_builtin_commands()
DATA = Path(__file__).resolve().parent / "data" / "megatron"
H100 = "h100-sxm5-80gb"


@pytest.fixture(scope="module")
def predictor():
    return Predictor()


@pytest.fixture(scope="module")
def registry(predictor):
    return predictor.registry


# ---------------------------------------------------------------------- the bash reader


def test_script_variables_arrays_defaults_and_arithmetic():
    text = r'''
    export CUDA_DEVICE_MAX_CONNECTIONS=1
    GPUS=8; NODES=${SLURM_NNODES:-4}
    WORLD=$((GPUS * NODES))
    TP=${TP:=2}
    EMPTY=
    ARGS=(
        --tensor-model-parallel-size $TP   # a comment
        --seq-length "$((1024*4))"
        "--lr 1e-4"
    )
    ARGS+=(--bf16 ${EMPTY})
    LAUNCH="--nproc_per_node=$GPUS --nnodes $NODES"
    torchrun $LAUNCH pretrain_gpt.py "${ARGS[@]}" --world '$WORLD' --w2 "$WORLD" \
        --last 1 > log.txt 2>&1
    '''
    r = read_script(text)
    assert r.program == "pretrain_gpt.py"
    assert r.launcher == ("torchrun", "--nproc_per_node=8", "--nnodes", "4")
    # quoted array elements stay one word; '...' is literal; redirections are not arguments
    assert r.arguments == ("--tensor-model-parallel-size", "2", "--seq-length", "4096", "--lr 1e-4", "--bf16",
                           "--world", "$WORLD", "--w2", "32", "--last", "1")
    assert launcher_gpus(r) == 32
    assert dict(r.variables)["WORLD"] == "32"


def test_script_conditionals_and_environment():
    text = '''
    DTYPE=${DTYPE:-bf16}
    if [[ "$DTYPE" == "fp8" ]]; then
        EXTRA=(--fp8-format hybrid)
    elif [ "$DTYPE" = bf16 ] && [ -n "$DTYPE" ]; then
        EXTRA=(--bf16)
    else
        EXTRA=(--fp16)
    fi
    if [ ! -f "$CKPT" ]; then EXTRA+=(--no-load); fi
    python pretrain_gpt.py ${EXTRA[@]}
    '''
    assert read_script(text).arguments == ("--bf16",)
    assert read_script(text, environ={"DTYPE": "fp8"}).arguments == ("--fp8-format", "hybrid")
    r = read_script("X=$(hostname)\npython train.py --host x$X\n")
    assert r.arguments == ("--host", "x") and any("hostname" in n for n in r.notes)


def test_a_plain_argument_list_and_a_command_in_a_variable():
    assert read_script("--num-layers 2 \\\n  --hidden-size 64").arguments == ("--num-layers", "2", "--hidden-size",
                                                                              "64")
    r = read_script(DATA.joinpath("deepseek_v3.sh").read_text())
    assert r.program == "pretrain_gpt.py" and launcher_gpus(r) == 256  # srun --nodes=32 --ntasks-per-node=8
    with pytest.raises(ConfigError, match="no arguments"):
        read_script("echo hello\n")


def test_parse_flags():
    assert parse_flags(["--a", "1", "--b", "--c=x", "--d", "p", "q", "--a", "2"]) == {
        "--a": ("2",), "--b": (), "--c": ("x",), "--d": ("p", "q")}


# ---------------------------------------------------------------------- published-style scripts


def imported(registry, name, **kw):
    kw.setdefault("hardware", H100)
    kw.setdefault("num_gpus", None)
    return read_source(DATA.joinpath(name).read_text(), registry, kind="megatron", **kw)


def test_gpt3_175b(registry, predictor):
    r = imported(registry, "gpt3_175b_fp16.sh")
    par = r.job["parallel"]
    assert r.model_match == "gpt3-175b"  # GPT-2 BPE's 50,257 padded to 51,200 for TP 8, as the zoo has it
    assert r.job["hardware"]["num_gpus"] == 1024  # torchrun: 8 per node × ${NUM_NODES:-128}
    assert (par["tp"], par["pp"], par["vpp"], par["micro_batch_size"], par["global_batch_size"],
            par["sequence_length"], par["precision"], par["sequence_parallel"]) == (8, 16, 1, 1, 1536, 2048, "fp16",
                                                                                     False)
    assert "features" not in r.job  # no overlap, no distributed optimizer, no recompute in the flags
    assert {"--lr", "--save", "--split", "--weight-decay", "--rampup-batch-size"} <= set(r.ignored)
    assert not r.unknown and any("rampup" in n for n in r.notes)
    predictor.job(r.job)  # loads


def test_llama3_70b_interleaved_fp8(registry):
    r = imported(registry, "llama3_70b_interleaved.sh")
    par = r.job["parallel"]
    assert r.model_match in ("llama3-70b", "llama3.1-70b")
    assert r.job["hardware"]["num_gpus"] == 128  # --nproc_per_node=8 --nnodes=${SLURM_NNODES:-16}
    # 80 layers / PP 4 = 20 per stage, 5 per virtual stage: 4 chunks
    assert (par["tp"], par["pp"], par["vpp"], par["cp"], par["sequence_parallel"]) == (8, 4, 4, 2, True)
    assert r.job["features"] == {
        "tp_overlap": {}, "cp_overlap": {}, "pp_overlap": {},  # interleaved: Megatron overlaps p2p by default
        "distributed_optimizer": {"grad_reduce_dtype": "fp32"}, "dp_overlap": {},
        "recompute": {"granularity": "full", "num_layers": 2}, "fp8": {"recipe": "tensorwise", "fp8_params": True}}
    assert r.unknown == ("--my-cluster-flag",)  # listed, not fatal
    assert "--fp8-param-gather" not in r.ignored  # read: FP8 weights, gathered in FP8


def test_mixtral_moe(registry):
    r = imported(registry, "mixtral_8x7b.sh")
    assert r.model_match == "mixtral-8x7b"  # no --vocab-size: matched on the shape alone
    assert r.job["hardware"]["num_gpus"] == 64
    assert (r.job["parallel"]["pp"], r.job["parallel"]["ep"]) == (4, 8)
    assert r.job["features"] == {"distributed_optimizer": {"grad_reduce_dtype": "fp32"}, "dp_overlap": {}}
    assert {"--moe-grouped-gemm", "--moe-aux-loss-coeff"} <= set(r.ignored)


def test_deepseek_v3(registry, predictor):
    r = imported(registry, "deepseek_v3.sh")
    par = r.job["parallel"]
    # MLA, 256 experts with one shared, [0]*3+[1]*58 = 3 dense layers, 8 groups top-4, one MTP layer
    assert r.model_match == "deepseek-v3"
    assert (par["pp"], par["ep"], par["etp"], par["first_stage_layers"], par["last_stage_layers"]) == (4, 64, 1, 16, 15)
    feats = r.job["features"]
    assert feats["fp8"] == {"recipe": "blockwise"} and feats["flex_dispatcher"] == {"backend": "deepep"}
    assert feats["recompute"] == {"mla_up_proj": True, "moe_act": True, "layernorm": True}
    res = predictor.predict(predictor.job(r.job))[0]
    assert res.step_time_s > 0 and set(res.stage_memory_gib) == {"first", "mid", "last"}


def test_inline_model_when_no_zoo_model_matches(registry, predictor):
    r = imported(registry, "small_gpt_args.txt", num_gpus=64)
    m = r.job["model"]
    assert r.model_match is None
    # 20 layers, hidden 2560, 20 heads; gelu 4h MLP; learned positions, tied embeddings
    assert (m["num_layers"], m["hidden_size"], m["ffn_hidden_size"], m["num_kv_heads"]) == (20, 2560, 10240, 20)
    assert (m["activation"], m["position_embedding"], m["tied_embeddings"]) == ("gelu", "learned", True)
    assert m["vocab_size"] == 50432  # 50,257 padded to a multiple of 128 × TP 2
    assert r.job["features"]["recompute"] == {}  # --recompute-activations: selective
    predictor.predict(predictor.job(r.job))
    with pytest.raises(ConfigError, match="--vocab-size"):
        from_args(["--num-layers", "3", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "128"],
                  registry, hardware=H100, num_gpus=8)


def test_model_flag_and_missing_inputs(registry):
    words = ["--tensor-model-parallel-size", "2", "--seq-length", "4096", "--global-batch-size", "16", "--bf16"]
    r = from_args(words, registry, hardware=H100, num_gpus=8, model="llama3-8b")
    assert r.job["model"] == {"name": "llama3-8b"} and r.job["parallel"]["tp"] == 2
    with pytest.raises(ConfigError, match="--hardware"):
        from_args(words, registry, hardware=None, num_gpus=8, model="llama3-8b")
    with pytest.raises(ConfigError, match="--gpus"):
        from_args(words, registry, hardware=H100, num_gpus=None, model="llama3-8b")
    with pytest.raises(ConfigError, match="--num-layers"):
        from_args(words, registry, hardware=H100, num_gpus=8)
    with pytest.raises(ConfigError, match="--moe-layer-freq"):
        from_args(words + ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
                           "--num-experts", "4", "--moe-layer-freq", "[1]*3", "--vocab-size", "100"],
                  registry, hardware=H100, num_gpus=8)


def test_uneven_stages_from_accounting_flags(registry):
    """Megatron counts the embedding (loss) as a layer of the first (last) stage: 80 layers + 2 on
    PP 4 are 20.5 — not divisible; 78 + 2 = 80 are 20 per stage, so 19 + 20 + 20 + 19."""
    words = ["--pipeline-model-parallel-size", "4", "--seq-length", "1024", "--global-batch-size", "8",
             "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
             "--num-layers", "78", "--hidden-size", "1024", "--num-attention-heads", "8", "--vocab-size", "32000"]
    r = from_args(words, registry, hardware=H100, num_gpus=8)
    assert (r.job["parallel"]["first_stage_layers"], r.job["parallel"]["last_stage_layers"]) == (19, 19)
    r = from_args(words + ["--num-layers-per-virtual-pipeline-stage", "5"], registry, hardware=H100, num_gpus=8)
    assert r.job["parallel"]["vpp"] == 4


def test_the_training_program_is_the_launch_line():
    text = "python tools/preprocess_data.py --input x\ntorchrun pretrain_gpt.py --num-layers 2\n" \
           "python tools/checkpoint/convert.py --model-type GPT\n"
    r = read_script(text)
    assert r.program == "pretrain_gpt.py" and r.arguments == ("--num-layers", "2")


def test_match_model_compares_the_shape(registry):
    llama = registry.model("llama3-8b")
    fields = {k: getattr(llama, k) for k in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
                                              "ffn_hidden_size", "vocab_size")}
    assert "llama3-8b" in match_model(fields, registry.models)
    assert match_model({**fields, "num_layers": 31}, registry.models) == []
    assert match_model({**fields, "vocab_size": 32064}, registry.models) == []
    # Mistral 7B is Llama 3 8B's shape with a 32,000 vocabulary
    assert match_model({**fields, "vocab_size": 32000}, registry.models) == ["mistral-7b"]


# ---------------------------------------------------------------------- features through the registry


def test_every_features_from_megatron_inverts_its_megatron_args(registry):
    """For each feature declaring both: the arguments it writes, read back, turn it on with
    options that write the same arguments (cp/pp overlap need CP > 1 / interleaving)."""
    checked = 0
    parallel = {"tp": 2, "pp": 4, "vpp": 2, "cp": 2, "ep": 1}
    context = MegatronContext(model=registry.model("llama3-8b"), parallel=parallel)
    for feat in registry.features.values():
        if feat.from_megatron is None or feat.megatron_args is None:
            continue
        opts = feat.options_type() if attrs.has(feat.options_type) else None
        words = [w for tok in feat.megatron_tokens(opts, context) for w in tok.split() if not tok.startswith("#")]
        if not words:
            continue
        args = MegatronArgs(flags=parse_flags(words), parallel=parallel)
        back = feat.from_megatron(args)
        assert back is not None, feat.name
        again = feat.megatron_tokens(feat.options_type(**back) if attrs.has(feat.options_type) else None, context)
        assert again == feat.megatron_tokens(opts, context), feat.name
        assert set(parse_flags(words)) <= args.read, f"{feat.name} must read every flag it writes"
        assert feat.from_megatron(MegatronArgs(flags={}, parallel={"pp": 1, "vpp": 1, "cp": 1})) is None, feat.name
        checked += 1
    assert checked >= 10


def test_megatron_defaults_that_depend_on_the_layout(registry):
    pp = registry.features["pp_overlap"].from_megatron
    assert pp(MegatronArgs(flags={}, parallel={"pp": 4, "vpp": 2})) == {}  # interleaved: on by default
    assert pp(MegatronArgs(flags={"--no-overlap-p2p-communication": ()}, parallel={"pp": 4, "vpp": 2})) is None
    assert pp(MegatronArgs(flags={"--overlap-p2p-communication": ()}, parallel={"pp": 4, "vpp": 1})) is None
    cp = registry.features["cp_overlap"].from_megatron
    assert cp(MegatronArgs(flags={}, parallel={"cp": 2})) == {}  # --cp-comm-type p2p is the default
    assert cp(MegatronArgs(flags={"--cp-comm-type": ("a2a",)}, parallel={"cp": 2})) is None
    dist = registry.features["distributed_optimizer"].from_megatron
    fsdp = registry.features["fsdp"].from_megatron
    mfsdp = {"--use-megatron-fsdp": (), "--use-distributed-optimizer": ()}
    assert dist(MegatronArgs(flags=mfsdp)) is None and fsdp(MegatronArgs(flags=mfsdp)) == {"grad_reduce_dtype": "fp32"}
    zero2 = {**mfsdp, "--data-parallel-sharding-strategy": ("optim_grads",)}
    assert dist(MegatronArgs(flags=zero2))["shard_gradients"] is True and fsdp(MegatronArgs(flags=zero2)) is None
    # what MoFa writes for ZeRO-2 is current Megatron-LM's (--use-custom-fsdp deprecated since 2025-08; the
    # fsdp_dtensor checkpoint format asserted since 2026-04), and it reads back as ZeRO-2
    feat = registry.features["distributed_optimizer"]
    words = feat.megatron_args(feat.options_type(shard_gradients=True))
    assert words[:3] == ["--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor"] and "optim_grads" in words
    assert dist(MegatronArgs(flags=parse_flags(words)))["shard_gradients"] is True


class _ClaimingSchedule:
    """A test-local plugin: 1F1B under another name, selected by a fork's flag."""

    @hookimpl
    def mofa_register_pipeline_schedules(self):
        base = schedule_1f1b.SCHEDULE
        return [attrs.evolve(base, name="fork-1f1b", aliases=(),
                             from_megatron=lambda a: a.has("--enable-fork-schedule"))]


def test_megatron_deepspeed_zero_stage(registry):
    words = ["--deepspeed", "--zero-stage", "2", "--seq-length", "1024", "--global-batch-size", "16", "--bf16"]
    r = from_args(words, registry, hardware=H100, num_gpus=8, model="llama3-8b")
    assert r.job["features"]["deepspeed_zero"] == {"stage": 2} and {"--deepspeed", "--zero-stage"} <= set(r.used)
    r = from_args(words[:2] + ["0"] + words[3:], registry, hardware=H100, num_gpus=8, model="llama3-8b")
    assert "deepspeed_zero" not in r.job.get("features", {})


def test_megatron_deepspeed_ulysses_is_context_parallelism_by_all_to_all(registry):
    """``--ds-sequence-parallel-size N`` (Megatron-DeepSpeed's DeepSpeed-Ulysses) is CP N in its
    all-to-all form, beside DeepSpeed's ZeRO, and the job predicts."""
    words = ["--deepspeed", "--zero-stage", "1", "--ds-sequence-parallel-size", "4", "--seq-length", "32768",
             "--global-batch-size", "8", "--bf16"]
    r = from_args(words, registry, hardware=H100, num_gpus=16, model="llama3-8b")
    assert r.job["parallel"]["cp"] == 4 and "cp_a2a" in r.job["features"] and "cp_overlap" not in r.job["features"]
    assert "--ds-sequence-parallel-size" in r.used
    pred = Predictor()
    assert pred.predict(pred.job(r.job))[0].step_time_s > 0


def test_megatron_deepspeeds_zb_h1_pipeline(registry):
    """``--enable-zbh1-pipeline`` (Megatron-DeepSpeed's ZB-H1 in DeepSpeed's pipeline engine) with ZeRO-1."""
    words = ["--deepspeed", "--zero-stage", "1", "--pipeline-model-parallel-size", "4", "--enable-zbh1-pipeline",
             "--seq-length", "4096", "--global-batch-size", "64", "--bf16"]
    r = from_args(words, registry, hardware=H100, num_gpus=16, model="llama3-8b")
    assert r.job["pipeline"] == {"schedule": "zb-h1"} and "--enable-zbh1-pipeline" in r.used
    assert r.job["features"]["deepspeed_zero"] == {"stage": 1}
    pred = Predictor()
    assert pred.predict(pred.job(r.job))[0].step_time_s > 0


def test_a_schedule_can_claim_its_flags():
    pr = Predictor(plugins={"claiming_schedule": _ClaimingSchedule()})
    words = ["--pipeline-model-parallel-size", "2", "--seq-length", "1024", "--global-batch-size", "8",
             "--enable-fork-schedule", "--bf16"]
    r = from_args(words, pr.registry, hardware=H100, num_gpus=8, model="llama3-8b")
    assert r.job["pipeline"] == {"schedule": "fork-1f1b"} and "--enable-fork-schedule" in r.used
    assert pr.predict(pr.job(r.job))[0].schedule == "fork-1f1b"
    r = from_args(words[:-2] + ["--bf16"], pr.registry, hardware=H100, num_gpus=8, model="llama3-8b")
    assert "pipeline" not in r.job  # Megatron's own choice


# ---------------------------------------------------------------------- NeMo / Megatron-Bridge


BRIDGE_YAML = """
model:
  _target_: megatron.bridge.models.llama.Llama3ModelProvider70B
  tensor_model_parallel_size: 4
  pipeline_model_parallel_size: 4
  virtual_pipeline_model_parallel_size: 5
  context_parallel_size: 1
  sequence_parallel: true
  num_layers: 80
  hidden_size: 8192
  ffn_hidden_size: 28672
  num_attention_heads: 64
  num_query_groups: 8
  seq_length: 8192
  vocab_size: 128256
  gated_linear_unit: true
  share_embeddings_and_output_weights: false
  recompute_granularity: null
  overlap_p2p_comm: false
train:
  micro_batch_size: 1
  global_batch_size: 128
ddp:
  overlap_grad_reduce: true
  use_distributed_optimizer: true
comm_overlap:
  tp_comm_overlap: true
mixed_precision: bf16_with_fp8_current_scaling_mixed
"""

NEMO1_YAML = """
trainer:
  devices: 8
  num_nodes: 4
  precision: bf16-mixed
model:
  micro_batch_size: 2
  global_batch_size: 256
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 1
  encoder_seq_length: 4096
  num_layers: 32
  hidden_size: 4096
  ffn_hidden_size: 14336
  num_attention_heads: 32
  num_query_groups: 8
  activation: fast-swiglu
  normalization: rmsnorm
  position_embedding_type: rope
  share_embeddings_and_output_weights: false
  activations_checkpoint_granularity: full
  activations_checkpoint_method: block
  activations_checkpoint_num_layers: 4
  sequence_parallel: true
  tokenizer:
    library: huggingface
"""

NEMO2_PRINTED = """<Partial[pretrain(
  model=<Config[LlamaModel](config=<Config[Llama3Config8B]>)>,
  data=<Config[MockDataModule](seq_length=8192, global_batch_size=512, micro_batch_size=1)>,
  trainer=<Config[Trainer](strategy=<Config[MegatronStrategy](tensor_model_parallel_size=1,
    pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None, context_parallel_size=2,
    sequence_parallel=False, ddp=<Config[DistributedDataParallelConfig](overlap_grad_reduce=True,
    overlap_param_gather=True)>)>, devices=8, num_nodes=2,
    plugins=<Config[MegatronMixedPrecision](precision='bf16-mixed')>,
    callbacks=[<Config[MegatronCommOverlapCallback](tp_comm_overlap=False)>])>,
  optim=<Config[MegatronOptimizerModule](config=<Config[OptimizerConfig](lr=0.0003, use_distributed_optimizer=True)>)>)]>
"""


def test_megatron_bridge_yaml(registry):
    r = read_source(BRIDGE_YAML, registry, kind="nemo", hardware=H100, num_gpus=64)
    par = r.job["parallel"]
    assert r.model_match in ("llama3-70b", "llama3.1-70b")
    assert (par["tp"], par["pp"], par["vpp"], par["sequence_parallel"], par["global_batch_size"]) == (4, 4, 5, True,
                                                                                                      128)
    # overlap_p2p_comm: false; overlap_grad_reduce without overlap_param_gather: the gathers stay exposed
    assert r.job["features"] == {"tp_overlap": {}, "distributed_optimizer": {"grad_reduce_dtype": "fp32"},
                                 "dp_overlap": {"overlap_param_gather": False}, "fp8": {"recipe": "tensorwise"}}


def test_nemo1_yaml(registry):
    r = read_source(NEMO1_YAML, registry, kind="nemo", hardware=H100, num_gpus=None)
    assert r.job["hardware"]["num_gpus"] == 32  # trainer.devices × trainer.num_nodes
    assert r.model_match in ("llama3-8b", "llama3.1-8b", "mixtral-8x7b") and r.model_match != "mixtral-8x7b"
    assert r.job["features"]["recompute"] == {"granularity": "full", "num_layers": 4}
    assert r.job["parallel"]["sequence_length"] == 4096 and r.job["parallel"]["precision"] == "bf16"


def test_nemo2_printed_recipe_and_overrides(registry):
    r = read_source(NEMO2_PRINTED, registry, kind="nemo", hardware=H100, num_gpus=None)
    assert r.job["model"] == {"name": "llama3-8b"}  # from the config class Llama3Config8B
    assert r.job["hardware"]["num_gpus"] == 16 and r.job["parallel"]["cp"] == 2
    assert set(r.job["features"]) == {"cp_overlap", "distributed_optimizer", "dp_overlap"}
    flags, gpus, _ = flags_from_config("model.tensor_model_parallel_size=2 train.global_batch_size=64 "
                                       "model.sequence_parallel=true")
    assert flags == {"--tensor-model-parallel-size": ("2",), "--global-batch-size": ("64",),
                     "--sequence-parallel": ()} and gpus is None


# ---------------------------------------------------------------------- CLI and round trip


@pytest.fixture
def run(monkeypatch):
    monkeypatch.delenv("MOFA_DISABLED_PLUGINS", raising=False)
    runner = CliRunner()
    return lambda *a, **kw: runner.invoke(cli, list(a), catch_exceptions=False, **kw)


def test_cli_import_writes_a_job_that_predicts(run, tmp_path):
    out = tmp_path / "job.toml"
    r = run("import", "megatron", str(DATA / "llama3_70b_interleaved.sh"), "--hardware", H100, "-o", str(out))
    assert r.exit_code == 0, r.output
    assert "unknown (not read): --my-cluster-flag" in r.output and "ignored:" in r.output
    job = tomllib.loads(out.read_text())
    assert job["parallel"]["vpp"] == 4 and job["model"]["name"].startswith("llama3")
    p = run("predict", str(out), "--format", "json")
    assert p.exit_code == 0, p.output
    assert json.loads(p.stdout)["schedule"] == "interleaved-1f1b"
    y = tmp_path / "bridge.yaml"
    y.write_text(BRIDGE_YAML)
    r = run("import", "nemo", str(y), "--hardware", H100, "--gpus", "64", "--format", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["parallel"]["vpp"] == 5


def test_cli_errors_are_one_line(run):
    r = run("import", "megatron", str(DATA / "mixtral_8x7b.sh"))
    assert r.exit_code == 2 and "--hardware" in r.output and "Traceback" not in r.output
    r = run("import", "megatron", "no/such/script.sh", "--hardware", H100)
    assert r.exit_code == 2 and "no such file" in r.output
    r = run("predict", "--megatron-args", "--num-layers 2", "--hardware", H100, "--gpus", "8", "--tp", "2")
    assert r.exit_code == 2 and "--tp" in r.output


ROUND_TRIP_JOB = """
name = "round-trip"
[model]
name = "llama3-70b"
[hardware]
name = "h100-sxm5-80gb"
num_gpus = 64
[parallel]
global_batch_size = 64
sequence_length = 4096
[features.tp_overlap]   # held on at the chunk count Megatron's --tp-comm-overlap implies
[search]
tp = [4, 8]
pp = [2, 4]
vpp = [1]
cp = [1]
schedules = ["1f1b"]
features = ["distributed_optimizer", "dp_overlap", "recompute"]
"""


def test_round_trip_tune_megatron_output_predicts_the_same_step(run, tmp_path):
    """`tune --format megatron` read back (with the model, GPUs and hardware the arguments do not
    carry) predicts the tuner's step time. The space holds what Megatron's flags cannot express
    (tp_overlap's chunk count) at its default and avoids what Megatron decides by itself
    (CP's ring overlap, interleaving's p2p overlap), which MoFa's export does not write."""
    job = tmp_path / "job.toml"
    job.write_text(ROUND_TRIP_JOB)
    r = run("tune", str(job), "--top", "1", "--format", "json")
    assert r.exit_code == 0, r.output
    best = json.loads(r.stdout)["best"][0]
    args = run("tune", str(job), "--top", "1", "--format", "megatron").stdout
    text = "\n".join(line for line in args.splitlines() if not line.startswith("#"))
    assert "--pipeline-model-parallel-size" in text and "--tp-comm-overlap" in text  # not a trivial layout
    p = run("predict", "--megatron-args", text, "--model", "llama3-70b", "--hardware", H100, "--gpus", "64",
            "--format", "json")
    assert p.exit_code == 0, p.output
    got = json.loads(p.stdout)
    assert got["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-9)
    assert sorted(got["features"]) == sorted(best["features"])


def test_to_toml_round_trips_through_tomllib():
    job = {"name": 'a "b"', "model": {"name": "x"}, "parallel": {"tp": 2, "sequence_parallel": True, "f": 0.5},
           "features": {"recompute": {"granularity": "full"}, "dp_overlap": {}}}
    assert tomllib.loads(to_toml(job, ["header"])) == job


def test_the_import_docs_name_every_feature_that_reads_megatron_flags(registry):
    text = (Path(__file__).resolve().parents[1] / "docs" / "megatron-import.md").read_text()
    readers = [f.name for f in registry.features.values() if f.from_megatron is not None]
    assert len(readers) >= 10 and all(f"| `{name}` |" in text for name in readers)


def test_latent_moe_and_repeated_mtp_flags(registry):
    """--moe-latent-size and --mtp-use-repeated-layer (Nemotron 3 Super's MoE and MTP flags) reach the
    model: experts on the latent, the MTP modules sharing one set of weights."""
    words = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --ffn-hidden-size 2048 --seq-length 4096 "
             "--max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 8 --bf16 --num-experts 8 "
             "--moe-router-topk 2 --moe-ffn-hidden-size 512 --moe-latent-size 256 --mtp-num-layers 2 "
             "--mtp-use-repeated-layer --vocab-size 32000").split()
    r = from_args(words, registry, hardware=H100, num_gpus=8)
    model = r.job["model"]
    assert model["moe_latent_size"] == 256 and model["num_mtp_layers"] == 2 and model["mtp_shared_weights"] is True


def test_ddp_bucket_size_reaches_dp_overlap_and_round_trips(registry):
    """--ddp-bucket-size sets dp_overlap's bucket (parameters); without it the bucket is
    Megatron-Core's default, written back as no flag. --overlap-grad-reduce alone leaves the
    parameter gathers exposed (overlap_param_gather false); with --overlap-param-gather both overlap."""
    feat = registry.features["dp_overlap"]
    par = {"tp": 1, "pp": 1, "vpp": 1, "cp": 1, "ep": 1}
    on = MegatronArgs(flags=parse_flags("--overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 20000000"
                                        .split()), parallel=par)
    assert feat.from_megatron(on) == {"bucket_size": 2e7}
    assert feat.megatron_args(feat.options_type(bucket_size=2e7))[-2:] == ["--ddp-bucket-size", "20000000"]
    grad_only = MegatronArgs(flags=parse_flags(["--overlap-grad-reduce"]), parallel=par)
    assert feat.from_megatron(grad_only) == {"overlap_param_gather": False}
    assert feat.megatron_args(feat.options_type(overlap_param_gather=False)) == ["--overlap-grad-reduce"]
    both = MegatronArgs(flags=parse_flags(["--overlap-grad-reduce", "--overlap-param-gather"]), parallel=par)
    assert feat.from_megatron(both) == {}
    assert "--ddp-bucket-size" not in feat.megatron_args(feat.options_type())
    # Megatron-Bridge / NeMo 2: DistributedDataParallelConfig.bucket_size
    flags, _, _ = flags_from_config("ddp.overlap_grad_reduce=true ddp.bucket_size=20000000")
    assert flags == {"--overlap-grad-reduce": (), "--ddp-bucket-size": ("20000000",)}


def test_the_zero_bubble_forks_flags_select_its_schedules(registry):
    """The sail-sg fork: --enable-zero-bubble with --zero-bubble-max-pending-backward pp is ZB-1P,
    2·pp (or its adaptive default, "auto") ZB-2P (its README); the Megatron line MoFa writes for
    each reads back as the same schedule."""
    base = ["--pipeline-model-parallel-size", "4", "--seq-length", "1024", "--global-batch-size", "32", "--bf16",
            "--enable-zero-bubble"]
    pick = lambda *extra: from_args(base + list(extra), registry, hardware=H100, num_gpus=8,  # noqa: E731
                                    model="llama3-8b").job["pipeline"]["schedule"]
    assert pick("--zero-bubble-max-pending-backward", "4") == "zb-h1"
    assert pick("--zero-bubble-max-pending-backward", "8") == "zb-h2"
    assert pick() == "zb-h2"
    r = from_args(base + ["--zero-bubble-max-pending-backward", "4"], registry, hardware=H100, num_gpus=8,
                  model="llama3-8b")
    assert {"--enable-zero-bubble", "--zero-bubble-max-pending-backward"} <= set(r.used)
    pred = Predictor()
    context = MegatronContext(model=registry.model("llama3-8b"), parallel={"pp": 4}, features={"pp_overlap": {}})
    for name in ("zb-h1", "zb-h2"):  # the note's flags, "pp" read as 4
        note = registry.schedule(name).megatron_args(registry.model("llama3-8b"), {"pp": 4}, context)[0]
        words = note.split(": ", 1)[1].replace("2·pp", "8").replace(" pp", " 4").split()
        job = from_args(base[:-1] + words, registry, hardware=H100, num_gpus=8, model="llama3-8b").job
        assert job["pipeline"] == {"schedule": name}, note
        # the fork's runtime flags: the local transformer's FlashAttention-2, which the fork's rule
        # asks for on an H100 (where "auto" means cuDNN); ZB-2p's post-validation needs fp16
        assert job["parallel"]["attention_kernel"] == "fa2"
        job["parallel"]["precision"] = "fp16"
        assert pred.predict(pred.job(job))[0].schedule == name


# ---------------------------------------------------------------------- sliding-window attention

#: a 12-layer shape no zoo model has (hidden 1536, 12 heads, vocabulary 32,000)
SMALL = ["--num-layers", "12", "--hidden-size", "1536", "--num-attention-heads", "12", "--vocab-size", "32000",
         "--seq-length", "8192", "--global-batch-size", "8"]


@pytest.mark.parametrize("window, skip, keys, share", [
    # (4095, 0): a query sees itself and the 4,095 keys before it; no skip frequency: every layer windowed
    (["4095", "0"], None, 4096, 1.0),
    # Megatron's tuple spelling; every 2nd layer (2, 4, …, 12) full: 6 of 12 windowed
    (["(127,0)"], "2", 128, 0.5),
    # every 6th layer full (Gemma 3's five local, one global): layers 6 and 12 of 12 full, 10 windowed
    (["1023", "0"], "6", 1024, 10 / 12),
    # a per-layer list, 1 windowed: three of twelve
    (["511", "0"], "[1,0,0,0]*3", 512, 3 / 12),
])
def test_window_flags_make_the_inline_models_window(registry, predictor, window, skip, keys, share):
    words = SMALL + ["--window-size", *window] + (["--window-attn-skip-freq", skip] if skip else [])
    r = from_args(words, registry, hardware=H100, num_gpus=8)
    m = r.job["model"]
    assert r.model_match is None
    assert m["sliding_window"] == keys and m["sliding_window_layer_fraction"] == pytest.approx(share)
    full = predictor.predict(predictor.job(from_args(SMALL, registry, hardware=H100, num_gpus=8).job))[0]
    windowed = predictor.predict(predictor.job(r.job))[0]
    assert windowed.step_time_s < full.step_time_s  # at 8K tokens a window of ≤ 4K keys is less attention


def test_a_stated_window_must_be_the_zoo_models(registry):
    """GPT-OSS 120B is windowed (128 keys) on every other layer: Megatron-Bridge's (127, 0) with skip
    frequency 2 is that model; the same shape windowed on every layer is not."""
    oss = registry.model("gpt-oss-120b")
    words = ["--num-layers", "36", "--hidden-size", "2880", "--num-attention-heads", "64", "--group-query-attention",
             "--num-query-groups", "8", "--kv-channels", "64", "--ffn-hidden-size", "2880", "--swiglu",
             "--num-experts", "128", "--moe-router-topk", "4", "--moe-ffn-hidden-size", "2880",
             "--vocab-size", str(oss.vocab_size), "--seq-length", "4096", "--global-batch-size", "64",
             "--untie-embeddings-and-output-weights", "--normalization", "RMSNorm", "--window-size", "127", "0"]
    assert from_args(words + ["--window-attn-skip-freq", "2"], registry, hardware=H100, num_gpus=64).model_match == \
        "gpt-oss-120b"
    r = from_args(words, registry, hardware=H100, num_gpus=64)
    assert r.model_match is None and r.job["model"]["sliding_window_layer_fraction"] == 1.0


def test_a_zoo_window_the_arguments_do_not_state_is_noted(registry):
    mistral = ["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32", "--group-query-attention",
               "--num-query-groups", "8", "--ffn-hidden-size", "14336", "--swiglu", "--vocab-size", "32000",
               "--seq-length", "8192", "--global-batch-size", "8", "--untie-embeddings-and-output-weights"]
    r = from_args(mistral, registry, hardware=H100, num_gpus=8)
    assert r.model_match == "mistral-7b"
    assert any("no --window-size" in n and "sliding_window = 0" in n for n in r.notes)
    assert not any("window" in n for n in from_args(mistral + ["--window-size", "4095", "0"], registry,
                                                      hardware=H100, num_gpus=8).notes)


@pytest.mark.parametrize("words, match", [
    (["--window-size", "127", "5"], "not causal"),
    (["--window-size", "abc"], "two non-negative integers"),
    (["--window-size", "127", "0", "--window-attn-skip-freq", "0"], "positive integer"),
    (["--window-size", "127", "0", "--window-attn-skip-freq", "[1,0]*5"], "10 entries for --num-layers 12"),
    (["--window-size", "127", "0", "--window-attn-skip-freq", "x"], "integer or a list"),
])
def test_bad_window_flags_name_the_flag(registry, words, match):
    with pytest.raises(ConfigError, match=match) as e:
        from_args(SMALL + words, registry, hardware=H100, num_gpus=8)
    assert "\n" not in str(e.value)


def test_bridge_dump_gradient_reduction_dtype_and_dataset_sequence(registry):
    """A dumped ConfigContainer states ``ddp.grad_reduce_in_fp32``: false is a bf16 reduction
    (Megatron-LM's --grad-reduce-in-bf16), true Megatron's fp32 default; its sequence length may
    be only ``dataset.sequence_length``."""
    base = BRIDGE_YAML.replace("  seq_length: 8192\n", "")
    for fp32, dtype in (("false", "bf16"), ("true", "fp32")):
        text = base.replace("ddp:\n", f"dataset:\n  sequence_length: 2048\nddp:\n  grad_reduce_in_fp32: {fp32}\n")
        r = read_source(text, registry, kind="nemo", hardware=H100, num_gpus=64)
        assert r.job["features"]["distributed_optimizer"]["grad_reduce_dtype"] == dtype
        assert r.job["parallel"]["sequence_length"] == 2048
    # the mixed-precision section's value is written over the DDP config's (MixedPrecisionConfig.setup)
    text = base.replace("ddp:\n", "ddp:\n  grad_reduce_in_fp32: false\n").replace(
        "mixed_precision: bf16_with_fp8_current_scaling_mixed\n",
        "mixed_precision:\n  bf16: true\n  fp8: hybrid\n  fp8_recipe: tensorwise\n  grad_reduce_in_fp32: true\n"
        "dataset:\n  sequence_length: 2048\n")
    r = read_source(text, registry, kind="nemo", hardware=H100, num_gpus=64)
    assert r.job["features"]["distributed_optimizer"]["grad_reduce_dtype"] == "fp32"


def test_bridge_dump_mixed_precision_overrides_the_models_defaults(registry):
    """A dumped ConfigContainer keeps the model config's precision defaults (``fp8_recipe: delayed``)
    beside the ``mixed_precision`` section that Megatron-Bridge writes over them at setup: the
    section decides, wherever it sits in the file."""
    mp = ("mixed_precision:\n  _target_: megatron.bridge.training.mixed_precision.MixedPrecisionConfig\n  bf16: true\n"
          "  fp8: hybrid\n  fp8_recipe: mxfp8\n")
    body = BRIDGE_YAML.replace("mixed_precision: bf16_with_fp8_current_scaling_mixed\n", "")
    model_defaults = "  fp8: null\n  fp8_recipe: delayed\n"
    for text in (mp + body.replace("  overlap_p2p_comm: false\n", "  overlap_p2p_comm: false\n" + model_defaults),
                 body.replace("  overlap_p2p_comm: false\n", "  overlap_p2p_comm: false\n" + model_defaults) + mp):
        r = read_source(text, registry, kind="nemo", hardware="b200-sxm-180gb", num_gpus=64)
        assert r.job["features"]["fp8"] == {"recipe": "mxfp8"}


#: the parts of Megatron-Bridge's dumped DeepSeek-V3 NVFP4 recipe for B300 that reach a job
#: (``scripts/performance/dryrun_configs/deepseek/deepseek_v3_pretrain_b300_nvfp4_v1.yaml``): its
#: pipeline layout and MoE layer pattern are YAML lists, its precision a mixed-precision section
DSV3_DUMP = """
_target_: megatron.bridge.training.config.ConfigContainer
dataset:
  sequence_length: 4096
ddp:
  grad_reduce_in_fp32: false
  overlap_grad_reduce: true
  overlap_param_gather: true
  use_distributed_optimizer: true
mixed_precision:
  _target_: megatron.bridge.training.mixed_precision.MixedPrecisionConfig
  bf16: true
  fp4: e2m1
  fp4_recipe: nvfp4
  fp8: null
  fp8_recipe: null
  grad_reduce_in_fp32: true
model:
  _target_: megatron.bridge.models.mla_provider.MLAModelProvider
  activation_func:
    _call_: false
    _target_: torch.nn.functional.silu
  context_parallel_size: 1
  expert_model_parallel_size: 8
  expert_tensor_parallel_size: 1
  ffn_hidden_size: 18432
  fp4: null
  fp8: null
  fp8_recipe: delayed
  gated_linear_unit: true
  hidden_size: 7168
  kv_channels: 64
  kv_lora_rank: 512
  moe_ffn_hidden_size: 2048
  moe_flex_dispatcher_backend: hybridep
  moe_layer_freq: [0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                   1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
  moe_router_topk: 8
  moe_shared_expert_intermediate_size: 2048
  moe_token_dispatcher_type: flex
  mtp_num_layers: 1
  multi_latent_attention: true
  normalization: RMSNorm
  num_attention_heads: 128
  num_layers: 61
  num_moe_experts: 256
  num_query_groups: 128
  pipeline_model_parallel_layout:
  - [embedding, decoder, decoder, decoder, decoder]
""" + "".join("  - [decoder, decoder, decoder, decoder]\n" for _ in range(14)) + """  - [decoder, mtp, loss]
  pipeline_model_parallel_size: 16
  q_lora_rank: 1536
  qk_head_dim: 128
  qk_pos_emb_head_dim: 64
  recompute_granularity: selective
  recompute_modules: [mla_up_proj]
  seq_length: 4096
  share_embeddings_and_output_weights: false
  tensor_model_parallel_size: 1
  v_head_dim: 128
  vocab_size: 129280
  window_size: null
optimizer:
  exp_avg_dtype:
    _call_: false
    _target_: torch.bfloat16
  exp_avg_sq_dtype:
    _call_: false
    _target_: torch.bfloat16
  main_grads_dtype:
    _call_: false
    _target_: torch.bfloat16
  use_distributed_optimizer: true
  use_precision_aware_optimizer: true
train:
  global_batch_size: 2048
  micro_batch_size: 1
"""


def test_a_dumped_deepseek_v3_recipe(registry, predictor):
    """The layout's 16 stages (embedding + 4 layers, fourteen of 4, one layer + MTP + loss) are the
    end stages MoFa places; NVFP4 comes from the mixed-precision section; the precision-aware
    optimizer's bf16 main gradients make the reduction bf16 although the section says fp32."""
    r = read_source(DSV3_DUMP, registry, kind="nemo", hardware="b300-sxm", num_gpus=256)
    par, feats = r.job["parallel"], r.job["features"]
    assert r.model_match == "deepseek-v3" and not r.unknown
    assert par["pipeline_layout"] == "Etttt|" + "tttt|" * 14 + "tmL"
    job = predictor.job(r.job)
    assert (job.parallel.pp, job.parallel.vpp, job.parallel.first_stage_layers, job.parallel.last_stage_layers) == (
        16, 1, 4, 1)
    assert (par["ep"], par["sequence_length"], par["global_batch_size"]) == (8, 4096, 2048)
    assert "nvfp4" in feats and "fp8" not in feats
    # the optimizer's dtypes are {_call_: false, _target_: torch.bfloat16} references in a dump
    assert feats["distributed_optimizer"] == {"grad_reduce_dtype": "bf16", "exp_avg_dtype": "bf16",
                                              "exp_avg_sq_dtype": "bf16"}
    assert feats["flex_dispatcher"]["backend"] == "hybridep"
    assert predictor.predict(job)[0].step_time_s > 0


def test_a_layout_list_with_an_unknown_layer_name_is_one_line(registry):
    text = DSV3_DUMP.replace("[decoder, mtp, loss]", "[decoder, vision, loss]")
    with pytest.raises(ConfigError, match="vision") as e:
        read_source(text, registry, kind="nemo", hardware="b300-sxm", num_gpus=256)
    assert "\n" not in str(e.value)


def test_a_dumped_per_layer_window_list(registry):
    """A dump's ``window_attn_skip_freq`` as a YAML list (1 windowed, 0 full, per layer) is one
    per-layer value, as ``moe_layer_freq``'s: 12 layers, every third full → 8 windowed."""
    text = ("model:\n  num_layers: 12\n  hidden_size: 1536\n  num_attention_heads: 12\n  vocab_size: 32000\n"
            "  seq_length: 8192\n  window_size: [1023, 0]\n  window_attn_skip_freq: [1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0]\n"
            "train:\n  global_batch_size: 8\n  micro_batch_size: 1\n")
    r = read_source(text, registry, kind="nemo", hardware=H100, num_gpus=8)
    assert r.job["model"]["sliding_window"] == 1024
    assert r.job["model"]["sliding_window_layer_fraction"] == pytest.approx(8 / 12)


# ---------------------------------------------------------------------- the line Megatron-LM parses

#: Megatron-LM's training flags at a recorded commit (tests/data/megatron_lm_flags.py writes it)
MEGATRON_LM_FLAGS = Path(__file__).resolve().parent / "data" / "megatron_lm_flags.txt"


def _option_space(feat) -> list[dict]:
    """A feature's options: every combination of each field's choices, search values and default
    (both values of a boolean)."""
    import itertools

    if not attrs.has(feat.options_type):
        return [{}]
    axes = []
    for f in attrs.fields(feat.options_type):
        values = {f.default} if not isinstance(f.default, attrs.Factory) else set()
        values |= set(f.metadata.get("choices") or ()) | set(f.metadata.get("search") or ())
        if isinstance(f.default, bool):
            values |= {True, False}
        axes.append((f.name, sorted(values, key=repr)))
    return [dict(zip([a for a, _ in axes], combo)) for combo in itertools.product(*[v for _, v in axes])]


def _printed_flags(registry) -> dict[str, set[str]]:
    """flag → who prints it, over every feature's option space and every schedule (pp 1 / 4, with
    and without its companions), end stages set and a micro-batch group pp does not divide."""
    from mofa_framework.tuner import schedule_arguments

    out: dict[str, set[str]] = {}

    def add(tokens, who):
        for tok in tokens:
            if not tok.startswith("#"):
                for word in tok.split():
                    if word.startswith("--"):
                        out.setdefault(word, set()).add(who)

    models = [registry.model("llama3-70b"), registry.model("deepseek-v3")]
    for feat in registry.features.values():
        for opts in _option_space(feat):
            try:
                options = feat.options_type(**opts) if attrs.has(feat.options_type) else None
            except (ValueError, TypeError):
                continue  # a combination the options refuse
            for model in models:
                for pp in (1, 4):
                    par = {"tp": 8, "pp": pp, "vpp": 1, "cp": 2, "ep": 8, "etp": 1, "dp": 16, "micro_batch_size": 1,
                           "global_batch_size": 1024, "sequence_length": 4096, "precision": "bf16"}
                    for companions in ({}, {"recompute": {}}):
                        ctx = MegatronContext(model=model, parallel=par, features={feat.name: opts, **companions})
                        add(feat.megatron_tokens(options, ctx), feat.name)
    for sched in registry.schedules.values():
        for model in models:
            par = {"tp": 8, "pp": 4, "vpp": 2 if sched.supports_vpp else 1, "cp": 1, "ep": 8, "etp": 1, "dp": 1,
                   "micro_batch_size": 1, "global_batch_size": 10, "sequence_length": 4096, "precision": "bf16",
                   "first_stage_layers": 2 * (2 if sched.supports_vpp else 1), "last_stage_layers": 0}
            for feats in ({}, {"pp_overlap": {}}):
                ctx = MegatronContext(model=model, parallel=par, features=feats, schedule=sched.name)
                toks = schedule_arguments(sched, model, par, ctx)
                add([t for t in toks if t.split()[0] not in sched.megatron_unsupported], f"schedule {sched.name}")
    return out


def test_every_flag_the_megatron_line_prints_is_one_megatron_lm_parses(registry, predictor):
    """`mofa tune`'s Megatron line is meant to be pasted into a launch script: every flag a feature,
    a schedule or the core prints (notes aside: a fork's or DeepSpeed's flags go in notes) must be
    one Megatron-LM's argument parser accepts, else the run stops at argument parsing
    ("unrecognized arguments"). The list is Megatron-LM's parser at a recorded commit
    (tests/data/megatron_lm_flags.txt). It caught ``--cpu-offloading`` (no such flag: N > 0 of
    ``--cpu-offloading-num-layers`` turns it on) and ``--overlap-p2p-communication`` (a flag only from
    2023-05 to 2023-10; the overlap is the interleaved schedule's default since)."""
    from mofa_framework.tuner import SearchSpace, TuneRequest, megatron_arguments, tune

    known = {ln.strip() for ln in MEGATRON_LM_FLAGS.read_text().splitlines() if ln.startswith("--")}
    assert len(known) > 800 and "--tensor-model-parallel-size" in known
    printed = _printed_flags(registry)
    for model_name, hw, gpus, extra in (("llama3-70b", H100, 64, {}), ("deepseek-v3", "b200-sxm-180gb", 256, {"ep": (8,)})):
        model, hardware = registry.model(model_name), registry.hardware_profile(hw)
        space = SearchSpace(tp=(4,), pp=(4,), vpp=(1, 2), cp=(1, 2), ep=extra.get("ep", (1,)), etp=(1,),
                            micro_batch_size=(1,), schedules=("1f1b", "interleaved-1f1b"),
                            features={"distributed_optimizer": ({},), "dp_overlap": ({},), "recompute": ({},)})
        res = tune(predictor, TuneRequest(model=model, hardware=hardware, num_gpus=gpus, global_batch_size=256,
                                          sequence_length=8192, space=space, top_k=4, precision="fp8"))
        for cand in res.best:
            args, _ = megatron_arguments(model, cand, registry)
            for line in args:
                printed.setdefault(line.split()[0], set()).add("core")
    assert len(printed) >= 40
    unknown = {flag: sorted(who) for flag, who in printed.items() if flag not in known}
    assert not unknown, f"flags Megatron-LM does not parse: {unknown}"
