"""Error bands, extrapolation flags and sensitivities (issue 17 §3): values derived by hand from
small residual tables, the sensitivities' finite differences on functions with known derivatives,
and the wiring into predict, tune, the CLI and the Python API."""

from __future__ import annotations

import json
import math

import numpy as np
import attrs
import pytest

from mofa_framework.crossval import Regime
from mofa_framework.uncertainty import (
    COVERAGE,
    MIN_ROWS,
    MIN_SOURCES,
    SCALE_SPAN,
    ResidualTable,
    band,
    elasticity,
    held_out_coverage,
    read_table,
    weighted_quantile,
)

H100, A100 = "h100-sxm5-80gb", "a100-sxm4-80gb"
FAMILY = "dense GQA gated MLP"
#: eleven ratios predicted / measured: with numpy's linear percentiles the 10th is the 2nd value
#: (position 0.1 · 10 = 1) and the 90th the 10th (position 9), so the 80 % band is [t/1.10, t/0.90]
RATIOS = (0.80, 0.90, 0.95, 0.97, 0.99, 1.00, 1.01, 1.03, 1.05, 1.10, 1.20)


def table(rows: list[dict]) -> ResidualTable:
    """A residual table from rows with keys gpu, precision, family, schedule, features, num_gpus,
    source, and the ratio predicted/measured per kind (``source`` and optionally others)."""
    col = lambda k, d="": np.array([r.get(k, d) for r in rows], dtype=object)  # noqa: E731
    kinds = {k for r in rows for k in r.get("ratio", {})}
    return ResidualTable(source=col("source", "s"), gpu=col("gpu", H100), precision=col("precision", "bf16"),
                         family=col("family", FAMILY), schedule=col("schedule", "1f1b"),
                         features=tuple(frozenset(r.get("features", ())) for r in rows),
                         num_gpus=np.array([float(r.get("num_gpus", 64)) for r in rows]),
                         log_error={k: np.log(np.array([r["ratio"].get(k, math.nan) for r in rows])) for k in kinds})


def regime(**kw) -> Regime:
    base = dict(gpu=H100, precision="bf16", family=FAMILY, schedule="1f1b", features=(), num_gpus=64)
    return Regime(**{**base, **kw})


@pytest.fixture(scope="module")
def registry():
    from mofa_framework import Predictor

    return Predictor().registry


def test_band_is_the_central_80_percent_of_the_held_out_errors(registry):
    t = table([{"ratio": {"source": r}} for r in RATIOS])
    b = band(10.0, regime(), registry, t)
    assert COVERAGE == 0.8 and b.rows == 11 and not b.flags
    # predicted 10 s; the runs like it were predicted between 10 % too fast and 10 % too slow
    assert b.low_s == pytest.approx(10.0 / 1.10) and b.high_s == pytest.approx(10.0 / 0.90)
    assert "held-out errors of 11 runs on h100-sxm5-80gb (bf16, dense GQA gated MLP, ~64 GPUs; 1 source" in b.basis


def test_band_spreads_across_sources_as_for_a_new_one(registry):
    """Three sources (one run in each predicted 5 % in ln too fast, one 5 % too slow) with biases
    −0.1, 0, +0.1 in ln(predicted/measured). A new source's bias is one more draw: the biases about
    their mean (0) widened by √(1 + 1/3) (a new group, and a mean from three) = ±0.11547, plus the
    within-source scatter ±0.05. The 18 equally weighted sums are ±0.16547, ±0.06547, ±0.05 (three
    each); numpy's linear 10th percentile (position 1.7 of 0…17) is −0.16547, the 90th +0.16547. The
    six errors alone would give ±0.1 (positions 0.5 and 4.5 of 0…5)."""
    rows = [{"source": src, "ratio": {"source": math.exp(bias + d)}}
            for src, bias in (("a", -0.1), ("b", 0.0), ("c", 0.1)) for d in (-0.05, 0.05)]
    b = band(10.0, regime(), registry, table(rows))
    half = 0.1 * math.sqrt(4 / 3) + 0.05
    assert b.low_s == pytest.approx(10.0 * math.exp(-half)) and b.high_s == pytest.approx(10.0 * math.exp(half))
    assert "3 sources" in b.basis


