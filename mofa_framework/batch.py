"""Struct-of-arrays batches: N candidate configurations, operators and collectives.

A single prediction is a batch of one; a tuning chunk is a batch of a million. All arrays
are 1-D, of the batch's length, read-only; categorical choices are integer codes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs
import numpy as np

from .units import BoolArray, FloatArray, IntArray, frozen_bool, frozen_f64, frozen_i64

PRECISIONS = ("bf16", "fp16", "fp8", "fp4")
#: fused-attention kernel implementations a job can name (``[parallel] attention_kernel``): "auto" is
#: the kernel a Megatron-Core-style framework picks on the GPU (the attention provider resolves it
#: from the profile's ``compute.architecture``); FlashAttention-2 and -3, cuDNN's fused attention,
#: Triton's FlashAttention. Unfused attention is ``flash_attention = false``.
ATTENTION_KERNELS = ("auto", "fa2", "fa3", "cudnn", "triton")


def _f64_or_scalar(x):
    return float(x) if np.ndim(x) == 0 else frozen_f64(x)


def taken(a: np.ndarray, idx) -> np.ndarray:
    """``a[idx]`` read-only: a fresh array nobody else holds, which the frozen converters then
    keep as it is instead of copying it again."""
    if a is None:
        return None
    out = a.take(np.flatnonzero(idx) if np.asarray(idx).dtype == bool else idx, axis=0)
    out.setflags(write=False)
    return out


def distinct_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index of each distinct row's first occurrence, each row's distinct-row id) of a 2-D table,
    the ids in the rows' lexicographic order — as ``np.unique(table, axis=0)`` numbers them, which
    sorts whole rows (0.17 s for DeepSeek-V3's 54,426 structures in the tuner); here one 1-D sort of
    a key per row: a bool table's rows packed into big-endian 64-bit words (≤ 64 columns), a
    numeric one's column value codes in mixed radix (when that fits 63 bits, else ``np.unique``).
    A table in runs of equal rows (a tuner's leaf batch, sorted by structure) sorts only its runs'
    heads. The tuner's structures, the engine's stage placements and the GEMM table's shapes use it."""
    n, width = table.shape
    if n > 64:  # rows in runs of equal rows (a batch sorted by structure): sort the runs' heads only
        change = np.empty(n, bool)
        change[0] = True
        np.any(table[1:] != table[:-1], axis=1, out=change[1:])
        heads = np.flatnonzero(change)
        if 4 * len(heads) <= n:
            first, ids = distinct_rows(table[heads])
            return heads[first], ids[np.cumsum(change) - 1]
    if table.dtype == bool and width <= 64:
        packed = np.zeros((n, 8), np.uint8)
        packed[:, :(width + 7) // 8] = np.packbits(table, axis=1)
        key = packed.view(">u8").reshape(-1)
    else:
        codes = [np.unique(col, return_inverse=True) for col in table.T]
        if math.prod(len(vals) for vals, _ in codes) >= 2**63:
            _, first, inverse = np.unique(table, axis=0, return_index=True, return_inverse=True)
            return first, inverse.reshape(-1)
        key = np.zeros(n, np.int64)
        for vals, inv in codes:
            key = key * len(vals) + inv.reshape(-1)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


class GatheredOptions(Mapping):
    """A feature's option arrays over rows, gathered from its (options × choices) table at the rows'
    choice indices when an option is first read, then kept: the tuner's batches carry every searched
    feature's options and most phases read a few of them. A read-only mapping of 1-D arrays, like the
    dict it stands for."""

    __slots__ = ("_index", "_table", "_col", "_got")

    def __init__(self, index: Mapping[str, int], table: np.ndarray, col: np.ndarray):
        self._index, self._table, self._col, self._got = index, table, col, {}

    def __getitem__(self, key: str) -> np.ndarray:
        got = self._got.get(key)
        if got is None:
            got = self._table[self._index[key]].take(self._col)
            got.setflags(write=False)
            self._got[key] = got
        return got

    def __contains__(self, key) -> bool:
        return key in self._index

    def __iter__(self):
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def take(self, idx) -> GatheredOptions:
        """The options of rows `idx` (a boolean mask or indices), still gathered on demand."""
        return GatheredOptions(self._index, self._table, taken(self._col, idx))

    @property
    def choice_codes(self) -> tuple[np.ndarray, int]:
        """(each row's choice, the number of choices): rows with equal codes have equal options."""
        return self._col.astype(np.int64), self._table.shape[1]


def _frozen_options(d) -> Mapping:
    if isinstance(d, GatheredOptions):
        return d
    return {k: (v if isinstance(v, np.ndarray) and not v.flags.writeable else np.asarray(v).copy()) for k, v in d.items()}


@attrs.frozen(kw_only=True, eq=False)
class FeatureRows:
    """One feature's on/off flags and option arrays over a batch.

    ``options[name]`` holds numbers, or for a categorical option the index into that
    option's ``choices``; :meth:`choice` tests a categorical value. ``options`` is a read-only
    mapping: a dict, or in the tuner's batches a :class:`GatheredOptions` that reads each option
    when first asked for (read it by key; do not rely on it being a dict).
    """

    enabled: BoolArray = attrs.field(converter=frozen_bool)
    options: Mapping[str, np.ndarray] = attrs.field(factory=dict, converter=_frozen_options)
    choices: Mapping[str, tuple] = attrs.field(factory=dict)

    def choice(self, option: str, value) -> BoolArray:
        """Rows whose categorical `option` equals `value`."""
        return self.options[option] == self.choices[option].index(value)

    def take(self, idx) -> FeatureRows:
        opts = self.options
        opts = opts.take(idx) if isinstance(opts, GatheredOptions) else {k: taken(v, idx) for k, v in opts.items()}
        return FeatureRows(enabled=taken(self.enabled, idx), options=opts, choices=self.choices)


_INT_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "micro_batch_size", "global_batch_size",
               "sequence_length", "precision", "schedule", "first_stage_layers", "last_stage_layers")


