"""Hypothesis properties over the whole job space: every accepted job's outputs are physically
possible, every refused job raises the project's error type and nothing else.

Jobs are drawn from zoo models and random valid-looking architectures (dense, MoE with shared
experts and leading dense layers, MLA, sliding windows, MTP), every hardware profile, random
parallel layouts (TP, PP with uneven end stages, VPP, CP, EP, ETP, micro-batches), precisions,
schedules, and random subsets of every feature with random options. Each example draws a few
layouts of one model on one GPU and predicts them in one engine call
(``testing.contract.feasible_prediction``), so 200 examples per property stay cheap
(≈ 10 s of CPU for the three). ``max_examples`` is set on each test: CI runs 200.
"""

from __future__ import annotations

import attrs
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mofa_framework import Predictor
from mofa_framework.batch import PRECISIONS
from mofa_framework.errors import MofaError
from mofa_framework.invariants import InvariantError
from mofa_framework.manager import MofaPluginManager
from mofa_framework.testing.contract import assert_outputs_possible, feasible_prediction

_PM = MofaPluginManager(strict=False)
_PM.load_entrypoints(builtin_only=True)
PRED = Predictor(pm=_PM)
REG = PRED.registry
EXAMPLES = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))

pow2 = lambda hi: st.sampled_from([2**i for i in range(hi + 1)])  # noqa: E731


@st.composite
def architectures(draw) -> dict:
    """A valid-looking inline [model] table: dense or MoE, GQA or MLA, maybe windowed, maybe MTP."""
    heads = draw(pow2(6))
    kv = draw(st.sampled_from([d for d in (1, 2, 4, 8, heads) if heads % d == 0]))
    head_dim = draw(st.sampled_from([32, 64, 128]))
    layers = draw(st.integers(1, 64))
    m = {"name": "arch", "num_layers": layers, "hidden_size": heads * head_dim, "num_attention_heads": heads,
         "num_kv_heads": kv, "ffn_hidden_size": draw(st.integers(1, 64)) * 128,
         "vocab_size": draw(st.sampled_from([1000, 32000, 128256])),
         "activation": draw(st.sampled_from(["swiglu", "gelu"])), "dropout": draw(st.booleans()),
         "tied_embeddings": draw(st.booleans())}
    if draw(st.booleans()):
        experts = draw(st.sampled_from([2, 4, 8, 16, 64]))
        m.update(num_experts=experts, experts_per_token=draw(st.integers(1, min(experts, 8))),
                 moe_ffn_hidden_size=draw(st.integers(1, 32)) * 64,
                 num_shared_experts=draw(st.integers(0, 2)), first_k_dense_layers=draw(st.integers(0, layers)),
                 moe_load_factor=draw(st.sampled_from([1.0, 1.2, 2.0])))
        if draw(st.booleans()):
            m["num_mtp_layers"] = draw(st.integers(1, 2))
    if draw(st.integers(0, 4)) == 0:
        m.update(kv_lora_rank=512, q_lora_rank=draw(st.sampled_from([0, 1536])), qk_nope_head_dim=128,
                 qk_rope_head_dim=64, v_head_dim=128)
    if draw(st.integers(0, 4)) == 0:
        m.update(sliding_window=draw(st.sampled_from([128, 4096])),
                 sliding_window_layer_fraction=draw(st.sampled_from([0.5, 1.0])))
    if draw(st.integers(0, 5)) == 0:  # a head dimension that does not divide: legal once given
        m["hidden_size"] = heads * head_dim + 8
        m["head_dim"] = head_dim
    return m


def _option_value(draw, f):
    choices = f.metadata.get("choices")
    if choices:
        return draw(st.sampled_from(list(choices)))
    if isinstance(f.default, bool):
        return draw(st.booleans())
    if isinstance(f.default, int):
        return draw(st.sampled_from([f.default, f.default, 1, 2, 4, 8]))
    if isinstance(f.default, float):
        return draw(st.sampled_from([f.default, f.default, 0.5, 1.0, 2.0, 10.0]))
    return f.default


@st.composite
def features(draw, hardware) -> dict:
    usable = [n for n in sorted(REG.features)
              if not (n == "fp8" and "fp8" not in hardware.compute.peak_tflops)
              and not (n == "nvfp4" and "fp4" not in hardware.compute.peak_tflops)]
    names = draw(st.lists(st.sampled_from(usable), max_size=5, unique=True))
    out = {}
    for name in names:
        fields = attrs.fields(REG.features[name].options_type) if attrs.has(REG.features[name].options_type) else ()
        out[name] = {f.name: _option_value(draw, f) for f in fields if draw(st.booleans())}
    return out


