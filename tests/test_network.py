"""A job on another network than its profile's (``[hardware] scaleout_bandwidth_gbps``,
``--scaleout-bandwidth-gbps``): the formula and the measured scale-out curves re-based to the
job's NICs, jobs grouped by their network, the flag, bad values, calibration keeping a row's own
network, and vTrain's cluster (4 × 200 Gb/s per node of 8 GPUs)."""

from __future__ import annotations

import json

import attrs
import numpy as np
import pytest
from click.testing import CliRunner

from mofa_framework.batch import COLLECTIVE_KINDS, CollectiveBatch
from mofa_framework.config import rebased_scaleout, with_scaleout_bandwidth
from mofa_framework.errors import ConfigError
from mofa_framework.types import CollectivePoint
from mofa_plugins.collectives import collective_seconds, table_seconds

H100, A100 = "h100-sxm5-80gb", "a100-sxm4-80gb"
JOB = {"model": {"name": "llama3-8b"}, "hardware": {"name": H100, "num_gpus": 16},
       "parallel": {"tp": 8, "global_batch_size": 16, "micro_batch_size": 1, "sequence_length": 4096}}


def one(kind, n, nodes, size):
    return CollectiveBatch(kind=np.array([COLLECTIVE_KINDS.index(kind)]), bytes=np.array([size]),
                           group_size=np.array([n]), nodes=np.array([nodes]))


def test_formula_all_reduce_across_nodes_by_hand(mofa_predictor):
    # a synthetic profile (no tables): scale-out 50 GB/s at bus efficiency 0.85, λ_out = 10 µs, decay
    # 0.02 per doubling; a DP group of 8 ranks on 8 nodes, one NIC each: B = g·0.85·0.98³, ring
    # all-reduce 2·7/8·S/B + 2·7·λ, S = 1e9. At the profile's 50 GB/s B = 42.5e9·0.941192 = 40.00066e9:
    # 1.75/40.00066 + 0.00014 = 0.0438893 s; on a job's 25 GB/s B = 20.00033e9: 0.0874986 + 0.00014 = 0.0876386 s
    h = mofa_predictor.registry.hardware_profile(H100)
    eff = attrs.evolve(h.efficiency, scaleout_bus_efficiency=0.85, scaleout_latency_us=10.0,
                       bandwidth_decay_per_doubling=0.02)
    hw = attrs.evolve(h, efficiency=eff, collective_profile=(),
                      interconnect=attrs.evolve(h.interconnect, scaleout_bandwidth_gbps=50.0))
    slow = with_scaleout_bandwidth(hw, 25.0, "test")
    assert float(collective_seconds(one("all_reduce", 8, 8, 1e9), hw)[0]) == pytest.approx(0.0438893, rel=1e-6)
    assert float(collective_seconds(one("all_reduce", 8, 8, 1e9), slow)[0]) == pytest.approx(0.0876386, rel=1e-6)
    # inside a node nothing moves
    assert collective_seconds(one("all_reduce", 8, 1, 1e9), slow)[0] == collective_seconds(one("all_reduce", 8, 1, 1e9), hw)[0]


def test_measured_curve_rebased_by_hand():
    # two all-reduce points of one curve, 1 MB at 10 GB/s and 1 GB at 40 GB/s (B_max 40): on NICs half as
    # fast, 1/busbw' = 1/busbw + (2 − 1)/40 → 1/(0.1 + 0.025) = 8 GB/s and 1/(0.025 + 0.025) = 20 GB/s;
    # twice as fast: 1/(0.1 − 0.0125) = 11.428571 and 1/(0.025 − 0.0125) = 80. Scale-up points stay.
    pts = (CollectivePoint(kind="all_reduce", scope="scaleout", group_size=16, message_bytes=1e6, busbw_gbps=10.0),
           CollectivePoint(kind="all_reduce", scope="scaleout", group_size=16, message_bytes=1e9, busbw_gbps=40.0),
           CollectivePoint(kind="all_reduce", scope="scaleup", group_size=8, message_bytes=1e9, busbw_gbps=300.0))
    half = rebased_scaleout(pts, 0.5)
    assert [p.busbw_gbps for p in half] == pytest.approx([8.0, 20.0, 300.0], rel=1e-12)
    double = rebased_scaleout(pts, 2.0)
    assert [p.busbw_gbps for p in double] == pytest.approx([80.0 / 7.0, 80.0, 300.0], rel=1e-12)
    assert rebased_scaleout(pts, 1.0) == pts


def test_measured_curve_follows_the_job_network(mofa_predictor):
    """H100's scale-out all-reduce is a measured curve (2 × p5, 16 ranks): at half the NICs a large
    all-reduce takes about twice as long, a tiny one about as long."""
    hw = mofa_predictor.registry.hardware_profile(H100)
    assert any(p.scope == "scaleout" for p in hw.collective_profile)
    slow = with_scaleout_bandwidth(hw, hw.interconnect.scaleout_bandwidth_gbps / 2, "test")

    def secs(h, size):
        colls = one("all_reduce", 16, 2, size)
        return float(table_seconds(colls, h, collective_seconds(colls, h))[0])
    big = secs(slow, 4e9) / secs(hw, 4e9)
    small = secs(slow, 1e3) / secs(hw, 1e3)
    assert 1.9 < big <= 2.0 and 1.0 <= small < 1.1