@attrs.frozen(kw_only=True, eq=False)
class CandidateBatch:
    """N candidate parallel configurations of one model on one hardware profile."""

    tp: IntArray = attrs.field(converter=frozen_i64)
    pp: IntArray = attrs.field(converter=frozen_i64)
    vpp: IntArray = attrs.field(converter=frozen_i64)
    cp: IntArray = attrs.field(converter=frozen_i64)
    ep: IntArray = attrs.field(converter=frozen_i64)
    etp: IntArray = attrs.field(converter=frozen_i64)
    dp: IntArray = attrs.field(converter=frozen_i64)
    micro_batch_size: IntArray = attrs.field(converter=frozen_i64)
    global_batch_size: IntArray = attrs.field(converter=frozen_i64)
    sequence_length: IntArray = attrs.field(converter=frozen_i64)
    sequence_parallel: BoolArray = attrs.field(converter=frozen_bool)
    #: index into :data:`PRECISIONS`
    precision: IntArray = attrs.field(converter=frozen_i64)
    #: index into the registry's schedules
    schedule: IntArray = attrs.field(converter=frozen_i64)
    #: layers on the first / last pipeline stage; 0 = balanced (Megatron's
    #: --decoder-first/last-pipeline-num-layers)
    first_stage_layers: IntArray = attrs.field(converter=frozen_i64)
    last_stage_layers: IntArray = attrs.field(converter=frozen_i64)
    #: attention kernel: True = fused/flash (no s² scores kept), False = unfused
    flash_attention: BoolArray = attrs.field(converter=frozen_bool)
    features: Mapping[str, FeatureRows] = attrs.field(factory=dict)
    #: index into :data:`ATTENTION_KERNELS` of the fused kernel; None = "auto" on every row
    attention_kernel: IntArray = attrs.field(default=None, converter=lambda x: None if x is None else frozen_i64(x))
    #: packed sequences' mean document length, tokens (THD attention within each document);
    #: 0 = one document per sequence. None = 0 on every row
    document_length: IntArray = attrs.field(default=None, converter=lambda x: None if x is None else frozen_i64(x))

    def __attrs_post_init__(self):
        n = len(self.tp)
        for name in ("attention_kernel", "document_length"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, frozen_i64(np.zeros(n, np.int64)))
        for f in attrs.fields(type(self)):
            if f.name != "features" and len(getattr(self, f.name)) != n:
                raise ValueError(f"batch field {f.name} has length {len(getattr(self, f.name))}, expected {n}")

    def __len__(self) -> int:
        return len(self.tp)

    @property
    def num_gpus(self) -> IntArray:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def num_microbatches(self) -> IntArray:
        """m = B_g / (D·b), micro-batches per DP rank per step (floor; feasibility checks divisibility)."""
        return self.global_batch_size // np.maximum(self.dp * self.micro_batch_size, 1)

    def feature(self, name: str) -> FeatureRows:
        """Rows of `name`; a feature absent from the batch is off everywhere."""
        rows = self.features.get(name)
        if rows is None:
            return FeatureRows(enabled=np.zeros(len(self), bool))
        return rows

    def take(self, idx) -> CandidateBatch:
        idx = np.asarray(idx)
        kw = {f.name: taken(getattr(self, f.name), idx) for f in attrs.fields(type(self)) if f.name != "features"}
        return CandidateBatch(**kw, features={k: r.take(idx) for k, r in self.features.items()})

    @classmethod
    def concat(cls, batches: list[CandidateBatch]) -> CandidateBatch:
        kw = {f.name: np.concatenate([getattr(b, f.name) for b in batches])
              for f in attrs.fields(cls) if f.name != "features"}
        names = sorted({k for b in batches for k in b.features})
        feats = {}
        for name in names:
            parts = [b.feature(name) for b in batches]
            opts = sorted({o for p in parts for o in p.options})
            choices = next((p.choices for p in parts if p.choices), {})
            feats[name] = FeatureRows(
                enabled=np.concatenate([p.enabled for p in parts]),
                options={o: np.concatenate([p.options.get(o, np.zeros(len(p.enabled))) for p in parts]) for o in opts},
                choices=choices,
            )
        return cls(**kw, features=feats)


