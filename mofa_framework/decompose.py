"""Model decomposition (paper §3.2, Table 2): layer → module → operator, after sharding.

For one kind of layer (``ModelSpec.block_kinds``: a mixer — attention, Mamba-2, Mamba,
gated DeltaNet, linear attention — and/or a dense MLP or MoE; see :mod:`mofa_framework.stack`)
and every candidate row, :func:`layer_operators` lists the operators one GPU runs per
micro-batch — forward FLOPs, bytes moved, GEMM shape, how the backward splits into input- and
weight-gradient work — and :func:`layer_collectives` lists the collectives that follow them.
:func:`saved_activation_bytes` derives the bytes each operator keeps for backward from the
tensors it saves (Korthikanti et al. 2022), so GQA, SwiGLU, MoE, MLA, fused attention and the
recurrent mixers need no hard-coded constant. docs/cost-model.md §3 gives every formula.

Everything is vectorised over rows: sizes are float64 arrays of the batch's length.
"""

from __future__ import annotations

import functools

import attrs
import numpy as np

from .batch import PRECISIONS, CandidateBatch
from .stack import BlockSpec
from .types import Activation, ModelSpec
from .units import FloatArray

GEMM, ATTENTION, ELEMENTWISE, SCAN = 0, 1, 2, 3
ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, P2P = 0, 1, 2, 3, 4

#: fused attention backward ≈ 2.5 × forward (it recomputes the scores)
ATTENTION_BWD_FACTOR = 2.5
#: causal attention does about half of the full square's work
CAUSAL_FRACTION = 0.5
#: bytes an unfused softmax/dropout chain moves per score element, in units of the dtype
UNFUSED_SCORE_PASSES = 6.0
#: the longest key sequence Megatron's fused scale-mask-softmax kernel takes (Megatron-LM 2021/22 and
#: Megatron-DeepSpeed, ``megatron/model/fused_softmax.py``; later Megatron-LM raised it to 4,096 and
#: 16,384, but MoFa's unfused attention is that era's)
FUSED_SOFTMAX_MAX_KEYS = 2048
#: the PyTorch softmax Megatron falls back to when its fused kernel cannot run, over the fused kernel:
#: extra bytes per score element (forward, backward) and extra kernels per pass. Forward
#: ``x.float()`` (read 2, write 4 B), ``· scale`` (4 + 4), ``masked_fill_`` (4 + 1 mask + 4),
#: ``Softmax`` (4 + 4), ``.half()`` (4 + 2) = 37 B in 5 kernels against the fused 2 + 2 = 4 B in
#: one; backward the five backwards (6 + 12 + 9 + 8 + 6 = 41 B) against the fused 2 + 2 + 2 = 6 B
SOFTMAX_FALLBACK_BYTES = (37.0 - 4.0, 41.0 - 6.0)
SOFTMAX_FALLBACK_KERNELS = 4.0
#: the chunked scans of the recurrent mixers (Mamba-2's SSD, gated DeltaNet): backward over forward
#: time. **Choice**: as fused attention's, whose kernels they resemble (chunk-wise matmuls that
#: recompute the chunk states in backward)
SCAN_BWD_FACTOR = ATTENTION_BWD_FACTOR


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
    #: the work its time is priced at, when it differs from the FLOPs it counts (``flops``, what
    #: model and hardware FLOPs add up): Mamba-2's SSD scan is priced as the fused attention that
    #: takes as long (:func:`ssd_priced_flops`). None: ``flops``
    priced_flops: FloatArray | None = None


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


def document_tokens(seq, doc) -> FloatArray:
    """A packed sequence's mean document length: `doc`, at most the sequence; `doc` 0 (one document
    per sequence) is the sequence."""
    s = np.asarray(seq, dtype=np.float64)
    d = np.broadcast_to(np.asarray(doc, dtype=np.float64), s.shape)
    return np.where(d > 0, np.minimum(d, s), s)


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
    #: fused-attention kernel (index into ATTENTION_KERNELS; 0 = "auto")
    kernel: np.ndarray | int = 0
    #: packed sequences' mean document length (0 = one document per sequence)
    doc: np.ndarray | float = 0.0

    @functools.cached_property
    def document(self) -> FloatArray:
        """Tokens a fused (THD) attention kernel keeps each query to (:func:`document_tokens`)."""
        return document_tokens(self.s, self.doc)

    @functools.cached_property
    def tokens(self) -> FloatArray:
        """T = b·s/c: tokens of one micro-batch on one CP rank."""
        return self.b * self.s / self.c

    @functools.cached_property
    def sp_div(self) -> FloatArray:
        """Divisor of replicated-by-TP tensors: t with sequence parallelism, else 1."""
        return np.where(self.sp, self.t, 1.0)

    @classmethod
    def unit(cls, seq, flash: bool = False) -> Geometry:
        """One sequence of each length in `seq` on one GPU, nothing sharded (whole-model counts)."""
        s = np.asarray(seq, dtype=np.float64)
        one = np.ones_like(s)
        return cls(b=one, s=s, t=one, c=one, e=one, etp=one, dp=one, sp=np.zeros(len(s), bool), dt=2.0 * one,
                   precision=np.zeros(len(s), int), flash=np.full(len(s), flash))

    @classmethod
    def of(cls, batch: CandidateBatch) -> Geometry:
        f = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
        return cls(b=f(batch.micro_batch_size), s=f(batch.sequence_length), t=f(batch.tp), c=f(batch.cp),
                   e=f(batch.ep), etp=f(batch.etp), dp=f(batch.dp), sp=np.asarray(batch.sequence_parallel),
                   dt=np.full(len(batch), 2.0), precision=np.asarray(batch.precision),
                   flash=np.asarray(batch.flash_attention), kernel=np.asarray(batch.attention_kernel),
                   doc=f(batch.document_length))


def _gemm(name, m, n, k, dt, group, *, bwd_weight=1.0) -> Op:
    m, n, k = (np.asarray(x, dtype=np.float64) for x in np.broadcast_arrays(m, n, k))
    return Op(name=name, kind=GEMM, flops=2.0 * m * n * k, bytes=(m * k + k * n + m * n) * dt,
              m=m, n=n, k=k, bwd_weight=bwd_weight, group=group)


def elementwise_op(name, nbytes, group, *, bwd=1.0, kernels=1.0) -> Op:
    """A memory-bound operator moving `nbytes` per pass (priced by its bytes; ``bwd`` times the
    forward in the input-gradient pass, no weight gradient), launching `kernels` kernels."""
    nbytes = np.asarray(nbytes, dtype=np.float64)
    return Op(name=name, kind=ELEMENTWISE, flops=nbytes / 2.0, bytes=nbytes, bwd_input=bwd, bwd_weight=0.0, group=group,
              kernels=kernels)


_LAYER = BlockSpec()  # attention + dense MLP: the transformer layer


def input_norm(model: ModelSpec, g: Geometry) -> Op:
    """The block's first pre-norm: a norm reads and writes each element once, 2·dt bytes."""
    return elementwise_op("input_norm", 2.0 * g.tokens * model.hidden_size * g.dt / g.sp_div, "norm")


def parallel_block(model: ModelSpec, block: BlockSpec) -> bool:
    """Attention and a dense MLP side by side from one normalised input (``parallel_attention_mlp``)."""
    return model.parallel_attention_mlp and block.is_attention and block.ffn == "dense"


def residual_operator(model: ModelSpec, g: Geometry, block: BlockSpec) -> Op:
    """The rest of a block's norms and residual adds (an add reads 2 and writes 1 element, a norm
    reads and writes 1), with dropout a 1-byte mask per sublayer: mixer + ffn blocks add twice and
    normalise the ffn's input; a lone sublayer adds once (an ffn-only block also normalises). A
    parallel block adds both outputs to its input at once (read 3, write 1) and needs no second
    norm (both sublayers read the first one's output)."""
    T, h, dt = g.tokens, model.hidden_size, g.dt
    hc = hyper_connection_passes(model) * (1.0 if parallel_block(model, block) else float(block.sublayers)) * dt
    if parallel_block(model, block):
        drop = 2.0 if model.dropout else 0.0
        return elementwise_op("residual_norm", (4.0 * dt + drop + hc) * T * h / g.sp_div, "norm")
    if block.sublayers == 2:
        drop = 2.0 if model.dropout else 0.0
        # two residual adds (read 2, write 1), the second norm, and with dropout its 1-byte masks
        return elementwise_op("residual_norm", ((2.0 + 6.0) * dt + drop + hc) * T * h / g.sp_div, "norm")
    drop = 1.0 if model.dropout else 0.0
    norm = 0.0 if block.mixer != "none" else 2.0
    return elementwise_op("residual_norm", ((norm + 3.0) * dt + drop + hc) * T * h / g.sp_div, "norm")


