"""The tuner: exactness against brute force, the paper's qualitative findings, and errors."""

import itertools
import json

import attrs
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mofa_framework import Predictor, hookimpl
from mofa_framework.cli import _builtin_commands, cli
from mofa_framework.errors import ConfigError
from mofa_framework.tuner import (CHUNK_ROWS, SearchSpace, TuneRequest, _combos, _count_combos, _pareto, default_space,
                                  feature_choices, megatron_arguments, tune)

_builtin_commands()


def _space(reg, **kw):
    base = dict(tp=(1, 2, 4), pp=(1, 2), vpp=(1, 2), cp=(1,), ep=(1,), etp=(1,), micro_batch_size=(1, 2),
                schedules=("1f1b", "interleaved-1f1b", "zb-h1"),
                features={f: feature_choices(reg, f) for f in ("recompute", "distributed_optimizer", "tp_overlap")})
    base.update(kw)
    return SearchSpace(**base)


# a dense transformer, and a hybrid stack whose stages hold different mixes of Mamba, MLP and attention layers
@pytest.mark.parametrize("model_name", ["llama3-8b", "nemotron-h-8b"])
def test_search_equals_brute_force(mofa_predictor, model_name):
    reg = mofa_predictor.registry
    model, hw = reg.model(model_name), reg.hardware_profile("h100-sxm5-80gb")
    space = _space(reg)
    req = TuneRequest(model=model, hardware=hw, num_gpus=8, global_batch_size=32, sequence_length=4096, space=space,
                      top_k=3)
    result = tune(mofa_predictor, req)
    # brute force: every point of the same space, one plain prediction at a time
    best = (np.inf, None)
    names = sorted(space.features)
    for tp, pp, vpp, mbs, sched in itertools.product(space.tp, space.pp, space.vpp, space.micro_batch_size,
                                                      space.schedules):
        for combo in itertools.product(*[space.features[n] for n in names]):
            features = {n: dict(o) for n, o in zip(names, combo) if o is not None}
            job = {"model": {"name": model_name}, "hardware": {"name": hw.name, "num_gpus": 8},
                   "parallel": {"tp": tp, "pp": pp, "vpp": vpp, "micro_batch_size": mbs, "global_batch_size": 32,
                                "sequence_length": 4096, "sequence_parallel": tp > 1},
                   "pipeline": {"schedule": sched}, "features": features}
            try:
                j = mofa_predictor.job(job)
                r = mofa_predictor.predict(j)[0]
            except ConfigError:
                continue
            m = 32 // (j.dp * mbs)
            if m < pp or not r.fits_in_memory:  # the paper's m ≥ p rule, and memory
                continue
            if r.step_time_s < best[0]:
                best = (r.step_time_s, (tp, pp, vpp, mbs, sched))
    assert result.best[0].step_time_s == pytest.approx(best[0], rel=1e-12)
    c = result.best[0]
    got = (c.parallel["tp"], c.parallel["pp"], c.parallel["vpp"], c.parallel["micro_batch_size"], c.schedule)
    # the same configuration (or an exact tie)
    assert got == best[1] or c.step_time_s == best[0]


def test_context_parallel_search_with_the_all_to_all_form_equals_brute_force(mofa_predictor):
    """CP as ring (with or without its overlap) or as all-to-alls (`cp_a2a`, asked for by name): the
    search over TP × CP × the CP features equals one plain prediction per point (GPT-3 5B, MHA, 32K)."""
    reg = mofa_predictor.registry
    model, hw = reg.model("gpt3-5b"), reg.hardware_profile("h100-sxm5-80gb")
    names = ("cp_a2a", "cp_overlap", "tp_overlap")
    space = _space(reg, tp=(1, 2, 4), pp=(1,), vpp=(1,), cp=(1, 2, 4), micro_batch_size=(1,), schedules=("1f1b",),
                   features={f: feature_choices(reg, f) for f in names})
    req = TuneRequest(model=model, hardware=hw, num_gpus=8, global_batch_size=8, sequence_length=32768, space=space,
                      top_k=3)
    result = tune(mofa_predictor, req)
    best = (np.inf, None)
    for tp, cp in itertools.product(space.tp, space.cp):
        for combo in itertools.product(*[space.features[n] for n in names]):
            features = {n: dict(o) for n, o in zip(names, combo) if o is not None}
            job = {"model": {"name": "gpt3-5b"}, "hardware": {"name": hw.name, "num_gpus": 8},
                   "parallel": {"tp": tp, "cp": cp, "micro_batch_size": 1, "global_batch_size": 8,
                                "sequence_length": 32768, "sequence_parallel": tp > 1}, "features": features}
            try:
                r = mofa_predictor.predict(mofa_predictor.job(job))[0]
            except ConfigError:
                continue
            if r.fits_in_memory and r.step_time_s < best[0]:
                best = (r.step_time_s, (tp, cp, tuple(sorted(features))))
    assert result.best[0].step_time_s == pytest.approx(best[0], rel=1e-12), best


def test_results_are_all_feasible_and_rank_ordered(mofa_predictor):
    reg = mofa_predictor.registry
    model, hw = reg.model("llama3-70b"), reg.hardware_profile("h100-sxm5-80gb")
    space = default_space(reg, model, hw, 64, 4096, features=["recompute", "distributed_optimizer"])
    result = tune(mofa_predictor, TuneRequest(model=model, hardware=hw, num_gpus=64, global_batch_size=128,
                                              sequence_length=4096, space=space, top_k=8))
    times = [c.step_time_s for c in result.best]
    assert times == sorted(times) and len(times) == 8
    for c in result.best:
        p = c.parallel
        job = mofa_predictor.job({
            "model": {"name": "llama3-70b"}, "hardware": {"name": hw.name, "num_gpus": 64},
            "parallel": {k: p[k] for k in ("tp", "pp", "vpp", "cp", "micro_batch_size", "global_batch_size",
                                           "sequence_length", "sequence_parallel")},
            "pipeline": {"schedule": c.schedule}, "features": c.features})
        r = mofa_predictor.predict(job)[0]  # raises if any rule is broken
        assert r.fits_in_memory and r.peak_memory_gib <= hw.memory.hbm_gib
        assert r.step_time_s == pytest.approx(c.step_time_s, rel=1e-12)
        assert p["tp"] <= hw.scaleup_domain_gpus


def test_empty_space_says_why(mofa_predictor):
    reg = mofa_predictor.registry
    model, hw = reg.model("llama3.1-405b"), reg.hardware_profile("a100-sxm4-40gb")
    space = default_space(reg, model, hw, 8, 4096, features=["recompute"])
    result = tune(mofa_predictor, TuneRequest(model=model, hardware=hw, num_gpus=8, global_batch_size=8,
                                              sequence_length=4096, space=space))
    assert not result.best
    why = result.why_empty()
    assert "memory" in why and "GiB" in why


def test_an_empty_space_ruled_out_by_the_memory_floor_says_so_first(mofa_predictor):
    """405B on 8 H100s with the distributed optimizer: every node's memory floor is over the HBM, so
    no leaf is evaluated; the line still says memory is why, first (the CLI cuts long lines at the
    end), with the smallest floor as a lower bound of the peaks."""
    reg = mofa_predictor.registry
    model, hw = reg.model("llama3.1-405b"), reg.hardware_profile("h100-sxm5-80gb")
    space = default_space(reg, model, hw, 8, 4096, features=["distributed_optimizer", "recompute"])
    result = tune(mofa_predictor, TuneRequest(model=model, hardware=hw, num_gpus=8, global_batch_size=8,
                                              sequence_length=4096, space=space))
    assert not result.best and result.evaluated == 0
    why = result.why_empty()
    assert why.index("need more memory than the GPU has (smallest peak at least") < why.index("the rules removed")
    assert result.min_peak_memory_gib > hw.memory.hbm_gib


def test_vpp8_beats_vpp16_when_pp_comm_is_exposed(mofa_predictor):
    """§5.5.1: LLaMA3-405B on 2,048 GPUs: raising v multiplies exposed PP communication in
    warmup/cooldown, so v = 8 beats v = 16 (a 128-layer variant so both divide the layers;
    Llama 3's 16M-token batch, 2,048 sequences: m = 64 micro-batches per pipeline)."""
    reg = mofa_predictor.registry
    model = attrs.evolve(reg.model("llama3.1-405b"), num_layers=128)
    hw = reg.hardware_profile("h100-sxm5-80gb")
    space = SearchSpace(tp=(8,), pp=(8,), vpp=(8, 16), cp=(1,), ep=(1,), etp=(1,), micro_batch_size=(1,),
                        schedules=("interleaved-1f1b",),
                        features={"distributed_optimizer": ({},), "recompute": ({"granularity": "full"},)})
    result = tune(mofa_predictor, TuneRequest(model=model, hardware=hw, num_gpus=2048, global_batch_size=2048,
                                              sequence_length=8192, space=space, top_k=2))
    by_v = {c.parallel["vpp"]: c for c in result.best}
    assert result.best[0].parallel["vpp"] == 8
    assert by_v[16].pp_comm_s > by_v[8].pp_comm_s * 1.5
    assert by_v[16].breakdown["bubble"] < by_v[8].breakdown["bubble"]  # the bubble still shrinks with v


def test_cpu_optimizer_fits_405b_on_64_gpus_of_hardware_b(mofa_predictor):
    """§5.5.2 / Table 6: LLaMA3-405B fits on 64 GPUs of hardware B (64 GB) with the CPU
    optimizer; with the distributed optimizer (DP = 1 at TP8·PP8) it does not."""
    reg = mofa_predictor.registry
    model, hw = reg.model("llama3.1-405b"), reg.hardware_profile("paper-b")
    base = dict(tp=(8,), pp=(8,), vpp=(1,), cp=(1,), ep=(1,), etp=(1,), micro_batch_size=(1,), schedules=("1f1b",))
    common = dict(model=model, hardware=hw, num_gpus=64, global_batch_size=16, sequence_length=4096)
    with_cpu = tune(mofa_predictor, TuneRequest(**common, space=SearchSpace(
        **base, features={"cpu_optimizer": feature_choices(reg, "cpu_optimizer", allow_off=False),
                          "recompute": feature_choices(reg, "recompute")})))
    assert with_cpu.best, with_cpu.why_empty()
    assert with_cpu.best[0].peak_memory_gib < hw.memory.hbm_gib
    assert "cpu_optimizer" in with_cpu.best[0].features
    with_dist = tune(mofa_predictor, TuneRequest(**common, space=SearchSpace(
        **base, features={"distributed_optimizer": feature_choices(reg, "distributed_optimizer", allow_off=False),
                          "recompute": feature_choices(reg, "recompute")})))
    assert not with_dist.best and "memory" in with_dist.why_empty()


