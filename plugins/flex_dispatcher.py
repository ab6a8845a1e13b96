"""Node-deduplicating token dispatch for expert parallelism (DeepEP / HybridEP).

Megatron-Core's ``alltoall`` token dispatcher sends every (token, expert) pair to the expert's
rank: k copies of each routed token, and an EP group that spans D scale-up domains (nodes, or
NVL72 racks) puts ``(n − n/D)/n`` of them on the scale-out network. The ``flex`` dispatcher with
the DeepEP or HybridEP backend sends a token **once to each remote domain** that hosts at least
one of its experts (to the rank with the same local index, "rail-aligned"), and that rank
forwards the copies to the domain's other ranks over the scale-up links. Per routed token of
``h·dt`` bytes, with k experts drawn among E spread evenly over the D domains::

    P0 = Π_{i<k} (E − E/D − i)/(E − i)        P(a given other domain gets none of them)
    R  = (D − 1)·(1 − P0)                     remote domains the token is sent to
    ρ  = n·(1 − Π_{i<k} (E − E/n − i)/(E − i))  EP ranks the token reaches (n ranks of E/n experts)
    scale-out:  R · tokens · h · dt
    scale-up:   (1 − D/n) · S·ρ/k             tokens forwarded inside a domain, once per rank

The two run concurrently: ``t = max(t_up, t_out)``, each priced by the
``mofa_collective_latency`` provider (an all-to-all inside one domain over n/D ranks, and one
across the D domains with one rank in each), so a third-party collective model applies to it —
at the links' rate: DeepEP's and HybridEP's kernels are not NCCL's all-to-all (DeepEP publishes
RDMA bottleneck bandwidths at the NICs' line rate), so the profile's
``alltoall_relative_efficiency``, which prices NCCL's many-peer all-to-all, is left at 1 for them
(the alltoall dispatcher it is compared with keeps it).
The busiest EP rank's volume is the model's ``moe_load_factor`` times the mean (1, balanced
routing, unless the job says otherwise; NVIDIA's MoE benchmarks force balance). Group-limited routing
(``moe_router_num_groups`` / ``moe_router_group_topk``: DeepSeek-V3 picks a token's experts from
its best 4 of 8 groups) whose groups tile the domains caps the domains a token reaches: j of the
chosen groups fall in a given domain with hypergeometric probability, and the k experts are drawn
among the chosen groups' experts only; groups spanning several domains (more domains than groups)
put a given domain among the chosen with probability ``group_topk/groups``.

**Once per rank** (since 2026-11-30). Both backends send a token once to each EP rank holding any of
its experts — the rank lays out the copies for its own experts (DeepEP's ``is_token_in_rank``
layout; Megatron-LM's DeepSeek-V3 GB200 guide, §2.1.1: the flex dispatcher "fuses the global
permute into the communication kernel, eliminating the need to explicitly copy the tokens top-k
times") — so where a rank holds several experts, fewer than k copies move: S·ρ/k, ρ the expected
ranks reached (by the same draws, with every rank a domain of E/n experts; DeepSeek-V3 at EP 8,
one group per rank, reaches 3.6 ranks, not 8 copies; Qwen3-235B at EP 8, 5.3). Inside one
scale-up domain that is the only difference from the alltoall dispatcher (the same all-to-all,
NCCL's efficiency kept: **choice**) — and DeepEP across more than 8 ranks of one NVLink domain.
DeepEP's NVLink kernels address at most ``NUM_MAX_NVL_PEERS = 8`` peers; on a GB200 NVL72 at EP 32
NVIDIA ran it through a community patch that reached about 400 GB/s (dispatch) and 190 GB/s
(combine) of algorithm bandwidth with 24 SMs, against the links' 900 GB/s per direction
(Megatron-LM ``docs/discussions/deepseek-v3-gb200-optimization``, §2.2.1; HybridEP, built for
NVL72, removed the gap, §2.5). Those rows price the scale-up leg as the tokens sent over those
measured fractions of the profile's link rate — a dispatch and a combine per pass, each counted
as their mean, ``(S·ρ/k)/B_up · (900/400 + 900/190)/2 = 3.49·(S·ρ/k)/B_up`` — with no NCCL
efficiency or latency term (**choice**: the fractions scale with another domain's link rate).

It changes the EP dispatch/combine all-to-alls (both passes) and nothing else: the expert-TP
gathers, compute and memory are unchanged (its communication buffers, ≈ 1–2 GiB, are not
counted). Runs before the overlap, recompute and kernel-speed features so they see the new
all-to-all time.
"""