def test_band_of_one_source_takes_the_spread_of_every_source(registry):
    """One source on the job's GPU (errors ±0.05 about bias 0) is fewer than MIN_SOURCES: the spread of
    a new source's bias comes from every source of the table — biases 0 (H100), +0.2 and −0.2 (two A100
    sources), about their mean 0, widened by √(1 + 1/3): 0, ±0.23094. With the scatter ±0.05 the six
    sums are ±0.28094, ±0.18094, ±0.05; the linear 10th percentile (position 0.5 of 0…5) is
    (−0.28094 − 0.18094)/2 = −0.23094, the 90th +0.23094."""
    rows = [{"source": "a", "ratio": {"source": math.exp(d)}} for d in (-0.05, 0.05)]
    rows += [{"source": s, "gpu": A100, "ratio": {"source": math.exp(e)}} for s, e in (("b", 0.2), ("c", -0.2))]
    b = band(10.0, regime(), registry, table(rows))
    half = 0.2 * math.sqrt(4 / 3)
    assert MIN_SOURCES == 3
    assert b.low_s == pytest.approx(10.0 * math.exp(-half)) and b.high_s == pytest.approx(10.0 * math.exp(half))


def test_the_centre_of_a_band_from_too_few_sources_is_pooled_with_the_tables(registry):
    """One source on the job's GPU, predicted 0.3 too slow in ln (errors 0.29, 0.31), and two on the
    A100 with bias 0 (±0.01): one source says little about where a new one lies, so its bias is pooled
    with the table's mean bias (0.3 + 0 + 0)/3 = 0.1 as if the two missing sources had it:
    (1·0.3 + 2·0.1)/3 = 0.16667. The spread is every source's: biases about 0.1 (+0.2, −0.1, −0.1)
    × √(4/3) = 0.23094, −0.11547, −0.11547; plus a's deviations ±0.01 the six sums sorted are
    −0.12547 ×2, −0.10547 ×2, 0.22094, 0.24094: 10th percentile −0.12547 (position 0.5), 90th 0.23094
    (4.5); every source's own (18 sums, the 90th at position 15.3 among the 0.24094s) widens it to
    0.24094. So e ∈ [0.04120, 0.40761] and the band [t·e^−0.40761, t·e^−0.04120] — centred on a's 0.3
    alone it would have been [t·e^−0.54094, t·e^−0.17453]."""
    rows = [{"source": "a", "ratio": {"source": math.exp(e)}} for e in (0.29, 0.31)]
    rows += [{"source": s, "gpu": A100, "ratio": {"source": math.exp(d)}} for s in "bc" for d in (-0.01, 0.01)]
    b = band(10.0, regime(), registry, table(rows))
    assert b.low_s == pytest.approx(10.0 * math.exp(-0.40761), rel=1e-4)
    assert b.high_s == pytest.approx(10.0 * math.exp(-0.04120), rel=1e-4)


def test_weighted_quantile_is_numpys_linear_percentile_for_equal_weights():
    x = np.array([3.0, 1.0, 4.0, 1.5, 9.0, 2.6])
    assert weighted_quantile(x, np.ones(6), [0.1, 0.5, 0.9]) == pytest.approx(np.percentile(x, [10, 50, 90]))
    # values 0, 1, 2 weighing 2, 1, 1: C = 2, 3, 4; positions (C − w/2 − 1)/(4 − 1 − 0.5) = 0, 0.6, 1;
    # the median (0.5) is 5/6 of the way from 0 to 1 (equal weights: 1)
    assert weighted_quantile(np.array([2.0, 0.0, 1.0]), np.array([1.0, 2.0, 1.0]), [0.5]) == pytest.approx([5 / 6])