def hyper_connection_passes(model: ModelSpec) -> float:
    """Extra hidden-size passes over memory per sublayer that n residual streams cost
    (hyper-connections, ``hyper_connections`` = n > 1): before the sublayer the streams are read
    and mixed into its input (read n, write 1), after it its output and the streams are mixed back
    (read 1 + n, write n), in place of the plain residual add (read 2, write 1): ``3n − 1``. The
    mixing weights come from a GEMM of the n streams to ``n(n + 2)`` values per token, a few
    hundred FLOPs per element of the streams it reads, priced with them as memory traffic."""
    n = model.hyper_connections
    return 3.0 * n - 1.0 if n > 1 else 0.0


def attention_operators(model: ModelSpec, g: Geometry, block: BlockSpec = _LAYER) -> list[Op]:
    """A transformer layer's attention half with the layer's norms and residual adds (as
    :func:`layer_operators` lays them out for `block`)."""
    return [input_norm(model, g), *attention_mixer_operators(model, g, block), residual_operator(model, g, block)]


def attention_mixer_operators(model: ModelSpec, g: Geometry, block: BlockSpec = _LAYER) -> list[Op]:
    """QKV projections, core attention (by the block's attention type) and the output projection."""
    h, a, kv = model.hidden_size, model.num_attention_heads, model.num_kv_heads
    T, t, dt = g.tokens, g.t, g.dt
    ops = []
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
        gate = a * dq if block.output_gate else 0  # the query projection also yields the output gate
        kv_width = kv_projections(model) * kv * dq
        if model.q_lora_rank:  # a low-rank query (DeepSeek-V4): the down projection replicated, as MLA's
            ops.append(_gemm("q_down_proj", T, model.q_lora_rank, h, dt, "qkv"))
            ops.append(_gemm("q_up_proj", T, (a * dq + gate) / t, model.q_lora_rank, dt, "qkv"))
        if model.q_lora_rank or model.kv_shared:
            if not model.q_lora_rank:
                ops.append(_gemm("q_proj", T, (a * dq + gate) / t, h, dt, "qkv"))
            ops.append(_gemm("kv_proj", T, kv_width / kv_shards(model, g), h, dt, "qkv"))
        else:
            ops.append(_gemm("qkv_proj", T, (a * dq + gate + kv_width) / t, h, dt, "qkv"))
        heads_q, heads_kv = a, kv
    if block.attention == "compressed":
        ops.extend(compressor_operators(model, g, block))
    s_kv, keys_causal = attended_keys(model, g.s, block)
    if np.any(np.asarray(g.doc) > 0):  # packed documents: a fused (THD) kernel keeps each query to its own
        keys_causal = attended_keys(model, g.document, block)[1]
    # core attention: T queries of this CP rank against the whole sequence's keys, causal
    core_flops = 2.0 * T * s_kv * heads_q * (dq + dv) / t
    io = (T * heads_q * (dq + dv) / t + kv_projections(model) * T * heads_kv * (dq + dv) / kv_shards(model, g)) * dt
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
    ops.append(elementwise_op("softmax_dropout", np.where(g.flash, 0.0, score_bytes), "core_attn"))
    torch_softmax = ~g.flash & ~fused_softmax_available(g.b, heads_q / t, g.s / g.c, s_kv)
    fwd_b, bwd_b = SOFTMAX_FALLBACK_BYTES
    ops.append(elementwise_op("softmax_fallback", np.where(torch_softmax, fwd_b * T * s_kv * heads_q / t, 0.0),
                            "core_attn", bwd=bwd_b / fwd_b, kernels=SOFTMAX_FALLBACK_KERNELS))
    if block.output_gate:  # sigmoid(gate) ⊙ attention output: read 2, write 1
        ops.append(elementwise_op("output_gate", 3.0 * T * a * dv / t * dt, "gate"))
    return [*ops, *output_projection(model, g, a * dv)]


def fused_softmax_available(b, heads_per_rank, sq, sk) -> np.ndarray:
    """Whether Megatron's fused scale-mask-softmax kernel runs on the unfused attention's scores
    ``[b, np, sq, sk]`` (``FusedScaleMaskSoftmax``: ``16 < sk ≤`` :data:`FUSED_SOFTMAX_MAX_KEYS`,
    ``sq % 4 == 0`` and ``b·np % 4 == 0``, np the heads on one TP rank); otherwise the scores go
    through PyTorch's softmax in fp32 (:data:`SOFTMAX_FALLBACK_BYTES`). So TP 8 with 16 heads at
    micro-batch 1 (b·np = 2) falls back, while micro-batch 2 does not."""
    b, heads, sq, sk = (np.asarray(x, dtype=np.float64) for x in (b, heads_per_rank, sq, sk))
    return (sk > 16) & (sk <= FUSED_SOFTMAX_MAX_KEYS) & (np.mod(sq, 4.0) == 0) & (np.mod(b * heads, 4.0) == 0)


def kv_projections(model: ModelSpec) -> float:
    """Key and value projections per KV head: 2, or 1 when one serves as both (``kv_shared``)."""
    return 1.0 if model.kv_shared else 2.0


def kv_shards(model: ModelSpec, g: Geometry):
    """What TP divides the key/value heads by: ``t``, or 1 for a shared K = V head, which every TP
    rank computes whole (as MLA's latent; its one head cannot be split)."""
    return 1.0 if model.kv_shared else g.t


def output_projection(model: ModelSpec, g: Geometry, width) -> list[Op]:
    """The attention output (`width` = heads × value dimension) back to the hidden size, row-parallel:
    one GEMM, or with ``o_lora_rank`` DeepSeek-V4's grouped low-rank pair — each of ``o_groups``
    head groups down to ``o_lora_rank`` (``o_groups/t`` equal GEMMs per rank), then all groups'
    latents up to the hidden size."""
    h, T, t, dt = model.hidden_size, g.tokens, g.t, g.dt
    if not model.o_lora_rank:
        return [_gemm("o_proj", T, h, width / t, dt, "proj")]
    groups, rank = float(model.o_groups), float(model.o_lora_rank)
    one = _gemm("o_down_proj", T, rank, width / groups, dt, "proj")
    members = groups / t
    down = attrs.evolve(one, flops=one.flops * members, bytes=one.bytes * members, count=members)
    return [down, _gemm("o_up_proj", T, h, groups * rank / t, dt, "proj")]


def compressor_operators(model: ModelSpec, g: Geometry, block: BlockSpec) -> list[Op]:
    """The pooled keys of a compressed-attention layer (DeepSeek-V4), replicated across TP ranks.

    - ``compress_proj``: one GEMM of the layer input to the pooled values and their gates
      (``2·o·d`` for head dimension d; ``o`` = 2 overlapping windows per pooled key when indexed,
      else 1), and when indexed the indexer's own pooled keys and gates ``2·o·d_i`` and its
      per-head weights ``H_i``;
    - ``compress_pool``: the gated pooling, which reads the projections and writes one key of
      ``d (+ d_i)`` per ``r`` tokens;
    - indexed only: ``index_q_proj`` (the query latent, or the layer input without one, to
      ``H_i·d_i``), ``index_scores`` — ReLU(q·k) of every query against the pooled keys the causal
      mask leaves, ``2·T·H_i·d_i·(s/2r)`` FLOPs, priced as a GEMM of ``T·H_i`` rows by those keys
      by ``d_i`` whose scores are summed over heads in the kernel (fp32 per query and key) —
      and ``index_topk``, the selection, which reads those scores and writes ``index_topk`` indices.
    """
    h, T, dt, s = model.hidden_size, g.tokens, g.dt, g.s
    r, d = float(block.compress_ratio), float(model.kv_channels)
    o = 2.0 if block.indexed else 1.0
    hi = float(model.index_num_heads) if block.indexed else 0.0
    di = float(model.index_head_dim) if block.indexed else 0.0
    width = 2.0 * o * (d + di) + hi
    ops = [_gemm("compress_proj", T, width, h, dt, "qkv"),
           elementwise_op("compress_pool", (T * 2.0 * o * (d + di) + T / r * (d + di)) * dt, "qkv")]
    if not block.indexed:
        return ops
    vis = s / (2.0 * r)  # pooled keys a query sees under the causal mask, on average
    ops.append(_gemm("index_q_proj", T, hi * di, model.q_lora_rank or h, dt, "indexer"))
    ops.append(Op(name="index_scores", kind=GEMM, flops=2.0 * T * hi * di * vis,
                  bytes=(T * hi * di + s / r * di) * dt + 4.0 * T * vis, m=T * hi, n=vis, k=di, group="indexer"))
    ops.append(elementwise_op("index_topk", 4.0 * T * vis + 4.0 * T * np.minimum(model.index_topk, s / r), "indexer"))
    return ops


