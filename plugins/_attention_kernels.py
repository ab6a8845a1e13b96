"""Published attention-kernel benchmarks (``attention_kernels.toml``): how fast each fused-attention
kernel runs relative to FlashAttention-2, by GPU architecture, head dimension, sequence length, mask
and pass. Used by ``profiled_attention`` to move the profile's measured FlashAttention-2 rate to the
job's kernel, sequence and causal mask.

For a kernel k, pass p, head dimension d and sequence s the multiplier on the measured rate is

    m = c(k, p, causal, d, s) / c(fa2, p, causal_ref, d, s_ref)

where c is the published curve on the profile's architecture (interpolated in log2 s, clamped to the
published range; the nearest published head dimension in log2) and (s_ref, causal_ref) where the
profile's table measured FlashAttention-2 (its sequence when it measured one, else s itself: a table
of several sequences carries its own shape). A pass published without a causal mask takes the
forward's causal-over-full ratio at that sequence; one published with the mask only and asked without
it, the prior architecture's FlashAttention-2 forward full-over-causal ratio. A kernel the architecture lacks is priced as
FlashAttention-2 (ratio 1), unless the table names it in ``ratio_from``: a kernel whose code uses no
instruction FlashAttention-2 does not (the 2023 Triton FlashAttention: ``mma.sync`` on every GPU, as
FlashAttention-2) keeps, on an architecture without its curve, its ratio to FlashAttention-2 on the
architecture it was published for, ``c(k) = c(fa2) · c_pub(k) / c_pub(fa2)`` at the same (d, s, mask,
pass), on architectures with FlashAttention-2 curves of their own. An architecture without any curve takes ``prior_architecture``'s FlashAttention-2 shape (the
prior: ratio 1 for every kernel, the shape of the nearest published GPU).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import resources

import attrs
import numpy as np

from mofa_framework.batch import ATTENTION_KERNELS
from mofa_framework.config import structure_file, toml_loads

KERNELS = ATTENTION_KERNELS[1:]  # "auto" is resolved, never published
DIRECTIONS = ("fwd", "bwd")


def _positive(_, attribute, value):
    if not value > 0:
        raise ValueError(f"{attribute.name} must be > 0 (got {value!r})")


@attrs.frozen(kw_only=True)
class KernelPoint:
    """One published bar: a kernel's achieved TFLOPS (causal: counting the FLOPs the mask keeps)."""

    architecture: str
    kernel: str = attrs.field(validator=attrs.validators.in_(KERNELS))
    head_dim: int = attrs.field(validator=_positive)
    seq_len: int = attrs.field(validator=_positive)
    causal: bool
    direction: str = attrs.field(validator=attrs.validators.in_(DIRECTIONS))
    tflops: float = attrs.field(validator=_positive)


@attrs.frozen(kw_only=True)
class KernelSource:
    architecture: str
    text: str


@attrs.frozen(kw_only=True, eq=False)
class KernelTable:
    #: the architecture whose FlashAttention-2 shape an architecture without curves takes
    prior_architecture: str
    points: tuple[KernelPoint, ...] = attrs.field(converter=tuple)
    #: architecture -> the kernel "auto" means there ("default": every other architecture)
    auto: Mapping[str, str] = attrs.field(factory=dict)
    #: kernel -> the architecture whose ratio to FlashAttention-2 it keeps where it has no curve
    ratio_from: Mapping[str, str] = attrs.field(factory=dict)
    source: tuple[KernelSource, ...] = attrs.field(default=(), converter=tuple)

    @auto.validator
    def _auto(self, attribute, value):
        bad = {k: x for k, x in value.items() if x not in KERNELS}
        if bad or "default" not in value:
            raise ValueError(f"auto must map architectures to one of {KERNELS} and name a 'default' (got {value!r})")

    @ratio_from.validator
    def _ratio_from(self, attribute, value):
        arches = {p.architecture for p in self.points if p.kernel == "fa2"}
        bad = {k: a for k, a in value.items() if k not in KERNELS or a not in arches}
        if bad:
            raise ValueError(f"ratio_from must map kernels {KERNELS} to an architecture with FlashAttention-2 "
                             f"curves {sorted(arches)} (got {bad!r})")


