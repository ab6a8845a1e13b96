"""Fine-tuning: LoRA (the ``lora`` feature: base frozen, rank-r adapters) and packed sequences
(``[parallel] document_length``: fused attention per document), with NVIDIA's SFT and LoRA rows."""

from __future__ import annotations

import json

import attrs
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mofa_framework.api import Predictor
from mofa_framework.cli import _builtin_commands, cli
from mofa_framework.config import jobs_to_batch
from mofa_framework.decompose import (
    GEMM,
    Geometry,
    Op,
    forward_flops_split,
    layer_operators,
    model_flops_per_sequence,
    total_params,
    training_flops_per_sequence,
)
from mofa_framework.measurements import builtin_data_dir
from mofa_plugins.lora import adapter_fraction, adapter_operators, module_of
from mofa_plugins.reader_nvidia import NVIDIA_FINETUNE_DOCUMENT_LENGTH, NVIDIA_LORA, fine_tuning

_builtin_commands()
P = Predictor()
REG = P.registry


def _job(model="llama3-70b", hw="h100-sxm5-80gb", gpus=8, tp=2, pp=4, vpp=1, mbs=1, gbs=32, seq=4096, doc=0,
         features=None, precision="bf16"):
    return P.job({"model": {"name": model}, "hardware": {"name": hw, "num_gpus": gpus},
                  "parallel": {"tp": tp, "pp": pp, "vpp": vpp, "micro_batch_size": mbs, "global_batch_size": gbs,
                               "sequence_length": seq, "precision": precision, "document_length": doc},
                  "features": features or {}})


def _predict(job):
    batch = jobs_to_batch([job], REG)
    return P.evaluate(batch, job.model, job.hardware)


# ------------------------------------------------------------------ the adapters, by hand

def test_adapter_gemms_by_hand():
    # Llama 3 70B's QKV projection at TP 1, one 4,096-token micro-batch: 4,096 × 10,240 × 8,192
    op = Op(name="qkv_proj", kind=GEMM, flops=2.0 * 4096 * 10240 * 8192, bytes=0.0, m=4096.0, n=10240.0, k=8192.0,
            group="qkv")
    a, b = adapter_operators(op, 32)
    # A: 4,096 × 32 × 8,192 → 2·m·n·k = 2,147,483,648; B: 4,096 × 10,240 × 32 → 2,684,354,560
    assert float(a.flops) == 2_147_483_648.0 and (float(a.n), float(a.k)) == (32.0, 8192.0)
    assert float(b.flops) == 2_684_354_560.0 and (float(b.n), float(b.k)) == (10240.0, 32.0)
    assert a.bwd_input == b.bwd_input == a.bwd_weight == b.bwd_weight == 1.0 and a.group == "lora"


def test_grouped_expert_adapters_count_every_member():
    op = Op(name="expert_fc1", kind=GEMM, flops=0.0, bytes=0.0, m=512.0, n=4096.0, k=7168.0, group="expert", count=8.0)
    a, _ = adapter_operators(op, 16)
    assert float(a.flops) == 2.0 * 512 * 16 * 7168 * 8 and a.count == 8.0


def test_which_operators_are_adaptable():
    model = REG.model("deepseek-v3")
    ops = {o.name: module_of(o) for o in layer_operators(model, Geometry.unit(np.array([4096.0])), "moe")}
    assert ops["q_down_proj"] == ops["kv_up_proj"] == "qkv" and ops["o_proj"] == "proj"
    assert ops["expert_fc1"] == ops["shared_expert_fc1"] == "fc1" and ops["expert_fc2"] == "fc2"
    assert ops["router"] is None and ops["core_attention"] is None


def test_adapter_fraction_by_hand():
    # Llama 3 70B, QKV only, rank 32: each of 80 layers adapts 8,192 → 10,240 (64 + 2·8 heads of 128):
    # 32·(8,192 + 10,240) = 589,824 per layer, 47,185,920 in all
    model = REG.model("llama3-70b")
    rows = jobs_to_batch([_job(features={"lora": {"rank": 32, "targets": "qkv"}})], REG).feature("lora")
    f = adapter_fraction(model, rows)
    assert f[0] * total_params(model)["total"] == pytest.approx(47_185_920.0, rel=1e-12)
    # all four modules: + o_proj 8,192 + 8,192, fc1 8,192 + 57,344, fc2 28,672 + 8,192 → 32·(18,432 + 16,384
    # + 65,536 + 36,864) = 4,390,912 per layer
    rows = jobs_to_batch([_job(features={"lora": {"rank": 32}})], REG).feature("lora")
    assert adapter_fraction(model, rows)[0] * total_params(model)["total"] == pytest.approx(80 * 4_390_912.0, rel=1e-12)


