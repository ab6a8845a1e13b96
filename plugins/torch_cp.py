"""Context parallelism as PyTorch runs it (``torch.distributed.tensor.experimental.context_parallel``,
torchtitan's CP): the K/V exchange, the fp32 gradient ring and the fp32 merges of its ring attention.

The engine prices context parallelism as Megatron-Core / Transformer Engine's ring (``cp_overlap``):
c − 1 bf16 K/V transfers per pass, each hidden behind one step's attention, with the model's KV
heads. PyTorch's ``_templated_ring_attention`` (``_attention.py``) runs the same load-balanced
steps — step 0 the causal local block, 1/c of the rank's attention, then c − 1 equal blocks — but
moves and merges differently:

- **K/V exchange** (``rotate``). ``"allgather"``, torchtitan's default (``context_parallel_rotate_method``
  from 2024-12): one all-gather of the c blocks, issued before step 0 and waited for at step 1, so only
  step 0's attention hides it; the backward gathers again behind its step 0.
  ``"alltoall"``: a permute to the next rank each step, hidden behind that step (the ring).
- **dK/dV** always go round the ring, in **fp32** (``convert_to_f32``, the default): each step's
  accumulated gradients are sent on after its attention backward and waited for after the next
  step's, so c − 1 transfers hide behind one step each and the last is exposed.
- **repeated K/V** (``repeat_kv``): torchtitan's models expanded K and V to every query head before
  SDPA (``repeat_kv``) until pytorch/torchtitan#2259 (2026-01-27, "GQA without kv repeats"); the
  exchanged K/V and their gradients are then a/g times the model's KV heads.
- **merges** on the compute stream, eager (PyTorch ops, not one kernel): per step the forward
  upcasts the block output and merges it into the fp32 running output (``_SDPAMerger``: the cast,
  three arithmetic ops, a re-concatenation for half-blocks — 40 B per output element) and
  concatenates K and V for the exchange (4 B per K/V element); the backward adds the bf16 block
  gradients into fp32 dQ, dK, dV (10 B per element), concatenates dK/dV in fp32 for the send
  (8 B per K/V element) and K/V again (4 B).

Per attention layer and micro-batch, with T the rank's tokens, t TP, ``w_kv`` the exchanged K and V
elements per token and TP rank, ``w_q``/``w_o`` the query/output ones, A_f and A_b the rank's attention
forward and backward::

    AG  = all-gather of c·T·w_kv·dt over the CP group      P_kv = p2p of T·w_kv·dt    P_d = p2p of T·w_kv·4
    fwd exposed:  allgather  max(0, AG − A_f/c)            alltoall  (c−1)·max(0, P_kv − A_f/c)
    bwd exposed:  allgather  max(0, AG − A_b/c) + (c−1)·max(0, P_d − A_b/c) + P_d
                  alltoall   (c−1)·max(0, P_kv + P_d − A_b/c) + P_d
    merges:       fwd c·T·(40·w_o + 4·w_kv) B,  bwd c·T·(10·w_q + 22·w_kv) B, at the GPU's memory rate

The gathered K/V (c·T·w_kv·dt; the permute's two blocks) and the fp32 gradients (T·(w_q + 3·w_kv)·4,
the accumulators and the buffer in flight) are transient bytes of the layer. Conflicts with
``cp_overlap`` and ``cp_a2a``; not searched (a framework's implementation, set by the torchtitan
reader and importer).
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.decompose import ALL_GATHER, P2P, Coll, elementwise_op
from mofa_framework.engine import price_collectives, price_operators
from mofa_framework.types import CostTransform, option
from mofa_plugins.cp_a2a import attention_cp, head_widths

FP32_BYTES = 4.0
#: bytes moved per element by the eager merges of one ring step (module docstring)
FWD_MERGE_PER_OUTPUT = 40.0
FWD_CONCAT_PER_KV = 4.0
BWD_ACCUMULATE_PER_Q = 10.0
BWD_PER_KV = 22.0  # accumulate 10 + fp32 concatenation 8 + K/V concatenation 4
#: eager kernels one merge step launches, forward and backward
FWD_MERGE_KERNELS = 7.0
BWD_MERGE_KERNELS = 6.0
ROTATE_METHODS = ("allgather", "alltoall")


@attrs.frozen(kw_only=True)
class TorchCpOptions:
    rotate: str = option("allgather", choices=ROTATE_METHODS,
                         doc="how K/V reach the other CP ranks: 'allgather' (torchtitan's default) or 'alltoall' "
                             "(a permute per step)")
    repeat_kv: bool = option(False, doc="K and V are expanded to every query head before attention (torchtitan "
                                        "before 2026-01-27): the exchange moves a/g times the KV heads")


def widths(model, repeat: bool) -> tuple[float, float, float]:
    """Elements per token (all TP ranks) of the exchanged K + V, of Q and of the attention output
    (:func:`~mofa_plugins.cp_a2a.head_widths`); repeated to every query head, K and V are as wide as
    Q and the output (MLA's already are)."""
    q, k, v, o = head_widths(model)
    return (q + o if repeat else k + v), q, o


def exchange_seconds(ctx, repeat: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(AG, P_kv, P_d): the all-gather of every rank's K/V, one bf16 K/V permute and one fp32 dK/dV
    permute, seconds per row."""
    g = ctx.geometry
    kv = g.tokens * widths(ctx.model, repeat)[0] / g.t
    one = np.ones_like(np.asarray(g.c, dtype=np.float64))
    colls = [Coll(name="torch_cp_ag", parallel="cp", kind=ALL_GATHER, bytes=g.c * kv * g.dt, group_size=g.c,
                  stride=g.t * one),
             Coll(name="torch_cp_kv", parallel="cp", kind=P2P, bytes=kv * g.dt, group_size=g.c, stride=g.t * one),
             Coll(name="torch_cp_dkv", parallel="cp", kind=P2P, bytes=kv * FP32_BYTES, group_size=g.c,
                  stride=g.t * one)]
    return tuple(price_collectives(ctx, colls))


def merge_seconds(ctx, repeat: bool) -> tuple[np.ndarray, np.ndarray]:
    """The eager merges of the c steps, forward and backward, seconds per row."""
    g = ctx.geometry
    kv, q, o = (g.tokens * w / g.t for w in widths(ctx.model, repeat))
    c = np.asarray(g.c, dtype=np.float64)
    fwd = c * (FWD_MERGE_PER_OUTPUT * o + FWD_CONCAT_PER_KV * kv)
    bwd = c * (BWD_ACCUMULATE_PER_Q * q + BWD_PER_KV * kv)
    ops = [elementwise_op(f"torch_cp_merge_{d}", b, "core_attn", bwd=0.0, kernels=c * k)
           for d, b, k in (("fwd", fwd, FWD_MERGE_KERNELS), ("bwd", bwd, BWD_MERGE_KERNELS))]
    return tuple(price_operators(ctx, ops))


def exposed(ag, p_kv, p_d, attn_f, attn_b, c, allgather):
    """The module docstring's exposed forward and backward exchange, seconds."""
    step_f, step_b = attn_f / c, attn_b / c
    fwd = np.where(allgather, np.maximum(0.0, ag - step_f), (c - 1.0) * np.maximum(0.0, p_kv - step_f))
    bwd_kv = np.where(allgather, np.maximum(0.0, ag - step_b) + (c - 1.0) * np.maximum(0.0, p_d - step_b),
                      (c - 1.0) * np.maximum(0.0, p_kv + p_d - step_b))
    return fwd, bwd_kv + p_d


def working_bytes(ctx, repeat: bool, allgather) -> np.ndarray:
    g = ctx.geometry
    kv, q, _ = (g.tokens * w / g.t for w in widths(ctx.model, repeat))
    gathered = np.where(allgather, g.c, 2.0) * kv * g.dt
    return gathered + (q + 3.0 * kv) * FP32_BYTES


def layer(state, rows):
    ctx = state.ctx
    kinds = [k for k in ctx.model.block_kinds if ctx.model.block(k).is_attention]
    if not kinds:
        return state
    c = np.asarray(ctx.geometry.c, dtype=np.float64)
    on = np.asarray(rows.enabled, bool) & (c > 1)
    repeat = rows.options["repeat_kv"] > 0.5
    allgather = rows.choice("rotate", "allgather")

    def pick(fn):
        """`fn`'s per-structure prices for the K/V widths the rows use (each priced once), per row."""
        got = {r: ctx.per_structure(lambda x, r=r: fn(x, r)) for r in (True, False) if (repeat == r).any()}
        if len(got) == 1:
            return next(iter(got.values()))
        return [np.where(repeat, a, b) for a, b in zip(got[True], got[False])]

    ag, p_kv, p_d = pick(exchange_seconds)
    merge_f, merge_b = pick(merge_seconds)
    work = np.where(repeat, working_bytes(ctx, True, allgather), working_bytes(ctx, False, allgather))
    total_f = np.where(allgather, ag, (c - 1.0) * p_kv)
    total_b = total_f + c * p_d
    w = lambda new, old: np.where(on, new, old)  # noqa: E731
    out = dict(state.layers)
    for kind in kinds:
        lc = out[kind]
        fwd, bwd = exposed(ag, p_kv, p_d, lc.attn_fwd_s, lc.attn_bwd_s, c, allgather)
        out[kind] = attrs.evolve(
            lc, cp_fwd_s=w(total_f, lc.cp_fwd_s), cp_bwd_s=w(total_b, lc.cp_bwd_s),
            cp_exposed_fwd_s=w(fwd, lc.cp_exposed_fwd_s), cp_exposed_bwd_s=w(bwd, lc.cp_exposed_bwd_s),
            fwd_compute_s=w(lc.fwd_compute_s + merge_f, lc.fwd_compute_s),
            qkv_attn_fwd_s=w(lc.qkv_attn_fwd_s + merge_f, lc.qkv_attn_fwd_s),
            bwd_input_s=w(lc.bwd_input_s + merge_b, lc.bwd_input_s),
            act_working_bytes=w(np.maximum(lc.act_working_bytes, work), lc.act_working_bytes))
    return attrs.evolve(state, layers=out)


FEATURE = CostTransform(
    name="torch_cp",
    description="context parallelism as PyTorch's context_parallel runs it (torchtitan): K/V all-gathered (or "
                "permuted) once per pass, dK/dV rotated in fp32, eager fp32 merges; optionally K/V repeated "
                "to every query head",
    equation="E_f = max(0, AG − A_f/c);  E_b = max(0, AG − A_b/c) + (c−1)·max(0, P_d − A_b/c) + P_d;  "
             "merges c·T·(40·w_o + 4·w_kv) + c·T·(10·w_q + 22·w_kv) B",
    options_type=TorchCpOptions,
    layer=layer,
    applies=attention_cp,
    conflicts=("cp_overlap", "cp_a2a"),
    tunable=False,  # a framework's implementation, not a tuning knob
    megatron_args=lambda o: ["# torch_cp is PyTorch's context_parallel (torchtitan); Megatron-LM runs Transformer "
                             "Engine's ring instead (--cp-comm-type p2p, priced as cp_overlap)"],
    before=("kernel_scaling", "recompute", "memfine", "activation_offload"),
)


@hookimpl
def mofa_register_cost_transforms():
    return [FEATURE]