def test_dp_overlap_improves_scaling_linearity(mofa_predictor):
    """§5.6.1: weak scaling of data parallelism is more linear with DP overlap."""
    def throughput(gpus, overlap):
        feats = {"distributed_optimizer": {}, **({"dp_overlap": {}} if overlap else {})}
        job = mofa_predictor.job({"model": {"name": "llama2-70b"}, "hardware": {"name": "h100-sxm5-80gb",
                                                                                 "num_gpus": gpus},
                                  "parallel": {"tp": 8, "pp": 4, "vpp": 5, "micro_batch_size": 1,
                                               "global_batch_size": gpus // 2, "sequence_length": 4096},
                                  "features": feats})
        return mofa_predictor.predict(job)[0].tokens_per_s_per_gpu
    sizes = (64, 256, 1024, 4096)
    lin = {o: [throughput(n, o) / throughput(sizes[0], o) for n in sizes] for o in (False, True)}
    assert all(a >= b - 1e-12 for a, b in zip(lin[True], lin[False]))
    assert lin[True][-1] > lin[False][-1]


def test_megatron_arguments(mofa_predictor):
    reg = mofa_predictor.registry
    model, hw = reg.model("llama3-70b"), reg.hardware_profile("h100-sxm5-80gb")
    space = SearchSpace(tp=(8,), pp=(4,), vpp=(5,), cp=(1,), ep=(1,), etp=(1,), micro_batch_size=(1,),
                        schedules=("interleaved-1f1b",),
                        features={"distributed_optimizer": ({},), "recompute": ({"granularity": "selective"},),
                                  "tp_overlap": ({"chunks": 4},), "dp_overlap": ({},)})
    best = tune(mofa_predictor, TuneRequest(model=model, hardware=hw, num_gpus=64, global_batch_size=64,
                                            sequence_length=4096, space=space)).best[0]
    args, _ = megatron_arguments(model, best, reg)
    for a in ("--tensor-model-parallel-size 8", "--pipeline-model-parallel-size 4",
              "--num-layers-per-virtual-pipeline-stage 4", "--sequence-parallel", "--use-distributed-optimizer",
              "--overlap-grad-reduce", "--tp-comm-overlap", "--recompute-granularity selective",
              "--micro-batch-size 1", "--global-batch-size 64", "--bf16"):
        assert a in args, a


def test_python_tune_is_the_cli_search(mofa_predictor):
    """`Predictor.tune` / `mofa.tune` run the search `mofa tune` runs for the same job and flags
    (`tuner.job_request` builds both): the same ranked configurations; a bad name is one
    ConfigError naming the argument."""
    import mofa_framework as mofa

    job = mofa_predictor.job({"model": {"name": "llama3-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 8},
                              "parallel": {"global_batch_size": 32, "sequence_length": 4096}})
    res = mofa_predictor.tune(job, values={"tp": (1, 2), "pp": (1, 2)}, features=["recompute", "distributed_optimizer"],
                              top_k=3)
    out = json.loads(CliRunner().invoke(cli, ["tune", "--model", "llama3-8b", "--hardware", "h100-sxm5-80gb", "--gpus",
                                              "8", "--gbs", "32", "--seq", "4096", "--tp-values", "1,2", "--pp-values",
                                              "1,2", "--features", "recompute,distributed_optimizer", "--format",
                                              "json", "--top", "3"], catch_exceptions=False).output)
    assert [c.step_time_s for c in res.best] == pytest.approx([b["step_time_s"] for b in out["best"]], rel=1e-12)
    assert [c.parallel["tp"] for c in res.best] == [b["parallel"]["tp"] for b in out["best"]]
    assert res.evaluated == out["evaluated"] and res.floored == out["ruled_out_by_memory_floor"]
    assert mofa.tune(job, values={"tp": (1,), "pp": (1,)}, top_k=1).best[0].parallel["tp"] == 1
    with pytest.raises(ConfigError, match="values: 'tpp'"):
        mofa_predictor.tune(job, values={"tpp": (8,)})
    with pytest.raises(ConfigError, match="features: unknown feature 'nope'"):
        mofa_predictor.tune(job, features=["nope"])
    # one name or one value stands for a list of one
    one = mofa_predictor.tune(job, values={"tp": 2, "pp": 1}, features="recompute", schedules="1f1b", top_k=1)
    assert one.best[0].parallel["tp"] == 2 and one.best[0].schedule == "1f1b"


@pytest.mark.parametrize("kwargs, line", [
    ({"values": {"tp": (0,)}}, "values: tp: 0 is out of range"),
    ({"values": {"tp": (2.5,)}}, "values: tp[0]: expected an integer, got 2.5"),
    ({"values": {"tp": "8"}}, "values: tp[0]: expected an integer, got '8'"),
    ({"values": {"tp": ()}}, "values: tp: an empty list searches nothing"),
    ({"values": {"tp": (10**30,)}}, "values: tp[0]: 10**30 is too large"),
    ({"values": 5}, "values: expected a mapping of sizes to values"),
    ({"features": 5}, "features: expected a name or a list of names, got 5"),
    ({"schedules": [1]}, "schedules: expected a name or a list of names"),
    ({"objective": "fastest"}, "objective: 'fastest' is not an objective; use one of step_time"),
    ({"top_k": 0}, "top_k: expected an integer ≥ 1"),
    ({"top_k": "3"}, "top_k: expected an integer ≥ 1"),
    ({"time_budget_s": -1}, "time_budget_s: expected seconds > 0"),
    ({"time_budget_s": float("nan")}, "time_budget_s: expected seconds > 0"),
    ({"memory_headroom_gib": -1}, "memory_headroom_gib: expected GiB ≥ 0"),
    ({"memory_headroom_gib": "4"}, "memory_headroom_gib: expected GiB ≥ 0"),
    ({"memory_headroom_gib": 80}, "memory_headroom_gib: 80 GiB leaves none of h100-sxm5-80gb's 80 GiB"),
])
def test_python_tune_refuses_bad_arguments_in_one_line(mofa_predictor, kwargs, line):
    """Every argument of `Predictor.tune` is checked before the search: one ConfigError naming the
    argument (the `[search]` ranges as a job file's are), never a TypeError from inside."""
    job = mofa_predictor.job({"model": {"name": "llama3-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 8},
                              "parallel": {"global_batch_size": 32, "sequence_length": 4096}})
    with pytest.raises(ConfigError) as exc:
        mofa_predictor.tune(job, **kwargs)
    assert str(exc.value).startswith(line) and "\n" not in str(exc.value)


def test_cli_tune_formats_and_errors(tmp_path):
    run = lambda *a: CliRunner().invoke(cli, ["tune", *a], catch_exceptions=False)  # noqa: E731
    flags = ["--model", "llama3-8b", "--hardware", "h100-sxm5-80gb", "--gpus", "8", "--gbs", "32", "--seq", "4096",
             "--tp-values", "1,2", "--pp-values", "1,2", "--features", "recompute,distributed_optimizer"]
    out = json.loads(run(*flags, "--format", "json", "--top", "3").output)
    assert len(out["best"]) == 3 and out["evaluated"] > 0 and "--tensor-model-parallel-size" in out["megatron_args"][0]
    csv_out = run(*flags, "--format", "csv").output.splitlines()
    assert csv_out[0].startswith("rank,step_time_s")
    assert "--pipeline-model-parallel-size" in run(*flags, "--format", "megatron").output
    table = run(*flags, "--pareto")
    assert table.exit_code == 0 and "Pareto front" in table.output
    bad = run(*flags[:-2], "--features", "nope")
    assert bad.exit_code == 2 and "nope" in bad.output
    bad = run(*flags, "--tp-values", "x,2")
    assert bad.exit_code == 2 and "--tp-values" in bad.output
    empty = run("--model", "llama3.1-405b", "--hardware", "a100-sxm4-40gb", "--gpus", "8", "--gbs", "8", "--seq",
                "4096", "--features", "recompute")
    assert empty.exit_code == 2 and "memory" in empty.output
    assert len(empty.output.strip().splitlines()) == 1
    job = tmp_path / "t.toml"
    job.write_text('[model]\nname = "llama3-8b"\n[hardware]\nname = "h100-sxm5-80gb"\nnum_gpus = 8\n'
                   '[parallel]\nglobal_batch_size = 32\nsequence_length = 4096\n'
                   '[search]\ntp = [2, 4]\npp = [1]\nfeatures = ["distributed_optimizer"]\n'
                   '[training]\ntokens = 1e10\n')
    out = json.loads(run(str(job), "--format", "json").output)
    assert {c["parallel"]["tp"] for c in out["best"]} <= {2, 4}
    e2e = json.loads(run(str(job), "--format", "json", "--objective", "e2e_time").output)
    assert e2e["best"][0]["total_time_s"] > e2e["best"][0]["step_time_s"]


def test_tune_holds_the_jobs_own_features_on_even_when_not_searched(tmp_path):
    """fp8 and cuda_graphs are not searched by default, but a job file that enables them keeps them,
    with their options, on every candidate and in the Megatron arguments."""
    job = tmp_path / "t.toml"
    job.write_text('[model]\nname = "llama3-8b"\n[hardware]\nname = "h100-sxm5-80gb"\nnum_gpus = 8\n'
                   '[parallel]\nglobal_batch_size = 32\nsequence_length = 4096\n'
                   '[features.fp8]\nrecipe = "tensorwise"\n[features.cuda_graphs]\n'
                   '[search]\ntp = [1, 2]\npp = [1]\n')
    out = json.loads(CliRunner().invoke(cli, ["tune", str(job), "--format", "json", "--top", "3"],
                                        catch_exceptions=False).stdout)  # stderr's progress lines apart
    assert all({"fp8", "cuda_graphs"} <= set(c["features"]) for c in out["best"])
    assert all(c["features"]["fp8"]["recipe"] == "tensorwise" for c in out["best"])
    args = " ".join(out["megatron_args"])
    assert "--fp8-recipe tensorwise" in args and "--cuda-graph-impl local" in args


def test_disabled_plugin_leaves_prediction_and_tuning(monkeypatch):
    from mofa_framework import Predictor

    monkeypatch.delenv("MOFA_DISABLED_PLUGINS", raising=False)
    pred = Predictor(disabled=["tp_overlap"])
    reg = pred.registry
    assert "tp_overlap" not in reg.features
    model, hw = reg.model("llama3.1-405b"), reg.hardware_profile("h100-sxm5-80gb")
    assert "tp_overlap" not in default_space(reg, model, hw, 2048, 8192).features
    out = json.loads(CliRunner().invoke(cli, ["--disable-plugin", "tp_overlap", "tune", "--model", "llama3.1-405b",
                                              "--hardware", "h100-sxm5-80gb", "--gpus", "2048", "--gbs", "1024",
                                              "--seq", "8192", "--tp-values", "8", "--pp-values", "8,16",
                                              "--features", "distributed_optimizer,recompute",
                                              "--format", "json"]).output)
    assert all("tp_overlap" not in c["features"] for c in out["best"])
    bad = CliRunner().invoke(cli, ["--disable-plugin", "tp_overlap", "tune", "--model", "llama3-8b", "--hardware",
                                   "h100-sxm5-80gb", "--gpus", "8", "--gbs", "32", "--seq", "4096", "--features",
                                   "tp_overlap"])
    assert bad.exit_code == 2 and "tp_overlap" in bad.output


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_feature_combinations_are_the_conflict_free_product(mofa_predictor, data):
    """`_combos` builds the conflict-free combinations one feature at a time; they are exactly the
    rows of the full product (itertools) that turn on no two conflicting features, in its order,
    and `_count_combos` counts them."""
    reg = mofa_predictor.registry
    names = data.draw(st.lists(st.sampled_from(sorted(reg.features)), min_size=0, max_size=6, unique=True))
    model, hw = reg.model("mixtral-8x7b"), reg.hardware_profile("h100-sxm5-80gb")
    space = default_space(reg, model, hw, 64, 4096, features=names)
    req = TuneRequest(model=model, hardware=hw, num_gpus=64, global_batch_size=128, sequence_length=4096, space=space)
    choices = [space.features[n] for n in names]
    clash = lambda a, b: b in reg.features[a].conflicts or a in reg.features[b].conflicts  # noqa: E731
    expected = [row for row in itertools.product(*(range(len(c)) for c in choices))
                if not any(choices[i][row[i]] is not None and choices[j][row[j]] is not None
                           and clash(names[i], names[j])
                           for i in range(len(names)) for j in range(i + 1, len(names)))]
    got = _combos(req, reg, names)
    assert got.shape == (len(expected), len(names))
    assert [tuple(r) for r in got.tolist()] == expected
    assert _count_combos(req, reg, names) == len(expected)


def test_pareto_front_breaks_exact_ties_by_the_tie_keys():
    """(step, memory) both minimised; of points equal in both, the first in the tie keys (features
    on, then structure, then leaf) stands for them, whatever their order in the arrays."""
    t = np.array([1.0, 1.0, 2.0, 1.0, 3.0, 2.0])
    mem = np.array([5.0, 5.0, 3.0, 6.0, 3.0, 3.0])
    tie = np.array([[2, 1, 1, 0, 0, 1],    # features on
                    [0, 9, 4, 0, 0, 3],    # structure
                    [0, 0, 0, 0, 0, 0]])   # leaf
    assert _pareto(t, mem) == [0, 2]            # without keys: the first of each tie in the arrays
    assert _pareto(t, mem, tie) == [1, 5]       # fewer features on (1 < 2), then the lower structure
    assert _pareto(t[:0], mem[:0], tie[:, :0]) == []


def test_default_space_searches_what_mofa_tune_searches(mofa_predictor):
    """`default_space` without `features` is `mofa tune`'s default: every tunable feature, never
    numerics (fp8, nvfp4), fine-tuning methods (lora) or software-stack settings (cuda_graphs),
    which a programmatic tune would otherwise search on and off (all 22 features: 3.2 M feature
    combinations per structure and a minute of set-up; the 14 tunable ones: 26,112)."""
    reg = mofa_predictor.registry
    space = default_space(reg, reg.model("gpt-oss-20b"), reg.hardware_profile("h100-sxm5-80gb"), 64, 4096)
    assert set(space.features) == {n for n, f in reg.features.items() if f.tunable}
    assert not {"lora", "fp8", "nvfp4", "cuda_graphs", "kernel_scaling"} & set(space.features)
    assert {"recompute", "distributed_optimizer", "tp_overlap"} <= set(space.features)


def test_chunk_size_does_not_change_the_answer(mofa_predictor):
    """Best-first expansion pops nodes in chunks of about `chunk_rows` candidates; how many at a
    time changes the order of work, never the answer (the bounds are exact)."""
    reg = mofa_predictor.registry
    model, hw = reg.model("llama3-70b"), reg.hardware_profile("h100-sxm5-80gb")
    space = default_space(reg, model, hw, 256, 4096, features=["recompute", "distributed_optimizer", "tp_overlap"])
    # fp16 and FlashAttention-2: every schedule runs, the ZeroBubble fork's too (its rules)
    common = dict(model=model, hardware=hw, num_gpus=256, global_batch_size=512, sequence_length=4096, space=space,
                  top_k=5, precision="fp16", attention_kernel="fa2")
    small = tune(mofa_predictor, TuneRequest(**common, chunk_rows=64))
    large = tune(mofa_predictor, TuneRequest(**common, chunk_rows=1 << 20))
    assert [c.step_time_s for c in small.best] == [c.step_time_s for c in large.best]
    assert [c.parallel for c in small.best] == [c.parallel for c in large.best]
    # a Pareto front evaluates every leaf in chunks of PARETO_CHUNK_ROWS unless told otherwise: the
    # same front, configurations and leaves as at the best-first chunk size (of configurations equal
    # in time and memory the one with fewer features on stands, whatever order they were evaluated in)
    front = {n: tune(mofa_predictor, TuneRequest(**common, pareto=True, chunk_rows=n))
             for n in (None, CHUNK_ROWS, 4096)}
    rows = {n: [(c.step_time_s, c.peak_memory_gib, c.parallel, c.schedule, c.features) for c in f.pareto]
            for n, f in front.items()}
    assert rows[None] == rows[CHUNK_ROWS] == rows[4096]
    # (the leaves reached span several chunks; those whose node's memory floor exceeds the GPU are
    # counted as memory failures, not evaluated)
    assert front[None].pareto and front[None].evaluated == front[CHUNK_ROWS].evaluated
    assert front[None].evaluated + front[None].removed_by["peak memory exceeds the GPU's HBM"] > 2 * 4096


# ---------------------------------------------------------------- exactness on an MoE model, every objective

_MOE_SPACE = dict(tp=(1, 2), pp=(1, 2, 4), vpp=(1, 2), cp=(1,), ep=(1, 2, 8), etp=(1,), micro_batch_size=(1,),
                  schedules=("1f1b", "interleaved-1f1b", "zb-h1"), lighter_ends=(0, 2), lighter_last=(0, 2, 4))
_MOE_FEATURES = ("ep_overlap", "recompute", "distributed_optimizer")


def _oracle(predictor, hw_name: str, gpus: int, gbs: int, seq: int, space=_MOE_SPACE, feature_names=_MOE_FEATURES):
    """Every point of the MoE sub-space as a plain job, predicted in one batch, with the rules
    applied by hand: the plugins' constraints (as `mofa predict` does), the paper's §4.1 rules
    (tp within a scale-up domain, m ≥ the schedule's minimum, vpp only where the schedule
    interleaves) and lighter_ends = d, lighter_last = e placing mid = (L + 2d + e)/pp layers on each
    middle stage, mid − d on the first and mid − d − e on the last.
    Returns (jobs, prediction, feasible mask)."""
    from mofa_framework.config import jobs_to_batch

    reg = predictor.registry
    hw = reg.hardware_profile(hw_name)
    layers = reg.model("mixtral-8x7b").num_layers
    names = sorted(feature_names)
    choices = [feature_choices(reg, n) for n in names]
    jobs = []
    s = space
    for tp, pp, vpp, ep, sched, d, e in itertools.product(s["tp"], s["pp"], s["vpp"], s["ep"], s["schedules"],
                                                         s["lighter_ends"], s["lighter_last"]):
        sch = reg.schedule(sched)
        if tp > hw.scaleup_domain_gpus or (vpp > 1) != sch.requires_vpp or gpus % (tp * pp):
            continue
        if gbs // (gpus // (tp * pp)) < sch.min_microbatches(pp):
            continue
        ends = {}
        if d or e:
            mid = (layers + 2 * d + e) // pp
            if pp < (3 if d else 2) or (layers + 2 * d + e) % pp or mid - d - e < 1:
                continue
            ends = {"first_stage_layers": mid - d, "last_stage_layers": mid - d - e}
        for combo in itertools.product(*choices):
            features = {n: dict(o) for n, o in zip(names, combo) if o is not None}
            try:
                jobs.append(predictor.job({
                    "model": {"name": "mixtral-8x7b"}, "hardware": {"name": hw_name, "num_gpus": gpus},
                    "parallel": {"tp": tp, "pp": pp, "vpp": vpp, "ep": ep, "etp": 1, "micro_batch_size": 1,
                                 "global_batch_size": gbs, "sequence_length": seq, **ends},
                    "pipeline": {"schedule": sched}, "features": features, "training": {"tokens": 1e11}}))
            except ConfigError:
                continue
    batch = jobs_to_batch(jobs, reg)
    ok = np.ones(len(jobs), bool)
    for r in predictor.constraints(batch, jobs[0].model, hw):
        ok &= np.asarray(r.feasible, bool)
    return jobs, predictor.evaluate(batch, jobs[0].model, hw), ok


_ORACLES: dict = {}  # built once per GPU for the six tests below


def _moe_case(predictor, hw_name):
    if hw_name not in _ORACLES:
        _ORACLES[hw_name] = _oracle(predictor, hw_name, 16, 32, 4096)
    return _ORACLES[hw_name]


def _e2e_of(predictor, job):
    from mofa_framework.e2e import e2e_inputs, e2e_time

    kwargs = e2e_inputs(job, predictor.registry).model_kwargs()
    return lambda step, batch=None: e2e_time(step, **kwargs)


@pytest.mark.parametrize("objective", ["step_time", "e2e_time", "gpu_hours"])
@pytest.mark.parametrize("hw_name", ["h100-sxm5-80gb", "a100-sxm4-80gb"])
def test_moe_search_equals_brute_force_for_every_objective(mofa_predictor, objective, hw_name):
    """The branch and bound's optimum is the brute-force optimum of an MoE sub-space (Mixtral 8×7B
    on 16 GPUs: EP, interleaving, end stages two layers lighter, EP overlap, recompute, distributed
    optimizer) for step time, end-to-end time and GPU-hours, on H100s and on A100s where memory
    decides (the fastest configuration does not fit). Cost: ~2 s for the six cases."""
    reg = mofa_predictor.registry
    jobs, pred, ok = _moe_case(mofa_predictor, hw_name)
    e2e = _e2e_of(mofa_predictor, jobs[0])
    step = pred.step_time_s
    value = {"step_time": step, "e2e_time": e2e(step).total_time_s,
             "gpu_hours": e2e(step).total_time_s * 16 / 3600}[objective]
    fits = ok & pred.fits_in_memory
    best = int(np.argmin(np.where(fits, value, np.inf)))
    if hw_name == "a100-sxm4-80gb":
        assert not fits[int(np.argmin(np.where(ok, value, np.inf)))], "the A100 case must be memory-bound"
    space = SearchSpace(**_MOE_SPACE, features={n: feature_choices(reg, n) for n in _MOE_FEATURES})
    req = TuneRequest(model=jobs[0].model, hardware=jobs[0].hardware, num_gpus=16, global_batch_size=32,
                      sequence_length=4096, space=space, objective=objective, top_k=3,
                      e2e=e2e if objective != "step_time" else None)
    result = tune(mofa_predictor, req)
    assert result.best[0].objective_value == pytest.approx(float(value[best]), rel=1e-12)
    assert result.best[0].step_time_s == pytest.approx(float(step[best]), rel=1e-12)
    # tokens/s/GPU: the same optimum (the global batch and GPU count are fixed)
    tps = np.where(fits, pred.tokens_per_s_per_gpu, -np.inf)
    if objective == "step_time":
        assert result.best[0].step_time_s == pytest.approx(32 * 4096 / (float(tps.max()) * 16), rel=1e-12)
        assert result.best[0].peak_memory_gib <= jobs[0].hardware.memory.hbm_gib
    else:
        assert result.best[0].ettr is not None and 0 < result.best[0].ettr <= 1
        assert result.best[0].checkpoint_interval_steps >= 1


def test_every_candidate_is_brute_forces_candidate_set(mofa_predictor):
    """``tuner.every_candidate`` yields exactly the jobs the hand-built oracle keeps (every rule applied),
    whatever the batch size: the same number of configurations and the same step times, so the
    evaluator benchmark prices what brute force prices — and its best that fits is the search's."""
    from mofa_framework.tuner import every_candidate

    reg = mofa_predictor.registry
    jobs, pred, ok = _moe_case(mofa_predictor, "h100-sxm5-80gb")
    space = SearchSpace(**_MOE_SPACE, features={n: feature_choices(reg, n) for n in _MOE_FEATURES})
    req = TuneRequest(model=jobs[0].model, hardware=jobs[0].hardware, num_gpus=16, global_batch_size=32,
                      sequence_length=4096, space=space, top_k=1)
    expected = np.sort(pred.step_time_s[ok])
    for chunk_rows in (1, 1000, 1 << 17):
        steps, fits = [], []
        for batch, structure in every_candidate(mofa_predictor, req, chunk_rows=chunk_rows):
            p = mofa_predictor.evaluate(batch, req.model, req.hardware, structure=structure)
            steps.append(p.step_time_s)
            fits.append(p.fits_in_memory)
        steps, fits = np.concatenate(steps), np.concatenate(fits)
        np.testing.assert_allclose(np.sort(steps), expected, rtol=1e-12)
    assert tune(mofa_predictor, req).best[0].step_time_s == pytest.approx(float(steps[fits].min()), rel=1e-12)


def test_pipeline_level_nodes_with_no_leaf_in_memory_are_never_popped(mofa_predictor, monkeypatch):
    """The memory-bound A100 case (20 GiB of headroom: most layouts do not fit): a pipeline-level node
    whose memory floor is over the HBM is dropped when it is bounded (its leaves counted as memory
    failures), so the search pops fewer of them than with the floors turned off (every node kept, to
    be ruled out when popped) — for the same optimum. (The leaves evaluated may differ by a few: the
    nodes ruled out count as reached either way, but at different times, and how many nodes a pop
    takes depends on those counts.)"""
    import mofa_framework.tuner as tuner

    reg = mofa_predictor.registry
    jobs, pred, ok = _moe_case(mofa_predictor, "a100-sxm4-80gb")
    space = SearchSpace(**_MOE_SPACE, features={n: feature_choices(reg, n) for n in _MOE_FEATURES})
    req = TuneRequest(model=jobs[0].model, hardware=jobs[0].hardware, num_gpus=16, global_batch_size=32,
                      sequence_length=4096, space=space, top_k=3, chunk_rows=16, memory_headroom_gib=20.0)
    dropped, popped = [], []
    room, evaluate = tuner._Search._room_below, tuner._Search.evaluate
    monkeypatch.setattr(tuner._Search, "_room_below",
                        lambda self, *a: dropped.append(int((~(r := room(self, *a))).sum())) or r)
    monkeypatch.setattr(tuner._Search, "evaluate", lambda self, grp, *a: popped.append(len(grp)) or evaluate(self, grp, *a))
    floored = tune(mofa_predictor, req)
    with_floors = sum(popped)
    popped.clear()
    monkeypatch.setattr(tuner._Search, "_room_below", lambda self, todo, *a: np.ones(len(todo), bool))
    kept = tune(mofa_predictor, req)
    assert sum(dropped) > 0 and with_floors < sum(popped)
    assert [c.step_time_s for c in floored.best] == [c.step_time_s for c in kept.best]
    assert floored.removed_by[tuner.OVER_HBM] > 0 and kept.removed_by[tuner.OVER_HBM] > 0


_LATTICE_SPACE = dict(_MOE_SPACE, tp=(2,), pp=(2, 4), vpp=(1,), ep=(2, 8), schedules=("1f1b",), lighter_ends=(0,),
                      lighter_last=(0, 2))
_LATTICE_FEATURES = ("activation_offload", "distributed_optimizer", "fsdp", "memfine", "recompute", "weight_offload")


def test_the_lattice_of_time_adding_features_keeps_the_search_exact(mofa_predictor):
    """The features that only add time (MemFine, recompute, activation offloading, FSDP and weight
    offloading, the last two exclusive: one level) are decided level by level (the order that keeps
    each level a bound is checked by the contracts test above): on Mixtral 8×7B on 16 A100 40GB,
    where memory decides, the optimum equals brute force."""
    from mofa_framework.tuner import _levels

    reg = mofa_predictor.registry
    assert [k for k, _ in _levels(reg, sorted(_LATTICE_FEATURES))] == ["settled", *["busy"] * 4, "pipeline"]
    jobs, pred, ok = _oracle(mofa_predictor, "a100-sxm4-40gb", 16, 32, 4096, _LATTICE_SPACE, _LATTICE_FEATURES)
    fits = ok & pred.fits_in_memory
    assert not fits[int(np.argmin(np.where(ok, pred.step_time_s, np.inf)))], "the case must be memory-bound"
    best = float(pred.step_time_s[int(np.argmin(np.where(fits, pred.step_time_s, np.inf)))])
    space = SearchSpace(**_LATTICE_SPACE, features={n: feature_choices(reg, n) for n in _LATTICE_FEATURES})
    req = TuneRequest(model=jobs[0].model, hardware=jobs[0].hardware, num_gpus=16, global_batch_size=32,
                      sequence_length=4096, space=space, top_k=3)
    assert tune(mofa_predictor, req).best[0].step_time_s == pytest.approx(best, rel=1e-12)


def test_the_lattice_shares_a_level_between_features_that_exclude_one_another(mofa_predictor):
    """By hand from the built-ins' `conflicts`: ZeRO excludes FSDP, weight offloading excludes both,
    so the three (consecutive in the layer phase's order) are decided on one level, where their
    settings add up instead of multiplying; MemFine, recompute and activation offloading exclude
    nothing and get a level each."""
    from mofa_framework.tuner import _lattice_order, _lattice_steps

    reg = mofa_predictor.registry
    names = ["activation_offload", "deepspeed_zero", "fsdp", "memfine", "recompute", "weight_offload"]
    order = _lattice_order(reg, names)
    assert order == ["memfine", "recompute", "activation_offload", "deepspeed_zero", "fsdp", "weight_offload"]
    assert _lattice_steps(reg, order) == [{"memfine"}, {"recompute"}, {"activation_offload"},
                                          {"deepspeed_zero", "fsdp", "weight_offload"}]
    # without weight offloading the other two still exclude each other; recompute between them would part them
    assert _lattice_steps(reg, ["deepspeed_zero", "fsdp"]) == [{"deepspeed_zero", "fsdp"}]
    assert _lattice_steps(reg, ["deepspeed_zero", "recompute", "fsdp"]) == [{"deepspeed_zero"}, {"recompute"}, {"fsdp"}]
    # one busy level, every layer feature set, when there is nothing to split (none, or one step)
    from mofa_framework.tuner import _levels

    for searched in (["tp_overlap"], ["recompute", "tp_overlap"], ["fsdp", "weight_offload"]):
        levels = _levels(reg, searched)
        assert [k for k, _ in levels] == ["settled", "busy", "pipeline"]
        assert [n for n in searched if levels[1][1](reg.features[n])] == searched


def test_a_memory_bound_search_pops_larger_chunks():
    """Hand values of the pop budget: the chunk until a chunk of leaves has been reached, then
    MEMORY_BOUND_GROWTH chunks while fewer than MEMORY_BOUND_SHARE of them fit; never when the
    request sets the chunk (or asks for a front: `adaptive` off), nor for pipeline-level nodes
    (depth 3 of 3 levels below the structures: their children are leaves)."""
    from types import SimpleNamespace

    from mofa_framework.tuner import MEMORY_BOUND_GROWTH, MEMORY_BOUND_SHARE, _Search

    def budget(evaluated, floored, feasible, adaptive=True, depth=1):
        search = SimpleNamespace(chunk_rows=1000, adaptive=adaptive, evaluated=evaluated, floored=floored,
                                 feasible=feasible, level_kinds=("settled", "busy", "pipeline"))
        search.memory_bound = lambda: _Search.memory_bound(search)
        return _Search.budget(search, depth)

    assert (MEMORY_BOUND_SHARE, MEMORY_BOUND_GROWTH) == (0.05, 2)
    assert budget(999, 0, 0) == 1000  # fewer than a chunk of leaves reached: too early to tell
    assert budget(600, 400, 49) == 2000  # 1,000 reached (evaluated or ruled out by their floor), 4.9 % fit
    assert budget(600, 400, 49, depth=2) == 2000  # the level above the pipeline level
    assert budget(600, 400, 49, depth=3) == 1000  # pipeline-level nodes: one chunk at a time
    assert budget(600, 400, 50) == 1000  # 5 % fit: not memory-bound
    assert budget(100_000, 0, 10, adaptive=False) == 1000


def test_the_grown_chunk_keeps_a_memory_bound_search_exact(mofa_predictor, monkeypatch):
    """The memory-bound A100 case of the brute-force test above, with 20 GiB of headroom (its leaves
    mostly do not fit) and a chunk small enough that the search grows it: the same optimum as brute
    force and as a fixed chunk of the same size."""
    import mofa_framework.tuner as tuner
    from mofa_framework import engine
    from mofa_framework.units import GIB

    reg = mofa_predictor.registry
    jobs, pred, ok = _moe_case(mofa_predictor, "a100-sxm4-80gb")
    room = jobs[0].hardware.hbm_bytes - 20.0 * GIB
    host = np.where(engine.stages_present(pred.state.batch), pred.state.mem.host_bytes, 0.0).max(axis=0)
    fits = ok & (pred.peak_memory_bytes <= room) & (host <= jobs[0].hardware.host_bytes_per_gpu)
    best = float(pred.step_time_s[int(np.argmin(np.where(fits, pred.step_time_s, np.inf)))])
    space = SearchSpace(**_MOE_SPACE, features={n: feature_choices(reg, n) for n in _MOE_FEATURES})
    common = dict(model=jobs[0].model, hardware=jobs[0].hardware, num_gpus=16, global_batch_size=32,
                  sequence_length=4096, space=space, top_k=3, memory_headroom_gib=20.0)
    monkeypatch.setattr(tuner, "CHUNK_ROWS", 16)
    grown = []
    budget = tuner._Search.budget
    monkeypatch.setattr(tuner._Search, "budget", lambda self, depth: grown.append(budget(self, depth)) or grown[-1])
    adaptive = tune(mofa_predictor, TuneRequest(**common))
    fixed = tune(mofa_predictor, TuneRequest(**common, chunk_rows=16))
    assert 16 * tuner.MEMORY_BOUND_GROWTH in grown and grown[0] == 16
    assert adaptive.best[0].step_time_s == pytest.approx(best, rel=1e-12)
    assert [c.step_time_s for c in adaptive.best] == [c.step_time_s for c in fixed.best]


# one kind of layer; and four (Mamba or attention × MLP or MoE), each priced and placed on stages separately
@pytest.mark.parametrize("model_name", ["mixtral-8x7b", "jamba-v0.1"])
def test_the_bounds_contracts_hold_for_every_builtin_schedule_and_feature(mofa_predictor, model_name):
    """What the branch and bound relies on, checked on the built-ins: (1) a schedule's busy time
    is m·v·(F+B+W); (2) the busy time read off engine.busy_terms equals the engine's own
    (the breakdown's per-micro-batch components); (3) turning on any set of adds_time_only
    features never lowers it below all of them off (the layer features that may speed
    layers up held at a random setting); (4) nor changes W, nor lowers busy + bubble under a
    schedule flagged monotone_bubble."""
    from mofa_framework import engine
    from mofa_framework.tuner import _combos, _feature_rows, _feature_tables, _paper_rules, _runs, _structure_batch

    reg = mofa_predictor.registry
    rng = np.random.default_rng(0)
    n = 64
    x = engine.PipelineInputs(
        p=rng.integers(1, 16, n).astype(float), v=rng.integers(1, 4, n).astype(float), m=rng.integers(16, 64, n) * 1.0,
        F=rng.random(n), B=rng.random(n), W=rng.random(n), sum_F=rng.random(n) * 16, sum_B=rng.random(n) * 16,
        sum_W=rng.random(n) * 16, p2p_s=rng.random(n) * 0.01, steady_p2p_s=rng.random(n) * 0.02)
    for sched in reg.schedules.values():
        xs = x if sched.supports_vpp else attrs.evolve(x, v=np.ones(n))  # the engine's rule: vpp only if interleaving
        xs = attrs.evolve(xs, v=np.full(n, 2.0)) if sched.feasible is not None and sched.requires_vpp else xs
        np.testing.assert_allclose(sched.time(xs).busy_s, xs.m * xs.v * (xs.F + xs.B + xs.W), rtol=1e-12,
                                   err_msg=sched.name)

    model, hw = reg.model(model_name), reg.hardware_profile("h100-sxm5-80gb")
    names = sorted(n for n, f in reg.features.items() if f.tunable and f.layer is not None)
    space = SearchSpace(tp=(2, 4), pp=(2, 4), vpp=(1, 2), cp=(1, 2), ep=(2, 8), etp=(1,), micro_batch_size=(1,),
                        schedules=("1f1b", "interleaved-1f1b", "zb-h1", "dualpipe"), lighter_ends=(0, 2),
                        features={f: feature_choices(reg, f) for f in names})
    req = TuneRequest(model=model, hardware=hw, num_gpus=64, global_batch_size=256, sequence_length=4096, space=space)
    structs, _ = _structure_batch(req, reg)
    ok = np.ones(len(structs), bool)
    for r in mofa_predictor.constraints(structs, model, hw):
        ok &= np.asarray(r.feasible, bool)
    for _, rule in _paper_rules(req, reg, structs):
        ok &= rule
    structs = structs.take(np.flatnonzero(ok))
    grid = _combos(req, reg, names)
    pick = rng.integers(0, len(grid), len(structs))
    slow = [j for j, f in enumerate(names) if reg.features[f].adds_time_only]
    off = grid[pick].copy()
    off[:, slow] = 0  # choice 0 is "off"
    s_idx = np.arange(len(structs))

    def busy(choice):
        rows = grid if choice is None else choice
        batch = attrs.evolve(structs, features=_feature_rows(_feature_tables(req, reg, names, rows), s_idx))
        pred = mofa_predictor.evaluate(batch, model, hw)
        state, priced = engine.layer_phase(batch, model, hw, mofa_predictor.pm, structure=_runs(s_idx))
        counts, const = engine.busy_terms(state, priced)
        work = const + sum(counts[k] * engine.layer_work_s(c)[None, :] for k, c in state.layers.items())
        ours = batch.num_microbatches * np.where(engine.stages_present(batch), work, -np.inf).max(axis=0)
        keys = ("compute_fwd", "compute_bwd_input", "compute_bwd_weight", "recompute", "tp_comm", "cp_comm",
                "ep_comm", "offload", "dp_layer_comm", "microbatch_overhead", "schedule_adjust")
        np.testing.assert_allclose(ours, sum(pred.breakdown[k] for k in keys), rtol=1e-9)
        return ours

    base = busy(off)
    full = busy(grid[pick])
    assert (full >= base * (1 - 1e-12)).all()
    # (3') nor does turning the next one on, in the order the tuner decides them (a lattice: each
    # level's busy time bounds the levels below it), whatever those before it are set to
    from mofa_framework.tuner import _lattice_order

    order = [names.index(f) for f in _lattice_order(reg, names)]
    assert sorted(order) == sorted(slow)
    for draw in (pick, *(rng.integers(0, len(grid), len(structs)) for _ in range(3))):
        setting = grid[draw]
        before = busy(np.where(np.isin(np.arange(len(names)), slow), 0, setting))
        for k in range(1, len(order) + 1):
            prefix = setting.copy()
            prefix[:, order[k:]] = 0
            now = busy(prefix)
            assert (now >= before * (1 - 1e-12)).all(), names[order[k - 1]]
            before = now

    # (4) they leave W alone, so schedules flagged monotone_bubble only get a larger busy + bubble
    def pipeline(choice):
        batch = attrs.evolve(structs, features=_feature_rows(_feature_tables(req, reg, names, choice), s_idx))
        return engine.pipeline_phase(batch, model, hw, mofa_predictor.pm, structure=_runs(s_idx))

    lo, hi = pipeline(off), pipeline(grid[pick])
    for kind in lo.state.layers:
        np.testing.assert_array_equal(hi.state.layers[kind].bwd_weight_s, lo.state.layers[kind].bwd_weight_s)
    monotone = np.array([s.monotone_bubble for s in reg.schedules.values()])[structs.schedule]
    assert monotone.any() and (~monotone).any()
    settled = lambda pl: pl.times.busy_s + pl.times.bubble_s  # noqa: E731
    assert (settled(hi)[monotone] >= settled(lo)[monotone] * (1 - 1e-12)).all()


# ---------------------------------------------------------------- usability


def test_405b_tuned_as_meta_ran_it_interleaved_with_lighter_end_stages():
    """Issue 17: on Llama 3.1 405B (126 layers) at TP 8, PP 16 the search contains what Meta ran —
    interleaved 1F1B with the first and last stage one layer lighter (7 + 14 × 8 + 7) — and finds
    it; the Megatron line places the layers with Megatron-Core's embedding/loss accounting."""
    out = json.loads(CliRunner().invoke(cli, [
        "tune", "--model", "llama3.1-405b", "--hardware", "h100-sxm5-80gb", "--gpus", "16384", "--gbs", "2048",
        "--seq", "8192", "--tp-values", "8", "--pp-values", "16", "--cp-values", "1", "--mbs-values", "1",
        "--schedules", "1f1b,interleaved-1f1b", "--features", "distributed_optimizer,tp_overlap",
        "--format", "json", "--top", "3"], catch_exceptions=False).output)
    best = out["best"][0]
    assert best["schedule"] == "interleaved-1f1b" and best["parallel"]["vpp"] > 1
    assert (best["parallel"]["first_stage_layers"], best["parallel"]["last_stage_layers"]) == (7, 7)
    args = " ".join(out["megatron_args"])
    assert "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split" in args
    assert f"--num-virtual-stages-per-pipeline-rank {best['parallel']['vpp']}" in args


def test_end_stage_layers_of_lighter_ends_and_a_lighter_last_stage(mofa_predictor):
    """Hand-derived: mid = (L + 2d + e)/pp layers on each middle stage, mid − d on the first,
    mid − d − e on the last; (0, 0) is the default split (0, 0 returned)."""
    from mofa_framework.tuner import end_stage_layers, last_stage_relief

    cases = [  # (L, pp, d, e) -> (first, last, valid)
        ((61, 16, 0, 3), (4, 1, True)),   # (61 + 3)/16 = 4: Megatron-Bridge's DeepSeek-V3 split
        ((61, 8, 1, 1), (7, 6, True)),    # (61 + 2 + 1)/8 = 8
        ((126, 16, 1, 0), (7, 7, True)),  # (126 + 2)/16 = 8: Llama 3 405B's 7 + 14 × 8 + 7
        ((61, 2, 0, 1), (31, 30, True)),  # pp 2: (61 + 1)/2 on the first, the rest on the last
        ((61, 2, 1, 1), (7, 6, False)),   # d needs a middle stage
        ((61, 16, 0, 2), (3, 1, False)),  # 63 is not a multiple of 16
        ((4, 4, 0, 4), (2, -2, False)),   # the last stage would hold no layer
        ((61, 16, 0, 0), (0, 0, True)),   # the default split
    ]
    for (L, pp, d, e), (first, last, ok) in cases:
        f, la, v = end_stage_layers(L, np.array([pp]), np.array([d]), np.array([e]))
        assert bool(v[0]) == ok, (L, pp, d, e)
        if ok:
            assert (int(f[0]), int(la[0])) == (first, last), (L, pp, d, e)
    reg = mofa_predictor.registry
    assert last_stage_relief(reg.model("deepseek-v3")) == 3 and last_stage_relief(reg.model("llama3-70b")) == 1


def test_deepseek_v3_tuned_with_the_last_stage_lighter_as_megatron_bridge_runs_it(mofa_predictor):
    """Issue 17: DeepSeek-V3's last stage also runs the output layer, the loss and the MTP module
    (a layer and a second output layer). On 16 stages the default split puts 2 layers first and
    3 + MTP last, which makes the last stage critical; the default space holds a last stage up to
    three layers lighter and finds Megatron-Bridge's 4 + 14 × 4 + 1, faster than the best search
    without that dimension; the Megatron line states it."""
    reg = mofa_predictor.registry
    model, hw = reg.model("deepseek-v3"), reg.hardware_profile("h100-sxm5-80gb")
    base = default_space(reg, model, hw, 1024, 4096, features=("flex_dispatcher", "distributed_optimizer"))
    assert base.lighter_last == (0, 1, 2, 3)
    narrow = dict(tp=(2,), pp=(16,), vpp=(1,), cp=(1,), ep=(64,), etp=(1,), micro_batch_size=(1,),
                  schedules=("1f1b",))
    best = {}
    for last in ((0,), base.lighter_last):
        space = attrs.evolve(base, **narrow, lighter_last=last)
        result = tune(mofa_predictor, TuneRequest(model=model, hardware=hw, num_gpus=1024, global_batch_size=8192,
                                                  sequence_length=4096, precision="fp8", space=space, top_k=1))
        best[last] = result.best[0]
    top = best[base.lighter_last]
    assert (top.parallel["first_stage_layers"], top.parallel["last_stage_layers"]) == (4, 1)
    assert top.step_time_s < 0.9 * best[(0,)].step_time_s  # 29.8 s against 36.6 s when written
    args, _ = megatron_arguments(model, top, reg)
    line = " ".join(args)
    assert "--decoder-first-pipeline-num-layers 4 --decoder-last-pipeline-num-layers 1" in line


def test_pricing_once_per_geometry_changes_no_number(mofa_predictor, monkeypatch):
    """The engine prices the layers, embedding, head and p2p of rows with one geometry once
    (structures differing in pp's split, vpp, schedule or end stages share it): every output of a
    batch of structures is bit-for-bit what pricing each row gives."""
    from mofa_framework import engine
    from mofa_framework.decompose import Geometry
    from mofa_framework.tuner import _structure_batch

    reg = mofa_predictor.registry
    model, hw = reg.model("deepseek-v3"), reg.hardware_profile("h100-sxm5-80gb")
    space = SearchSpace(tp=(2, 4), pp=(4, 8), vpp=(1, 2), cp=(1,), ep=(8, 16), etp=(1,), micro_batch_size=(1, 2),
                        schedules=("1f1b", "interleaved-1f1b", "zb-h1"), lighter_ends=(0, 1), lighter_last=(0, 1, 3))
    req = TuneRequest(model=model, hardware=hw, num_gpus=256, global_batch_size=1024, sequence_length=4096,
                      space=space)
    structs, _ = _structure_batch(req, reg)
    first, inverse = engine._geometry_rows(Geometry.of(structs))
    assert len(structs) >= 4 * len(first)  # the case the engine takes: a few geometries, many structures
    shared = mofa_predictor.evaluate(structs, model, hw)
    monkeypatch.setattr(engine, "_GEOMETRY_ROWS", 10 ** 12)  # row by row
    alone = mofa_predictor.evaluate(structs, model, hw)
    np.testing.assert_array_equal(shared.step_time_s, alone.step_time_s)
    np.testing.assert_array_equal(shared.peak_memory_bytes, alone.peak_memory_bytes)
    for k in alone.breakdown:
        np.testing.assert_array_equal(shared.breakdown[k], alone.breakdown[k], err_msg=k)


def test_lighter_last_from_the_flag_and_the_search_table(tmp_path):
    """--lighter-last-values and `[search] lighter_last` narrow the dimension: Mixtral 8×7B's 32
    layers on 2 stages with e = 2 run (32 + 2)/2 = 17 first and 15 last, and with e = 0 only the
    default split 16 / 16; a negative value is one line, exit 2."""
    run = lambda *a: CliRunner().invoke(cli, ["tune", *a], catch_exceptions=False)  # noqa: E731
    flags = ["--model", "mixtral-8x7b", "--hardware", "h100-sxm5-80gb", "--gpus", "16", "--gbs", "64", "--seq",
             "4096", "--tp-values", "2", "--pp-values", "2", "--ep-values", "8", "--mbs-values", "1",
             "--schedules", "1f1b", "--features", "distributed_optimizer", "--lighter-ends-values", "0",
             "--format", "json", "--top", "50"]
    ends = lambda out: {(c["parallel"]["first_stage_layers"], c["parallel"]["last_stage_layers"])  # noqa: E731
                        for c in json.loads(out.output)["best"]}
    assert ends(run(*flags, "--lighter-last-values", "2")) == {(17, 15)}
    assert ends(run(*flags, "--lighter-last-values", "0")) == {(0, 0)}
    bad = run(*flags, "--lighter-last-values", "-1")
    assert bad.exit_code == 2 and "--lighter-last-values" in bad.output and len(bad.output.strip().splitlines()) == 1
    job = tmp_path / "t.toml"
    job.write_text('[model]\nname = "mixtral-8x7b"\n[hardware]\nname = "h100-sxm5-80gb"\nnum_gpus = 16\n'
                   '[parallel]\nglobal_batch_size = 64\nsequence_length = 4096\n'
                   '[search]\ntp = [2]\npp = [2]\nep = [8]\nmicro_batch_size = [1]\nschedules = ["1f1b"]\n'
                   'lighter_ends = [0]\nlighter_last = [2]\nfeatures = ["distributed_optimizer"]\n')
    assert ends(run(str(job), "--format", "json", "--top", "50")) == {(17, 15)}


def test_pipeline_layout_arguments_follow_megatron_core():
    """Megatron-Core's rules: --num-layers-per-virtual-pipeline-stage needs every stage alike;
    --decoder-first/last-pipeline-num-layers with interleaving need stages splitting into whole
    chunks, else the embedding/loss accounting (one layer lighter) or an explicit layout."""
    from mofa_framework import Predictor
    from mofa_framework.tuner import pipeline_layout_arguments as args

    reg = Predictor().registry
    llama, ds = reg.model("llama3.1-405b"), reg.model("deepseek-v3")
    par = lambda pp, v, ends=0: {"pp": pp, "vpp": v, "first_stage_layers": ends, "last_stage_layers": ends}  # noqa: E731
    assert args(llama, par(16, 1)) == ["--decoder-first-pipeline-num-layers", "7",
                                       "--decoder-last-pipeline-num-layers", "7"]  # 126 on 16: the default split
    assert args(llama, par(14, 3)) == ["--num-layers-per-virtual-pipeline-stage", "3"]
    assert args(llama, par(16, 4, 7))[:2] == ["--account-for-embedding-in-pipeline-split",
                                              "--account-for-loss-in-pipeline-split"]
    assert args(reg.model("llama3-70b"), par(4, 2, 18)) == [  # 18 + 2 × 22 + 18: every stage in whole chunks
        "--decoder-first-pipeline-num-layers", "18", "--decoder-last-pipeline-num-layers", "18",
        "--num-virtual-stages-per-pipeline-rank", "2"]
    layout = args(ds, par(16, 2))  # 61 layers + MTP on 16 stages of 2 chunks: 2 + 14 × 4 + 3
    assert layout[0] == "--pipeline-model-parallel-layout"
    segments = layout[1].split("|")
    assert len(segments) == 32 and segments[0].startswith("E") and segments[-1].endswith("mL")
    layers = [seg.strip("EmL") for seg in segments]
    assert sum(int(t[2:]) if t.startswith("t*") else len(t) for t in layers) == 61


def test_zb_v_and_dualpipe_megatron_lines_match_their_constraints(mofa_predictor):
    """ZB-V runs two V-shaped chunks per stage (vpp = 2, set by the fork's --zero-bubble-v-schedule,
    so no virtual-pipeline flags), with p2p overlap the fork's default; DualPipe states its rank
    placement and requirements."""
    reg = mofa_predictor.registry
    model, hw = reg.model("llama3-70b"), reg.hardware_profile("h100-sxm5-80gb")
    space = SearchSpace(tp=(8,), pp=(4,), vpp=(1, 2, 4), cp=(1,), ep=(1,), etp=(1,), micro_batch_size=(1,),
                        schedules=("zb-v",), features={"pp_overlap": feature_choices(reg, "pp_overlap")})
    result = tune(mofa_predictor, TuneRequest(model=model, hardware=hw, num_gpus=64, global_batch_size=64,
                                              sequence_length=4096, space=space, top_k=3, precision="fp16",
                                              attention_kernel="fa2"))
    assert {c.parallel["vpp"] for c in result.best} == {2}
    assert "pp_overlap" in result.best[0].features
    args, notes = megatron_arguments(model, result.best[0], reg)
    assert not any("virtual" in a for a in args)
    assert any("--zero-bubble-v-schedule" in n and "post-validation" in n and "--use-legacy-models" in n
               and "--transformer-impl local" in n for n in notes)
    # the fork overlaps the pipeline's p2p by default, as Megatron-LM has since 2023-10: no flag with
    # pp_overlap on (Megatron-LM rejects the old --overlap-p2p-communication), the fork's
    # --no-overlap-p2p-communication in its note for a configuration priced without it
    assert "overlap-p2p" not in " ".join(args + notes)
    off = attrs.evolve(result.best[0], features={k: v for k, v in result.best[0].features.items() if k != "pp_overlap"})
    args_off, notes_off = megatron_arguments(model, off, reg)
    assert "overlap-p2p" not in " ".join(args_off)
    assert any("--zero-bubble-v-schedule" in n and "--no-overlap-p2p-communication" in n for n in notes_off)
    dual = attrs.evolve(result.best[0], schedule="dualpipe", parallel={**result.best[0].parallel, "vpp": 1})
    _, notes = megatron_arguments(model, dual, reg)
    assert any("pp−1−j" in n and "2·pp micro-batches" in n for n in notes)


def test_interleaved_megatron_line_states_the_micro_batch_group_it_needs(mofa_predictor):
    """Megatron-Core's interleaved schedule refuses micro-batch counts pp does not divide at its
    default group size (pp): with 10 micro-batches on 4 stages the line asks for groups of 5
    (--microbatch-group-size-per-virtual-pipeline-stage, which the activations are priced at); with 8,
    nothing is added."""
    reg = mofa_predictor.registry
    model, hw = reg.model("llama3-70b"), reg.hardware_profile("h100-sxm5-80gb")
    lines = {}
    for gbs in (10, 8):
        space = SearchSpace(tp=(8,), pp=(4,), vpp=(2,), cp=(1,), ep=(1,), etp=(1,), micro_batch_size=(1,),
                            schedules=("interleaved-1f1b",), features={})
        best = tune(mofa_predictor, TuneRequest(model=model, hardware=hw, num_gpus=32, global_batch_size=gbs,
                                                sequence_length=4096, space=space, top_k=1)).best[0]
        lines[gbs] = " ".join(megatron_arguments(model, best, reg)[0])
    assert "--microbatch-group-size-per-virtual-pipeline-stage 5" in lines[10]
    assert "--microbatch-group-size" not in lines[8] and "--num-layers-per-virtual-pipeline-stage 10" in lines[8]


def test_interleaved_megatron_line_states_p2p_overlap_as_megatron_lm_spells_it(mofa_predictor):
    """Megatron-LM overlaps the interleaved schedule's p2p by default (since 2023-10; its parser has
    only --no-overlap-p2p-communication and rejects the older --overlap-p2p-communication): with
    pp_overlap on the line names no p2p flag, without it --no-overlap-p2p-communication — except at
    pp 2, where Megatron-LM asserts pp > 2 for interleaving without the overlap: no flag (the run
    overlaps) and a note saying so."""
    reg = mofa_predictor.registry
    model, hw = reg.model("llama3-8b"), reg.hardware_profile("h100-sxm5-80gb")
    lines = {}
    for pp in (4, 2):
        best = _best_of(mofa_predictor, model, hw, 2 * pp, 16, tp=(2,), pp=(pp,), vpp=(2,),
                        schedules=("interleaved-1f1b",), features={"pp_overlap": ({},)})
        assert "pp_overlap" in best.features
        off = attrs.evolve(best, features={})
        lines[pp] = {k: megatron_arguments(model, c, reg) for k, c in (("on", best), ("off", off))}
    for pp in (4, 2):
        args, notes = lines[pp]["on"]
        assert "overlap-p2p" not in " ".join(args + notes)
    args, notes = lines[4]["off"]
    assert "--no-overlap-p2p-communication" in args and not any("pp > 2" in n for n in notes)
    args, notes = lines[2]["off"]  # Megatron-LM would refuse the flag: the run overlaps, a note says so
    assert "overlap-p2p" not in " ".join(args) and any("asserts pp > 2" in n for n in notes)


def _best_of(predictor, model, hw, gpus: int, gbs: int, seq: int = 4096, **space):
    """The top configuration of a narrow search (one value per axis unless given): tp, pp, vpp, cp,
    ep, etp and the micro-batch 1 by default, `schedules` and `features` as given."""
    axes = {"tp": (1,), "pp": (1,), "vpp": (1,), "cp": (1,), "ep": (1,), "etp": (1,), "micro_batch_size": (1,),
            **space}
    return tune(predictor, TuneRequest(model=model, hardware=hw, num_gpus=gpus, global_batch_size=gbs,
                                       sequence_length=seq, space=SearchSpace(**axes), top_k=1)).best[0]


def test_megatron_line_drops_a_flag_megatron_lm_takes_only_beside_another(mofa_predictor):
    """Megatron-LM asserts ``--overlap-param-gather`` only with the distributed optimizer or
    Megatron-FSDP (dp_overlap's ``megatron_requires``): with plain DDP the DP overlap is
    ``--overlap-grad-reduce`` alone (the all-reduce it hides), beside the distributed optimizer
    both flags."""
    reg = mofa_predictor.registry
    model, hw = reg.model("llama3.2-1b"), reg.hardware_profile("h100-sxm5-80gb")
    best = _best_of(mofa_predictor, model, hw, 8, 32, schedules=("1f1b",), features={"dp_overlap": ({},)})
    assert set(best.features) == {"dp_overlap"}
    plain = " ".join(megatron_arguments(model, best, reg)[0])
    assert "--overlap-grad-reduce" in plain and "--overlap-param-gather" not in plain
    sharded = attrs.evolve(best, features={**best.features, "distributed_optimizer": {}})
    line = " ".join(megatron_arguments(model, sharded, reg)[0])
    assert "--overlap-param-gather" in line and "--use-distributed-optimizer" in line


def test_moe_megatron_line_states_the_dispatch_mofa_prices(mofa_predictor):
    """MoFa prices an MoE layer's all-to-all dispatch and grouped expert GEMMs; Megatron-Core's
    defaults are the allgather dispatcher (which its A2A overlap refuses) and one GEMM per expert.
    So an MoE line states --moe-token-dispatcher-type alltoall --moe-grouped-gemm, the flex
    dispatcher's own type where that feature is on (once), and a dense line neither."""
    reg = mofa_predictor.registry
    model, hw = reg.model("mixtral-8x7b"), reg.hardware_profile("h100-sxm5-80gb")
    space = {"tp": (2,), "schedules": ("1f1b",), "features": {"distributed_optimizer": ({},)}}
    best = _best_of(mofa_predictor, model, hw, 32, 64, ep=(8,), **space)
    line = megatron_arguments(model, best, reg)[0]
    assert "--moe-token-dispatcher-type alltoall" in line and "--moe-grouped-gemm" in line
    flex = attrs.evolve(best, features={**best.features, "flex_dispatcher": {"backend": "deepep"}})
    words = " ".join(megatron_arguments(model, flex, reg)[0]).split()
    assert words.count("--moe-token-dispatcher-type") == 1
    assert words[words.index("--moe-token-dispatcher-type") + 1] == "flex"
    dense = reg.model("llama3-8b")
    dense_best = _best_of(mofa_predictor, dense, hw, 8, 32, **space)
    assert "moe" not in " ".join(megatron_arguments(dense, dense_best, reg)[0])


def test_zero_bubble_schedules_take_only_the_end_stages_their_fork_places(mofa_predictor):
    """The ZeroBubble schedules run in the sail-sg fork, which has no end-stage arguments: it splits
    evenly or pads (--allow-padding-num-layers takes the k = −L mod pp padded layers off the last
    stage then the first; under ZB-V off rank 0, which holds the embedding and the loss, priced as
    the same sizes with the head on the last stage). Hand-derived: 126 layers on 16 stages pad 2
    → 7 / 7; 127 on 16 pad 1 → 8 / 7; ZB-V needs an even stage (two equal chunks): 126 on 8 → 15 /
    15, on 32 → 3 / 3, 62 on 32 (the paper's 28.3B run) → 1 / 1, 30 on 8 (mid 4) → 3 / 3 but 22 on 8 (mid 3) none;
    61 on 16 pads 3 (uneven middles): none. The tuner then offers a ZeroBubble schedule
    only with such a split, and its Megatron line names the padding, never Megatron-Core's
    --decoder-first/last flags the fork lacks; a job asking for another split is one line, exit 2."""
    from mofa_plugins.schedule_zero_bubble import padded_end_stages

    first, last, ok = padded_end_stages(126, np.array([16, 8]), v_shape=False)
    assert ok.all() and (first.tolist(), last.tolist()) == ([7, 15], [7, 15])
    first, last, ok = padded_end_stages(127, np.array([16]), v_shape=False)
    assert ok.all() and (int(first[0]), int(last[0])) == (8, 7)
    first, last, ok = padded_end_stages(126, np.array([8, 32]), v_shape=True)
    assert ok.all() and (first.tolist(), last.tolist()) == ([15, 3], [15, 3])  # 126 on 32: mid 4, pad 2
    first, last, ok = padded_end_stages(62, np.array([32]), v_shape=True)
    assert ok.all() and (int(first[0]), int(last[0])) == (1, 1)
    first, last, ok = padded_end_stages(30, np.array([8]), v_shape=True)
    assert ok.all() and (int(first[0]), int(last[0])) == (3, 3)
    assert not padded_end_stages(22, np.array([8]), v_shape=True)[2].any()
    assert not padded_end_stages(61, np.array([16, 8]), v_shape=False)[2].any()
    first, last, ok = padded_end_stages(32, np.array([4]), v_shape=False)  # even: 8 each, stated or not
    assert ok.all() and (int(first[0]), int(last[0])) == (8, 8)

    reg = mofa_predictor.registry
    model, hw = reg.model("llama3.1-405b"), reg.hardware_profile("a100-sxm4-80gb")
    space = attrs.evolve(default_space(reg, model, hw, 2048, 4096, features=()), tp=(8,), pp=(8, 16, 32),
                         cp=(1,), micro_batch_size=(1,))
    result = tune(mofa_predictor, TuneRequest(model=model, hardware=hw, num_gpus=2048, global_batch_size=2048,
                                              sequence_length=4096, space=space, top_k=30, precision="fp16"))
    zb = [c for c in result.best if c.schedule.startswith("zb-")]
    assert zb and len(zb) < len(result.best)  # both kinds near the top
    for c in zb:  # the default split, or exactly the one the fork's padding places
        ends = (c.parallel["first_stage_layers"], c.parallel["last_stage_layers"])
        first, last, _ = padded_end_stages(126, np.array([c.parallel["pp"]]), v_shape=c.schedule == "zb-v")
        assert ends in ((0, 0), (int(first[0]), int(last[0]))), c.parallel
    assert any(c.parallel["first_stage_layers"] for c in result.best if not c.schedule.startswith("zb-"))

    llama = reg.model("llama3.1-405b")
    cand = next(iter(tune(mofa_predictor, TuneRequest(
        model=llama, hardware=reg.hardware_profile("h100-sxm5-80gb"), num_gpus=1024, global_batch_size=512,
        sequence_length=8192, space=SearchSpace(tp=(8,), pp=(16,), vpp=(1,), cp=(1,), ep=(1,), etp=(1,),
                                                micro_batch_size=(1,), schedules=("zb-h1",), lighter_ends=(0, 1),
                                                features={f: feature_choices(reg, f) for f in
                                                          ("distributed_optimizer", "recompute")}),
        top_k=1, attention_kernel="fa2")).best))  # 7 / 7 is the default split too: one candidate
    args, notes = megatron_arguments(llama, cand, reg)
    assert not any("--decoder-" in a or "--pipeline-model-parallel-layout" in a for a in args)
    assert any("--allow-padding-num-layers" in n and "126 layers padded to 128" in n for n in notes)

    run = CliRunner().invoke(cli, ["predict", "--model", "llama3.1-405b", "--hardware", "a100-sxm4-80gb", "--gpus",
                                   "1024", "--gbs", "1024", "--seq", "4096", "--tp", "8", "--pp", "16",
                                   "--schedule", "zb-h1", "--pipeline-layout", "Et*4|(t*8|)*14t*10L"])
    assert run.exit_code == 2 and len(run.output.strip().splitlines()) == 1
    assert "(4 / 10)" in run.output and "1f1b" in run.output


def test_rows_identical_in_every_number_collapse_into_one_with_variants(mofa_predictor):
    """Top-k without near-duplicates: configurations with the same structure, step time and memory
    (a feature that changes nothing there, e.g. PP overlap under plain 1F1B, which Megatron-LM runs
    without it) are one row listing the others as variants."""
    reg = mofa_predictor.registry
    model, hw = reg.model("llama3-70b"), reg.hardware_profile("h100-sxm5-80gb")
    space = SearchSpace(tp=(8,), pp=(8,), vpp=(1,), cp=(1,), ep=(1,), etp=(1,), micro_batch_size=(1,),
                        schedules=("1f1b",),  # no p2p overlap in plain 1F1B: pp_overlap changes nothing
                        features={f: feature_choices(reg, f) for f in ("pp_overlap", "tp_overlap")})
    result = tune(mofa_predictor, TuneRequest(model=model, hardware=hw, num_gpus=64, global_batch_size=64,
                                              sequence_length=4096, space=space, top_k=5))
    keys = [(tuple(sorted(c.parallel.items())), c.schedule, c.step_time_s, c.peak_memory_gib) for c in result.best]
    assert len(set(keys)) == len(keys)
    with_variants = [c for c in result.best if c.variants]
    assert with_variants
    for c in with_variants:  # the representative is the simplest: fewest features on
        assert all(len(c.features) <= len(v) for v in c.variants)


class _SameAs1f1b:
    """A test-local plugin: 1F1B under another name (as a fork's copy of it would register)."""

    @hookimpl
    def mofa_register_pipeline_schedules(self):
        from mofa_plugins import schedule_1f1b

        return [attrs.evolve(schedule_1f1b.SCHEDULE, name="fork-1f1b", aliases=(), from_megatron=None)]


def test_schedules_that_change_nothing_collapse_too():
    """Two schedules that run the same step in the same memory (here 1F1B and a copy of it under
    another name) give one row per layout, the other schedule listed as its variant (the CLI says
    "≡ 1 more: schedule 1f1b/fork-1f1b"), the simplest (1F1B, the first registered) shown. (The
    ZeroBubble schedules used to show this at PP 1, where they are 1F1B; their fork refuses PP 1.)"""
    from mofa_framework.commands.tune import _variants

    pred = Predictor(plugins={"same_as_1f1b": _SameAs1f1b()})
    reg = pred.registry
    model, hw = reg.model("llama3.2-1b"), reg.hardware_profile("h100-sxm5-80gb")
    space = SearchSpace(tp=(1, 2), pp=(2,), vpp=(1,), cp=(1,), ep=(1,), etp=(1,), micro_batch_size=(1, 2),
                        schedules=("1f1b", "fork-1f1b"), features={})
    result = tune(pred, TuneRequest(model=model, hardware=hw, num_gpus=8, global_batch_size=64,
                                    sequence_length=4096, space=space, top_k=4))
    layouts = [tuple(sorted(c.parallel.items())) for c in result.best]
    assert len(result.best) == 4 and len(set(layouts)) == 4
    for c in result.best:
        assert c.schedule == "1f1b" and list(c.variant_schedules) == ["fork-1f1b"]
        assert len(c.variant_schedules) == len(c.variants)
        assert _variants(c, reg) == "≡ 1 more: schedule 1f1b/fork-1f1b"


def test_rules_that_read_features_hold_for_what_the_search_returns(mofa_predictor):
    """The plugins' candidate rules that read a row's features (cp_a2a's heads, the offloads' host
    memory, fp8's MX recipe) are checked on the leaves, where the features are on — the structures
    passed them with every feature off. Llama 3 70B (8 KV heads) at TP 1 × CP 16: the all-to-all CP
    would split 8 KV heads 16 ways, which `mofa predict` refuses; the search must not return it."""
    reg = mofa_predictor.registry
    model, hw = reg.model("llama3-70b"), reg.hardware_profile("h100-sxm5-80gb")
    space = SearchSpace(tp=(1,), pp=(4,), vpp=(1,), cp=(16,), ep=(1,), etp=(1,), micro_batch_size=(1,),
                        schedules=("1f1b",),
                        features={f: feature_choices(reg, f) for f in ("cp_a2a", "distributed_optimizer", "recompute")})
    result = tune(mofa_predictor, TuneRequest(model=model, hardware=hw, num_gpus=64, global_batch_size=64,
                                              sequence_length=65536, space=space, top_k=3))
    assert result.best and all("cp_a2a" not in c.features for c in result.best)
    assert any(k.startswith("features.cp_a2a splits") and n > 0 for k, n in result.removed_by.items())
    for c in result.best:  # each one predicts as the search priced it
        job = mofa_predictor.job({"model": {"name": model.name}, "hardware": {"name": hw.name, "num_gpus": 64},
                                  "parallel": {k: v for k, v in c.parallel.items() if k != "dp"},
                                  "pipeline": {"schedule": c.schedule}, "features": dict(c.features)})
        assert mofa_predictor.predict(job)[0].step_time_s == pytest.approx(c.step_time_s, rel=1e-9)


def test_the_zero_bubble_schedules_are_searched_only_as_their_fork_runs_them(mofa_predictor):
    """ZB-H1 / ZB-H2 / ZB-V run in the sail-sg fork (legacy GPT model, local transformer): no CP, no
    Transformer Engine, no DP overlap, FlashAttention-2, ZB-H2 / ZB-V only in fp16. In fp16 with
    FlashAttention-2 on A100s the search returns ZeroBubble rows, each with only the features the
    fork has; in bf16 with H100's default kernel (cuDNN) none, and the removed-by table says why."""
    from mofa_plugins.schedule_zero_bubble import FORK_FEATURES

    reg = mofa_predictor.registry
    model = reg.model("llama3-70b")
    feats = {f: feature_choices(reg, f) for f in ("dp_overlap", "tp_overlap", "distributed_optimizer", "recompute",
                                                  "pp_overlap")}
    space = SearchSpace(tp=(8,), pp=(4, 8), vpp=(1, 2), cp=(1, 2), ep=(1,), etp=(1,), micro_batch_size=(1,),
                        schedules=("1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v"), features=feats)
    # 16 micro-batches on 8 stages: the bubble ZeroBubble removes outweighs the overlaps it cannot run
    common = dict(model=model, num_gpus=256, global_batch_size=64, sequence_length=4096, space=space, top_k=200)
    fp16 = tune(mofa_predictor, TuneRequest(hardware=reg.hardware_profile("a100-sxm4-80gb"), precision="fp16",
                                            **common))
    zb = [c for c in fp16.best if c.schedule.startswith("zb-")]
    assert "zb-v" in {c.schedule for c in zb}  # in fp16: post-validation
    for c in zb:
        assert c.parallel["cp"] == 1 and set(c.features) <= set(FORK_FEATURES), (c.schedule, c.features)
        assert not c.features.get("distributed_optimizer", {}).get("shard_gradients", False)
    assert any("dp_overlap" in c.features for c in fp16.best if not c.schedule.startswith("zb-"))
    bf16 = tune(mofa_predictor, TuneRequest(hardware=reg.hardware_profile("h100-sxm5-80gb"), **common))
    assert bf16.best and not any(c.schedule.startswith("zb-") for c in bf16.best)
    assert any("sail-sg" in reason and n > 0 for reason, n in bf16.removed_by.items())


def test_offloads_that_overflow_the_host_are_not_returned(mofa_predictor):
    """Host memory bounds the search as HBM does: on a node with 64 GiB of CPU memory per GPU, no
    returned configuration offloads more than that, and the rows that would are counted."""
    reg = mofa_predictor.registry
    model, base = reg.model("llama3-70b"), reg.hardware_profile("h100-sxm5-80gb")
    hw = attrs.evolve(base, host=attrs.evolve(base.host, cpu_memory_gib=64.0 * base.gpus_per_node))
    space = SearchSpace(tp=(4, 8), pp=(1, 2), vpp=(1,), cp=(1,), ep=(1,), etp=(1,), micro_batch_size=(1,),
                        schedules=("1f1b",),
                        features={f: feature_choices(reg, f) for f in ("activation_offload", "weight_offload")})
    result = tune(mofa_predictor, TuneRequest(model=model, hardware=hw, num_gpus=32, global_batch_size=16,
                                              sequence_length=4096, space=space, top_k=5))
    assert result.best and any(c.memory_breakdown["host"] > 0 for c in result.best)  # offloading ones among them
    for c in result.best:
        assert c.memory_breakdown["host"] <= 64.0 + 1e-9
    assert sum(n for k, n in result.removed_by.items() if "host memory" in k) > 0


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_what_the_search_returns_predict_accepts_and_prices_alike(mofa_predictor, data):
    """Any job, any features searched: every configuration the tuner returns is a job `mofa predict`
    accepts (no rule refuses it), that fits, and that predicts the step time the search ranked it by."""
    reg = mofa_predictor.registry
    name, gpus, gbs, seq = data.draw(st.sampled_from([("llama3-8b", 16, 32, 4096), ("mixtral-8x7b", 32, 64, 4096),
                                                     ("llama3-70b", 64, 64, 8192), ("qwen3-30b-a3b", 16, 64, 4096),
                                                     ("gpt3-175b", 64, 128, 2048)]))
    hw_name = data.draw(st.sampled_from(["h100-sxm5-80gb", "a100-sxm4-80gb", "b200-sxm-180gb"]))
    model, hw = reg.model(name), reg.hardware_profile(hw_name)
    feats = data.draw(st.lists(st.sampled_from(sorted(reg.features)), min_size=1, max_size=5, unique=True))
    space = default_space(reg, model, hw, gpus, seq, features=feats)
    narrow = {"tp": data.draw(st.sampled_from([(1, 2), (2, 4), (4, 8), (8,)])),
              "pp": data.draw(st.sampled_from([(1,), (1, 2), (2, 4), (4,)])), "micro_batch_size": (1, 2)}
    space = attrs.evolve(space, **narrow)
    result = tune(mofa_predictor, TuneRequest(model=model, hardware=hw, num_gpus=gpus, global_batch_size=gbs,
                                              sequence_length=seq, space=space, top_k=3))
    for c in result.best:
        job = mofa_predictor.job({"model": {"name": name}, "hardware": {"name": hw_name, "num_gpus": gpus},
                                  "parallel": {k: v for k, v in c.parallel.items() if k != "dp"},
                                  "pipeline": {"schedule": c.schedule}, "features": dict(c.features)})
        (r,) = mofa_predictor.predict(job)
        assert r.fits_in_memory
        assert r.step_time_s == pytest.approx(c.step_time_s, rel=1e-9)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_memory_floors_never_change_the_answer(mofa_predictor, data, monkeypatch):
    """Any job on small clusters (where memory decides), any memory features searched: the search with
    its memory floors returns the same top-k as the same search without them (every node kept and its
    leaves evaluated), both proven optimal. (Run on 2,198 random jobs by hand: 1,211 evaluated fewer
    leaves with the floors, none differed.)"""
    import mofa_framework.tuner as tuner_mod

    reg = mofa_predictor.registry
    name = data.draw(st.sampled_from(["llama3-8b", "mixtral-8x7b", "llama3-70b", "qwen3-30b-a3b", "gpt-oss-20b"]))
    hw_name = data.draw(st.sampled_from(["a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "l40s-48gb"]))
    gpus, gbs = data.draw(st.sampled_from([8, 16, 32])), data.draw(st.sampled_from([16, 64]))
    feats = data.draw(st.lists(st.sampled_from(["distributed_optimizer", "cpu_optimizer", "fp32_cross_entropy",
                                                "dp_overlap", "recompute", "activation_offload", "weight_offload",
                                                "fsdp", "memfine", "tp_overlap"]), min_size=1, max_size=6, unique=True))
    model, hw = reg.model(name), reg.hardware_profile(hw_name)
    space = default_space(reg, model, hw, gpus, 4096, features=feats)
    space = attrs.evolve(space, tp=tuple(t for t in space.tp if t <= 4), micro_batch_size=(1, 2))
    req = TuneRequest(model=model, hardware=hw, num_gpus=gpus, global_batch_size=gbs, sequence_length=4096,
                      space=space, top_k=3)
    floored = tune(mofa_predictor, req)
    init = tuner_mod._Search.__init__

    def without_floors(self, *a, **k):
        init(self, *a, **k)
        self.alternatives = None

    monkeypatch.setattr(tuner_mod._Search, "__init__", without_floors)
    plain = tune(mofa_predictor, req)
    assert floored.proven_optimal and plain.proven_optimal
    assert [c.step_time_s for c in floored.best] == [c.step_time_s for c in plain.best]


@pytest.mark.parametrize("model_name, gpus, layout", [("llama3-8b", 16, {"tp": 2, "pp": 2}),
                                                      ("mixtral-8x7b", 32, {"tp": 2, "pp": 2, "ep": 4})])
def test_lowers_memory_declarations_hold(mofa_predictor, model_name, gpus, layout):
    """The memory floor's contract on the built-ins: a feature that declares ``lowers_memory`` never
    lowers any other component on any stage, in any option, beside other features on."""
    from mofa_framework.config import jobs_to_batch
    from mofa_framework.engine import MEMORY_FIELDS

    reg = mofa_predictor.registry
    options = {"distributed_optimizer": [{}, {"shard_gradients": True}, {"grad_reduce_dtype": "bf16"}],
               "cpu_optimizer": [{}, {"shard": False}], "dp_overlap": [{}],
               "fp32_cross_entropy": [{}, {"compiled": True}]}
    declared = {n for n, f in reg.features.items() if f.lowers_memory is not None}
    assert declared == set(options), "give the new declaration its options here"
    for base in ({}, {"recompute": {"granularity": "full"}}, {"activation_offload": {}}, {"weight_offload": {}}):
        for name, opts in options.items():
            clash = lambda a, b: b in reg.features[a].conflicts or a in reg.features[b].conflicts  # noqa: E731
            if any(clash(name, b) for b in base):
                continue
            jobs = []
            for o in [None, *opts]:
                feats = dict(base)
                if o is not None:
                    feats[name] = o
                jobs.append(mofa_predictor.job({"model": {"name": model_name},
                                                "hardware": {"name": "h100-sxm5-80gb", "num_gpus": gpus},
                                                "parallel": {**layout, "micro_batch_size": 1, "global_batch_size": 64,
                                                             "sequence_length": 4096}, "features": feats}))
            pred = mofa_predictor.evaluate(jobs_to_batch(jobs, reg), jobs[0].model, jobs[0].hardware)
            lowers = reg.features[name].lowers_memory
            for comp, field in MEMORY_FIELDS.items():
                if comp in lowers:
                    continue
                a = getattr(pred.state.mem, field)
                assert (a[:, 1:] >= a[:, :1] * (1 - 1e-12) - 1e-6).all(), (name, comp, base)


_FLOOR_BASES = ({}, {"recompute": {"granularity": "full"}}, {"activation_offload": {}}, {"fp8": {"fp8_params": True}},
                {"lora": {}}, {"memfine": {}}, {"tp_overlap": {}})


@pytest.mark.parametrize("model_name, gpus, layouts", [
    ("llama3-8b", 16, [{"tp": 2, "pp": 2}, {"tp": 1, "pp": 4, "vpp": 2}, {"tp": 4, "pp": 1, "cp": 2}]),
    ("mixtral-8x7b", 32, [{"tp": 2, "pp": 2, "ep": 4}, {"tp": 1, "pp": 4, "ep": 8}, {"tp": 2, "pp": 1, "ep": 2}])])
def test_memory_floor_bounds_every_leaf(mofa_predictor, model_name, gpus, layouts):
    """The tuner's memory floor of a pipeline-level node (its memory with the leaf features off, then
    each setting of the leaf features that lower memory, ``memory_alternatives``) is at most the GPU
    peak and the host bytes of every leaf that takes that setting, whatever the layer features
    (recompute, offload, FP8 weights, LoRA, MemFine) and with the DP overlap on or off — so a node
    over in every setting has no leaf that fits."""
    from mofa_framework import engine
    from mofa_framework.config import jobs_to_batch
    from mofa_framework.batch import FeatureRows
    from mofa_framework.tuner import alternative_rows, memory_alternatives

    reg = mofa_predictor.registry
    model, hw = reg.model(model_name), reg.hardware_profile("h100-sxm5-80gb")
    leaf_names = ("distributed_optimizer", "cpu_optimizer", "fp32_cross_entropy", "dp_overlap")
    choices = {"distributed_optimizer": (None, {}, {"shard_gradients": True}, {"grad_reduce_dtype": "bf16"},
                                         {"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}),
               "cpu_optimizer": (None, {}, {"shard": False}), "fp32_cross_entropy": (None, {}, {"compiled": True}),
               "dp_overlap": (None, {})}
    assert {n for n, f in reg.features.items() if f.layer is None and f.pipeline is None} == set(leaf_names)
    req = TuneRequest(model=model, hardware=hw, num_gpus=gpus, global_batch_size=64, sequence_length=4096,
                      space=SearchSpace(tp=(1,), pp=(1,), vpp=(1,), cp=(1,), ep=(1,), etp=(1,), micro_batch_size=(1,),
                                        schedules=("1f1b",), features=choices))
    alternatives = memory_alternatives(reg, req, [reg.features[n] for n in leaf_names])
    assert len(alternatives) == 1 + 4 + 2 + 2 + 4 * 2 + 2 * 2  # none; each alone; pairs that do not conflict
    checked = 0
    for base in _FLOOR_BASES:
        clash = lambda a, b: b in reg.features[a].conflicts or a in reg.features[b].conflicts  # noqa: E731
        jobs = [mofa_predictor.job({"model": {"name": model_name}, "hardware": {"name": hw.name, "num_gpus": gpus},
                                    "parallel": {**lay, "micro_batch_size": 1, "global_batch_size": 64,
                                                 "sequence_length": 4096},
                                    "pipeline": {"schedule": "interleaved-1f1b" if lay.get("vpp", 1) > 1 else "1f1b"},
                                    "features": base}) for lay in layouts]
        nodes = jobs_to_batch(jobs, reg)
        pl = engine.pipeline_phase(nodes, model, hw, mofa_predictor.pm)
        alt_rows = alternative_rows(alternatives, len(nodes))
        gpu, host = engine.memory_floor(pl, alt_rows)
        for a, alt in enumerate(alt_rows):
            if any(clash(f.name, b) for f, _ in alt for b in base):
                continue
            for overlap in (False, True):
                feats = {**nodes.features, **{f.name: rows for f, rows in alt}}
                if overlap:
                    feats["dp_overlap"] = FeatureRows(enabled=np.ones(len(nodes), bool))
                leaves = mofa_predictor.evaluate(attrs.evolve(nodes, features=feats), model, hw)
                exists = engine.stages_present(nodes)
                leaf_host = np.where(exists, leaves.state.mem.host_bytes, 0.0).max(axis=0)
                assert (leaves.peak_memory_bytes >= gpu[a] * (1 - 1e-12)).all(), (base, [f.name for f, _ in alt])
                assert (leaf_host >= host[a] * (1 - 1e-12) - 1e-6).all(), (base, [f.name for f, _ in alt])
                checked += 1
    assert checked > 100


def test_each_leaf_maps_to_its_memory_setting(mofa_predictor):
    """``alternative_of`` reads from a leaf's choice vector which setting of the memory-lowering leaf
    features it takes: a choice that is off (the None choice, or −1 = not set) reads as off, a
    feature that lowers nothing (dp_overlap) is ignored, and every conflict-free combination maps to
    the alternative that holds exactly its features and choices."""
    from mofa_framework.tuner import alternative_of, memory_alternatives

    reg = mofa_predictor.registry
    model, hw = reg.model("llama3-8b"), reg.hardware_profile("h100-sxm5-80gb")
    choices = {"dp_overlap": (None, {}), "distributed_optimizer": (None, {}, {"shard_gradients": True}),
               "cpu_optimizer": (None, {}), "fp32_cross_entropy": ({}, None)}
    names = list(choices)
    req = TuneRequest(model=model, hardware=hw, num_gpus=16, global_batch_size=64, sequence_length=4096,
                      space=SearchSpace(tp=(1,), pp=(1,), vpp=(1,), cp=(1,), ep=(1,), etp=(1,), micro_batch_size=(1,),
                                        schedules=("1f1b",), features=choices))
    alts = memory_alternatives(reg, req, [reg.features[n] for n in names])
    of = alternative_of(alts, req, names)
    seen = set()
    for combo in itertools.product(*(range(-1, len(c)) for c in choices.values())):
        picked = {n: c for n, c in zip(names, combo) if c >= 0 and choices[n][c] is not None}
        if "distributed_optimizer" in picked and "cpu_optimizer" in picked:
            continue  # they conflict: no leaf takes both
        (a,) = of(np.array([combo]))
        want = {n: c for n, c in picked.items() if n != "dp_overlap"}
        assert {f.name: i for f, _, _, i in alts[a]} == want, combo
        seen.add(int(a))
    assert seen == set(range(len(alts)))


def test_memory_floor_of_a_leaf_feature_without_a_memory_transform(mofa_predictor):
    """A leaf feature that declares ``lowers_memory`` but has no memory transform (a third party's):
    the floor takes the components it declares as 0, the others as they are; a transform that fails
    is one PluginError naming the feature."""
    from mofa_framework import engine
    from mofa_framework.batch import FeatureRows
    from mofa_framework.config import jobs_to_batch
    from mofa_framework.errors import PluginError
    from mofa_framework.types import MemoryOptimizer

    reg = mofa_predictor.registry
    job = mofa_predictor.job({"model": {"name": "llama3-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 16},
                              "parallel": {"tp": 2, "pp": 2, "micro_batch_size": 1, "global_batch_size": 64,
                                           "sequence_length": 4096}})
    nodes = jobs_to_batch([job], reg)
    pl = engine.pipeline_phase(nodes, job.model, job.hardware, mofa_predictor.pm)
    rows = FeatureRows(enabled=np.ones(1, bool))
    off = engine._optimizer_and_memory(pl, {})
    quiet = MemoryOptimizer(name="third_party_states", description="x", lowers_memory=("optimizer_states",),
                            optimizer=lambda state, rows: state)
    floor = engine._with_memory_features(off, [(quiet, rows)]).mem
    assert (floor.optimizer_bytes == 0).all() and off.mem.optimizer_bytes.max() > 1e9  # 12 B a parameter
    assert (floor.weights_bytes == off.mem.weights_bytes).all() and (floor.grads_bytes == off.mem.grads_bytes).all()
    gpu, _ = engine.memory_floor(pl, [(), ((quiet, rows),)])
    exists = engine.stages_present(nodes)
    by_hand = np.where(exists, off.mem.gpu_bytes - off.mem.optimizer_bytes, -np.inf).max()
    assert gpu[1, 0] == pytest.approx(by_hand + job.hardware.reserved_memory_bytes, rel=1e-12) and gpu[1, 0] < gpu[0, 0]

    def broken(state, rows):
        raise KeyError("shard")

    loud = MemoryOptimizer(name="third_party_broken", description="x", lowers_memory=("optimizer_states",),
                           memory=broken)
    with pytest.raises(PluginError, match="third_party_broken.*memory floor.*KeyError"):
        engine.memory_floor(pl, [((loud, rows),)])


def _budget_request(predictor, model_name, hw_name, gpus, gbs, top_k):
    """The time-budget tests' request: recompute, the distributed optimizer and TP overlap, small chunks."""
    reg = predictor.registry
    model, hw = reg.model(model_name), reg.hardware_profile(hw_name)
    space = default_space(reg, model, hw, gpus, 4096, features=["recompute", "distributed_optimizer", "tp_overlap"])
    return dict(model=model, hardware=hw, num_gpus=gpus, global_batch_size=gbs, sequence_length=4096, space=space,
                top_k=top_k, chunk_rows=256)


def test_time_budget_returns_the_best_so_far_labelled(mofa_predictor, monkeypatch):
    """--time-budget: the search stops when it runs out and returns the best found, labelled as not
    proven optimal; with no time at all it still dives to the first configuration that fits. A fake
    clock makes it deterministic: every reading advances one second."""
    import mofa_framework.tuner as tuner_mod

    common = _budget_request(mofa_predictor, "llama3-70b", "h100-sxm5-80gb", 256, 512, top_k=3)
    exact = tune(mofa_predictor, TuneRequest(**common))
    assert exact.proven_optimal and exact.unexplored == 0
    results = []
    for seconds in (10, 20, 40, 80, 160):
        clock = itertools.count()
        monkeypatch.setattr(tuner_mod.time, "perf_counter", lambda: float(next(clock)))
        results.append(tune(mofa_predictor, TuneRequest(**common, time_budget_s=seconds)))
    cut = [r for r in results if r.best and not r.proven_optimal]
    assert cut, "some budget must stop the search after it found something"
    for budget in cut:
        assert budget.unexplored > 0 and budget.best[0].step_time_s >= exact.best[0].step_time_s
    assert all(r.unexplored == 0 for r in results if r.proven_optimal)
    # out of time before anything fitted: it dives to the first configuration that fits (within its
    # grace, here longer than the fake clock's readings run: see the next test for a dive that ends)
    monkeypatch.setattr(tuner_mod, "DIVE_GRACE_S", 1e6)
    dive = tune(mofa_predictor, TuneRequest(**common, time_budget_s=0.5))
    assert dive.best and not dive.proven_optimal and dive.evaluated < exact.evaluated
    monkeypatch.undo()
    # A100 40GB (memory-tight): its first dive leaves nodes pending; the grounded H100's tighter
    # bounds, and since the lattice of adds_time_only features A100 80GB's, settle this search in
    # the first dive, which is then honestly proven optimal
    out = CliRunner().invoke(cli, ["tune", "--model", "llama3-70b", "--hardware", "a100-sxm4-40gb", "--gpus", "256",
                                   "--gbs", "512", "--seq", "4096", "--time-budget", "1e-6", "--top", "2",
                                   "--format", "json"])
    assert out.exit_code == 0 and "not proven optimal" in out.output
    assert json.loads(out.output[out.output.index("{"):])["proven_optimal"] is False


def test_a_dive_that_finds_nothing_that_fits_stops_too(mofa_predictor, monkeypatch):
    """Out of time with nothing that fits, the search dives for the first configuration that does —
    for at most ``dive_deadline(budget)`` = budget + max(budget, DIVE_GRACE_S) seconds. Llama 3.1 405B
    on 32 A100 40GBs fits nowhere (the full search proves it); with a 40 s budget on a fake clock (one
    second a reading) it stops by 80 s, labelled not proven, and says so in one line."""
    import mofa_framework.tuner as tuner_mod

    assert tuner_mod.dive_deadline(40.0) == 80.0 and tuner_mod.dive_deadline(1.0) == 1.0 + tuner_mod.DIVE_GRACE_S
    common = _budget_request(mofa_predictor, "llama3.1-405b", "a100-sxm4-40gb", 32, 64, top_k=2)
    full = tune(mofa_predictor, TuneRequest(**common))
    assert not full.best and full.proven_optimal and "no feasible configuration" in full.why_empty()
    clock = itertools.count()
    monkeypatch.setattr(tuner_mod.time, "perf_counter", lambda: float(next(clock)))
    cut = tune(mofa_predictor, TuneRequest(**common, time_budget_s=40.0))
    # (the memory floors rule out every node the full search reaches: it evaluates no leaf at all)
    assert not cut.best and not cut.proven_optimal and cut.unexplored > 0 and cut.evaluated == full.evaluated == 0
    assert cut.elapsed_s <= 80.0 + 4  # the last pop, and the readings around it
    assert "not proven that none fits" in cut.why_empty() and "\n" not in cut.why_empty()


def test_a_search_where_nothing_fits_dives_and_keeps_few_nodes_pending(mofa_predictor, monkeypatch):
    """Llama 3 70B on 8 A100 40GBs fits nowhere: with no k-th best no bound prunes, so a memory-bound
    search with nothing that fits dives (deepest level first) instead of expanding best-first. It
    proves the same answer with at most a few chunks pending per level: 3,409 nodes at most with
    chunks of 1,024 (best-first held 20,404)."""
    import mofa_framework.tuner as tuner_mod

    reg = mofa_predictor.registry
    model, hw = reg.model("llama3-70b"), reg.hardware_profile("a100-sxm4-40gb")
    req = TuneRequest(model=model, hardware=hw, num_gpus=8, global_batch_size=64, sequence_length=4096,
                      space=default_space(reg, model, hw, 8, 4096), chunk_rows=1024)
    pending, expand = [], tuner_mod._Search.expand
    monkeypatch.setattr(tuner_mod._Search, "expand", lambda self, depth, *a: pending.append(
        sum(len(lv) for lv in self.levels)) or expand(self, depth, *a))
    result = tune(mofa_predictor, req)
    assert not result.best and result.proven_optimal and "no feasible configuration" in result.why_empty()
    assert max(pending) <= 4 * req.chunk_rows


def test_progress_line_when_not_on_a_terminal(capsys):
    """Not on a TTY: one line on stderr every few seconds with evaluated, ruled out, best and ETA."""
    from mofa_framework.commands.tune import _ProgressLine
    from mofa_framework.tuner import TuneProgress

    line = _ProgressLine(every_s=3.0)
    line(TuneProgress(evaluated=10, skipped=0, total=1000, best=None, elapsed_s=1.0))
    assert capsys.readouterr().err == ""
    line(TuneProgress(evaluated=400, skipped=100, total=1000, best=5.5, elapsed_s=3.5))
    err = capsys.readouterr().err
    assert "400 evaluated" in err and "100 ruled out" in err and "best 5.5" in err and "ETA 4 s" in err
    assert "memory-tight" not in err
    line(TuneProgress(evaluated=40_000, skipped=100, total=10**6, best=5.5, elapsed_s=7.0, reached=50_000,
                      feasible=1_200, memory_tight=True))
    err = capsys.readouterr().err
    assert "memory-tight: 1,200 of 50,000 leaves reached fit" in err and "--time-budget" in err and err.count("\n") == 1
    # the leaves a memory floor ruled out are settled too: (50,000 reached + 100 ruled out) of 10^6
    # in 7 s, so 5 % done and 133 s to go (not the 170 s that counting the evaluated alone would say)
    assert "(5%)" in err and "ETA 133 s" in err


def test_a_memory_tight_search_says_so_in_its_progress(mofa_predictor, monkeypatch):
    """Llama 3 70B on 16 A100 40GBs: its fast layouts do not fit (16 bytes a parameter is 1.1 TB against
    640 GB of HBM), so the progress the search reports says it is memory-tight, with counts that agree
    with each other and with the result (reached ≥ evaluated ≥ feasible; fewer than 5 % fitting). A fake
    clock (a second a reading) makes the search report after every pop, on any machine."""
    import mofa_framework.tuner as tuner_mod

    clock = itertools.count()
    monkeypatch.setattr(tuner_mod.time, "perf_counter", lambda: float(next(clock)))
    reg = mofa_predictor.registry
    model, hw = reg.model("llama3-70b"), reg.hardware_profile("a100-sxm4-40gb")
    seen = []
    result = tune(mofa_predictor, TuneRequest(model=model, hardware=hw, num_gpus=16, global_batch_size=128,
                                              sequence_length=4096, space=default_space(reg, model, hw, 16, 4096),
                                              chunk_rows=1024),
                  progress=seen.append)
    assert result.best and seen and seen[-1].evaluated <= result.evaluated
    tight = [p for p in seen if p.memory_tight]
    assert tight, "a 70B search on 16 A100 40GBs should be memory-bound"
    assert all(p.reached >= p.evaluated >= p.feasible and p.feasible < 0.05 * p.reached for p in tight)
    # the leaves the memory floors ruled out: reached, not evaluated, counted as over memory
    over = result.removed_by.get(tuner_mod.OVER_HBM, 0) + result.removed_by.get(tuner_mod.OVER_HOST, 0)
    assert 0 < result.floored <= over and seen[-1].reached - seen[-1].evaluated <= result.floored


def test_e2e_objective_prints_checkpoint_interval_and_ettr_per_row(tmp_path):
    job = tmp_path / "t.toml"
    job.write_text('[model]\nname = "llama3-8b"\n[hardware]\nname = "h100-sxm5-80gb"\nnum_gpus = 64\n'
                   '[parallel]\nglobal_batch_size = 64\nsequence_length = 4096\n'
                   '[search]\ntp = [2, 4]\npp = [1, 2]\nlighter_ends = [0]\nfeatures = ["distributed_optimizer"]\n'
                   '[training]\ntokens = 1e12\n')
    run = lambda *a: CliRunner().invoke(cli, ["tune", str(job), "--objective", "e2e_time", "--top", "3", *a],  # noqa: E731
                                        catch_exceptions=False)
    table = run().output
    assert "ckpt" in table and "ETTR" in table and "steps" in table
    rows = json.loads(run("--format", "json").output)["best"]
    assert all(r["checkpoint_interval_steps"] >= 1 and 0 < r["ettr"] <= 1 for r in rows)
    csv_out = run("--format", "csv").output.splitlines()
    assert "checkpoint_interval_steps" in csv_out[0] and "ettr" in csv_out[0]


def test_gathered_options_read_a_feature_table_at_the_rows_choices():
    """The tuner's FeatureRows options: a feature's (options × choices) table read at each row's choice
    index when first asked for, then kept; `take` keeps rows by index or mask, still unread; the mapping
    behaves as the dict it stands for (keys, membership, get, length)."""
    import numpy as np

    from mofa_framework.batch import FeatureRows, GatheredOptions

    table = np.array([[1.0, 2.0, 4.0], [0.0, 1.0, 0.0]])  # option "chunks", option "mode"; 3 choices
    col = np.array([2, 0, 1, 2])
    opts = GatheredOptions({"chunks": 0, "mode": 1}, table, col)
    assert list(opts) == ["chunks", "mode"] and len(opts) == 2 and "mode" in opts and "nope" not in opts
    assert opts["chunks"].tolist() == [4.0, 1.0, 2.0, 4.0] and opts.get("nope") is None
    assert opts["chunks"] is opts["chunks"] and not opts["chunks"].flags.writeable
    rows = FeatureRows(enabled=np.array([True, False, True, True]), options=opts, choices={"mode": ("a", "b")})
    assert rows.options is opts  # kept as it is, not gathered into a dict
    sub = rows.take(np.array([False, True, True, False]))
    assert isinstance(sub.options, GatheredOptions) and sub.enabled.tolist() == [False, True]
    assert sub.options["chunks"].tolist() == [1.0, 2.0] and sub.choice("mode", "b").tolist() == [False, True]
    assert rows.take(np.array([3, 0])).options["mode"].tolist() == [0.0, 0.0]
    assert dict(sub.options) == {"chunks": sub.options["chunks"], "mode": sub.options["mode"]}


def test_distinct_rows_number_rows_as_np_unique_does():
    """Row ids (the tuner's structures and applicability patterns, the engine's stage placements, the
    GEMM table's shapes): hand values, then any bool or small-integer table against
    ``np.unique(axis=0)`` — same first rows, same ids, same order."""
    import numpy as np
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from hypothesis.extra.numpy import arrays

    from mofa_framework.batch import distinct_rows

    first, ids = distinct_rows(np.array([[2.0, 1.0], [1.0, 5.0], [2.0, 1.0], [1.0, 4.0]]))
    assert first.tolist() == [3, 1, 0] and ids.tolist() == [2, 1, 2, 0]
    first, ids = distinct_rows(np.array([[True, False], [False, True], [True, False]]))
    assert first.tolist() == [1, 0] and ids.tolist() == [1, 0, 1]

    @settings(max_examples=60, deadline=None)
    @given(st.integers(1, 70).flatmap(lambda w: st.one_of(
        arrays(bool, st.tuples(st.integers(1, 40), st.just(w))),
        arrays(np.float64, st.tuples(st.integers(1, 40), st.just(min(w, 12))),
               elements=st.integers(0, 3).map(float)))))
    def check(table):
        _, want_first, want_ids = np.unique(table, axis=0, return_index=True, return_inverse=True)
        got_first, got_ids = distinct_rows(table)
        assert np.array_equal(table[got_first], table[want_first]) and got_ids.tolist() == want_ids.reshape(-1).tolist()

    check()


def test_distinct_rows_of_a_table_in_runs():
    """A leaf batch sorted by structure holds runs of equal rows: only the runs' heads are sorted, and
    the answer is still np.unique's — first occurrences and ids in the rows' order — including a row
    whose runs come back later (hand values, then any run-length table of 65+ rows)."""
    import numpy as np
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from mofa_framework.batch import distinct_rows

    table = np.repeat(np.array([[4, 1], [2, 7], [4, 1]]), [30, 40, 30], axis=0)  # 100 rows, 3 runs
    first, ids = distinct_rows(table)
    assert first.tolist() == [30, 0] and ids.tolist() == [1] * 30 + [0] * 40 + [1] * 30

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(1, 40)), min_size=1, max_size=12),
           st.booleans())
    def check(runs, as_bool):
        rows = np.repeat(np.array([[a, b] for a, b, _ in runs]), [n for *_, n in runs], axis=0)
        table = rows.astype(bool) if as_bool else rows
        _, want_first, want_ids = np.unique(table, axis=0, return_index=True, return_inverse=True)
        got_first, got_ids = distinct_rows(table)
        assert got_first.tolist() == want_first.tolist() and got_ids.tolist() == want_ids.reshape(-1).tolist()

    check()


def test_pareto_staircase_drops_only_strictly_dominated_rows():
    """A chunk's rows strictly dominated by the front kept so far (no slower, no larger, better in one)
    never reach the front; a row equal to a front point is kept for the tie rule."""
    from mofa_framework.tuner import _dominated, _staircase

    st_t, st_m = _staircase(np.array([2.0, 1.0, 3.0, 2.0]), np.array([5.0, 9.0, 1.0, 7.0]), np.zeros(0), np.zeros(0))
    assert st_t.tolist() == [1.0, 2.0, 3.0] and st_m.tolist() == [9.0, 5.0, 1.0]  # (2, 7) is dominated by (2, 5)
    t = np.array([0.5, 1.0, 1.5, 2.0, 2.0, 2.5, 3.0, 4.0, 2.5])
    m = np.array([99., 9.0, 9.5, 5.0, 4.0, 5.0, 1.0, 2.0, 4.5])
    assert _dominated((st_t, st_m), t, m).tolist() == [False, False, True, False, False, True, False, True, False]
    assert not _dominated((np.zeros(0), np.zeros(0)), t, m).any()


def _level_arrays(bounds, fanouts, first_id=0):
    """A pushed batch of nodes: ids from `first_id`, leaves below each = 2 × its fanout."""
    ids = np.arange(first_id, first_id + len(bounds))
    return ids % 3, ids, ids * 10, np.array(bounds, float), np.array(fanouts, np.int64) * 2, np.array(fanouts, np.int64)


def _pop_as_reference(lv, ref, limit, budget):
    """Pop `lv` and check it against the reference list `ref` of (bound, id, fanout) sorted stably by
    bound, the budget read as the largest prefix whose children fit (at least one): the new `ref`."""
    live = sorted((n for n in ref if n[0] <= limit), key=lambda n: n[0])  # stable: push order
    take = 0
    while take < len(live) and (take == 0 or sum(n[2] for n in live[:take + 1]) <= budget):
        take += 1
    got = lv.pop(limit, budget)
    if not live:
        assert got is None
        return ref
    want = live[:take]
    assert got[1].tolist() == [n[1] for n in want] and got[3].tolist() == [n[0] for n in want]
    return [n for n in ref if n not in want]


def test_pending_level_pops_the_smallest_bounds_first_as_one_sorted_list_would():
    """``_Level`` keeps each pushed batch sorted with a cursor: hand values, then any sequence of
    pushes and pops against the whole pending list sorted stably by bound (equal bounds in push
    order), the budget read as the largest prefix whose children fit (at least one node)."""
    from mofa_framework.tuner import _Level

    arrays = _level_arrays

    lv = _Level()
    lv.push(*arrays([5.0, 1.0, 3.0], [4, 4, 4]))
    lv.push(*arrays([3.0, 0.5], [4, 4], first_id=3))
    assert len(lv) == 5 and lv.min() == 0.5
    assert lv.leaves(3.0) == (2 * 4, 2 * 16)  # only the bound-5 node lies above 3
    grp, s, sub, bound = lv.pop(limit=4.0, budget=10)  # 0.5, 1.0 (fanout 8 ≤ 10), not a third
    assert s.tolist() == [4, 1] and bound.tolist() == [0.5, 1.0] and sub.tolist() == [40, 10]
    assert lv.pop(limit=4.0, budget=1)[1].tolist() == [2]  # equal bounds: the earlier push first
    assert lv.pop(limit=4.0, budget=100)[1].tolist() == [3] and lv.pop(limit=4.0, budget=100) is None
    assert len(lv) == 1 and lv.min() == 5.0

    @settings(max_examples=80, deadline=None)
    @given(st.lists(st.one_of(
        st.tuples(st.just("push"), st.lists(st.tuples(st.integers(0, 6), st.integers(1, 5)), min_size=1, max_size=12)),
        st.tuples(st.just("pop"), st.tuples(st.integers(0, 7), st.integers(1, 20)))), max_size=25))
    def check(ops):
        lv, ref, next_id = _Level(), [], 0
        for kind, arg in ops:
            if kind == "push":
                bounds, fans = [float(b) for b, _ in arg], [f for _, f in arg]
                lv.push(*arrays(bounds, fans, next_id))
                ref += [(b, next_id + i, f) for i, (b, f) in enumerate(zip(bounds, fans))]
                next_id += len(arg)
            else:
                ref = _pop_as_reference(lv, ref, float(arg[0]), arg[1])
            assert len(lv) == len(ref)
            assert lv.min() == min((n[0] for n in ref), default=np.inf)
            above = 3.0
            assert lv.leaves(above) == (sum(2 * n[2] for n in ref if n[0] > above),
                                        sum(2 * n[2] for n in ref if n[0] <= above))

    check()


@pytest.mark.parametrize("compact_min", [1, 4096])
def test_pending_level_drops_what_can_no_longer_win_and_counts_its_leaves(monkeypatch, compact_min):
    """``_Level.prune(limit)`` / ``push(..., limit=)``: nodes above the k-th best (which only falls)
    are dropped with their leaves counted as pruned, and popped heads are freed; against a reference
    list: the same pops, the same live nodes below the limit, the same pruned and kept leaves
    (with every part compacted at once, ``COMPACT_MIN = 1``, and at the shipped threshold)."""
    from mofa_framework.tuner import _Level

    monkeypatch.setattr(_Level, "COMPACT_MIN", compact_min)

    arrays = _level_arrays

    lv = _Level()
    lv.push(*arrays([5.0, 1.0, 3.0, 9.0], [4, 4, 4, 4]), limit=6.0)  # 9.0 can never be popped
    assert len(lv) == 3 and lv.dropped == 8
    lv.prune(2.0)
    assert lv.leaves(2.0) == (8 + 2 * 8, 8) and lv.min() == 1.0

    @settings(max_examples=80, deadline=None)
    @given(st.lists(st.one_of(
        st.tuples(st.just("push"), st.lists(st.tuples(st.integers(0, 6), st.integers(1, 5)), min_size=1, max_size=12)),
        st.tuples(st.just("pop"), st.tuples(st.integers(0, 7), st.integers(1, 20))),
        st.tuples(st.just("prune"), st.integers(0, 7))), max_size=25))
    def check(ops):
        lv, ref, next_id, cap, dropped = _Level(), [], 0, np.inf, 0
        for kind, arg in ops:
            if kind == "push":
                bounds, fans = [float(b) for b, _ in arg], [f for _, f in arg]
                lv.push(*arrays(bounds, fans, next_id), limit=cap)
                new = [(b, next_id + i, f) for i, (b, f) in enumerate(zip(bounds, fans))]
                dropped += sum(2 * n[2] for n in new if n[0] > cap)
                ref += [n for n in new if n[0] <= cap]
                next_id += len(arg)
            elif kind == "prune":
                cap = min(cap, float(arg))
                lv.prune(cap)
                dropped += sum(2 * n[2] for n in ref if n[0] > cap)
                ref = [n for n in ref if n[0] <= cap]
            else:
                ref = _pop_as_reference(lv, ref, min(float(arg[0]), cap), arg[1])
            if ref:  # every reference node is ≤ cap: the level's smallest is the reference's
                assert lv.min() == min(n[0] for n in ref)
            above = min(3.0, cap)
            assert lv.leaves(above) == (dropped + sum(2 * n[2] for n in ref if n[0] > above),
                                        sum(2 * n[2] for n in ref if n[0] <= above))

    check()


def test_present_values_are_np_unique_of_small_ints():
    """`_present` counts instead of sorting: the same sorted distinct values as np.unique."""
    from mofa_framework.tuner import _present

    a = np.array([3, 0, 3, 7, 0, 2], np.int64)
    assert _present(a).tolist() == np.unique(a).tolist() == [0, 2, 3, 7]
    assert _present(np.zeros(0, np.int64)).tolist() == []


def test_tune_offloads_only_the_layers_memory_needs(mofa_predictor):
    """Mixtral 8×22B at TP 4, PP 1, EP 8 with FSDP on 512 H100s (mbs 2 or 4): without offloading
    only resharding parameters after the forward fits (5.44 s); offloading every layer's activations
    costs more than that saves (6.04 s); offloading a quarter of them (the option's search values
    0.25, 0.5, 1) fits without resharding and hides each copy behind its window of layers (5.12 s)."""
    reg = mofa_predictor.registry
    model, hw = reg.model("mixtral-8x22b"), reg.hardware_profile("h100-sxm5-80gb")

    def best(offload):
        space = SearchSpace(tp=(4,), pp=(1,), vpp=(1,), cp=(1,), ep=(8,), etp=(2,), micro_batch_size=(2, 4),
                            schedules=("1f1b",), features={"activation_offload": offload,
                                                           "fsdp": feature_choices(reg, "fsdp", allow_off=False)})
        req = TuneRequest(model=model, hardware=hw, num_gpus=512, global_batch_size=1024, sequence_length=4096,
                          space=space, top_k=1)
        return tune(mofa_predictor, req).best[0]

    searched = best(feature_choices(reg, "activation_offload"))
    whole = best((None, {"fraction": 1.0}))
    assert searched.features["activation_offload"]["fraction"] == 0.25
    assert "activation_offload" not in whole.features
    assert searched.step_time_s == pytest.approx(5.120, rel=2e-3) and whole.step_time_s == pytest.approx(5.440, rel=2e-3)
    args, _ = megatron_arguments(model, searched, reg)
    assert "--cpu-offloading-num-layers 14" in args  # a quarter of 56 layers


def test_memory_headroom_keeps_that_much_hbm_free(mofa_predictor, tmp_path):
    """A headroom of h GiB: every configuration kept peaks at most HBM − h (the search's floors and
    each leaf's fit alike). Mixtral 8×22B at TP 4, PP 1, EP 8 on 512 H100s nearly fills the GPU
    without one (78.6 GiB of 80); with 10 GiB the best peaks under 70 GiB and is slower or as fast; the same from the
    job file's [search] table, from the CLI flag (the headline says so) and Predictor.tune."""
    job = {"model": {"name": "mixtral-8x22b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 512},
           "parallel": {"global_batch_size": 1024, "sequence_length": 4096},
           "search": {"tp": [4], "pp": [1], "ep": [8], "micro_batch_size": [4], "schedules": ["1f1b"]}}
    free = mofa_predictor.tune(job, top_k=1)
    roomy = mofa_predictor.tune(job, top_k=3, memory_headroom_gib=10)
    assert free.best[0].peak_memory_gib > 75 and free.memory_headroom_gib == 0
    assert roomy.memory_headroom_gib == 10 and all(c.peak_memory_gib <= 70 for c in roomy.best)
    assert roomy.best[0].step_time_s >= free.best[0].step_time_s
    from_table = mofa_predictor.tune({**job, "search": {**job["search"], "memory_headroom_gib": 10}}, top_k=1)
    assert from_table.best[0].step_time_s == roomy.best[0].step_time_s
    path = tmp_path / "job.toml"
    path.write_text('[model]\nname = "mixtral-8x22b"\n[hardware]\nname = "h100-sxm5-80gb"\nnum_gpus = 512\n'
                    '[parallel]\nglobal_batch_size = 1024\nsequence_length = 4096\n'
                    '[search]\ntp = [4]\npp = [1]\nep = [8]\nmicro_batch_size = [4]\nschedules = ["1f1b"]\n')
    out = CliRunner().invoke(cli, ["tune", str(path), "--memory-headroom-gib", "10", "--top", "1", "--no-progress"],
                             catch_exceptions=False)
    assert out.exit_code == 0 and "leaving 10 GiB of HBM free" in out.output
    bad = CliRunner().invoke(cli, ["tune", str(path), "--memory-headroom-gib", "80", "--no-progress"])
    assert bad.exit_code == 2 and "memory_headroom_gib: 80 GiB leaves none" in bad.output
    bad = CliRunner().invoke(cli, ["tune", str(path), "--memory-headroom-gib", "nan", "--no-progress"])
    assert bad.exit_code == 2 and bad.output.startswith("error: memory_headroom_gib: expected GiB ≥ 0")
    path.write_text(path.read_text() + "memory_headroom_gib = -2\n")
    bad = CliRunner().invoke(cli, ["tune", str(path), "--no-progress"])
    assert bad.exit_code == 2 and "search.memory_headroom_gib" in bad.output and "\n" not in bad.output.strip()


def test_rows_of_one_structure_with_other_dp_bytes_are_priced_as_predict_prices_them(mofa_predictor):
    """The distributed optimizer's collectives are priced once per structure in a search, but their bytes
    per parameter come from feature options (fp32 or bf16 gradients; FP8 weights gathered in 1 byte), which
    rows of one structure need not share. With both searched (Llama 3 8B, TP 2, 64 H100s: DP 32 over the
    nodes' NICs), the search's choice is the fastest of the four as `predict` prices them — bf16 gradients
    and FP8 weights — not the first row's bytes applied to all four (the search ranked them as equals)."""
    reg = mofa_predictor.registry
    model, hw = reg.model("llama3-8b"), reg.hardware_profile("h100-sxm5-80gb")
    options = {"fp8": ({"fp8_params": False}, {"fp8_params": True}),
               "distributed_optimizer": ({"grad_reduce_dtype": "fp32"}, {"grad_reduce_dtype": "bf16"})}
    space = SearchSpace(tp=(2,), pp=(1,), vpp=(1,), cp=(1,), ep=(1,), etp=(1,), micro_batch_size=(1,),
                        schedules=("1f1b",), features=options)
    req = TuneRequest(model=model, hardware=hw, num_gpus=64, global_batch_size=64, sequence_length=4096,
                      space=space, top_k=1)
    best = tune(mofa_predictor, req).best[0]
    predicted = {}
    for fp8, dist in itertools.product(*options.values()):
        job = {"model": {"name": "llama3-8b"}, "hardware": {"name": hw.name, "num_gpus": 64},
               "parallel": {"tp": 2, "pp": 1, "micro_batch_size": 1, "global_batch_size": 64, "sequence_length": 4096},
               "features": {"fp8": fp8, "distributed_optimizer": dist}}
        predicted[(fp8["fp8_params"], dist["grad_reduce_dtype"])] = mofa_predictor.predict(mofa_predictor.job(job))[0].step_time_s
    assert len(set(predicted.values())) == 4  # the four byte counts price differently
    fastest = min(predicted, key=predicted.get)
    assert fastest == (True, "bf16")
    assert best.step_time_s == pytest.approx(predicted[fastest], rel=1e-12)
    assert (best.features["fp8"]["fp8_params"], best.features["distributed_optimizer"]["grad_reduce_dtype"]) == fastest


_FLEX_SPACE = dict(_MOE_SPACE, tp=(1, 2), pp=(1, 2), vpp=(1,), ep=(1, 2, 4, 8), schedules=("1f1b",), lighter_ends=(0,),
                   lighter_last=(0,))
_FLEX_FEATURES = ("distributed_optimizer", "ep_overlap", "flex_dispatcher", "recompute")


def test_a_feature_never_slower_is_tried_on_only_and_the_optimum_stays_brute_force(mofa_predictor):
    """flex_dispatcher declares itself never slower inside one node of at most 8 EP ranks (the same
    all-to-all, the tokens sent once per rank): Mixtral 8×7B on 16 H100s, EP 2 and 4 within a node
    (EP 8: one expert per rank, nothing to save, not searched), the tuner skips its off leaves there
    and its optimum equals brute force over every setting, off included."""
    from mofa_framework.tuner import NEVER_SLOWER

    reg = mofa_predictor.registry
    jobs, pred, ok = _oracle(mofa_predictor, "h100-sxm5-80gb", 16, 32, 4096, _FLEX_SPACE, _FLEX_FEATURES)
    fits = ok & pred.fits_in_memory
    best = float(pred.step_time_s[int(np.argmin(np.where(fits, pred.step_time_s, np.inf)))])
    space = SearchSpace(**_FLEX_SPACE, features={n: feature_choices(reg, n) for n in _FLEX_FEATURES})
    req = TuneRequest(model=jobs[0].model, hardware=jobs[0].hardware, num_gpus=16, global_batch_size=32,
                      sequence_length=4096, space=space, top_k=3)
    result = tune(mofa_predictor, req)
    assert result.best[0].step_time_s == pytest.approx(best, rel=1e-12)
    assert result.removed_by.get(NEVER_SLOWER, 0) > 0
    # EP 2 and 4 alone (the optimum above is EP 8): brute force's best there is reached with the
    # dispatcher on (off at most ties it), and the tuner's, which never tries it off there, is that
    inside = np.array([j.parallel.ep in (2, 4) for j in jobs]) & fits
    flex = np.array(["flex_dispatcher" in j.features for j in jobs])
    best_inside = float(np.min(np.where(inside, pred.step_time_s, np.inf)))
    assert np.isfinite(best_inside)
    assert float(np.min(np.where(inside & flex, pred.step_time_s, np.inf))) == best_inside
    assert np.any(inside & ~flex & (pred.step_time_s > best_inside))  # off does cost somewhere
    only = tune(mofa_predictor, attrs.evolve(req, space=attrs.evolve(space, ep=(2, 4))))
    assert only.best[0].step_time_s == pytest.approx(best_inside, rel=1e-12)
    assert "flex_dispatcher" in only.best[0].features


@pytest.mark.parametrize("model_name", ["qwen3-30b-a3b", "mixtral-8x7b"])
def test_never_slower_declarations_hold(mofa_predictor, model_name):
    """Where a built-in feature declares ``never_slower``, each of its option settings on is
    feasible, no slower in step time and equal in peak memory to the feature off (random layouts and
    companion features on 8 and 16 H100s)."""
    from mofa_framework.config import jobs_to_batch

    reg = mofa_predictor.registry
    rng = np.random.default_rng(1)
    declared = [n for n, f in reg.features.items() if f.never_slower is not None]
    assert "flex_dispatcher" in declared
    for name in declared:
        feat = reg.features[name]
        settings = [c for c in feature_choices(reg, name) if c is not None]
        settings += [{"backend": b} for b in ("hybridep", "deepep") if name == "flex_dispatcher"]
        for _ in range(12):
            gpus = int(rng.choice([8, 16]))
            tp, ep = int(rng.choice([1, 2])), int(rng.choice([2, 4, 8]))
            base = {"model": {"name": model_name}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": gpus},
                    "parallel": {"tp": tp, "pp": 1, "ep": ep, "micro_batch_size": 1, "global_batch_size": 64,
                                 "sequence_length": 4096},
                    "features": {k: {} for k in rng.choice(["ep_overlap", "recompute", "distributed_optimizer"],
                                                           size=int(rng.integers(0, 3)), replace=False)}}
            try:
                off = mofa_predictor.job(base)
            except ConfigError:
                continue
            if not feat.never_slower(jobs_to_batch([off], reg), off.model, off.hardware)[0]:
                continue
            r_off = mofa_predictor.predict(off)[0]
            for opts in settings:
                on = mofa_predictor.job({**base, "features": {**base["features"], name: dict(opts)}})
                r_on = mofa_predictor.predict(on)[0]
                assert r_on.step_time_s <= r_off.step_time_s * (1 + 1e-12), (name, opts, base)
                assert r_on.peak_memory_gib == pytest.approx(r_off.peak_memory_gib, rel=1e-12), (name, opts, base)
