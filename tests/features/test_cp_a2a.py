"""Context parallelism by all-to-all (``cp_a2a``): the four all-to-alls of each attention layer and pass,
derived here by hand from the model's heads and priced by the engine's collective provider."""

from __future__ import annotations

import numpy as np
import pytest

from mofa_framework.config import jobs_to_batch
from mofa_framework.decompose import ALL_TO_ALL, Coll
from mofa_framework.engine import price_collectives
from mofa_framework.errors import ConfigError

#: Llama 3 70B (64 heads, 8 KV heads of 128), TP 2, CP 4 inside one 8-GPU node, 32K tokens
JOB = {"model": {"name": "llama3-70b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 64},
       "parallel": {"tp": 2, "pp": 2, "cp": 4, "micro_batch_size": 1, "global_batch_size": 64,
                    "sequence_length": 32768}}


def evaluate(predictor, base, features):
    job = predictor.job({**base, "features": features}, name="j")
    return predictor.evaluate(jobs_to_batch([job], predictor.registry), job.model, job.hardware)


def f0(x) -> float:
    return float(np.asarray(x).ravel()[0])


def test_four_all_to_alls_of_the_local_heads_by_hand(mofa_predictor):
    """T = 32768 / 4 = 8192 tokens per CP rank, t = 2, bf16: Q and O are 8192 · 64·128 / 2 · 2 B =
    67,108,864 B per rank, K and V 8192 · 8·128 / 2 · 2 B = 8,388,608 B; each an all-to-all of the 4
    CP ranks (stride t = 2), the same in both passes, nothing hidden."""
    off = evaluate(mofa_predictor, JOB, {})
    on = evaluate(mofa_predictor, JOB, {"cp_a2a": {}})
    one = np.ones(1)
    colls = [Coll(name=n, parallel="cp", kind=ALL_TO_ALL, bytes=b * one, group_size=4 * one, stride=2 * one)
             for n, b in (("q", 67_108_864), ("k", 8_388_608), ("v", 8_388_608), ("o", 67_108_864))]
    expected = sum(f0(x) for x in price_collectives(off.state.ctx, colls))
    lc = on.state.layers["dense"]
    for field in ("cp_fwd_s", "cp_bwd_s", "cp_exposed_fwd_s", "cp_exposed_bwd_s"):
        assert f0(getattr(lc, field)) == pytest.approx(expected, rel=1e-12), field
    assert f0(off.state.layers["dense"].cp_fwd_s) != pytest.approx(expected)  # the ring priced otherwise
    assert np.array_equal(on.peak_memory_bytes, off.peak_memory_bytes)


def test_all_to_all_beats_the_unhidden_ring_for_many_heads(mofa_predictor):
    """MHA (GPT-3 175B, 96 heads of 128, TP 8, CP 4): the ring sends K and V of its T tokens c − 1 = 3
    times forward (6 units of T·h/t) and twice that backward; the all-to-alls move 3/4 of Q, K, V and O
    (3 units) each pass. With nothing hidden the all-to-all form is cheaper."""
    job = {"model": {"name": "gpt3-175b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 256},
           "parallel": {"tp": 8, "pp": 8, "cp": 4, "micro_batch_size": 1, "global_batch_size": 64,
                        "sequence_length": 16384}}
    ring = mofa_predictor.predict(mofa_predictor.job(job, name="ring"))[0]
    a2a = mofa_predictor.predict(mofa_predictor.job({**job, "features": {"cp_a2a": {}}}, name="a2a"))[0]
    assert a2a.breakdown["cp_comm"] < 0.6 * ring.breakdown["cp_comm"]
    assert a2a.step_time_s < ring.step_time_s


@pytest.mark.parametrize("features, words", [
    ({"cp_a2a": {}}, ("cp_a2a", "num_attention_heads (64)", "KV heads (8)")),  # 8 KV heads over TP 8 × CP 4
    ({"cp_a2a": {}, "cp_overlap": {}}, ("cp_a2a", "cp_overlap")),
])
def test_refused_in_one_line(mofa_predictor, features, words):
    job = {**JOB, "parallel": {**JOB["parallel"], "tp": 8 if "cp_overlap" not in features else 2}}
    with pytest.raises(ConfigError) as e:
        mofa_predictor.predict(mofa_predictor.job({**job, "features": features}, name="bad"))
    assert "\n" not in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


def test_imported_from_megatron_and_written_back(mofa_predictor):
    from mofa_framework.megatron import MegatronArgs, parse_flags

    feat = mofa_predictor.registry.features["cp_a2a"]
    args = MegatronArgs(flags=parse_flags("--cp-comm-type a2a".split()), parallel={"cp": 4})
    assert feat.from_megatron(args) == {} and feat.megatron_args(None) == ["--cp-comm-type", "a2a"]
    assert mofa_predictor.registry.features["cp_overlap"].from_megatron(args) is None  # the ring's overlap: off
    assert feat.from_megatron(MegatronArgs(flags=parse_flags("--cp-comm-type p2p".split()), parallel={"cp": 4})) is None
