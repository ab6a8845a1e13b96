"""Rows that share a phase (``mofa_framework/row_groups.py``) and the engine's use of them: grouping is
exact — a batch priced with its rows grouped equals the same batch priced row by row, bit for bit."""

from __future__ import annotations

import attrs
import numpy as np

import mofa_framework.engine as engine
from mofa_framework.row_groups import _key_groups, _value_code
from mofa_framework.tuner import TuneRequest, default_space, every_candidate


def test_key_groups_numbers_groups_in_key_order():
    key = np.array([5, 2, 5, 2, 2, 7])
    first, inverse = _key_groups(key, 8)
    assert inverse.tolist() == [1, 0, 1, 0, 0, 2]  # keys 2, 5, 7 → groups 0, 1, 2
    assert key[first].tolist() == [2, 5, 7]
    assert _key_groups(np.array([0, 1, 2, 3, 3]), 4) is None  # 4 groups of 5 rows: fewer than half repeat


def test_value_codes_tell_apart_every_bit_pattern():
    code, radix = _value_code(np.array([0.0, 1.0, 3.0, 1.0]))  # small whole numbers: themselves
    assert code.tolist() == [0, 1, 3, 1] and radix == 4
    code, _ = _value_code(np.array([0.5, -0.0, 0.0, 0.5]))  # else by bit pattern: −0.0 is not 0.0
    assert code[0] == code[3] and len({code[0], code[1], code[2]}) == 3


def _grid(predictor):
    reg = predictor.registry
    model, hw = reg.model("llama3.1-70b"), reg.hardware_profile("h100-sxm5-80gb")
    space = attrs.evolve(default_space(reg, model, hw, 64, 8192), tp=(8,), pp=(2,), cp=(1, 2), micro_batch_size=(1,))
    req = TuneRequest(model=model, hardware=hw, num_gpus=64, global_batch_size=64, sequence_length=8192, space=space)
    return req, list(every_candidate(predictor, req, chunk_rows=1 << 20))


def test_grouped_rows_price_exactly_as_row_by_row(mofa_predictor, monkeypatch):
    """A flat batch (structures × every feature setting: tens of thousands of rows, features on a few of
    them) priced as the engine prices it — rows sharing the layer and pipeline phases priced once, a
    feature's transform run on its rows alone — equals the same batch with neither, array for array."""
    req, chunks = _grid(mofa_predictor)
    (batch, structure), = chunks
    assert len(batch) >= engine._SUBSET_ROWS

    def run():
        p = mofa_predictor.evaluate(batch, req.model, req.hardware, structure=structure)
        return {"step": p.step_time_s, "peak": p.peak_memory_bytes, "mfu": p.mfu,
                **{f"bd:{k}": v for k, v in p.breakdown.items()}}

    grouped = run()
    monkeypatch.setattr(engine, "layer_rows", lambda *a, **k: None)
    monkeypatch.setattr(engine, "_SUBSET_ROWS", 1 << 62)
    plain = run()
    assert grouped.keys() == plain.keys()
    for k in grouped:
        assert np.array_equal(np.asarray(grouped[k]), np.asarray(plain[k])), k
