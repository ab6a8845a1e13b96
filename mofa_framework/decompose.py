"""Model decomposition (paper §3.2, Table 2): layer → module → operator, after sharding.

For one layer type (dense or MoE) and every candidate row, :func:`layer_operators` lists the
operators one GPU runs per micro-batch — forward FLOPs, bytes moved, GEMM shape, how the
backward splits into input- and weight-gradient work — and :func:`layer_collectives` lists
the collectives that follow them. :func:`saved_activation_bytes` derives the bytes each
operator keeps for backward from the tensors it saves (Korthikanti et al. 2022), so GQA,
SwiGLU, MoE, MLA and fused attention need no hard-coded constant.

Everything is vectorised over rows: sizes are float64 arrays of the batch's length.
"""

from __future__ import annotations

import attrs
import numpy as np

from .batch import PRECISIONS, CandidateBatch
from .types import Activation, ModelSpec
from .units import FloatArray

GEMM, ATTENTION, ELEMENTWISE = 0, 1, 2
ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, P2P = 0, 1, 2, 3, 4

#: fused attention backward ≈ 2.5 × forward (it recomputes the scores)
ATTENTION_BWD_FACTOR = 2.5
#: causal attention does about half of the full square's work
CAUSAL_FRACTION = 0.5
#: bytes an unfused softmax/dropout chain moves per score element, in units of the dtype
UNFUSED_SCORE_PASSES = 6.0


@attrs.frozen(kw_only=True, eq=False)
class Op:
    """One operator over all rows: per-GPU, per-micro-batch forward work."""

    name: str
    kind: int
    flops: FloatArray
    bytes: FloatArray
    #: GEMM: the per-GPU shape M×N×K; fused attention: queries × keys per query × head dimension
    #: (the mean of the query/key and value head dimensions); 0 for other operators
    m: FloatArray | float = 0.0
    n: FloatArray | float = 0.0
    k: FloatArray | float = 0.0
    #: backward work as multiples of the forward time: input-gradient and weight-gradient
    bwd_input: float = 1.0
    bwd_weight: float = 1.0
    #: which group the op belongs to, for features that act on some ops only
    group: str = "other"  # qkv | core_attn | proj | mlp | expert | router | norm | head | embedding
    #: equal, independent GEMMs the op stands for (a grouped GEMM over the local experts): FLOPs
    #: and bytes are the group's total; the GEMM shape m×n×k and the size-efficiency curve are
    #: those of one member
    count: FloatArray | float = 1.0
    #: kernel launches the op takes per pass (each pays the profile's ``kernel_launch_s``)
    kernels: FloatArray | float = 1.0


@attrs.frozen(kw_only=True, eq=False)
class Coll:
    """One collective over all rows (per micro-batch, one direction of one pass)."""

    name: str
    parallel: str  # tp | cp | ep | etp
    kind: int
    bytes: FloatArray
    group_size: FloatArray
    stride: FloatArray
    count: FloatArray | float = 1.0  # how many times it runs per pass
    passes: str = "fwd+bwd"  # fwd | bwd | fwd+bwd


@attrs.frozen(kw_only=True, eq=False)
class Geometry:
    """Per-row sizes every formula below needs (float64 arrays)."""

    b: FloatArray
    s: FloatArray
    t: FloatArray
    c: FloatArray
    e: FloatArray
    etp: FloatArray
    dp: FloatArray
    sp: np.ndarray
    dt: FloatArray  # activation/weight bytes per element of the GEMM inputs
    precision: np.ndarray
    flash: np.ndarray

    @property
    def tokens(self) -> FloatArray:
        """T = b·s/c: tokens of one micro-batch on one CP rank."""
        return self.b * self.s / self.c

    @property
    def sp_div(self) -> FloatArray:
        """Divisor of replicated-by-TP tensors: t with sequence parallelism, else 1."""
        return np.where(self.sp, self.t, 1.0)

    @classmethod
    def of(cls, batch: CandidateBatch) -> Geometry:
        f = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
        return cls(b=f(batch.micro_batch_size), s=f(batch.sequence_length), t=f(batch.tp), c=f(batch.cp),
                   e=f(batch.ep), etp=f(batch.etp), dp=f(batch.dp), sp=np.asarray(batch.sequence_parallel),
                   dt=np.full(len(batch), 2.0), precision=np.asarray(batch.precision),
                   flash=np.asarray(batch.flash_attention))


