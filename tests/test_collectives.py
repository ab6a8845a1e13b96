"""Every collective formula of the `collectives` provider, and its measured-table path, against
values derived here by hand (paper eqs. [2], [3]; plugins/collectives.py; nccl-tests' PERFORMANCE.md
bus-bandwidth factors).

The synthetic profile: scale-up 100 GB/s at bus efficiency 0.8 → B_up = 80e9 B/s, λ_up = 5 µs;
scale-out 50 GB/s at 0.85 → B_out = 42.5e9 B/s, λ_out = 10 µs; eq. [3] decay d = 0.02 per
doubling of the nodes a group spans; 8 GPUs per scale-up domain. S = 1e9 bytes throughout.
"""

import attrs
import numpy as np
import pytest

from mofa_framework.batch import COLLECTIVE_KINDS, CollectiveBatch
from mofa_framework.types import CollectivePoint
from mofa_plugins.collectives import collective_seconds, table_seconds

S = 1e9
UP, OUT = 80e9, 42.5e9
LAT_UP, LAT_OUT = 5e-6, 10e-6


@pytest.fixture
def hw(mofa_predictor):
    h = mofa_predictor.registry.hardware_profile("h100-sxm5-80gb")
    eff = attrs.evolve(h.efficiency, scaleup_bus_efficiency=0.8, scaleout_bus_efficiency=0.85, scaleup_latency_us=5.0,
                       scaleout_latency_us=10.0, bandwidth_decay_per_doubling=0.02, alltoall_relative_efficiency=1.0)
    ic = attrs.evolve(h.interconnect, scaleup_bandwidth_gbps=100.0, scaleout_bandwidth_gbps=50.0, scaleup_domain_gpus=8)
    return attrs.evolve(h, interconnect=ic, efficiency=eff, collective_profile=())


def one(kind, n, nodes, size=S):
    return CollectiveBatch(kind=np.array([COLLECTIVE_KINDS.index(kind)]), bytes=np.array([size]),
                           group_size=np.array([n]), nodes=np.array([nodes]))


def t(hw, kind, n, nodes, size=S):
    return float(collective_seconds(one(kind, n, nodes, size), hw)[0])


# ====================================================================== intra-node (one scale-up domain)


def test_ring_all_reduce_intra(hw):
    # 2(n−1)/n·S/B + 2(n−1)λ = 2·7/8·1e9/80e9 + 14·5e-6 = 0.021875 + 0.00007
    assert t(hw, "all_reduce", 8, 1) == pytest.approx(0.021945, rel=1e-12)


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
def test_all_gather_and_reduce_scatter_intra(hw, kind):
    # (n−1)/n·S/B + (n−1)λ = 7/8·1e9/80e9 + 7·5e-6 = 0.0109375 + 0.000035
    assert t(hw, kind, 8, 1) == pytest.approx(0.0109725, rel=1e-12)


def test_all_to_all_intra(hw):
    # (n−1)/n·S/B + λ = 0.0109375 + 5e-6
    assert t(hw, "all_to_all", 8, 1) == pytest.approx(0.0109425, rel=1e-12)


def test_p2p_intra(hw):
    # S/B + λ = 1e9/80e9 + 5e-6
    assert t(hw, "p2p", 2, 1) == pytest.approx(0.012505, rel=1e-12)


def test_group_of_one_costs_nothing(hw):
    assert t(hw, "all_reduce", 1, 1) == 0.0


# ====================================================================== across scale-up domains


def test_ring_all_reduce_two_full_nodes(hw):
    # n = 16 on 2 domains, 8 ranks (NICs) each: B_large = 42.5e9·0.98^log2(2) = 41.65e9;
    # ring = min(B_up, 8·B_large) = 80e9 → 2·15/16·1e9/80e9 + 2·15·10e-6 = 0.0234375 + 0.0003
    assert t(hw, "all_reduce", 16, 2) == pytest.approx(0.0237375, rel=1e-12)


