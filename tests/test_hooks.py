"""One test per hookspec (`test_hook_<name>`), each through a tiny in-process plugin."""

import click
import numpy as np
import pytest

from mofa_framework import hookimpl
from mofa_framework.batch import OP_KINDS
from mofa_framework.types import (
    ComputeSpec,
    ConfigSection,
    ConstraintResult,
    CostTransform,
    FaultRecoveryPolicy,
    HardwareProfile,
    InterconnectSpec,
    MemoryOptimizer,
    MemorySpec,
    ModelSpec,
    NoOptions,
    OverlapStrategy,
    PipelineSchedule,
)

import attrs

JOB = {"model": {"name": "llama3-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 16},
       "parallel": {"tp": 2, "pp": 2, "micro_batch_size": 1, "global_batch_size": 32, "sequence_length": 4096}}


def predict(pred, job=JOB):
    return pred.predict(pred.job(job))[0]


def test_hook_mofa_register_hardware_profiles(mofa_pm, mofa_predictor):
    class P:
        @hookimpl
        def mofa_register_hardware_profiles(self):
            yield HardwareProfile(name="toy-gpu", gpus_per_node=4, compute=ComputeSpec(peak_tflops={"bf16": 100.0}),
                                  memory=MemorySpec(hbm_gib=16.0, hbm_bandwidth_gbps=900.0),
                                  interconnect=InterconnectSpec(scaleup_domain_gpus=4, scaleup_bandwidth_gbps=100.0,
                                                                scaleout_bandwidth_gbps=12.5), aliases=("Toy",))
    mofa_pm.register_plugin(P(), "toy")
    assert mofa_pm.registry.hardware_profile("toy").name == "toy-gpu"
    r = predict(mofa_predictor, {**JOB, "hardware": {"name": "toy-gpu", "num_gpus": 16}})
    assert r.hardware == "toy-gpu" and r.step_time_s > predict(mofa_predictor).step_time_s


def test_hook_mofa_register_models(mofa_pm, mofa_predictor):
    class P:
        @hookimpl
        def mofa_register_models(self):
            return [ModelSpec(name="tiny", num_layers=4, hidden_size=512, num_attention_heads=8, num_kv_heads=8,
                              ffn_hidden_size=2048, vocab_size=1000)]
    mofa_pm.register_plugin(P(), "tiny_model")
    r = predict(mofa_predictor, {**JOB, "model": {"name": "tiny"}})
    assert r.model == "tiny" and r.step_time_s < predict(mofa_predictor).step_time_s


def _const_schedule(x):
    from mofa_framework.engine import PipelineTimes
    busy = x.m * x.v * (x.F + x.B + x.W)
    z = np.zeros_like(busy)
    return PipelineTimes(busy_s=busy, bubble_s=z + 1.0, pp_comm_s=z, warmup_s=z, steady_s=busy + 1.0, cooldown_s=z)


def test_hook_mofa_register_pipeline_schedules(mofa_pm, mofa_predictor):
    from mofa_framework.engine import Inflight

    class P:
        @hookimpl
        def mofa_register_pipeline_schedules(self):
            return [PipelineSchedule(name="one-second-bubble", description="test", time=_const_schedule,
                                     inflight=lambda x: Inflight(first=x.m, mid=x.m, last=x.m))]
    mofa_pm.register_plugin(P(), "sched")
    r = predict(mofa_predictor, {**JOB, "pipeline": {"schedule": "one-second-bubble"}})
    assert r.breakdown["bubble"] == pytest.approx(1.0)
    assert sum(r.breakdown.values()) == pytest.approx(r.step_time_s)


def test_schedule_inflight_may_be_one_number(mofa_pm, mofa_predictor):
    """An ``Inflight`` field given as one number holds for every row: the same peak memory as the
    same value given per row."""
    from mofa_framework.engine import Inflight

    class P:
        @hookimpl
        def mofa_register_pipeline_schedules(self):
            return [PipelineSchedule(name=n, description="test", time=_const_schedule, inflight=f)
                    for n, f in (("arrays", lambda x: Inflight(first=x.m * 0 + 2.0, mid=x.m * 0 + 2.0, last=x.m * 0 + 2.0)),
                                 ("numbers", lambda x: Inflight(first=2.0, mid=2.0, last=2.0)))]
    mofa_pm.register_plugin(P(), "sched2")
    arrays = predict(mofa_predictor, {**JOB, "pipeline": {"schedule": "arrays"}})
    numbers = predict(mofa_predictor, {**JOB, "pipeline": {"schedule": "numbers"}})
    assert numbers.peak_memory_gib == arrays.peak_memory_gib
    assert numbers.memory_breakdown["activations"] > 0


def _feature_plugin(hook, cls, name, **phases):
    def impl(self):
        return [cls(name=name, description="test", **phases)]
    impl.__name__ = hook
    return type("P", (), {hook: hookimpl(impl)})()


def test_hook_mofa_register_overlap_strategies(mofa_pm, mofa_predictor):
    def halve_tp(state, rows):
        layers = {k: attrs.evolve(c, tp_exposed_fwd_s=c.tp_exposed_fwd_s / 2, tp_exposed_bwd_s=c.tp_exposed_bwd_s / 2)
                  for k, c in state.layers.items()}
        return attrs.evolve(state, layers=layers)
    mofa_pm.register_plugin(_feature_plugin("mofa_register_overlap_strategies", OverlapStrategy, "half_tp",
                                            layer=halve_tp), "half_tp")
    off = predict(mofa_predictor)
    on = predict(mofa_predictor, {**JOB, "features": {"half_tp": {}}})
    # layers' TP collectives halve; the LM head's input gather is not a layer and stays
    assert off.breakdown["tp_comm"] / 2 < on.breakdown["tp_comm"] < 0.55 * off.breakdown["tp_comm"]
    assert "features.layer.half_tp" in on.provenance


def test_hook_mofa_register_memory_optimizers(mofa_pm, mofa_predictor):
    def no_acts(state, rows):
        return attrs.evolve(state, mem=attrs.evolve(state.mem, activations_bytes=state.mem.activations_bytes * 0))
    mofa_pm.register_plugin(_feature_plugin("mofa_register_memory_optimizers", MemoryOptimizer, "no_acts",
                                            memory=no_acts), "no_acts")
    on = predict(mofa_predictor, {**JOB, "features": {"no_acts": {}}})
    assert on.memory_breakdown["activations"] == 0.0
    assert on.peak_memory_gib < predict(mofa_predictor).peak_memory_gib


def test_hook_mofa_register_cost_transforms(mofa_pm, mofa_predictor):
    def slow_opt(state, rows):
        return attrs.evolve(state, opt=attrs.evolve(state.opt, update_s=state.opt.update_s + 2.0))
    mofa_pm.register_plugin(_feature_plugin("mofa_register_cost_transforms", CostTransform, "slow_opt",
                                            optimizer=slow_opt), "slow_opt")
    off, on = predict(mofa_predictor), predict(mofa_predictor, {**JOB, "features": {"slow_opt": {}}})
    assert on.step_time_s == pytest.approx(off.step_time_s + 2.0)


def test_hook_mofa_register_fault_recovery_policies(mofa_pm):
    class P:
        @hookimpl
        def mofa_register_fault_recovery_policies(self):
            return [FaultRecoveryPolicy(name="in-memory", description="test", mttr_s=lambda o: 30.0)]
    mofa_pm.register_plugin(P(), "in_memory")
    assert mofa_pm.registry.policy("in-memory").mttr_s(NoOptions()) == 30.0


def test_hook_mofa_register_measurement_readers(mofa_pm, tmp_path):
    """A registered reader maps the rows of files whose header has its columns; the most specific
    reader wins over the plain schema, and two equally specific ones are an error naming both."""
    from mofa_framework.errors import ConfigError
    from mofa_framework.measurements import map_rows
    from mofa_framework.types import MappedRow, MeasurementReader

    def map_row(row, ctx):
        job = {"model": {"name": ctx.text(row, "model")}, "hardware": {"name": "h100", "num_gpus": 8},
               "parallel": {"global_batch_size": 8, "sequence_length": 4096}}
        return MappedRow(source=ctx.source, reference="mine", row_id=str(ctx.line), job=job,
                         measured_s=ctx.number(row, "ms") / 1e3, target="ms")

    class P:
        @hookimpl
        def mofa_register_measurement_readers(self):
            return [MeasurementReader(name="my-logs", description="test", columns={"model", "ms"}, map_row=map_row)]
    mofa_pm.register_plugin(P(), "my_logs")
    assert mofa_pm.registry.reader("my-logs").columns == {"model", "ms"}
    path = tmp_path / "logs.csv"
    path.write_text("model,ms\nllama3-8b,1500\n")
    (m,), skipped = map_rows([path], mofa_pm.registry)
    assert m.measured_s == 1.5 and m.row_id == "2" and not skipped

    class Q:
        @hookimpl
        def mofa_register_measurement_readers(self):
            return [MeasurementReader(name="other-logs", description="test", columns={"model", "ms"}, map_row=map_row)]
    mofa_pm.register_plugin(Q(), "other_logs")
    with pytest.raises(ConfigError, match="my-logs, other-logs"):
        map_rows([path], mofa_pm.registry)
    assert map_rows([path], mofa_pm.registry, reader="other-logs")[0][0].measured_s == 1.5


def test_hook_mofa_register_flops_conventions(mofa_pm):
    """A registered convention is looked up by name or alias and gives one step's FLOPs."""
    from mofa_framework.measurements import ReadContext
    from mofa_framework.types import FlopsConvention

    class P:
        @hookimpl
        def mofa_register_flops_conventions(self):
            return [FlopsConvention(name="eight-nd", aliases=("8ND",), description="test",
                                    step_flops=lambda model, b, s: 8.0 * b * s)]
    mofa_pm.register_plugin(P(), "eight_nd")
    reg = mofa_pm.registry
    assert reg.flops_convention("8ND").name == "eight-nd"
    ctx = ReadContext(source="t", registry=reg)
    assert ctx.step_flops("eight-nd", reg.model("llama3-8b"), 2, 1024) == 8.0 * 2 * 1024
    assert "not installed" in ctx.step_flops("no-such", reg.model("llama3-8b"), 2, 1024)
    assert {"6nd", "palm", "megatron-2021", "megatron-core", "nemo"} <= set(reg.flops_conventions)


def test_hook_mofa_register_config_sections(mofa_pm):
    @attrs.frozen
    class Opts:
        path: str = ""

    class P:
        @hookimpl
        def mofa_register_config_sections(self):
            return [ConfigSection(name="my_table", options_type=Opts)]
    mofa_pm.register_plugin(P(), "tables")
    assert mofa_pm.registry.config_sections["my_table"].options_type is Opts


def test_hook_mofa_operator_latency(mofa_pm, mofa_predictor):
    base = predict(mofa_predictor)

    class Wrapper:  # a partial override: GEMMs twice as fast, the rest from the built-in
        @hookimpl(wrapper=True)
        def mofa_operator_latency(self, ops, hardware):
            default = yield
            return np.where(ops.kind == OP_KINDS.index("gemm"), default / 2, default)
    mofa_pm.register_plugin(Wrapper(), "fast_gemm")
    assert predict(mofa_predictor).breakdown["compute_bwd_weight"] == pytest.approx(base.breakdown["compute_bwd_weight"] / 2)
    mofa_pm.unregister(name="fast_gemm")

    class Provider:  # a full provider wins over the trylast built-in
        @hookimpl
        def mofa_operator_latency(self, ops, hardware):
            return np.full(len(ops), 1e-3)
    mofa_pm.register_plugin(Provider(), "constant")
    r = predict(mofa_predictor)
    assert r.provenance["compute_fwd"].split(" ")[0] == "constant"
    assert r.breakdown["compute_fwd"] != base.breakdown["compute_fwd"]


def test_hook_mofa_collective_latency(mofa_pm, mofa_predictor):
    class Free:
        @hookimpl
        def mofa_collective_latency(self, colls, hardware):
            return np.zeros(len(colls))
    mofa_pm.register_plugin(Free(), "free_comm")
    r = predict(mofa_predictor)
    assert r.breakdown["tp_comm"] == 0.0 and r.breakdown["dp_comm"] == 0.0 and r.breakdown["pp_comm"] == 0.0


def test_hook_mofa_collective_latency_bad_result_names_contract(mofa_pm, mofa_predictor):
    from mofa_framework.errors import PluginResultError

    class Bad:
        @hookimpl
        def mofa_collective_latency(self, colls, hardware):
            return -np.ones(len(colls))
    mofa_pm.register_plugin(Bad(), "negative")
    with pytest.raises(PluginResultError, match="negative"):
        predict(mofa_predictor)


def test_hook_mofa_candidate_constraints(mofa_pm, mofa_predictor):
    from mofa_framework.errors import ConfigError

    class NoPP:
        @hookimpl
        def mofa_candidate_constraints(self, batch, model, hardware):
            yield ConstraintResult(name="no_pp", feasible=batch.pp == 1, reason="parallel.pp must be 1 on this site")
    mofa_pm.register_plugin(NoPP(), "site_rules")
    with pytest.raises(ConfigError, match="parallel.pp must be 1"):
        predict(mofa_predictor)


def test_constraint_detail_names_the_refused_row_and_stays_out_of_a_search(mofa_pm, mofa_predictor):
    """A rule's ``detail(i)`` is appended to a refused job's error with that job's numbers; a search
    counts the rows it removes under the bare reason (one entry, whatever the rows' numbers)."""
    from mofa_framework.errors import ConfigError

    class SmallPP:
        @hookimpl
        def mofa_candidate_constraints(self, batch, model, hardware):
            yield ConstraintResult(name="small_pp", feasible=batch.pp <= 2, reason="parallel.pp must be at most 2",
                                   detail=lambda i: f" (here pp {int(batch.pp[i])})")
    mofa_pm.register_plugin(SmallPP(), "site_rules")
    r = ConstraintResult(name="x", feasible=np.ones(1, bool), reason="why", detail=lambda i: f" #{i}")
    assert r.reason_for(np.int64(3)) == "why #3"
    assert ConstraintResult(name="x", feasible=np.ones(1, bool), reason="why").reason_for(0) == "why"
    with pytest.raises(ConfigError, match=r"parallel.pp must be at most 2 \(here pp 4\)"):
        predict(mofa_predictor, {**JOB, "parallel": {**JOB["parallel"], "pp": 4}})
    res = mofa_predictor.tune(JOB, values={"pp": (1, 2, 4, 8), "tp": (2,)}, features=(), top_k=1)
    assert res.removed_by["parallel.pp must be at most 2"] > 0
    assert not any("(here pp" in k for k in res.removed_by)


def _feature_batch(pred):
    """Jobs with features on, one of them breaking a structural rule (TP 3 divides no head count)."""
    from mofa_framework.config import jobs_to_batch

    jobs = [pred.job({**JOB, "hardware": {**JOB["hardware"], "num_gpus": gpus},
                      "parallel": {**JOB["parallel"], **par}, "features": feats}) for gpus, par, feats in (
        (16, {}, {"recompute": {}, "distributed_optimizer": {}}),
        (16, {"tp": 4, "pp": 1}, {"cpu_optimizer": {}, "tp_overlap": {}}),
        (24, {"tp": 3, "pp": 1}, {"activation_offload": {}}),
        (16, {}, {}))]
    return jobs_to_batch(jobs, pred.registry), jobs[0].model, jobs[0].hardware


def test_constraints_blind_to_features_are_left_out_of_feature_rules(mofa_pm, mofa_predictor):
    """A plugin declaring ``MOFA_CONSTRAINTS_READ_FEATURES = False`` runs in every constraint check
    but not among the feature rules a search re-checks per feature setting; one without the
    declaration runs in both."""
    calls = []

    class Blind:
        MOFA_CONSTRAINTS_READ_FEATURES = False

        @hookimpl
        def mofa_candidate_constraints(self, batch, model, hardware):
            calls.append("blind")
            yield ConstraintResult(name="blind", feasible=batch.pp >= 1, reason="never fails")

    class Reads:
        @hookimpl
        def mofa_candidate_constraints(self, batch, model, hardware):
            calls.append("reads")
            yield ConstraintResult(name="reads", feasible=~batch.feature("cpu_optimizer").enabled, reason="no offload")
    mofa_pm.register_plugin(Blind(), "blind_rules")
    mofa_pm.register_plugin(Reads(), "feature_rules")
    batch, model, hw = _feature_batch(mofa_predictor)
    names = {r.name for r in mofa_predictor.plugin_constraints(batch, model, hw)}
    assert {"blind", "reads", "tp_divides_heads"} <= names and sorted(calls) == ["blind", "reads"]
    calls.clear()
    names = {r.name for r in mofa_predictor.plugin_constraints(batch, model, hw, feature_rules_only=True)}
    assert "reads" in names and not names & {"blind", "tp_divides_heads"} and calls == ["reads"]
    assert "cpu_optimizer_host_memory" in names  # a built-in rule that reads a feature stays


def test_base_constraints_ignore_features(mofa_predictor):
    """The built-in structural rules declare themselves blind to features, and are: the same masks
    with the features on as off (the TP-3 row fails ``tp_divides_heads`` both ways)."""
    from mofa_framework.testing.contract import assert_constraints_ignore_features
    from mofa_plugins import base_constraints

    batch, model, hw = _feature_batch(mofa_predictor)
    assert_constraints_ignore_features(base_constraints, batch, model, hw)
    masks = {r.name: r.feasible for r in base_constraints.mofa_candidate_constraints(batch, model, hw)}
    assert list(masks["tp_divides_heads"]) == [True, True, False, True]


def test_constraints_that_read_features_fail_the_blindness_check(mofa_predictor):
    """The contract check catches a wrong declaration: a rule that depends on a feature."""
    from mofa_framework.testing.contract import assert_constraints_ignore_features

    class Liar:
        MOFA_CONSTRAINTS_READ_FEATURES = False

        @staticmethod
        def mofa_candidate_constraints(batch, model, hardware):
            yield ConstraintResult(name="liar", feasible=~batch.feature("recompute").enabled, reason="no recompute")
    batch, model, hw = _feature_batch(mofa_predictor)
    with pytest.raises(AssertionError, match="liar"):
        assert_constraints_ignore_features(Liar, batch, model, hw)


def test_hook_mofa_register_commands(mofa_pm):
    group = click.Group()

    class P:
        @hookimpl
        def mofa_register_commands(self, cli):
            cli.add_command(click.Command("hello", callback=lambda: click.echo("hi")))
    mofa_pm.register_plugin(P(), "cmds")
    mofa_pm.hook.mofa_register_commands(cli=group)
    assert "hello" in group.commands
