"""Validation against published measurements (issue 7): CI gates on the calibration set,
CLI errors, and calibration recovering a known coefficient from synthetic data."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import attrs
import numpy as np
import pytest
from click.testing import CliRunner

from mofa_framework.measurements import builtin_data_dir

#: the measurements shipped with MoFa (tests/test_measurement_data.py pins them to ../shared/data)
DATA = builtin_data_dir()
CALIBRATION_SET = ("megatron_selene_a100.csv", "zero_bubble.csv", "vtrain_single_node_a100.csv",
                   "nvidia_megatron_bridge.csv", "nemo_2407.csv", "nemo_long_context.csv", "megatron_core_moe.csv",
                   "torchtitan.csv")

# Gates: set just above what the shipped profiles achieve, so they only tighten over time
# (docs/validation.md has the figures; benchmarks/validation_report.py regenerates them).
# achieved 7.06 % over 1,881 rows: 6.66 % over the 1,850 predicted before the Megatron-Core MoE model zoo's 25
# TFLOPS-only rows got a step time from Megatron's FLOPs count (their MAPE 25.9 %) and Narayanan's 6 DeepSpeed
# ZeRO-3 rows were predicted with the deepspeed_zero plugin (then 30–59 % too fast, 11–22 % since DeepSpeed 2021's
# stage 3 is modelled; docs/validation.md)
OVERALL_MAPE = 0.0710
# achieved 65.3 %: Qwen3-235B at TP 2, EP 64 on 64 GB200s (32 micro-batches of small expert GEMMs), priced
# host-bound since the GB200 refit took its per-kernel host floor 18 -> 109 us (the per-step constant bounded
# to 0.1 s; before, 62.0 %: the 1.06 s Llama 3 70B SFT step under a 0.6 s constant, now +14 %)
OVERALL_MAX = 0.66
# (docs/validation.md; 59.1 % before the 2026-11-28 refit that read DeepSeek-V3 with its pipeline layouts)
# Megatron PTD-P rows (Narayanan 2021 Table 1 + Korthikanti 2022); the target is 5 %,
# Calculon reaches 3.65 % mean / 8.87 % max. One A100 profile serves three software stacks
# (Selene 2021/22, the 2023 ZeroBubble fork, vTrain's Megatron-DeepSpeed) and is fitted on all
# their rows.
SELENE_MAPE = 0.033  # achieved 3.1 % (28 rows: 3 from Korthikanti's MFU at +5 %; 3.3 % before Megatron's softmax fallback)
# achieved 7.28 % (7.0 % before the A100 refit with Megatron's softmax fallback, which moved 32 vTrain rows
# from 21 % to within 7 % and the fitted NVLink efficiency from 0.77 to 0.70; 7.11 % before ZB-2p's
# adaptive bubble moved ZeroBubble's 21 ZB-2p rows in the same fit; MAPE 3.3 → 3.0 % over the two);
# 7.46 % after the refit that followed ZeroBubble's critical-path floor (its six ZB-2p rows at m < p
# no longer pull the per-micro-batch overhead up: 2.06 → 1.58 ms; ZeroBubble 4.1 → 3.0 %)
SELENE_MAX = 0.075
# the same rows predicted by an A100 fit that never saw them (held back; achieved 3.6 % / 8.4 %)
SELENE_HELD_BACK_MAPE = 0.038  # 3.7 % before the softmax fallback
# 8.60 % since the pipeline's cross-node hop (2026-11-29): the ZeroBubble rows this fit keeps no longer
# need a per-chunk overhead (0.42 → 0.22 ms), which the held-back Selene rows had leaned on
SELENE_HELD_BACK_MAX = 0.087  # 8.36 % with the softmax fallback, 8.17 % before it (Calculon: 8.87 %)
ZERO3_ROWS = 6  # DeepSpeed ZeRO-3 rows of Narayanan Table 2, predicted with the deepspeed_zero plugin
VTRAIN_SPEARMAN_MIN = 0.95  # achieved ≥ 0.97 in every (architecture, GPU count) group; target 0.85
#: calibration rows (runs that completed) predicted not to fit: 78 on 2026-11-28 (Megatron-Bridge 53, NeMo 24.07
#: 14, the Megatron-Core MoE zoo 9, Selene 1, NeMo long context 1; 84 before the Llama FSDP presets' CPU
#: activation offloading was read; docs/validation.md)
RAN_OVER_MEMORY = 69
VTRAIN_REGRET_MAX = 0.05  # predicted-best strategy within 5 % of the measured best (achieved 0 %)


def _dense_job(row, registry, source):
    """The dense reader's mapping of one row (the ``reader_dense`` plugin)."""
    from mofa_framework.measurements import ReadContext
    from mofa_plugins.reader_dense import map_row

    return map_row(row, ReadContext(source=source, registry=registry))


def _nvidia_job(row, registry, source):
    """The NVIDIA-schema reader's mapping of one row (the ``reader_nvidia`` plugin)."""
    from mofa_framework.measurements import ReadContext
    from mofa_plugins.reader_nvidia import map_row

    return map_row(row, ReadContext(source=source, registry=registry))


@pytest.fixture(scope="module")
def cli():
    import mofa_framework.cli as c

    c._builtin_commands()
    return c.cli


@pytest.fixture(scope="module")
def calibration_result():
    from mofa_framework.validate import validate

    return validate([DATA / f for f in CALIBRATION_SET])


def test_overall_step_time_gate(calibration_result):
    o = calibration_result.overall
    assert o.rows > 1500
    assert o.step_time.mape <= OVERALL_MAPE, o.step_time
    assert o.step_time.max <= OVERALL_MAX, o.step_time
    # nothing silently dropped: every CSV row is predicted or listed with a reason
    import csv

    total = sum(sum(1 for _ in csv.DictReader((DATA / f).open())) for f in CALIBRATION_SET)
    assert o.rows + len(calibration_result.skipped) == total
    assert all(s.reason for s in calibration_result.skipped)
    # a row the engine cannot price is listed, not fatal, for users; here it is a bug
    assert not [s for s in calibration_result.skipped if s.kind == "error"]