def test_ring_all_reduce_one_rank_per_node(hw):
    # a DP group of 8 ranks on 8 domains (TP 8 inside): one NIC each, B = 42.5e9·0.98^3
    b = 42.5e9 * 0.98 ** 3
    assert t(hw, "all_reduce", 8, 8) == pytest.approx(2 * 7 / 8 * S / b + 2 * 7 * LAT_OUT, rel=1e-12)


def test_all_gather_one_rank_per_node(hw):
    b = 42.5e9 * 0.98 ** 2
    assert t(hw, "all_gather", 4, 4) == pytest.approx(3 / 4 * S / b + 3 * LAT_OUT, rel=1e-12)


def test_hierarchical_all_to_all_inter(hw):
    # n = 16 on 2 domains: (8−1)/16·S over scale-up (80e9) and (16−8)/16·S over 41.65e9, at once
    intra, inter = 7 / 16 * S / UP, 8 / 16 * S / (42.5e9 * 0.98)
    assert inter > intra
    assert t(hw, "all_to_all", 16, 2) == pytest.approx(inter + LAT_OUT, rel=1e-12)


def test_p2p_inter(hw):
    # a pipeline send between domains: S/B_large + λ_out, B_large = 42.5e9·0.98
    assert t(hw, "p2p", 2, 2) == pytest.approx(S / (42.5e9 * 0.98) + LAT_OUT, rel=1e-12)


# ====================================================================== measured tables


def curve(kind, scope, n, pairs):
    return tuple(CollectivePoint(kind=kind, scope=scope, group_size=n, message_bytes=s, busbw_gbps=b) for s, b in pairs)


def test_table_all_reduce_at_a_measured_size(hw):
    # nccl-tests: busbw = algbw·2(n−1)/n → t = S·2(n−1)/n / busbw = 1e9·1.75/100e9
    h = attrs.evolve(hw, collective_profile=curve("all_reduce", "scaleup", 8, [(1e6, 10.0), (1e9, 100.0)]))
    out = table_seconds(one("all_reduce", 8, 1), h, np.array([123.0]))
    assert out[0] == pytest.approx(0.0175, rel=1e-12)


def test_table_interpolates_in_log_size_and_holds_the_latency_floor(hw):
    h = attrs.evolve(hw, collective_profile=curve("all_gather", "scaleup", 8, [(2**20, 10.0), (2**30, 110.0)]))
    # halfway in log2 size (2^25): busbw 60 GB/s; factor (n−1)/n = 7/8
    mid = table_seconds(one("all_gather", 8, 1, 2**25), h, np.zeros(1))[0]
    assert mid == pytest.approx(2**25 * 7 / 8 / 60e9, rel=1e-12)
    # below the smallest message: the smallest message's time
    tiny = table_seconds(one("all_gather", 8, 1, 1024), h, np.zeros(1))[0]
    assert tiny == pytest.approx(2**20 * 7 / 8 / 10e9, rel=1e-12)
    # above the largest: its bus bandwidth
    huge = table_seconds(one("all_gather", 8, 1, 2**32), h, np.zeros(1))[0]
    assert huge == pytest.approx(2**32 * 7 / 8 / 110e9, rel=1e-12)


def test_table_p2p_factor_is_one_and_uncovered_kinds_keep_the_formula(hw):
    h = attrs.evolve(hw, collective_profile=curve("p2p", "scaleup", 2, [(1e9, 200.0)]))
    assert table_seconds(one("p2p", 2, 1), h, np.zeros(1))[0] == pytest.approx(1e9 / 200e9, rel=1e-12)
    default = np.array([7.0])
    assert table_seconds(one("all_reduce", 8, 1), h, default)[0] == 7.0  # no all-reduce curve
    assert table_seconds(one("p2p", 2, 2), h, default)[0] == 7.0  # no scale-out curve


