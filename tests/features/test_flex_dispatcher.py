"""The flex token dispatcher (DeepEP / HybridEP): a token crosses the scale-out network once per
remote scale-up domain that hosts one of its experts.

Expected values are derived here from the ring/all-to-all formulas of the collectives provider
and the hypergeometric count of remote domains — not by calling the plugin's own functions.
"""

from __future__ import annotations

from math import comb

import numpy as np
import pytest
from click.testing import CliRunner

from mofa_framework.config import jobs_to_batch
from mofa_framework.testing.contract import assert_same_row

# DeepSeek-V3 on H100 (8 GPUs per node): EP 32 spans 4 nodes
CROSS = {"model": {"name": "deepseek-v3"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 512},
         "parallel": {"tp": 1, "pp": 16, "ep": 32, "etp": 1, "micro_batch_size": 1, "global_batch_size": 256,
                      "sequence_length": 4096, "first_stage_layers": 2, "last_stage_layers": 3}}  # 2 + 14 × 4 + 3 = 61
# the same EP inside one NVL72 domain
INSIDE = {**CROSS, "hardware": {"name": "gb200-nvl72", "num_gpus": 512}}


def _evaluate(predictor, base, features=None):
    job = predictor.job({**base, "features": features or {}})
    return predictor.evaluate(jobs_to_batch([job], predictor.registry), job.model, job.hardware), job


def f0(x) -> float:
    return float(np.asarray(x)[0])


def test_remote_domains_is_hypergeometric():
    from mofa_plugins.flex_dispatcher import remote_domains

    # 256 experts over 4 domains (64 each), top-8: P(a given other domain gets none) = C(192,8)/C(256,8)
    p0 = comb(192, 8) / comb(256, 8)
    assert remote_domains(256, 8, [4.0])[0] == pytest.approx(3 * (1 - p0), rel=1e-12)
    assert remote_domains(256, 8, [1.0])[0] == 0.0
    # never more remote domains than copies, nor than other domains
    r = remote_domains(128, 4, np.array([2.0, 8.0, 16.0]))
    assert np.all(r <= np.minimum(4, np.array([1.0, 7.0, 15.0])) + 1e-12)


def test_group_limited_routing_reaches_fewer_domains():
    """DeepSeek-V3: 8 groups of 32 experts, a token's 8 experts from its best 4 groups. Over 8 nodes
    (one group each) a token reaches the 4 chosen nodes, each only if one of its experts lands there."""
    from mofa_plugins.flex_dispatcher import remote_domains

    hit = 1 - comb(96, 8) / comb(128, 8)  # a chosen group gets ≥ 1 of the 8 experts drawn among 128
    # the 4 chosen groups are 4 of the 8 nodes: a given other node is chosen with probability 4/8
    assert remote_domains(256, 8, [8.0], 8, 4)[0] == pytest.approx(7 * (4 / 8) * hit, rel=1e-9)
    assert remote_domains(256, 8, [8.0], 8, 4)[0] < remote_domains(256, 8, [8.0])[0]
    # 4 nodes of 2 groups: j = 1 or 2 chosen groups in a given node
    p1 = comb(2, 1) * comb(6, 3) / comb(8, 4)
    p2 = comb(2, 2) * comb(6, 2) / comb(8, 4)
    expect = 3 * (p1 * (1 - comb(96, 8) / comb(128, 8)) + p2 * (1 - comb(64, 8) / comb(128, 8)))
    assert remote_domains(256, 8, [4.0], 8, 4)[0] == pytest.approx(expect, rel=1e-9)
    # groups spanning two domains each (16 domains, 8 groups): a given domain's group is chosen with
    # probability 4/8, and then the 8 experts are drawn among the 4 chosen groups' 128, 16 of them there
    assert remote_domains(256, 8, [16.0], 8, 4)[0] == pytest.approx(
        15 * (4 / 8) * (1 - comb(112, 8) / comb(128, 8)), rel=1e-12)
    # neither tiling: 12 domains, 8 groups: unrestricted formula
    assert remote_domains(256, 8, [12.0], 8, 4)[0] == remote_domains(256, 8, [12.0])[0]
    # every group chosen = unrestricted
    assert remote_domains(256, 8, [4.0], 8, 8)[0] == pytest.approx(remote_domains(256, 8, [4.0])[0])


