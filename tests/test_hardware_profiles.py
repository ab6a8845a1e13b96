"""Every shipped hardware profile loads, and its peaks are the ones ``shared/data/gpu_specs.csv``
lists for the row its ``source`` names; the parts added for issue 18 §3 resolve under the names
runs publish them with."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import attrs
import pytest

from mofa_framework.limits import PROFILE_LIMITS
from mofa_framework.types import HardwareProfile

ROOT = Path(__file__).resolve().parents[1]
GPU_SPECS = ROOT.parent / "shared" / "data" / "gpu_specs.csv"
PROFILES = sorted((ROOT / "hardware_profiles").glob("*.toml"))

#: issue 18 §3's parts: profile -> (fitted sibling whose [efficiency] it copies, names runs use)
NEW_PARTS = {
    "a800-sxm4-80gb": ("a100-sxm4-80gb", ["A800-SXM4-80GB (DGX A800)", "A800", "a800 sxm4 80gb"]),
    "a100-pcie-40gb": ("a100-sxm4-80gb", ["A100-PCIE-40GB", "A100 PCIe 40GB"]),
    "a100-pcie-80gb": ("a100-sxm4-80gb", ["A100 80GB PCIe", "A100-PCIE-80GB", "A100 PCIe"]),
    "h20-96gb": ("h100-sxm5-80gb", ["H20 96GB", "H20", "NVIDIA H20"]),
    "h100-nvl-pcie-94gb": ("h100-sxm5-80gb", ["H100 NVL", "H100-NVL-94GB"]),
    "l40s-48gb": ("h100-sxm5-80gb", ["L40S", "l40s_48GB"]),
    "gh200-96gb": ("h100-sxm5-80gb", ["GH200", "GH200 96GB", "Grace Hopper"]),
}


def _number(cell: str) -> float | None:
    m = re.match(r"\s*([\d.]+)", cell)
    return float(m.group(1)) if m else None


@pytest.fixture(scope="module")
def specs():
    with GPU_SPECS.open() as fh:  # fails (not skips) without ../shared
        return {r["gpu"]: r for r in csv.DictReader(fh)}


def test_every_profile_file_loads_and_is_registered(mofa_predictor):
    reg = mofa_predictor.registry
    assert not reg.problems
    for path in PROFILES:
        if path.stem.startswith("paper-"):
            continue
        hw = reg.hardware[path.stem]
        assert isinstance(hw, HardwareProfile) and hw.source and hw.notes, path.name


#: an absolute path of some machine (a user's clone has none): /work/…, /home/…, /root/…, /Users/…
_MACHINE_PATH = re.compile(r"(?<![\w.:/])/(?:work|home|root|tmp|Users|mnt)/")


@pytest.mark.parametrize("path", [*PROFILES, *sorted((ROOT / "model_zoo").glob("*.toml"))],
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_shipped_records_cite_no_machine_paths(path):
    text = path.read_text(encoding="utf-8")
    assert not _MACHINE_PATH.search(text), f"{path.name}: cite ../shared/… or a URL, not this machine's path"


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_peaks_match_the_gpu_specs_row_the_profile_cites(path, specs, mofa_predictor):
    hw = mofa_predictor.registry.hardware[path.stem]
    m = re.search(r"gpu_specs\.csv row '([^']+)'", hw.source)
    if m is None:
        assert path.stem in NEW_PARTS or path.stem.startswith("paper-"), f"{path.stem} cites no gpu_specs.csv row"
        return
    row = specs[m.group(1)]
    assert hw.compute.peak_tflops["bf16"] == _number(row["bf16_dense_tflops"])
    fp8 = _number(row["fp8_dense_tflops"])
    assert hw.compute.peak_tflops.get("fp8") == fp8  # None on both sides where the part has no FP8


@pytest.mark.parametrize("name", sorted(NEW_PARTS))
def test_new_parts_resolve_by_the_names_runs_use(name, mofa_predictor):
    reg = mofa_predictor.registry
    for alias in NEW_PARTS[name][1]:
        assert reg.hardware_profile(alias).name == name, alias


@pytest.mark.parametrize("name", sorted(NEW_PARTS))
def test_new_parts_copy_their_fitted_siblings_coefficients(name, mofa_predictor):
    """Not fitted on runs of their own yet: the efficiency table is the named sibling's, and the
    notes say so (helper `ground` may reground them in microbenchmarks)."""
    reg = mofa_predictor.registry
    sibling = NEW_PARTS[name][0]
    hw, sib = reg.hardware[name], reg.hardware[sibling]
    assert attrs.asdict(hw.efficiency) == attrs.asdict(sib.efficiency)
    assert sibling in hw.notes and "copied" in hw.notes.lower()


def test_datasheet_values_of_the_new_parts(mofa_predictor):
    """The numbers the issue names, from the datasheets cited in each profile's ``source``."""
    hw = mofa_predictor.registry.hardware
    # A800: A100 silicon, NVLink cut from 600 to 400 GB/s bidirectional (200 per direction)
    assert hw["a800-sxm4-80gb"].interconnect.scaleup_bandwidth_gbps == 200.0
    assert hw["a800-sxm4-80gb"].compute.peak_tflops == hw["a100-sxm4-80gb"].compute.peak_tflops
    # H20: 148 TFLOPS bf16 dense, 96 GB at 4.0 TB/s, full NVLink 4 (450 GB/s per direction)
    assert (hw["h20-96gb"].compute.peak_tflops["bf16"], hw["h20-96gb"].memory.hbm_gib) == (148.0, 96.0)
    assert hw["h20-96gb"].interconnect.scaleup_bandwidth_gbps == 450.0
    # H100 NVL: dense = half the datasheet's sparse 1,671 / 3,341; NVLink-bridged pairs
    assert hw["h100-nvl-pcie-94gb"].compute.peak_tflops["fp8"] == 3341.0 / 2
    assert hw["h100-nvl-pcie-94gb"].interconnect.scaleup_domain_gpus == 2
    # L40S: no NVLink; peers over PCIe Gen4 x16 (64 GB/s bidirectional)
    assert hw["l40s-48gb"].interconnect.scaleup_bandwidth_gbps == 31.0
    assert hw["l40s-48gb"].memory.hbm_bandwidth_gbps == 864.0
    # GH200: NVLink-C2C 900 GB/s bidirectional to the Grace CPU is the host link
    assert hw["gh200-96gb"].interconnect.h2d_bandwidth_gbps == 450.0