def test_job_file_sets_the_network_and_jobs_keep_their_own(mofa_predictor):
    base = mofa_predictor.job(JOB)
    slow = mofa_predictor.job({**JOB, "hardware": {**JOB["hardware"], "scaleout_bandwidth_gbps": 12.5}})
    assert slow.hardware.interconnect.scaleout_bandwidth_gbps == 12.5 and slow.batch_key != base.batch_key
    alone = [mofa_predictor.predict(j)[0] for j in (base, slow)]
    both = mofa_predictor.predict([base, slow])
    assert [r.step_time_s for r in both] == [r.step_time_s for r in alone]
    assert both[1].breakdown["dp_comm"] > 3.0 * both[0].breakdown["dp_comm"] > 0.0  # 50 → 12.5 GB/s per GPU
    assert (both[0].scaleout_bandwidth_gbps, both[1].scaleout_bandwidth_gbps) == (0.0, 12.5)
    # one node: nothing crosses the network, bit for bit
    one_node = {**JOB, "hardware": {**JOB["hardware"], "num_gpus": 8}, "parallel": {**JOB["parallel"], "global_batch_size": 8}}
    a, b = (mofa_predictor.predict(mofa_predictor.job(j))[0] for j in
            (one_node, {**one_node, "hardware": {**one_node["hardware"], "scaleout_bandwidth_gbps": 1.0}}))
    assert a.step_time_s == b.step_time_s


@pytest.mark.parametrize("value, says", [(0, "out of range"), (-3, "out of range"), ("fast", "expected a number"),
                                         (float("inf"), "finite")])
def test_bad_network_is_one_line_naming_the_field(mofa_predictor, value, says):
    with pytest.raises(ConfigError, match=f"hardware.scaleout_bandwidth_gbps.*{says}") as exc:
        mofa_predictor.job({**JOB, "hardware": {**JOB["hardware"], "scaleout_bandwidth_gbps": value}})
    assert "\n" not in str(exc.value)


def test_flags_reach_predict_and_tune():
    import mofa_framework.cli as c

    c._builtin_commands()
    args = ["--model", "llama3-8b", "--hardware", H100, "--gpus", "16", "--gbs", "16", "--seq", "4096"]
    runs = [json.loads(CliRunner().invoke(c.cli, ["predict", *args, "--tp", "8", "--format", "json", *extra]).output)
            for extra in ([], ["--scaleout-bandwidth-gbps", "12.5"])]
    assert (runs[0]["scaleout_bandwidth_gbps"], runs[1]["scaleout_bandwidth_gbps"]) == (0.0, 12.5)
    assert runs[1]["step_time_s"] > runs[0]["step_time_s"]
    table = CliRunner().invoke(c.cli, ["predict", *args, "--tp", "8", "--scaleout-bandwidth-gbps", "12.5"]).output
    assert "12.5 GB/s per GPU between nodes" in table.splitlines()[0]
    tune = ["tune", *args, "--tp-values", "8", "--pp-values", "1", "--mbs-values", "1", "--features", "",
            "--schedules", "1f1b", "--top", "1", "--no-progress"]
    tuned = [json.loads(CliRunner().invoke(c.cli, [*tune, "--format", "json", *extra]).output)
             for extra in ([], ["--scaleout-bandwidth-gbps", "12.5"])]
    assert tuned[1]["best"][0]["step_time_s"] > tuned[0]["best"][0]["step_time_s"]
    assert [t["scaleout_bandwidth_gbps"] for t in tuned] == [0.0, 12.5]
    assert "12.5 GB/s per GPU between nodes" in CliRunner().invoke(c.cli, [*tune, "--scaleout-bandwidth-gbps", "12.5"]).output
    bad = CliRunner().invoke(c.cli, ["predict", *args, "--tp", "8", "--scaleout-bandwidth-gbps", "0"])
    assert bad.exit_code == 2 and "hardware.scaleout_bandwidth_gbps" in bad.output


def test_calibration_override_keeps_a_rows_own_network_and_power(mofa_predictor):
    """Calibration swaps a profile's coefficients by name; a row's own run settings stay."""
    from mofa_framework.validate import MappedRow, predict_prepared, prepare

    job = {**JOB, "hardware": {**JOB["hardware"], "scaleout_bandwidth_gbps": 12.5, "power_limit_w": 500}}
    row = MappedRow(source="t", reference="t", row_id="1", job=job, measured_s=1.0, target="t")
    groups, skipped = prepare([row], mofa_predictor)
    assert not skipped
    hw = mofa_predictor.registry.hardware_profile(H100)
    same = predict_prepared(groups, mofa_predictor, {H100: hw})["step_s"]
    assert same[0] == predict_prepared(groups, mofa_predictor)["step_s"][0]
    slower = attrs.evolve(hw, efficiency=attrs.evolve(hw.efficiency, profiled_gemm_relative_efficiency=0.5))
    assert predict_prepared(groups, mofa_predictor, {H100: slower})["step_s"][0] > same[0]