def test_band_prefers_the_nearest_regime_with_enough_rows(registry):
    """Rows at the job's scale drive the band; rows of another precision do not (even if they are far
    worse), nor rows far from its scale, until the nearer level has fewer than MIN_ROWS rows. The
    near rows come from three sources with the same errors (RATIOS each): biases equal, so the band
    is RATIOS' own 10th and 90th percentiles (33 values: positions 3.2 and 28.8, 0.90 and 1.10)."""
    same = [{"source": src, "ratio": {"source": r}} for src in "abc" for r in RATIOS]
    fp8 = [{"source": "f", "precision": "fp8", "ratio": {"source": 2.0}} for _ in range(20)]
    b = band(10.0, regime(), registry, table(same + fp8))
    assert b.high_s == pytest.approx(10.0 / 0.90) and b.low_s == pytest.approx(10.0 / 1.10)
    # far from the job's scale (more than SCALE_SPAN× away): the "same precision and family" level
    far = [{"source": "g", "num_gpus": 64 * SCALE_SPAN * 2, "ratio": {"source": 0.5}} for _ in range(MIN_ROWS)]
    b = band(10.0, regime(), registry, table(same + far))
    assert b.high_s == pytest.approx(10.0 / 0.90)  # the 33 rows at its scale are enough
    b = band(10.0, regime(), registry, table(same[:5] + far))  # 5 at its scale: not enough
    assert b.rows == 15 and "(bf16, dense GQA gated MLP; 2 sources," in b.basis


def test_a_band_from_too_few_sources_is_at_least_as_wide_as_every_sources_scatter(registry):
    """One source on the job's GPU, scattering ±0.01 about bias 0, is fewer than MIN_SOURCES: how
    widely a new source scatters is not known from it. Every source of the table: a (±0.01, each row
    weighing 1/2), b on the A100 (±0.3, 1/2 each) and c (one row, bias 0: deviation 0, weight 1); biases
    all 0, so the spread across sources is 0. The sums — the five deviations, once per source, weights
    ½ ½ 1 ½ ½ — sorted: −0.3 ×3, −0.01 ×3, 0 ×3, 0.01 ×3, 0.3 ×3; cumulative weight at each value's
    middle less the first's half: 0, 0.5, 1, 1.5, 2, 2.5, 3.25 … 6, 6.5 … 8.5; the 10th percentile (at
    0.85 of 8.5) and the 90th (7.65) fall among the ±0.3s: the band is [t·e^−0.3, t·e^0.3], not a's ±0.01."""
    rows = [{"source": "a", "ratio": {"source": math.exp(d)}} for d in (-0.01, 0.01)]
    rows += [{"source": "b", "gpu": A100, "ratio": {"source": math.exp(d)}} for d in (-0.3, 0.3)]
    rows += [{"source": "c", "gpu": A100, "ratio": {"source": 1.0}}]
    b = band(10.0, regime(), registry, table(rows))
    assert b.low_s == pytest.approx(10.0 * math.exp(-0.3)) and b.high_s == pytest.approx(10.0 * math.exp(0.3))
    # three sources on the job's GPU: their own scatter (±0.01, biases 0), b's does not widen it
    rows3 = [{"source": s, "ratio": {"source": math.exp(d)}} for s in "ade" for d in (-0.01, 0.01)]
    b = band(10.0, regime(), registry, table(rows3 + rows[2:]))
    assert b.low_s == pytest.approx(10.0 * math.exp(-0.01)) and b.high_s == pytest.approx(10.0 * math.exp(0.01))


def test_flags_and_widening(registry):
    """A job outside the calibrated regimes is flagged; a schedule no run used takes each row's
    worst held-out error over every leave-one-out kind (here the model-family one: ratio 1.5)."""
    rows = [{"ratio": {"source": r, "model-family": 1.5 if i == 3 else r}} for i, r in enumerate(RATIOS)]
    t = table(rows)
    b = band(10.0, regime(schedule="dualpipe"), registry, t)
    assert b.flags == ("no validated run uses the dualpipe schedule: band widened",)
    # errors now 0.80, 0.90, 0.95, 1.5, 0.99, … : sorted, the 90th percentile is the 10th value, 1.20
    assert b.high_s == pytest.approx(10.0 / 0.90) and b.low_s == pytest.approx(10.0 / 1.20)
    b = band(10.0, regime(num_gpus=64 * SCALE_SPAN + 64), registry, t)
    assert any("more than 8× the largest calibrated run" in f for f in b.flags)
    b = band(10.0, regime(precision="fp8"), registry, t)
    assert b.flags == ("no calibration rows for fp8 on h100-sxm5-80gb; band from its other precisions",)
    b = band(10.0, regime(family="MoE MLA gated MLP"), registry, t)
    assert b.flags == ("no calibration rows for MoE MLA gated MLP models on h100-sxm5-80gb",)
    b = band(10.0, regime(features=("never_validated",)), registry, t)
    assert b.flags == ("no validated run uses the never_validated feature: band widened",)


