"""torchao's measured float8 rowwise speedup over bf16 (``float8_rowwise.toml``), read by ``fp8``.

The table gives, on one GPU architecture, the speedup of a torch.compiled LayerNorm → Linear →
Sigmoid unit, forward and backward, with the linear in torchao's Float8Linear (dynamic rowwise
scaling: the three GEMMs and their quantisation casts) over the same unit in bf16, on a grid of the
forward's M, K, N (input M×K, weight K×N). Between grid points the speedup is interpolated linearly
in (log2 M, log2 K, log2 N); outside the grid it is held at the nearest face (a linear with N = 128,
below the grid's 1024, takes N = 1024's speedup: optimistic for the smallest shards). Not a plugin:
no entry point, no hooks.
"""

from __future__ import annotations

import functools
from importlib import resources

import attrs
import numpy as np

from mofa_framework.config import structure_file, toml_loads


def _axis(_, attribute, value):
    if len(value) < 2 or any(x <= 0 for x in value) or any(b <= a for a, b in zip(value, value[1:])):
        raise ValueError(f"{attribute.name} must be at least two increasing positive sizes (got {value!r})")


def _ints(value) -> tuple[int, ...]:
    return tuple(int(x) for x in value)


def _grid(value) -> tuple:
    return tuple(tuple(tuple(float(x) for x in row) for row in plane) for plane in value)


@attrs.frozen(kw_only=True, eq=False)
class RowwiseTable:
    """Speedups ``speedup[i][j][l]`` at forward M = ``m[i]``, K = ``k[j]``, N = ``n[l]``."""

    architecture: str
    source: str
    m: tuple[int, ...] = attrs.field(converter=_ints, validator=_axis)
    k: tuple[int, ...] = attrs.field(converter=_ints, validator=_axis)
    n: tuple[int, ...] = attrs.field(converter=_ints, validator=_axis)
    speedup: tuple = attrs.field(converter=_grid)

    @speedup.validator
    def _shape(self, attribute, value):
        shape = (len(self.m), len(self.k), len(self.n))
        arr = np.array(value, dtype=np.float64)
        if arr.shape != shape:
            raise ValueError(f"speedup must be an M × K × N grid of shape {shape} (got {arr.shape})")
        if not np.all(arr > 0):
            raise ValueError("every speedup must be > 0")


@functools.cache
def table() -> RowwiseTable:
    with resources.files("mofa_plugins").joinpath("float8_rowwise.toml").open("rb") as fh:
        return structure_file(toml_loads(fh.read().decode()), RowwiseTable, "float8_rowwise.toml")


def _bracket(grid: tuple[int, ...], x) -> tuple[np.ndarray, np.ndarray]:
    """(lower grid index, weight of the upper point) of each x, linear in log2, clamped to the grid."""
    g = np.log2(np.array(grid, dtype=np.float64))
    lx = np.clip(np.log2(np.maximum(np.asarray(x, dtype=np.float64), 1.0)), g[0], g[-1])
    i = np.clip(np.searchsorted(g, lx, side="right") - 1, 0, len(g) - 2)
    return i, (lx - g[i]) / (g[i + 1] - g[i])


def speedup(architecture: str, m, k, n, t: RowwiseTable | None = None) -> np.ndarray | None:
    """The measured speedup over bf16 at each (m, k, n) (arrays broadcast together), or None when
    `architecture` has no table."""
    t = t or table()
    if architecture != t.architecture:
        return None
    m, k, n = np.broadcast_arrays(np.asarray(m, float), np.asarray(k, float), np.asarray(n, float))
    grid = np.array(t.speedup, dtype=np.float64)
    (im, wm), (ik, wk), (i_n, wn) = _bracket(t.m, m), _bracket(t.k, k), _bracket(t.n, n)
    out = np.zeros(m.shape)
    for dm, fm in ((0, 1.0 - wm), (1, wm)):
        for dk, fk in ((0, 1.0 - wk), (1, wk)):
            for dn, fn in ((0, 1.0 - wn), (1, wn)):
                out += fm * fk * fn * grid[im + dm, ik + dk, i_n + dn]
    return out