def attended_keys(model: ModelSpec, s, block: BlockSpec = _LAYER) -> tuple[np.ndarray, np.ndarray]:
    """Keys per query of one layer's core attention: (unfused: the masked score square's width,
    fused causal kernel: keys actually attended), by the block's attention type.

    Full causal attention: ``s`` and ``CAUSAL_FRACTION·s``. A sliding window ``w`` (query i sees
    keys ``max(0, i−w+1)..i``): ``min(s, w)`` and ``w'·(1 − w'/(2s))`` with ``w' = min(s, w)``
    (``s/2`` at ``w = s``). Chunked attention, chunks of ``C`` tokens (query i sees the keys of
    its chunk up to i): ``min(s, C)`` and ``(n·C² + r²)/(2s)`` for ``s = n·C + r`` (``s/2`` at
    ``C ≥ s``). A block whose attention follows the model (``"model"``) is windowed on
    ``sliding_window_layer_fraction`` of the layers and full on the rest (GPT-OSS alternates
    the two): the per-layer costs are the fraction-weighted mix.
    """
    s = np.asarray(s, dtype=np.float64)
    kind = block.attention
    if kind == "full" or (kind == "model" and not model.sliding_window):
        return s, CAUSAL_FRACTION * s
    if kind == "chunked":
        c = float(model.attention_chunk_size)
        n = np.floor(s / c)
        r = s - n * c
        return np.minimum(s, c), (n * c * c + r * r) / (2.0 * np.maximum(s, 1.0))
    f = model.sliding_window_layer_fraction if kind == "model" else 1.0
    w = np.minimum(s, float(model.sliding_window))
    win_causal = w * (1.0 - w / (2.0 * np.maximum(s, 1.0)))
    if kind == "sliding":
        return w, win_causal
    if kind == "compressed":
        width, mean = pooled_keys(model, s, block)
        return w + width, win_causal + mean
    return f * w + (1.0 - f) * s, f * win_causal + (1.0 - f) * CAUSAL_FRACTION * s


def pooled_keys(model: ModelSpec, s, block: BlockSpec) -> tuple[np.ndarray, np.ndarray]:
    """Pooled keys of compressed attention per query: (the most any query sees, the mean over a
    sequence's queries under the causal mask). Query i sees the ``i/r`` keys pooled before it,
    ``s/(2r)`` on average; indexed, at most k = ``index_topk`` of them, so the mean over
    ``i ∈ [0, s)`` of ``min(k, i/r)`` is ``s/(2r)`` while ``s ≤ r·k``, else ``k·(1 − r·k/(2s))``."""
    s = np.asarray(s, dtype=np.float64)
    r = float(block.compress_ratio)
    width, mean = np.floor(s / r), s / (2.0 * r)
    if not block.indexed:
        return width, mean
    k = float(model.index_topk)
    mean = np.where(s <= r * k, mean, k * (1.0 - r * k / (2.0 * np.maximum(s, 1.0))))
    return np.minimum(width, k), mean


def _mlp(name, model: ModelSpec, T, ffn, divisor, dt, group) -> list[Op]:
    h = model.hidden_size
    width = 2.0 if model.activation is Activation.swiglu else 1.0
    act_bytes = (3.0 if model.activation is Activation.swiglu else 2.0) * T * ffn / divisor * dt
    return [
        _gemm(f"{name}_fc1", T, width * ffn / divisor, h, dt, group),
        elementwise_op(f"{name}_act", act_bytes, group),
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
    """Router, permutation, the local experts' grouped GEMMs and the shared expert; with LatentMoE
    (``moe_latent_size`` ℓ) the experts read and write ℓ-wide tokens, a down projection ``h → ℓ``
    runs before dispatch and an up projection ``ℓ → h`` after the combine, on the tokens this GPU
    routes (Megatron-Core's ``fc1_latent_proj`` / ``fc2_latent_proj``)."""
    h, E, k, fe = model.hidden_size, model.num_experts, model.experts_per_token, model.moe_ffn_hidden_size
    w = model.expert_width  # what dispatch moves and the experts read (h without a latent)
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
        elementwise_op("router_topk", 4.0 * 4.0 * tok * E, "router", kernels=ROUTER_KERNELS),
    ]
    if model.moe_latent_size:
        ops.append(_gemm("latent_down_proj", tok, w, h, g.dt, "expert"))
    ops.append(
        # permute: read tok·w, write tok·k·w; un-permute: read tok·k·w (+ probabilities), write tok·w.
        # With EP the received tokens are sorted by local expert once more each way.
        elementwise_op("permute", (4.0 + 4.0 * ep_on * load) * tok * k * w * g.dt, "expert",
                     kernels=PERMUTE_KERNELS + 2.0 * ep_on))
    for name, nn, kk in (("expert_fc1", width * fe / g.etp, w), ("expert_fc2", w, fe / g.etp)):
        op = _gemm(name, per_expert, nn, kk, g.dt, "expert")
        # a grouped GEMM over the local experts: FLOPs add up, each expert's weights are read,
        # and each expert's GEMM runs at the efficiency of its own (smaller) size
        ops.append(attrs.evolve(op, flops=op.flops * local_experts, bytes=op.bytes * local_experts,
                                count=np.broadcast_to(local_experts, np.shape(op.flops)).astype(np.float64)))
    act = (3.0 if model.activation is Activation.swiglu else 2.0) * routed * fe / g.etp * g.dt
    ops.append(elementwise_op("expert_act", act, "expert"))
    if model.moe_latent_size:
        ops.append(_gemm("latent_up_proj", tok, h, w, g.dt, "expert"))
    if model.shared_expert_ffn:
        ops += _mlp("shared_expert", model, g.tokens, model.shared_expert_ffn, g.t, g.dt, "mlp")
    return ops


def embedding_operators(model: ModelSpec, g: Geometry) -> list[Op]:
    return [elementwise_op("embedding", 2.0 * g.tokens * model.hidden_size * g.dt / g.sp_div, "embedding", bwd=2.0)]


def head_operators(model: ModelSpec, g: Geometry) -> list[Op]:
    T, V, h = g.tokens, model.vocab_size, model.hidden_size
    return [
        elementwise_op("final_norm", 2.0 * T * h * g.dt / g.sp_div, "norm"),
        _gemm("lm_head", T, V / g.t, h, g.dt, "head"),
        elementwise_op("cross_entropy", 3.0 * T * V / g.t * 4.0, "head"),
    ]


# ------------------------------------------------------------------ recurrent mixers


def _conv1d(name, T, channels, width, dt) -> Op:
    """A causal depthwise conv1d over `channels`: reads and writes each element (memory-bound),
    2·width FLOPs per element; its backward computes input and weight gradients."""
    T, channels = np.broadcast_arrays(np.asarray(T, dtype=np.float64), np.asarray(channels, dtype=np.float64))
    return Op(name=name, kind=ELEMENTWISE, flops=2.0 * width * T * channels, bytes=2.0 * T * channels * dt,
              bwd_input=1.0, bwd_weight=1.0, group="ssm")


def _scan(name, flops, io_bytes, head_dim) -> Op:
    """A chunked scan (SSD, gated delta rule): tensor-core matmuls over chunks, priced like fused
    attention at its head dimension (Dao & Gu 2024 §6: SSD runs at FlashAttention-2's speed)."""
    flops, io_bytes = np.broadcast_arrays(np.asarray(flops, dtype=np.float64), np.asarray(io_bytes, dtype=np.float64))
    return Op(name=name, kind=ATTENTION, flops=flops, bytes=io_bytes, m=0.0, n=0.0, k=float(head_dim),
              bwd_input=SCAN_BWD_FACTOR, bwd_weight=0.0, group="ssm")


#: the sequence length at which Mamba-2's SSD kernels and FlashAttention-2 take equal time for the
#: same heads and head dimension (Dao & Gu 2024, arXiv 2405.21060, §9.3, Fig. 10: SSD is faster
#: than FlashAttention-2 from sequence length 2K on, and its time barely grows with the state size)
SSD_ATTENTION_CROSSOVER_SEQ = 2048.0


