"""PyTorch's context parallelism (``torch_cp``, torchtitan): the K/V all-gather or permute, the fp32
dK/dV ring, the eager merges and the transient bytes, derived here by hand from the model's heads
(``plugins/torch_cp.py``'s docstring) and priced by the engine's own providers."""

from __future__ import annotations

import numpy as np
import pytest

from mofa_framework.config import jobs_to_batch
from mofa_framework.decompose import ALL_GATHER, P2P, Coll, elementwise_op
from mofa_framework.engine import price_collectives, price_operators
from mofa_framework.errors import ConfigError
from mofa_framework.measurements import builtin_data_dir, map_files

#: Llama 3.1 8B (32 heads, 8 KV heads of 128) on one 8-GPU H100 node, CP 8, 256K tokens: T = 32768
JOB = {"model": {"name": "llama3.1-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 8},
       "parallel": {"tp": 1, "pp": 1, "cp": 8, "micro_batch_size": 1, "global_batch_size": 1,
                    "sequence_length": 262144}}
T, C = 32768, 8


def evaluate(predictor, features, job=JOB):
    j = predictor.job({**job, "features": features}, name="j")
    return predictor.evaluate(jobs_to_batch([j], predictor.registry), j.model, j.hardware)


def f0(x) -> float:
    return float(np.asarray(x).ravel()[0])


def seconds(ctx, *items):
    one = np.ones(1)
    colls = [Coll(name=n, parallel="cp", kind=k, bytes=b * one, group_size=C * one, stride=one) for n, k, b in items]
    return [f0(x) for x in price_collectives(ctx, colls)]


def memory_seconds(ctx, nbytes, kernels):
    op = elementwise_op("m", np.array([float(nbytes)]), "core_attn", bwd=0.0, kernels=kernels)
    return f0(price_operators(ctx, [op])[0])


@pytest.mark.parametrize("repeat, kv_per_token", [(True, 2 * 32 * 128), (False, 2 * 8 * 128)])
def test_allgather_exchange_by_hand(mofa_predictor, repeat, kv_per_token):
    """K + V per token: 2·32·128 = 8192 elements repeated to the query heads, 2·8·128 = 2048 not. The
    all-gather moves c·T·w_kv·2 B (8 · 32768 · 8192 · 2 = 4,294,967,296 B repeated), the fp32 dK/dV
    permute T·w_kv·4 B. Forward: max(0, AG − A_f/8); backward: max(0, AG − A_b/8) + 7·max(0, P_d − A_b/8)
    + P_d, with A the rank's attention (left as the ring priced it)."""
    off = evaluate(mofa_predictor, {})
    on = evaluate(mofa_predictor, {"torch_cp": {"repeat_kv": repeat}})
    kv = T * kv_per_token
    ag, p_d = seconds(off.state.ctx, ("ag", ALL_GATHER, C * kv * 2.0), ("dkv", P2P, kv * 4.0))
    lc, base = on.state.layers["dense"], off.state.layers["dense"]
    a_f, a_b = f0(base.attn_fwd_s), f0(base.attn_bwd_s)
    assert f0(lc.attn_fwd_s) == a_f and f0(lc.attn_bwd_s) == a_b
    assert f0(lc.cp_fwd_s) == pytest.approx(ag, rel=1e-12)
    assert f0(lc.cp_bwd_s) == pytest.approx(ag + C * p_d, rel=1e-12)
    assert f0(lc.cp_exposed_fwd_s) == pytest.approx(max(0.0, ag - a_f / C), rel=1e-12, abs=1e-15)
    bwd = max(0.0, ag - a_b / C) + (C - 1) * max(0.0, p_d - a_b / C) + p_d
    assert f0(lc.cp_exposed_bwd_s) == pytest.approx(bwd, rel=1e-12)


def test_alltoall_exchange_by_hand(mofa_predictor):
    """A permute per step: forward 7·max(0, P_kv − A_f/8); backward 7·max(0, P_kv + P_d − A_b/8) + P_d,
    P_kv = T·w_kv·2 B and P_d = T·w_kv·4 B of the 8 KV heads."""
    off = evaluate(mofa_predictor, {})
    on = evaluate(mofa_predictor, {"torch_cp": {"rotate": "alltoall"}})
    kv = T * 2 * 8 * 128
    p_kv, p_d = seconds(off.state.ctx, ("kv", P2P, kv * 2.0), ("dkv", P2P, kv * 4.0))
    lc, base = on.state.layers["dense"], off.state.layers["dense"]
    a_f, a_b = f0(base.attn_fwd_s), f0(base.attn_bwd_s)
    assert f0(lc.cp_fwd_s) == pytest.approx((C - 1) * p_kv, rel=1e-12)
    assert f0(lc.cp_exposed_fwd_s) == pytest.approx((C - 1) * max(0.0, p_kv - a_f / C), rel=1e-12, abs=1e-15)
    bwd = (C - 1) * max(0.0, p_kv + p_d - a_b / C) + p_d
    assert f0(lc.cp_exposed_bwd_s) == pytest.approx(bwd, rel=1e-12)


def test_merges_and_transient_bytes_by_hand(mofa_predictor):
    """Repeated K/V (w_kv = 8192, w_q = w_o = 4096 per token): the forward merges move
    c·T·(40·4096 + 4·8192) = 51,539,607,552 B in 8·7 kernels, the backward c·T·(10·4096 + 22·8192)
    = 57,982,058,496 B in 8·6; they add to the forward (and selective recompute's re-run) and the
    input-gradient pass. Transient: the gathered K/V, 8·T·8192·2 B, and the fp32 gradients
    T·(4096 + 3·8192)·4 B."""
    off = evaluate(mofa_predictor, {})
    on = evaluate(mofa_predictor, {"torch_cp": {"repeat_kv": True}})
    ctx = off.state.ctx
    fwd = memory_seconds(ctx, 51_539_607_552, 56.0)
    bwd = memory_seconds(ctx, 57_982_058_496, 48.0)
    lc, base = on.state.layers["dense"], off.state.layers["dense"]
    assert f0(lc.fwd_compute_s) - f0(base.fwd_compute_s) == pytest.approx(fwd, rel=1e-9)
    assert f0(lc.qkv_attn_fwd_s) - f0(base.qkv_attn_fwd_s) == pytest.approx(fwd, rel=1e-9)
    assert f0(lc.bwd_input_s) - f0(base.bwd_input_s) == pytest.approx(bwd, rel=1e-9)
    work = C * T * 8192 * 2.0 + T * (4096 + 3 * 8192) * 4.0
    assert f0(lc.act_working_bytes) == pytest.approx(max(work, f0(base.act_working_bytes)), rel=1e-12)


def test_no_cp_is_a_no_op(mofa_predictor):
    job = {**JOB, "parallel": {**JOB["parallel"], "cp": 1, "sequence_length": 32768, "global_batch_size": 8}}
    off = mofa_predictor.predict(mofa_predictor.job(job, name="off"))[0]
    on = mofa_predictor.predict(mofa_predictor.job({**job, "features": {"torch_cp": {"repeat_kv": True}}}, name="on"))[0]
    assert on.step_time_s == off.step_time_s and on.peak_memory_gib == off.peak_memory_gib


def test_repeated_kv_costs_more_across_nodes(mofa_predictor):
    """Llama 3.1 405B at TP 8 puts each CP group across nodes: the 16 repeated heads' all-gather is
    exposed far beyond the 1 KV head's."""
    job = {"model": {"name": "llama3.1-405b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 512},
           "parallel": {"tp": 8, "pp": 8, "cp": 8, "micro_batch_size": 1, "global_batch_size": 8,
                        "sequence_length": 262144, "sequence_parallel": True},
           "features": {"recompute": {"granularity": "full"}}}
    gqa = mofa_predictor.predict(mofa_predictor.job({**job, "features": {**job["features"], "torch_cp": {}}}))[0]
    rep = mofa_predictor.predict(mofa_predictor.job(
        {**job, "features": {**job["features"], "torch_cp": {"repeat_kv": True}}}))[0]
    assert rep.breakdown["cp_comm"] > 3.0 * gqa.breakdown["cp_comm"] > 0
    assert rep.step_time_s > gqa.step_time_s


@pytest.mark.parametrize("features, words", [
    ({"torch_cp": {}, "cp_overlap": {}}, ("torch_cp", "cp_overlap")),
    ({"torch_cp": {"rotate": "ring"}}, ("rotate", "ring", "allgather")),
])
def test_refused_in_one_line(mofa_predictor, features, words):
    with pytest.raises(ConfigError) as e:
        mofa_predictor.predict(mofa_predictor.job({**JOB, "features": features}, name="bad"))
    assert "\n" not in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


def test_torchtitan_rows_run_it_with_repeated_heads(mofa_predictor):
    """torchtitan's December 2024 CP rows: PyTorch's context_parallel (not the ring's overlap), K/V
    repeated (before pytorch/torchtitan#2259); its CP 1 rows have no CP feature."""
    mapped, _, _ = map_files([builtin_data_dir() / "torchtitan_benchmarks.csv"], mofa_predictor.registry)
    rows = {m.row_id: m for m in mapped}
    for rid in ("TT-005", "TT-007", "TT-018"):
        f = rows[rid].job["features"]
        assert f["torch_cp"] == {"rotate": "allgather", "repeat_kv": True} and "cp_overlap" not in f, rid
    assert "torch_cp" not in rows["TT-004"].job["features"]


def test_torchtitan_configs_name_their_rotation(mofa_predictor):
    from mofa_plugins.import_torchtitan import from_torchtitan

    reg = mofa_predictor.registry
    flags = "--model.flavor 8B --parallelism.context_parallel_degree 4 --training.seq_len 131072"
    res = from_torchtitan(flags, reg, hardware="h100-sxm5-80gb", num_gpus=8)
    assert res.job["features"]["torch_cp"] == {"rotate": "allgather", "repeat_kv": False}
    res = from_torchtitan(flags + " --parallelism.context_parallel_rotate_method alltoall", reg,
                          hardware="h100-sxm5-80gb", num_gpus=8)
    assert res.job["features"]["torch_cp"]["rotate"] == "alltoall"
    with pytest.raises(ConfigError, match="context_parallel_rotate_method: 'ring'"):
        from_torchtitan(flags + " --parallelism.context_parallel_rotate_method ring", reg,
                        hardware="h100-sxm5-80gb", num_gpus=8)


def test_megatron_line_says_it_is_not_megatrons(mofa_predictor):
    feat = mofa_predictor.registry.features["torch_cp"]
    (note,) = feat.megatron_args(None)
    assert note.startswith("#") and "--cp-comm-type p2p" in note and not feat.tunable
