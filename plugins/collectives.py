"""Collective latency: ring algorithms with latency and bandwidth terms (eqs. [2], [3]).

For n ranks, S bytes (the full tensor), bandwidth B and per-step latency λ:
all-reduce ``2(n−1)/n·S/B + 2(n−1)λ``; all-gather / reduce-scatter ``(n−1)/n·S/B + (n−1)λ``;
all-to-all ``(n−1)/n·S/B + λ``; p2p ``S/B + λ``. B is the scale-up bandwidth when the group
stays inside one scale-up domain, else the per-GPU scale-out bandwidth decayed by eq. [3]:
``B_large = α·B_small`` with ``α = (1 − d)^log2(nodes)``.

A ring (all-reduce, all-gather, reduce-scatter) that spans several domains crosses each domain
boundary once per ring, and NCCL runs one ring per NIC: with ``n/nodes`` ranks of the group in
each domain, each with its own NIC, the crossing traffic is spread over those NICs, so the ring
runs at ``min(B_up, (n/nodes)·B_large)`` — the scale-out bandwidth of the group's share of each
domain, capped by the scale-up links (nccl-tests bus bandwidth of multi-node rings ≈ a node's
total NIC bandwidth).

An all-to-all that spans several scale-up domains is hierarchical (NCCL's PXN, DeepEP, HybridEP):
of the ``(n−1)/n·S`` a rank sends, the ``(n/nodes − 1)/n·S`` for peers in its own domain go over
the scale-up links and the ``(n − n/nodes)/n·S`` for the other domains over the scale-out NIC, at
the same time: ``max(intra, inter) + λ``. Its bandwidth terms are divided by the profile's
``alltoall_relative_efficiency`` (many peers, small per-peer messages; default 1).

**Measured tables.** Where the profile carries ``[[collective_profile]]`` points of a collective's
kind and scope (``scaleup`` for a group inside one scale-up domain, else ``scaleout``), the
measured nccl-tests bus bandwidth replaces the formula (:func:`table_seconds`): the curve of the
measured group size nearest the collective's (in log2), interpolated linearly in log2 of the
message size (clamped: above the largest message its bus bandwidth, below the smallest its time —
the latency floor), and ``t = S·f(n) / busbw`` with nccl-tests' factor f = 2(n−1)/n for
all-reduce, (n−1)/n for all-gather, reduce-scatter and all-to-all, 1 for p2p. A scale-out curve
is measured with every GPU of each node in the group (nccl-tests ``-g 8`` per node, one NIC per
GPU); a group with fewer ranks per domain has fewer NICs to spread the ring over, so its bus
bandwidth is scaled by ``local / local_measured``, and a group spanning more domains than the
measurement loses eq. [3]'s ``(1 − d)`` per doubling beyond it. Collectives the table does not
cover (a kind or scope without points) keep the formula.
"""

from __future__ import annotations

import numpy as np

from mofa_framework import hookimpl
from mofa_framework.batch import COLLECTIVE_KINDS

AR, AG, RS, A2A, P2P = (COLLECTIVE_KINDS.index(k) for k in
                        ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"))


def collective_seconds(colls, hardware) -> np.ndarray:
    eff = hardware.efficiency
    n = np.maximum(colls.group_size.astype(np.float64), 1.0)
    nodes = np.maximum(colls.nodes.astype(np.float64), 1.0)
    intra = colls.nodes <= 1
    decay = (1.0 - eff.bandwidth_decay_per_doubling) ** np.log2(nodes)
    bw = np.where(intra, hardware.scaleup_bandwidth_bytes_per_s * eff.scaleup_bus_efficiency,
                  hardware.scaleout_bandwidth_bytes_per_s * eff.scaleout_bus_efficiency * decay)
    lat = np.where(intra, eff.scaleup_latency_us, eff.scaleout_latency_us) * 1e-6
    frac = (n - 1.0) / n
    s = colls.bytes
    k = colls.kind
    local = np.maximum(n / nodes, 1.0)  # ranks of the group in each scale-up domain
    up = hardware.scaleup_bandwidth_bytes_per_s * eff.scaleup_bus_efficiency
    # rings across domains: the boundary crossings are spread over the group's NICs in a domain
    ring = np.where(intra, bw, np.minimum(up, local * bw))
    # all-to-all across domains: the share for peers in the own domain rides the scale-up links
    a2a = np.where(intra, frac * s / bw, np.maximum((local - 1.0) / n * s / up, (n - local) / n * s / bw))
    a2a = a2a / eff.alltoall_relative_efficiency
    t = np.select(
        [k == AR, (k == AG) | (k == RS), k == A2A, k == P2P],
        [2.0 * frac * s / ring + 2.0 * (n - 1.0) * lat, frac * s / ring + (n - 1.0) * lat, a2a + lat,
         s / bw + lat],
        default=np.nan,
    )
    return np.where(n > 1, t, 0.0)


#: nccl-tests bus-bandwidth factor per kind: busbw = algbw · factor(n)
BUSBW_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1.0) / n,
    "all_gather": lambda n: (n - 1.0) / n,
    "reduce_scatter": lambda n: (n - 1.0) / n,
    "all_to_all": lambda n: (n - 1.0) / n,
    "p2p": lambda n: np.ones_like(n),
}


