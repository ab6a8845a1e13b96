"""Measurement files as users write them: the plain schema with no plugin, a third party's reader,
and every bad input of issue 14 (one clear line naming the field, the value and the fix, exit 2,
or a listed row with a warning), plus a fuzz test of mutated rows through every reader."""

from __future__ import annotations

import csv
import io
import json
import random

import pytest
from click.testing import CliRunner

from mofa_framework.errors import MofaError
from mofa_framework.measurements import builtin_data_dir, map_rows

DATA = builtin_data_dir()
PLAIN_HEADER = "model,hardware,num_gpus,tp,pp,micro_batch_size,global_batch_size,sequence_length,precision,features,step_time_s"
PLAIN_ROW = "llama3-8b,h100-sxm5-80gb,8,1,1,1,128,8192,bf16,distributed_optimizer; dp_overlap,{t}"
READER_PLUGINS = ["reader_dense", "reader_nvidia", "reader_vtrain"]


@pytest.fixture(scope="module")
def cli():
    import mofa_framework.cli as c

    c._builtin_commands()
    return c.cli


def run(cli, *args):
    """(exit status, stdout — or everything printed, for an error —, stderr)."""
    res = CliRunner().invoke(cli, [str(a) for a in args])
    return res.exit_code, res.stdout if res.exit_code == 0 else res.output, res.stderr


def one_line(out: str) -> bool:
    return out.strip().count("\n") == 0 and "Traceback" not in out


def write(tmp_path, name: str, text: str, encoding: str = "utf-8"):
    path = tmp_path / name
    path.write_bytes(text.encode(encoding))
    return path


# ---------------------------------------------------------------------- the plain schema


def test_plain_schema_needs_no_plugin(cli, tmp_path):
    """A user's CSV in the documented plain schema validates with every reader plugin disabled."""
    path = write(tmp_path, "mine.csv", f"{PLAIN_HEADER}\n{PLAIN_ROW.format(t='5.0')}\n"
                 f"llama3-8b,h100,16,2,1,1,256,8192,fp8,,,\n".replace(",,,\n", ",,6.0\n"))
    code, out, err = run(cli, *(f"--disable-plugin={p}" for p in READER_PLUGINS), "validate", path, "--format", "json")
    assert code == 0, out + err
    rows = json.loads(out)["rows"]
    assert [r["source"] for r in rows] == ["mine", "mine"] and rows[0]["target"] == "step_time_s"
    assert rows[0]["measured_s"] == 5.0 and rows[0]["predicted_s"] > 0


def test_plain_schema_targets_throughput_tflops_and_a_layer_override(mofa_predictor, tmp_path):
    """tokens/s/GPU and model TFLOPS under a named convention give the step time; ``num_layers``
    is the ``[model] num_layers`` override of a zoo model (a reduced-layer run)."""
    path = write(tmp_path, "t.csv", "model,hardware,num_gpus,global_batch_size,sequence_length,num_layers,"
                 "tokens_per_s_per_gpu,model_tflops_per_gpu,flops_convention\n"
                 "llama3-8b,h100,8,64,4096,,8000,,\n"
                 "llama3.1-405b,h100,64,64,4096,8,,400,6nd\n")
    mapped, skipped = map_rows([path], mofa_predictor.registry)
    assert not skipped
    a, b = mapped
    assert a.measured_s == pytest.approx(64 * 4096 / (8000 * 8))
    m = mofa_predictor.registry.model("llama3.1-405b")
    from mofa_plugins.flops_conventions import six_nd_flops
    import attrs
    assert b.job["model"] == {"name": "llama3.1-405b", "num_layers": 8}
    assert b.measured_s == pytest.approx(six_nd_flops(attrs.evolve(m, num_layers=8), 64, 4096) / (400e12 * 64))


# ---------------------------------------------------------------------- a third party's reader

LOG_READER = '''
from mofa_framework import hookimpl
from mofa_framework.types import MappedRow, MeasurementReader

def map_row(row, ctx):
    gpus = ctx.count(row, "world_size")
    job = {"model": {"name": ctx.text(row, "arch")}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": gpus},
           "parallel": {"tp": ctx.count(row, "tp", 1), "global_batch_size": ctx.count(row, "gbs"),
                        "sequence_length": 4096}}
    return MappedRow(source=ctx.source, reference="acme cluster", row_id=ctx.text(row, "job_id"), job=job,
                     measured_s=ctx.number(row, "iter_ms") / 1e3, target="iter_ms")

@hookimpl
def mofa_register_measurement_readers():
    return [MeasurementReader(name="acme-logs", description="ACME's training logs",
                              columns={"job_id", "arch", "world_size", "iter_ms"}, map_row=map_row,
                              row_id_column="job_id", model_column="arch")]
'''