# ------------------------------------------------------------------ what LoRA changes in a step

def test_lora_removes_the_weight_gradients_and_adds_the_adapters():
    base = _predict(_job())
    lora = _predict(_job(features={"lora": {"rank": 16, "targets": "qkv"}}))
    bd0, bd1 = base.breakdown, lora.breakdown
    # the adapters' weight gradients only (two tiny GEMMs per layer, at the profile's per-kernel floor),
    # the same time as the adapters add to the forward
    w = bd1["compute_bwd_weight"][0]
    assert 0.0 < w < 0.1 * bd0["compute_bwd_weight"][0]
    assert bd1["compute_fwd"][0] - bd0["compute_fwd"][0] == pytest.approx(w, rel=1e-9)
    assert bd1["compute_bwd_input"][0] - bd0["compute_bwd_input"][0] == pytest.approx(w, rel=1e-9)
    # gradients and optimizer state: the adapters' share of the model's parameters
    m0, m1 = base.memory_breakdown, lora.memory_breakdown
    assert m1["gradients"][0] < 1e-3 * m0["gradients"][0]
    assert m1["optimizer_states"][0] < 1e-3 * m0["optimizer_states"][0]
    assert lora.step_time_s[0] < 0.8 * base.step_time_s[0]


def test_lora_model_flops_skip_the_weight_gradients():
    # model FLOPs: 2·F_weights + 3·F_weightless per sequence (NeMo's count for its LoRA rows)
    model = REG.model("llama3-70b")
    w, wl = forward_flops_split(model, np.array([4096.0]))
    assert float(training_flops_per_sequence(model, [4096.0], True)[0]) == pytest.approx(float(2 * w[0] + 3 * wl[0]))
    assert float(training_flops_per_sequence(model, [4096.0])[0]) == pytest.approx(3.0 * float(
        model_flops_per_sequence(model, [4096.0])[0]))
    pred = _predict(_job(features={"lora": {}}))
    assert pred.model_tflops_per_gpu[0] * 1e12 * pred.step_time_s[0] * 8 == pytest.approx(
        32 * float(2 * w[0] + 3 * wl[0]), rel=1e-9)


def test_lora_conflicts_with_deepspeed_zero():
    res = CliRunner().invoke(cli, ["predict", "--model", "llama3-8b", "--hardware", "h100-sxm5-80gb", "--gpus", "8",
                                   "--gbs", "32", "--seq", "4096", "--feature", "lora", "--feature", "deepspeed_zero"])
    assert res.exit_code == 2 and "lora" in res.output and "deepspeed_zero" in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


def test_lora_under_fsdp_gathers_the_frozen_weights_but_reduces_no_gradient():
    """FSDP2 / Megatron-FSDP with LoRA (HF PEFT, NeMo AutoModel): every layer still all-gathers its
    sharded frozen weights, forward and backward, but reduce-scatters no gradient of theirs and keeps
    no unsharded gradient; the per-step remainder (embedding, head) is gathered, not reduced."""
    kw = dict(model="llama3-8b", gpus=8, tp=1, pp=1, gbs=32, seq=4096)
    full = _predict(_job(**kw, features={"fsdp": {}}))
    lora = _predict(_job(**kw, features={"fsdp": {}, "lora": {"targets": "qkv"}}))
    s_full, s_lora = full.state.layers["dense"], lora.state.layers["dense"]
    # forward: the same gathers; backward: the gather again (resharded), no reduce-scatter
    assert s_lora.dp_fwd_s[0] == pytest.approx(s_full.dp_fwd_s[0])
    assert s_lora.dp_bwd_s[0] == pytest.approx(s_full.dp_fwd_s[0])
    assert s_full.dp_bwd_s[0] > 1.5 * s_full.dp_fwd_s[0]  # all-gather + fp32 reduce-scatter
    assert lora.memory_breakdown["gradients"][0] < 0.01 * full.memory_breakdown["gradients"][0]
    assert lora.peak_memory_bytes[0] < full.peak_memory_bytes[0]
    assert lora.step_time_s[0] < full.step_time_s[0]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]), mbs=st.sampled_from([1, 2]),
       rank=st.sampled_from([8, 32, 128]), targets=st.sampled_from(["all", "qkv", "attention", "mlp"]),
       doc=st.sampled_from([0, 128, 1024]), model=st.sampled_from(["llama3-8b", "qwen3-30b-a3b", "gemma-2-9b"]))
