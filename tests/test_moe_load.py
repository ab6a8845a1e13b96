"""MoE routing load imbalance (``ModelSpec.moe_load_factor``): the busiest expert-parallel rank
computes, receives and stores `f` times the mean rank's token-expert pairs. Expectations are
derived by hand from the decomposition's formulas."""

import json

import attrs
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import assume, given
from hypothesis import strategies as st

import mofa_framework.cli as mofa_cli
from mofa_framework import Predictor
from mofa_framework.config import jobs_to_batch
from mofa_framework.decompose import Geometry, layer_collectives, layer_operators, saved_activation_bytes
from mofa_framework.errors import ConfigError

PRED = Predictor()


def _geometry(ep: float, etp: float = 1.0) -> Geometry:
    one = np.ones(1)
    return Geometry(b=one, s=np.array([4096.0]), t=one, c=one, e=np.array([ep]), etp=np.array([etp]), dp=8 * one,
                    sp=np.zeros(1, bool), dt=2.0 * one, precision=np.zeros(1, int), flash=np.ones(1, bool))


def _ops(model, g) -> dict:
    return {o.name: o for o in layer_operators(model, g, "moe")}


def test_the_busiest_rank_computes_receives_and_stores_f_times_the_mean():
    base = PRED.registry.model("qwen3-30b-a3b")
    f = 1.5
    heavy = attrs.evolve(base, moe_load_factor=f)
    g = _geometry(ep=8)
    o1, of = _ops(base, g), _ops(heavy, g)
    tok, k, h = 4096.0, base.experts_per_token, base.hidden_size
    for name in ("expert_fc1", "expert_fc2"):
        assert float(of[name].flops[0]) == pytest.approx(f * float(o1[name].flops[0]))
        assert float(of[name].m[0]) == pytest.approx(f * float(o1[name].m[0]))  # each expert's GEMM is taller
    assert float(of["expert_act"].bytes[0]) == pytest.approx(f * float(o1["expert_act"].bytes[0]))
    # permutation: the tokens this rank sends are as many as ever; the ones it receives and sorts are f×
    assert float(of["permute"].bytes[0]) == pytest.approx((4.0 + 4.0 * f) * tok * k * h * 2.0)
    # attention, the router and the other operators are the mean rank's
    for name in o1:
        if name not in ("expert_fc1", "expert_fc2", "expert_act", "permute"):
            assert np.array_equal(np.asarray(of[name].flops), np.asarray(o1[name].flops)), name
    a2a = {c.name: c for c in layer_collectives(heavy, g, "moe")}["ep_a2a"]
    assert float(a2a.bytes[0]) == pytest.approx(f * tok * k * h * 2.0)
    s1, sf = saved_activation_bytes(base, g, "moe"), saved_activation_bytes(heavy, g, "moe")
    routed = tok * k
    assert float(sf.other[0] - s1.other[0]) == pytest.approx((f - 1.0) * 2.0 * routed * (h + 3.0 * base.moe_ffn_hidden_size))


def test_without_expert_parallelism_nothing_changes():
    base = PRED.registry.model("qwen3-30b-a3b")
    g = _geometry(ep=1)
    o1, of = _ops(base, g), _ops(attrs.evolve(base, moe_load_factor=2.0), g)
    for name in o1:
        assert np.array_equal(np.asarray(of[name].flops), np.asarray(o1[name].flops))
        assert np.array_equal(np.asarray(of[name].bytes), np.asarray(o1[name].bytes))


def _job(model: str, f: float, ep: int, tp: int, pp: int, dp: int, features: dict):
    return PRED.job({"model": {"name": model, "moe_load_factor": f},
                     "hardware": {"name": "h100-sxm5-80gb", "num_gpus": tp * pp * dp},
                     "parallel": {"tp": tp, "pp": pp, "ep": ep, "etp": 1, "micro_batch_size": 1,
                                  "global_batch_size": 8 * dp, "sequence_length": 4096},
                     "features": features})


@given(st.sampled_from(["qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3"]), st.floats(1.0, 3.0),
       st.sampled_from([2, 4, 8]), st.sampled_from([1, 2]), st.sampled_from([1, 2, 4]),
       st.sampled_from([{}, {"ep_overlap": {}}, {"fp8": {}, "flex_dispatcher": {}}, {"recompute": {}}]))
def test_imbalance_is_never_faster_and_never_takes_less_memory(model, f, ep, tp, pp, features):
    dp = 8
    try:
        one, heavy = _job(model, 1.0, ep, tp, pp, dp, features), _job(model, f, ep, tp, pp, dp, features)
    except ConfigError:
        assume(False)
    a, b = (PRED.evaluate(jobs_to_batch([j], PRED.registry), j.model, j.hardware) for j in (one, heavy))
    assert b.step_time_s[0] >= a.step_time_s[0] * (1 - 1e-12)
    assert b.peak_memory_bytes[0] >= a.peak_memory_bytes[0] * (1 - 1e-12)
    assert b.model_tflops_per_gpu[0] <= a.model_tflops_per_gpu[0] * (1 + 1e-12)  # the same model FLOPs


def test_cli_flag_and_one_line_errors():
    mofa_cli._builtin_commands()
    flags = ["--model", "qwen3-30b-a3b", "--hardware", "h100-sxm5-80gb", "--gpus", "16", "--ep", "16", "--etp", "1",
             "--gbs", "256", "--seq", "4096", "--format", "json"]
    runner = CliRunner()
    step = {}
    for f in ("1", "1.4"):
        res = runner.invoke(mofa_cli.cli, ["predict", *flags, "--moe-load-factor", f])
        assert res.exit_code == 0, res.output
        step[f] = json.loads(res.stdout)["step_time_s"]
    assert step["1.4"] > step["1"]
    res = runner.invoke(mofa_cli.cli, ["predict", *flags, "--moe-load-factor", "0.9"])
    assert res.exit_code == 2 and "moe_load_factor" in res.output and res.output.strip().count("\n") == 0