def test_a_third_party_reader_registers_and_reads_its_logs(cli, mofa_fake_distribution, tmp_path):
    mofa_fake_distribution("acme-mofa", "1.0", {"acme_logs": "acme_logs"}, {"acme_logs": LOG_READER})
    logs = write(tmp_path, "acme.csv", "job_id,arch,world_size,tp,gbs,iter_ms\nj1,llama3-8b,8,2,64,2500\n"
                                       "j2,llama3-8b,16,eight,128,2600\n")
    code, out, err = run(cli, "validate", logs, "--format", "json")
    assert code == 0, out + err
    result = json.loads(out)
    assert [r["row_id"] for r in result["rows"]] == ["j1"] and result["rows"][0]["reference"] == "acme cluster"
    bad = result["skipped"][0]
    assert bad["kind"] == "malformed" and bad["row_id"] == "j2" and "tp = 'eight'" in bad["reason"]
    assert "warning: 1 malformed row" in err
    code, out, _ = run(cli, "list-plugins", "--format", "json")
    acme = {r["name"]: r for r in json.loads(out)}["acme_logs"]
    assert acme["status"] == "active" and acme["provides"] == {"readers": ["acme-logs"]}


# ---------------------------------------------------------------------- files that are not measurements


def test_header_only_non_utf8_and_unknown_files(cli, tmp_path):
    header_only = write(tmp_path, "empty.csv", PLAIN_HEADER + "\n")
    code, out, _ = run(cli, "validate", header_only)
    assert code == 2 and one_line(out) and "no data rows" in out
    latin1 = write(tmp_path, "latin.csv", PLAIN_HEADER + "\nLlama-\xe9,h100,8,1,1,1,8,8,bf16,,1\n", "latin-1")
    code, out, _ = run(cli, "validate", latin1)
    assert code == 2 and one_line(out) and "not UTF-8" in out and "save the file as UTF-8" in out
    binary = tmp_path / "x.csv"
    binary.write_bytes(bytes(range(256)) * 4)
    code, out, _ = run(cli, "validate", binary)
    assert code == 2 and one_line(out)
    code, out, _ = run(cli, "validate")
    assert code == 2 and one_line(out) and "--builtin" in out
    code, out, _ = run(cli, "validate", tmp_path)
    assert code == 2 and one_line(out)


def test_a_non_measurement_file_among_others_is_skipped_with_a_note(cli):
    """``mofa validate data/*.csv``: gpu_specs.csv is passed over with a note, the rest validated."""
    code, out, err = run(cli, "validate", DATA / "gpu_specs.csv", DATA / "megatron_selene_a100.csv", "--format", "json")
    assert code == 0, out + err
    assert "note: " in err and "gpu_specs.csv: skipped, not a measurement file" in err
    assert json.loads(out)["notes"] and len(json.loads(out)["rows"]) == 34
    code, out, _ = run(cli, "validate", DATA / "gpu_specs.csv")  # alone: an error
    assert code == 2 and one_line(out) and "not a measurement file" in out


def test_error_lists_are_capped(cli, tmp_path):
    """A header of 200,000 unknown columns is one short line, not megabytes."""
    wide = write(tmp_path, "wide.csv", ",".join(f"col{i}" for i in range(200_000)) + "\n" + "1," * 199_999 + "1\n")
    code, out, _ = run(cli, "validate", wide)
    assert code == 2 and one_line(out) and len(out) < 1500 and "more" in out


def test_source_that_matches_nothing_is_an_error(cli):
    code, out, _ = run(cli, "validate", DATA / "megatron_selene_a100.csv", "--source", "no-such-source")
    assert code == 2 and one_line(out) and "matches none of the 34 rows" in out and "megatron_selene_a100" in out
    code, out, _ = run(cli, "calibrate", "--hardware", "a100", DATA / "megatron_selene_a100.csv", "--source", "zzz")
    assert code == 2 and one_line(out) and "matches none" in out


# ---------------------------------------------------------------------- bad cells


@pytest.mark.parametrize("value, problem", [("0", "must be > 0"), ("-3", "must be > 0"), ("nan", "not a finite"),
                                            ("inf", "not a finite"), ("1e400", "not a finite"),
                                            ("fast", "not a number")])
