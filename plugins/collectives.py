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


@hookimpl(trylast=True)
def mofa_collective_latency(colls, hardware):
    return collective_seconds(colls, hardware)