def test_lora_never_costs_more_memory_and_keeps_the_invariants(tp, pp, mbs, rank, targets, doc, model):
    """Property: a LoRA step needs no more memory than full training of the same layout, and every
    output invariant holds (the engine checks them: MFU within its ceiling for frozen weights and
    packed documents). On a dense model its weight-gradient time is below full training's; not
    always on an MoE one, whose per-expert adapters are as many small GEMMs as it has local experts."""
    gbs = 64 * mbs
    kw = dict(model=model, gpus=8 * pp, tp=tp, pp=pp, mbs=mbs, gbs=gbs, seq=4096, doc=doc)
    full, lora = _predict(_job(**kw)), _predict(_job(**kw, features={"lora": {"rank": rank, "targets": targets}}))
    assert lora.peak_memory_bytes[0] <= full.peak_memory_bytes[0]
    if not REG.model(model).is_moe:
        assert lora.breakdown["compute_bwd_weight"][0] < full.breakdown["compute_bwd_weight"][0]
    assert 0.0 < lora.mfu[0] <= 1.0 and np.isfinite(lora.step_time_s[0])


# ------------------------------------------------------------------ packed documents

def test_packed_attention_keys_by_hand():
    # s = 4,096 packed from 1,024-token documents: a fused causal kernel attends 512 keys per query on
    # average (half the document), not 2,048 (half the sequence)
    model = REG.model("llama3-8b")
    g = Geometry.unit(np.array([4096.0]), flash=True)
    op = lambda g: next(o for o in layer_operators(model, g, "dense") if o.name == "core_attention")  # noqa: E731
    assert float(op(g).n[0]) == 2048.0
    assert float(op(attrs.evolve(g, doc=np.array([1024.0]))).n[0]) == 512.0
    # a document longer than the sequence is cut to it
    assert float(op(attrs.evolve(g, doc=np.array([10_000.0]))).n[0]) == 2048.0


def test_packed_model_flops_count_each_documents_square():
    # Llama 3 8B, s = 8,192 of 2,048-token documents: attention forward 4·s·d·a·d_h per layer
    # (a full d × d square per document, s/d documents) instead of 4·s²·a·d_h
    model = REG.model("llama3-8b")
    s, d = 8192.0, 2048.0
    full = float(model_flops_per_sequence(model, [s])[0])
    packed = float(model_flops_per_sequence(model, [s], [d])[0])
    per_layer = 4.0 * 32 * 128  # 4 · heads · head dim
    assert full - packed == pytest.approx(32 * per_layer * s * (s - d), rel=1e-12)


def test_packing_shortens_attention_only():
    model_kw = dict(model="llama3-8b", gpus=8, tp=1, pp=1, gbs=32, seq=8192)
    full, packed = _predict(_job(**model_kw)), _predict(_job(**model_kw, doc=512))
    assert packed.step_time_s[0] < full.step_time_s[0]
    assert packed.breakdown["compute_bwd_weight"][0] == pytest.approx(full.breakdown["compute_bwd_weight"][0])
    assert packed.peak_memory_bytes[0] == pytest.approx(full.peak_memory_bytes[0])