def test_impossible_measured_times_are_named_not_scored(cli, tmp_path, value, problem):
    path = write(tmp_path, "t.csv", f"{PLAIN_HEADER}\n{PLAIN_ROW.format(t=value)}\n")
    code, out, _ = run(cli, "validate", path)
    assert code == 2 and one_line(out), out
    assert f"step_time_s = '{value}'" in out and problem in out
    # beside a good row: listed as malformed, with a warning, the good row scored
    path = write(tmp_path, "u.csv", f"{PLAIN_HEADER}\n{PLAIN_ROW.format(t=value)}\n{PLAIN_ROW.format(t='5')}\n")
    code, out, err = run(cli, "validate", path, "--format", "csv")
    assert code == 0 and "warning: 1 malformed row" in err and ",malformed," in out


@pytest.mark.parametrize("column, value, problem", [("tp", "eight", "not a number"), ("hidden", "0", "must be ≥ 1"),
                                                    ("n_gpus", "2.5", "not a whole number"),
                                                    ("n_layers", "1e30", "implausibly large")])
def test_dense_schema_cells_that_are_not_counts_are_named(mofa_predictor, tmp_path, column, value, problem):
    rows = list(csv.DictReader((DATA / "megatron_selene_a100.csv").open()))[:1]
    rows[0][column] = value
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    path = write(tmp_path, "d.csv", buf.getvalue())
    mapped, skipped = map_rows([path], mofa_predictor.registry)
    assert not mapped and skipped[0].kind == "malformed"
    assert f"{column} = '{value}'" in skipped[0].reason and problem in skipped[0].reason