def test_vtrain_rows_run_on_its_clusters_network(mofa_predictor, tmp_path):
    """vTrain's nodes have 4 × 200 Gb/s NICs for 8 GPUs (800 Gb/s / 8 bits / 8 GPUs = 12.5 GB/s): a
    multi-node row crosses them; on another profile (`--hardware`) its network is that profile's."""
    from mofa_framework.validate import validate

    csv = tmp_path / "vtrain_multi.csv"
    csv.write_text("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
                   "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)\n"
                   "256,1024,2,6144,48,40,2048,16,16,1,10000\n")
    from mofa_framework.measurements import map_files

    mapped, _, _ = map_files([csv], mofa_predictor.registry)
    assert mapped[0].job["hardware"] == {"name": A100, "scaleout_bandwidth_gbps": 12.5, "num_gpus": 256}
    ours = validate([csv], mofa_predictor).rows[0].predicted_s
    dgx = validate([csv], mofa_predictor, hardware=A100).rows[0].predicted_s  # the profile's 8 NICs per node
    assert ours > 1.1 * dgx  # TP 16 spans two nodes: its all-reduces cross the NICs


def test_plain_schema_reads_the_runs_hardware_settings(mofa_predictor, tmp_path):
    """The plain schema's ``power_limit_w`` and ``scaleout_bandwidth_gbps`` columns become the job's
    ``[hardware]`` settings; a cell that is no positive number is the row's one-line reason."""
    from mofa_framework.measurements import map_files

    csv = tmp_path / "runs.csv"
    csv.write_text("model,hardware,num_gpus,tp,global_batch_size,sequence_length,power_limit_w,scaleout_bandwidth_gbps,"
                   "step_time_s\n"
                   "llama3-8b,h100-sxm5-80gb,16,8,16,4096,500,12.5,1.5\n"
                   "llama3-8b,h100-sxm5-80gb,16,8,16,4096,,,1.5\n"
                   "llama3-8b,h100-sxm5-80gb,16,8,16,4096,,0,1.5\n")
    mapped, skipped, _ = map_files([csv], mofa_predictor.registry)
    assert mapped[0].job["hardware"] == {"name": H100, "num_gpus": 16, "power_limit_w": 500.0,
                                         "scaleout_bandwidth_gbps": 12.5}
    assert mapped[1].job["hardware"] == {"name": H100, "num_gpus": 16}
    assert len(skipped) == 1 and "scaleout_bandwidth_gbps" in skipped[0].reason and "\n" not in skipped[0].reason


def test_a_job_on_its_own_network_is_flagged_and_so_are_the_tuners_rows(mofa_predictor):
    """Across nodes a job on another network than the profile's rows is outside the calibrated
    regimes (its band stays the profile's); inside one node nothing crosses it, so no flag. The
    tuner's top rows carry the same flags, and a power limit's too."""
    slow = {**JOB, "hardware": {**JOB["hardware"], "scaleout_bandwidth_gbps": 12.5}}
    flags = mofa_predictor.predict(mofa_predictor.job(slow))[0].extrapolation
    assert any("12.5 GB/s per GPU between nodes (the profile's rows: 50)" in f for f in flags)
    one_node = {**slow, "hardware": {**slow["hardware"], "num_gpus": 8},
                "parallel": {**JOB["parallel"], "global_batch_size": 8}}
    assert not any("between nodes" in f for f in mofa_predictor.predict(mofa_predictor.job(one_node))[0].extrapolation)
    import mofa_framework.cli as c

    c._builtin_commands()
    out = CliRunner().invoke(c.cli, ["tune", "--model", "llama3-8b", "--hardware", H100, "--gpus", "16", "--gbs", "16",
                                     "--seq", "4096", "--tp-values", "8", "--pp-values", "1", "--features", "",
                                     "--schedules", "1f1b", "--top", "1", "--no-progress", "--format", "json",
                                     "--scaleout-bandwidth-gbps", "12.5", "--power-limit-w", "600"]).output
    flags = json.loads(out)["best"][0]["extrapolation"]
    assert any("between nodes" in f for f in flags) and any("GPUs at 600 W" in f for f in flags)


def test_own_network_is_zero_on_the_profiles_and_the_value_otherwise(mofa_predictor):
    from mofa_framework.config import own_network

    h100 = mofa_predictor.registry.hardware_profile(H100)  # 50 GB/s per GPU between nodes
    assert (own_network(50.0, h100), own_network(12.5, h100), own_network(0.0, h100)) == (0.0, 12.5, 0.0)