#: parts whose only published step times are held out (llm-foundry's A100 40GB, torchtitan's Grand
#: Teton H100): never fitted, their [efficiency] is the fitted sibling's (ground_profiles copies it)
HELD_OUT_PARTS = {
    "a100-sxm4-40gb": ("a100-sxm4-80gb", ["A100 40GB", "A100-40GB"]),
    "h100-sxm-96gb-grandteton": ("h100-sxm5-80gb", [
        "H100 (Grand Teton: 96GB HBM2e, 500W power limit, NVLink intra-host, 400Gb/s/GPU RDMA)",
        "H100 SXM 95GB HBM2e lower-TDP (per doc footnote)"]),
}


@pytest.mark.parametrize("name", sorted(HELD_OUT_PARTS))
def test_held_out_parts_copy_their_siblings_coefficients_and_resolve(name, mofa_predictor):
    reg = mofa_predictor.registry
    sibling, aliases = HELD_OUT_PARTS[name]
    assert attrs.asdict(reg.hardware[name].efficiency) == attrs.asdict(reg.hardware[sibling].efficiency)
    for alias in aliases:
        assert reg.hardware_profile(alias).name == name, alias


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_no_profile_is_fitted_on_a_held_out_source(path):
    """The sources added after the fits (``--builtin-set newer``) and the older copies of the same
    benchmark tables (torchtitan's docs: ``torchtitan.csv``, ``torchtitan_dense.csv``) stay out of
    every recorded fit (the ``# N rows (source: n, ...)`` line a refit writes)."""
    from mofa_framework.measurements import builtin_sets

    held_out = {Path(f).stem for f in builtin_sets()["newer"]} | {"torchtitan", "torchtitan_dense"}
    assert {"llm_foundry", "torchtitan_benchmarks"} <= held_out
    for line in re.findall(r"^# \d+ rows \((.*?)\)", path.read_text(), flags=re.M):
        used = {s.split(":")[0].strip() for s in line.split(",") if int(s.split(":")[1]) > 0}
        assert not used & held_out, f"{path.stem} fitted on {used & held_out}"


#: GH100 parts with no step times in the calibration set: H100 SXM5's fitted coefficients (the same
#: die, so the same measured-to-achieved GEMM factor and framework overheads), their own HBM
GH100_PARTS = {"h800-sxm5-80gb": 0.8866, "h200-sxm-141gb": 0.8708, "h100-pcie-80gb": 0.8866}