def ssd_priced_flops(model: ModelSpec, T, t):
    """The work Mamba-2's SSD scan is priced at, per micro-batch and GPU: the causal fused attention
    that takes as long (the published crossover, :data:`SSD_ATTENTION_CROSSOVER_SEQ` = L*), i.e.
    ``T·H/t · 2·P·L*`` — per query and head 2·P FLOPs for each of QKᵀ and PV over L*/2 keys on
    average — at the SSD's head dimension P, priced from the hardware's FlashAttention-2
    measurements (the kernel the crossover was measured against). The scan's own FLOPs
    (:func:`ssd_flops_per_token`: 53 k per token and head for Nemotron-H's P = 64, N = 128,
    Q = 128) are a fifth of that: its five Triton kernels (chunk cumsum, C·Bᵀ, chunk states, state
    passing, chunk scan) run small per-chunk matmuls with fp32 intermediates, far below
    attention's rate, which the crossover measures as a whole."""
    _, H, P, _, _ = mamba2_dims(model)
    return np.asarray(T, dtype=np.float64) * H / t * 2.0 * P * SSD_ATTENTION_CROSSOVER_SEQ


def mamba2_dims(model: ModelSpec) -> tuple[int, int, int, int, int]:
    """(d_inner, heads H, head dim P, groups G, state N) of a Mamba-2 mixer."""
    return model.mamba_inner_size, model.mamba_heads, model.mamba_head_dim, model.mamba_num_groups, \
        model.mamba_state_size


