"""llm-foundry training YAMLs in (``mofa import llm-foundry``): the model sections, the batch, the
FSDP settings, interpolation, what is refused, the command — and that an imported config of a
published llm-foundry benchmark row predicts exactly what the validated row does.

The YAML below follows llm-foundry's ``scripts/train/yamls/pretrain/mpt-7b.yaml`` (its keys and
values; data loaders, optimizer and logging, which change no cost, left out)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mofa_framework.api import Predictor
from mofa_framework.errors import ConfigError
from mofa_framework.measurements import builtin_files, map_files

from mofa_plugins.import_llm_foundry import from_llm_foundry, parse_source

H100 = "h100-sxm5-80gb"

MPT_7B = """
data_local: ./my-copy-c4
max_seq_len: 2048
global_seed: 17
model:
  name: mpt_causal_lm
  init_device: meta
  d_model: 4096
  n_heads: 32
  n_layers: 32
  expansion_ratio: 4
  max_seq_len: ${max_seq_len}
  vocab_size: 50368
  attn_config:
    attn_impl: triton
tokenizer:
  name: EleutherAI/gpt-neox-20b
  kwargs:
    model_max_length: ${max_seq_len}
global_train_batch_size: 1024
seed: ${global_seed}
device_train_microbatch_size: 8
precision: amp_bf16
fsdp_config:
  sharding_strategy: FULL_SHARD
  mixed_precision: PURE
  activation_checkpointing: true
  activation_cpu_offload: false
  limit_all_gathers: true
"""


@pytest.fixture(scope="module")
def predictor():
    return Predictor()


def test_an_mpt_config(predictor):
    r = from_llm_foundry(MPT_7B, predictor.registry, hardware=H100, num_gpus=8, name="mpt-7b")
    m, par, feats = r.job["model"], r.job["parallel"], r.job["features"]
    assert r.model_match is None
    # MPT-7B: 32 layers of 4,096, 32 heads, a GELU MLP of 4 × 4,096, learned positions, tied embeddings
    assert (m["num_layers"], m["hidden_size"], m["num_attention_heads"], m["ffn_hidden_size"], m["vocab_size"]) == (
        32, 4096, 32, 16384, 50368)
    assert (m["activation"], m["normalization"], m["position_embedding"], m["tied_embeddings"]) == (
        "gelu", "layernorm", "learned", True)
    assert (par["micro_batch_size"], par["global_batch_size"], par["sequence_length"]) == (8, 1024, 2048)
    assert par["attention_kernel"] == "triton" and par["precision"] == "bf16"
    # PURE: bf16 reduce-scatter; activation checkpointing: full recompute; no compile_config: eager
    assert feats == {"fsdp": {"grad_reduce_dtype": "bf16"}, "recompute": {"granularity": "full"},
                     "eager_kernels": {}, "dp_overlap": {}}
    assert predictor.predict(predictor.job(r.job))[0].step_time_s > 0


def test_an_imported_benchmark_row_predicts_what_the_validated_row_does(predictor):
    """LF-001 of ``llm_foundry.csv``: MPT-70B on 512 H100s, micro-batch 8, batch 4,096, 2,048 tokens,
    amp_bf16, FULL_SHARD with fsdp_mixed_precision DEFAULT and activation checkpointing, the
    benchmark launcher's Triton attention. The same run written as a YAML predicts the same step."""
    mapped, _, _ = map_files(builtin_files("all"), predictor.registry)
    row = next(m for m in mapped if m.row_id == "LF-001")
    text = (MPT_7B.replace("d_model: 4096", "d_model: 8192").replace("n_heads: 32", "n_heads: 64")
            .replace("n_layers: 32", "n_layers: 80").replace("global_train_batch_size: 1024",
                                                             "global_train_batch_size: 4096")
            .replace("mixed_precision: PURE", "mixed_precision: DEFAULT"))
    r = from_llm_foundry(text, predictor.registry, hardware=H100, num_gpus=512)
    ours = predictor.predict(predictor.job(r.job))[0]
    theirs = predictor.predict(predictor.job(row.job))[0]
    assert ours.step_time_s == pytest.approx(theirs.step_time_s, rel=1e-12)
    assert ours.peak_memory_gib == pytest.approx(theirs.peak_memory_gib, rel=1e-12)


def test_a_hugging_face_model_and_variables(predictor):
    text = """
variables:
  max_seq_len: 4096
  model_name: meta-llama/Meta-Llama-3.1-8B
max_seq_len: ${variables.max_seq_len}
model:
  name: hf_causal_lm
  pretrained_model_name_or_path: ${variables.model_name}
  use_flash_attention_2: true
global_train_batch_size: 64
device_train_microbatch_size: 2
precision: amp_fp8
loss_fn: torch_crossentropy
compile_config: {}
fsdp_config:
  sharding_strategy: SHARD_GRAD_OP
"""
    r = from_llm_foundry(text, predictor.registry, hardware=H100, num_gpus=16)
    assert r.model_match == "llama3.1-8b" and r.job["model"] == {"name": "llama3.1-8b"}
    assert r.job["parallel"]["sequence_length"] == 4096  # an interpolated number stays a number
    assert r.job["parallel"]["attention_kernel"] == "fa2"
    # SHARD_GRAD_OP keeps each unit gathered to its backward; DEFAULT reduces in fp32; compiled: no eager
    assert r.job["features"] == {"fsdp": {"reshard_after_forward": False}, "fp8": {}, "fp32_cross_entropy": {},
                                 "dp_overlap": {}}
    predictor.predict(predictor.job(r.job))