def test_table_scaleout_scales_with_ranks_per_domain_and_decays_beyond_the_measured_nodes(hw):
    # measured: 16 ranks on 2 nodes (8 per node), 200 GB/s bus bandwidth at 1 GB
    h = attrs.evolve(hw, collective_profile=curve("all_reduce", "scaleout", 16, [(1e9, 200.0)]))
    full = table_seconds(one("all_reduce", 16, 2), h, np.zeros(1))[0]
    assert full == pytest.approx(1e9 * 2 * 15 / 16 / 200e9, rel=1e-12)
    # 16 ranks on 16 nodes: one rank (NIC) per node instead of 8 → 1/8 of the bus bandwidth, and
    # 16 nodes are 3 doublings beyond the measured 2: × 1/0.98³
    sparse = table_seconds(one("all_reduce", 16, 16), h, np.zeros(1))[0]
    assert sparse == pytest.approx(full * 8 / 0.98 ** 3, rel=1e-12)


def test_shipped_h100_tables_cover_its_collectives(mofa_predictor):
    """The shipped H100 profile prices TP all-reduce inside a node from Azure's NVLS curve and a DP
    all-reduce across 2 full nodes from AWS p5's: both above the formula's ring at large sizes."""
    hw = mofa_predictor.registry.hardware_profile("h100-sxm5-80gb")
    kinds = {(p.kind, p.scope) for p in hw.collective_profile}
    assert {("all_reduce", "scaleup"), ("all_gather", "scaleup"), ("reduce_scatter", "scaleup"),
            ("all_to_all", "scaleup"), ("p2p", "scaleup"), ("all_reduce", "scaleout")} <= kinds
    up = table_seconds(one("all_reduce", 8, 1, 2**30), hw, np.zeros(1))[0]
    nvls = max(p.busbw_gbps for p in hw.collective_profile if p.kind == "all_reduce" and p.scope == "scaleup"
               and p.group_size == 8)
    assert up == pytest.approx(2**30 * 2 * 7 / 8 / (nvls * 1e9), rel=0.05)


# ====================================================================== the engine's pricing of many rows


def test_large_batches_ask_the_provider_once_per_run_of_equal_rows(mofa_predictor, monkeypatch):
    """Rows sorted by structure repeat a collective's inputs: a batch above the memo's size asks the
    provider for the first row of each run of equal rows only, and every row gets its run's price,
    bit for bit what the provider gives each row alone."""
    from mofa_framework import engine

    hw = mofa_predictor.registry.hardware_profile("h100-sxm5-80gb")
    runs = [(0, 1e6, 8, 1), (2, 4e8, 64, 8), (0, 1e6, 8, 1), (1, 3e7, 16, 2)]  # a run may recur later
    reps = [300, 1, 250, 100]
    cols = {k: np.repeat(np.array([r[i] for r in runs], dtype=dt), reps)
            for i, (k, dt) in enumerate((("kind", np.int64), ("bytes", np.float64), ("group_size", np.int64),
                                          ("nodes", np.int64)))}
    n = sum(reps)
    assert n > engine._MEMO_ROWS
    asked = []
    real = engine.invariants.provider_result

    def spy(pm, hook, rows, **kw):
        asked.append(rows)
        return real(pm, hook, rows, **kw)

    monkeypatch.setattr(engine.invariants, "provider_result", spy)
    monkeypatch.setattr(engine, "_COLLECTIVE_MEMO", {})  # nothing priced before
    ctx = engine.Context(model=mofa_predictor.registry.model("llama3-8b"), hardware=hw, geometry=None,
                         pm=mofa_predictor.pm)
    got = engine._memo_prices(ctx, cols)
    assert asked == [len(runs)]  # one question, the four runs' first rows
    alone = real(mofa_predictor.pm, "mofa_collective_latency", n, colls=CollectiveBatch(**cols), hardware=hw)
    assert np.array_equal(got, alone)
    heads, run = engine._runs_of(cols)
    assert heads.tolist() == [0, 300, 301, 551] and run[299] == 0 and run[300] == 1 and run[-1] == 3
