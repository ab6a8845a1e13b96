"""Data-parallel communication overlap: paper eq. [24].

Megatron reduces gradients and gathers parameters per virtual pipeline chunk
(``--overlap-grad-reduce``, ``--overlap-param-gather``). In the cooldown, the backward of
chunk j hides the gradient reduce-scatter of chunk j+1 (whose gradients are complete); in
the next step's warmup, the forward of chunk j hides the parameter all-gather of chunk j+1.
Only the first all-gather and the last reduce-scatter have nothing to hide behind. With
v = ``pipe.v`` chunks, the DP communication split evenly over them, and per chunk the
compute the critical stage runs between two chunks' collectives — in interleaved 1F1B the
first stage runs one chunk for ``n = min(m, p)`` micro-batches before moving to the next
(warmup forwards, cooldown backwards), so ``n·F`` and ``n·(B+W)`` with F, B, W per chunk::

    T_dp_exposed = AG_1 + RS_v + Σ_{j=1}^{v−1} [max(α·nF, β·AG_j) − nF]
                               + Σ_{j=1}^{v−1} [max(α·n(B+W), β·RS_j) − n(B+W)]

(v = 1: only the last chunk, split into buckets below.)

**Choice** on contention: cost-model.md writes the overlapped term as
``max(0, β·comm − α·compute)``; that lets a larger α (slower compute) *hide more*. Here the
overlapped pair costs ``max(α·compute, β·comm)`` in total like every other overlap, and its
compute is counted elsewhere, so the exposed part is ``max(α·compute, β·comm) − compute``.
The two agree for α = 1; with α = β = 1 the exposed time never exceeds the DP
communication, so the overlap never makes a step slower.

Which collectives:

- with the distributed optimizer (``distributed_optimizer``, or ``cpu_optimizer`` with
  ``shard = true``) ``opt.dp_comm_s`` is reduce-scatter + all-gather; it is split between
  them by bytes: gradients ``d_g`` bytes/parameter (4 with fp32 main grads, 2 with fp16 or
  a bf16 gradient reduction), parameters 2 (1 with ``fp8``'s ``fp8_params``; so RS = 2/3, AG = 1/3
  with fp32 gradients and bf16 parameters); ``fsdp`` rows
  keep only the per-step remainder (embedding, head) here, split the same way;
- without it the DP communication is an all-reduce (= RS + AG of the same gradients, two
  halves) issued per chunk in the cooldown as its gradients complete (Megatron's
  ``--overlap-grad-reduce`` with the plain DDP): the whole all-reduce sits on the cooldown
  side and the warmup side has nothing to hide.

**Buckets of the chunk reduced last** (option ``bucket_size``, parameters per bucket).
Megatron-Core does not reduce a chunk in one piece: its DDP packs gradients into buckets of
``bucket_size`` parameters and launches each bucket's reduce-scatter the moment the bucket's
gradients are complete, i.e. during the backward that produces them (and gathers parameter
buckets one ahead of the forward that needs them). Default 0 = Megatron-Core's own size,
``max(40 M, 1 M × D)`` parameters with D = DP×CP ranks (``distributed_data_parallel.py``, what
``--ddp-bucket-size`` overrides). Bucketing stops at the first model chunk: Megatron turns it off
for chunks 2 onwards, whose reduction hides behind the other chunks anyway (``training.py``:
``disable_bucketing = model_chunk_idx > 0``). So the chunk reduced last — the only chunk at
v = 1 — splits into ``k_l = ⌈P_c / bucket_size⌉`` buckets (``P_c`` its parameters on the critical
stage) that hide behind its own last micro-batch's backward (reduce-scatter side) or the next
step's first forward (all-gather side): one micro-batch of one chunk, X = B + W or F::

    last chunk:  C/k_l + (k_l − 1)·[max(α·X/k_l, β·C/k_l) − X/k_l]        (C = comm / v)

so only the last bucket and what the other buckets' traffic exceeds that backward stay exposed.
A ``bucket_size`` at least a chunk's parameters gives one bucket: the paper's per-chunk eq. [24],
where a plain 1F1B step (v = 1) hides nothing. Torch DDP (``bucket_cap_mb`` 25 MiB) and other
stacks set their own size. The per-bucket collective latency is not re-priced (a bucket moves
tens to hundreds of MB, far above the latency-bound sizes).

Option ``buckets_per_chunk`` (default 1) further splits every chunk's communication and
compute into k equal pieces, the earlier chunks' ``n·X`` included; the last chunk takes
``max(k, k_l)`` buckets. Option ``overlap_param_gather`` (default true, Megatron's
``--overlap-param-gather``): false leaves the all-gather side whole and exposed, as Megatron runs
the parameter gather after the optimizer step without that flag.

Acts in the optimizer phase after ``distributed_optimizer``, ``cpu_optimizer`` and
``kernel_scaling`` (which set and scale ``opt.dp_comm_s``). Rows without DP communication are
left unchanged. Memory is unchanged.
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.types import OverlapStrategy, option
from mofa_plugins._overlap import ContentionOptions, _positive_int, contention, opt
from mofa_plugins.distributed_optimizer import dp_sizes, local_params, param_gather_bytes, reduce_grad_bytes

#: Megatron-Core's default gradient bucket: max(MIN, PER_RANK × DP×CP) parameters
#: (megatron/core/distributed/distributed_data_parallel.py)
MEGATRON_MIN_BUCKET_PARAMS = 40_000_000.0
MEGATRON_BUCKET_PARAMS_PER_RANK = 1_000_000.0
#: the largest bucket a job may name (parameters): beyond any model's chunk
MAX_BUCKET_PARAMS = 1e12


def _bucket_size(inst, attribute, value):
    if not 0.0 <= value <= MAX_BUCKET_PARAMS:
        raise ValueError(f"'{attribute.name}' must be 0 (Megatron-Core's default) or a number of parameters "
                         f"up to {MAX_BUCKET_PARAMS:g}, got {value!r}")


@attrs.frozen(kw_only=True)
class DpOverlapOptions(ContentionOptions):
    buckets_per_chunk: int = option(
        1, validator=_positive_int,
        doc="pieces every virtual chunk's communication and compute split into (1 = the paper's per-chunk overlap)")
    bucket_size: float = option(
        0.0, validator=_bucket_size,
        doc="parameters per gradient/parameter bucket of the chunk reduced last (Megatron --ddp-bucket-size); "
            "0 = Megatron-Core's default max(40 M, 1 M × DP×CP)")
    overlap_param_gather: bool = option(
        True, doc="hide the parameter all-gathers behind the next step's forwards (--overlap-param-gather); "
                  "false: they run exposed after the optimizer step, only the gradient reduction overlaps")


def sharded_rows(batch) -> np.ndarray:
    """Rows whose DP communication is reduce-scatter + all-gather (a distributed optimizer, FSDP)."""
    dist = np.asarray(batch.feature("distributed_optimizer").enabled, bool)
    dist = dist | np.asarray(batch.feature("fsdp").enabled, bool)
    cpu = batch.feature("cpu_optimizer")
    shard = cpu.options.get("shard", np.ones(len(batch)))
    return dist | (np.asarray(cpu.enabled, bool) & (np.asarray(shard) > 0.5))


def side(comm, chunk_compute, last_compute, v, k, k_last, alpha, beta):
    """One side of [24] with buckets: the v − 1 earlier chunks in `k` pieces each hidden behind
    `chunk_compute`/k, the last chunk in `k_last` buckets of which all but one hide behind
    `last_compute`/k_last. k = k_last = 1 is the paper's per-chunk form."""
    c = comm / v

    def hidden(comm_piece, compute_piece):
        return np.maximum(alpha * compute_piece, beta * comm_piece) - compute_piece

    earlier = (v - 1.0) * k * hidden(c / k, chunk_compute / k)
    return earlier + c / k_last + (k_last - 1.0) * hidden(c / k_last, last_compute / k_last)