def _gemm(name, m, n, k, dt, group, *, bwd_weight=1.0) -> Op:
    m, n, k = (np.asarray(x, dtype=np.float64) for x in np.broadcast_arrays(m, n, k))
    return Op(name=name, kind=GEMM, flops=2.0 * m * n * k, bytes=(m * k + k * n + m * n) * dt,
              m=m, n=n, k=k, bwd_weight=bwd_weight, group=group)


def _elementwise(name, nbytes, group, *, bwd=1.0, kernels=1.0) -> Op:
    nbytes = np.asarray(nbytes, dtype=np.float64)
    return Op(name=name, kind=ELEMENTWISE, flops=nbytes / 2.0, bytes=nbytes, bwd_input=bwd, bwd_weight=0.0, group=group,
              kernels=kernels)


def attention_operators(model: ModelSpec, g: Geometry) -> list[Op]:
    h, a, kv = model.hidden_size, model.num_attention_heads, model.num_kv_heads
    T, t, dt = g.tokens, g.t, g.dt
    # a norm reads and writes each element once: 2·dt bytes per element
    ops = [_elementwise("input_norm", 2.0 * T * h * dt / g.sp_div, "norm")]
    if model.is_mla:
        dq, dv, rope = model.qk_head_dim, model.v_dim, model.qk_rope_head_dim
        if model.q_lora_rank:
            # down projections are replicated across TP ranks in Megatron-Core's MLA
            ops.append(_gemm("q_down_proj", T, model.q_lora_rank, h, dt, "qkv"))
            ops.append(_gemm("q_up_proj", T, a * dq / t, model.q_lora_rank, dt, "qkv"))
        else:
            ops.append(_gemm("q_proj", T, a * dq / t, h, dt, "qkv"))
        ops.append(_gemm("kv_down_proj", T, model.kv_lora_rank + rope, h, dt, "qkv"))
        ops.append(_gemm("kv_up_proj", T, a * (model.qk_nope_head_dim + dv) / t, model.kv_lora_rank, dt, "qkv"))
        heads_q, heads_kv = a, a
    else:
        dq = dv = model.kv_channels
        ops.append(_gemm("qkv_proj", T, (a * dq + 2 * kv * dq) / t, h, dt, "qkv"))
        heads_q, heads_kv = a, kv
    s_kv, keys_causal = attended_keys(model, g.s)
    # core attention: T queries of this CP rank against the whole sequence's keys, causal
    core_flops = 2.0 * T * s_kv * heads_q * (dq + dv) / t
    io = (T * heads_q * (dq + dv) + 2.0 * T * heads_kv * (dq + dv)) / t * dt
    fused = Op(name="core_attention", kind=ATTENTION, flops=2.0 * T * keys_causal * heads_q * (dq + dv) / t,
               bytes=io, bwd_input=ATTENTION_BWD_FACTOR, bwd_weight=0.0, group="core_attn")
    # unfused (2021/22 Megatron): batched GEMMs over the full square plus softmax/dropout passes
    score_bytes = UNFUSED_SCORE_PASSES * T * s_kv * heads_q / t * dt
    unfused_gemm = Op(name="core_attention", kind=GEMM, flops=core_flops, bytes=io, bwd_input=1.0, bwd_weight=1.0,
                      m=T, n=s_kv, k=dq, group="core_attn")
    ops.append(Op(name="core_attention", kind=np.where(g.flash, ATTENTION, GEMM),
                  flops=np.where(g.flash, fused.flops, unfused_gemm.flops), bytes=io,
                  m=T, n=np.where(g.flash, keys_causal, s_kv), k=np.where(g.flash, 0.5 * (dq + dv), float(dq)),
                  bwd_input=ATTENTION_BWD_FACTOR, bwd_weight=0.0, group="core_attn"))
    ops.append(_elementwise("softmax_dropout", np.where(g.flash, 0.0, score_bytes), "core_attn"))
    ops.append(_gemm("o_proj", T, h, a * dv / t, dt, "proj"))
    # two residual adds (read 2, write 1), the second norm, and with dropout its 1-byte masks
    drop = 2.0 if model.dropout else 0.0
    ops.append(_elementwise("residual_norm", ((2.0 + 6.0) * dt + drop) * T * h / g.sp_div, "norm"))
    return ops


