"""DeepSpeed ZeRO stages 1-3 (``deepspeed_zero``): memory and communication volumes derived by hand
from the ZeRO paper (Rajbhandari et al. 2020, §5 and Table 1) and DeepSpeed's defaults, against the
*off* prediction's engine state and the collective provider — never by calling the plugin."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from mofa_framework.config import jobs_to_batch
from mofa_framework.decompose import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, Coll, layer_params
from mofa_framework.errors import ConfigError
from mofa_framework.testing.contract import assert_same_row
from mofa_framework.tuner import feature_choices

# the ZeRO paper's Table 1 case: a 7.5B model on N_d = 64 GPUs (here GPT 7.5B, TP = PP = 1, so every
# GPU holds all Ψ parameters); 128 sequences = m = 2 micro-batches of 1 per rank
JOB = {"model": {"name": "gpt-7.5b"}, "hardware": {"name": "a100-sxm4-80gb", "num_gpus": 64},
       "parallel": {"tp": 1, "pp": 1, "micro_batch_size": 1, "global_batch_size": 128, "sequence_length": 2048}}
D, M, L = 64, 2, 36
ONE_BUCKET = {"reduce_bucket_size": 1e12, "allgather_bucket_size": 1e12}  # the whole model in one bucket
PAPER = {"use_multi_rank_bucket_allreduce": False, **ONE_BUCKET}  # reduce-scatter: the paper's volumes


def predict(pred, features):
    jobs = [pred.job({**JOB, "features": f}) for f in features]
    return pred.evaluate(jobs_to_batch(jobs, pred.registry), jobs[0].model, jobs[0].hardware)


def close(a, b, rel=1e-9):
    np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=rel, atol=1e-12)


def price(ctx, kind, nbytes, rows=1):
    return ctx.collective_s(Coll(name="x", parallel="dp", kind=kind, bytes=np.full(rows, float(nbytes)),
                                 group_size=np.full(rows, float(D)), stride=np.ones(rows)))[0]


def psi(pred):
    return predict(pred, [{}]).state.mem.dense_params[0, 0]


def layer_psi(pred):
    lp = layer_params(pred.registry.model("gpt-7.5b"), "dense")
    return lp["sharded"] + lp["replicated"]


# ------------------------------------------------------------------ memory: the paper's Table 1


@pytest.mark.parametrize("stage, bytes_per_param, paper_gb", [
    (1, 2 + 2 + 12 / D, 31.4),       # P_os: 4Ψ + 12Ψ/N_d
    (2, 2 + (2 + 12) / D, 16.6),     # P_os+g: 2Ψ + 14Ψ/N_d
    (3, (2 + 2 + 12) / D, 1.9),      # P_os+g+p: 16Ψ/N_d
])
def test_model_state_memory_is_the_papers(mofa_predictor, stage, bytes_per_param, paper_gb):
    mem = predict(mofa_predictor, [{"deepspeed_zero": {"stage": stage}}]).state.mem
    P = mem.dense_params[0, 0]
    states = mem.weights_bytes[0, 0] + mem.grads_bytes[0, 0] + mem.optimizer_bytes[0, 0]
    close(states, bytes_per_param * P)
    # Table 1 (Ψ = 7.5B, K = 12, N_d = 64), in GB
    assert round(bytes_per_param * 7.5e9 / 1e9, 1) == paper_gb


def test_deepspeed_buffers(mofa_predictor):
    """The contiguous gradient bucket: reduce_bucket_size = 5e8 elements × 2 bytes, two with overlap_comm
    (stages 1-2); stage 3 adds the gathered parameters: R = min(max_reuse_distance/2, Ψ) = 5e8 retained
    across the turn + 5e7 prefetched (≤ max_live 1e9), the running layer P_ℓ, and its gradient."""
    runs = predict(mofa_predictor, [{"deepspeed_zero": {"stage": 1}}, {"deepspeed_zero": {"stage": 2, "overlap_comm": "on"}},
                                    {"deepspeed_zero": {"stage": 3}}, {}])
    extra = runs.state.mem.buffers_bytes[0] - runs.state.mem.buffers_bytes[0, 3]
    pl = layer_psi(mofa_predictor)
    close(extra[:3], [1e9, 2e9, 1e9 + (5e8 + 5e7 + pl) * 2 + pl * 2])


def test_gradients_in_the_model_dtype_or_fp32(mofa_predictor):
    runs = predict(mofa_predictor, [{"deepspeed_zero": {"grad_accum_dtype": "fp32"}}, {"deepspeed_zero": {}}, {}])
    g = runs.state.mem.grads_bytes[0]
    P = runs.state.mem.dense_params[0, 0]
    close(g, [4 * P, 2 * P, 4 * P])  # Megatron's engine default keeps fp32 main grads
    with pytest.raises(ConfigError, match="grad_accum_dtype"):
        mofa_predictor.job({**JOB, "features": {"deepspeed_zero": {"stage": 2, "grad_accum_dtype": "fp32"}}})


# ------------------------------------------------------------------ communication volumes: 2Ψ / 2Ψ / 3Ψ


def test_stage1_reduce_scatter_plus_all_gather_is_2psi(mofa_predictor):
    r = predict(mofa_predictor, [{"deepspeed_zero": {"stage": 1, **PAPER}}])
    ctx, P = r.state.ctx, r.state.mem.dense_params[0, 0]
    close(r.state.opt.dp_comm_s[0], price(ctx, REDUCE_SCATTER, 2 * P) + price(ctx, ALL_GATHER, 2 * P))
    close(r.breakdown["dp_comm"][0], r.state.opt.dp_comm_s[0])  # overlap_comm off at stage 1: all exposed
    assert r.breakdown["dp_layer_comm"][0] == 0.0


def test_stage1_default_all_reduces_the_buckets(mofa_predictor):
    """use_multi_rank_bucket_allreduce (default): each bucket is all-reduced (2Ψ) + the all-gather (Ψ);
    P = 7.46e9 in ⌊P/5e8⌋ = 14 full buckets of 5e8 elements and the rest."""
    r = predict(mofa_predictor, [{"deepspeed_zero": {"stage": 1}}])
    ctx, P = r.state.ctx, r.state.mem.dense_params[0, 0]
    n = np.floor(P / 5e8)
    assert n == 14
    rest = P - n * 5e8
    red = n * price(ctx, ALL_REDUCE, 1e9) + price(ctx, ALL_REDUCE, 2 * rest)
    ag = n * price(ctx, ALL_GATHER, 1e9) + price(ctx, ALL_GATHER, 2 * rest)
    close(r.state.opt.dp_comm_s[0], red + ag)


def test_stage1_overlap_hides_all_but_the_last_bucket(mofa_predictor):
    r = predict(mofa_predictor, [{"deepspeed_zero": {"stage": 1, "overlap_comm": "on"}}])
    ctx, P, pipe = r.state.ctx, r.state.mem.dense_params[0, 0], r.state.pipe
    rest = P - 14 * 5e8
    red, last = 14 * price(ctx, ALL_REDUCE, 1e9) + price(ctx, ALL_REDUCE, 2 * rest), price(ctx, ALL_REDUCE, 2 * rest)
    ag = 14 * price(ctx, ALL_GATHER, 1e9) + price(ctx, ALL_GATHER, 2 * rest)
    eff = r.hardware.efficiency
    T = pipe.v[0] * (pipe.B[0] + pipe.W[0])  # the last micro-batch's backward
    exposed = max(eff.contention_compute * T, eff.contention_comm * (red - last)) - T + last
    close(r.breakdown["dp_comm"][0], exposed + ag)


def test_stage2_reduces_every_micro_batch(mofa_predictor):
    """Stage 2: m × Ψ gradient reduce-scatters (one per micro-batch) + Ψ all-gather per step."""
    r = predict(mofa_predictor, [{"deepspeed_zero": {"stage": 2, **PAPER}}])
    ctx, P = r.state.ctx, r.state.mem.dense_params[0, 0]
    rs = price(ctx, REDUCE_SCATTER, 2 * P)
    dense = r.state.layers["dense"]
    close(L * dense.dp_bwd_s[0], rs)                        # per micro-batch, spread over the 36 layers
    close(r.breakdown["dp_layer_comm"][0], M * rs, rel=1e-6)  # overlap off: all exposed, m times
    close(r.state.opt.dp_comm_s[0], price(ctx, ALL_GATHER, 2 * P))


def test_stage3_gathers_twice_and_scatters_once_per_micro_batch(mofa_predictor):
    """Stage 3, per micro-batch: AG(Ψ) forward + AG(Ψ) backward + RS(Ψ) = 3Ψ (nothing retained across
    the turn with max_reuse_distance = 0; one gather per layer), nothing per step."""
    r = predict(mofa_predictor, [{"deepspeed_zero": {"stage": 3, "max_reuse_distance": 0, "modules_per_layer": 1,
                                                     **PAPER}}])
    ctx, P = r.state.ctx, r.state.mem.dense_params[0, 0]
    pl = layer_psi(mofa_predictor)
    rest = P - L * pl  # embedding (tied) and final norm
    ag_layers = L * price(ctx, ALL_GATHER, 2 * pl) + price(ctx, ALL_GATHER, 2 * rest)
    dense = r.state.layers["dense"]
    close(L * dense.dp_fwd_s[0], ag_layers)
    close(L * dense.dp_bwd_s[0], ag_layers + price(ctx, REDUCE_SCATTER, 2 * P))
    assert r.state.opt.dp_comm_s[0] == 0.0
    # DeepSpeed's defaults keep R = 5e8 elements gathered for the backward and gather module by module
    d = predict(mofa_predictor, [{"deepspeed_zero": {"stage": 3, "modules_per_layer": 1, **PAPER}}]).state.layers
    close(L * d["dense"].dp_bwd_s[0] - price(ctx, REDUCE_SCATTER, 2 * P), ag_layers * (1 - 5e8 / P))
    four = predict(mofa_predictor, [{"deepspeed_zero": {"stage": 3, "max_reuse_distance": 0, **PAPER}}]).state.layers
    close(four["dense"].dp_fwd_s[0] - dense.dp_fwd_s[0], 4 * price(ctx, ALL_GATHER, 2 * pl / 4)
          - price(ctx, ALL_GATHER, 2 * pl))


def test_stage3_prefetch_and_overlap_hide_behind_the_layer(mofa_predictor):
    r = predict(mofa_predictor, [{"deepspeed_zero": {"stage": 3, "max_reuse_distance": 0, "modules_per_layer": 1,
                                                     **PAPER}},
                                 {"deepspeed_zero": {"stage": 3, "max_reuse_distance": 0, "modules_per_layer": 1,
                                                     "prefetch_bucket_size": 0, "overlap_comm": "off", **PAPER}}])
    d = r.state.layers["dense"]
    eff = r.hardware.efficiency
    a, b = eff.contention_compute, eff.contention_comm
    f = d.fwd_compute_s[0]
    close(d.dp_exposed_fwd_s[0], max(a * f, b * d.dp_fwd_s[0]) - f)
    close(d.dp_exposed_fwd_s[1], d.dp_fwd_s[1])  # no prefetch: every gather exposed
    close(d.dp_exposed_bwd_s[1], d.dp_bwd_s[1])
    # one bucket: the whole reduce-scatter is the last bucket, exposed after the backward
    rs = price(r.state.ctx, REDUCE_SCATTER, 2 * r.state.mem.dense_params[0, 0])
    bc = d.bwd_input_s[0] + d.bwd_weight_s[0] + d.recompute_s[0]
    gather_b = d.dp_bwd_s[0] - rs / L
    close(d.dp_exposed_bwd_s[0], max(a * bc, b * gather_b) - bc + rs / L)


def test_stage3_without_contiguous_gradients_all_reduces_them(mofa_predictor):
    """DeepSpeed before v0.4.5 (stage 3's contiguous_gradients defaulted to false): the gradients are
    all-reduced, 2(n−1)/n·2Ψ instead of the reduce-scatter's (n−1)/n·2Ψ (one bucket here)."""
    base = {"stage": 3, "max_reuse_distance": 0, "modules_per_layer": 1, **PAPER}
    r = predict(mofa_predictor, [{"deepspeed_zero": base},
                                 {"deepspeed_zero": {**base, "contiguous_gradients": False}}])
    ctx, P = r.state.ctx, r.state.mem.dense_params[0, 0]
    d = r.state.layers["dense"]
    close(L * (d.dp_bwd_s[1] - d.dp_bwd_s[0]), price(ctx, ALL_REDUCE, 2 * P) - price(ctx, REDUCE_SCATTER, 2 * P))


def test_stage3_full_recompute_gathers_again(mofa_predictor):
    """Full recompute re-runs each layer's forward inside the backward: DeepSpeed's hooks gather its
    parameters for the recompute, and again for the backward unless kept within max_reuse_distance.
    D = 0: nothing kept, AG forward + AG recompute + AG backward + RS = 4Ψ per micro-batch."""
    base = {"stage": 3, "max_reuse_distance": 0, "modules_per_layer": 1, **PAPER}
    r = predict(mofa_predictor, [{"deepspeed_zero": base},
                                 {"deepspeed_zero": base, "recompute": {"granularity": "full"}},
                                 {"deepspeed_zero": base, "recompute": {"granularity": "selective"}}])
    d = r.state.layers["dense"]
    gather = d.dp_fwd_s[0]
    close(d.dp_bwd_s[1] - d.dp_bwd_s[0], gather)  # one more gather per layer
    close(d.dp_bwd_s[2], d.dp_bwd_s[0])  # the attention core has no parameters to gather


def test_modules_kept_from_the_recompute_for_the_backward():
    """Module j of k is reused 2(k−1−j)·P_ℓ/k elements after its recompute. GPT-3 175B's layer,
    P_ℓ = 12h² + 13h = 1.812e9 (h = 12288), k = 4: distances 0, 0.906e9, 1.81e9, 2.72e9; with DeepSpeed's
    default D = 1e9 the last two modules are kept (½); D = 0: none; D = 3e9: all four."""
    from mofa_framework.batch import FeatureRows
    from mofa_plugins.deepspeed_zero import kept_after_recompute

    p = 12 * 12288**2 + 13 * 12288
    for d, want in ((1e9, 0.5), (0.0, 0.0), (3e9, 1.0), (0.95e9, 0.5), (0.9e9, 0.25)):
        rows = FeatureRows(enabled=np.array([True]), options={"max_reuse_distance": np.array([d])})
        close(kept_after_recompute(rows, np.array([float(p)]), np.array([4.0])), [want])


def test_stage3_prefetch_stops_at_max_live_parameters(mofa_predictor):
    """DeepSpeed prefetches only while the gathered parameters are under max_live_parameters: a
    module as large as the cap is gathered when asked, every gather exposed."""
    base = {"stage": 3, "max_reuse_distance": 0, "modules_per_layer": 1, **PAPER}
    r = predict(mofa_predictor, [{"deepspeed_zero": {**base, "max_live_parameters": 1e12}},
                                 {"deepspeed_zero": {**base, "max_live_parameters": layer_psi(mofa_predictor)}}])
    d = r.state.layers["dense"]
    eff = r.hardware.efficiency
    f = d.fwd_compute_s[0]
    close(d.dp_exposed_fwd_s[0], max(eff.contention_compute * f, eff.contention_comm * d.dp_fwd_s[0]) - f)
    close(d.dp_exposed_fwd_s[1], d.dp_fwd_s[1])


# ------------------------------------------------------------------ contracts


def test_rows_with_the_feature_off_are_bit_identical(mofa_predictor):
    both = predict(mofa_predictor, [{"deepspeed_zero": {"stage": 3}}, {}])
    alone = predict(mofa_predictor, [{}])
    assert_same_row(both, 1, alone)
    assert both.step_time_s[0] != both.step_time_s[1]


def test_stages_2_and_3_need_pp_1(mofa_predictor):
    job = mofa_predictor.job({**JOB, "parallel": {**JOB["parallel"], "pp": 2},
                              "features": {"deepspeed_zero": {"stage": 2}}})
    with pytest.raises(ConfigError, match="pipeline engine supports ZeRO stage 1 only"):
        mofa_predictor.predict(job)
    ok = mofa_predictor.job({**JOB, "parallel": {**JOB["parallel"], "pp": 2}, "features": {"deepspeed_zero": {}}})
    assert mofa_predictor.predict(ok)[0].step_time_s > 0


def test_conflicts_with_other_zero_implementations_and_what_only_megatron_core_runs(mofa_predictor):
    feat = mofa_predictor.registry.features["deepspeed_zero"]
    assert set(feat.conflicts) == {"distributed_optimizer", "fsdp", "cpu_optimizer", "dp_overlap", "tp_overlap",
                                   "ep_overlap", "flex_dispatcher", "cuda_graphs", "cp_overlap", "pp_overlap"}
    for other in ("fsdp", "tp_overlap"):
        with pytest.raises(ConfigError, match=f"deepspeed_zero cannot be combined with features.{other}"):
            mofa_predictor.predict(mofa_predictor.job({**JOB, "features": {"deepspeed_zero": {}, other: {}}}))


def _with(pred, parallel=None, features=None, model=None, schedule=None):
    job = {**JOB, "parallel": {**JOB["parallel"], **(parallel or {})},
           "features": {"deepspeed_zero": {}, **(features or {})}}
    if model:
        job["model"] = {"name": model}
    if schedule:
        job["pipeline"] = {"schedule": schedule}
    return pred.job(job)


def test_a_pipeline_runs_deepspeeds_1f1b_or_megatron_deepspeeds_zb_h1(mofa_predictor):
    """DeepSpeed's pipeline engine runs its TrainSchedule (1F1B), and Megatron-DeepSpeed replaces it
    with ZB-H1 (--enable-zbh1-pipeline): no interleaving, no ZB-V, no DualPipe."""
    assert mofa_predictor.registry.features["deepspeed_zero"].schedules == ("1f1b", "zb-h1")
    for sched, pp in (("interleaved-1f1b", {"pp": 2, "vpp": 2}), ("zb-v", {"pp": 2, "vpp": 2}), ("gpipe", {"pp": 2})):
        with pytest.raises(ConfigError, match="deepspeed_zero runs a pipeline only under the 1f1b / zb-h1 schedule"):
            mofa_predictor.predict(_with(mofa_predictor, pp, schedule=sched))
    for sched in ("1f1b", "zb-h1"):
        assert mofa_predictor.predict(_with(mofa_predictor, {"pp": 2}, schedule=sched))[0].step_time_s > 0
    assert mofa_predictor.predict(_with(mofa_predictor, schedule="gpipe"))[0].step_time_s > 0  # pp 1: no pipeline


def test_megatron_deepspeeds_zb_h1_flag_is_in_the_note_under_zb_h1_only():
    from mofa_framework.types import MegatronContext
    from mofa_plugins.deepspeed_zero import FEATURE
    opts = FEATURE.options_type(stage=1)
    for sched, pp, flag in (("zb-h1", 2, True), ("zb-h1", 1, False), ("1f1b", 2, False)):
        (note,) = FEATURE.megatron_tokens(opts, MegatronContext(model=None, parallel={"pp": pp}, schedule=sched))
        assert ("--enable-zbh1-pipeline" in note) is flag and "--zero-stage 1" in note


def test_stage_3_runs_no_expert_parallelism(mofa_predictor):
    """DeepSpeed's engine asserts "MoE not supported with Stage 3" for its MoE layers; experts held as
    plain modules (ep = 1) shard like dense parameters."""
    moe = {"micro_batch_size": 1, "global_batch_size": 64, "sequence_length": 1024}
    with pytest.raises(ConfigError, match="no expert parallelism under ZeRO stage 3"):
        mofa_predictor.predict(_with(mofa_predictor, {**moe, "ep": 8}, {"deepspeed_zero": {"stage": 3}},
                                     model="mixtral-8x7b"))
    for stage, ep in ((3, 1), (2, 8)):
        job = _with(mofa_predictor, {**moe, "ep": ep}, {"deepspeed_zero": {"stage": stage}}, model="mixtral-8x7b")
        assert mofa_predictor.predict(job)[0].step_time_s > 0


def test_context_parallelism_is_ulysses_only(mofa_predictor):
    with pytest.raises(ConfigError, match="DeepSpeed-Ulysses .* enable features.cp_a2a"):
        mofa_predictor.predict(_with(mofa_predictor, {"cp": 2}))
    assert mofa_predictor.predict(_with(mofa_predictor, {"cp": 2}, {"cp_a2a": {}}))[0].step_time_s > 0


def test_the_tuner_never_pairs_it_with_what_deepspeed_does_not_run(mofa_predictor):
    """Every configuration a search returns that turns ZeRO on keeps the Megatron-Core-only features
    off, runs 1F1B under a pipeline, never the K/V ring, and no expert parallelism at stage 3."""
    from mofa_framework import tuner
    reg = mofa_predictor.registry
    model, hw = reg.model("mixtral-8x7b"), reg.hardware["h100-sxm5-80gb"]
    names = ["deepspeed_zero", "tp_overlap", "ep_overlap", "flex_dispatcher", "cp_overlap", "cp_a2a", "pp_overlap",
             "distributed_optimizer"]
    space = attrs.evolve(tuner.default_space(reg, model, hw, 64, 2048, features=names), tp=(1, 2), pp=(1, 2),
                         cp=(1, 2), ep=(1, 8), etp=(1,), micro_batch_size=(1,), vpp=(1, 2), lighter_ends=(0,),
                         lighter_last=(0,))
    req = tuner.TuneRequest(model=model, hardware=hw, num_gpus=64, global_batch_size=256, sequence_length=2048,
                            space=space, top_k=100_000)
    best = tuner.tune(mofa_predictor, req).best
    zero = [c for c in best if "deepspeed_zero" in c.features]
    assert zero and len(zero) < len(best)
    banned = set(reg.features["deepspeed_zero"].conflicts)
    for c in zero:
        assert not banned & set(c.features)
        assert c.parallel["pp"] == 1 or c.schedule in ("1f1b", "zb-h1")
        assert c.parallel["cp"] == 1 or "cp_a2a" in c.features
        assert c.features["deepspeed_zero"]["stage"] < 3 or c.parallel["ep"] == 1
