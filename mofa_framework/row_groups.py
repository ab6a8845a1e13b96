"""Which rows of a candidate batch share a phase of the engine: the same structure and the same flags
and options of every feature acting in it (:func:`layer_rows`), then of every pipeline-phase feature
(:func:`pipeline_rows`). The engine prices such rows once and repeats the answer
(:func:`mofa_framework.engine.pipeline_phase`); grouping is exact — rows are grouped only where every
one of those inputs is equal, floats bit for bit — so it changes no number. Pure functions of the
batch and the registry's phase lists.
"""

from __future__ import annotations

import attrs
import numpy as np

from .batch import CandidateBatch, FeatureRows, GatheredOptions
from .types import Phase

#: below this many rows a batch is not grouped (finding its groups costs more than it saves)
MIN_ROWS = 64


def pipeline_rows(batch: CandidateBatch, registry, layer_group: np.ndarray, groups: int):
    """(a row of each group, each row's group) of the rows that share the pipeline phase and the
    schedule's answer: rows of one layer group (`layer_group`, of `groups`; :func:`layer_rows`) with
    the same flags and options of every pipeline-phase feature — what the search's pipeline-level
    nodes share with their leaves (:func:`expand_pipelined`); None when fewer than half repeat."""
    key, bound = layer_group, groups
    for feat in sorted(registry.features_in_phase(Phase.pipeline), key=lambda f: f.name):
        rows = batch.features.get(feat.name)
        if rows is not None:
            for code, radix in _feature_codes(rows):
                key, bound = _combined(key, bound, code, radix)
    return _key_groups(key, bound)


#: a key over rows is compacted to consecutive codes before it could pass this bound (int64 headroom)
_KEY_BOUND = 1 << 62


def layer_rows(batch: CandidateBatch, registry) -> tuple[np.ndarray, np.ndarray] | None:
    """(a row of each group, each row's group) of the rows that share every input of the layer phase
    and the stage sums (:func:`pipeline_phase`'s `layer_key`): the batch's own fields (the structure)
    and the flags and options of every feature acting in the layer phase or freezing weights (which
    the stage sums read); None for a small batch or when fewer than half the rows repeat. Exact: rows
    are grouped only where all of those are equal (floats bit for bit), so sharing changes no number.
    A tuner's flat batch (structures × feature combinations) shares it across the later phases'
    features."""
    n = len(batch)
    if n < MIN_ROWS:
        return None
    key, bound = _structure_runs(batch)
    if 2 * bound > n:
        return None
    names = {f.name for f in registry.features_in_phase(Phase.layer)}
    names |= {f.name for f in registry.features.values() if f.frozen_weights}
    for name in sorted(names):
        rows = batch.features.get(name)
        if rows is None:  # absent: off on every row
            continue
        for code, radix in _feature_codes(rows):
            key, bound = _combined(key, bound, code, radix)
    return _key_groups(key, bound)


def _structure_runs(batch: CandidateBatch) -> tuple[np.ndarray, int]:
    """(run id of each row, number of runs): runs of consecutive rows equal in every field of the
    batch but its features. A flat batch is sorted by structure, so its runs are its structures;
    a structure that comes back later gets a new run (less sharing, never a wrong one)."""
    n = len(batch)
    change = np.zeros(n, bool)
    change[0] = True
    for f in attrs.fields(CandidateBatch):
        if f.name != "features":
            col = getattr(batch, f.name)
            change[1:] |= col[1:] != col[:-1]
    runs = np.cumsum(change) - 1
    return runs, int(runs[-1]) + 1


def _feature_codes(rows: FeatureRows):
    """(code, radix) pairs that tell apart the rows' flags and options where they differ at all:
    the flag; an option table's column (:class:`~mofa_framework.batch.GatheredOptions`), or each
    option that is not one constant (compared bit for bit)."""
    enabled = np.asarray(rows.enabled)
    if enabled.any() and not enabled.all():
        yield enabled.astype(np.int64), 2
    opts = rows.options
    if isinstance(opts, GatheredOptions):
        yield opts.choice_codes
        return
    for value in opts.values():
        value = np.asarray(value)
        if value.ndim != 1:
            value = value.reshape(len(enabled), -1)
            for col in value.T:
                yield _value_code(col)
            continue
        bits = value.view(np.int64) if value.dtype == np.float64 else value
        if not (bits == bits[0]).all():
            yield _value_code(value)


def _value_code(value: np.ndarray) -> tuple[np.ndarray, int]:
    """(code, radix) of one option column: the value itself when it is a small non-negative whole
    number (not −0.0), else its rank among the distinct bit patterns."""
    if value.dtype.kind in "fiub":
        lo, hi = value.min(), value.max()
        if 0 <= lo and hi < 1 << 20:
            code = value.astype(np.int64)
            if value.dtype.kind != "f" or ((code == value).all() and not np.signbit(value).any()):
                return code, int(hi) + 1
    flat = value.view(np.int64) if value.dtype == np.float64 else value
    uniq, inv = np.unique(flat, return_inverse=True)
    return inv.reshape(-1).astype(np.int64), len(uniq)


def _combined(key: np.ndarray, bound: int, code: np.ndarray, radix: int) -> tuple[np.ndarray, int]:
    """The mixed-radix key ``key·radix + code``, compacted first when it would leave int64."""
    if bound * radix >= _KEY_BOUND:
        uniq, key = np.unique(key, return_inverse=True)
        key, bound = key.reshape(-1), len(uniq)
    return key * radix + code, bound * radix


def _key_groups(key: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(a row of each distinct key, each row's group, groups in key order), or None when fewer than
    half the rows repeat. A key below a few times the rows is grouped by a table (no sort)."""
    n = len(key)
    if bound <= 4 * n:
        seen = np.zeros(bound, bool)
        seen[key] = True
        if 2 * int(seen.sum()) > n:
            return None
        ids = np.cumsum(seen) - 1
        inverse = ids[key]
        first = np.empty(int(ids[-1]) + 1, np.int64)
        first[inverse] = np.arange(n)  # any row of a group stands for it: they share every input
        return first, inverse
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    if 2 * len(first) > n:
        return None
    return first, inverse.reshape(-1)