def attended_keys(model: ModelSpec, s) -> tuple[np.ndarray, np.ndarray]:
    """Keys per query of one layer's core attention, averaged over the model's layers:
    (unfused: the masked score square's width, fused causal kernel: keys actually attended).

    Full causal attention: ``s`` and ``CAUSAL_FRACTION·s``. A sliding window ``w`` (query i sees
    keys ``max(0, i−w+1)..i``): ``min(s, w)`` and ``w'·(1 − w'/(2s))`` with ``w' = min(s, w)``
    (``s/2`` at ``w = s``). ``sliding_window_layer_fraction`` of the layers are windowed, the rest
    full (GPT-OSS alternates the two); the per-layer costs are the fraction-weighted mix.
    """
    s = np.asarray(s, dtype=np.float64)
    if not model.sliding_window:
        return s, CAUSAL_FRACTION * s
    f = model.sliding_window_layer_fraction
    w = np.minimum(s, float(model.sliding_window))
    win_causal = w * (1.0 - w / (2.0 * np.maximum(s, 1.0)))
    return f * w + (1.0 - f) * s, f * win_causal + (1.0 - f) * CAUSAL_FRACTION * s


def _mlp(name, model: ModelSpec, T, ffn, divisor, dt, group) -> list[Op]:
    h = model.hidden_size
    width = 2.0 if model.activation is Activation.swiglu else 1.0
    act_bytes = (3.0 if model.activation is Activation.swiglu else 2.0) * T * ffn / divisor * dt
    return [
        _gemm(f"{name}_fc1", T, width * ffn / divisor, h, dt, group),
        _elementwise(f"{name}_act", act_bytes, group),
        _gemm(f"{name}_fc2", T, h, ffn / divisor, dt, group),
    ]


def dense_mlp_operators(model: ModelSpec, g: Geometry) -> list[Op]:
    return _mlp("mlp", model, g.tokens, model.ffn_hidden_size, g.t, g.dt, "mlp")


#: kernels of the router and its bookkeeping per pass (softmax/sigmoid, top-k, score
#: normalisation, auxiliary load-balancing loss, token counts) besides its GEMM
ROUTER_KERNELS = 8.0
#: kernels of the token permutation per pass (index computation, gather, and the matching
#: un-permutation with the routing-probability weighted scatter-add)
PERMUTE_KERNELS = 6.0


def moe_load(model: ModelSpec, g: Geometry):
    """The busiest expert-parallel rank's share of the token-expert pairs over the mean
    (``model.moe_load_factor`` where EP > 1; 1 without EP, where every rank holds every expert)."""
    return np.where(g.e > 1, model.moe_load_factor, 1.0)


def routed_pairs(model: ModelSpec, g: Geometry):
    """Token-expert pairs one GPU computes per micro-batch after dispatch: its sequence-parallel
    share of the tokens × top-k × the expert-TP group that gathers them, on the busiest EP rank."""
    return g.tokens / g.sp_div * model.experts_per_token * g.etp * moe_load(model, g)


def moe_mlp_operators(model: ModelSpec, g: Geometry) -> list[Op]:
    h, E, k, fe = model.hidden_size, model.num_experts, model.experts_per_token, model.moe_ffn_hidden_size
    tok = g.tokens / g.sp_div  # tokens this GPU routes (sequence-parallel shard)
    load = moe_load(model, g)
    routed = routed_pairs(model, g)  # on the busiest EP rank (balanced routing: load = 1)
    local_experts = E / g.e
    per_expert = routed / local_experts
    width = 2.0 if model.activation is Activation.swiglu else 1.0
    ep_on = np.where(g.e > 1, 1.0, 0.0)
    ops = [
        _gemm("router", tok, E, h, g.dt, "router"),
        # scores (fp32) read and written by softmax/top-k/aux-loss kernels
        _elementwise("router_topk", 4.0 * 4.0 * tok * E, "router", kernels=ROUTER_KERNELS),
        # permute: read tok·h, write tok·k·h; un-permute: read tok·k·h (+ probabilities), write tok·h.
        # With EP the received tokens are sorted by local expert once more each way.
        _elementwise("permute", (4.0 + 4.0 * ep_on * load) * tok * k * h * g.dt, "expert",
                     kernels=PERMUTE_KERNELS + 2.0 * ep_on),
    ]
    for name, nn, kk in (("expert_fc1", width * fe / g.etp, h), ("expert_fc2", h, fe / g.etp)):
        op = _gemm(name, per_expert, nn, kk, g.dt, "expert")
        # a grouped GEMM over the local experts: FLOPs add up, each expert's weights are read,
        # and each expert's GEMM runs at the efficiency of its own (smaller) size
        ops.append(attrs.evolve(op, flops=op.flops * local_experts, bytes=op.bytes * local_experts,
                                count=np.broadcast_to(local_experts, np.shape(op.flops)).astype(np.float64)))
    act = (3.0 if model.activation is Activation.swiglu else 2.0) * routed * fe / g.etp * g.dt
    ops.append(_elementwise("expert_act", act, "expert"))
    if model.num_shared_experts:
        ops += _mlp("shared_expert", model, g.tokens, model.num_shared_experts * fe, g.t, g.dt, "mlp")
    return ops