def _divisors(n: int, cap: int = 8) -> list[int]:
    return [d for d in (1, 2, 4, 8, 16, 32, 64) if d <= cap and n % d == 0]


@st.composite
def layouts(draw, spec, hardware) -> tuple[dict, int, str | None]:
    """A layout that mostly satisfies the structural rules (heads, experts, layers), sometimes not."""
    tp_ok = spec.num_attention_heads if spec.is_mla else np.gcd(spec.num_attention_heads, spec.num_kv_heads)
    tp_ok = np.gcd(tp_ok, spec.moe_ffn_hidden_size if spec.is_moe and not spec.num_dense_layers else spec.ffn_hidden_size)
    tp = draw(st.sampled_from(_divisors(int(tp_ok))))
    pp = draw(st.sampled_from([p for p in (1, 2, 3, 4, 8) if p <= spec.num_layers]))
    cp, dp = draw(pow2(2)), draw(pow2(4))
    sched = draw(st.none() | st.sampled_from(sorted(REG.schedules))) if pp > 1 else None
    rec = REG.schedules[sched] if sched else None
    vpp = 1
    if pp > 1 and (rec is None or rec.supports_vpp) and (rec is None or not rec.requires_vpp):
        vpp = draw(st.sampled_from([1, 1, 2]))
    if rec is not None and rec.requires_vpp:
        vpp = 2
    ep = draw(st.sampled_from(_divisors(spec.num_experts, 8))) if spec.is_moe else 1
    formats = [p for p in PRECISIONS if p in ("bf16", "fp16") or p in hardware.compute.peak_tflops]
    par = {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "etp": draw(st.sampled_from([0, 1])) if spec.is_moe else 0,
           "vpp": vpp, "micro_batch_size": draw(pow2(2)),
           "sequence_length": draw(st.sampled_from([256, 1024, 2048, 4096, 8192, 32768])),
           "precision": draw(st.sampled_from(formats)), "sequence_parallel": draw(st.booleans()),
           "flash_attention": draw(st.booleans()),
           # packed documents, sometimes longer than the sequence (cut to it)
           "document_length": draw(st.sampled_from([0, 0, 0, 64, 1000, 100_000]))}
    if spec.is_moe:
        dp = max(dp, ep)  # ep × etp folds into tp × cp × dp
    par["global_batch_size"] = dp * par["micro_batch_size"] * draw(st.sampled_from([1, 2, 4, 8, 16]))
    L = spec.num_layers
    if pp > 2 and draw(st.booleans()):  # uneven end stages: first + (pp − 2)·mid + last = L
        mid = draw(st.integers(1, max(1, L // pp)))
        first = draw(st.integers(1, max(1, L - mid * (pp - 2) - 1)))
        par.update(first_stage_layers=first, last_stage_layers=max(0, L - mid * (pp - 2) - first))
    elif pp == 2 and L % 2 and L > 1:
        par.update(first_stage_layers=L // 2, last_stage_layers=L - L // 2)
    return par, tp * pp * cp * dp, sched


@st.composite
def job_groups(draw) -> list[dict]:
    """A few jobs of one model on one GPU, differing in layout, schedule and features."""
    zoo = draw(st.booleans())
    model = {"name": draw(st.sampled_from(sorted(REG.models)))} if zoo else draw(architectures())
    try:
        spec = PRED.job({"model": model, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 1},
                         "parallel": {"global_batch_size": 1, "sequence_length": 1024}}).model
    except MofaError:
        return [{"model": model, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 1},
                 "parallel": {"global_batch_size": 1, "sequence_length": 1024}}]
    hw = REG.hardware[draw(st.sampled_from(sorted(REG.hardware)))]
    out = []
    for _ in range(draw(st.integers(1, 4))):
        par, gpus, sched = draw(layouts(spec, hw))
        job = {"model": model, "hardware": {"name": hw.name, "num_gpus": gpus}, "parallel": par,
               "features": draw(features(hw))}
        if sched:
            job["pipeline"] = {"schedule": sched}
        out.append(job)
    return out


def _accepted(docs) -> list:
    jobs = []
    for doc in docs:
        try:
            jobs.append(PRED.job(doc))
        except InvariantError:
            raise
        except MofaError:
            continue  # refused with the project's error type: fine
    return jobs


@EXAMPLES
@given(job_groups())
def test_every_accepted_job_gives_a_possible_answer(docs):
    jobs = _accepted(docs)
    if not jobs:
        return
    try:
        pred, ok = feasible_prediction(PRED, jobs)
    except InvariantError:
        raise
    except MofaError:
        return  # e.g. a feasibility rule naming its own reason
    if pred is not None:
        assert_outputs_possible(pred)


@EXAMPLES
@given(job_groups())
def test_batched_rows_equal_single_predictions(docs):
    """A row's answer does not depend on what else is in the batch (the invariants hold row by row)."""
    jobs = _accepted(docs)
    if len(jobs) < 2:
        return
    pred, ok = feasible_prediction(PRED, jobs)
    if pred is None:
        return
    keep = [j for j, good in zip(jobs, ok) if good]
    for i, job in enumerate(keep[:2]):
        single, _ = feasible_prediction(PRED, [job])
        assert single.step_time_s[0] == pred.step_time_s[i]
        assert single.peak_memory_bytes[0] == pred.peak_memory_bytes[i]


@EXAMPLES
@given(job_groups(), st.floats(0.05, 0.95))
def test_a_slower_network_never_makes_a_step_faster(docs, ratio):
    """The same jobs on NICs `ratio` times as fast as the profile's (``[hardware]
    scaleout_bandwidth_gbps``): no step is faster, and a job that fits one node is unchanged."""
    jobs = _accepted(docs)
    if not jobs:
        return
    fast, ok = feasible_prediction(PRED, jobs)
    if fast is None:
        return
    net = jobs[0].hardware.interconnect.scaleout_bandwidth_gbps * ratio
    slow_jobs = [PRED.job({**d, "hardware": {**d["hardware"], "scaleout_bandwidth_gbps": net}})
                 for d, good in zip(docs, ok) if good] if len(jobs) == len(docs) else None
    if slow_jobs is None:
        return
    slow, ok2 = feasible_prediction(PRED, slow_jobs)
    assert ok2.all()
    assert np.all(slow.step_time_s >= fast.step_time_s * (1 - 1e-12)), (fast.step_time_s, slow.step_time_s)
    one_node = fast.batch.num_gpus <= jobs[0].hardware.scaleup_domain_gpus
    assert np.array_equal(slow.step_time_s[one_node], fast.step_time_s[one_node])


HOSTILE = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                    st.booleans(), st.none(), st.lists(st.integers(-3, 3), max_size=3),
                    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
PATHS = ["hardware.num_gpus", "parallel.tp", "parallel.pp", "parallel.vpp", "parallel.cp", "parallel.ep",
         "parallel.etp", "parallel.micro_batch_size", "hardware.scaleout_bandwidth_gbps", "hardware.power_limit_w", "parallel.global_batch_size", "parallel.sequence_length",
         "parallel.precision", "parallel.first_stage_layers", "parallel.last_stage_layers", "model.num_layers",
         "model.hidden_size", "model.num_attention_heads", "model.num_experts", "model.moe_load_factor",
         "model.num_mtp_layers", "model.name", "hardware.name", "pipeline.schedule", "training.tokens",
         "fault.init_s", "features.recompute.num_layers", "features.kernel_scaling.compute_factor",
         "features.dp_overlap.contention_comm", "features.memfine.chunks", "search.tp", "model", "features"]


@EXAMPLES
@given(job_groups(), st.lists(st.tuples(st.sampled_from(PATHS), HOSTILE), min_size=1, max_size=3))
def test_every_refused_job_raises_the_project_error(docs, edits):
    """Any value at any key: accepted (and possible) or refused with a MofaError, never anything else."""
    doc = dict(docs[0])
    for path, value in edits:
        *parents, key = path.split(".")
        d = doc
        for p in parents:
            d[p] = dict(d[p]) if isinstance(d.get(p), dict) else {}
            d = d[p]
        d[key] = value
    try:
        pred, _ = feasible_prediction(PRED, [PRED.job(doc)])
    except InvariantError:
        raise
    except MofaError:
        return
    if pred is not None:
        assert_outputs_possible(pred)
    assert np.all(np.isfinite(pred.mfu)) if pred is not None else True