def test_selene_mape_via_cli(cli):
    res = CliRunner().invoke(cli, ["validate", str(DATA / "megatron_selene_a100.csv"), "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["overall"]["step_time"]["n"] == 28 + ZERO3_ROWS and not out["skipped"]
    # the target: MAPE ≤ 5 % on the Megatron PTD-P runs, 3 of them from Korthikanti's MFU (eq. 7)
    # (Calculon: 3.65 % mean / 8.87 % max)
    ptdp = np.array([r["error"] for r in out["rows"] if "DeepSpeed" not in r["reference"]])
    assert len(ptdp) == 28
    assert np.abs(ptdp).mean() <= SELENE_MAPE <= 0.05, ptdp
    assert np.abs(ptdp).max() <= SELENE_MAX, ptdp
    # Narayanan's DeepSpeed ZeRO-3 comparison runs: DeepSpeed 2021's own pattern (per-micro-batch gathers in
    # forward, recompute and backward, none hidden; gradients all-reduced, unhidden), predicted 12–23 % too
    # fast (1,536 GPUs took as long as 768; docs/validation.md). Never fitted to: the A100 refit after
    # dp_overlap's Megatron-Core buckets (scale-out bus efficiency 0.82 → 0.85, as the Megatron rows' DP
    # traffic now hides behind their last backward) moved them from 16.4 % to 18.0 %
    zero3 = [r for r in out["rows"] if "DeepSpeed ZeRO-3" in r["reference"]]
    errors = np.array([r["error"] for r in zero3])
    assert len(zero3) == ZERO3_ROWS and np.all((-0.24 < errors) & (errors < -0.09)), errors
    assert np.abs(errors).mean() < 0.19, errors  # achieved 18.0 % (48.8 % before the 2021 pattern)


def test_selene_predicted_by_a_fit_that_never_saw_it():
    """The A100 profile refitted as its recorded command does, but on ZeroBubble's and vTrain's rows
    only (Selene held back; what those rows do not constrain at the library defaults), predicts
    Narayanan's and Korthikanti's Selene runs within the issue's 5 % (Calculon: 3.65 % / 8.87 %)."""
    import re

    from mofa_framework.calibrate import calibrate

    text = (Path(__file__).resolve().parents[1] / "hardware_profiles" / "a100-sxm4-80gb.toml").read_text()
    params = re.findall(r"--param (\S+)", text.split("\n[efficiency]")[0])
    assert len(params) >= 5
    r = calibrate([DATA / f for f in CALIBRATION_SET[:3]], "a100-sxm4-80gb", parameters=params, folds=0,
                  hold_out=("megatron_selene_a100",))
    assert set(r.rows_by_source) == {"zero_bubble", "vtrain_single_node_a100"} and r.held_back_rows == 28
    assert r.unfitted == ZERO3_ROWS  # DeepSpeed's 2021 ZeRO-3 runs: validated, never fitted to
    assert r.held_back_after.mape <= SELENE_HELD_BACK_MAPE and r.held_back_after.max <= SELENE_HELD_BACK_MAX


def test_vtrain_ranking(calibration_result):
    s = next(x for x in calibration_result.sources if x.source == "vtrain_single_node_a100")
    assert s.ranking.groups == 24
    assert s.ranking.spearman_min >= VTRAIN_SPEARMAN_MIN, s.ranking.spearman
    assert s.ranking.regret_max <= VTRAIN_REGRET_MAX, s.ranking.regret


def test_csv_and_table_formats(cli):
    path = str(DATA / "megatron_selene_a100.csv")
    res = CliRunner().invoke(cli, ["validate", path, "--format", "csv", "--source", "Korthikanti"])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert lines[0].startswith("source,reference,row_id")
    assert len(lines) == 1 + 12  # the 12 Korthikanti rows: 9 with an iteration time, 3 with only the MFU
    assert sum(",ok,," in line for line in lines) == 12  # status, reason, then the mapping's assumptions
    assert sum(",mfu_pct (palm FLOPs)," in line for line in lines) == 3
    res = CliRunner().invoke(cli, ["validate", str(DATA / "torchtitan_dense.csv"), "--rows"])
    assert res.exit_code == 0 and "rows not predicted" in res.output


def test_errors_grouped_by_reference_model_or_hardware(cli):
    from mofa_framework.validate import group_errors, validate

    path = DATA / "megatron_selene_a100.csv"
    result = validate([path])
    groups = group_errors(result.rows, ["reference"])
    assert {g.key[0]: g.step_time.n for g in groups} == {"Narayanan et al. 2021": 16, "Korthikanti et al. 2022": 12,
                                                         "Narayanan et al. 2021 (DeepSpeed ZeRO-3)": 6}
    assert sum(g.share_of_error for g in groups) == pytest.approx(1.0)
    assert groups[0].share_of_error >= groups[1].share_of_error >= groups[2].share_of_error
    for g in groups:
        errs = [r.error for r in result.rows if r.reference == g.key[0]]
        assert g.step_time.mape == pytest.approx(np.mean(np.abs(errs)))
    res = CliRunner().invoke(cli, ["validate", str(path), "--format", "json", "--by", "reference,hardware"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)["groups"]
    assert out["by"] == ["reference", "hardware"] and len(out["groups"]) == 3
    assert out["groups"][0]["key"][1] == "a100-sxm4-80gb"
    res = CliRunner().invoke(cli, ["validate", str(path), "--by", "gpu"])
    assert res.exit_code == 2 and "num_gpus" in res.output and res.output.strip().count("\n") == 0


def test_errors_grouped_by_framework_and_precision(cli):
    """Each predicted row carries the GEMMs' format and the stack its source names, so a pattern by
    framework or precision is one ``--by`` away (Selene: Megatron-LM's fp16 and bf16 rows and the
    DeepSpeed ZeRO-3 comparison)."""
    from mofa_framework.validate import group_errors, validate

    path = DATA / "megatron_selene_a100.csv"
    rows = validate([path]).rows
    counts = {g.key: g.step_time.n for g in group_errors(rows, ["framework", "precision"])}
    assert counts == {("Megatron-LM 2021–22", "fp16"): 16, ("Megatron-LM 2021–22", "bf16"): 12,
                      ("DeepSpeed ZeRO", "fp16"): 6}
    res = CliRunner().invoke(cli, ["validate", str(path), "--format", "csv"])
    lines = res.stdout.splitlines()
    assert lines[0].endswith(",assumptions,precision,framework")
    assert sum(line.endswith(",fp16,DeepSpeed ZeRO") for line in lines) == 6
    plain = [attrs.evolve(r, framework="") for r in rows[:3]]  # a plain-schema file names no stack
    assert [g.key for g in group_errors(plain, ["framework"])] == [("(not stated)",)]


def test_parity_plot(cli, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    path = str(DATA / "megatron_selene_a100.csv")
    png = tmp_path / "parity.png"
    res = CliRunner().invoke(cli, ["validate", path, "--format", "csv", "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the CSV on stdout stays parseable: the notice goes to stderr
    assert res.stdout.startswith("source,reference,row_id") and "plot written to" not in res.stdout
    for args, fragment in (([str(tmp_path / "no-such-dir" / "x.png")], "cannot write"),
                           ([str(png), "--source", "nothing-matches"], "matches none of the 34 rows")):
        res = CliRunner().invoke(cli, ["validate", path, "--plot", *args])
        assert res.exit_code == 2 and res.output.strip().count("\n") == 0 and fragment in res.output, res.output
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    res = CliRunner().invoke(cli, ["validate", path, "--plot", str(png)])
    assert res.exit_code == 2 and "mofa[plot]" in res.output and res.output.strip().count("\n") == 0


def test_calibrate_cli_hold_out(cli, tmp_path):
    out = tmp_path / "h100.toml"
    res = CliRunner().invoke(cli, ["calibrate", "--hardware", "h100-sxm5-80gb", "--param", "gemm_efficiency",
                                   "--folds", "0", "--hold-out", "nemo_2407", "--write", str(out),
                                   str(DATA / "nvidia_megatron_bridge.csv"), str(DATA / "nemo_2407.csv")])
    assert res.exit_code == 0, res.output
    assert "held back (not fitted)" in res.output and "nemo_2407 (held back)" in res.output
    text = out.read_text()
    assert "# 48 rows held back, not fitted (nemo_2407: 48): step-time MAPE" in text
    assert "--hold-out=nemo_2407" in text  # the recorded command reproduces the split


def test_bad_input_is_one_line_exit_2(cli, tmp_path):
    res = CliRunner().invoke(cli, ["validate", str(tmp_path / "missing.csv")])
    assert res.exit_code == 2
    assert res.output.strip().count("\n") == 0 and "no such file" in res.output
    bad = tmp_path / "other.csv"
    bad.write_text("a,b,c\n1,2,3\n")
    res = CliRunner().invoke(cli, ["validate", str(bad)])
    assert res.exit_code == 2
    assert res.output.strip().count("\n") == 0 and "not a measurement file" in res.output
    res = CliRunner().invoke(cli, ["calibrate", "--hardware", "a100-sxm4-80gb", str(bad)])
    assert res.exit_code == 2 and res.output.strip().count("\n") == 0


KORTHIKANTI_LIKE = (("gpt-22b", 8, 8, 1, 1, 4), ("gpt3-175b", 64, 8, 8, 3, 64), ("gpt-7.5b", 32, 4, 2, 1, 64),
                    ("gpt-1.7b", 8, 1, 1, 1, 64))
#: data parallelism over 1 to 16 nodes (the gradient all-reduce spans them all)
DP_SCALING = tuple(("gpt-1.7b", n, 1, 1, 1, n) for n in (8, 16, 32, 64, 128)) + (("gpt-7.5b", 32, 4, 1, 1, 64),)


def _synthetic_rows(predictor, true_eff: float, features: dict | None = None, layouts=KORTHIKANTI_LIKE,
                    **truth_coeffs):
    """A few jobs (model, GPUs, TP, PP, VPP, global batch) whose 'measured' step time is the prediction
    with known coefficients (`gemm_efficiency` = `true_eff` and any of `truth_coeffs`); `features` are
    added to every job."""
    from mofa_framework.validate import MappedRow, prepare, predict_prepared

    jobs = []
    for model, gpus, tp, pp, vpp, gbs in layouts:
        for rec in ("full", "selective"):
            jobs.append({"model": {"name": model}, "hardware": {"name": "a100-sxm4-80gb", "num_gpus": gpus},
                         "parallel": {"tp": tp, "pp": pp, "vpp": vpp, "micro_batch_size": 1, "global_batch_size": gbs,
                                      "sequence_length": 2048, "precision": "fp16"},
                         "features": {"recompute": {"granularity": rec}, **(features or {})}})
    rows = [MappedRow(source="synthetic", reference="", row_id=str(i), job=j, measured_s=1.0, target="synthetic")
            for i, j in enumerate(jobs)]
    hw = predictor.registry.hardware_profile("a100-sxm4-80gb")
    truth = attrs.evolve(hw, efficiency=attrs.evolve(hw.efficiency, gemm_efficiency=true_eff, **truth_coeffs))
    groups, infeasible = prepare(rows, predictor)
    assert not infeasible
    t = predict_prepared(groups, predictor, {hw.name: truth}, n_rows=len(rows))["step_s"]
    return [attrs.evolve(r, measured_s=float(x)) for r, x in zip(rows, t)]


def test_calibrate_recovers_known_coefficient(tmp_path):
    from mofa_framework import Predictor
    from mofa_framework.calibrate import calibrate, replace_efficiency, efficiency_table

    predictor = Predictor()
    rows = _synthetic_rows(predictor, 0.62)
    res = calibrate([], "a100-sxm4-80gb", predictor, parameters=("gemm_efficiency",), folds=2,
                    start={"gemm_efficiency": 0.9}, mapped=rows)
    assert res.fitted["gemm_efficiency"] == pytest.approx(0.62, abs=0.005)
    assert res.after.max < 0.01
    assert res.cross_validated is not None and res.cross_validated.max < 0.02
    # the TOML rewrite replaces an existing [efficiency] table and keeps the rest
    text = 'name = "x"\n\n[efficiency]\ngemm_efficiency = 0.5\n\n[host]\ncpu_memory_gib = 1.0\n'
    out = replace_efficiency(text, efficiency_table({"gemm_efficiency": 0.62}, ["test"]))
    import tomllib

    data = tomllib.loads(out)
    assert data["efficiency"] == {"gemm_efficiency": 0.62} and data["host"]["cpu_memory_gib"] == 1.0
    again = replace_efficiency(out, efficiency_table({"gemm_efficiency": 0.7}, ["again"]))
    assert again.count("\n[efficiency]\n") == 1 and again.count("fitted by") == 1


def test_calibrate_holds_back_a_source_and_scores_it(monkeypatch):
    """A held-back split: rows of the held-back source are not fitted (changing their times does not
    move the fit) and their error before and after the fit is reported."""
    from mofa_framework import Predictor, calibrate as calibration
    from mofa_framework.calibrate import calibrate
    from mofa_framework.errors import ConfigError

    monkeypatch.setattr(calibration, "PRIOR_WEIGHT", 0.0)
    predictor = Predictor()
    fit_rows = _synthetic_rows(predictor, 0.62)
    other = [attrs.evolve(r, source="other", row_id=f"o{r.row_id}") for r in _synthetic_rows(predictor, 0.62)]
    res = calibrate([], "a100-sxm4-80gb", predictor, parameters=("gemm_efficiency",), folds=0,
                    mapped=fit_rows + other, hold_out=("other",))
    assert res.rows == len(fit_rows) and res.held_back_rows == len(other) and set(res.rows_by_source) == {"synthetic"}
    assert res.fitted["gemm_efficiency"] == pytest.approx(0.62, abs=0.005)
    assert res.held_back_after.max < 0.01 < res.held_back_before.max and set(res.held_back_by_source) == {"other"}
    # held-back rows 30 % slower: the fit does not move, their error does
    slow = [attrs.evolve(r, measured_s=1.3 * r.measured_s) for r in other]
    res2 = calibrate([], "a100-sxm4-80gb", predictor, parameters=("gemm_efficiency",), folds=0,
                     mapped=fit_rows + slow, hold_out=("OTHER",))
    assert res2.fitted == res.fitted
    assert res2.held_back_after.mape == pytest.approx(1 - 1 / 1.3, abs=0.01)
    with pytest.raises(ConfigError, match="none is left to fit"):
        calibrate([], "a100-sxm4-80gb", predictor, parameters=("gemm_efficiency",), folds=0,
                  mapped=fit_rows, hold_out=("synthetic",))


@pytest.mark.parametrize("name, truth", [("contention_compute", 1.2), ("bandwidth_decay_per_doubling", 0.1)])
def test_calibrate_fits_contention_and_node_scaling(name, truth, monkeypatch):
    """The issue's "contention coefficients" and "collective efficiency vs nodes spanned" are
    fittable: rows whose TP, PP and DP communication overlaps compute recover a known α
    (contention_compute), and rows whose rings span 1–8 nodes a known eq. [3] decay, next to
    the GEMM efficiency. (The weak prior towards the library defaults is switched off: with a
    dozen synthetic rows of one source it would hold the coefficient part of the way back.)"""
    from mofa_framework import Predictor, calibrate as calibration
    from mofa_framework.calibrate import PARAMETERS, calibrate

    monkeypatch.setattr(calibration, "PRIOR_WEIGHT", 0.0)
    assert {"contention_compute", "contention_comm", "bandwidth_decay_per_doubling"} <= set(PARAMETERS)
    predictor = Predictor()
    overlaps = {"tp_overlap": {}, "pp_overlap": {}, "dp_overlap": {}, "distributed_optimizer": {}}
    if name.startswith("contention"):
        rows = _synthetic_rows(predictor, 0.7, overlaps, **{name: truth})
    else:
        rows = _synthetic_rows(predictor, 0.7, layouts=DP_SCALING, **{name: truth})
    res = calibrate([], "a100-sxm4-80gb", predictor, parameters=("gemm_efficiency", name), folds=0, mapped=rows)
    assert res.fitted[name] == pytest.approx(truth, rel=0.05)
    assert res.fitted["gemm_efficiency"] == pytest.approx(0.7, abs=0.01)
    assert res.after.max < 0.005 < res.before.max


def test_spearman_ties_and_order():
    from mofa_framework.validate import spearman

    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert np.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_rows_the_source_flags_as_a_known_regression_are_listed_not_predicted():
    from mofa_framework.api import Predictor
    from mofa_framework.validate import map_rows

    mapped, skipped = map_rows([DATA / "nvidia_megatron_bridge.csv"], Predictor().registry)
    flagged = {s.row_id: s.reason for s in skipped if "known performance regression" in s.reason}
    assert set(flagged) == {"MB-ARC-003", "MB-ARC-004"}  # GPT-OSS 120B, cudnn-frontend issue 256
    assert not any(m.row_id in flagged for m in mapped)


def test_every_nemotron_3_and_deepseek_v4_row_is_predicted():
    """Issue 17 §6 / issue 18: Nemotron 3 Nano's 20 rows, Super's 30 and Ultra's 2 (LatentMoE + shared
    MTP modules), 3.5 Lightning's 1 and DeepSeek-V4 Flash's 2 (compressed sparse attention,
    hyper-connections) are predicted, none listed as not predictable."""
    from mofa_framework.api import Predictor
    from mofa_framework.validate import map_rows

    mapped, skipped = map_rows([DATA / "nvidia_megatron_bridge.csv"], Predictor().registry)
    names = [m.job["model"]["name"] for m in mapped]
    for name, n in (("nemotron-3-nano", 20), ("nemotron-3-super", 30), ("nemotron-3-ultra", 2),
                    ("nemotron-3.5-nano", 1), ("deepseek-v4-flash", 2)):
        assert names.count(name) == n, name
    assert not [s for s in skipped if s.model.startswith(("Nemotron_3", "DeepSeekV4"))]


def test_megatron_bridge_presets_and_stated_dispatchers_map_to_features():
    """Settings read from Megatron-Bridge's performance presets reach exactly the rows whose
    layout matches; a Megatron-Core row's stated dispatcher maps to the flex dispatcher."""
    from mofa_framework.api import Predictor
    from mofa_framework.validate import map_rows

    reg = Predictor().registry
    mapped, _ = map_rows([DATA / "nvidia_megatron_bridge.csv", DATA / "megatron_core_moe.csv"], reg)
    feats = {m.row_id: m.job["features"] for m in mapped}
    precision = {m.row_id: m.job["parallel"]["precision"] for m in mapped}
    # DeepSeek-V3 B200 MXFP8, TP1 PP8 VP2 EP32: DeepEP, 1F1B A2A overlap, mla_up_proj + mlp recompute
    f = feats["MB-ARC-073"]
    assert f["flex_dispatcher"] == {"backend": "deepep"} and "ep_overlap" in f
    assert f["recompute"] == {"granularity": "selective", "mla_up_proj": True, "mlp": True}
    # Qwen3-235B on H100 (TP2 PP8 VP4 EP32): alltoall dispatcher, with the A2A overlap
    assert "ep_overlap" in feats["MB-ARC-088"] and "flex_dispatcher" not in feats["MB-ARC-088"]
    # Qwen3-30B-A3B everywhere: HybridEP
    assert feats["MB-ARC-083"]["flex_dispatcher"] == {}
    # GPT-OSS GB200 BF16 at GBS 1280: recompute modules, but no overlap (the preset versions disagree)
    f = feats["MB-ARC-075"]
    assert f["recompute"] == {"granularity": "selective", "layernorm": True, "moe_act": True}
    assert "ep_overlap" not in f and "flex_dispatcher" not in f
    # dense rows get none of it; NVFP4 rows run bf16 + nvfp4
    assert not {"flex_dispatcher", "ep_overlap"} & set(feats["MB-ARC-017"])
    assert "nvfp4" in feats["MB-ARC-017"] and precision["MB-ARC-017"] == "bf16"
    # CUDA graphs as the presets capture them: per module on Qwen3-30B (B200: attention + router +
    # permutation; GB200 MXFP8: router + permutation), the full iteration for GPT-OSS MXFP8 on GB200,
    # none for GPT-OSS BF16 on GB200 or for DeepSeek-V3 (the preset versions disagree)
    assert feats["MB-ARC-082"]["cuda_graphs"] == {"scope": "per_module", "attn": True, "mlp": False,
                                                  "moe_router": True, "moe_preprocess": True}
    assert feats["MB-ARC-080"]["cuda_graphs"]["attn"] is False
    assert feats["MB-CUR-006"]["cuda_graphs"] == {}
    assert "cuda_graphs" not in feats["MB-ARC-121"] and "cuda_graphs" not in feats["MB-ARC-073"]
    # a preset that changed between releases: Qwen3-30B MXFP8 on GB200 overlaps the EP all-to-all and
    # graphs the full iteration from NeMo 26.06 (Megatron-Bridge v0.5.0) on, per module before
    assert feats["MB-CUR-008"]["cuda_graphs"] == {"scope": "full_iteration"} and "ep_overlap" in feats["MB-CUR-008"]
    assert feats["MB-ARC-080"]["cuda_graphs"]["scope"] == "per_module" and "ep_overlap" not in feats["MB-ARC-080"]
    # likewise Qwen3-235B's 256-GPU MXFP8 runs on GB200 (26.08, not 26.04.01) and DeepSeek-V3 MXFP8 on GB300
    assert feats["MB-CUR-010"]["cuda_graphs"] == {"scope": "full_iteration"} and "ep_overlap" in feats["MB-CUR-010"]
    assert feats["MB-ARC-085"]["cuda_graphs"]["scope"] == "per_module" and "ep_overlap" not in feats["MB-ARC-085"]
    assert feats["MB-CUR-001"]["cuda_graphs"] == {"scope": "full_iteration"}
    # DeepSeek-V3 MXFP8 on GB200 by release: 26.02 mla_up_proj, 26.04 the MLP recomputed, per-module graphs
    # and no overlap; 26.08 the overlap, mla_up_proj and the full iteration
    for rid, module in (("MB-ARC-198", "mla_up_proj"), ("MB-ARC-117", "mlp")):
        assert feats[rid]["recompute"] == {"granularity": "selective", module: True} and "ep_overlap" not in feats[rid]
        assert feats[rid]["cuda_graphs"]["scope"] == "per_module"
    assert feats["MB-CUR-002"]["recompute"] == {"granularity": "selective", "mla_up_proj": True}
    assert "ep_overlap" in feats["MB-CUR-002"] and feats["MB-CUR-002"]["cuda_graphs"] == {"scope": "full_iteration"}
    # Nemotron 3 Super's NVFP4 runs keep their last 14 layers in BF16
    assert feats["MB-CUR-016"]["nvfp4"] == {"bf16_layers_at_end": 14}
    # Megatron-Core model zoo: "dispatcher=DeepEP" → flex (deepep); "dispatcher=A2A" → none
    assert feats["MCORE-MZOO-001"]["flex_dispatcher"] == {"backend": "deepep"}
    assert "flex_dispatcher" not in feats["MCORE-MZOO-004"]
    # 25.09's Qwen3 presets: token drop (the alltoall dispatcher) and, on GB200 at the layouts they name,
    # whole layers in CUDA graphs (enable_cuda_graph); B200's 25.09 rows ran neither graphs nor flex
    for rid in ("MB-ARC-258", "MB-ARC-259", "MB-ARC-256", "MB-ARC-257"):
        assert feats[rid]["cuda_graphs"] == {"scope": "full_iteration"} and "flex_dispatcher" not in feats[rid]
    assert "flex_dispatcher" not in feats["MB-ARC-266"] and "flex_dispatcher" not in feats["MB-ARC-267"]
    assert "cuda_graphs" not in feats["MB-ARC-267"]
    # DeepSeek-V3's 25.09 token-drop runs on GB200 / B200 ran the alltoall dispatcher; H100's kept DeepEP
    assert "flex_dispatcher" not in feats["MB-ARC-254"] and "flex_dispatcher" not in feats["MB-ARC-264"]
    assert feats["MB-ARC-272"]["flex_dispatcher"] == {"backend": "deepep"}
    # Llama 3 8B at micro-batch 2 on GB200 / B200: the whole iteration, in every preset version read;
    # GB300's rows (micro-batch 2 against its presets' 4) and H100's (FSDP) keep none
    for rid in ("MB-ARC-225", "MB-ARC-226", "MB-ARC-234", "MB-ARC-248", "MB-ARC-261"):
        assert feats[rid]["cuda_graphs"] == {"scope": "full_iteration"}
    assert "cuda_graphs" not in feats["MB-ARC-216"] and "cuda_graphs" not in feats["MB-ARC-242"]


def test_nemo2_rows_run_the_cuda_graphs_of_nemos_recommended_configs():
    """NeMo 2.0's tables (the external check) get ``enable_cuda_graph`` where NeMo's 25.04 GB200
    recommended configurations set ``cuda_graphs = 1`` (GPT-3 175B, Llama 3 8B, Mixtral 8×7B,
    Nemotron-4 15B and 340B), not on Llama 3 70B / 3.1 405B (0) nor on the 25.02 B200 and H100 rows
    (no such column then); Megatron-Bridge's rows of the same models are not touched by them."""
    from mofa_framework.api import Predictor
    from mofa_framework.validate import map_rows

    reg = Predictor().registry
    mapped, _ = map_rows([Path(__file__).parent / "data" / "external_nemo2.csv"], reg)
    graphed = {m.row_id for m in mapped if m.job["features"].get("cuda_graphs") == {"scope": "full_iteration"}}
    assert graphed == {"NEMO2-2504-GB200-01", "NEMO2-2504-GB200-02", "NEMO2-2504-GB200-05",
                       "NEMO2-2504-GB200-06", "NEMO2-2504-GB200-07", "NEMO2-2507-GB200-01"}
    assert not any("cuda_graphs" in m.job["features"] for m in mapped if m.row_id not in graphed)
    # the table covers NeMo 2.0's later B200 / GB200 runs too (every version from 25.04 agrees), not 25.02's
    from mofa_plugins._bridge_presets import NEMO2_CONFIGS

    def graphed_run(model, gpu, layout, release, precision="FP8"):
        ref = "https://docs.nvidia.com/nemo-framework/user-guide/latest/performance/performance-summary.html"
        return any(r.matches(model, gpu, precision, layout, release, ref) for r in NEMO2_CONFIGS)
    mixtral = {"tp": 1, "pp": 1, "ep": 8, "mbs": 2, "gbs": 256}
    assert graphed_run("mixtral-8x7b", "b200-sxm-180gb", mixtral, "NeMo 25.07")
    assert not graphed_run("mixtral-8x7b", "b200-sxm-180gb", mixtral, "NeMo 25.02")
    assert not graphed_run("gpt3-175b", "b200-sxm-180gb", {"tp": 4, "pp": 4, "vpp": 12, "mbs": 2, "gbs": 256}, "NeMo 25.07")
    assert not graphed_run("nemotron-4-340b", "gb200-nvl72", {"tp": 8, "pp": 4, "vpp": 12, "mbs": 1, "gbs": 32},
                           "NeMo 25.04", "BF16")


def test_llama3_70b_fsdp_rows_offload_the_layers_their_presets_name():
    """Megatron-Bridge's Llama 3 70B FSDP presets offload N of the 80 layers' activations
    (cpu_offloading_num_layers: GB300 FP8-CS 20, GB200 FP8-CS 40): the rows at TP 1, PP 1 with FSDP
    get `activation_offload` at N/80; the same model at PP 4 (MXFP8) or without FSDP gets none; the
    405B FSDP preset on GB200 offloads 95 of 126 in its 25.09 version."""
    import csv

    from mofa_framework import Predictor

    reg = Predictor().registry
    with open(DATA / "nvidia_megatron_bridge.csv", newline="") as fh:
        rows = {r["source_id"]: r for r in csv.DictReader(fh)}
    feats = {rid: _nvidia_job(rows[rid], reg, "nvidia_megatron_bridge").job["features"]
             for rid in ("MB-ARC-056", "MB-ARC-059", "MB-ARC-147", "MB-ARC-057", "MB-ARC-252")}
    assert feats["MB-ARC-056"]["activation_offload"] == {"fraction": 0.25}  # GB300 FP8, FSDP 64
    assert feats["MB-ARC-059"]["activation_offload"] == {"fraction": 0.5}  # GB200 FP8, FSDP 64
    assert "activation_offload" not in feats["MB-ARC-147"]  # GB300 NVFP4, no FSDP stated
    assert "activation_offload" not in feats["MB-ARC-057"]  # GB300 MXFP8, PP 4
    # Llama 3.1 405B FP8-CS on 128 GB200s at TP 2 with FSDP, NeMo 25.09: 95 of 126 layers (92 from 25.11)
    assert feats["MB-ARC-252"]["activation_offload"] == {"fraction": 95 / 126}


def test_qwen3_model_zoo_rows_run_the_command_their_readme_prints():
    """The Megatron-Core MoE model zoo's Qwen3 README prints the command under each table: the H100
    long-context rows (PP 8 VPP 4 EP 8, 16K-128K) recompute ``layernorm moe``, the GB200 MXFP8 row
    runs A2A_OVERLAP=1 (``--overlap-moe-expert-parallel-comm``), ``moe_act layernorm`` recompute and
    CUDA graphs of attn/moe_router/moe_preprocess (and offloads activations, which MoFa does not price:
    not fitted to), the GB200 BF16 row those graphs only; a row that
    states its own recompute (the 4K table: "recompute=norm, act") keeps it, and a row citing another
    document gets nothing from these commands."""
    import csv

    from mofa_framework import Predictor
    from mofa_plugins._bridge_presets import MODEL_ZOO_COMMANDS

    reg = Predictor().registry
    with open(DATA / "megatron_core_moe.csv", newline="") as fh:
        rows = {r["source_id"]: r for r in csv.DictReader(fh)}
    mapped = {rid: _nvidia_job(rows[rid], reg, "megatron_core_moe")
              for rid in ("MCORE-MZOO-001", "MCORE-MZOO-007", "MCORE-MZOO-013", "MCORE-MZOO-015", "MCORE-MZOO-016")}
    feats = {rid: m.job["features"] for rid, m in mapped.items()}
    # the GB200 MXFP8 command also offloads expert_fc1 and moe_act activations (no MoFa feature):
    # validated, not fitted to
    assert not mapped["MCORE-MZOO-016"].fit and "fine-grained-activation-offloading" in mapped["MCORE-MZOO-016"].assumptions
    assert mapped["MCORE-MZOO-015"].fit and mapped["MCORE-MZOO-007"].fit
    for rid in ("MCORE-MZOO-007", "MCORE-MZOO-013"):
        assert feats[rid]["recompute"] == {"granularity": "selective", "layernorm": True, "moe": True}
    assert feats["MCORE-MZOO-016"]["recompute"] == {"granularity": "selective", "moe_act": True, "layernorm": True}
    assert "ep_overlap" in feats["MCORE-MZOO-016"] and "ep_overlap" not in feats["MCORE-MZOO-015"]
    graphs = {"scope": "per_module", "attn": True, "mlp": False, "moe_router": True, "moe_preprocess": True}
    assert feats["MCORE-MZOO-015"]["cuda_graphs"] == feats["MCORE-MZOO-016"]["cuda_graphs"] == graphs
    assert feats["MCORE-MZOO-001"]["recompute"] == {"granularity": "selective", "layernorm": True, "moe_act": True}
    h100_long = MODEL_ZOO_COMMANDS[0]
    layout = {"tp": 4, "pp": 8, "vpp": 4, "cp": 2, "ep": 8, "mbs": 1, "gbs": 256}
    assert h100_long.matches("qwen3-235b-a22b", "h100-sxm5-80gb", "BF16", layout, "",
                             "https://github.com/yanring/Megatron-MoE-ModelZoo/blob/x/best_practice/qwen3/readme.md")
    assert not h100_long.matches("qwen3-235b-a22b", "h100-sxm5-80gb", "BF16", layout, "", "another document")


def test_bridge_presets_match_a_release_window():
    from mofa_plugins._bridge_presets import BridgeRecipe, release_key

    assert release_key("NeMo 26.06.01") == (26, 6) and release_key("26.08") == (26, 8)
    assert release_key("") is None and release_key("NeMo") is None
    r = BridgeRecipe(models=("m",), gpus=("gb200",), features={}, source="s", since="26.06")
    assert r.matches("m", "gb200-nvl72", "MXFP8", {}, "NeMo 26.06")
    assert r.matches("m", "gb200-nvl72", "MXFP8", {}, "NeMo 26.08")
    assert not r.matches("m", "gb200-nvl72", "MXFP8", {}, "NeMo 26.04.01")
    assert not r.matches("m", "gb200-nvl72", "MXFP8", {}, "")  # a release bound needs a stated release
    assert BridgeRecipe(models=("m",), gpus=(), features={}, source="s").matches("m", "h100", "BF16", {})
    window = BridgeRecipe(models=("m",), gpus=(), features={}, source="s", since="26.04", until="26.04")
    assert [window.matches("m", "b200", "", {}, f"NeMo {r}") for r in ("26.02.01", "26.04", "26.04.01", "26.06")] == [
        False, True, True, False]


def test_nemo_model_flops_is_nemos_llama2_formula(mofa_predictor):
    """NeMo's ``llama2`` formula, written the way NeMo writes it:
    gbs·s·L·h²·(12 + 12·g/a + 18·f/h + 12·s/h + 6·V/(L·h))."""
    from mofa_plugins.flops_conventions import nemo_flops as nemo_model_flops

    m = mofa_predictor.registry.model("llama2-7b")  # L 32, h 4096, a = g = 32, f 11008, V 32000
    gbs, s, L, h = 4, 1048576, 32, 4096
    want = gbs * s * L * h * h * (12 + 12 * 32 / 32 + 18 * 11008 / h + 12 * s / h + 6 * 32000 / (L * h))
    assert nemo_model_flops(m, gbs, s) == pytest.approx(want, rel=1e-12)
    g3 = mofa_predictor.registry.model("gpt3-175b")  # NeMo's gpt3: (24·B·s·h² + 4·B·s²·h)·3L + 6·B·s·h·V
    B, s, L, h, V = 8, 2048, 96, 12288, g3.vocab_size
    assert nemo_model_flops(g3, B, s) == pytest.approx((24 * B * s * h * h + 4 * B * s * s * h) * 3 * L
                                                       + 6 * B * s * h * V, rel=1e-12)


def test_nemo_formula_reproduces_nemos_own_tflops_and_derives_long_context_steps():
    """On NeMo 24.07's rows, which publish both tokens/s and model TFLOPS, the formula turns the
    step time back into NeMo's TFLOPS; the long-context table (TFLOPS only) gets its step time from
    it, on the layout the row states."""
    from mofa_framework.api import Predictor
    from mofa_framework.validate import map_rows
    from mofa_plugins.flops_conventions import nemo_flops as nemo_model_flops

    reg = Predictor().registry
    mapped, _ = map_rows([DATA / "nemo_2407.csv"], reg)
    # pretraining rows: NeMo counts its SFT / LoRA rows' FLOPs over the packed documents
    dense = [m for m in mapped if not reg.model(m.job["model"]["name"]).is_moe and m.measured_tflops
             and not m.job["parallel"].get("document_length")]
    assert len(dense) >= 20
    for m in dense:
        p = m.job["parallel"]
        flops = nemo_model_flops(reg.model(m.job["model"]["name"]), p["global_batch_size"], p["sequence_length"])
        tflops = flops / (m.measured_s * m.job["hardware"]["num_gpus"]) / 1e12
        assert tflops == pytest.approx(m.measured_tflops, rel=0.006), m.row_id
    mapped, skipped = map_rows([DATA / "nemo_long_context.csv"], reg)
    rows = {m.row_id: m for m in mapped}
    assert len(rows) == 28 and all(m.target.startswith("model_tflops_per_gpu") for m in mapped)
    # LLAMA2-7B, 1M tokens, TP 8 CP 32 DP 4 on 1,024 H100s at 536 TFLOPS/GPU
    m = rows["NEMO-LONGSEQ-032"]
    s = 1048576
    flops = 4 * s * 32 * 4096 ** 2 * (12 + 12 + 18 * 11008 / 4096 + 12 * s / 4096 + 6 * 32000 / (32 * 4096))
    assert m.measured_s == pytest.approx(flops / (536e12 * 1024), rel=1e-9)
    # B200 table: TP·PP·CP·DP is a quarter of the listed GPUs; the stated layout is predicted
    b = rows["NEMO-LONGSEQ-015"]
    assert b.job["hardware"]["num_gpus"] == 4 * 16 * 4 and "stated layout" in b.assumptions
    # the without-CP column states no layout: MoFa chooses one (see the next test), except where the
    # global batch leaves fewer micro-batches than stages on every layout — listed with the reason
    assert {s.row_id for s in skipped} == {f"NEMO-LONGSEQ-{i:03d}" for i in (12, 14, 29, 31, 33)}
    assert all("at least one micro-batch of 1 per pipeline stage" in s.reason for s in skipped)
    without_cp = [*range(2, 11, 2), *range(17, 28, 2)]  # B200: even rows; H100: odd rows
    assert all(rows[f"NEMO-LONGSEQ-{i:03d}"].variants and not rows[f"NEMO-LONGSEQ-{i:03d}"].fit
               for i in without_cp)


def test_layout_variants_hand_values():
    """The (TP, PP) layouts of an unstated-layout row, counted by hand: Llama 2 7B (32 heads,
    32 layers) on 16 H100s (scale-up domain 8), CP 1, global batch 256, micro-batch 1 — TP 1
    with PP 1…16, TP 2 with PP 1…8, TP 4 with PP 1…4, TP 8 with PP 1…2 (16 / (TP·PP) ≥ 1 data-
    parallel ranks, each with 256 / DP ≥ PP micro-batches): 5 + 4 + 3 + 2 = 14. At 256 GPUs with
    16 sequences no layout keeps a micro-batch per stage (TP·PP ≥ 16 puts 16 / DP = TP·PP / 16
    micro-batches on PP stages, fewer unless TP ≥ 16)."""
    from mofa_framework.api import Predictor
    from mofa_framework.measurements import layout_variants

    reg = Predictor().registry
    model, hw = reg.model("llama2-7b"), reg.hardware_profile("h100-sxm5-80gb")
    got = layout_variants(model, hw, 16, 1, 256, 1)
    assert sorted(got) == sorted([(1, 1), (1, 2), (1, 4), (1, 8), (1, 16), (2, 1), (2, 2), (2, 4), (2, 8),
                                  (4, 1), (4, 2), (4, 4), (8, 1), (8, 2)])
    assert layout_variants(model, hw, 256, 1, 16, 1) == []
    # CP takes its share of the GPUs first: 32 GPUs at CP 2 are the 16 above
    assert sorted(layout_variants(model, hw, 32, 2, 256, 1)) == sorted(got)


def test_unstated_layout_keeps_the_fastest_that_fits(mofa_predictor):
    """An unstated layout is settled to the fastest candidate that fits in memory, not the fastest
    of all: NeMo 24.03's Llama 2 7B on 4 H100s at 4K tokens and global batch 1,024 is fastest on
    TP 1 PP 1, which does not fit in 80 GB; TP 1 PP 2 does and is kept, its features following
    the layout (PP overlap on), and the note says how many layouts fit."""
    from mofa_framework.validate import map_rows, predict_prepared, prepare, resolve_unstated

    mapped, _ = map_rows([DATA / "nemo_long_context.csv"], mofa_predictor.registry)
    (m,) = [r for r in mapped if r.row_id == "NEMO-LONGSEQ-017"]
    trial = []
    for v in m.variants:
        par = {k: x for k, x in {**m.job["parallel"], **v}.items() if k != "features" and x is not None}
        trial.append(attrs.evolve(m, job={**m.job, "parallel": par, "features": v["features"]}, variants=()))
    groups, _ = prepare(trial, mofa_predictor)
    arrays = predict_prepared(groups, mofa_predictor, n_rows=len(trial))
    fits = arrays["fits"] > 0.5
    assert not fits.all() and fits.any()
    fastest_fit = min(np.flatnonzero(fits), key=lambda k: arrays["step_s"][k])
    assert arrays["step_s"].min() < arrays["step_s"][fastest_fit]  # the fastest of all does not fit
    (r,) = resolve_unstated([m], mofa_predictor)
    want = trial[fastest_fit].job["parallel"]
    assert (r.job["parallel"]["tp"], r.job["parallel"]["pp"]) == (want["tp"], want["pp"]) == (1, 2)
    assert "pp_overlap" in r.job["features"] and "tp_overlap" not in r.job["features"]
    assert not r.fit and not r.variants
    assert f"layout not stated: TP 1, PP 2, the fastest of the {int(fits.sum())} of {len(trial)} layouts" \
        in r.assumptions


def test_torchtitan_fsdp2_rows_are_fsdp_and_deepspeed_zero3_rows_are_deepspeeds():
    """torchtitan's FSDP2 ("ZeRO-3-like") rows map to the fsdp feature; DeepSpeed's ZeRO-3 rows
    (Narayanan Table 2) to the deepspeed_zero plugin at stage 3, in fp16 with unfused attention."""
    from mofa_framework.api import Predictor
    from mofa_framework.validate import map_rows

    reg = Predictor().registry
    mapped, skipped = map_rows([DATA / "torchtitan_dense.csv", DATA / "megatron_selene_a100.csv"], reg)
    titan = [m for m in mapped if m.source == "torchtitan_dense"]
    assert len(titan) == 18
    for m in titan:  # ZeRO-2 per step under a pipeline (see the next test), FSDP without
        want = "distributed_optimizer" if m.job["parallel"]["pp"] > 1 else "fsdp"
        assert want in m.job["features"], m.row_id
    assert not [s for s in skipped if s.source == "megatron_selene_a100"]
    zero3 = [m for m in mapped if "DeepSpeed ZeRO-3" in m.reference]
    assert len(zero3) == ZERO3_ROWS and all(m.source == "megatron_selene_a100" for m in zero3)
    for m in zero3:
        assert m.job["features"] == {"recompute": {"granularity": "full"}, "deepspeed_zero": {
            "stage": 3, "contiguous_gradients": False, "overlap_comm": "off", "prefetch_bucket_size": 0}}  # 2021's
        assert m.job["parallel"]["precision"] == "fp16" and m.job["parallel"]["flash_attention"] is False
    assert _dense_job(_dense_row(framework="Megatron-DeepSpeed", distributed_optimizer="ZeRO stage 1",
                                 derived_iter_time_s="5"), reg, "t").job["features"]["deepspeed_zero"] == {"stage": 1}


def test_a_deepspeed_zero_row_runs_only_what_deepspeed_runs(mofa_predictor):
    """A row naming DeepSpeed's ZeRO beside a Megatron-Core recipe (which turns on its TP, PP and CP
    overlaps) keeps none of them, and its CP is DeepSpeed-Ulysses: the row is predicted, not refused."""
    reg = mofa_predictor.registry
    row = _dense_row(framework="Megatron-Core + DeepSpeed", distributed_optimizer="ZeRO stage 1", tp="8", pp="5",
                     cp="2", n_gpus="160", global_batch="160", derived_iter_time_s="60")
    m = _dense_job(row, reg, "t")
    feats = m.job["features"]
    assert feats["deepspeed_zero"]["stage"] == 1 and "cp_a2a" in feats
    assert not set(feats) & set(reg.features["deepspeed_zero"].conflicts)
    assert mofa_predictor.predict(mofa_predictor.job(m.job))[0].step_time_s > 0


def test_gpu_descriptions_resolve_to_profiles(mofa_predictor):
    """Sources describe a GPU in many ways; the family token, then form factor and memory, pick
    the profile. No family token, or an unknown one: not guessed."""
    from mofa_framework.measurements import hardware_for as _lookup_hw

    reg = mofa_predictor.registry
    cases = {"H100 80GB HBM3 @700W": "h100-sxm5-80gb", "NVIDIA H100 80GB HBM3 (700 W)": "h100-sxm5-80gb",
             "H100 SXM 80GB": "h100-sxm5-80gb", "H100 PCIe": "h100-pcie-80gb",
             "H100 SXM 96GB HBM2e @500W (Grand Teton)": "h100-sxm-96gb-grandteton",
             "DGX A100": "a100-sxm4-80gb", "A100 40GB": "a100-sxm4-40gb", "GB200 NVL72": "gb200-nvl72",
             "B200": "b200-sxm-180gb", "Ampere GPUs": None, "A800": "a800-sxm4-80gb", "TPU v5p": None}
    for text, want in cases.items():
        got = _lookup_hw(reg, text)
        assert (got.name if got else None) == want, text


def _dense_row(**kw):
    row = {"row_id": "t", "source": "test", "model_name": "GPT 530B", "n_layers": "105", "hidden": "20480",
           "n_heads": "128", "n_kv_heads": "128", "ffn_hidden": "81920", "vocab": "51200", "seq_len": "2048",
           "gpu_type": "A100-SXM4-80GB", "n_gpus": "280", "tp": "8", "pp": "35", "vpp": "", "cp": "1",
           "micro_batch": "1", "global_batch": "280", "framework": "Megatron-LM", "measured_iter_time_s": "",
           "derived_iter_time_s": "", "measured_tflops_per_gpu": "", "mfu_pct": "", "peak_tflops_used": "",
           "throughput_value": "", "throughput_unit": "", "flops_convention": "", "precision": "bf16"}
    row.update(kw)
    return row


def test_dense_rows_without_a_time_derive_it_from_throughput_or_the_sources_flops_convention(mofa_predictor):
    """Hand-derived: 530B (l 105, h 20480, V 51200), s 2048, B 280 on 280 GPUs."""

    reg = mofa_predictor.registry
    B, s, L, h, V, n = 280, 2048, 105, 20480, 51200, 280
    job = lambda **kw: _dense_job(_dense_row(**kw), reg, "test")  # noqa: E731
    m = job(throughput_value="1000", throughput_unit="tokens/s/GPU")
    assert m.measured_s == pytest.approx(B * s / (1000 * n)) and m.target.startswith("throughput_value")
    m = job(throughput_value="2.5", throughput_unit="samples/s")
    assert m.measured_s == pytest.approx(B / 2.5)
    # Korthikanti eq. 7 model FLOPs from an MFU of 56 % of 312
    m = job(mfu_pct="56.0", peak_tflops_used="312", flops_convention="MFU: model FLOPs=72*B*L*s*h^2*(1+s/6h+v/12hL)")
    eq7 = 72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    assert m.measured_s == pytest.approx(eq7 / (0.56 * 312e12 * n), rel=1e-12)
    # Narayanan eq. 3 (counts the recompute forward) from reported TFLOPS
    m = job(measured_tflops_per_gpu="138", flops_convention="Megatron eq.3: F=96*B*s*l*h^2*(1+s/6h+V/16lh)")
    eq3 = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    assert m.measured_s == pytest.approx(eq3 / (138e12 * n), rel=1e-12)
    assert "megatron-2021" in m.target
    # 6·N·D (no attention term): N = per layer 4h² (QKV + O) + 8h² (MLP), plus the output layer h·V
    m = job(mfu_pct="50", peak_tflops_used="312", flops_convention="6ND (Kaplan)")
    six_nd = 6 * (L * 12 * h * h + h * V) * B * s
    assert m.measured_s == pytest.approx(six_nd / (0.5 * 312e12 * n), rel=1e-12) and m.target.endswith("(6nd FLOPs)")
    # "1,024" GPUs is a thousands separator; a row without its sequence length says so
    assert job(n_gpus="1,024", measured_iter_time_s="9").job["hardware"]["num_gpus"] == 1024
    assert job(seq_len="", measured_iter_time_s="9").reason == "seq_len not stated"
    # a convention MoFa does not know: listed with it
    skipped = job(measured_tflops_per_gpu="147", flops_convention="metaseq's own count")
    assert "does not recognise" in skipped.reason and "metaseq" in skipped.reason


def test_dense_rows_with_uneven_pipelines_put_a_layer_fewer_on_the_end_stages(mofa_predictor):
    """BLOOM: 70 layers on 12 stages, the embeddings counted as layers: 5 + 10·6 + 5."""

    m = _dense_job(_dense_row(model_name="BLOOM-like", n_layers="70", hidden="14336", n_heads="112",
                              n_kv_heads="112", ffn_hidden="57344",
                              vocab="250880", tp="4", pp="12", n_gpus="384", global_batch="2048", micro_batch="2",
                              measured_iter_time_s="104.7"), mofa_predictor.registry, "test")
    par = m.job["parallel"]
    assert (par["first_stage_layers"], par["last_stage_layers"]) == (5, 5)
    assert "pp_splits_layers" in m.ignore_constraints


def test_unstated_interleaving_is_resolved_to_the_fastest_factor(mofa_predictor):
    """Llama 3 405B on 8,192 H100s (TP 8, PP 16, DP 64, 32 sequences per DP rank): plain 1F1B
    would idle 15/47 of the step, so an unstated vpp is searched, and the factor kept is the
    fastest of the candidates as predicted one by one. A stated vpp, or a deep enough batch, is
    left alone. Llama 3's "ZeRO-2-like" FSDP keeps the parameters: the distributed optimizer with
    sharded gradients, not fsdp."""
    from mofa_framework.validate import prepare, predict_prepared, resolve_unstated

    reg = mofa_predictor.registry
    llama = dict(model_name="Llama 3 405B", n_layers="126", hidden="16384", n_heads="128", n_kv_heads="8",
                 ffn_hidden="53248", vocab="128000", seq_len="8192", gpu_type="H100 80GB HBM3 @700W", n_gpus="8192",
                 tp="8", pp="16", cp="1", global_batch="2048", micro_batch="", measured_tflops_per_gpu="430",
                 flops_convention="BF16 MFU, PaLM 6N + attention", framework="Meta",
                 distributed_optimizer="FSDP, ZeRO-2-like: shards optimizer states and gradients")
    m = _dense_job(_dense_row(**llama), reg, "test")
    assert m.job["features"]["distributed_optimizer"] == {"shard_gradients": True} and "fsdp" not in m.job["features"]
    # 126 layers: 1 (plain), 2 (63 per chunk pair... 126 = 16·2·4 − 2: uneven), 4 and 8 chunks per stage
    assert [v["vpp"] for v in m.variants] == [1, 2, 4, 8]
    (resolved,) = resolve_unstated([m], mofa_predictor)
    trial = []
    for v in m.variants:
        par = {k: x for k, x in {**m.job["parallel"], **v}.items() if x is not None}
        trial.append(attrs.evolve(m, job={**m.job, "parallel": par}, variants=()))
    groups, _ = prepare(trial, mofa_predictor)
    t = predict_prepared(groups, mofa_predictor, n_rows=len(trial))["step_s"]
    assert resolved.job["parallel"]["vpp"] == m.variants[int(np.nanargmin(t))]["vpp"] > 1
    assert "interleaving not stated" in resolved.assumptions and not resolved.variants
    stated = _dense_job(_dense_row(**{**llama, "vpp": "1"}), reg, "test")
    deep = _dense_job(_dense_row(**{**llama, "global_batch": "8192"}), reg, "test")  # 128 per pipeline ≥ 4·15
    assert not stated.variants and not deep.variants
    # the schedule column decides first: interleaved with no factor searches v ≥ 2 whatever the
    # batch; a plain "1F1B" is taken at its word
    inter = _dense_job(_dense_row(**{**llama, "global_batch": "8192", "pp_schedule": "interleaved 1F1B"}), reg, "t")
    plain = _dense_job(_dense_row(**{**llama, "pp_schedule": "1F1B"}), reg, "t")
    assert [v["vpp"] for v in inter.variants] == [2, 4, 8] and not plain.variants
    # DeepSpeed's pipeline engine cannot interleave (BLOOM's ramp-up: one micro-batch per pipeline)
    ds = _dense_job(_dense_row(**{**llama, "framework": "Megatron-DeepSpeed"}), reg, "t")
    assert not ds.variants and ds.job["parallel"]["vpp"] == 1


def test_nvidia_rows_with_no_interleaving_given_follow_the_same_rule(mofa_predictor):
    """An NVIDIA-schema row whose VP is blank or "n/a" with a pipeline too shallow in micro-batches
    for plain 1F1B (Megatron-Bridge 26.02.01's Llama 3 70B on GB300: PP 4, 8 micro-batches) gets
    the interleaving factors to resolve; a deep pipeline or a stated VP keeps its value."""

    reg = mofa_predictor.registry
    row = {"source_id": "t", "framework": "Megatron-Bridge", "release": "26.02.01", "task": "pretrain",
           "model": "LLAMA3_70B", "gpu_type": "GB300", "num_gpus": "64", "precision": "MXFP8", "gbs": "256",
           "mbs": "2", "seq_len": "8192", "tp": "1", "pp": "4", "cp": "1", "vp": "n/a", "ep": "", "etp": "",
           "step_time_s_derived": "6.83", "notes": ""}
    m = _nvidia_job(row, reg, "test")
    assert [v["vpp"] for v in m.variants] == [1, 2, 4, 5, 10, 20]  # 80 layers on 4 stages
    assert not _nvidia_job({**row, "vp": "5"}, reg, "test").variants
    assert not _nvidia_job({**row, "gbs": "1024"}, reg, "test").variants  # 32 micro-batches ≥ 4·3


def test_fsdp_rows_without_a_micro_batch_run_the_ranks_batch_at_once(mofa_predictor):
    """torchtitan (FSDP2, no pipeline): local batch 16 per FSDP rank is one micro-batch of 16, so
    the parameters are gathered once per step, not 16 times."""

    m = _dense_job(_dense_row(model_name="LLAMA3-70B", framework="torchtitan", gpu_type="H100 SXM 96GB HBM2e @500W",
                              n_gpus="256", tp="8", pp="1", global_batch="512", micro_batch="", seq_len="8192",
                              distributed_optimizer="FSDP2 (ZeRO-3-like)", derived_iter_time_s="19.764"),
                   mofa_predictor.registry, "test")
    assert "fsdp" in m.job["features"] and m.job["parallel"]["micro_batch_size"] == 16
    # under a pipeline torchtitan keeps FSDP2's parameters gathered and its gradients unreduced
    # across micro-batches, accumulated unsharded in fp32: one gather and one reduce-scatter per
    # step and a whole fp32 gradient buffer, the distributed optimizer's (ZeRO-1) — not ZeRO-2's shards
    m = _dense_job(_dense_row(model_name="LLAMA3.1-405B", framework="torchtitan", gpu_type="H100 SXM 96GB HBM2e @500W",
                              n_gpus="512", tp="8", pp="8", global_batch="256", micro_batch="", seq_len="8192",
                              distributed_optimizer="FSDP2 (ZeRO-3-like)", derived_iter_time_s="40.96"),
                   mofa_predictor.registry, "test")
    assert m.job["features"]["distributed_optimizer"] == {} and "fsdp" not in m.job["features"]


def test_torchtitan_pipelines_run_its_defaults_when_the_row_states_none(mofa_predictor):
    """torchtitan at 9dec370 (2024-12-26; ``build_pipeline_schedule``): an unset
    ``pipeline_parallel_microbatches`` is the PP degree, so the 405B table's local batch of 32 on 8
    stages runs micro-batches of 4; its looped schedules build two stages per rank
    (``generate_split_points``: 7 + 14 × 8 + 7 layers, 15 on each end rank). From pytorch/torchtitan
    #1073 (2025-04-07) the default is a micro-batch of one sequence."""
    row = lambda **kw: _dense_row(**{  # noqa: E731
        "model_name": "LLAMA3.1-405B", "framework": "torchtitan (PyTorch FSDP2/DTensor)",
        "gpu_type": "H100 SXM 96GB HBM2e @500W", "n_gpus": "512", "tp": "8", "pp": "8", "global_batch": "256",
        "micro_batch": "", "seq_len": "8192", "n_layers": "126", "hidden": "16384", "n_heads": "128",
        "n_kv_heads": "8", "ffn_hidden": "53248", "vocab": "128256", "recompute": "full",
        "distributed_optimizer": "FSDP2 ZeRO-3", "derived_iter_time_s": "40.96",
        "notes": "torch 1963fc8 (2024-12-23), torchao eab345c, torchtitan 9dec370 (2024-12-26)", **kw})
    reg = mofa_predictor.registry
    m = _dense_job(row(pp_schedule="1F1B"), reg, "test")
    assert m.job["parallel"]["micro_batch_size"] == 4 and m.job["parallel"]["vpp"] == 1
    m = _dense_job(row(pp_schedule="Interleaved 1F1B"), reg, "test")
    par = m.job["parallel"]
    assert (par["micro_batch_size"], par["vpp"], par["first_stage_layers"], par["last_stage_layers"]) == (4, 2, 15, 15)
    assert not m.variants
    later = row(pp_schedule="1F1B")
    later["notes"] = "torchtitan 820504e (2025-06-14)"
    assert _dense_job(later, reg, "test").job["parallel"]["micro_batch_size"] == 1
    # the release month in the framework column (the torchtitan_dense twin of the same table)
    twin = row(pp_schedule="1F1B", notes="", framework="torchtitan (2024-12, torch 1963fc8)")
    assert _dense_job(twin, reg, "test").job["parallel"]["micro_batch_size"] == 4
    undated = row(pp_schedule="1F1B", notes="")
    assert _dense_job(undated, reg, "test").job["parallel"]["micro_batch_size"] == 1
    assert _dense_job(row(pp_schedule="1F1B", micro_batch="2"), reg, "test").job["parallel"]["micro_batch_size"] == 2
    # Megatron's default stays one sequence
    meg = row(pp_schedule="1F1B", framework="Megatron-LM")
    assert _dense_job(meg, reg, "test").job["parallel"]["micro_batch_size"] == 1


def test_torchtitan_pipeline_stage_holds_gathered_weights_and_a_whole_fp32_gradient_buffer(mofa_predictor):
    """torchtitan's Llama 3.1 405B on 512 H100s (TP 8, PP 8, FSDP 8; its 2024-12 benchmark table):
    under the pipeline FSDP2 keeps the stage's parameters gathered and accumulates its unreduced
    gradients unsharded in fp32 (``FSDPParam.to_accumulated_grad_if_needed``); only the fp32 master
    copy and Adam's moments stay sharded. Hand-derived for a 16-layer stage: a layer holds
    (2·h² + 2·h·1024 + 3·h·53248)/8 + 2·h parameters at h = 16384 (Q and O, K and V of 8 KV heads,
    the SwiGLU MLP, TP 8; the two norms whole), 6.376 G on the stage: bf16 weights 2 B, gradients
    4 B, optimizer states 12 B over the 8 FSDP ranks, per parameter."""
    m = _dense_job(_dense_row(model_name="LLAMA3.1-405B", framework="torchtitan", gpu_type="H100 SXM 96GB HBM2e @500W",
                              n_gpus="512", tp="8", pp="8", global_batch="256", micro_batch="", seq_len="8192",
                              n_layers="126", hidden="16384", n_heads="128", n_kv_heads="8", ffn_hidden="53248",
                              vocab="128256", recompute="full", distributed_optimizer="FSDP2 (ZeRO-3-like)",
                              derived_iter_time_s="40.96"),
                   mofa_predictor.registry, "test")
    mem = mofa_predictor.predict(mofa_predictor.job(m.job))[0].memory_breakdown
    h = 16384
    stage = 16 * ((2 * h * h + 2 * h * 1024 + 3 * h * 53248) / 8 + 2 * h)
    assert mem["gradients"] == pytest.approx(4 * stage / 2**30, rel=1e-3)  # 23.75 GiB (ZeRO-2's shard: 2.97)
    assert mem["weights"] == pytest.approx(2 * stage / 2**30, rel=1e-3)
    assert mem["optimizer_states"] == pytest.approx(12 * stage / 8 / 2**30, rel=1e-3)


def test_torchtitan_selective_layer_ac_is_full_recompute_of_every_other_block(mofa_predictor):
    """torchtitan's "selective layer" AC (``selective_ac_option = "2"``, its config_manager default)
    wraps every 2nd block in a full checkpoint: 40 layers of Llama 2 13B → 20 fully recomputed; its
    "selective op" is the per-op policy; a Megatron row's "selective" stays Megatron's."""

    kw = dict(model_name="Llama 2 13B", n_layers="40", hidden="5120", n_heads="40", n_kv_heads="40",
              ffn_hidden="13824", vocab="32000", gpu_type="A100 80GB", n_gpus="64", tp="1", pp="1",
              global_batch="128", micro_batch="2", seq_len="4096", distributed_optimizer="FSDP2 ZeRO-3",
              derived_iter_time_s="1")
    job = lambda rec, fw="torchtitan (PyTorch FSDP2/DTensor)": _dense_job(  # noqa: E731
        _dense_row(framework=fw, recompute=rec, **kw), mofa_predictor.registry, "test").job["features"]["recompute"]
    assert job("selective (layer)") == {"granularity": "full", "num_layers": 20}
    assert job("selective (layer, every 4th)") == {"granularity": "full", "num_layers": 10}
    assert job("selective (op)") == {"granularity": "op"}
    assert job("selective", fw="Megatron-LM") == {"granularity": "selective"}


def test_fsdp_shard_grad_op_is_fsdp_without_reshard(mofa_predictor):
    """PyTorch FSDP's SHARD_GRAD_OP (llm-foundry's "FSDP ZeRO-2 (SHARD_GRAD_OP)") unshards before the
    forward and reshards only after the backward (PyTorch's ShardingStrategy doc): ``fsdp`` with
    ``reshard_after_forward = false``, gradients reduce-scattered in fp32 unless the row says PURE."""

    kw = dict(model_name="MPT 1B", n_layers="24", hidden="2048", n_heads="16", n_kv_heads="16",
              ffn_hidden="8192", vocab="50368", gpu_type="H100 80GB", n_gpus="128", tp="1", pp="1",
              global_batch="1536", micro_batch="12", seq_len="2048", derived_iter_time_s="1",
              framework="Composer / llm-foundry (PyTorch FSDP)", distributed_optimizer="FSDP ZeRO-2 (SHARD_GRAD_OP)")
    feats = _dense_job(_dense_row(notes="fsdp_mixed_precision=DEFAULT", **kw), mofa_predictor.registry, "t").job["features"]
    assert feats["fsdp"] == {"reshard_after_forward": False} and "distributed_optimizer" not in feats
    feats = _dense_job(_dense_row(notes="mixed_precision=PURE", **kw), mofa_predictor.registry, "t").job["features"]
    assert feats["fsdp"] == {"grad_reduce_dtype": "bf16", "reshard_after_forward": False}


def test_megatron_core_era_dense_rows_get_the_recipe_their_nvidia_schema_twins_get(mofa_predictor):
    """A dense row from a Megatron-Core-era stack (NeMo, Megatron-Bridge, the Megatron-Core README)
    gets what the NVIDIA schema's mapper applies to the same runs; a 2021 Megatron-LM row does not."""

    reg = mofa_predictor.registry
    kw = dict(tp="8", pp="4", cp="2", n_gpus="128", global_batch="256", derived_iter_time_s="10")
    want = {"distributed_optimizer", "dp_overlap", "tp_overlap", "pp_overlap", "cp_overlap"}
    for fw, dopt in (("Megatron-Core r0.8.0", ""), ("Megatron-Bridge / NeMo 26.02", "DDP (dist. optimizer not stated)"),
                     ("NeMo 24.07 (Megatron-Core)", "")):
        m = _dense_job(_dense_row(framework=fw, distributed_optimizer=dopt, **kw), reg, "test")
        assert set(m.job["features"]) == want, fw
    fsdp = _dense_job(_dense_row(framework="Megatron-Bridge", distributed_optimizer="FSDP (Megatron-FSDP)", **kw),
                      reg, "test")
    assert "fsdp" in fsdp.job["features"] and "distributed_optimizer" not in fsdp.job["features"]
    old = _dense_job(_dense_row(framework="Megatron-LM (2021, commit 6985e58)", distributed_optimizer="n", **kw),
                     reg, "test")
    assert not {"distributed_optimizer", "tp_overlap", "pp_overlap", "cp_overlap"} & set(old.job["features"])


def test_megascale_rows_get_its_overlaps_and_say_what_is_not_modelled(mofa_predictor):
    """MegaScale (§3.2) overlaps DP, PP and TP communication and (§3.1) runs the parallel transformer
    block; its Megatron-LM baseline rows do neither."""

    reg = mofa_predictor.registry
    kw = dict(tp="8", pp="8", n_gpus="12288", global_batch="6144", mfu_pct="55.2", vpp="6",
              flops_convention="6N + 12lhs (MegaScale)", distributed_optimizer="")
    ms = _dense_job(_dense_row(framework="MegaScale", **kw), reg, "test")
    assert {"distributed_optimizer", "dp_overlap", "tp_overlap", "pp_overlap"} <= set(ms.job["features"])
    assert "parallel transformer block applied" in ms.assumptions and "sliding-window" in ms.assumptions
    assert ms.job["model"]["parallel_attention_mlp"] is True
    # the MFU's peak is not stated: the A100's dense BF16 peak, said in the target column
    assert ms.target == "mfu_pct, peak 312 assumed (palm FLOPs)"
    with_peak = _dense_job(_dense_row(framework="MegaScale", **{**kw, "peak_tflops_used": "312"}), reg, "test")
    assert with_peak.target == "mfu_pct (palm FLOPs)" and with_peak.measured_s == pytest.approx(ms.measured_s)
    base = _dense_job(_dense_row(framework="Megatron-LM commit 285068c8 (baseline)", **kw), reg, "test")
    assert not {"tp_overlap", "pp_overlap"} & set(base.job["features"]) and not base.assumptions
    assert "parallel_attention_mlp" not in base.job["model"]


def test_a_row_that_names_flash_attention_decides_it(mofa_predictor):

    reg = mofa_predictor.registry
    flash = lambda **kw: _dense_job(_dense_row(derived_iter_time_s="1", **kw), reg, "t").job["parallel"]["flash_attention"]  # noqa: E731
    assert flash(framework="Megatron-LM commit 285068c8") is True  # 2023+: fused attention by default
    assert flash(framework="Megatron-DeepSpeed") is False  # 2021–22 stacks: unfused
    assert flash(framework="Megatron-DeepSpeed", notes="with FlashAttention-2") is True
    assert flash(framework="Megatron-LM commit 285068c8", notes="baseline without flash attention") is False


def test_moe_rows_without_an_etp_run_experts_unsharded_and_dispatchers_are_read_however_phrased(mofa_predictor):
    """Megatron-Bridge's MoE recipes and the MoE model zoo set --expert-tensor-parallel-size 1:
    an unstated ETP is 1 even where Megatron-Core's default (= TP) would fold (DeepSeek-V3 on 1,024
    H100s, TP 2 × EP 64 = 128 ranks per stage). "dispatcher DeepEP" and "HybridEP dispatcher" name
    the flex dispatcher as "dispatcher=DeepEP" does; a stated all-to-all does not."""
    from mofa_framework.validate import map_rows

    mapped, _ = map_rows([DATA / "nvidia_megatron_bridge.csv", DATA / "megatron_core_moe.csv"], mofa_predictor.registry)
    rows = {m.row_id: m.job for m in mapped}
    assert rows["MB-ARC-272"]["parallel"]["etp"] == 1 and rows["MB-ARC-272"]["parallel"]["tp"] == 2
    assert rows["MCORE-MZOO-001"]["features"]["flex_dispatcher"] == {"backend": "deepep"}  # "dispatcher=DeepEP"
    assert "flex_dispatcher" not in rows["MCORE-MZOO-004"]["features"]  # "dispatcher=A2A"

    raw = {"source_id": "x", "model": "Qwen3-235B-A22B", "gpu_type": "H100", "num_gpus": "256", "gbs": "2048",
           "mbs": "1", "seq_len": "4096", "tp": "2", "pp": "8", "ep": "32", "step_time_s": "20",
           "precision": "BF16", "framework": "Megatron-Core"}
    for notes in ("forced balance; dispatcher DeepEP", "HybridEP dispatcher; forced load balancing"):
        job = _nvidia_job({**raw, "notes": notes}, mofa_predictor.registry, "t").job
        assert "flex_dispatcher" in job["features"], notes


def test_calibrate_resolves_an_unstated_interleaving_as_validate_does(mofa_predictor):
    """Rows handed to calibrate (as the CLI does) get the factor validate would choose: the error
    before fitting is the error validate reports."""
    from mofa_framework.calibrate import calibrate
    from mofa_framework.validate import resolve_unstated

    reg = mofa_predictor.registry
    llama = dict(model_name="Llama 3 405B", n_layers="126", hidden="16384", n_heads="128", n_kv_heads="8",
                 ffn_hidden="53248", vocab="128000", seq_len="8192", gpu_type="H100", tp="8", pp="16", cp="1",
                 micro_batch="", flops_convention="PaLM 6N + attention", framework="Meta",
                 distributed_optimizer="ZeRO-2-like")
    rows = [_dense_job(_dense_row(**llama, n_gpus=str(n), global_batch="2048", measured_tflops_per_gpu=str(t)),
                       reg, "t") for n, t in ((8192, 430), (16384, 400))]
    assert all(r.variants for r in rows)
    resolved = resolve_unstated(rows, mofa_predictor)
    res = calibrate([], "h100-sxm5-80gb", mofa_predictor, parameters=["gemm_efficiency"], folds=0, mapped=rows)
    from mofa_framework.validate import predict_prepared, prepare

    groups, _ = prepare(resolved, mofa_predictor)
    t = predict_prepared(groups, mofa_predictor, n_rows=len(resolved))["step_s"]
    want = np.mean([abs(p / r.measured_s - 1) for p, r in zip(t, resolved)])
    assert res.before.mape == pytest.approx(want, rel=1e-9)


def test_a_dense_row_that_states_another_architecture_than_the_zoo_model_gets_its_own(mofa_predictor):
    """MegaScale's "175B": the zoo's GPT-3 175B with 128 heads and a 64,000 vocabulary, as the row
    states; a vocabulary within padding of the zoo's (50,257 vs 51,200) is the zoo's."""

    reg = mofa_predictor.registry
    kw = dict(model_name="GPT-3 175B", n_layers="96", hidden="12288", ffn_hidden="49152", tp="8", pp="8",
              n_gpus="256", global_batch="768", derived_iter_time_s="40")
    m = _dense_job(_dense_row(**kw, n_heads="128", n_kv_heads="128", vocab="64000"), reg, "t")
    assert m.job["model"] == {"name": "gpt3-175b", "num_attention_heads": 128, "num_kv_heads": 128, "vocab_size": 64000}
    m = _dense_job(_dense_row(**kw, n_heads="96", n_kv_heads="96", vocab="50257"), reg, "t")
    assert m.job["model"] == {"name": "gpt3-175b"}


def test_a_throughput_unit_that_is_not_a_rate_is_not_read_as_one(mofa_predictor):
    """"M tokens per batch" is a batch size, not a rate: the row falls back to its MFU (here 6ND),
    or, with none, is listed with that reason; "M tokens/s" (all GPUs) is a rate of 10⁶ tokens."""
    reg = mofa_predictor.registry
    B, s, L, h, V, n = 280, 2048, 105, 20480, 51200, 280
    batch = dict(throughput_value="0.57", throughput_unit="M tokens per batch")
    m = _dense_job(_dense_row(**batch, mfu_pct="50", peak_tflops_used="312", flops_convention="6ND"), reg, "t")
    assert m.target == "mfu_pct (6nd FLOPs)"
    assert m.measured_s == pytest.approx(6 * (L * 12 * h * h + h * V) * B * s / (0.5 * 312e12 * n), rel=1e-12)
    skipped = _dense_job(_dense_row(**batch), reg, "t")
    assert "'M tokens per batch' is not a rate" in skipped.reason and "no TFLOPS or MFU" in skipped.reason
    m = _dense_job(_dense_row(throughput_value="0.5", throughput_unit="M tokens/s"), reg, "t")
    assert m.measured_s == pytest.approx(B * s / 0.5e6)


def test_reduced_layer_proxy_rows_are_predicted_with_the_layers_their_notes_state(mofa_predictor):
    """A 405B recipe run with 32 layers (notes say so) is the zoo model with ``num_layers = 32``; a
    proxy whose notes give no layer count is listed with that reason."""
    from mofa_framework.validate import prepare

    import csv

    row = next(r for r in csv.DictReader((DATA / "nvidia_megatron_bridge.csv").open()) if r["source_id"] == "MB-ARC-015")
    assert row["model"] == "LLAMA3.1_405B"  # 126 layers, TP 4 PP 8 VP 4 on 256 GB300s
    proxy = {**row, "num_gpus": "64", "gbs": "384", "notes": "reduced-layer proxy of the 405B recipe: 32 layers "
                                                                "(of 126) on 64 GPUs"}
    m = _nvidia_job(proxy, mofa_predictor.registry, "t")
    assert m.job["model"] == {"name": "llama3.1-405b", "num_layers": 32} and "32 layers" in m.assumptions
    groups, infeasible = prepare([m], mofa_predictor)
    assert not infeasible and groups[0].model.num_layers == 32
    full = _nvidia_job(row, mofa_predictor.registry, "t")
    assert full.job["model"] == {"name": "llama3.1-405b"}
    vague = _nvidia_job({**proxy, "notes": "proxy run at small scale"}, mofa_predictor.registry, "t")
    assert "layer count the row does not state" in vague.reason


def test_a_dense_row_that_states_its_context_parallel_form_gets_it(mofa_predictor):
    """Ulysses / cp_comm_type a2a → the all-to-all form; Llama 3's all-gather-based CP → the ring's
    bytes, unhidden; a Megatron-Core row that says nothing keeps the recipe's ring with its overlap."""
    reg = mofa_predictor.registry
    kw = dict(model_name="Llama 3 8B", n_layers="32", hidden="4096", n_heads="32", n_kv_heads="8",
              ffn_hidden="14336", vocab="128256", seq_len="65536", n_gpus="32", tp="2", pp="1", cp="4",
              global_batch="8", framework="Megatron-Core 0.12", derived_iter_time_s="10")
    plain = _dense_job(_dense_row(**kw), reg, "test")
    ulysses = _dense_job(_dense_row(**kw, notes="DeepSpeed-Ulysses sequence parallelism over the CP group"), reg,
                         "test")
    a2a = _dense_job(_dense_row(**kw, notes="--cp-comm-type a2a"), reg, "test")
    gather = _dense_job(_dense_row(**kw, notes="all-gather based context parallelism (Llama 3)"), reg, "test")
    assert "cp_overlap" in plain.job["features"] and "cp_a2a" not in plain.job["features"]
    for row in (ulysses, a2a):
        assert "cp_a2a" in row.job["features"] and "cp_overlap" not in row.job["features"]
    assert not {"cp_a2a", "cp_overlap"} & set(gather.job["features"])


def test_the_gb200_guide_steps_carry_the_guides_recompute_and_graphs():
    """Megatron-Core's DeepSeek-V3 GB200 guide: `mlp up_proj` recompute until "Remove up_proj
    recompute", `mlp moe_act` after; per-module CUDA graphs (attn, moe_router, moe_preprocess) from
    "CUDA Graphs", the shared experts too from "CUDA Graphs capture shared expert"."""
    from mofa_framework.api import Predictor
    from mofa_framework.validate import map_rows

    mapped, _ = map_rows([DATA / "megatron_core_moe.csv"], Predictor().registry)
    steps = {int(m.row_id[-3:]): m.job["features"] for m in mapped if m.row_id.startswith("MCORE-DSV3GB200")}
    assert len(steps) == 13
    for n, f in steps.items():
        rec = f["recompute"]
        assert rec["mlp"] and rec.get("mla_up_proj", False) == (n <= 4) and rec.get("moe_act", False) == (n >= 5)
        graphs = f.get("cuda_graphs")
        assert (graphs is not None) == (n >= 6)
        if graphs:
            assert graphs["attn"] and graphs["moe_router"] and graphs["moe_preprocess"] and graphs["mlp"] == (n >= 10)


def test_deepseek_v3_rows_run_the_pipeline_layouts_their_sources_give():
    """Megatron-Bridge's DeepSeek-V3 rows take its recipes' layout for their pp·vpp stages (B200 PP 16:
    "Et*4|(t*4|)*14tmL", 4 + 14 × 4 + 1 layers; GB200 PP 4 VP 4: the same 16 stages, 16 / 16 / 13);
    the GB200 guide's rows the layout their notes state ("Et|(tt|)*30L" on PP 8: 7 / 8 / 6)."""
    from mofa_framework.api import Predictor
    from mofa_framework.validate import map_rows

    p = Predictor()
    mapped, _ = map_rows([DATA / "nvidia_megatron_bridge.csv", DATA / "megatron_core_moe.csv"], p.registry)
    rows = {m.row_id: m for m in mapped}
    for rid, layout, ends in (("MB-ARC-119", "Et*4|(t*4|)*14tmL", (4, 1, 1)), ("MB-CUR-002", "Et*4|(t*4|)*14tmL", (16, 13, 4)),
                              ("MCORE-DSV3GB200-013", "Et|(tt|)*30L", (7, 6, 4))):
        assert rows[rid].job["parallel"]["pipeline_layout"] == layout
        par = p.job(rows[rid].job).parallel
        assert (par.first_stage_layers, par.last_stage_layers, par.vpp) == ends
    assert "pipeline_layout" not in rows["MB-ARC-121"].job["parallel"]  # GPT-OSS: PP 1, no layout
    assert "set_deepseek_v3_pipeline_model_parallel_layout" in rows["MB-ARC-119"].assumptions  # where it came from
    assert "pipeline layout" not in rows["MCORE-DSV3GB200-013"].assumptions  # stated by the row itself


def test_kimi_k2_rows_run_megatron_bridges_layout_and_preset():
    """Megatron-Bridge's Kimi-K2 rows (GB300, PP 4 × VP 4, MBS 2, GBS 4096) run its recipe's layout
    for (4, 4) — the embedding and 4 layers first, 14 × 4, then 1 layer and the loss: 16 / 16 / 13 per
    rank in 4 chunks — and its preset's HybridEP dispatcher and mla_up_proj recompute; the
    assumptions cite both."""
    from mofa_framework.api import Predictor
    from mofa_framework.validate import map_rows

    p = Predictor()
    mapped, _ = map_rows([DATA / "nvidia_megatron_bridge.csv"], p.registry)
    kimi = [m for m in mapped if m.job["model"]["name"] == "kimi-k2"]
    assert len(kimi) == 4
    for m in kimi:
        assert m.job["parallel"]["pipeline_layout"] == "Et*4|(t*4|)*14tL"
        par = p.job(m.job).parallel
        assert (par.first_stage_layers, par.last_stage_layers, par.vpp) == (16, 13, 4)
        assert m.job["features"]["flex_dispatcher"] == {"backend": "hybridep"}
        assert m.job["features"]["recompute"]["mla_up_proj"] is True
        assert "_get_kimi_k2_pipeline_layout" in m.assumptions


def test_a_job_measured_more_than_once_is_one_strategy_in_the_ranking():
    """Group g: job A predicted 1.0 s/seq and measured three times (1.0, 1.2, 1.1: median 1.1), B
    predicted 2.0 measured 2.0, C predicted 3.0 measured 1.5. Three strategies: measured ranks
    (0, 2, 1) against predicted (0, 1, 2), Σd² = 2, ρ = 1 − 6·2/(3·8) = 0.5; the predicted best (A)
    is the measured best at its median: regret 0. Group h, one job measured four times and one
    other, has two strategies: not ranked."""
    from types import SimpleNamespace

    from mofa_framework.validate import rank_stats, strategies

    row = lambda g, p, m: SimpleNamespace(group=("src", g), predicted_s_per_seq=p, measured_s_per_seq=m)  # noqa: E731
    g = [row("g", 1.0, 1.0), row("g", 1.0, 1.2), row("g", 1.0 * (1 + 1e-12), 1.1), row("g", 2.0, 2.0),
         row("g", 3.0, 1.5)]
    h = [row("h", 5.0, m) for m in (5.0, 5.5, 6.0, 4.0)] + [row("h", 6.0, 6.0)]
    assert strategies(g) == ([1.1, 2.0, 1.5], [1.0, 2.0, 3.0])
    stats = rank_stats(g + h)
    assert stats.groups == 1 and stats.spearman == {"g": pytest.approx(0.5)}
    assert stats.regret == {"g": pytest.approx(0.0)}


def test_rows_that_ran_but_are_predicted_over_memory_are_counted():
    """Each measured row is a run that completed, so a row predicted not to fit is a memory
    over-estimate: three rows, one over the HBM, count 1 in their source and 1 in total, whatever
    their memory column says."""
    from mofa_framework.validate import RowResult, summarize

    def row(fits, memory=None):
        return RowResult(source="s", reference="r", row_id="1", model="m", hardware="h", num_gpus=8, strategy="TP1",
                         target="t", measured_s=1.0, predicted_s=1.1, error=0.1, measured_tflops=None,
                         predicted_tflops_source_convention=None, predicted_model_tflops=1.0,
                         tflops_convention="", measured_memory_gib=memory, predicted_memory_gib=90.0,
                         fits_in_memory=fits)

    s = summarize("s", [row(True), row(False), row(True, memory=70.0)], [])
    assert s.ran_over_memory == 1
    assert summarize("s", [], []).ran_over_memory == 0


def test_measured_runs_predicted_over_memory_only_become_fewer(calibration_result):
    """A ratchet on the one-sided memory check (docs/validation.md, *Runs that ran, predicted not
    to fit*): 78 of the calibration set's 1,973 predicted rows (runs that completed) are predicted
    not to fit on 2026-11-28; the memory model may only come closer."""
    assert calibration_result.overall.ran_over_memory <= RAN_OVER_MEMORY
    assert sum(s.ran_over_memory for s in calibration_result.sources) == calibration_result.overall.ran_over_memory


def test_a_row_without_tp_is_a_tuned_layout_not_tp_1(tmp_path, mofa_predictor):
    """An NVIDIA-schema row with no TP is read as the layout a tuned run would use, whatever its
    notes say: its candidates are :func:`layout_variants`'s (here Llama 3 70B on 64 H100s at global
    batch 128: TP 1–8 × PP 1–8 where 64 / (TP·PP) data-parallel ranks leave ≥ PP micro-batches),
    a stated PP is kept, and the row is predicted on the fastest that fits, never fitted."""
    from mofa_framework.validate import map_rows, resolve_unstated
    from mofa_framework.measurements import layout_variants

    head = ("source_id,release,framework,task,model,system,gpu_type,num_gpus,precision,gbs,mbs,seq_len,fsdp,tp,pp,"
            "cp,vp,ep,etp,dp,ga,step_time_s,notes\n")
    rows = ["A,r,NeMo,pretrain,LLAMA3-70B,DGX-H100,H100,64,BF16,128,1,8192,,,,1,,,,,,20.0,\n",
            "B,r,NeMo,pretrain,LLAMA3-70B,DGX-H100,H100,64,BF16,128,1,8192,,,4,1,,,,,,20.0,\n"]
    p = tmp_path / "nvidia.csv"
    p.write_text(head + "".join(rows))
    reg = mofa_predictor.registry
    (a, b), skipped = map_rows([p], reg)
    assert not skipped and not a.fit and not b.fit
    want = layout_variants(reg.model("llama3-70b"), reg.hardware_profile("h100-sxm5-80gb"), 64, 1, 128, 1)
    assert [(v["tp"], v["pp"]) for v in a.variants] == want and (8, 8) in want and (1, 1) in want
    assert [(v["tp"], v["pp"]) for v in b.variants] == [(t, q) for t, q in want if q == 4]
    ra, rb = resolve_unstated([a, b], mofa_predictor)
    assert ra.job["parallel"]["tp"] > 1 and rb.job["parallel"]["pp"] == 4  # 70B does not fit on TP 1
    assert "layout not stated" in ra.assumptions and "layouts that fit in memory" in ra.assumptions


def test_a_stated_layout_that_leaves_a_stage_empty_is_one_row_not_predicted(tmp_path):
    """80 layers on PP 32 (the reader relaxes the divisibility rule for uneven real runs) cannot give
    every stage a layer: that row is listed as infeasible with the numbers, and the file's other rows
    are still predicted (it used to stop the whole validation with a plugin's invariant error)."""
    from mofa_framework.validate import validate

    head = ("source_id,release,framework,task,model,system,gpu_type,num_gpus,precision,gbs,mbs,seq_len,fsdp,tp,pp,"
            "cp,vp,ep,etp,dp,ga,step_time_s,notes\n")
    p = tmp_path / "nvidia.csv"
    p.write_text(head + "A,r,NeMo,pretrain,LLAMA3-70B,DGX-H100,H100,64,BF16,128,1,8192,,2,32,1,,,,,,20.0,\n"
                 "B,r,NeMo,pretrain,LLAMA3-70B,DGX-H100,H100,64,BF16,128,1,8192,,8,8,1,,,,,,20.0,\n")
    res = validate([p])
    assert [r.row_id for r in res.rows] == ["B"]
    (s,) = res.skipped
    assert s.row_id == "A" and s.kind == "infeasible" and "stages_hold_layers" in s.reason
    assert "-5 / 3 / -5" in s.reason


def test_a_megatron_plain_row_without_tp_is_searched_an_fsdp_one_is_tp_1(tmp_path, mofa_predictor):
    """Plain (dense) schema: a Megatron-family row with no TP or PP (Narayanan 2021's GPT 39.1B on
    512 A100s with its TP 8 / PP 2 blanked) is mapped on every layout it could have run — each
    candidate the reader's own mapping of the row at that TP and PP — and settled to the fastest
    that fits, never fitted; an FSDP row (llm-foundry) with no TP ran none: TP 1, no variants."""
    import csv
    import io

    from mofa_framework.validate import map_rows, resolve_unstated

    def rows_of(name):
        return list(csv.DictReader(io.StringIO((DATA / name).read_text())))

    selene = next(r for r in rows_of("megatron_selene_a100.csv") if r["model_name"] == "GPT 39.1B")
    foundry = next(r for r in rows_of("llm_foundry.csv") if r["n_gpus"] and int(r["n_gpus"]) >= 8)
    for name, r in (("selene.csv", selene), ("foundry.csv", foundry)):
        out = io.StringIO()
        w = csv.DictWriter(out, fieldnames=list(r))
        w.writeheader()
        w.writerow({**r, "tp": "", "pp": "" if name == "selene.csv" else r["pp"]})
        (tmp_path / name).write_text(out.getvalue())
    reg = mofa_predictor.registry
    (m,), _ = map_rows([tmp_path / "selene.csv"], reg)
    # by hand: 48 layers split by PP 1…16, 64 heads by TP 1…8; 512 / (TP·PP) ranks of 4-sequence
    # micro-batches leave 1536 / (4·DP) = 0.75·TP·PP of them, whole and ≥ PP: TP ≥ 2, 4 | TP·PP
    want = [(2, 2), (2, 4), (2, 8), (2, 16), *[(t, q) for t in (4, 8) for q in (1, 2, 4, 8, 16)]]
    assert not m.fit and m.job["parallel"]["micro_batch_size"] == 4
    assert sorted((v["tp"], v["pp"]) for v in m.variants) == want
    (r,) = resolve_unstated([m], mofa_predictor)
    assert "layout not stated" in r.assumptions and not r.variants
    (f,), _ = map_rows([tmp_path / "foundry.csv"], reg)
    assert f.job["parallel"]["tp"] == 1 and not f.variants and f.fit


def test_nvidia_rows_with_only_a_throughput_derive_the_step_from_it(tmp_path, mofa_predictor):
    """A row giving tokens/s per GPU (or in total) but no step time: step = global batch × sequence /
    the rate, exact (no FLOPs convention), and preferred to the row's TFLOPS. Hand values: Llama 3 8B,
    8 GPUs, 128 × 8192 tokens at 26,006 tokens/s/GPU → 1,048,576 / 208,048 = 5.0400 s."""
    from mofa_framework.validate import map_rows

    head = ("source_id,release,framework,task,model,system,gpu_type,num_gpus,precision,gbs,mbs,seq_len,fsdp,tp,pp,"
            "cp,vp,ep,etp,dp,ga,tokens_per_sec_per_gpu,total_tokens_per_sec,model_tflops_per_gpu,notes\n")
    p = tmp_path / "nvidia.csv"
    p.write_text(head + "A,NeMo 25.02,NeMo 2.0,pretrain,LLAMA3-8B,DGX-B200,B200,8,FP8,128,2,8192,,1,1,1,1,1,,,8,"
                        "26006,,1506,\n"
                        "B,NeMo 25.02,NeMo 2.0,pretrain,LLAMA3-8B,DGX-B200,B200,8,FP8,128,2,8192,,1,1,1,1,1,,,8,"
                        ",208048,,\n")
    (a, b), skipped = map_rows([p], mofa_predictor.registry)
    assert not skipped
    assert a.measured_s == pytest.approx(128 * 8192 / (26006 * 8)) and a.measured_s == pytest.approx(5.0400, abs=1e-4)
    assert a.target == "tokens_per_sec_per_gpu" and b.target == "total_tokens_per_sec"
    assert b.measured_s == pytest.approx(128 * 8192 / 208048)


def test_nemo2_and_megatron_bridge_rows_reduce_gradients_as_their_performance_scripts_do():
    """NeMo 2.0's performance scripts set ``grad_reduce_in_fp32 = False`` for FP8 runs from 25.02 and
    for every run from 25.07; Megatron-Bridge's presets keep it. NeMo 1 (24.x) and NeMo 2.0's BF16
    runs before 25.07 reduce in fp32 (the ``bf16_mixed`` plugin's default)."""
    from mofa_plugins._megatron import bf16_gradient_reduction as bf16

    assert bf16("NeMo 2.0", "NeMo 25.02", "FP8") and bf16("NeMo 2.0", "NeMo 25.04.rc2", "MXFP8")
    assert not bf16("NeMo 2.0", "NeMo 25.04", "BF16") and bf16("NeMo 2.0", "NeMo 25.07", "BF16")
    assert bf16("Megatron-Bridge", "NeMo 25.09", "BF16") and bf16("Megatron-Bridge", "NeMo 26.06", "NVFP4")
    assert not bf16("NeMo (1.0/Megatron)", "NeMo 24.07", "FP8") and not bf16("NeMo", "NeMo 24.03.01", "FP8")
    # the framework column may say only "NeMo": the release decides
    assert bf16("NeMo", "NeMo 25.02", "FP8") and not bf16("NeMo", "NeMo 24.12", "FP8")
    assert not bf16("Megatron-Core (moe_dev/main branches, 2025)", "", "FP8")
    assert not bf16("Megatron-Bridge", "", "BF16")  # no release: the default fp32 reduction


def test_nvidia_rows_carry_the_gradient_reduction_into_the_sharding_feature(mofa_predictor):
    from mofa_framework.validate import map_rows

    mapped, _ = map_rows([DATA / "nvidia_megatron_bridge.csv", DATA / "nemo_2407.csv"], mofa_predictor.registry)
    feats = {m.row_id: m.job["features"] for m in mapped}
    assert feats["MB-ARC-073"]["distributed_optimizer"]["grad_reduce_dtype"] == "bf16"
    fsdp = [f for rid, f in feats.items() if rid.startswith("MB-") and "fsdp" in f]
    assert fsdp and all(f["fsdp"].get("grad_reduce_dtype") == "bf16" for f in fsdp)
    nemo1 = [f for rid, f in feats.items() if rid.startswith("NEMO2407")]
    assert nemo1 and all("grad_reduce_dtype" not in f.get("distributed_optimizer", {}) for f in nemo1)


def test_nemo2_and_megatron_bridge_fp8_rows_keep_fp8_weights(mofa_predictor):
    """Their FP8 precision configs set fp8_param_gather (delayed, current scaling, MXFP8), the blockwise
    one does not, and NeMo turns it off under Megatron-FSDP: the reader gives ``fp8_params`` to the
    rest of their FP8 rows; NeMo 1 and the MoE model zoo keep bf16 weights."""
    from mofa_framework.validate import map_rows
    from mofa_plugins._megatron import fp8_primary_weights as fp8w

    assert fp8w("Megatron-Bridge", "NeMo 26.04", "mxfp8") and fp8w("NeMo 2.0", "NeMo 25.02", "delayed")
    assert not fp8w("Megatron-Bridge", "NeMo 25.09", "blockwise") and not fp8w("NeMo", "NeMo 24.07", "delayed")
    mapped, _ = map_rows([DATA / "nvidia_megatron_bridge.csv", DATA / "nemo_2407.csv", DATA / "megatron_core_moe.csv"],
                         mofa_predictor.registry)
    fp8 = {m.row_id: m.job["features"] for m in mapped if "fp8" in m.job["features"]}
    assert fp8["MB-ARC-073"]["fp8"].get("fp8_params") is True  # DeepSeek-V3 MXFP8 on B200
    assert "fp8_params" not in fp8["MB-ARC-273"]["fp8"]  # FP8 blockwise on H100
    fsdp = [f for rid, f in fp8.items() if rid.startswith("MB-") and "fsdp" in f]
    assert fsdp and all("fp8_params" not in f["fp8"] for f in fsdp)
    assert all("fp8_params" not in f["fp8"] for rid, f in fp8.items() if not rid.startswith("MB-"))


def test_a_recompute_row_naming_modules_only_is_predicted(cli, tmp_path):
    """A plain row whose recompute states modules but no granularity (Megatron-Core's
    ``--recompute-modules`` alone) is predicted and labelled ``rc``; it used to stop `mofa validate`
    with an internal KeyError while naming the row's strategy."""
    p = tmp_path / "runs.csv"
    p.write_text("row_id,model,hardware,num_gpus,tp,pp,micro_batch_size,global_batch_size,sequence_length,features,"
                 "step_time_s\n"
                 'r1,llama3.1-8b,h100-sxm5-80gb,8,1,1,1,64,4096,"recompute:layernorm=true,moe_act=false",1.0\n')
    res = CliRunner().invoke(cli, ["validate", str(p), "--format", "json"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.output)["rows"][0]
    assert row["strategy"].endswith(" rc") and row["predicted_s"] > 0