def test_cross_node_all_to_all_is_priced_once_per_remote_node(mofa_predictor):
    off, job = _evaluate(mofa_predictor, CROSS)
    on, _ = _evaluate(mofa_predictor, CROSS, {"flex_dispatcher": {}})
    hw, m = job.hardware, job.model
    eff = hw.efficiency
    up = hw.scaleup_bandwidth_bytes_per_s * eff.scaleup_bus_efficiency
    out = hw.scaleout_bandwidth_bytes_per_s * eff.scaleout_bus_efficiency * (1 - eff.bandwidth_decay_per_doubling) ** 2
    tok, h, k, n, local = 4096.0, m.hidden_size, m.experts_per_token, 32.0, 8.0  # 4 nodes of 8 ranks
    s = tok * k * h * 2.0
    lat_up, lat_out = eff.scaleup_latency_us * 1e-6, eff.scaleout_latency_us * 1e-6
    a2a = eff.alltoall_relative_efficiency  # divides NCCL's all-to-all bandwidth terms
    # alltoall: hierarchical, k copies; flex: forwarded copies over NVLink ‖ one copy per remote node
    plain = max((local - 1) / n * s / up, (n - local) / n * s / out) / a2a + lat_out
    # group-limited routing (4 of 8 groups, two groups per node): j chosen groups in a given node
    r = 3 * sum(comb(2, j) * comb(6, 4 - j) / comb(8, 4) * (1 - comb(128 - 32 * j, 8) / comb(128, 8))
                for j in (1, 2))
    # DeepEP / HybridEP are not NCCL's all-to-all: priced at the links' rate, no a2a efficiency
    flex = max((local - 1) / local * s / up + lat_up, r * tok * h * 2.0 / out + lat_out)
    lc_off, lc_on = off.state.layers["moe"], on.state.layers["moe"]
    # dispatch + combine in each pass
    assert f0(lc_on.ep_fwd_s) - f0(lc_off.ep_fwd_s) == pytest.approx(2 * (flex - plain), rel=1e-9)
    assert f0(lc_on.ep_bwd_s) - f0(lc_off.ep_bwd_s) == pytest.approx(2 * (flex - plain), rel=1e-9)
    assert flex < plain / 2  # 2.2 copies per token cross the network instead of 6
    assert f0(on.step_time_s) < f0(off.step_time_s)
    # compute and memory are untouched; dense layers too
    assert np.array_equal(lc_on.fwd_compute_s, lc_off.fwd_compute_s)
    assert np.array_equal(on.peak_memory_bytes, off.peak_memory_bytes)
    assert np.array_equal(on.state.layers["dense"].ep_fwd_s, off.state.layers["dense"].ep_fwd_s)


def test_ranks_reached_counts_each_rank_once():
    """A token goes once to each rank holding any of its k experts (hypergeometric, each rank a
    domain of E/n experts); group-limited routing narrows the ranks to the chosen groups'."""
    from mofa_framework.types import ModelSpec
    from mofa_plugins.flex_dispatcher import ranks_reached

    def moe(e, k, groups=0, topk=0):
        return ModelSpec(name="m", num_layers=2, hidden_size=256, num_attention_heads=4, num_kv_heads=4, ffn_hidden_size=512,
                         vocab_size=1000, num_experts=e, experts_per_token=k, moe_ffn_hidden_size=128,
                         moe_router_num_groups=groups, moe_router_group_topk=topk)

    # Qwen3-235B's routing (128 experts, top 8) at EP 8: 16 experts per rank
    assert ranks_reached(moe(128, 8), 8.0) == pytest.approx(8 * (1 - comb(112, 8) / comb(128, 8)), rel=1e-12)
    # one expert per rank: every copy to its own rank
    assert ranks_reached(moe(8, 2), 8.0) == pytest.approx(2.0, rel=1e-12)
    assert ranks_reached(moe(8, 2), 1.0) == 1.0
    # DeepSeek-V3's routing at EP 8, one group of 32 experts per rank: the 4 chosen ranks, each hit
    # unless none of the 8 experts (drawn among the chosen 128) lands there
    assert ranks_reached(moe(256, 8, 8, 4), 8.0) == pytest.approx(4 * (1 - comb(96, 8) / comb(128, 8)), rel=1e-9)
    # ... at EP 32, a group over 4 ranks of 8 experts: 16 candidate ranks
    assert ranks_reached(moe(256, 8, 8, 4), 32.0) == pytest.approx(16 * (1 - comb(120, 8) / comb(128, 8)), rel=1e-9)


def test_inside_one_domain_the_flex_dispatcher_sends_each_token_once_per_rank(mofa_predictor):
    """HybridEP inside one NVL72 (EP 32), and DeepEP within its 8 NVLink peers: the alltoall
    dispatcher's all-to-all at its own speed, of the tokens sent once per rank, S·ρ/k."""
    from mofa_framework.decompose import ALL_TO_ALL, Coll
    from mofa_framework.engine import Context, price_collectives
    from mofa_framework.decompose import Geometry

    for ep, backend, rho in ((32, "hybridep", 16 * (1 - comb(120, 8) / comb(128, 8))),
                             (8, "deepep", 4 * (1 - comb(96, 8) / comb(128, 8)))):
        base = {**INSIDE, "parallel": {**INSIDE["parallel"], "ep": ep}}
        off, job = _evaluate(mofa_predictor, base)
        on, _ = _evaluate(mofa_predictor, base, {"flex_dispatcher": {"backend": backend}})
        s = 4096 * 8 * 7168 * 2.0
        ctx = Context(model=job.model, hardware=job.hardware,
                      geometry=Geometry.of(jobs_to_batch([job], mofa_predictor.registry)), pm=mofa_predictor.pm)
        plain, sent = (f0(t) for t in price_collectives(ctx, [
            Coll(name="a", parallel="ep", kind=ALL_TO_ALL, bytes=np.array([b]), group_size=np.array([float(ep)]),
                 stride=np.array([1.0])) for b in (s, s * rho / 8)]))
        lc_off, lc_on = off.state.layers["moe"], on.state.layers["moe"]
        assert f0(lc_on.ep_fwd_s) - f0(lc_off.ep_fwd_s) == pytest.approx(2 * (sent - plain), rel=1e-9)
        assert f0(on.step_time_s) < f0(off.step_time_s)
        assert np.array_equal(on.peak_memory_bytes, off.peak_memory_bytes)