def embedding_operators(model: ModelSpec, g: Geometry) -> list[Op]:
    return [_elementwise("embedding", 2.0 * g.tokens * model.hidden_size * g.dt / g.sp_div, "embedding", bwd=2.0)]


def head_operators(model: ModelSpec, g: Geometry) -> list[Op]:
    T, V, h = g.tokens, model.vocab_size, model.hidden_size
    return [
        _elementwise("final_norm", 2.0 * T * h * g.dt / g.sp_div, "norm"),
        _gemm("lm_head", T, V / g.t, h, g.dt, "head"),
        _elementwise("cross_entropy", 3.0 * T * V / g.t * 4.0, "head"),
    ]


def layer_operators(model: ModelSpec, g: Geometry, kind: str) -> list[Op]:
    """Operators of one layer of `kind` ('dense' or 'moe')."""
    mlp = moe_mlp_operators(model, g) if kind == "moe" else dense_mlp_operators(model, g)
    return attention_operators(model, g) + mlp


# ------------------------------------------------------------------ collectives


def layer_collectives(model: ModelSpec, g: Geometry, kind: str) -> list[Coll]:
    """Collectives of one layer per micro-batch, each with the passes it runs in (§3)."""
    h = model.hidden_size
    T, dt = g.tokens, g.dt
    act = T * h * dt  # the full (TP-gathered) activation of this CP rank
    one = np.ones_like(T)
    out: list[Coll] = []
    tp_on = g.t > 1
    # TP: with SP an all-gather before each block and a reduce-scatter after (and mirrored in
    # backward); without SP an all-reduce after each block in each pass.
    blocks = 2.0 if kind == "dense" or model.num_shared_experts else 1.0
    out.append(Coll(name="tp_ag_or_ar", parallel="tp", kind=np.where(g.sp, ALL_GATHER, ALL_REDUCE), bytes=act,
                    group_size=g.t, stride=one, count=np.where(tp_on, blocks, 0.0)))
    out.append(Coll(name="tp_rs", parallel="tp", kind=REDUCE_SCATTER, bytes=act, group_size=g.t, stride=one,
                    count=np.where(g.sp & tp_on, blocks, 0.0)))
    # CP ring attention: c−1 steps, each sending this rank's K and V (forward) and K, V, dK, dV
    # (backward) to the next rank
    if model.is_mla:
        kv_el = model.num_attention_heads * (model.qk_head_dim + model.v_dim)
    else:
        kv_el = 2.0 * model.num_kv_heads * model.kv_channels
    step = T * kv_el / g.t * dt
    cp_steps = np.maximum(g.c - 1.0, 0.0)
    out.append(Coll(name="cp_kv_fwd", parallel="cp", kind=P2P, bytes=step, group_size=g.c, stride=g.t,
                    count=cp_steps, passes="fwd"))
    out.append(Coll(name="cp_kv_bwd", parallel="cp", kind=P2P, bytes=2.0 * step, group_size=g.c, stride=g.t,
                    count=cp_steps, passes="bwd"))
    if kind == "moe":
        k = model.experts_per_token
        tok = T / g.sp_div
        ep_on = np.where(g.e > 1, 2.0, 0.0)  # dispatch + combine
        # the busiest EP rank receives (dispatch) and returns (combine) `load` times the mean
        load = moe_load(model, g)
        out.append(Coll(name="ep_a2a", parallel="ep", kind=ALL_TO_ALL, bytes=tok * k * h * dt * load,
                        group_size=g.e, stride=g.etp, count=ep_on))
        etp_on = np.where(g.etp > 1, 1.0, 0.0)
        for label, ck in (("etp_ag", ALL_GATHER), ("etp_rs", REDUCE_SCATTER)):
            out.append(Coll(name=label, parallel="ep", kind=ck, bytes=tok * k * g.etp * h * dt * load,
                            group_size=g.etp, stride=one, count=etp_on))
    return out


