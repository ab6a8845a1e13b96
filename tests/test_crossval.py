"""Leave-one-source-out and leave-one-regime-out cross-validation (issue 17 §2) on synthetic rows
whose 'measured' times are the model's own predictions with known coefficients, so each held-out
prediction is known by hand: a source held out is predicted by the coefficient its *other* sources
carry. Small folds (eight jobs per source, one coefficient): ~1 s."""

from __future__ import annotations

import re

import attrs
import pytest

from mofa_framework.crossval import FitPlan, Regime, cross_validate, model_family, parse_recorded, twins

A100 = "a100-sxm4-80gb"
LAYOUTS = (("gpt-22b", 8, 8, 1, 4), ("gpt3-175b", 64, 8, 8, 64), ("gpt-7.5b", 32, 4, 2, 64), ("gpt-1.7b", 8, 1, 1, 64))


@pytest.fixture(scope="module")
def predictor():
    from mofa_framework import Predictor

    return Predictor()


def rows(predictor, source: str, gemm_efficiency: float, framework: str = "", scale: float = 1.0, gpu: str = A100):
    """Eight jobs whose measured step time is the `gpu` prediction with `gemm_efficiency` (× `scale`)."""
    from mofa_framework.types import MappedRow
    from mofa_framework.validate import predict_prepared, prepare

    out = []
    for model, gpus, tp, pp, gbs in LAYOUTS:
        for rec in ("full", "selective"):
            job = {"model": {"name": model}, "hardware": {"name": gpu, "num_gpus": gpus},
                   "parallel": {"tp": tp, "pp": pp, "micro_batch_size": 1, "global_batch_size": gbs,
                                "sequence_length": 2048, "precision": "fp16"},
                   "features": {"recompute": {"granularity": rec}}}
            out.append(MappedRow(source=source, reference="", row_id=f"{model}-{rec}", job=job, measured_s=1.0,
                                 target="t", framework=framework))
    hw = predictor.registry.hardware_profile(gpu)
    truth = attrs.evolve(hw, efficiency=attrs.evolve(hw.efficiency, gemm_efficiency=gemm_efficiency))
    groups, _ = prepare(out, predictor)
    t = predict_prepared(groups, predictor, {gpu: truth}, n_rows=len(out))["step_s"]
    return [attrs.evolve(r, measured_s=float(x) * scale) for r, x in zip(out, t)]


@pytest.fixture(scope="module")
def cv(predictor):
    """Source 'fast' runs at GEMM efficiency 0.62, 'slow' at 0.50 (the same eight jobs), and 'copy'
    republishes fast's measurements 1 % apart (twins, TWIN_TOLERANCE 2 %)."""
    import mofa_framework.calibrate as calibration

    prior = calibration.PRIOR_WEIGHT
    calibration.PRIOR_WEIGHT = 0.0  # no pull towards the library default: the fit is the data's
    try:
        fast = rows(predictor, "fast", 0.62, framework="stack 2021")
        slow = rows(predictor, "slow", 0.50, framework="stack 2024")
        copy = rows(predictor, "copy", 0.62, framework="stack 2021", scale=1.01)
        plan = FitPlan(hardware=A100, parameters=("gemm_efficiency",))
        res = cross_validate([], predictor, plans=[plan], kinds=("source", "framework"), mapped=fast + slow + copy)
    finally:
        calibration.PRIOR_WEIGHT = prior
    return res, fast, slow


def test_a_recorded_prior_is_what_each_refit_is_held_towards(predictor, monkeypatch):
    """With the prior weighted far above the rows (PRIOR_WEIGHT 100) every fold's refit lands on
    its anchor: the plan's ``--prior`` for host_dispatch_s (150 µs), the library default for
    gemm_efficiency (EfficiencySpec: 0.80) — not the default 0 for host_dispatch_s."""
    import mofa_framework.calibrate as calibration
    from mofa_framework.types import EfficiencySpec

    monkeypatch.setattr(calibration, "PRIOR_WEIGHT", 100.0)
    plan = FitPlan(hardware=A100, parameters=("gemm_efficiency", "host_dispatch_s"),
                   priors=(("host_dispatch_s", 1.5e-4),))
    mapped = rows(predictor, "fast", 0.62)[6:] + rows(predictor, "slow", 0.50)[6:]
    res = cross_validate([], predictor, plans=[plan], kinds=("source",), mapped=mapped)
    refits = [f.refits[A100] for f in res.held_out["source"].folds]
    assert len(refits) == 2
    for r in refits:
        assert r["host_dispatch_s"] == pytest.approx(1.5e-4, rel=0.01)
        assert r["gemm_efficiency"] == pytest.approx(EfficiencySpec().gemm_efficiency, rel=0.01)