def last_chunk_buckets(state, rows, k):
    """k_l = ⌈P_c / bucket_size⌉ (at least k) buckets of the chunk reduced last; bucket_size 0 is
    Megatron-Core's max(40 M, 1 M × DP×CP). FSDP rows keep k: their remainder is not bucketed."""
    p_dense, p_expert = local_params(state)
    d_dense, _ = dp_sizes(state)
    size = opt(rows, "bucket_size", 0.0)
    size = np.where(size > 0, size, np.maximum(MEGATRON_MIN_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_RANK * d_dense))
    k_last = np.maximum(k, np.ceil((p_dense + p_expert) / state.pipe.v / size))
    return np.where(np.asarray(state.batch.feature("fsdp").enabled, bool), k, k_last)


def optimizer(state, rows):
    batch, o, pipe = state.batch, state.opt, state.pipe
    alpha, beta = contention(state, rows)
    k = opt(rows, "buckets_per_chunk", 1.0)
    k_last = last_chunk_buckets(state, rows, k)
    grad_bytes = reduce_grad_bytes(batch)
    rs_share = np.where(sharded_rows(batch), grad_bytes / (grad_bytes + param_gather_bytes(batch)), 1.0)
    comm = o.dp_comm_s
    rs, ag = comm * rs_share, comm * (1.0 - rs_share)
    # micro-batches of one chunk the first stage runs back to back between two chunks' collectives
    n = np.where(pipe.v > 1, np.minimum(pipe.m, pipe.p), 1.0)
    bwd = pipe.B + pipe.W
    exposed_rs = side(rs, n * bwd, bwd, pipe.v, k, k_last, alpha, beta)
    hide_ag = opt(rows, "overlap_param_gather", 1.0) > 0.5
    exposed_ag = np.where(ag > 0, np.where(hide_ag, side(ag, n * pipe.F, pipe.F, pipe.v, k, k_last, alpha, beta), ag),
                          0.0)
    exposed = np.where(comm > 0, exposed_rs + exposed_ag, o.dp_exposed_s)
    return attrs.evolve(state, opt=attrs.evolve(o, dp_exposed_s=exposed))