def head_collectives(model: ModelSpec, g: Geometry) -> list[Coll]:
    """The LM head gathers the sequence-parallel input and reduces its input gradient."""
    one = np.ones_like(g.t)
    act = g.tokens * model.hidden_size * g.dt
    return [Coll(name="head_tp", parallel="tp", kind=np.where(g.sp, ALL_GATHER, ALL_REDUCE), bytes=act,
                 group_size=g.t, stride=one, count=np.where(g.t > 1, 1.0, 0.0))]


# ------------------------------------------------------------------ activations


@attrs.frozen(kw_only=True, eq=False)
class SavedActivations:
    """Bytes one layer keeps for backward, per micro-batch per GPU, by what recompute drops."""

    layer_input: FloatArray  #: the layer's input: all that full recompute keeps
    core_attention: FloatArray  #: scores/softmax/dropout or fused-kernel statistics
    other: FloatArray  #: everything else

    @property
    def total(self) -> FloatArray:
        return self.layer_input + self.core_attention + self.other


def saved_activation_bytes(model: ModelSpec, g: Geometry, kind: str) -> SavedActivations:
    """Bytes saved for backward by one layer, from its operators' saved tensors.

    For GPT (MHA, 4h GELU MLP, dropout, unfused attention) this reduces to Korthikanti et
    al.'s ``s·b·h·(34 + 5·a·s/h)`` without TP, ``s·b·h/t·(34 + 5·a·s/h)`` with TP+SP.
    """
    h, a = model.hidden_size, model.num_attention_heads
    T, t, dt = g.tokens, g.t, g.dt
    spd = g.sp_div
    drop = 1.0 if model.dropout else 0.0
    # replicated across TP unless sequence parallel: the two norm inputs (the first is the
    # layer input), the QKV input, the MLP input and the two dropout masks (1 byte/element)
    layer_input = dt * T * h / spd
    replicated = (dt * T * h * 3.0 + drop * 2.0 * T * h) / spd  # norm2 input, QKV input, MLP input, masks
    if model.is_mla:
        dq, dv = model.qk_head_dim, model.v_dim
        qkv = dt * T * a * (2.0 * dq + dv) / t  # Q, K, V after up-projection
        lat = dt * T * (model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim)  # replicated latents
        qkv = qkv + lat
        o_in = dt * T * a * dv / t
        heads = a
    else:
        d = model.kv_channels
        qkv = dt * T * (a * d + 2.0 * model.num_kv_heads * d) / t
        o_in = dt * T * a * d / t
        heads = a
    s_kv, _ = attended_keys(model, g.s)
    scores = T * s_kv * heads / t
    unfused = dt * scores + drop * (scores + dt * scores)  # softmax output, dropout mask and output
    fused = 4.0 * T * heads / t  # fp32 log-sum-exp per query and head
    core = np.where(g.flash, fused, unfused)
    if kind == "moe":
        k, fe = model.experts_per_token, model.moe_ffn_hidden_size
        routed = routed_pairs(model, g)
        swiglu = model.activation is Activation.swiglu
        expert = dt * routed * h + dt * routed * (3.0 if swiglu else 2.0) * fe / g.etp
        router = 4.0 * T / spd * model.num_experts  # fp32 routing probabilities
        shared = 0.0
        if model.num_shared_experts:
            f = model.num_shared_experts * fe
            shared = dt * T * (3.0 if swiglu else 2.0) * f / t
        mlp = expert + router + shared
    else:
        f = model.ffn_hidden_size
        mlp = dt * T * (3.0 if model.activation is Activation.swiglu else 2.0) * f / t
    return SavedActivations(layer_input=layer_input, core_attention=core, other=replicated + qkv + o_in + mlp)


# ------------------------------------------------------------------ parameters