@functools.cache
def table() -> KernelTable:
    with resources.files("mofa_plugins").joinpath("attention_kernels.toml").open("rb") as fh:
        return structure_file(toml_loads(fh.read().decode()), KernelTable, "attention_kernels.toml")


def resolve(codes, architecture: str, t: KernelTable | None = None) -> np.ndarray:
    """Kernel codes with "auto" (0) replaced by the architecture's kernel."""
    t = t or table()
    auto = ATTENTION_KERNELS.index(t.auto.get(architecture, t.auto["default"]))
    codes = np.asarray(codes, dtype=np.int64)
    return np.where(codes == 0, auto, codes)


@functools.cache
def _curves(t: KernelTable) -> dict:
    """(architecture, kernel, direction, causal) -> {head_dim: (log2 seq, tflops) sorted by seq}."""
    out: dict = {}
    for p in t.points:
        out.setdefault((p.architecture, p.kernel, p.direction, p.causal), {}).setdefault(p.head_dim, []).append(
            (np.log2(p.seq_len), p.tflops))
    return {k: {d: tuple(np.array(x) for x in zip(*sorted(v))) for d, v in by_d.items()} for k, by_d in out.items()}


def _nearest(by_d: dict, d) -> np.ndarray:
    dims = np.array(sorted(by_d), dtype=np.float64)
    return dims[np.abs(np.log2(np.asarray(d, float))[:, None] - np.log2(dims)[None, :]).argmin(axis=1)]


def _interp(by_d: dict, d, s) -> np.ndarray:
    near = _nearest(by_d, d)
    out = np.empty(len(near))
    for dim in np.unique(near):
        x, y = by_d[int(dim)]
        sel = near == dim
        out[sel] = np.interp(np.log2(np.asarray(s, float)[sel]), x, y)
    return out


def _longest(by_d: dict, d) -> np.ndarray:
    """The longest published sequence of the curve at each element's nearest head dimension."""
    near = _nearest(by_d, d)
    return np.array([2.0 ** by_d[int(dim)][0][-1] for dim in near])


def _causal(by_d: dict, d, s, full_at) -> np.ndarray:
    """A causal curve at (d, s). Inside its published range, interpolated. Past its longest sequence
    s_max the kernel keeps skipping the masked tiles and wastes work only on the diagonal ones,
    whose share of the kept work falls as 1/s: the rate closes its gap to the unmasked rate
    ``full_at(d, s)`` as ``s_max/s`` — ``c(s) = f(s) − (f(s_max) − c(s_max))·s_max/s`` (1M tokens past a
    16K curve: 1.6 % of the 16K gap left) — instead of being held at c(s_max)."""
    s = np.asarray(s, float)
    out = _interp(by_d, d, s)
    s_max = _longest(by_d, d)
    beyond = s > s_max
    if beyond.any():
        d_b, s_b, m_b = np.asarray(d, float)[beyond], s[beyond], s_max[beyond]
        edge, far = full_at(d_b, m_b), full_at(d_b, s_b)
        if edge is not None:  # no unmasked rate to tend to: held at c(s_max)
            gap = np.maximum(edge - out[beyond], 0.0)
            out[beyond] = np.maximum(far - gap * m_b / s_b, out[beyond])
    return out