def test_a_gpu_without_rows_borrows_the_most_similar_gpus(registry):
    """H800 has H100's compute and HBM bandwidth: its band comes from the H100 rows, not the A100's."""
    h100 = [{"ratio": {"source": r}} for r in RATIOS]
    a100 = [{"gpu": A100, "ratio": {"source": 3.0}} for _ in range(11)]
    b = band(10.0, regime(gpu="h800-sxm5-80gb"), registry, table(h100 + a100))
    assert b.flags[0] == ("no calibration rows for bf16 on h800-sxm5-80gb; band from similar GPUs "
                          "(h100-sxm5-80gb)")
    # exactly the band of a job on the H100 (its rows, the table's spread across sources), not the A100's
    # (whose one source runs 3× slow: its band sits far lower, if less than 3× so, its centre pooled
    # with the table's mean as one source's bias says little)
    h = band(10.0, regime(), registry, table(h100 + a100))
    a = band(10.0, regime(gpu=A100), registry, table(h100 + a100))
    assert (b.low_s, b.high_s) == (h.low_s, h.high_s) and a.low_s < 0.75 * h.low_s and a.high_s < 0.75 * h.high_s


def test_no_table_no_band(registry):
    b = band(10.0, regime(), registry, table([]))
    assert math.isnan(b.low_s) and b.flags == ("no cross-validation table is installed: no band",)


def test_held_out_coverage_counts_rows_inside_a_band_drawn_without_their_source(registry):
    """Source a: eleven rows (RATIOS); source b: one row predicted 15 % slow and one 5 % slow. b's
    bands come from a's rows alone, [t/1.10, t/0.90] around its own prediction t = 1.15 (or 1.05) ×
    measured: 1.15 → measured in [1.15/1.10, 1.15/0.90] = [1.045, 1.278] · measured: outside; 1.05 → [0.955,
    1.167]: inside. a's bands come from b's two rows and the widening to every row: checked as a total."""
    rows = [{"source": "a", "ratio": {"source": r}} for r in RATIOS]
    rows += [{"source": "b", "ratio": {"source": r}} for r in (1.15, 1.05)]
    cov = held_out_coverage(table(rows), registry)
    assert cov["b"] == (1, 2)
    assert cov["overall"] == (cov["a"][0] + 1, 13)


def test_read_table_round_trip(tmp_path):
    from mofa_framework.crossval import TABLE_COLUMNS

    path = tmp_path / "t.csv"
    head = ",".join(TABLE_COLUMNS)
    path.write_text(f"# comment\n{head}\nsrc,1,{H100},bf16,{FAMILY},Megatron-Core,1f1b,a;b,64,128,g,2,2.2,2.4,2,nan,2\n")
    t = read_table(path)
    assert list(t.source) == ["src"] and t.features == (frozenset({"a", "b"}),)
    assert t.log_error["in-sample"][0] == pytest.approx(math.log(1.1))
    assert t.log_error["source"][0] == pytest.approx(math.log(1.2))
    assert t.log_error["gpu-precision"][0] == 0.0 and math.isnan(t.log_error["model-family"][0])
    assert t.gpu_specs == {}


def test_the_column_reader_reads_what_the_row_reader_reads():
    """`table_columns` (the band's reader) gives the shipped table's cells exactly as `table_records`."""
    from mofa_framework.crossval import table_columns, table_records
    from mofa_framework.uncertainty import TABLE

    text = TABLE.read_text()
    rows, cols = table_records(text), table_columns(text)
    assert len(rows) > 1000 and list(cols) == list(rows[0])
    assert all(cols[k] == tuple(r[k] for r in rows) for k in cols)
    assert table_columns("# only a comment\n") == {} and table_columns("a,b\n") == {"a": (), "b": ()}


