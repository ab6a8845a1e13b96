"""Every shipped hardware profile loads, and its peaks are the ones ``shared/data/gpu_specs.csv``
lists for the row its ``source`` names; the parts added for issue 18 §3 resolve under the names
runs publish them with."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import attrs
import pytest

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