from __future__ import annotations

from math import comb

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.decompose import ALL_TO_ALL, Coll, moe_load
from mofa_framework.engine import nodes_spanned, price_collectives
from mofa_framework.types import CostTransform, option

BACKENDS = ("hybridep", "deepep")
#: DeepEP's NVLink peers per rank (``NUM_MAX_NVL_PEERS`` in its ``buffer.py`` and ``config.hpp``)
DEEPEP_NVL_PEERS = 8
#: DeepEP over more NVLink peers (GB200 NVL72, EP 32, 24 SMs): dispatch and combine algorithm
#: bandwidth as fractions of the links' 900 GB/s per direction (the DeepSeek-V3 GB200 guide, §2.2.1)
DEEPEP_WIDE_NVL_FRACTIONS = (400.0 / 900.0, 190.0 / 900.0)
#: its time per dispatch or combine there, in units of the copies' time at the links' rate: the mean
#: of 1/fraction over its dispatch and its combine (3.49)
DEEPEP_WIDE_NVL_SLOWDOWN = 0.5 * sum(1.0 / f for f in DEEPEP_WIDE_NVL_FRACTIONS)


@attrs.frozen(kw_only=True)
class FlexDispatcherOptions:
    backend: str = option("hybridep", choices=BACKENDS,
                          doc="Megatron-Core flex dispatcher backend (both send a token once per remote domain)")


def _none_of(pool: float, away: float, k: int) -> float:
    """P(none of k experts drawn without replacement from `pool` lies in `away` of them)."""
    p = 1.0
    for i in range(int(k)):
        p *= min(max((pool - away - i) / max(pool - i, 1.0), 0.0), 1.0)
    return p