def test_tune_bands_equal_the_band_of_each_row(registry):
    """The tuner's top-k share their bands per regime (one band per regime, scaled): each row's band
    is exactly what :func:`band` gives for its step time and regime."""
    from mofa_framework import Predictor
    from mofa_framework.crossval import model_family
    from mofa_framework.tuner import job_request, tune
    from mofa_framework.uncertainty import gemm_format

    pred = Predictor()
    job = pred.job({"model": {"name": "llama3-8b"}, "hardware": {"name": H100, "num_gpus": 16},
                    "parallel": {"global_batch_size": 64, "sequence_length": 4096}})
    req = job_request(job, pred.registry, values={"tp": (1, 2, 4), "pp": (1, 2)}, top_k=8)
    best = tune(pred, req).best
    regimes = [Regime(gpu=H100, family=model_family(req.model), schedule=c.schedule, num_gpus=16,
                      precision=gemm_format(req.hardware, c.parallel["precision"], c.features, pred.registry),
                      features=tuple(sorted(c.features))) for c in best]
    assert len(best) == 8 and len(set(regimes)) < len(regimes)  # some rows share a regime
    for c, r in zip(best, regimes):
        b = band(c.step_time_s, r, pred.registry)
        assert (c.step_time_s_low, c.step_time_s_high, c.extrapolation) == (b.low_s, b.high_s, b.flags)


def test_the_shipped_table_records_its_gpus_specs_and_bands_rank_by_them(registry):
    """Every GPU of the shipped table has a `# gpu` line with its profile's bf16 peak and HBM bandwidth
    (to the 6 digits written), so a band for a GPU without rows ranks the table's GPUs without reading
    their profiles; a table whose recorded specs say otherwise ranks by them (here: an A100 recorded
    with H100's specs is as near to H800 as H100 is, and comes first by table order)."""
    from mofa_framework.uncertainty import _similar_gpus, shipped_table

    t = shipped_table()
    assert set(t.gpu_specs) == set(t.gpu)
    for name, (peak, hbm) in t.gpu_specs.items():
        hw = registry.hardware_profile(name)
        assert peak == pytest.approx(hw.peak_flops_per_s("bf16"), rel=1e-5)
        assert hbm == pytest.approx(hw.hbm_bandwidth_bytes_per_s, rel=1e-5)
    assert _similar_gpus("h800-sxm5-80gb", t, registry)[0] in ("h100-sxm5-80gb", "h100-sxm-96gb-grandteton")
    h100 = registry.hardware_profile(H100)
    spec = (h100.peak_flops_per_s("bf16"), h100.hbm_bandwidth_bytes_per_s)
    mixed = attrs.evolve(table([{"gpu": A100, "ratio": {"source": 1.0}}, {"ratio": {"source": 1.0}}]),
                         gpu_specs={A100: spec, H100: spec})
    assert _similar_gpus("h800-sxm5-80gb", mixed, registry) == [A100, H100]


# ---------------------------------------------------------------------------------- sensitivity


def test_elasticity_of_functions_with_known_derivatives():
    # t = c^-0.7: ln t is linear in ln c, so central differences give −0.7 exactly
    assert elasticity(lambda k: np.array([k ** -0.7])) == pytest.approx([-0.7], abs=1e-12)
    # t = 2 + c at c = 1: d ln t / d ln c = c / (2 + c) = 1/3; central differences over ±5 %:
    # ln(3.05 / 2.95) / ln(1.05 / 0.95) = 0.033336 / 0.100083 = 0.33309
    assert elasticity(lambda k: np.array([2.0 + k])) == pytest.approx([0.33309], abs=1e-5)
    # a bound above 1: one-sided, ln(2.95 / 3) / ln(0.95) = −0.016807 / −0.051293 = 0.32767
    e = elasticity(lambda k: None if k > 1 else np.array([2.0 + k]))
    assert e == pytest.approx([0.32767], abs=1e-5)