@pytest.mark.parametrize("name", sorted(GH100_PARTS))
def test_gh100_parts_copy_h100_sxm5_coefficients_but_keep_their_memory_efficiency(name, mofa_predictor):
    hw = mofa_predictor.registry.hardware
    mine, sib = attrs.asdict(hw[name].efficiency), attrs.asdict(hw["h100-sxm5-80gb"].efficiency)
    assert mine.pop("memory_efficiency") == GH100_PARTS[name]  # BabelStream: H200's own, else H100's
    sib.pop("memory_efficiency")
    assert mine == sib
    assert sib["profiled_gemm_relative_efficiency"] < 1.0  # a fitted value reached the copy, not a default


def _ground_profiles():
    """benchmarks/ground_profiles.py as a module (a script, not a package)."""
    import importlib.util
    import sys
    spec = importlib.util.spec_from_file_location("ground_profiles", ROOT / "benchmarks" / "ground_profiles.py")
    gp = importlib.util.module_from_spec(spec)
    sys.modules["ground_profiles"] = gp
    spec.loader.exec_module(gp)
    return gp


def test_copying_keeps_the_parts_own_memory_efficiency(tmp_path, monkeypatch):
    gp = _ground_profiles()
    (tmp_path / "sib.toml").write_text("[efficiency]\nmemory_efficiency = 0.5\nstep_overhead_s = 1.0\n")
    monkeypatch.setattr(gp, "PROFILES", tmp_path)
    part = "# [efficiency] copied from the fitted sibling `sib` (why)\n[efficiency]\nmemory_efficiency = 0.9\n"
    assert gp.copy_sibling_efficiency(part).endswith("[efficiency]\nmemory_efficiency = 0.9\nstep_overhead_s = 1.0\n")
    bare = "# [efficiency] copied from the fitted sibling `sib` (why)\n[efficiency]\n"
    assert gp.copy_sibling_efficiency(bare).endswith("[efficiency]\nmemory_efficiency = 0.5\nstep_overhead_s = 1.0\n")


#: (h2d, d2h) GB/s: nvbandwidth's copy-engine measurements (microbench_memory.csv), each part's own
#: or, for the parts on the same PCIe Gen5 x16 host link, H100 SXM5's; A100's two directions disagree
#: (26.28 / 6.27 on Azure ND A100 v4) and are not taken: its PCIe Gen4 nominal 31 GB/s stays
HOST_LINKS = {"h100-sxm5-80gb": (51.0, 52.0), "h200-sxm-141gb": (55.0, 55.0), "gb200-nvl72": (201.0, 193.0),
              "gb300-nvl72": (211.0, 193.0), "b200-sxm-180gb": (51.0, 52.0), "b300-sxm": (51.0, 52.0),
              "h800-sxm5-80gb": (51.0, 52.0), "h100-sxm-96gb-grandteton": (51.0, 52.0), "a100-sxm4-80gb": (31.0, 31.0)}


@pytest.mark.parametrize("name", sorted(HOST_LINKS))
def test_host_links_are_the_measured_copies(name, mofa_predictor):
    ic = mofa_predictor.registry.hardware[name].interconnect
    assert (ic.h2d_bandwidth_gbps, ic.d2h_bandwidth_gbps) == HOST_LINKS[name]


def test_host_link_directions_that_disagree_are_not_taken():
    """`host_link` reads the medians of the current nvbandwidth rows (the measurements shipped with
    MoFa, copies of ../shared/data); the A100 pair (26.28 / 6.27 GB/s, more than 10 % apart) comes
    back as no measurement, with the reason."""
    gp = _ground_profiles()
    data = gp.DATA
    assert gp.host_link(data, "GB200 (one")[:2] == (201.0, 193.0)
    h2d, d2h, why = gp.host_link(data, "A100-SXM4-80GB")
    assert (h2d, d2h) == (None, None) and "26.28 / device to host 6.27" in why and "not taken" in why


def test_power_capped_part_runs_its_siblings_tables_at_the_capped_clock(mofa_predictor):
    """The Grand Teton H100 (500 W) carries H100 SXM5's GEMM and attention tables as measured at
    700 W, unscaled, and its 500 W limit against that 700 W: the providers run tensor-core work at
    ((500 − 70)/(700 − 70))^(1/3) = 0.8805 of the tables (tests/test_power_limit.py), once — the
    tables are not scaled as well; its (scale-up) collectives are H100 SXM5's."""
    hw = mofa_predictor.registry.hardware
    cap, sib = hw["h100-sxm-96gb-grandteton"], hw["h100-sxm5-80gb"]
    assert (cap.compute.tdp_w, cap.compute.power_limit_w) == (700.0, 500.0)
    assert cap.compute_clock_scale == pytest.approx(0.8805, abs=1e-4) and sib.compute_clock_scale == 1.0
    assert cap.gemm_profile == sib.gemm_profile and cap.attention_profile == sib.attention_profile
    assert cap.collective_profile == tuple(p for p in sib.collective_profile if p.scope == "scaleup")
    assert "compute.power_limit_w = 500" in cap.notes