# ------------------------------------------------------------------ operators and collectives

OP_KINDS = ("gemm", "attention", "elementwise", "scan")
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")


@attrs.frozen(kw_only=True, eq=False)
class OperatorBatch:
    """Flat operator table handed to ``mofa_operator_latency``.

    One row per (operator, candidate): FLOPs and bytes moved on one GPU, the kind (index into
    :data:`OP_KINDS`), the numeric format (index into :data:`~mofa_framework.batch.PRECISIONS`)
    and, for GEMMs, the per-GPU shape M×N×K; for fused attention, queries × keys per query ×
    head dimension (0 for other operators). A ``scan`` (Mamba-2's chunked SSD) is priced as the
    FlashAttention-2 kernel that takes as long: its ``flops`` are that causal attention's work at
    ``gemm_n`` keys per query and head dimension ``gemm_k`` (``decompose.ssd_priced_flops``), not
    the FLOPs the model counts for it.
    """

    flops: FloatArray = attrs.field(converter=frozen_f64)
    bytes: FloatArray = attrs.field(converter=frozen_f64)
    kind: IntArray = attrs.field(converter=frozen_i64)
    precision: IntArray = attrs.field(converter=frozen_i64)
    gemm_m: FloatArray = attrs.field(converter=frozen_f64)
    gemm_n: FloatArray = attrs.field(converter=frozen_f64)
    gemm_k: FloatArray = attrs.field(converter=frozen_f64)
    #: equal GEMMs the row stands for (grouped expert GEMM: E/e); FLOPs and bytes are their
    #: total, the shape is one member's. Scalar 1 (the default) or an array.
    count: FloatArray | float = attrs.field(default=1.0, converter=_f64_or_scalar)
    #: kernel launches per pass of the row. Scalar 1 (the default) or an array.
    kernels: FloatArray | float = attrs.field(default=1.0, converter=_f64_or_scalar)
    #: fused-attention kernel of the row's job (index into :data:`ATTENTION_KERNELS`; 0 = "auto").
    #: Scalar 0 (the default) or an array.
    attention_kernel: IntArray | int = attrs.field(default=0, converter=lambda x: int(x) if np.ndim(x) == 0 else frozen_i64(x))

    def __len__(self) -> int:
        return len(self.flops)


@attrs.frozen(kw_only=True, eq=False)
class CollectiveBatch:
    """Flat collective table handed to ``mofa_collective_latency``.

    ``bytes`` is the full tensor S of the cost model (for all-gather: the gathered size;
    for all-to-all: what one rank sends in all; for p2p: the message). ``group_size`` is n,
    ``nodes`` the scale-up domains the group spans (1 = inside one), ``kind`` an index into
    :data:`COLLECTIVE_KINDS`.
    """

    kind: IntArray = attrs.field(converter=frozen_i64)
    bytes: FloatArray = attrs.field(converter=frozen_f64)
    group_size: IntArray = attrs.field(converter=frozen_i64)
    nodes: IntArray = attrs.field(converter=frozen_i64)

    def __len__(self) -> int:
        return len(self.kind)

    @property
    def intra(self) -> BoolArray:
        return self.nodes <= 1


def sequence_shapes(batch: CandidateBatch) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """The distinct (sequence length, document length) pairs of `batch` and each row's index among them."""
    s, d = np.asarray(batch.sequence_length), np.asarray(batch.document_length)
    if len(s) and (s == s[0]).all() and (d == d[0]).all():  # the usual case: one shape
        return (s[:1].astype(np.float64), d[:1].astype(np.float64)), np.zeros(len(s), np.int64)
    pairs, inv = np.unique(np.stack([s, d]), axis=1, return_inverse=True)
    return (pairs[0].astype(np.float64), pairs[1].astype(np.float64)), np.asarray(inv).reshape(-1)
