"""The tuner: exactness against brute force, the paper's qualitative findings, and errors."""

import itertools
import json

import attrs
import numpy as np
import pytest
from click.testing import CliRunner

from mofa_framework.cli import _builtin_commands, cli
from mofa_framework.errors import ConfigError
from mofa_framework.tuner import SearchSpace, TuneRequest, default_space, feature_choices, megatron_arguments, tune

_builtin_commands()


def _space(reg, **kw):
    base = dict(tp=(1, 2, 4), pp=(1, 2), vpp=(1, 2), cp=(1,), ep=(1,), etp=(1,), micro_batch_size=(1, 2),
                schedules=("1f1b", "interleaved-1f1b", "zb-h1"),
                features={f: feature_choices(reg, f) for f in ("recompute", "distributed_optimizer", "tp_overlap")})
    base.update(kw)
    return SearchSpace(**base)


def test_search_equals_brute_force(mofa_predictor):
    reg = mofa_predictor.registry
    model, hw = reg.model("llama3-8b"), reg.hardware_profile("h100-sxm5-80gb")
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
            job = {"model": {"name": "llama3-8b"}, "hardware": {"name": hw.name, "num_gpus": 8},
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
                                        catch_exceptions=False).output)
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


def test_chunk_size_does_not_change_the_answer(mofa_predictor):
    """Best-first expansion pops nodes in chunks of about `chunk_rows` candidates; how many at a
    time changes the order of work, never the answer (the bounds are exact)."""
    reg = mofa_predictor.registry
    model, hw = reg.model("llama3-70b"), reg.hardware_profile("h100-sxm5-80gb")
    space = default_space(reg, model, hw, 256, 4096, features=["recompute", "distributed_optimizer", "tp_overlap"])
    common = dict(model=model, hardware=hw, num_gpus=256, global_batch_size=512, sequence_length=4096, space=space,
                  top_k=5)
    small = tune(mofa_predictor, TuneRequest(**common, chunk_rows=64))
    large = tune(mofa_predictor, TuneRequest(**common, chunk_rows=1 << 20))
    assert [c.step_time_s for c in small.best] == [c.step_time_s for c in large.best]
    assert [c.parallel for c in small.best] == [c.parallel for c in large.best]