def test_deepep_beyond_eight_nvlink_peers_runs_at_its_measured_bandwidth(mofa_predictor):
    """DeepEP at EP 32 inside a GB200 NVL72: NVIDIA's DeepSeek-V3 guide measured about 400 GB/s for
    the dispatch and 190 GB/s for the combine, of the links' 900 GB/s per direction. Per pass one
    dispatch and one combine of the tokens sent once per rank, S·ρ/k, S = 4096 tokens · 8 · 7168 ·
    2 bytes and ρ = 16·(1 − C(120,8)/C(128,8)) = 6.6 ranks (DeepSeek-V3's best 4 of 8 groups)."""
    off, job = _evaluate(mofa_predictor, INSIDE)
    on, _ = _evaluate(mofa_predictor, INSIDE, {"flex_dispatcher": {"backend": "deepep"}})
    s = 4096 * 8 * 7168 * 2.0 * 16 * (1 - comb(120, 8) / comb(128, 8)) / 8
    per_pass = s / 400e9 + s / 190e9  # = 3.007 ms
    lc_off, lc_on = off.state.layers["moe"], on.state.layers["moe"]
    assert f0(lc_on.ep_fwd_s) == pytest.approx(per_pass, rel=1e-9)
    assert f0(lc_on.ep_bwd_s) - f0(lc_off.ep_bwd_s) == pytest.approx(per_pass - f0(lc_off.ep_fwd_s), rel=1e-9)
    assert f0(on.step_time_s) > f0(off.step_time_s)  # slower than NCCL's all-to-all over the same links
    assert np.array_equal(on.peak_memory_bytes, off.peak_memory_bytes)


def test_runs_before_ep_overlap(mofa_predictor):
    """The 1F1B all-to-all overlap hides the flex dispatcher's (smaller) all-to-all."""
    both, _ = _evaluate(mofa_predictor, CROSS, {"flex_dispatcher": {}, "ep_overlap": {}})
    flex, _ = _evaluate(mofa_predictor, CROSS, {"flex_dispatcher": {}})
    lc, lf = both.state.layers["moe"], flex.state.layers["moe"]
    assert f0(lc.ep_fwd_s) == f0(lf.ep_fwd_s)  # the total is the flex one ...
    assert f0(lc.ep_exposed_fwd_s) < f0(lf.ep_exposed_fwd_s)  # ... and the overlap hides part of it


def test_off_rows_bit_identical(mofa_predictor):
    on = mofa_predictor.job({**CROSS, "features": {"flex_dispatcher": {}}}, name="on")
    off = mofa_predictor.job(CROSS, name="off")
    both = mofa_predictor.evaluate(jobs_to_batch([on, off], mofa_predictor.registry), off.model, off.hardware)
    alone = mofa_predictor.evaluate(jobs_to_batch([off], mofa_predictor.registry), off.model, off.hardware)
    assert_same_row(both, 1, alone, 0)
    assert both.step_time_s[0] != alone.step_time_s[0]


def test_tuner_searches_it_and_prints_megatron_arguments():
    import mofa_framework.cli as c

    c._builtin_commands()
    args = ["tune", "--model", "qwen3-30b-a3b", "--hardware", "h100-sxm5-80gb", "--gpus", "16", "--gbs", "256",
            "--seq", "4096", "--tp-values", "1", "--pp-values", "1", "--vpp-values", "1", "--cp-values", "1",
            "--ep-values", "16", "--etp-values", "1", "--mbs-values", "1", "--schedules", "1f1b",
            "--features", "flex_dispatcher,distributed_optimizer", "--top", "1", "--no-progress"]
    res = CliRunner().invoke(c.cli, [*args, "--format", "megatron"])
    assert res.exit_code == 0, res.output
    # cross-node EP: the best configuration uses it, and says how to turn it on
    assert "--moe-token-dispatcher-type flex" in res.output
    assert "--moe-flex-dispatcher-backend" in res.output
    res = CliRunner().invoke(c.cli, ["list-plugins"])
    assert "flex_dispatcher" in res.output