def attention_params(model: ModelSpec) -> tuple[float, float]:
    """(TP-sharded, replicated) parameters of one attention block."""
    h, a = model.hidden_size, model.num_attention_heads
    if model.is_mla:
        dq, dv = model.qk_head_dim, model.v_dim
        rep = h * (model.kv_lora_rank + model.qk_rope_head_dim) + (h * model.q_lora_rank if model.q_lora_rank else 0)
        rep += model.kv_lora_rank + model.q_lora_rank  # latent norms
        q_up = model.q_lora_rank * a * dq if model.q_lora_rank else h * a * dq
        shard = q_up + model.kv_lora_rank * a * (model.qk_nope_head_dim + dv) + a * dv * h
    else:
        d = model.kv_channels
        shard = h * (a * d + 2 * model.num_kv_heads * d) + a * d * h
        rep = 0.0
    return float(shard), float(rep + 2 * h)  # + two norms


def mlp_params(model: ModelSpec, ffn: int) -> float:
    return float((3 if model.activation is Activation.swiglu else 2) * model.hidden_size * ffn)


def layer_params(model: ModelSpec, kind: str) -> dict[str, float]:
    """Parameters of one layer: TP-sharded, replicated, and expert (EP×ETP-sharded)."""
    shard, rep = attention_params(model)
    if kind == "moe":
        expert = model.num_experts * mlp_params(model, model.moe_ffn_hidden_size)
        shard += model.num_shared_experts * mlp_params(model, model.moe_ffn_hidden_size)
        rep += model.hidden_size * model.num_experts
        return {"sharded": shard, "replicated": rep, "expert": expert}
    return {"sharded": shard + mlp_params(model, model.ffn_hidden_size), "replicated": rep, "expert": 0.0}


def total_params(model: ModelSpec) -> dict[str, float]:
    """Whole-model parameter counts: total and active per token."""
    dense, moe = layer_params(model, "dense"), layer_params(model, "moe") if model.is_moe else None
    emb = model.vocab_size * model.hidden_size * (1 if model.tied_embeddings else 2)
    total = emb + model.num_dense_layers * sum(dense.values())
    active = emb + model.num_dense_layers * sum(dense.values())
    if moe:
        total += model.num_moe_layers * sum(moe.values())
        active += model.num_moe_layers * (moe["sharded"] + moe["replicated"]
                                          + moe["expert"] * model.experts_per_token / model.num_experts)
    return {"total": float(total), "active": float(active)}


def model_flops_per_sequence(model: ModelSpec, seq: FloatArray) -> FloatArray:
    """Forward FLOPs of one sequence through the whole model, unsharded.

    Attention counts the full s×s square (the Megatron/PaLM convention behind eq. 3 of
    Narayanan et al.: 72·B·L·s·h²·(1 + s/6h + V/12hL) = 3 × this for GPT), no recompute.
    """
    s = np.asarray(seq, dtype=np.float64)
    one = np.ones_like(s)
    g = Geometry(b=one, s=s, t=one, c=one, e=one, etp=one, dp=one, sp=np.zeros(len(s), bool), dt=2.0 * one,
                 precision=np.zeros(len(s), int), flash=np.zeros(len(s), bool))
    total = np.zeros_like(s)
    # each MTP module is one more transformer layer of the model's (last) layer type, plus a head
    mtp_kind = "moe" if model.is_moe else "dense"
    counts = {"dense": model.num_dense_layers, "moe": model.num_moe_layers}
    counts[mtp_kind] += model.num_mtp_layers
    for kind, count in counts.items():
        if not count:
            continue
        for op in layer_operators(model, g, kind):
            if np.all(np.asarray(op.kind) == GEMM):
                total += count * np.asarray(op.flops)
    total += 2.0 * s * model.hidden_size * model.vocab_size * (1 + model.num_mtp_layers)
    return total


def precision_name(code) -> str:
    return PRECISIONS[int(code)]


# ------------------------------------------------------------------ selective recompute modules

#: Megatron-Core's ``--recompute-modules`` (``--recompute-granularity selective``; default
#: ``core_attn``). ``moe_act``, ``layernorm`` and ``mla_up_proj`` use output-discarding
#: checkpointing (the module's output is dropped and re-made from its kept input before the
#: consumer's backward); ``core_attn``, ``mlp``, ``moe`` and ``shared_experts`` checkpoint the
#: whole submodule (only its input is kept).
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")