def test_a_row_cut_short_is_listed_not_a_crash(cli, tmp_path):
    text = (DATA / "nvidia_megatron_bridge.csv").read_text().splitlines()
    cut = text[1][: len(text[1]) // 3]
    path = write(tmp_path, "cut.csv", "\n".join([text[0], cut, text[2]]) + "\n")
    code, out, err = run(cli, "validate", path, "--format", "json")
    assert code == 0, out + err
    bad = [s for s in json.loads(out)["skipped"] if s["kind"] == "malformed"]
    assert len(bad) == 1 and "row cut short" in bad[0]["reason"]
    path = write(tmp_path, "cut1.csv", "\n".join([text[0], cut]) + "\n")
    code, out, _ = run(cli, "validate", path)
    assert code == 2 and one_line(out) and "cut short" in out


# ---------------------------------------------------------------------- calibrate


def test_calibrate_refuses_more_coefficients_than_rows_and_more_folds_than_rows(cli, tmp_path):
    path = write(tmp_path, "one.csv", f"{PLAIN_HEADER}\n{PLAIN_ROW.format(t='5')}\n")
    six = [f"--param={p}" for p in ("gemm_efficiency", "gemm_half_efficiency_s", "attention_efficiency",
                                    "scaleup_bus_efficiency", "step_overhead_s", "memory_efficiency")]
    code, out, _ = run(cli, "calibrate", "--hardware", "h100", path, *six, "--folds", "0")
    assert code == 2 and one_line(out) and "cannot be fitted to 1 row" in out
    code, out, _ = run(cli, "calibrate", "--hardware", "a100", DATA / "megatron_selene_a100.csv",
                       "--param", "gemm_efficiency", "--folds", "1000")
    assert code == 2 and one_line(out) and "--folds 1000: only 28 rows" in out


@pytest.mark.parametrize("prior, says", [("host_dispatch_s=1", "outside host_dispatch_s's bounds"),
                                         ("host_dispatch_s", "NAME=VALUE"), ("speed=2", "NAME=VALUE"),
                                         ("host_dispatch_s=soon", "is not a number")])
def test_calibrate_refuses_a_bad_prior(cli, prior, says):
    code, out, _ = run(cli, "calibrate", "--hardware", "a100", DATA / "megatron_selene_a100.csv",
                       "--param", "host_dispatch_s", "--prior", prior, "--folds", "0")
    assert code == 2 and one_line(out) and says in out and "--prior" in out


@pytest.mark.parametrize("sibling, says", [("b9000", "--prior-from"), ("a100", "name another profile than --hardware")])
def test_calibrate_refuses_a_bad_prior_sibling(cli, sibling, says):
    code, out, _ = run(cli, "calibrate", "--hardware", "a100", DATA / "megatron_selene_a100.csv",
                       "--param", "gemm_efficiency", "--prior-from", sibling, "--folds", "0")
    assert code == 2 and one_line(out) and says in out and sibling in out


# ---------------------------------------------------------------------- fuzz

MUTATIONS = ("", "0", "-1", "nan", "inf", "1e400", "NaN", "eight", "1,024", "2.5", "9" * 40, "\x00", "é", " ",
             "n/a", "yes", "None", "[]", "1e30", "-0", "+8", "0x10", "  7  ", "'", '"')


def test_fuzzed_rows_raise_only_mofa_errors(mofa_predictor, tmp_path):
    """2,400 rows of the shared set's three schemas and the plain one, with cells replaced by bad
    values, cut short or lengthened: mapping them never raises anything but MofaError, and no row
    reaches the readers' catch-all (a reader bug listed as "internal")."""
    rng = random.Random(14)
    sources = ["megatron_selene_a100.csv", "zero_bubble.csv", "nvidia_megatron_bridge.csv",
               "megatron_core_moe.csv", "vtrain_single_node_a100.csv", "llm_foundry.csv"]
    files = []
    for name in sources:
        lines = (DATA / name).read_text().splitlines()
        header = next(csv.reader([lines[0]]))
        rows = [next(csv.reader([ln])) for ln in lines[1:]]
        out = io.StringIO()
        w = csv.writer(out)
        w.writerow(header)
        for _ in range(400):
            row = list(rng.choice(rows))
            for _ in range(rng.randint(1, 4)):
                row[rng.randrange(len(row))] = rng.choice(MUTATIONS)
            if rng.random() < 0.05:
                row = row[: rng.randrange(len(row))]
            elif rng.random() < 0.03:
                row = row + ["extra"]
            w.writerow(row)
        files.append(write(tmp_path, name, out.getvalue()))
    plain = [PLAIN_HEADER] + [",".join(rng.choice(MUTATIONS) if rng.random() < 0.3 else c
                                       for c in PLAIN_ROW.format(t="5").split(",")) for _ in range(400)]
    files.append(write(tmp_path, "plain.csv", "\n".join(p.replace("\x00", "") for p in plain) + "\n"))
    total = 0
    for f in files:
        try:
            mapped, skipped = map_rows([f], mofa_predictor.registry)
        except MofaError:
            continue
        total += len(mapped) + len(skipped)
        internal = [s.reason for s in skipped if s.reason.startswith("internal")]
        assert not internal, internal[:3]
        assert all(m.measured_s > 0 for m in mapped)
    assert total >= 2000


def test_one_utf8_decoder_names_the_first_bad_byte_and_drops_a_bom():
    from mofa_framework.errors import ConfigError
    from mofa_framework.limits import decode_text

    assert decode_text(b"\xef\xbb\xbfa,b", "x.csv", "fix") == "a,b"
    with pytest.raises(ConfigError, match=r"^x.csv: not UTF-8 text \(byte 0xe9 at offset 4\); save it$"):
        decode_text("caf\xe9".encode("latin-1").rjust(5, b" "), "x.csv", "save it")


def test_plain_schema_uneven_end_stages_and_an_unstated_interleaving(mofa_predictor, tmp_path):
    """``first_stage_layers`` / ``last_stage_layers`` are the job file's [parallel] keys (Llama 3
    405B: 126 layers on 16 stages, the end stages one layer short, arXiv 2407.21783 sec. 3.3.2:
    7 + 14·8 + 7 = 126); ``vpp = auto`` makes every factor up to one layer per chunk a candidate
    and validation keeps the fastest feasible one, saying so. Without it, vpp is 1."""
    from mofa_framework.validate import resolve_unstated

    head = ("model,hardware,num_gpus,tp,pp,vpp,first_stage_layers,last_stage_layers,global_batch_size,"
            "sequence_length,step_time_s\n")
    path = write(tmp_path, "l3.csv", head + "llama3.1-405b,h100,8192,8,16,auto,7,7,2048,8192,12.5\n"
                                             "llama3.1-405b,h100,8192,8,16,,7,7,2048,8192,12.5\n")
    mapped, skipped = map_rows([path], mofa_predictor.registry)
    assert not skipped
    auto, plain = mapped
    assert auto.job["parallel"]["first_stage_layers"] == 7 == auto.job["parallel"]["last_stage_layers"]
    assert "vpp" not in auto.job["parallel"] and [v["vpp"] for v in auto.variants] == list(range(1, 126 // 16 + 1))
    assert not plain.variants
    (resolved,) = resolve_unstated([auto], mofa_predictor)
    # 8 layers per middle stage and 7 at the ends: 1, 2 and 4 chunks are feasible (3, 5, 6, 7
    # split neither 8 nor the ends' layouts); the kept one is named in the row's assumptions
    assert resolved.job["parallel"]["vpp"] in (1, 2, 4) and not resolved.variants
    assert "interleaving not stated" in resolved.assumptions


def test_plain_schema_vpp_that_is_neither_a_count_nor_auto_names_both(mofa_predictor, tmp_path):
    path = write(tmp_path, "v.csv", "model,hardware,num_gpus,tp,pp,vpp,global_batch_size,sequence_length,step_time_s\n"
                                    "llama3-8b,h100,8,1,2,abc,16,4096,1.0\n")
    mapped, skipped = map_rows([path], mofa_predictor.registry)
    assert not mapped and len(skipped) == 1
    assert "vpp = 'abc': not a count; write a whole number, or auto" in skipped[0].reason


def test_plain_schema_tp_and_pp_auto_search_the_layout(mofa_predictor, tmp_path):
    """``tp = auto`` / ``pp = auto``: the run's layout was tuned, not stated. Llama 3 70B (80
    layers, 64 heads) on 64 H100s at global batch 128, micro-batch 1, by hand: TP 1, 2, 4, 8 ×
    PP 1, 2, 4, 8, 16 (32 splits 80 layers neither evenly nor with lighter ends), 64 / (TP·PP)
    whole data-parallel ranks each with 2·TP·PP ≥ PP micro-batches — all but TP 8 × PP 16 (128
    GPUs): 19 layouts; ``pp = 4`` stated keeps the 4 with PP 4. The row is predicted on the
    fastest that fits and never fitted; a count that is neither a number nor auto names both."""
    from mofa_framework.validate import resolve_unstated

    head = "model,hardware,num_gpus,tp,pp,global_batch_size,sequence_length,step_time_s\n"
    path = write(tmp_path, "a.csv", head + "llama3-70b,h100,64,auto,auto,128,8192,20\n"
                                           "llama3-70b,h100,64,auto,4,128,8192,20\n"
                                           "llama3-70b,h100,64,x,4,128,8192,20\n")
    mapped, skipped = map_rows([path], mofa_predictor.registry)
    both, tp_only = mapped
    want = sorted((t, q) for t in (1, 2, 4, 8) for q in (1, 2, 4, 8, 16) if t * q <= 64)
    assert len(want) == 19 and sorted((v["tp"], v["pp"]) for v in both.variants) == want
    assert sorted((v["tp"], v["pp"]) for v in tp_only.variants) == [(1, 4), (2, 4), (4, 4), (8, 4)]
    assert not both.fit and not tp_only.fit and "tp" not in both.job["parallel"]
    (r,) = resolve_unstated([both], mofa_predictor)
    assert "layout not stated" in r.assumptions and r.job["parallel"]["tp"] > 1 and not r.variants
    assert "tp = 'x': not a count; write a whole number, or auto to try every layout" in skipped[0].reason
    # a model outside the zoo has no layers or heads to bound the layouts; a batch of 3 fills no pipeline
    path = write(tmp_path, "b.csv", head + "nosuchmodel,h100,64,auto,4,128,8192,20\n"
                                           "llama3-70b,h100,64,auto,auto,3,8192,20\n")
    mapped, skipped = map_rows([path], mofa_predictor.registry)
    assert not mapped
    assert "tp = auto needs a zoo model" in skipped[0].reason and "'nosuchmodel'" in skipped[0].reason
    assert "tp and pp = auto, and no layout of 64 GPUs divides the global batch 3" in skipped[1].reason


def test_plain_schema_states_the_attention_kernel(mofa_predictor, tmp_path):
    """``attention_kernel`` is the job file's [parallel] key: a row states the fused-attention
    kernel its stack ran (Meta's 2024 stack: FlashAttention-2), a row without it leaves the
    default (`auto`: cuDNN on Hopper). At 128K tokens, where attention is most of the step,
    FlashAttention-2 prices the same job slower than cuDNN."""
    head = "model,hardware,num_gpus,tp,pp,cp,global_batch_size,sequence_length,attention_kernel,step_time_s\n"
    path = write(tmp_path, "k.csv", head + "llama3-8b,h100,16,1,1,16,16,131072,fa2,30\n"
                                           "llama3-8b,h100,16,1,1,16,16,131072,,30\n")
    mapped, skipped = map_rows([path], mofa_predictor.registry)
    assert not skipped
    fa2, auto = mapped
    assert fa2.job["parallel"]["attention_kernel"] == "fa2" and "attention_kernel" not in auto.job["parallel"]
    t_fa2, t_auto = (mofa_predictor.predict(mofa_predictor.job(m.job))[0].step_time_s for m in (fa2, auto))
    assert t_fa2 > 1.1 * t_auto