def _remote_one(e: float, k: int, d: float, groups: int, group_topk: int) -> float:
    if d <= 1.0:
        return 0.0
    restricted = groups and group_topk < groups
    if restricted and d > groups and not d % groups:
        # each group spans d/groups domains: a given domain's group is chosen with probability
        # group_topk/groups, and then the k experts are drawn among the chosen groups' experts
        pool = group_topk * e / groups
        return (d - 1.0) * group_topk / groups * (1.0 - _none_of(pool, e / d, k))
    if not restricted or groups % d or d > groups:
        return (d - 1.0) * (1.0 - _none_of(e, e / d, k))
    g_d, per_group = int(groups // d), e / groups
    pool = group_topk * per_group
    hit = sum(comb(g_d, j) * comb(groups - g_d, group_topk - j) / comb(groups, group_topk)
              * (1.0 - _none_of(pool, j * per_group, k)) for j in range(1, min(group_topk, g_d) + 1))
    return (d - 1.0) * hit


def remote_domains(num_experts: int, k: int, domains, groups: int = 0, group_topk: int = 0) -> np.ndarray:
    """Expected remote scale-up domains one token is sent to, ``(D − 1)·P(a given other domain)``.

    Unrestricted routing: the k experts are drawn among all E, ``P = 1 − P0``. Group-limited
    routing (G groups, the token's best ``group_topk`` chosen) whose groups tile the domains
    (G a multiple of D): j of the chosen groups lie in a given domain with hypergeometric
    probability, and the k experts are drawn among the chosen groups' experts only. Computed once
    per distinct domain count of the batch.
    """
    d = np.maximum(np.asarray(domains, dtype=np.float64), 1.0)
    uniq, inv = np.unique(d, return_inverse=True)
    vals = np.array([_remote_one(float(num_experts), int(k), float(u), int(groups), int(group_topk)) for u in uniq])
    return vals[inv].reshape(d.shape)


def ranks_reached(moe_model, e) -> np.ndarray:
    """Expected EP ranks one token's k experts lie on (each rank holding E/e of them), by the same
    draw as :func:`remote_domains` with every rank a domain of its own: ``e·P(a given rank)``; with
    group-limited routing whose groups tile the ranks, at most the chosen groups' ranks."""
    e = np.maximum(np.asarray(e, dtype=np.float64), 1.0)
    other = remote_domains(moe_model.num_experts, moe_model.experts_per_token, e, moe_model.moe_router_num_groups,
                           moe_model.moe_router_group_topk)
    return np.where(e > 1.0, other * e / np.maximum(e - 1.0, 1.0), 1.0)


def _a2a_seconds(ctx, moe_model, g) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One dispatch (or combine) all-to-all: (alltoall dispatcher, flex dispatcher, DeepEP) seconds;
    the last differs from the flex one where more than 8 EP ranks share a scale-up domain."""
    h, k = moe_model.expert_width, moe_model.experts_per_token  # LatentMoE dispatches ℓ-wide tokens
    tok = g.tokens / g.sp_div
    load = moe_load(moe_model, g)  # the busiest EP rank receives `load` times the mean
    copies = tok * k * h * g.dt * load  # S: the k copies the alltoall dispatcher sends
    # the flex dispatcher sends a token once to each rank holding any of its experts (the rank lays
    # out the copies for its own experts): S·(ranks reached)/k
    sent = copies * ranks_reached(moe_model, g.e) / k
    d = nodes_spanned(g.e, g.etp, ctx.hardware.scaleup_domain_gpus)
    local = np.maximum(g.e / d, 1.0)
    r = remote_domains(moe_model.num_experts, k, d, moe_model.moe_router_num_groups, moe_model.moe_router_group_topk)
    one = np.ones_like(g.e)
    colls = [
        Coll(name="ep_a2a", parallel="ep", kind=ALL_TO_ALL, bytes=copies, group_size=g.e, stride=g.etp),
        Coll(name="ep_a2a_flex", parallel="ep", kind=ALL_TO_ALL, bytes=sent, group_size=g.e, stride=g.etp),
        Coll(name="ep_a2a_intra", parallel="ep", kind=ALL_TO_ALL, bytes=sent, group_size=local, stride=g.etp),
        # one rank per domain: (D−1)/D of the bytes leave the domain, = R·tok·h·dt
        Coll(name="ep_a2a_inter", parallel="ep", kind=ALL_TO_ALL,
             bytes=r * tok * h * g.dt * load * d / np.maximum(d - 1.0, 1.0), group_size=d,
             stride=np.maximum(ctx.hardware.scaleup_domain_gpus * one, local * g.etp)),
    ]
    plain, inside = price_collectives(ctx, colls[:2])
    intra, inter = price_collectives(_line_rate(ctx), colls[2:])
    flex = np.where(d > 1.0, np.maximum(intra, inter), inside)
    wide = sent / ctx.hardware.scaleup_bandwidth_bytes_per_s * DEEPEP_WIDE_NVL_SLOWDOWN
    deepep = np.where(local > DEEPEP_NVL_PEERS, np.where(d > 1.0, np.maximum(wide, inter), wide), flex)
    return plain, flex, deepep


def _line_rate(ctx):
    """The context DeepEP / HybridEP are priced in: their kernels are not NCCL's all-to-all and run
    at the links' rate (DeepEP's published RDMA bottleneck bandwidths are the NICs' line rate), so
    the profile's ``alltoall_relative_efficiency`` — NCCL's many-peer all-to-all — does not apply."""
    eff = ctx.hardware.efficiency
    if eff.alltoall_relative_efficiency == 1.0:
        return ctx
    return attrs.evolve(ctx, hardware=attrs.evolve(ctx.hardware, efficiency=attrs.evolve(
        eff, alltoall_relative_efficiency=1.0)))


def layer(state, rows):
    ctx = state.ctx
    kinds = ctx.model.moe_kinds
    if not kinds:
        return state
    g = ctx.geometry
    plain, flex, deepep = ctx.per_structure(lambda c: _a2a_seconds(c, c.model, c.geometry))
    flex = np.where(rows.choice("backend", "deepep"), deepep, flex)
    on = g.e > 1
    delta = np.where(on, 2.0 * (flex - plain), 0.0)  # dispatch + combine, per pass
    out = dict(state.layers)
    for kind in kinds:
        moe = out[kind]
        out[kind] = attrs.evolve(moe, ep_fwd_s=moe.ep_fwd_s + delta, ep_bwd_s=moe.ep_bwd_s + delta,
                                 ep_exposed_fwd_s=moe.ep_exposed_fwd_s + delta,
                                 ep_exposed_bwd_s=moe.ep_exposed_bwd_s + delta)
    return attrs.evolve(state, layers=out)


def _applies(batch, model, hardware):
    """Rows where it changes anything: expert parallelism across scale-up domains, or where a rank
    holds several experts and a token reaches fewer ranks than it has experts (inside one domain the
    tokens sent once per rank are all that differs)."""
    if not model.is_moe:
        return np.zeros(len(batch), bool)
    fewer = ranks_reached(model, batch.ep) < model.experts_per_token - 1e-9
    return (batch.ep > 1) & ((nodes_spanned(batch.ep, batch.etp, hardware.scaleup_domain_gpus) > 1) | fewer)


def _never_slower(batch, model, hardware):
    """Rows where it is never slower than the alltoall dispatcher: an EP group inside one scale-up
    domain of at most DeepEP's 8 NVLink peers, where either backend runs the alltoall dispatcher's
    all-to-all with the tokens sent once per rank — the same collective with no more bytes, memory
    unchanged (beyond 8 peers DeepEP's own kernels are slower)."""
    if not model.is_moe:
        return np.zeros(len(batch), bool)
    inside = nodes_spanned(batch.ep, batch.etp, hardware.scaleup_domain_gpus) <= 1
    return (batch.ep > 1) & inside & (batch.ep <= DEEPEP_NVL_PEERS)


def megatron_args(options) -> list[str]:
    return ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", options.backend]


def from_megatron(args):
    """``--moe-token-dispatcher-type flex`` with ``--moe-flex-dispatcher-backend`` (Megatron's
    default: deepep; backends MoFa does not know are read as deepep); ``--moe-enable-deepep`` is
    the older spelling."""
    flex = args.value("--moe-token-dispatcher-type") == "flex"
    legacy = args.has("--moe-enable-deepep")
    backend = args.value("--moe-flex-dispatcher-backend", "deepep")
    if not (flex or legacy):
        return None
    return {"backend": backend if backend in BACKENDS and not legacy else "deepep"}


FEATURE = CostTransform(
    name="flex_dispatcher",
    description="DeepEP / HybridEP token dispatch: each token crosses the scale-out network once per "
                "remote domain holding its experts, then fans out over the scale-up links once per rank "
                "holding them",
    equation="t_a2a = max((1 − D/n)·S·ρ/k / B_up, (D−1)(1−P0)·T·h·dt / B_out)",
    options_type=FlexDispatcherOptions,
    layer=layer,
    megatron_args=megatron_args,
    from_megatron=from_megatron,
    applies=_applies,
    never_slower=_never_slower,
    before=("kernel_scaling", "ep_overlap", "recompute", "memfine", "activation_offload"),
)


@hookimpl
def mofa_register_cost_transforms():
    return [FEATURE]