def ssd_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of Mamba-2's chunked SSD scan, unsharded (Dao & Gu 2024, §6):
    within each chunk of Q tokens C·Bᵀ (Q·N per token and group) and (C·Bᵀ ∘ L)·X (Q·P per token
    and head), and per head the chunk states Bᵀ·X and their output C·h (P·N each):
    ``2·(Q·G·N + Q·H·P + 2·H·P·N)``. Passing the states between chunks (H·P·N per chunk) is left out."""
    _, H, P, G, N = mamba2_dims(model)
    Q = model.mamba_chunk_size
    return 2.0 * (Q * G * N + Q * H * P + 2.0 * H * P * N)


def _ssd_scan(model: ModelSpec, T, t, io) -> Op:
    """The SSD scan: its FLOPs counted (:func:`ssd_flops_per_token`), its time that of causal
    FlashAttention-2 at L* keys (:func:`ssd_priced_flops`, ``n`` = L*/2 keys per query on
    average, ``k`` = P), or of its bytes if those take longer."""
    op = _scan("ssd_scan", T * ssd_flops_per_token(model) / t, io, model.mamba_head_dim)
    shape = np.shape(op.flops)
    return attrs.evolve(op, kind=SCAN, n=np.full(shape, SSD_ATTENTION_CROSSOVER_SEQ / 2.0),
                        priced_flops=np.broadcast_to(ssd_priced_flops(model, T, t), shape).astype(np.float64))


def mamba2_operators(model: ModelSpec, g: Geometry) -> list[Op]:
    """Megatron-Core's MambaMixer (Nemotron-H): in_proj to z, x, B, C, dt; causal conv1d over x, B,
    C; the SSD scan; the gated RMSNorm; out_proj. TP shards heads and groups (column-parallel
    in_proj, row-parallel out_proj)."""
    h, T, t, dt = model.hidden_size, g.tokens, g.t, g.dt
    di, H, P, G, N = mamba2_dims(model)
    xbc = di + 2 * G * N
    io = T * (xbc + H + di) / t * dt  # x, B, C, dt in; y out
    # the chunked kernels' fp32 intermediates (mamba_ssm's ssd_combined): the chunk states, written by
    # the chunk-state kernel, read and rewritten by state passing, read by the chunk scan (4 passes),
    # and C·Bᵀ per chunk and group, written and read (2 passes)
    io = io + (4.0 * 4.0 * np.ceil(T / model.mamba_chunk_size) * H * P * N + 2.0 * 4.0 * T * model.mamba_chunk_size * G) / t
    return [
        _gemm("mamba_in_proj", T, (di + xbc + H) / t, h, dt, "qkv"),
        _conv1d("mamba_conv1d", T, xbc / t, model.mamba_conv_kernel, dt),
        _ssd_scan(model, T, t, io),
        elementwise_op("mamba_gated_norm", 3.0 * T * di / t * dt, "ssm"),  # reads y and z, writes
        _gemm("mamba_out_proj", T, h, di / t, dt, "proj"),
    ]


#: FLOPs of Mamba-1's selective scan per element of d_inner and of the state (Gu & Dao 2023, §3.3.2:
#: the scan's 9·B·L·D·N FLOPs)
SELECTIVE_SCAN_FLOPS = 9.0


def mamba_operators(model: ModelSpec, g: Geometry) -> list[Op]:
    """Mamba-1 (Jamba): in_proj to x and z, causal conv1d, x_proj to Δ, B, C, dt_proj, the selective
    scan (a fused, memory-bound kernel: 9·d_inner·N FLOPs per token, priced by the bytes it moves),
    out_proj. TP shards d_inner."""
    h, T, t, dt = model.hidden_size, g.tokens, g.t, g.dt
    di, N, R = model.mamba_inner_size, model.mamba_state_size, model.mamba_delta_rank
    scan_io = T * (3.0 * di / t + 2.0 * N) * dt + T * di / t * dt  # x, Δ, z, B, C in; y out
    scan = Op(name="selective_scan", kind=ELEMENTWISE, flops=np.broadcast_to(
        SELECTIVE_SCAN_FLOPS * T * di * N / t, np.shape(scan_io)).astype(np.float64), bytes=scan_io,
        bwd_input=2.0, bwd_weight=0.0, group="ssm")
    return [
        _gemm("mamba_in_proj", T, 2.0 * di / t, h, dt, "qkv"),
        _conv1d("mamba_conv1d", T, di / t, model.mamba_conv_kernel, dt),
        _gemm("mamba_x_proj", T, R + 2.0 * N, di / t, dt, "qkv"),
        _gemm("mamba_dt_proj", T, di / t, R, dt, "qkv"),
        scan,
        _gemm("mamba_out_proj", T, h, di / t, dt, "proj"),
    ]


def linear_attention_dims(model: ModelSpec) -> tuple[int, int, int, int]:
    """(key heads, value heads, key head dim, value head dim) of a linear-attention mixer."""
    return model.linear_num_key_heads, model.linear_num_value_heads, model.linear_key_head_dim, \
        model.linear_value_head_dim


def delta_rule_flops_per_token(model: ModelSpec, delta: bool = True) -> float:
    """Forward FLOPs per token of the chunked (gated) delta rule, unsharded, with chunks of C tokens
    and queries/keys repeated to the Hv value heads (Yang et al. 2024, Gated Delta Networks, §3.3,
    arXiv 2412.06464; the WY representation of DeltaNet). Per chunk and head: K·Kᵀ (2C²·dk), the
    triangular inverse (C³/3), W = A·K and U = A·V (2C²·dk, 2C²·dv), U − W·S (2C·dk·dv), Q·S
    (2C·dk·dv), Q·Kᵀ (2C²·dk), its product with U (2C²·dv) and the state update Kᵀ·U (2C·dk·dv):
    per token ``Hv·(C·(6dk + 4dv) + C²/3 + 6·dk·dv)``. Plain chunked linear attention (``delta =
    False``) keeps Q·Kᵀ, its product with V, Q·S and Kᵀ·V: ``Hv·(2C·(dk + dv) + 4·dk·dv)``."""
    _, hv, dk, dv = linear_attention_dims(model)
    c = float(model.linear_chunk_size)
    if delta:
        return hv * (c * (6.0 * dk + 4.0 * dv) + c * c / 3.0 + 6.0 * dk * dv)
    return hv * (2.0 * c * (dk + dv) + 4.0 * dk * dv)


def linear_attention_operators(model: ModelSpec, g: Geometry, delta: bool = True) -> list[Op]:
    """Gated DeltaNet (Qwen3-Next's linear-attention layers) or plain linear attention: input
    projections to q, k, v, the output gate z (and the delta rule's β and decay a), a causal
    conv1d over q, k, v, the chunked scan, the gated RMSNorm, the output projection. TP shards
    heads."""
    h, T, t, dt = model.hidden_size, g.tokens, g.t, g.dt
    hk, hv, dk, dv = linear_attention_dims(model)
    qk, vv = hk * dk, hv * dv
    io = T * (2 * qk + vv + vv) / t * dt  # q, k, v in; o out
    # flash-linear-attention's chunked kernels write and read the chunk states (2 passes) and, for the
    # delta rule, the fp32 K·Kᵀ blocks A and the WY factors w, u (2 passes each)
    c = model.linear_chunk_size
    io = io + 2.0 * dt * np.ceil(T / c) * hv * dk * dv / t
    if delta:
        io = io + (2.0 * 4.0 * T * c * hv + 2.0 * dt * T * hv * (dk + dv)) / t
    ops = [_gemm("linear_in_proj", T, (2 * qk + 2 * vv) / t, h, dt, "qkv")]
    if delta:
        ops.append(_gemm("linear_beta_decay_proj", T, 2.0 * hv / t, h, dt, "qkv"))
    ops += [
        _conv1d("linear_conv1d", T, (2 * qk + vv) / t, model.linear_conv_kernel, dt),
        _scan("delta_rule_scan" if delta else "linear_attention_scan",
              T * delta_rule_flops_per_token(model, delta) / t, io, dk),
        elementwise_op("linear_gated_norm", 3.0 * T * vv / t * dt, "ssm"),
        _gemm("linear_out_proj", T, h, vv / t, dt, "proj"),
    ]
    return ops


def mixer_operators(model: ModelSpec, g: Geometry, block: BlockSpec) -> list[Op]:
    """The operators of a block's sequence mixer (no norms or residual adds)."""
    if block.mixer == "attention":
        return attention_mixer_operators(model, g, block)
    if block.mixer == "mamba2":
        return mamba2_operators(model, g)
    if block.mixer == "mamba":
        return mamba_operators(model, g)
    if block.mixer in ("gated_deltanet", "linear_attention"):
        return linear_attention_operators(model, g, delta=block.mixer == "gated_deltanet")
    return []


def ffn_operators(model: ModelSpec, g: Geometry, block: BlockSpec) -> list[Op]:
    if block.ffn == "dense":
        return dense_mlp_operators(model, g)
    if block.ffn == "moe":
        return moe_mlp_operators(model, g)
    return []


#: geometries of at most this many rows (a batch's structures) have their layers' operators memoised
_MEMO_ROWS = 256
#: (id of the model, kind, the geometry's bytes) -> (the model, its operators)
_LAYER_OPS: dict[tuple, tuple] = {}


def layer_operators(model: ModelSpec, g: Geometry, kind: str) -> list[Op]:
    """Operators of one layer of `kind` (a key of ``model.block_kinds``; "dense"/"moe" always):
    the mixer's pre-norm and operators, the residual adds and the ffn's norm, the ffn.

    Per-structure geometries (few rows) are decomposed once per process: features ask for the
    same structures' operators chunk after chunk of a search (the operators are values, never
    written in place)."""
    if len(g.b) > _MEMO_ROWS:
        return _layer_operators(model, g, kind)
    key = (id(model), kind, tuple((a.dtype.str, a.shape, a.tobytes()) for a in map(np.asarray, attrs.astuple(
        g, recurse=False))))
    hit = _LAYER_OPS.get(key)
    if hit is None:
        if len(_LAYER_OPS) > 4096:
            _LAYER_OPS.clear()
        hit = _LAYER_OPS[key] = (model, _layer_operators(model, g, kind))  # holding the model keeps its id its own
    return list(hit[1])


def _layer_operators(model: ModelSpec, g: Geometry, kind: str) -> list[Op]:
    block = model.block(kind)
    ops = [input_norm(model, g), *mixer_operators(model, g, block)] if block.mixer != "none" else []
    return [*ops, residual_operator(model, g, block), *ffn_operators(model, g, block)]


# ------------------------------------------------------------------ collectives


def tp_sublayers(model: ModelSpec, block: BlockSpec) -> int:
    """Sublayers of a block whose TP-sharded GEMMs need the gathered activation: the mixer, a dense
    MLP, and an MoE's shared experts (routed experts gather through expert-TP instead). A parallel
    block gathers once for both and reduce-scatters their sum once."""
    if parallel_block(model, block):
        return 1
    return (block.mixer != "none") + (block.ffn == "dense" or (block.ffn == "moe" and model.shared_expert_ffn > 0))


def cp_ring_steps(model: ModelSpec, g: Geometry, block: BlockSpec):
    """Ring-attention steps of one pass: ``c − 1``, fewer where a window or chunk of w keys reaches
    back only ``⌈w·c/s⌉`` CP ranks."""
    steps = np.maximum(g.c - 1.0, 0.0)
    reach = {"sliding": model.sliding_window, "chunked": model.attention_chunk_size}.get(block.attention, 0)
    if reach:
        steps = np.minimum(steps, np.ceil(reach * g.c / g.s))
    return steps


def recurrent_cp_bytes(model: ModelSpec, g: Geometry, block: BlockSpec):
    """Bytes one rank exchanges per pass when CP re-shards a recurrent mixer from sequence to heads
    and back (Megatron-Core's Mamba context parallelism: an all-to-all of the conv/scan inputs
    before the scan and of its output after)."""
    if block.mixer == "mamba2":
        di, H, _, G, N = mamba2_dims(model)
        width = di + 2 * G * N + H + di
    elif block.mixer == "mamba":
        width = 2 * model.mamba_inner_size
    else:
        hk, hv, dk, dv = linear_attention_dims(model)
        width = 2 * hk * dk + 2 * hv * dv + 2 * hv
    return g.tokens * width / g.t * g.dt


def layer_collectives(model: ModelSpec, g: Geometry, kind: str) -> list[Coll]:
    """Collectives of one layer per micro-batch, each with the passes it runs in (§3)."""
    block = model.block(kind)
    h = model.hidden_size
    T, dt = g.tokens, g.dt
    act = T * h * dt  # the full (TP-gathered) activation of this CP rank
    one = np.ones_like(T)
    out: list[Coll] = []
    tp_on = g.t > 1
    # TP: with SP an all-gather before each block and a reduce-scatter after (and mirrored in
    # backward); without SP an all-reduce after each block in each pass.
    blocks = float(tp_sublayers(model, block))
    out.append(Coll(name="tp_ag_or_ar", parallel="tp", kind=np.where(g.sp, ALL_GATHER, ALL_REDUCE), bytes=act,
                    group_size=g.t, stride=one, count=np.where(tp_on, blocks, 0.0)))
    out.append(Coll(name="tp_rs", parallel="tp", kind=REDUCE_SCATTER, bytes=act, group_size=g.t, stride=one,
                    count=np.where(g.sp & tp_on, blocks, 0.0)))
    if block.is_attention:
        # CP ring attention: c−1 steps, each sending this rank's K and V (forward) and K, V, dK, dV
        # (backward) to the next rank
        if model.is_mla:
            kv_el = model.num_attention_heads * (model.qk_head_dim + model.v_dim)
        else:
            kv_el = kv_projections(model) * model.num_kv_heads * model.kv_channels
        step = T * kv_el / (g.t if model.is_mla else kv_shards(model, g)) * dt
        cp_steps = cp_ring_steps(model, g, block)
        out.append(Coll(name="cp_kv_fwd", parallel="cp", kind=P2P, bytes=step, group_size=g.c, stride=g.t,
                        count=cp_steps, passes="fwd"))
        out.append(Coll(name="cp_kv_bwd", parallel="cp", kind=P2P, bytes=2.0 * step, group_size=g.c, stride=g.t,
                        count=cp_steps, passes="bwd"))
    elif block.mixer != "none":
        out.append(Coll(name="cp_a2a", parallel="cp", kind=ALL_TO_ALL, bytes=recurrent_cp_bytes(model, g, block),
                        group_size=g.c, stride=g.t, count=np.where(g.c > 1, 1.0, 0.0)))
    if block.ffn == "moe":
        k = model.experts_per_token
        tok = T / g.sp_div
        ep_on = np.where(g.e > 1, 2.0, 0.0)  # dispatch + combine
        # the busiest EP rank receives (dispatch) and returns (combine) `load` times the mean
        load = moe_load(model, g)
        # LatentMoE dispatches the ℓ-wide latent tokens
        w = model.expert_width
        out.append(Coll(name="ep_a2a", parallel="ep", kind=ALL_TO_ALL, bytes=tok * k * w * dt * load,
                        group_size=g.e, stride=g.etp, count=ep_on))
        etp_on = np.where(g.etp > 1, 1.0, 0.0)
        for label, ck in (("etp_ag", ALL_GATHER), ("etp_rs", REDUCE_SCATTER)):
            out.append(Coll(name=label, parallel="ep", kind=ck, bytes=tok * k * g.etp * w * dt * load,
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
    block = model.block(kind)
    h = model.hidden_size
    T, dt = g.tokens, g.dt
    spd = g.sp_div
    drop = 1.0 if model.dropout else 0.0
    n = block.sublayers
    # replicated across TP unless sequence parallel: the layer input (the first norm's), the other
    # norm inputs, each sublayer's normed input (QKV / mixer input, MLP input) and the dropout masks
    # (1 byte/element) — for a transformer layer norm2 input, QKV input, MLP input and two masks
    layer_input = dt * T * h / spd
    # a parallel block keeps one normed input for both sublayers and has no second norm input
    copies = 1.0 if parallel_block(model, block) else 2.0 * n - 1.0
    replicated = (dt * T * h * copies + drop * float(n) * T * h) / spd
    if model.hyper_connections > 1:
        # n residual streams: each sublayer keeps the streams it mixes and its own output for the
        # mixing's backward; the first sublayer's streams are the layer's input (what full
        # recompute keeps), its mixed input the first norm's input
        streams = float(model.hyper_connections)
        subs = 1.0 if parallel_block(model, block) else float(n)
        replicated = replicated + dt * T * h * ((subs - 1.0) * streams + subs + 1.0) / spd
        layer_input = layer_input * streams
    z = np.zeros_like(np.asarray(T, dtype=np.float64))
    core = z
    other = replicated
    if block.is_attention:
        core, mixer = attention_saved_bytes(model, g, block)
        other = other + mixer[0] + mixer[1]
    elif block.mixer != "none":
        other = other + recurrent_saved_bytes(model, g, block)
    return SavedActivations(layer_input=layer_input, core_attention=core, other=other + ffn_saved_bytes(model, g, block))


def attention_saved_bytes(model: ModelSpec, g: Geometry, block: BlockSpec):
    """(core, (Q/K/V after projection [+ latents], output-projection input [+ gate])) of an
    attention mixer: the core keeps the scores, softmax and dropout (unfused) or the fused
    kernel's fp32 log-sum-exp per query and head."""
    a = model.num_attention_heads
    T, t, dt = g.tokens, g.t, g.dt
    drop = 1.0 if model.dropout else 0.0
    if model.is_mla:
        dq, dv = model.qk_head_dim, model.v_dim
        qkv = dt * T * a * (2.0 * dq + dv) / t  # Q, K, V after up-projection
        lat = dt * T * (model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim)  # replicated latents
        qkv = qkv + lat
        o_in = dt * T * a * dv / t
        heads = a
    else:
        d = model.kv_channels
        qkv = dt * T * (a * d / t + kv_projections(model) * model.num_kv_heads * d / kv_shards(model, g))
        qkv = qkv + dt * T * model.q_lora_rank  # a low-rank query's latent, replicated
        o_in = dt * T * a * d / t
        heads = a
        if block.output_gate:  # the gate and the ungated output, kept by the gating product
            o_in = o_in + 2.0 * dt * T * a * d / t
    o_in = o_in + dt * T * model.o_groups * model.o_lora_rank / t  # the low-rank output's latent
    if block.attention == "compressed":
        qkv = qkv + compressor_saved_bytes(model, g, block)
    s_kv, _ = attended_keys(model, g.s, block)
    scores = T * s_kv * heads / t
    # the softmax output (kept by the fused kernel, and by the probabilities' GEMM without dropout),
    # dropout's mask and output; PyTorch's fallback softmax keeps its own output in fp32 and, without
    # dropout, the GEMM keeps the cast copy
    torch_softmax = ~fused_softmax_available(g.b, heads / t, g.s / g.c, s_kv)
    probs = np.where(torch_softmax, 4.0 + (1.0 - drop) * dt, dt)
    unfused = probs * scores + drop * (scores + dt * scores)
    fused = 4.0 * T * heads / t  # fp32 log-sum-exp per query and head
    return np.where(g.flash, fused, unfused), (qkv, o_in)


def compressor_saved_bytes(model: ModelSpec, g: Geometry, block: BlockSpec):
    """What compressed attention's pooling and indexer keep (replicated across TP): the pooling's
    projections (values and gates) and pooled keys, and when indexed the indexer's query and the
    picked keys' int32 indices per query."""
    T, dt, r = g.tokens, g.dt, float(block.compress_ratio)
    d = float(model.kv_channels) + (float(model.index_head_dim) if block.indexed else 0.0)
    o = 2.0 if block.indexed else 1.0
    saved = dt * T * 2.0 * o * d + dt * g.s / r * d
    if block.indexed:
        saved = saved + dt * T * model.index_num_heads * model.index_head_dim \
            + 4.0 * T * np.minimum(model.index_topk, g.s / r)
    return saved


def recurrent_saved_bytes(model: ModelSpec, g: Geometry, block: BlockSpec):
    """What a recurrent mixer keeps for backward (besides its normed input), TP-sharded.

    - Mamba-2 (mamba_ssm's fused ``mamba_split_conv1d_scan_combined``, Megatron-Core's default):
      the in_proj output z, x, B, C, dt ``(2·d_inner + 2·G·N + H)``, the scan output ``d_inner``
      and the gated norm's fp32 reciprocal RMS per group; the conv output and out_proj input are
      recomputed in backward.
    - Mamba-1 (``mamba_inner_fn``): x and z ``(2·d_inner)``, the conv output, Δ and the scan output
      ``(3·d_inner)``, and x_proj's output ``(R + 2·N)``.
    - gated DeltaNet / linear attention (flash-linear-attention's chunked kernels): the input
      projections ``(2·Hk·dk + 2·Hv·dv [+ 2·Hv])``, the conv output ``(2·Hk·dk + Hv·dv)``, the
      scan output and the out_proj input ``(2·Hv·dv)``, and for the delta rule β and the decay in
      fp32 and the chunk's triangular matrix A ``(Hv·C)``.
    """
    T, t, dt = g.tokens, g.t, g.dt
    if block.mixer == "mamba2":
        di, H, _, G, N = mamba2_dims(model)
        return dt * T * (2.0 * di + 2.0 * G * N + H + di) / t + 4.0 * T * G / t
    if block.mixer == "mamba":
        di = model.mamba_inner_size
        return dt * T * (5.0 * di + model.mamba_delta_rank + 2.0 * model.mamba_state_size) / t
    hk, hv, dk, dv = linear_attention_dims(model)
    qk, vv = hk * dk, hv * dv
    saved = dt * T * (2.0 * qk + 2.0 * vv + (2.0 * qk + vv) + 2.0 * vv) / t
    if block.mixer == "gated_deltanet":
        saved = saved + dt * T * 2.0 * hv / t + 4.0 * T * 2.0 * hv / t + dt * T * hv * model.linear_chunk_size / t
    return saved


def recurrent_state_bytes(model: ModelSpec, g: Geometry, kind: str) -> FloatArray:
    """Transient bytes of a recurrent mixer's chunk states while the layer runs (forward, and again
    in backward, which recomputes them): the fp32 state ``(T/Q)·H·P·N`` at every SSD chunk boundary
    (Mamba-2, chunks of Q tokens; mamba_ssm's ``_chunk_state_fwd``), ``(T/C)·Hv·dk·dv`` for the
    chunked delta rule (flash-linear-attention's ``h``), TP-sharded by heads; 0 for other layers
    (Mamba-1's scan keeps its state on chip)."""
    block = model.block(kind)
    T, t = g.tokens, g.t
    z = np.zeros_like(np.asarray(T, dtype=np.float64))
    if block.mixer == "mamba2":
        _, H, P, _, N = mamba2_dims(model)
        return z + 4.0 * np.ceil(T / model.mamba_chunk_size) * H * P * N / t
    if block.mixer in ("gated_deltanet", "linear_attention"):
        _, hv, dk, dv = linear_attention_dims(model)
        return z + 4.0 * np.ceil(T / model.linear_chunk_size) * hv * dk * dv / t
    return z


def ffn_saved_bytes(model: ModelSpec, g: Geometry, block: BlockSpec):
    """What a block's dense MLP or MoE keeps for backward (besides its normed input)."""
    T, t, dt = g.tokens, g.t, g.dt
    h = model.hidden_size
    if block.ffn == "moe":
        fe = model.moe_ffn_hidden_size
        routed = routed_pairs(model, g)
        swiglu = model.activation is Activation.swiglu
        expert = dt * routed * model.expert_width + dt * routed * (3.0 if swiglu else 2.0) * fe / g.etp
        expert = expert + latent_saved_bytes(model, g)
        router = 4.0 * T / g.sp_div * model.num_experts  # fp32 routing probabilities
        shared = 0.0
        if model.shared_expert_ffn:
            f = model.shared_expert_ffn
            shared = dt * T * (3.0 if swiglu else 2.0) * f / t
        return expert + router + shared
    if block.ffn == "dense":
        f = model.ffn_hidden_size
        return dt * T * (3.0 if model.activation is Activation.swiglu else 2.0) * f / t
    return 0.0


def latent_saved_bytes(model: ModelSpec, g: Geometry):
    """LatentMoE's own saved tensor: the combined ℓ-wide expert output, the up projection's input,
    ``dt·T/sp·ℓ`` (the down projection's input is the block's normed input, its output the
    dispatched tokens already counted); 0 without a latent."""
    return g.dt * g.tokens / g.sp_div * model.moe_latent_size


# ------------------------------------------------------------------ parameters


def attention_params(model: ModelSpec, block: BlockSpec = _LAYER) -> tuple[float, float]:
    """(TP-sharded, replicated) parameters of one attention block (with a transformer layer's
    two norms; :func:`mixer_params` has the attention alone)."""
    shard, rep = mixer_params(model, block)
    return float(shard), float(rep + 2 * model.hidden_size)  # + two norms


def mixer_params(model: ModelSpec, block: BlockSpec) -> tuple[float, float]:
    """(TP-sharded, replicated) parameters of a block's sequence mixer, without the block's norms.

    Mamba-2: in_proj ``h·(2·d_inner + 2·G·N + H)``, conv1d with bias ``(d_inner + 2·G·N)·(K + 1)``,
    A, D and the Δ bias ``3·H``, the gated norm ``d_inner``, out_proj ``d_inner·h``. Mamba-1:
    in_proj ``2·d_inner·h``, conv1d ``d_inner·(K + 1)``, x_proj ``d_inner·(R + 2N)``, dt_proj
    ``(R + 1)·d_inner``, A ``d_inner·N``, D ``d_inner``, out_proj ``d_inner·h``. Gated DeltaNet:
    input projections ``h·(2·Hk·dk + 2·Hv·dv + 2·Hv)``, conv1d ``(2·Hk·dk + Hv·dv)·K``, A and the Δ
    bias ``2·Hv``, out_proj ``Hv·dv·h``, and the gated norm's ``dv`` (replicated; linear attention
    has no β/decay projection, A or Δ bias).
    """
    h, a = model.hidden_size, model.num_attention_heads
    if block.mixer == "attention":
        if model.is_mla:
            dq, dv = model.qk_head_dim, model.v_dim
            rep = h * (model.kv_lora_rank + model.qk_rope_head_dim) + (h * model.q_lora_rank if model.q_lora_rank else 0)
            rep += model.kv_lora_rank + model.q_lora_rank  # latent norms
            q_up = model.q_lora_rank * a * dq if model.q_lora_rank else h * a * dq
            shard = q_up + model.kv_lora_rank * a * (model.qk_nope_head_dim + dv) + a * dv * h
        else:
            d = model.kv_channels
            q_in = model.q_lora_rank or h
            kv_params = h * kv_projections(model) * model.num_kv_heads * d
            shard = q_in * a * d + (0 if model.kv_shared else kv_params)
            shard += q_in * a * d if block.output_gate else 0
            # a low-rank query's down projection and norm, and a shared K = V head, are replicated
            rep = float(h * model.q_lora_rank + model.q_lora_rank + (kv_params if model.kv_shared else 0))
            shard += a * d * model.o_lora_rank + model.o_groups * model.o_lora_rank * h if model.o_lora_rank \
                else a * d * h
        if block.attention == "compressed":
            rep += compressor_params(model, block)
        return shard, rep
    if block.mixer == "mamba2":
        di, H, _, G, N = mamba2_dims(model)
        xbc = di + 2 * G * N
        return h * (di + xbc + H) + xbc * (model.mamba_conv_kernel + 1) + 3 * H + di + di * h, 0.0
    if block.mixer == "mamba":
        di, N, R = model.mamba_inner_size, model.mamba_state_size, model.mamba_delta_rank
        return (2 * di * h + di * (model.mamba_conv_kernel + 1) + di * (R + 2 * N) + (R + 1) * di + di * N + di
                + di * h), 0.0
    if block.mixer in ("gated_deltanet", "linear_attention"):
        hk, hv, dk, dv = linear_attention_dims(model)
        delta = 2 * hv if block.mixer == "gated_deltanet" else 0
        shard = h * (2 * hk * dk + 2 * hv * dv + delta) + (2 * hk * dk + hv * dv) * model.linear_conv_kernel \
            + delta + hv * dv * h
        return shard, float(dv)
    return 0, 0.0


def compressor_params(model: ModelSpec, block: BlockSpec) -> float:
    """Compressed attention's pooling: value and gate projections ``2·o·h·d``, a learned position
    bias per window slot ``o·r·d`` and the pooled keys' norm ``d`` (``o`` = 2 overlapping windows
    when indexed); the indexer adds its own pooling at ``d_i`` and its query ``q·H_i·d_i`` (from
    the query latent q, else the hidden size) and head weights ``h·H_i``."""
    h, r = model.hidden_size, block.compress_ratio
    o = 2 if block.indexed else 1
    dims = [model.kv_channels] + ([model.index_head_dim] if block.indexed else [])
    n = sum(2 * o * h * d + o * r * d + d for d in dims)
    if block.indexed:
        hi = model.index_num_heads
        n += (model.q_lora_rank or h) * hi * model.index_head_dim + h * hi
    return float(n)


def hyper_connection_params(model: ModelSpec) -> float:
    """One sublayer's hyper-connection mixing (n = ``hyper_connections`` streams): the projection
    of the n streams to the ``n(n + 2)`` mixing values ``n·h·n(n + 2)``, their bias ``n(n + 2)``
    and three scales; 0 for a plain residual."""
    n = model.hyper_connections
    return float(n * model.hidden_size * n * (n + 2) + n * (n + 2) + 3) if n > 1 else 0.0


def mlp_params(model: ModelSpec, ffn: int) -> float:
    return float((3 if model.activation is Activation.swiglu else 2) * model.hidden_size * ffn)


def layer_params(model: ModelSpec, kind: str) -> dict[str, float]:
    """Parameters of one layer: TP-sharded, replicated, and expert (EP×ETP-sharded)."""
    key = ("layer_params", kind)
    if key not in model.derived:
        model.derived[key] = _layer_params(model, kind)
    return dict(model.derived[key])


def _layer_params(model: ModelSpec, kind: str) -> dict[str, float]:
    block = model.block(kind)
    shard, rep = mixer_params(model, block)
    shard, rep = float(shard), float(rep + block.sublayers * model.hidden_size)  # + the block's norms
    rep += (1 if parallel_block(model, block) else block.sublayers) * hyper_connection_params(model)
    if block.ffn == "moe":
        mats = 3 if model.activation is Activation.swiglu else 2
        expert = float(model.num_experts * mats * model.expert_width * model.moe_ffn_hidden_size)
        rep += 2.0 * model.hidden_size * model.moe_latent_size  # LatentMoE's down and up projections
        if model.shared_expert_ffn_hidden_size:
            shard += mlp_params(model, model.shared_expert_ffn_hidden_size)
        else:
            shard += model.num_shared_experts * mlp_params(model, model.moe_ffn_hidden_size)
        rep += model.hidden_size * model.num_experts
        return {"sharded": shard, "replicated": rep, "expert": expert}
    if block.ffn == "dense":
        shard = shard + mlp_params(model, model.ffn_hidden_size)
    return {"sharded": shard, "replicated": rep, "expert": 0.0}


def mtp_module_params(model: ModelSpec) -> dict[str, float]:
    """Parameters of one MTP module's weights (DeepSeek-V3 §2.2; Megatron-Core's
    ``MultiTokenPredictionLayer``): its layers, the projection of [embedding; hidden] ``2h·h``
    (TP-sharded) and its three norms ``3h`` (the embedding and output layer are the model's)."""
    h = model.hidden_size
    out = {"sharded": 2.0 * h * h, "replicated": 3.0 * h, "expert": 0.0}
    for kind, n in model.mtp_kind_counts.items():
        for key, value in layer_params(model, kind).items():
            out[key] += n * value
    return out


def total_params(model: ModelSpec) -> dict[str, float]:
    """Whole-model parameter counts: total and active per token (MTP modules not included:
    :func:`mtp_module_params` × ``model.mtp_param_copies``)."""
    emb = model.vocab_size * model.hidden_size * (1 if model.tied_embeddings else 2)
    total = active = emb
    for kind, count in model.kind_counts.items():
        p = layer_params(model, kind)
        total += count * sum(p.values())
        if p["expert"]:
            active += count * (p["sharded"] + p["replicated"] + p["expert"] * model.experts_per_token / model.num_experts)
        else:
            active += count * sum(p.values())
    return {"total": float(total), "active": float(active)}


#: the scans of the recurrent mixers, counted in model FLOPs with the GEMMs
SCAN_OPS = ("ssd_scan", "selective_scan", "delta_rule_scan", "linear_attention_scan")


def _forward_flops_parts(model: ModelSpec, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Forward FLOPs of one sequence per length in `s`: (weight GEMMs with the LM heads, the attention
    core, the recurrent scans and other weightless GEMMs)."""
    g = Geometry.unit(s)
    weights, attention, other = np.zeros_like(s), np.zeros_like(s), np.zeros_like(s)
    for kind, count in model.executed_kind_counts.items():
        for op in layer_operators(model, g, kind):
            if not (np.all(np.asarray(op.kind) == GEMM) or op.name in SCAN_OPS):
                continue
            f = count * np.asarray(op.flops)
            if op.bwd_weight:
                weights += f
            elif op.name == "core_attention":
                attention += f
            else:
                other += f
    weights += 2.0 * s * model.hidden_size * model.vocab_size * (1 + model.num_mtp_layers)
    return weights, attention, other


def forward_flops_split(model: ModelSpec, seq: FloatArray, doc=None) -> tuple[np.ndarray, np.ndarray]:
    """(weight GEMMs, weightless operators) of :func:`model_flops_per_sequence`. Packed documents of
    mean length `doc` (0 or None: one per sequence) count their attention per document: a sequence
    of s tokens is s/d documents, each the full d×d square."""
    s = np.asarray(seq, dtype=np.float64)
    weights, attention, other = _forward_flops_parts(model, s)
    if doc is not None and np.any(np.asarray(doc) > 0):
        d = document_tokens(s, doc)
        attention = np.where(d < s, s / d * _forward_flops_parts(model, d)[1], attention)
    return weights, attention + other


def model_flops_per_sequence(model: ModelSpec, seq: FloatArray, doc=None) -> FloatArray:
    """Forward FLOPs of one sequence through the whole model, unsharded.

    Attention counts the full s×s square (the Megatron/PaLM convention behind eq. 3 of
    Narayanan et al.: 72·B·L·s·h²·(1 + s/6h + V/12hL) = 3 × this for GPT), no recompute; the
    recurrent mixers count their GEMMs and scans. Each MTP module counts its layers
    (``mtp_layer_pattern``, else one of the stack's last kind; ``executed_kind_counts``) and one
    more LM head. With packed documents (`doc`), each document's own square
    (:func:`forward_flops_split`).
    """
    weights, weightless = forward_flops_split(model, seq, doc)
    return weights + weightless


def training_flops_per_sequence(model: ModelSpec, seq: FloatArray, frozen=False, doc=None) -> FloatArray:
    """Model FLOPs of one sequence's training step: forward + backward, 3 × the forward's. Where
    `frozen` (rows that train none of the model's own weights, e.g. LoRA) no weight gradient is
    computed: each weight GEMM counts its forward and input gradient (2×), the weightless
    operators (attention core, scans) still 3× — ``2·F_weights + 3·F_weightless``."""
    weights, weightless = forward_flops_split(model, seq, doc)
    full = 3.0 * (weights + weightless)
    if not np.any(frozen):
        return full
    return np.where(frozen, 2.0 * weights + 3.0 * weightless, full)


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

    - ``core_attn`` (attention blocks): the attention core's tensors (``SavedActivations.core_attention``);
    - ``layernorm``: the outputs of the block's pre-norms (input_layernorm and pre_mlp_layernorm
      in a transformer layer), i.e. each sublayer's normed input, ``n·dt·T·h/sp`` for n sublayers;
      the norms' inputs stay;
    - ``mla_up_proj`` (MLA, and a low-rank query without MLA): Q, K, V after the up projections and
      RoPE, ``dt·T·a·(2·d_qk + d_v)/t`` (a low-rank query: Q, ``dt·T·a·d/t``); the latents stay;
    - ``mlp`` (dense-MLP blocks): the MLP's internal tensors, ``dt·T·(3|2)·f/t``;
    - ``moe`` (MoE blocks): every MoE tensor but its input (routed-expert, router and shared-
      expert terms);
    - ``moe_act`` (MoE blocks): the routed experts' activation output (fc2's input),
      ``dt·T/sp·k·etp·f_e/etp``;
    - ``shared_experts`` (MoE blocks with shared experts): ``dt·T·(3|2)·f_s/t``.
    """
    block = model.block(kind)
    T, t, dt, spd = g.tokens, g.t, g.dt, g.sp_div
    h, a = model.hidden_size, model.num_attention_heads
    z = np.zeros_like(np.asarray(T, dtype=np.float64))
    fe = model.moe_ffn_hidden_size
    if module == "core_attn":
        return saved_activation_bytes(model, g, kind).core_attention
    if module == "layernorm":
        return z + float(block.sublayers) * dt * T * h / spd
    if module == "mla_up_proj":
        if not block.is_attention:
            return z
        if model.is_mla:
            return z + dt * T * a * (2.0 * model.qk_head_dim + model.v_dim) / t
        return z + (dt * T * a * model.kv_channels / t if model.q_lora_rank else 0.0)  # a low-rank query's Q
    if module == "mlp":
        return z + (dt * T * _mlp_factor(model) * model.ffn_hidden_size / t if block.ffn == "dense" else 0.0)
    if block.ffn != "moe":
        if module in RECOMPUTE_MODULES:
            return z
        raise ValueError(f"unknown recompute module {module!r}")
    routed = routed_pairs(model, g)
    if model.shared_expert_ffn_hidden_size:
        shared = dt * T * _mlp_factor(model) * model.shared_expert_ffn_hidden_size / t
    else:
        shared = dt * T * _mlp_factor(model) * model.num_shared_experts * fe / t
    if module == "moe":
        expert = dt * routed * model.expert_width + dt * routed * _mlp_factor(model) * fe / g.etp
        expert = expert + latent_saved_bytes(model, g)
        return expert + 4.0 * T / spd * model.num_experts + shared
    if module == "moe_act":
        return z + dt * routed * fe / g.etp
    if module == "shared_experts":
        return z + shared
    raise ValueError(f"unknown recompute module {module!r}")


def module_operators(model: ModelSpec, g: Geometry, kind: str, module: str) -> list[Op]:
    """Forward operators backward re-runs when Megatron module `module` is recomputed
    (empty where the module is absent); collectives inside the module are not included."""
    block = model.block(kind)
    if module == "core_attn":
        return [o for o in mixer_operators(model, g, block) if o.group == "core_attn"] if block.is_attention else []
    if module == "layernorm":
        # the block's pre-norms (input_layernorm and pre_mlp_layernorm): each reads and writes T·h/sp elements
        norm = 2.0 * g.tokens * model.hidden_size * g.dt / g.sp_div
        names = ("input_norm", "pre_mlp_norm")[:block.sublayers]
        return [elementwise_op(name, norm, "norm") for name in names]
    if module == "mla_up_proj":
        if not (block.is_attention and (model.is_mla or model.q_lora_rank)):
            return []
        names = ("q_up_proj", "q_proj", "kv_up_proj") if model.is_mla else ("q_up_proj",)
        return [o for o in mixer_operators(model, g, block) if o.name in names]
    if module == "mlp":
        return dense_mlp_operators(model, g) if block.ffn == "dense" else []
    if module not in RECOMPUTE_MODULES:
        raise ValueError(f"unknown recompute module {module!r}")
    if block.ffn != "moe":
        return []
    ops = moe_mlp_operators(model, g)
    if module == "moe":
        return ops
    if module == "moe_act":
        return [o for o in ops if o.name == "expert_act"]
    return [o for o in ops if o.name.startswith("shared_expert")]
