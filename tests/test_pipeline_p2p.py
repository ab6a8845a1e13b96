"""Pipeline p2p across scale-up domains (``engine.pipeline_p2p_s``): a pipeline whose stages span
several nodes crosses a node boundary at some of its hops; warmup and cooldown pay each hop once
(τ is their mean), the lock-step steady phase waits for the slowest hop."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from mofa_framework.config import job_from_dict
from mofa_framework.engine import PipelineInputs, pipeline_p2p_s
from mofa_framework.simulate import simulate
from mofa_plugins import schedule_1f1b

A100 = "a100-sxm4-80gb"  # 8 GPUs per NVLink domain


def _ctx(t, c, dp, domain=8):
    one = np.ones(len(t))
    geometry = SimpleNamespace(t=np.asarray(t, float), c=np.asarray(c, float) * one, dp=np.asarray(dp, float) * one)
    return SimpleNamespace(geometry=geometry, hardware=SimpleNamespace(scaleup_domain_gpus=domain))


def test_hops_by_hand():
    # near hop 1 s, cross-domain hop 10 s, 8 GPUs per domain:
    # p=16, stride 1: 2 domains, 1 of 15 hops crosses → τ = 1 + 9/15 = 1.6; the stages beside it send
    #   across one way and inside the other: steady pair 1 + 10 = 11
    # p=8, stride 1: one domain → τ = 1, pair 2
    # p=16, stride 2 (dp 2): 32 ranks, 4 domains, 3 of 15 hops cross → τ = 1 + 27/15 = 2.8, pair 11
    # p=4, stride 8 (tp 8): every hop crosses → τ = 10 (the caller's near price is the cross one then), pair 20
    # p=4, stride 6 (dp 6): 24 ranks, 3 domains, 2 of 3 hops cross → τ = 1 + 18/3 = 7; a domain cannot
    #   hold two stages, so a stage may cross both ways: pair 20
    # p=1: no pipeline, no p2p
    t, dp = [1, 1, 1, 8, 1, 1], [1, 1, 2, 1, 6, 1]
    pp = np.array([16, 8, 16, 4, 4, 1])
    near, cross = np.ones(6), np.full(6, 10.0)
    tau, steady = pipeline_p2p_s(near, cross, pp, _ctx(t, 1, dp))
    assert tau == pytest.approx([1.6, 1.0, 2.8, 10.0, 7.0, 0.0])
    assert steady == pytest.approx([11.0, 2.0, 11.0, 20.0, 20.0, 0.0])


@pytest.mark.parametrize("domain", [8, 4])
def test_slow_hops_against_the_simulator(domain):
    # 16 equal stages one rank apart, F = 1, B + W = 1, m = 96 micro-batches, blocking sends: 0.02 s
    # inside a domain of `domain` GPUs, 0.2 s between domains (1 or 3 of the 15 hops). The closed
    # form's p2p (its step time less the same step's without p2p) is within 12 % of the simulator's;
    # pricing every hop inside the domain, as MoFa did before, gives 3.84 s against ≈ 20.6 s (domain 8)
    p, m, near_s, cross_s = 16, 96, 0.02, 0.2
    stage = np.arange(p)
    hop = np.where(stage[:, None] // domain == stage[None, :] // domain, near_s, cross_s)
    order = schedule_1f1b.op_order(p, 1, m)
    sim = lambda tau: simulate(order, p=p, v=1, m=m, F=1.0, B=1.0, W=0.0, tau=tau, p2p="blocking").makespan_s  # noqa: E731
    simulated = sim(hop) - sim(0.0)
    a = lambda z: np.array([float(z)])  # noqa: E731
    tau, pair = pipeline_p2p_s(a(near_s), a(cross_s), a(p), _ctx([1], 1, [1], domain=domain))
    closed = lambda t, pr: float(schedule_1f1b.time(PipelineInputs(  # noqa: E731
        p=a(p), v=a(1), m=a(m), F=a(1), B=a(1), W=a(0), sum_F=a(p), sum_B=a(p), sum_W=a(0), p2p_s=t,
        steady_p2p_s=pr)).total_s[0])
    priced = closed(tau, pair) - closed(a(0), a(0))
    assert priced == pytest.approx(simulated, rel=0.12)


def _pp_comm(predictor, pp, scaleout_gbps):
    ends = {16: 1, 8: 3}[pp]  # the model's 30 layers: 1 + 14·2 + 1, 3 + 6·4 + 3
    job = {"model": {"name": "zb-gpt-6.2b"},
           "hardware": {"name": A100, "num_gpus": pp, "scaleout_bandwidth_gbps": scaleout_gbps},
           "parallel": {"tp": 1, "pp": pp, "micro_batch_size": 1, "global_batch_size": 4 * pp,
                        "sequence_length": 1024, "first_stage_layers": ends, "last_stage_layers": ends}}
    return predictor.predict(job_from_dict(job, predictor.registry))[0].breakdown["pp_comm"]


def test_pipeline_over_two_nodes_pays_the_network(mofa_predictor):
    # 16 stages over two 8-GPU nodes: halving the NICs' bandwidth slows the one crossing hop, which
    # every steady pair waits for; 8 stages in one node never touch the network
    assert _pp_comm(mofa_predictor, 16, 12.5) > 1.5 * _pp_comm(mofa_predictor, 16, 25.0)
    assert _pp_comm(mofa_predictor, 8, 12.5) == _pp_comm(mofa_predictor, 8, 25.0)


def test_simulator_rejects_a_hop_table_of_the_wrong_shape():
    order = schedule_1f1b.op_order(4, 1, 4)
    with pytest.raises(ValueError, match=r"tau must be a number or a \(4, 4\) array"):
        simulate(order, p=4, v=1, m=4, F=1.0, B=1.0, tau=np.ones((3, 3)))
    with pytest.raises(ValueError, match="tau must be"):
        simulate(order, p=4, v=1, m=4, F=1.0, B=1.0, tau=-0.1)
