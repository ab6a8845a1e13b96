"""Units: SI inside, human units only at the file boundary, converted once here."""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
import numpy.typing as npt

FloatArray: TypeAlias = npt.NDArray[np.float64]
IntArray: TypeAlias = npt.NDArray[np.int64]
BoolArray: TypeAlias = npt.NDArray[np.bool_]

GIB = 1024**3
GB = 1e9
TERA = 1e12
US = 1e-6
SECONDS_PER_DAY = 86400.0

#: bytes per element of each numeric format the cost model knows
DTYPE_BYTES = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5}


def gib_to_bytes(x: float) -> float:
    return float(x) * GIB


def gbps_to_bytes_per_s(x: float) -> float:
    """GB/s (decimal, as vendors quote them) to bytes per second."""
    return float(x) * GB


def tflops_to_flops_per_s(x: float) -> float:
    return float(x) * TERA


def frozen(x, dtype) -> np.ndarray:
    """Copy `x` into a read-only 1-D array: a plugin that writes into shared input fails loudly."""
    if isinstance(x, np.ndarray) and x.dtype == dtype and not x.flags.writeable and x.ndim == 1:
        return x  # already frozen: nobody can write it, so sharing is safe
    a = np.array(x, dtype=dtype, copy=True)
    if a.ndim == 0:
        a = a.reshape(1)
    a.setflags(write=False)
    return a


def frozen_f64(x) -> FloatArray:
    return frozen(x, np.float64)


def frozen_i64(x) -> IntArray:
    return frozen(x, np.int64)


def frozen_bool(x) -> BoolArray:
    return frozen(x, np.bool_)