A800 = "a800-sxm4-80gb"


def test_a_gpu_left_without_rows_takes_its_siblings_refit_of_the_same_fold(predictor, monkeypatch):
    """``--prior-from``: A800's only rows are source x's. Held out, A800 has nothing to fit and
    takes its prior — its sibling A100's coefficient refitted in the same fold, i.e. without x's A100
    rows (0.50): 0.62 from source a alone, not the library default (0.80) nor A100's shipped fit.
    The sibling is refitted for the anchor even when only A800 is cross-validated."""
    import mofa_framework.calibrate as calibration
    import mofa_framework.crossval as crossval
    from mofa_framework.crossval import siblings

    monkeypatch.setattr(calibration, "PRIOR_WEIGHT", 0.0)
    mapped = rows(predictor, "a", 0.62)[:4] + rows(predictor, "x", 0.50)[:4] + rows(predictor, "x", 0.55, gpu=A800)[:4]
    sibling = FitPlan(hardware=A100, parameters=("gemm_efficiency",))
    plan = FitPlan(hardware=A800, parameters=("gemm_efficiency",), prior_from=A100)
    assert siblings([plan], [sibling, plan]) == [sibling] and siblings([plan, sibling], [sibling, plan]) == []
    monkeypatch.setattr(crossval, "recorded_plans", lambda registry: [sibling, plan])
    for plans in ([sibling, plan], [plan]):
        cv = cross_validate([], predictor, plans=plans, kinds=("source",), mapped=mapped)
        fold = next(f for f in cv.held_out["source"].folds if f.key == "x")
        assert fold.train_rows[A800] == 0
        assert fold.refits[A800]["gemm_efficiency"] == pytest.approx(0.62, abs=0.003)
    # without the sibling the empty refit is the library default
    cv = cross_validate([], predictor, plans=[attrs.evolve(plan, prior_from="")], kinds=("source",), mapped=mapped)
    fold = next(f for f in cv.held_out["source"].folds if f.key == "x")
    assert fold.refits[A800]["gemm_efficiency"] == pytest.approx(0.80)


def test_prior_from_holds_the_fit_towards_the_siblings_coefficients(predictor, monkeypatch):
    """With the prior weighted far above the rows, ``calibrate(prior_from=…)`` lands on the
    sibling's shipped coefficient (clipped to the fitting bounds); a profile cannot be its own."""
    import mofa_framework.calibrate as calibration
    from mofa_framework.errors import ConfigError
    from mofa_framework.types import EfficiencySpec

    monkeypatch.setattr(calibration, "PRIOR_WEIGHT", 100.0)
    mapped = rows(predictor, "x", 0.55, gpu=A800)[:4]
    res = calibration.calibrate([], A800, predictor, parameters=("gemm_efficiency",), folds=0, mapped=mapped,
                                prior_from=A100)
    shipped = predictor.registry.hardware_profile(A100).efficiency.gemm_efficiency
    assert res.fitted["gemm_efficiency"] == pytest.approx(shipped, rel=0.01)
    assert calibration.sibling_prior(EfficiencySpec(profiled_gemm_relative_efficiency=1.4),
                                     ["profiled_gemm_relative_efficiency"]) == {"profiled_gemm_relative_efficiency": 1.1}
    with pytest.raises(ConfigError, match="--prior-from A800: name another profile than --hardware a800-sxm4-80gb"):
        calibration.calibrate([], A800, predictor, parameters=("gemm_efficiency",), folds=0, mapped=mapped,
                              prior_from="A800")