def from_megatron(args):
    """On with ``--overlap-grad-reduce`` or ``--overlap-param-gather`` (Megatron's DDP overlaps; the
    second needs the first, so either turns the reduction's overlap on); without
    ``--overlap-param-gather`` the parameter all-gathers stay exposed. ``--ddp-bucket-size`` sets the
    bucket size (default: Megatron-Core's own)."""
    grad, param = args.has("--overlap-grad-reduce"), args.has("--overlap-param-gather")
    if not (grad or param):
        return None
    out: dict = {} if param else {"overlap_param_gather": False}
    size = args.number("--ddp-bucket-size", None)
    return out if size is None else {**out, "bucket_size": float(size)}


def megatron_args(options) -> list[str]:
    out = ["--overlap-grad-reduce"]
    if getattr(options, "overlap_param_gather", True):
        out.append("--overlap-param-gather")
    size = getattr(options, "bucket_size", 0.0)
    return out + (["--ddp-bucket-size", str(int(size))] if size > 0 else [])


FEATURE = OverlapStrategy(
    name="dp_overlap",
    description="hide gradient reduce-scatters behind cooldown backwards and parameter all-gathers behind "
                "warmup forwards, chunk by chunk (Megatron --overlap-grad-reduce/--overlap-param-gather)",
    equation="[24] T = Σ_{j<v} [max(α·nF, β·AG_j) − nF] + Σ_{j<v} [max(α·n(B+W), β·RS_j) − n(B+W)] + the last "
             "chunk in ⌈P_c/bucket⌉ buckets behind one micro-batch's F (AG) and B+W (RS)",
    options_type=DpOverlapOptions,
    optimizer=optimizer,
    after=("distributed_optimizer", "cpu_optimizer", "fsdp", "kernel_scaling"),
    lowers_memory=(),  # no memory transform
    applies=lambda batch, model, hardware: (batch.dp * batch.cp > 1) | (
        (batch.tp * batch.cp * batch.dp > batch.ep * batch.etp) if model.is_moe else False),
    megatron_args=megatron_args,
    # Megatron-LM asserts "--overlap-param-gather only supported with distributed optimizer, megatron
    # fsdp, or dist_muon" (megatron/training/arguments.py); without them there is no gather to overlap
    megatron_requires={"--overlap-param-gather": ("--use-distributed-optimizer", "--use-megatron-fsdp")},
    from_megatron=from_megatron,
)


@hookimpl
def mofa_register_overlap_strategies():
    return [FEATURE]