def test_an_mpt_shape_of_the_zoo_is_named_and_variants_read(predictor):
    """A gated, grouped-query, RoPE MPT whose shape is the zoo's Llama 3 8B (vocabulary included)
    is that model; NO_SHARD is plain DDP."""
    text = """
max_seq_len: 8192
model:
  name: mpt_causal_lm
  d_model: 4096
  n_heads: 32
  n_layers: 32
  vocab_size: 128256
  ffn_config: {ffn_type: mptglu, ffn_hidden_size: 14336}
  attn_config: {attn_impl: flash, attn_type: grouped_query_attention, kv_n_heads: 8, rope: true}
  norm_type: rmsnorm
  tie_word_embeddings: false
global_train_batch_size: 32
device_train_microbatch_size: 1
fsdp_config: {sharding_strategy: NO_SHARD}
"""
    r = from_llm_foundry(text, predictor.registry, hardware=H100, num_gpus=32)
    assert r.model_match in ("llama3-8b", "llama3.1-8b")
    assert "fsdp" not in r.job["features"] and "dp_overlap" in r.job["features"]


@pytest.mark.parametrize("change, match", [
    ("device_train_microbatch_size: 8", "auto: Composer picks"),
    ("global_train_batch_size: 1024", "make it a multiple of 64"),
    ("precision: amp_bf16", "fp32 training is not modelled"),
    ("name: mpt_causal_lm", "reads mpt_causal_lm and hf_causal_lm"),
    ("attn_impl: triton", "attn_impl 'xformers'"),
    ("max_seq_len: 2048", "refers to max_seq_len"),
    ("sharding_strategy: FULL_SHARD", "sharding_strategy 'ZERO9'"),
])
def test_what_cannot_be_priced_is_one_line(predictor, change, match):
    bad = {"device_train_microbatch_size: 8": "device_train_microbatch_size: auto",
           "global_train_batch_size: 1024": "global_train_batch_size: 1000",
           "precision: amp_bf16": "precision: fp32",
           "name: mpt_causal_lm": "name: bert_masked_lm",
           "attn_impl: triton": "attn_impl: xformers",
           "max_seq_len: 2048": "max_seq: 2048",
           "sharding_strategy: FULL_SHARD": "sharding_strategy: ZERO9"}[change]
    with pytest.raises(ConfigError, match=match) as e:
        from_llm_foundry(MPT_7B.replace(change, bad), predictor.registry, hardware=H100, num_gpus=8)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="tp_config"):
        from_llm_foundry(MPT_7B + "tp_config: {strategy: ffn, tensor_parallel_degree: 2}\n", predictor.registry,
                         hardware=H100, num_gpus=8)
    with pytest.raises(ConfigError, match="llm-foundry tp_config 2: expected a table of settings"):
        from_llm_foundry(MPT_7B + "tp_config: 2\n", predictor.registry, hardware=H100, num_gpus=8)
    with pytest.raises(ConfigError, match="not YAML"):
        parse_source("model: [unclosed")


@pytest.mark.parametrize("change, match", [
    ("expansion_ratio: 4", "model.expansion_ratio 'abc': expected a positive number"),
    ("vocab_size: 50368", "model.vocab_size 'big': expected a positive integer"),
    ("attn_config:\n    attn_impl: triton", "model.attn_config 3: expected a table"),
    ("fsdp_config:\n  sharding_strategy: FULL_SHARD", "llm-foundry fsdp_config \\[1, 2\\]: expected a table"),
])
def test_a_malformed_value_is_one_line_naming_the_key(predictor, change, match):
    bad = {"expansion_ratio: 4": "expansion_ratio: abc", "vocab_size: 50368": "vocab_size: big",
           "attn_config:\n    attn_impl: triton": "attn_config: 3",
           "fsdp_config:\n  sharding_strategy: FULL_SHARD": "fsdp_config: [1, 2]\nunused:\n  sharding_strategy: x"}[change]
    assert change in MPT_7B
    with pytest.raises(ConfigError, match=match) as e:
        from_llm_foundry(MPT_7B.replace(change, bad), predictor.registry, hardware=H100, num_gpus=8)
    assert "\n" not in str(e.value)


def test_the_command_writes_a_job_that_predicts(mofa_cli, tmp_path):
    cli = mofa_cli
    src = tmp_path / "mpt-7b.yaml"
    src.write_text(MPT_7B.replace("device_train_microbatch_size: 8", "device_train_microbatch_size: auto"))
    runner = CliRunner()
    out = tmp_path / "job.toml"
    r = runner.invoke(cli, ["import", "llm-foundry", str(src), "--hardware", H100, "--gpus", "8",
                            "--micro-batch-size", "4", "-o", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert text.startswith("# imported by `mofa import llm-foundry` from mpt-7b.yaml") and 'name = "mpt-7b"' in text
    r = runner.invoke(cli, ["predict", str(out), "--format", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["parallel"]["micro_batch_size"] == 4 and json.loads(r.stdout)["step_time_s"] > 0
    r = runner.invoke(cli, ["import", "llm-foundry", str(src), "--hardware", H100, "--gpus", "8"])
    assert r.exit_code == 2 and "--micro-batch-size" in r.output and "Traceback" not in r.output