def _by_source(scheme, source):
    return [r for r in scheme.rows if r.source == source]


def test_a_held_out_source_is_predicted_by_the_others_coefficient(cv):
    res, fast, slow = cv
    loso = res.held_out["source"]
    # slow held out: fitted to fast and copy (0.62 and 0.62 at +1 %), so slow's rows are predicted at
    # ~0.62: their predicted time is fast's measured time (same jobs), within copy's 1 % pull
    for r, f in zip(_by_source(loso, "slow"), fast):
        assert r.predicted_s == pytest.approx(f.measured_s, rel=0.012)
    # fast held out: copy holds the same measurements (twins), so it is held out too and the refit
    # sees slow alone: fast's rows are predicted at 0.50, i.e. slow's measured times
    for r, s in zip(_by_source(loso, "fast"), slow):
        assert r.predicted_s == pytest.approx(s.measured_s, rel=1e-3)
    fold = next(f for f in loso.folds if f.key == "fast")
    assert fold.train_rows == {A100: 8} and fold.rows == 8
    assert fold.refits[A100]["gemm_efficiency"] == pytest.approx(0.50, abs=0.003)


def test_in_sample_is_the_shipped_profile(cv, predictor):
    res, fast, _ = cv
    from mofa_framework.validate import predict_prepared, prepare

    groups, _ = prepare(fast, predictor)
    shipped = predict_prepared(groups, predictor, n_rows=len(fast))["step_s"]
    assert [r.predicted_s for r in _by_source(res.in_sample, "fast")] == pytest.approx(list(shipped))


def test_leave_one_framework_out(cv):
    """'stack 2021' is fast and copy: held out together, the refit sees slow alone (0.50)."""
    res, fast, slow = cv
    held = res.held_out["framework"]
    for r, s in zip(_by_source(held, "copy"), slow):
        assert r.predicted_s == pytest.approx(s.measured_s, rel=1e-3)
    keys = {k for k, _, _ in res.by_regime("framework")}
    assert keys == {"stack 2021", "stack 2024"}
    worst = res.by_regime("framework")[0]
    assert worst[2].mape >= res.by_regime("framework")[1][2].mape


def test_twins_are_other_sources_same_job_within_two_percent(predictor):
    """c is 5 % from a and 3 % from b (1.05 / 1.019): no twin; b is 1.9 % from both a rows."""
    from mofa_framework.types import MappedRow

    job = {"model": {"name": "m"}, "hardware": {"num_gpus": 8}, "parallel": {"global_batch_size": 8}}
    mk = lambda src, t: MappedRow(source=src, reference="", row_id="1", job=job, measured_s=t, target="t")  # noqa: E731
    got = twins([mk("a", 1.0), mk("b", 1.019), mk("c", 1.05), mk("a", 1.0)], ["x"] * 4)
    assert got == [[1], [0, 3], [], [1]]


def test_model_family_and_regime_keys(predictor):
    reg = predictor.registry
    assert model_family(reg.model("llama3-8b")) == "dense GQA gated MLP"
    assert model_family(reg.model("gpt3-175b")) == "dense MHA 2-matrix MLP"
    assert model_family(reg.model("deepseek-v3")).startswith("MoE MLA")
    # the stack's own mixers and attention are classes of their own (bands and leave-one-family-out)
    assert model_family(reg.model("deepseek-v4-flash")) == "MoE compressed-attention gated MLP"
    assert model_family(reg.model("nemotron-h-8b")) == "dense hybrid Mamba GQA 2-matrix MLP"
    assert model_family(reg.model("qwen3-next-80b-a3b")) == "MoE hybrid linear-attention GQA gated MLP"
    r = Regime(gpu="g", precision="fp8", family="f", schedule="1f1b", features=(), num_gpus=8)
    assert (r.key("gpu-precision"), r.key("model-family"), r.key("framework")) == ("fp8 on g", "f", "(not stated)")