@pytest.fixture(scope="module")
def predictor():
    from mofa_framework import Predictor

    return Predictor()


def _job(predictor, **parallel):
    return predictor.job({"model": {"name": "llama3-8b"}, "hardware": {"name": H100, "num_gpus": 16},
                          "parallel": {"tp": 2, "pp": 2, "micro_batch_size": 1, "global_batch_size": 64,
                                       "sequence_length": 4096, "precision": "bf16", **parallel},
                          "features": {"dp_overlap": {}}})


#: the sections and measured tables whose entries are rates (a larger value: a faster step)
RATE_PARTS = ("compute", "memory", "interconnect", "gemm_profile", "attention_profile", "collective_profile")


def _euler_sum(s) -> float:
    rate = sum(x.elasticity for x in s if x.parameter.split(".")[0] in RATE_PARTS)
    time_ = sum(x.elasticity for x in s if x.parameter.endswith(("_s", "_us")))
    return rate - time_


def test_sensitivities_obey_eulers_theorem(predictor):
    """Step time is homogeneous of degree −1 in the profile's rates with its times scaled inversely
    (every rate ×k and every latency or overhead ÷k makes the step k× shorter), so Euler's theorem
    gives Σ elasticity(rate) − Σ elasticity(time) = −1; the dimensionless efficiencies are neither.
    Exact for the roofline (the H100 without its measured tables)."""
    job = _job(predictor)
    bare = attrs.evolve(job.hardware, gemm_profile=(), attention_profile=(), collective_profile=())
    s = predictor.sensitivity(attrs.evolve(job, hardware=bare))[0]
    assert _euler_sum(s) == pytest.approx(-1.0, abs=0.01)
    assert [abs(x.elasticity) for x in s] == sorted((abs(x.elasticity) for x in s), reverse=True)
    peak = next(x for x in s if x.parameter == "compute.peak_tflops")
    assert peak.value == 989.0 and -1.0 < peak.elasticity < -0.3


def test_sensitivities_of_the_grounded_profile_follow_its_tables(predictor):
    """On the grounded H100 the step depends on its measured tables, not on the datasheet peak; Euler's
    sum holds to the tile model's fit (its launch term t₀ is fitted on a fixed grid of times, so
    scaling the GEMM table's rates does not scale t₀: −1.014 measured for this job, 2 % allowed)."""
    s = predictor.sensitivity(_job(predictor))[0]
    names = [x.parameter for x in s]
    assert {"gemm_profile.tflops", "attention_profile.tflops", "collective_profile.busbw_gbps"} <= set(names)
    assert "compute.peak_tflops" not in names
    assert _euler_sum(s) == pytest.approx(-1.0, abs=0.02)
    # a table's value is its highest bf16 rate (H100's: 820 TFLOPS, XLA's best shape at MAMF's level), not
    # its first row's (7 TFLOPS at 256 × 256 × 256)
    gemm = next(x for x in s if x.parameter == "gemm_profile.tflops")
    hw = _job(predictor).hardware
    assert gemm.value == max(r.tflops for r in hw.gemm_profile if r.dtype == "bf16") == pytest.approx(820, rel=0.01)


def test_table_value_falls_back_to_every_row_without_bf16():
    """A table of fp8 rows only (or of rows without a dtype, as collective tables) shows its highest rate."""
    from types import SimpleNamespace as Row
    from mofa_framework.uncertainty import table_value
    assert table_value([Row(tflops=10.0, dtype="fp8"), Row(tflops=30.0, dtype="fp8")], "tflops") == 30.0
    assert table_value([Row(tflops=10.0, dtype="bf16"), Row(tflops=30.0, dtype="fp8")], "tflops") == 10.0
    assert table_value([Row(busbw_gbps=5.0), Row(busbw_gbps=2.0)], "busbw_gbps") == 5.0


def test_sensitivities_of_a_batch_equal_one_at_a_time(predictor):
    jobs = [_job(predictor), _job(predictor, tp=4, pp=1)]
    both = predictor.sensitivity(jobs, top=5)
    assert [len(x) for x in both] == [5, 5]
    for job, got in zip(jobs, both):
        assert got == predictor.sensitivity(job, top=5)[0]