def curve(t: KernelTable, arch: str, kernel: str, direction: str, causal: bool, d, s) -> np.ndarray | None:
    """The published rate (TFLOPS) at (d, s), or None when the architecture lacks the kernel's pass."""
    c = _curves(t)
    if (arch, kernel, direction, causal) in c:
        by_d = c[arch, kernel, direction, causal]
        if not causal:
            return _interp(by_d, d, s)
        return _causal(by_d, d, s, lambda dd, ss: curve(t, arch, kernel, direction, False, dd, ss))
    if not causal:
        return _full_from_causal(t, c, arch, kernel, direction, d, s)
    full = c.get((arch, kernel, direction, False))
    if full is None:
        return None
    # a pass published without the mask: the forward's causal-over-full ratio (the kernel's, else FA2's)
    for k in (kernel, "fa2"):
        fc, ff = c.get((arch, k, "fwd", True)), c.get((arch, k, "fwd", False))
        if fc and ff:
            return _interp(full, d, s) * _causal(fc, d, s, lambda dd, ss: _interp(ff, dd, ss)) / _interp(ff, d, s)
    return None


def _full_from_causal(t: KernelTable, c: dict, arch: str, kernel: str, direction: str, d, s) -> np.ndarray | None:
    """A pass published with the causal mask only, asked without it: its causal curve times the prior
    architecture's FlashAttention-2 full-over-causal forward ratio at (d, s) (cuDNN's Blackwell
    benchmark publishes causal runs only; the profiles' FlashAttention-2 point is unmasked)."""
    mine = c.get((arch, kernel, direction, True))
    fc, ff = c.get((t.prior_architecture, "fa2", "fwd", True)), c.get((t.prior_architecture, "fa2", "fwd", False))
    if mine is None or not (fc and ff):
        return None
    # held flat past the causal curve's longest sequence, as a published unmasked curve is
    s = np.minimum(np.asarray(s, float), _longest(mine, d))
    return _interp(mine, d, s) * _interp(ff, d, s) / _causal(fc, d, s, lambda dd, ss: _interp(ff, dd, ss))


def shape_architecture(t: KernelTable, arch: str) -> str | None:
    """The architecture whose curves price `arch`: its own, else the prior's (None: no curves at all)."""
    have = {p.architecture for p in t.points if p.kernel == "fa2"}
    return arch if arch in have else (t.prior_architecture if t.prior_architecture in have else None)


def multiplier(codes, architecture: str, direction: str, d, s, s_ref, causal_ref: bool,
               t: KernelTable | None = None) -> np.ndarray:
    """Rate multiplier on a FlashAttention-2 measurement at (s_ref, causal_ref) for causal attention at
    (d, s) with the kernels `codes` (resolved, never "auto"), one pass. Arrays of equal length."""
    t = t or table()
    codes, d, s = np.asarray(codes), np.asarray(d, float), np.asarray(s, float)
    s_ref = np.broadcast_to(np.asarray(s_ref, float), s.shape)
    out = np.ones(len(s))
    arch = shape_architecture(t, architecture)
    if arch is None:
        return out
    ref = curve(t, arch, "fa2", direction, causal_ref, d, s_ref)
    if ref is None:
        return out
    for code in np.unique(codes):
        sel = codes == code
        kernel = ATTENTION_KERNELS[int(code)]
        # a kernel is priced from its own curve only on the architecture it was published for
        num = curve(t, arch, kernel, direction, True, d[sel], s[sel]) if arch == architecture else None
        if num is None:
            num = curve(t, arch, "fa2", direction, True, d[sel], s[sel])
            if arch == architecture:  # onto the GPU's own FA2 curve only; the prior keeps ratio 1
                num = num * _carried_ratio(t, kernel, direction, d[sel], s[sel])
        out[sel] = num / ref[sel]
    return out


def _carried_ratio(t: KernelTable, kernel: str, direction: str, d, s) -> np.ndarray | float:
    """A kernel's causal rate over FlashAttention-2's on the architecture ``ratio_from`` names (1: none)."""
    pub = t.ratio_from.get(kernel)
    own = curve(t, pub, kernel, direction, True, d, s) if pub else None
    fa2 = curve(t, pub, "fa2", direction, True, d, s) if pub else None
    return 1.0 if own is None or fa2 is None else own / fa2