def _curve(points, group: float):
    """(log2 sizes, busbw GB/s, measured group size) of the measured group size nearest `group`."""
    sizes = np.array(sorted({p.group_size for p in points}), dtype=np.float64)
    g = sizes[np.argmin(np.abs(np.log2(sizes) - np.log2(max(group, 2.0))))]
    pts = sorted((p.message_bytes, p.busbw_gbps) for p in points if p.group_size == g)
    x = np.log2(np.array([p[0] for p in pts]))
    y = np.array([p[1] for p in pts])
    return x, y, g


def _interp_seconds(x, y, factor, size):
    """S·f/busbw(S) on one measured curve: busbw interpolated in log2 S, held flat above the largest
    message; below the smallest message the smallest message's time (latency-bound)."""
    s = np.maximum(size, 2.0 ** x[0])
    bus = np.interp(np.log2(s), x, y) * 1e9
    return s * factor / bus


class _TableIndex:
    """A profile's ``[[collective_profile]]`` points by (kind, scope), and the curves of
    :func:`_curve` once per measured group size asked for: built once per table, not per call."""

    def __init__(self, table):
        self.table = table
        self.points: dict[tuple[str, str], list] = {}
        for p in table:
            self.points.setdefault((p.kind, p.scope), []).append(p)
        self.curves: dict[tuple[str, str, float], tuple] = {}

    def curve(self, kind: str, scope: str, group: float):
        key = (kind, scope, group)
        if key not in self.curves:
            self.curves[key] = _curve(self.points[(kind, scope)], group)
        return self.curves[key]


_INDEXES: dict[int, _TableIndex] = {}


def _index(table) -> _TableIndex:
    """The index of `table` (kept by identity: profiles are frozen and live for the process)."""
    index = _INDEXES.get(id(table))
    if index is None or index.table is not table:
        index = _INDEXES[id(table)] = _TableIndex(table)
    return index


def table_seconds(colls, hardware, default: np.ndarray) -> np.ndarray:
    """`default` with every collective a ``[[collective_profile]]`` curve covers priced from it."""
    table = hardware.collective_profile
    if not table:
        return default
    index = _index(table)
    out = np.array(default, dtype=np.float64, copy=True)
    n = np.maximum(colls.group_size.astype(np.float64), 1.0)
    nodes = np.maximum(colls.nodes.astype(np.float64), 1.0)
    domain = float(hardware.scaleup_domain_gpus)
    decay_per_doubling = 1.0 - hardware.efficiency.bandwidth_decay_per_doubling
    for kind in {kind for kind, _ in index.points}:
        k = COLLECTIVE_KINDS.index(kind)
        for scope, where in (("scaleup", colls.nodes <= 1), ("scaleout", colls.nodes > 1)):
            if (kind, scope) not in index.points:
                continue
            sel = (colls.kind == k) & where & (n > 1)
            if not sel.any():
                continue
            for group in np.unique(n[sel]):
                rows = sel & (n == group)
                x, y, g = index.curve(kind, scope, float(group))
                t = _interp_seconds(x, y, BUSBW_FACTOR[kind](n[rows]), colls.bytes[rows])
                if scope == "scaleout":
                    local = np.maximum(n[rows] / nodes[rows], 1.0)
                    local_meas, nodes_meas = min(g, domain), max(g / domain, 1.0)
                    t = t / np.minimum(local / local_meas, 1.0)
                    extra = np.maximum(np.log2(nodes[rows] / nodes_meas), 0.0)
                    t = t / decay_per_doubling ** extra
                out[rows] = t
    return out


@hookimpl(trylast=True)
def mofa_collective_latency(colls, hardware):
    return table_seconds(colls, hardware, collective_seconds(colls, hardware))