def _mlp_factor(model: ModelSpec) -> float:
    """Elements an MLP keeps per hidden unit: fc1 output (2 with SwiGLU's gate) + activation output."""
    return 3.0 if model.activation is Activation.swiglu else 2.0


def module_saved_bytes(model: ModelSpec, g: Geometry, kind: str, module: str) -> FloatArray:
    """Bytes of :func:`saved_activation_bytes` that recomputing Megatron module `module` drops
    (one layer of `kind`, per micro-batch per GPU; 0 where the module is absent).

    - ``core_attn``: the attention core's tensors (``SavedActivations.core_attention``);
    - ``layernorm``: the outputs of input_layernorm and pre_mlp_layernorm, i.e. the QKV input
      and the MLP/MoE input, ``2·dt·T·h/sp``; the norms' inputs stay;
    - ``mla_up_proj`` (MLA only): Q, K, V after the up projections and RoPE,
      ``dt·T·a·(2·d_qk + d_v)/t``; the latents stay;
    - ``mlp`` (dense layers): the MLP's internal tensors, ``dt·T·(3|2)·f/t``;
    - ``moe`` (MoE layers): every MoE tensor but its input (routed-expert, router and shared-
      expert terms);
    - ``moe_act`` (MoE layers): the routed experts' activation output (fc2's input),
      ``dt·T/sp·k·etp·f_e/etp``;
    - ``shared_experts`` (MoE layers with shared experts): ``dt·T·(3|2)·f_s/t``.
    """
    T, t, dt, spd = g.tokens, g.t, g.dt, g.sp_div
    h, a = model.hidden_size, model.num_attention_heads
    z = np.zeros_like(np.asarray(T, dtype=np.float64))
    fe = model.moe_ffn_hidden_size
    if module == "core_attn":
        return saved_activation_bytes(model, g, kind).core_attention
    if module == "layernorm":
        return z + 2.0 * dt * T * h / spd
    if module == "mla_up_proj":
        return z + (dt * T * a * (2.0 * model.qk_head_dim + model.v_dim) / t if model.is_mla else 0.0)
    if module == "mlp":
        return z + (dt * T * _mlp_factor(model) * model.ffn_hidden_size / t if kind == "dense" else 0.0)
    if kind != "moe":
        if module in RECOMPUTE_MODULES:
            return z
        raise ValueError(f"unknown recompute module {module!r}")
    routed = routed_pairs(model, g)
    shared = dt * T * _mlp_factor(model) * model.num_shared_experts * fe / t
    if module == "moe":
        expert = dt * routed * h + dt * routed * _mlp_factor(model) * fe / g.etp
        return expert + 4.0 * T / spd * model.num_experts + shared
    if module == "moe_act":
        return z + dt * routed * fe / g.etp
    if module == "shared_experts":
        return z + shared
    raise ValueError(f"unknown recompute module {module!r}")


def module_operators(model: ModelSpec, g: Geometry, kind: str, module: str) -> list[Op]:
    """Forward operators backward re-runs when Megatron module `module` is recomputed
    (empty where the module is absent); collectives inside the module are not included."""
    if module == "core_attn":
        return [o for o in attention_operators(model, g) if o.group == "core_attn"]
    if module == "layernorm":
        # input_layernorm and pre_mlp_layernorm: each reads and writes T·h/sp elements
        norm = 2.0 * g.tokens * model.hidden_size * g.dt / g.sp_div
        return [_elementwise("input_norm", norm, "norm"), _elementwise("pre_mlp_norm", norm, "norm")]
    if module == "mla_up_proj":
        if not model.is_mla:
            return []
        return [o for o in attention_operators(model, g) if o.name in ("q_up_proj", "q_proj", "kv_up_proj")]
    if module == "mlp":
        return dense_mlp_operators(model, g) if kind == "dense" else []
    if module not in RECOMPUTE_MODULES:
        raise ValueError(f"unknown recompute module {module!r}")
    if kind != "moe":
        return []
    ops = moe_mlp_operators(model, g)
    if module == "moe":
        return ops
    if module == "moe_act":
        return [o for o in ops if o.name == "expert_act"]
    return [o for o in ops if o.name.startswith("shared_expert")]