_EDGE_KEYS = sorted(k for k in PROFILE_LIMITS
                    if k.split(".")[0] in ("memory", "interconnect", "host", "efficiency"))


def _at_edges(hw, picks):
    """`hw` with each (key, lower or upper end) of `picks` set to that end of its bound."""
    for key, upper in picks:
        section, field = key.split(".")
        b = PROFILE_LIMITS[key]
        value = b.hi if upper else b.lo
        value = int(value) if b.integer else float(value)
        part = getattr(hw, section)
        hw = attrs.evolve(hw, **{section: attrs.evolve(part, **{field: value})})
    return hw


def test_every_profile_within_its_bounds_prices_a_finite_step(mofa_predictor):
    """The bounds' promise (mofa_framework/limits.py): a profile anywhere inside them gives every
    number finite. Six of its numbers at once at the ends of their bounds, 200 draws, an MoE job
    with overlaps, recompute and offload: a finite, positive step, and no RuntimeWarning."""
    import random
    import warnings

    import numpy as np

    from mofa_framework.config import jobs_to_batch

    job = mofa_predictor.job({"model": {"name": "mixtral-8x7b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 32},
                              "parallel": {"tp": 2, "pp": 2, "cp": 2, "ep": 4, "micro_batch_size": 1,
                                           "global_batch_size": 32, "sequence_length": 4096},
                              "features": {"distributed_optimizer": {}, "ep_overlap": {}, "cp_overlap": {},
                                           "tp_overlap": {}, "pp_overlap": {}, "dp_overlap": {},
                                           "recompute": {"granularity": "selective"}, "activation_offload": {}}})
    batch = jobs_to_batch([job], mofa_predictor.registry)
    rng = random.Random(0)
    tried = 0
    for _ in range(200):
        picks = [(k, rng.random() < 0.5) for k in rng.sample(_EDGE_KEYS, 6)]
        try:
            hw = _at_edges(job.hardware, picks)
        except ValueError:  # a cross-field rule (a power limit above its TDP, ...)
            continue
        tried += 1
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            step = float(mofa_predictor.evaluate(batch, job.model, hw).step_time_s[0])
        assert np.isfinite(step) and step > 0, picks
    assert tried > 150


def test_every_number_of_a_profile_table_has_its_bound():
    """The sections' fields check ``PROFILE_LIMITS["section.<field>"]`` by name: a field added
    without a bound would fail only when set, so every one is listed here."""
    from mofa_framework.types import EfficiencySpec, HostSpec, InterconnectSpec, MemorySpec

    for section, cls in (("memory", MemorySpec), ("interconnect", InterconnectSpec), ("host", HostSpec),
                         ("efficiency", EfficiencySpec)):
        missing = [f.name for f in attrs.fields(cls) if f"{section}.{f.name}" not in PROFILE_LIMITS]
        assert not missing, (section, missing)
    EfficiencySpec()  # every default within its bound


#: (part, its same-die sibling whose own cuBLASLt NVFP4 sweep it takes, the dense NVFP4 peaks' ratio)
SAME_DIE_FP4 = {"b200-sxm-180gb": ("gb200-nvl72", 9000.0 / 9800.0), "b300-sxm": ("gb300-nvl72", 13500.0 / 14700.0)}


@pytest.mark.parametrize("name", sorted(SAME_DIE_FP4))
def test_fp4_table_is_the_same_dies_measured_sweep_at_the_peak_ratio(name, mofa_predictor):
    """B200 and B300 measured no NVFP4 GEMM; their siblings on the same die (GB200 / GB300, Azure's
    cuBLASLt sweep) did. Each fp4 point is the sibling's measured one × the dense-peak ratio: by
    hand, GB200's 8192³ 7,609.1 TFLOPS × 9,000/9,800 = 6,987.95; GB300's 8,155.9 × 13,500/14,700 =
    7,490.11 (the tables keep two decimals). Before, the two fell to the roofline at the datasheet
    peak and priced NVFP4 faster than their better-powered siblings."""
    sibling, ratio = SAME_DIE_FP4[name]
    reg = mofa_predictor.registry
    table = {(p.m, p.n, p.k): p.tflops for p in reg.hardware[name].gemm_profile if p.dtype == "fp4"}
    theirs = {(p.m, p.n, p.k): p.tflops for p in reg.hardware[sibling].gemm_profile if p.dtype == "fp4"}
    assert len(table) == len(theirs) == 8
    assert table == {k: pytest.approx(v * ratio, abs=0.01) for k, v in theirs.items()}
    hand = {"b200-sxm-180gb": 6987.95, "b300-sxm": 7490.11}[name]
    assert table[(8192, 8192, 8192)] == pytest.approx(hand, abs=0.01)


def test_same_die_sibling_supplies_only_the_dtypes_named():
    """`gemm_siblings` takes the named dtypes from the sibling's own measurements only: B300 keeps
    B200's 126 XLA shapes for fp8 (scaled to its own MAMF point, which it keeps), not GB300's 9
    Azure ones."""
    gp = _ground_profiles()
    built = gp.build(gp.DATA)["b300-sxm"]
    by_dtype = {}
    for p in built["gemm"]:
        by_dtype[p["dtype"]] = by_dtype.get(p["dtype"], 0) + 1
    assert by_dtype == {"bf16": 127, "fp8": 127, "fp4": 8}  # its own MAMF point + B200's 126
    assert "fp4 shapes from gb300-nvl72 (8), scaled ×0.918 by the dense-peak ratio (measured on the same die)" \
        in built["notes"]


@pytest.mark.parametrize("name, sibling", [("h20-96gb", "h100-sxm5-80gb"), ("h200-sxm-141gb", "h100-sxm5-80gb")])
def test_a_part_on_its_siblings_board_takes_its_measured_scale_up_curves(name, sibling, mofa_predictor):
    """HGX H20 sits on HGX H100's NVLink 4 switch board (450 GB/s per direction): without a collective
    measurement of its own it takes H100's scale-up curves (the formula had priced an 8-GPU all-to-all
    of 1 MB at 105 GB/s of bus bandwidth against H100's measured 16); H200 adds its own all-reduce."""
    hw = mofa_predictor.registry.hardware
    mine = {(p.kind, p.group_size, p.message_bytes): p.busbw_gbps for p in hw[name].collective_profile}
    theirs = {(p.kind, p.group_size, p.message_bytes): p.busbw_gbps for p in hw[sibling].collective_profile
              if p.scope == "scaleup" and p.kind == "all_to_all"}
    assert theirs and all(mine[k] == v for k, v in theirs.items())


def test_b300_takes_b200s_measured_scale_up_collectives(mofa_predictor):
    """HGX B300 has HGX B200's NVLink 5 switch board (900 GB/s per GPU): its scale-up collectives are
    B200's measured curves (XLA's sm_100 tables, AWS p6's one-node all-reduce), not the ring formula,
    which had priced an 8-GPU all-to-all of 16 MB at 485 GB/s of bus bandwidth against B200's
    measured 189. Its scale-out (800 Gb/s NICs, B200's 400) keeps the formula."""
    hw = mofa_predictor.registry.hardware
    b300, b200 = hw["b300-sxm"].collective_profile, hw["b200-sxm-180gb"].collective_profile
    assert b300 and b300 == tuple(p for p in b200 if p.scope == "scaleup")
    assert not any(p.scope == "scaleout" for p in b300)


def test_a800_prices_attention_from_a100s_measured_row(mofa_predictor):
    """A800 is A100 80GB's GA100 at the same clocks (NVLink cut to 400 GB/s): it carries A100's
    FlashAttention-2 row (179.5 TFLOPS at head dim 64, 8K tokens), so the same job's compute is A100's
    to the bit; without the row its attention fell to the roofline (3.6 % more backward compute on a
    Llama 2 7B step)."""
    hw = mofa_predictor.registry.hardware
    assert hw["a800-sxm4-80gb"].attention_profile == hw["a100-sxm4-80gb"].attention_profile
    base = {"model": {"name": "llama2-7b"}, "parallel": {"tp": 1, "pp": 1, "micro_batch_size": 1,
                                                         "global_batch_size": 64, "sequence_length": 4096}}
    got = {name: mofa_predictor.predict(mofa_predictor.job({**base, "hardware": {"name": name, "num_gpus": 8}}))[0]
           for name in ("a100-sxm4-80gb", "a800-sxm4-80gb")}
    for k in ("compute_fwd", "compute_bwd_input", "compute_bwd_weight"):
        assert got["a800-sxm4-80gb"].breakdown[k] == got["a100-sxm4-80gb"].breakdown[k], k