def test_document_length_flag_and_bad_value():
    base = ["predict", "--model", "llama3-8b", "--hardware", "h100-sxm5-80gb", "--gpus", "8", "--gbs", "32",
            "--seq", "8192", "--format", "json"]
    r0, r1 = (CliRunner().invoke(cli, base + extra) for extra in ([], ["--document-length", "512"]))
    assert r0.exit_code == r1.exit_code == 0
    step = lambda r: json.loads(r.output)[0]["step_time_s"] if isinstance(json.loads(r.output), list) \
        else json.loads(r.output)["step_time_s"]  # noqa: E731
    assert step(r1) < step(r0)
    bad = CliRunner().invoke(cli, base[:-2] + ["--document-length", "-5"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output and "document-length" in bad.output


def test_tune_holds_the_document_length_and_lora(tmp_path):
    job = tmp_path / "ft.toml"
    job.write_text('[model]\nname = "llama3-8b"\n[hardware]\nname = "h100-sxm5-80gb"\nnum_gpus = 8\n'
                   '[parallel]\nglobal_batch_size = 32\nsequence_length = 4096\ndocument_length = 256\n'
                   '[features.lora]\ntargets = "qkv"\n')
    res = CliRunner().invoke(cli, ["tune", str(job), "--tp-values", "1,2", "--pp-values", "1", "--top", "3",
                                   "--format", "json", "--no-progress"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)["best"]
    assert rows and all(r["features"].get("lora") == {"rank": 32, "targets": "qkv"} for r in rows)
    # the packed documents reach the search: the same job unpacked is slower
    job.write_text(job.read_text().replace("document_length = 256", "document_length = 0"))
    unpacked = CliRunner().invoke(cli, ["tune", str(job), "--tp-values", "1,2", "--pp-values", "1", "--top", "3",
                                        "--format", "json", "--no-progress"])
    assert json.loads(unpacked.output)["best"][0]["step_time_s"] > rows[0]["step_time_s"]


# ------------------------------------------------------------------ NVIDIA's fine-tuning rows

def test_task_names():
    assert fine_tuning("") == fine_tuning("Pretrain") == fine_tuning("pre-train") == "pretrain"
    assert fine_tuning("SFT") == fine_tuning("Fine-tuning") == fine_tuning("full fine-tune") == "sft"
    assert fine_tuning("LoRA") == fine_tuning("PEFT (LoRA)") == fine_tuning("lora") == "lora"
    assert fine_tuning("DPO") is None and fine_tuning("RLHF") is None


FINETUNE_IDS = ({f"NEMO2407-{rev}-0{i}" for rev in ("164b009", "ccef6aa", "9c5c5e9") for i in range(13, 19)}
                | {f"MB-ARC-0{i}" for i in range(46, 56)})


def test_nvidia_fine_tuning_rows_are_predicted():
    """Golden values from ../shared/data: NeMo 24.07's SFT and LoRA rows (Llama 2 7B/13B/70B on H100)
    and Megatron-Bridge's (Llama 3 70B on GB300, GB200, H100) are all read, LoRA with the lora
    feature at NVIDIA's recipe, every one on packed SQuAD documents; on H100 within 20 %."""
    from mofa_framework.measurements import map_files
    from mofa_framework.validate import validate

    files = [builtin_data_dir() / f for f in ("nemo_2407.csv", "nvidia_megatron_bridge.csv")]
    mapped, skipped, _ = map_files(files, REG)
    assert not [s for s in skipped if "fine-tuning" in s.reason or "SFT" in s.reason]
    rows = [m for m in mapped if m.row_id in FINETUNE_IDS]
    assert len(rows) == 25
    lora = [m for m in rows if "lora" in m.job["features"]]
    assert len(lora) == 12 and all(m.job["features"]["lora"] == NVIDIA_LORA for m in lora)
    assert all(m.job["parallel"]["document_length"] == NVIDIA_FINETUNE_DOCUMENT_LENGTH for m in rows)
    h100 = {m.row_id for m in rows if m.job["hardware"]["name"] == "h100-sxm5-80gb"}
    assert len(h100) == 17
    results = [r for r in validate(files).rows if r.row_id in h100]
    assert len(results) == 17
    assert max(abs(r.predicted_s / r.measured_s - 1.0) for r in results) < 0.20


# ------------------------------------------------------------------ mofa import nemo: the PEFT section

BRIDGE_LORA_YAML = """
model:
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 4
  seq_length: 4096
train:
  global_batch_size: 32
  micro_batch_size: 1
peft:
  _target_: megatron.bridge.peft.lora.LoRA
  dim: 16
  alpha: 32
  target_modules: [linear_qkv, linear_proj]
dataset:
  packed_sequence_specs:
    packed_sequence_size: 4096
mixed_precision: bf16_mixed
"""


def test_import_reads_a_bridge_peft_section():
    from mofa_framework.megatron import read_source

    r = read_source(BRIDGE_LORA_YAML, REG, kind="nemo", hardware="h100-sxm5-80gb", num_gpus=8, model="llama3-70b")
    assert r.job["features"]["lora"] == {"rank": 16, "targets": "attention"}
    assert "--lora-alpha" in r.ignored and not r.unknown
    assert any("document_length" in n for n in r.notes)  # packing noted: the documents' length is the data's
    P.job(r.job)  # it loads


def test_import_reads_nemo1_lora_overrides():
    from mofa_framework.megatron import read_source

    text = ("model.peft.peft_scheme=lora model.peft.lora_tuning.adapter_dim=8 "
            "model.peft.lora_tuning.target_modules=[attention_qkv] model.global_batch_size=32 "
            "model.micro_batch_size=1 model.encoder_seq_length=4096 trainer.precision=bf16")
    r = read_source(text, REG, kind="nemo", hardware="h100-sxm5-80gb", num_gpus=8, model="llama2-7b")
    assert r.job["features"]["lora"] == {"rank": 8, "targets": "qkv"}
    # a config without PEFT has no lora
    plain = read_source("model.global_batch_size=32 model.encoder_seq_length=4096 trainer.precision=bf16", REG,
                        kind="nemo", hardware="h100-sxm5-80gb", num_gpus=8, model="llama2-7b")
    assert "lora" not in plain.job.get("features", {})


def test_target_module_names():
    from mofa_plugins.lora import targets_of

    assert targets_of(["linear_qkv"]) == "qkv" and targets_of(["attention_qkv", "attention_dense"]) == "attention"
    assert targets_of(["linear_fc1", "linear_fc2"]) == "mlp" and targets_of(["all"]) == targets_of([]) == "all"
    assert targets_of(["linear_fc1"]) == "mlp"  # the smallest choice covering it
    assert targets_of(["linear_qkv", "linear_fc2"]) == "all"


def test_lora_checkpoints_hold_the_adapters_and_start_up_loads_the_base():
    """e2e: a LoRA checkpoint is its adapters (47,185,920 parameters × 14 bytes = 660,602,880 for
    Llama 3 70B, rank 32 on QKV); start-up still reads the frozen base in bf16."""
    from mofa_framework.e2e import FROZEN_BYTES_PER_PARAM, STARTUP_PER_NODE_S, STARTUP_S, e2e_inputs
    from mofa_framework.units import gbps_to_bytes_per_s

    job = attrs.evolve(_job(gpus=64, tp=4, pp=2, gbs=64, features={"lora": {"targets": "qkv"}}),
                       training=attrs.evolve(_job().training, tokens=1e9))
    inputs = e2e_inputs(job, REG)
    assert inputs.checkpoint_bytes == pytest.approx(660_602_880.0, rel=1e-12)
    params = total_params(job.model)["total"]
    base = (params - 47_185_920.0) * FROZEN_BYTES_PER_PARAM
    read = gbps_to_bytes_per_s(job.hardware.host.disk_read_gbps) * 8
    assert inputs.init_s == pytest.approx(STARTUP_S + 8 * STARTUP_PER_NODE_S + (660_602_880.0 + base) / read)
    full = e2e_inputs(attrs.evolve(job, features={}), REG)
    assert full.checkpoint_bytes == pytest.approx(params * 14.0) and full.init_s > inputs.init_s


def test_the_documented_fine_tuning_table_is_current():
    """docs/features/fine-tuning.md's per-row table is what benchmarks/fine_tuning_report.py prints
    with the shipped profiles (regenerate with --write after a refit)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import fine_tuning_report

    assert fine_tuning_report.main(["--check"]) == 0


def test_plain_schema_reads_document_length_and_lora(tmp_path):
    """Your own fine-tuning runs: the plain schema's document_length column and a lora feature."""
    from mofa_framework.validate import validate

    f = tmp_path / "ft.csv"
    f.write_text("model,hardware,num_gpus,tp,pp,vpp,global_batch_size,sequence_length,document_length,features,"
                 "tokens_per_s_per_gpu\n"
                 'llama3-70b,h100-sxm5-80gb,8,2,4,20,32,4096,210,"fp8; lora:rank=32,targets=qkv; '
                 'distributed_optimizer; dp_overlap; tp_overlap; pp_overlap",2643\n'
                 "llama3-70b,h100-sxm5-80gb,8,2,4,20,32,4096,-3,fp8,2643\n")
    res = validate([f])
    assert len(res.rows) == 1 and abs(res.rows[0].predicted_s / res.rows[0].measured_s - 1) < 0.1
    assert len(res.skipped) == 1 and "document_length" in res.skipped[0].reason