# ---------------------------------------------------------------------------------- wiring


def test_prediction_carries_its_band(predictor):
    from mofa_framework.uncertainty import band_for, shipped_table

    job = _job(predictor)
    r = predictor.predict(job)[0]
    assert len(shipped_table()) > 1000
    b = band_for(r, job, predictor.registry)
    assert (r.step_time_s_low, r.step_time_s_high, r.extrapolation) == (b.low_s, b.high_s, b.flags)
    assert 0 < r.step_time_s_low < r.step_time_s_high and r.band_basis
    d = r.to_dict()
    assert {"step_time_s_low", "step_time_s_high", "extrapolation", "band_basis"} <= set(d)


def test_predict_cli_band_flags_and_sensitivity(tmp_path):
    from click.testing import CliRunner

    import mofa_framework.cli as c

    c._builtin_commands()
    args = ["predict", "--model", "llama3-8b", "--hardware", "h800", "--gpus", "16", "--tp", "2", "--pp", "2",
            "--gbs", "64", "--seq", "4096"]
    res = CliRunner().invoke(c.cli, [*args, "--format", "json", "--sensitivity"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["step_time_s_low"] < d["step_time_s_high"]
    assert any("no calibration rows" in f and "h800" in f for f in d["extrapolation"])
    assert d["sensitivity"][0].keys() == {"parameter", "value", "elasticity"}
    res = CliRunner().invoke(c.cli, [*args, "--sensitivity"])
    assert res.exit_code == 0, res.output
    assert "(band " in res.output and "outside the calibrated regimes: no calibration rows" in res.output
    assert "sensitivity of the step time" in res.output and d["sensitivity"][0]["parameter"] in res.output
    res = CliRunner().invoke(c.cli, [*args, "--format", "csv"])
    head, row = res.output.splitlines()[:2]
    assert "step_time_s_low" in head.split(",") and "step_time_s_high" in head.split(",")


def test_tune_marks_winners_inside_each_others_band():
    from click.testing import CliRunner

    import mofa_framework.cli as c

    c._builtin_commands()
    args = ["tune", "--model", "llama3-8b", "--hardware", "h100", "--gpus", "16", "--gbs", "64", "--seq", "4096",
            "--tp-values", "1,2,4", "--pp-values", "1,2", "--top", "5"]
    res = CliRunner().invoke(c.cli, [*args, "--format", "json"])
    assert res.exit_code == 0, res.output
    best = json.loads(res.output)["best"]
    assert best[0]["within_band_of_best"] and all(b["step_time_s_low"] < b["step_time_s_high"] for b in best)
    half = lambda b: 0.5 * math.log(b["step_time_s_high"] / b["step_time_s_low"])  # noqa: E731
    for b in best[1:]:
        gap = abs(math.log(b["step_time_s"] / best[0]["step_time_s"]))
        assert b["within_band_of_best"] == (gap <= half(b) and gap <= half(best[0]))
    res = CliRunner().invoke(c.cli, args)
    assert res.exit_code == 0 and "band" in res.output


def test_indistinguishable_by_spread_not_by_containment():
    """Hand-picked bands: a regime that ran 5–50 % slower than predicted gives 1.05–1.5 s around a
    1.0 s prediction, which excludes it. ln(1.5/1.05)/2 = 0.178: a rival at 1.15 s (ln 1.15 = 0.140)
    is indistinguishable, one at 1.25 s (0.223) is not; equal predictions always are."""
    from types import SimpleNamespace as C

    from mofa_framework.uncertainty import indistinguishable

    top = C(step_time_s=1.0, step_time_s_low=1.05, step_time_s_high=1.5)
    near = C(step_time_s=1.15, step_time_s_low=1.2075, step_time_s_high=1.725)
    far = C(step_time_s=1.25, step_time_s_low=1.3125, step_time_s_high=1.875)
    assert indistinguishable(top, top) and indistinguishable(near, top) and not indistinguishable(far, top)
