"""A misbehaving plugin is named — the one plugin at fault, not the hook's every implementation —
and a broken third-party plugin is warned about once per command."""

from __future__ import annotations

import numpy as np
import pluggy
import pytest
from click.testing import CliRunner

from mofa_framework import Predictor, hookimpl
from mofa_framework.cli import _builtin_commands, cli
from mofa_framework.config import jobs_to_batch
from mofa_framework.errors import MofaError, PluginError, PluginResultError
from mofa_framework.invariants import InvariantError
from mofa_framework.manager import MofaPluginManager
from mofa_framework.types import ConstraintResult, CostTransform, PipelineSchedule

_builtin_commands()
JOB = {"model": {"name": "llama3-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 16},
       "parallel": {"tp": 2, "pp": 2, "global_batch_size": 32, "sequence_length": 4096}}
wrapper = pluggy.HookimplMarker("mofa")(wrapper=True)
tryfirst = pluggy.HookimplMarker("mofa")(tryfirst=True)


def predictor(**plugins) -> Predictor:
    pm = MofaPluginManager(strict=False)
    pm.load_entrypoints(builtin_only=True)
    for name, plugin in plugins.items():
        pm.register_plugin(plugin, name)
    return Predictor(pm=pm)


def run(pred: Predictor, doc=JOB):
    job = pred.job(doc)
    return pred.evaluate(jobs_to_batch([job], pred.registry), job.model, job.hardware)


class NanProvider:
    @tryfirst
    @hookimpl
    def mofa_operator_latency(self, ops, hardware):
        out = np.full(len(ops), 1e-6)
        out[3] = np.nan
        return out


class DeferringProvider:
    @hookimpl
    def mofa_operator_latency(self, ops, hardware):
        return None  # defers: never to blame


class NegatingWrapper:
    @wrapper
    @hookimpl
    def mofa_collective_latency(self, colls, hardware):
        out = yield
        return -np.asarray(out)


class RaisingProvider:
    @tryfirst
    @hookimpl
    def mofa_collective_latency(self, colls, hardware):
        raise ZeroDivisionError("bad table")


def test_provider_returning_nan_is_named_alone():
    with pytest.raises(PluginResultError) as exc:
        run(predictor(nan_gemm=NanProvider(), quiet=DeferringProvider()))
    msg = str(exc.value)
    assert "'nan_gemm'" in msg and "roofline" not in msg and "quiet" not in msg and "one of" not in msg


def test_wrapper_breaking_a_sound_answer_is_named():
    with pytest.raises(PluginResultError) as exc:
        run(predictor(negator=NegatingWrapper()))
    assert "'negator'" in str(exc.value) and "collectives" not in str(exc.value)


def test_raising_provider_is_named_from_its_traceback():
    with pytest.raises(PluginError) as exc:
        run(predictor(raiser=RaisingProvider(), negator=NegatingWrapper()))
    msg = str(exc.value)
    assert "'raiser'" in msg and "ZeroDivisionError" in msg and "negator" not in msg


def _negative_activations(state, rows):
    import attrs

    layers = {k: attrs.evolve(c, act_saved_bytes=c.act_saved_bytes - 1e15) for k, c in state.layers.items()}
    return attrs.evolve(state, layers=layers)


def _superfast(state, rows):
    import attrs

    fields = ("fwd_compute_s", "bwd_input_s", "bwd_weight_s")
    layers = {k: attrs.evolve(c, **{f: getattr(c, f) / 1000.0 for f in fields}) for k, c in state.layers.items()}
    return attrs.evolve(state, layers=layers)


class BadFeatures:
    @hookimpl
    def mofa_register_cost_transforms(self):
        return [CostTransform(name="shrinker", description="makes activations negative", layer=_negative_activations),
                CostTransform(name="warp_drive", description="compute 1000x faster than the peak", layer=_superfast),
                CostTransform(name="picky", description="a feasibility rule that raises",
                              feasible=lambda batch, rows: 1 / 0)]


@pytest.mark.parametrize("feature, fragment", [("shrinker", "act_saved_bytes"), ("warp_drive", "MFU")])
def test_feature_breaking_an_invariant_is_named(feature, fragment):
    pred = predictor(bad_features=BadFeatures())
    with pytest.raises(InvariantError) as exc:
        run(pred, {**JOB, "features": {feature: {}, "recompute": {}}})
    msg = str(exc.value)
    assert "'bad_features'" in msg and f"'{feature}'" in msg and fragment in msg and "recompute" not in msg


def test_feasibility_rule_raising_is_named():
    pred = predictor(bad_features=BadFeatures())
    with pytest.raises(PluginError, match=r"plugin 'bad_features': feature 'picky'.*ZeroDivisionError"):
        pred.predict(pred.job({**JOB, "features": {"picky": {}}}))


class NanSchedule:
    @hookimpl
    def mofa_register_pipeline_schedules(self):
        from mofa_plugins.schedule_1f1b import SCHEDULE

        def time(inputs):
            t = SCHEDULE.time(inputs)
            import attrs

            return attrs.evolve(t, bubble_s=t.bubble_s * np.nan)

        import attrs

        return [attrs.evolve(SCHEDULE, name="nan-1f1b", time=time, aliases=())]


def test_schedule_returning_nan_is_named():
    pred = predictor(nan_sched=NanSchedule())
    with pytest.raises(PluginResultError, match=r"plugin 'nan_sched': schedule 'nan-1f1b': bubble_s"):
        run(pred, {**JOB, "pipeline": {"schedule": "nan-1f1b"}})


def test_errors_are_the_project_type():
    for exc in (InvariantError, PluginResultError, PluginError):
        assert issubclass(exc, MofaError)


def test_plugin_failing_in_several_hooks_warns_once(mofa_fake_distribution, monkeypatch):
    """A plugin failing to add commands and to register models: one warning line per command, naming it
    (it printed one line per failing hook, the commands one without the plugin's name)."""
    monkeypatch.delenv("MOFA_DISABLED_PLUGINS", raising=False)
    mofa_fake_distribution("flaky", "0.1", {"flaky": "flaky_plugin", "gone": "gone_plugin"}, {
        "flaky_plugin": "from mofa_framework import hookimpl\n"
                        "@hookimpl\ndef mofa_register_models():\n    raise RuntimeError('models boom')\n"
                        "@hookimpl\ndef mofa_register_commands(cli):\n    raise RuntimeError('cmd boom')\n",
        "gone_plugin": "import nope_nope_nope\n"})
    import mofa_framework.cli as cli_module

    monkeypatch.setattr(cli_module, "_COMMAND_FAILURES", {})  # this process's record, not the next test's
    cli_module.assemble()
    r = CliRunner().invoke(cli, ["predict", "--model", "llama3-8b", "--hardware", "h100-sxm5-80gb", "--gpus", "8",
                                 "--gbs", "8", "--seq", "4096", "--format", "json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 2, warnings
    assert sum("'flaky'" in w for w in warnings) == 1 and sum("'gone'" in w for w in warnings) == 1
    r = CliRunner().invoke(cli, ["list-models", "--format", "json"], catch_exceptions=False)
    assert len([ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]) == 2


def test_constraint_hook_with_wrong_shape_is_named():
    class Bad:
        @hookimpl
        def mofa_candidate_constraints(self, batch, model, hardware):
            yield ConstraintResult(name="bad", feasible=np.ones(len(batch) + 1, bool), reason="x")

    pred = predictor(bad_rule=Bad())
    with pytest.raises(PluginError, match="plugin 'bad_rule'"):
        pred.predict(pred.job(JOB))


assert PipelineSchedule  # the record type NanSchedule evolves


class NanAtMicroBatch2:
    """Answers NaN for the GEMMs of 2 × 8,192 tokens (micro-batch 2 at sequence 8,192): one row of
    a file breaks, the others do not."""

    @pluggy.HookimplMarker("mofa")(wrapper=True, tryfirst=True)  # outermost: the table providers wrap too
    def mofa_operator_latency(self, ops, hardware):
        out = yield
        return np.where(ops.gemm_m == 16384, np.nan, out)


NVIDIA_HEAD = ("source_id,release,framework,task,model,system,gpu_type,num_gpus,precision,gbs,mbs,seq_len,fsdp,tp,pp,"
               "cp,vp,ep,etp,dp,ga,step_time_s,notes\n")


def test_a_row_the_engine_cannot_price_is_listed_the_others_predicted(tmp_path):
    """`mofa validate` does not stop at the first row a plugin cannot price: the batch is split until
    the row at fault is alone, listed as not predicted (kind ``error``, the plugin named), and the
    file's other rows — in the same batch — are predicted as without the fault. A fit, which must
    not lose rows silently, still raises."""
    from mofa_framework.calibrate import calibrate
    from mofa_framework.validate import validate

    p = tmp_path / "nvidia.csv"
    p.write_text(NVIDIA_HEAD + "".join(
        f"{k},r,NeMo,pretrain,LLAMA3-8B,DGX-H100,H100,16,BF16,64,{mbs},8192,,2,2,1,,,,,,{t},\n"
        for k, mbs, t in (("A", 1, 5.0), ("B", 2, 5.0), ("C", 1, 6.0))))
    clean = {r.row_id: r.predicted_s for r in validate([p], predictor()).rows}
    res = validate([p], predictor(nan_m=NanAtMicroBatch2()))
    assert {r.row_id: r.predicted_s for r in res.rows} == {k: clean[k] for k in ("A", "C")}
    (s,) = res.skipped
    assert s.row_id == "B" and s.kind == "error" and "'nan_m'" in s.reason and "internal error" in s.reason
    with pytest.raises(PluginResultError):
        calibrate([p], "h100-sxm5-80gb", predictor(nan_m=NanAtMicroBatch2()), parameters=("step_overhead_s",),
                  folds=0)


def test_validate_cli_names_rows_not_priced_and_goes_on(tmp_path, mofa_fake_distribution, monkeypatch):
    """The CLI with a third party's faulty provider installed: exit 0, the good row in the JSON, the
    bad one listed with the plugin named, one warning line on stderr."""
    import json

    monkeypatch.delenv("MOFA_DISABLED_PLUGINS", raising=False)
    mofa_fake_distribution("nanm", "0.1", {"nan_m": "nan_m_plugin"}, {
        "nan_m_plugin": "import numpy as np\nimport pluggy\n"
                        "@pluggy.HookimplMarker('mofa')(wrapper=True, tryfirst=True)\n"
                        "def mofa_operator_latency(ops, hardware):\n"
                        "    out = yield\n"
                        "    return np.where(ops.gemm_m == 16384, np.nan, out)\n"})
    p = tmp_path / "nvidia.csv"
    p.write_text(NVIDIA_HEAD + "A,r,NeMo,pretrain,LLAMA3-8B,DGX-H100,H100,16,BF16,64,1,8192,,2,2,1,,,,,,5.0,\n"
                 "B,r,NeMo,pretrain,LLAMA3-8B,DGX-H100,H100,16,BF16,64,2,8192,,2,2,1,,,,,,5.0,\n")
    out = CliRunner().invoke(cli, ["validate", str(p), "--format", "json"])
    assert out.exit_code == 0, out.output
    d = json.loads(out.stdout)
    assert [r["row_id"] for r in d["rows"]] == ["A"] and [s["row_id"] for s in d["skipped"]] == ["B"], out.stderr
    assert "'nan_m'" in d["skipped"][0]["reason"]
    warnings = [ln for ln in out.stderr.splitlines() if "could not be priced" in ln]
    assert len(warnings) == 1 and "row B" in warnings[0]