def test_parse_recorded_command():
    text = ("# [efficiency] fitted by `mofa calibrate`: mofa calibrate --hardware x --builtin-set calibration "
            "--param gemm_efficiency --param=contention_compute extra.csv --write x.toml\n")
    plan = parse_recorded("x", text)
    assert plan.parameters == ("gemm_efficiency", "contention_compute")
    assert plan.files[-1] == "extra.csv" and "megatron_selene_a100.csv" in plan.files
    assert parse_recorded("x", text.replace("--write", "--all-rows --write")) is None
    assert parse_recorded("x", "name = 'x'\n") is None
    assert plan.priors == ()
    # a recorded --prior (either spelling) becomes the refits' anchor for that coefficient
    primed = parse_recorded("x", text.replace("--write", "--prior host_dispatch_s=1e-4 --prior=kernel_launch_s=2e-6 "
                                                             "--write"))
    assert dict(primed.priors) == {"host_dispatch_s": 1e-4, "kernel_launch_s": 2e-6}
    assert primed.parameters == plan.parameters and primed.files == plan.files
    # a recorded --prior-from names the sibling whose refit anchors this one (either spelling)
    for flag in ("--prior-from b200-sxm-180gb ", "--prior-from=b200-sxm-180gb "):
        sib = parse_recorded("x", text.replace("--write", flag + "--write"))
        assert sib.prior_from == "b200-sxm-180gb" and sib.files == plan.files and plan.prior_from == ""


def test_parse_priors_names_the_bad_item():
    from mofa_framework.calibrate import parse_priors
    from mofa_framework.errors import ConfigError

    assert parse_priors(["host_dispatch_s=1.0e-4", " microbatch_overhead_s=0.002"]) == {
        "host_dispatch_s": 1.0e-4, "microbatch_overhead_s": 0.002}
    for bad, says in (("host_dispatch_s", "NAME=VALUE"), ("no_such=1", "NAME=VALUE"), ("host_dispatch_s=fast", "fast"),
                      ("host_dispatch_s=1e-3", "outside host_dispatch_s's bounds [0, 0.0002]")):
        with pytest.raises(ConfigError, match=re.escape(says)):
            parse_priors([bad])


def test_cli_cross_validate_refuses_what_it_cannot_do():
    from click.testing import CliRunner

    import mofa_framework.cli as c

    c._builtin_commands()
    res = CliRunner().invoke(c.cli, ["calibrate", "--cross-validate", "--builtin", "--write", "x.toml"])
    assert res.exit_code == 2 and "--write does not go with --cross-validate" in res.output
    res = CliRunner().invoke(c.cli, ["calibrate", "--cross-validate", "--builtin", "--prior-from", "b200-sxm-180gb"])
    assert res.exit_code == 2 and "--prior-from does not go with --cross-validate" in res.output
    res = CliRunner().invoke(c.cli, ["calibrate", "--cross-validate", "--builtin", "--param", "gemm_efficiency"])
    assert res.exit_code == 2 and "needs --hardware" in res.output and res.output.strip().count("\n") == 0


def test_cli_cross_validate_one_profile_refits_it_as_recorded(monkeypatch):
    """``--hardware`` alone refits that profile with its recorded coefficients and ``--prior``s (as
    the full run does), ``--param`` with those coefficients instead."""
    from click.testing import CliRunner

    import mofa_framework.cli as c
    import mofa_framework.crossval as crossval
    from mofa_framework import Predictor

    seen = []

    def fake(files, predictor, *, plans, **kw):
        seen.append(plans)
        raise crossval.ConfigError("stop here")

    monkeypatch.setattr(crossval, "cross_validate", fake)
    c._builtin_commands()
    recorded = [p for p in crossval.recorded_plans(Predictor().registry) if p.hardware == A100]
    assert CliRunner().invoke(c.cli, ["calibrate", "--cross-validate", "--builtin", "--hardware", A100]).exit_code == 2
    assert seen[-1] == recorded and recorded[0].priors  # the shipped A100 fit records a host-dispatch prior
    CliRunner().invoke(c.cli, ["calibrate", "--cross-validate", "--builtin", "--hardware", A100, "--param",
                               "gemm_efficiency"])
    assert seen[-1] == [FitPlan(hardware=A100, parameters=("gemm_efficiency",))]
