"""Write the shipped hardware profiles' microbenchmark tables from ``microbench/`` of the measurements.

    .venv/bin/python benchmarks/ground_profiles.py [--data DIR] [--check]

Reads the copy shipped with MoFa (``mofa_measurements``, the same files as ``../shared/data``);
``--data`` or ``$MOFA_SHARED_DATA`` for another copy.

For every shipped profile this script writes, between its markers near the top of the TOML,
the ``gemm_profile``, ``attention_profile`` and ``collective_profile`` arrays (the
``[[gemm_profile]]`` / ``[[attention_profile]]`` / ``[[collective_profile]]`` schema, written as
arrays of inline tables), sets ``[efficiency] memory_efficiency`` from BabelStream and
``[interconnect] h2d_bandwidth_gbps`` / ``d2h_bandwidth_gbps`` from nvbandwidth's host-link copies,
and records in the profile's ``notes`` where every table came from. What it reads and why is in
``SOURCES`` below; ``docs/validation.md`` ("Grounding in microbenchmarks") explains the choices.
``--check`` exits 1 when a profile is out of date.

Rules: only ``version_status = current`` rows; GEMMs of batch 1 only; a row above the GPU's dense
datasheet peak is physically impossible and is dropped (XLA's sm_90 fp8 table reaches 2,424
TFLOPS on a 1,979 TFLOPS part, and disagrees with cuBLASLt's 1,217 at 4096³: the whole table is
left out). A GPU without a measurement of its own takes its nearest measured sibling's table,
scaled to its own measured best shape (``MAMF``) where one exists, else by the ratio of the dense
peaks in ``gpu_specs.csv``; its notes say so. A dtype that neither it nor that sibling measured comes
from a sibling on the same die that did (``gemm_siblings``: B200's and B300's NVFP4 from GB200's and
GB300's cuBLASLt sweeps), that sibling's own points only, scaled the same way; without one the dtype
has no table and its GEMMs fall to the roofline at the datasheet peak.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mofa_framework.measurements import builtin_data_dir  # noqa: E402

DATA = Path(os.environ.get("MOFA_SHARED_DATA") or builtin_data_dir())
PROFILES = ROOT / "hardware_profiles"
BEGIN = "# >>> microbenchmark tables (benchmarks/ground_profiles.py writes this block; do not edit)"
END = "# <<< microbenchmark tables"
NOTE = " Microbenchmarks:"

XLA_GEMM = "microbench_gemm_xla_perf_tables.csv"
GEMM = "microbench_gemm.csv"
XLA_COLL = "microbench_collectives_xla_perf_tables.csv"
COLL = "microbench_collectives.csv"

# (file, gpu prefix, system substring, dtype substring in the row, dtype written)
G = {
    "xla-h100-bf16": (XLA_GEMM, "sm_90", "", "bf16xbf16->bf16", "bf16"),
    "mamf-h100-bf16": (GEMM, "NVIDIA H100 SXM", "MAMF", "bf16", "bf16"),
    "azure-h100-fp8": (GEMM, "H100-SXM5-80GB", "Azure", "fp8", "fp8"),
    "mamf-h100-fp8": (GEMM, "NVIDIA H100 SXM", "MAMF", "fp8", "fp8"),
    "azure-a100-fp16": (GEMM, "A100-SXM4-80GB", "Azure", "fp16", "fp16"),
    "azure-a100-as-bf16": (GEMM, "A100-SXM4-80GB", "Azure", "fp16", "bf16"),
    "mamf-a100-bf16": (GEMM, "NVIDIA A100 SXM", "MAMF", "bf16", "bf16"),
    "azure-h200-fp8": (GEMM, "H200-SXM", "Azure", "fp8", "fp8"),
    "mamf-h200-fp8": (GEMM, "NVIDIA H200 SXM", "MAMF", "fp8", "fp8"),
    "xla-b200-bf16": (XLA_GEMM, "B200 (sm_100)", "", "bf16xbf16->bf16", "bf16"),
    "xla-b200-fp8": (XLA_GEMM, "B200 (sm_100)", "", "f8e4m3fnxf8e4m3fn->bf16", "fp8"),
    "mamf-b200-bf16": (GEMM, "NVIDIA B200 SXM", "MAMF", "bf16", "bf16"),
    "mamf-b200-fp8": (GEMM, "NVIDIA B200 SXM", "MAMF", "fp8", "fp8"),
    "azure-gb200-fp8": (GEMM, "GB200 (one", "Azure", "fp8", "fp8"),
    "azure-gb200-fp4": (GEMM, "GB200 (one", "Azure", "fp4", "fp4"),
    "mamf-gb200-bf16": (GEMM, "NVIDIA GB200 SXM", "MAMF", "bf16", "bf16"),
    "mamf-gb200-fp8": (GEMM, "NVIDIA GB200 SXM", "MAMF", "fp8", "fp8"),
    "mamf-b300-bf16": (GEMM, "NVIDIA B300 SXM", "MAMF", "bf16", "bf16"),
    "mamf-b300-fp8": (GEMM, "NVIDIA B300 SXM", "MAMF", "fp8", "fp8"),
    "azure-gb300-fp8": (GEMM, "GB300 (one", "Azure", "fp8", "fp8"),
    "azure-gb300-fp4": (GEMM, "GB300 (one", "Azure", "fp4", "fp4"),
    "xla-mi300x-bf16": (XLA_GEMM, "AMD gfx942", "", "bf16xbf16->bf16", "bf16"),
    "xla-mi300x-fp8": (XLA_GEMM, "AMD gfx942", "", "f8e4m3fnxf8e4m3fn->bf16", "fp8"),
    "azure-mi300x-fp8": (GEMM, "MI300X 192GB", "Azure", "fp8", "fp8"),
    "mamf-mi300x-bf16": (GEMM, "AMD MI300X", "MAMF", "bf16", "bf16"),
    "mamf-mi325x-bf16": (GEMM, "AMD MI325X", "MAMF", "bf16", "bf16"),
    "mamf-gh200-bf16": (GEMM, "NVIDIA GH200 SXM", "MAMF", "bf16", "bf16"),
    "mamf-gh200-fp8": (GEMM, "NVIDIA GH200 SXM", "MAMF", "fp8", "fp8"),
    "mamf-gaudi2-bf16": (GEMM, "Intel Gaudi 2", "MAMF", "bf16", "bf16"),
    "mamf-gaudi2-fp8": (GEMM, "Intel Gaudi 2", "MAMF", "fp8", "fp8"),
    "mamf-gaudi3-bf16": (GEMM, "Intel Gaudi 3", "MAMF", "bf16", "bf16"),
    "mamf-gaudi3-fp8": (GEMM, "Intel Gaudi 3", "MAMF", "fp8", "fp8"),
}

# (gpu prefix in microbench_attention.csv)
A = {"a100": "A100-SXM4-80GB", "h100": "H100-SXM5-80GB", "h200": "H200-SXM", "gb200": "GB200 (one",
     "gb300": "GB300 (one", "mi300x": "MI300X 192GB"}

# collectives: (file, gpu prefix, system substring, collective substring, kind, scope)
C = {
    "azure-h100-ar": (COLL, "H100-SXM5-80GB (HBM3)", "Azure ND H100", "all_reduce", "all_reduce", "scaleup"),
    "aws-p5-ar": (COLL, "H100-SXM5-80GB (p5", "AWS 2x p5", "all_reduce", "all_reduce", "scaleout"),
    "xla-h100": (XLA_COLL, "sm_90", "", "", "", "scaleup"),
    "azure-a100-ar": (COLL, "A100-SXM4-80GB", "Azure ND A100", "all_reduce", "all_reduce", "scaleup"),
    "a100-sendrecv": (COLL, "A100 (SXM, NVLink3 600", "single node 8x A100", "sendrecv", "p2p", "scaleup"),
    "azure-h200-ar": (COLL, "H200-SXM 141GB", "Azure ND H200", "all_reduce", "all_reduce", "scaleup"),
    "xla-b200": (XLA_COLL, "B200 (sm_100)", "", "", "", "scaleup"),
    "aws-p6-ar-1": (COLL, "B200 (p6-b200", "1 node(s) x 8 B200", "all_reduce", "all_reduce", "scaleup"),
    "aws-p6-ar-4": (COLL, "B200 (p6-b200", "4 node(s) x 8 B200", "all_reduce", "all_reduce", "scaleout"),
    "xla-gb200": (XLA_COLL, "GB200 (sm_100)", "", "", "", "scaleup"),
    "xla-gb300": (XLA_COLL, "GB300 (sm_103)", "", "", "", "scaleup"),
    "xla-mi300x": (XLA_COLL, "AMD gfx942", "", "", "", "scaleup"),
    "azure-mi300x-ar": (COLL, "MI300X 192GB", "Azure ND MI300X", "all_reduce", "all_reduce", "scaleup"),
}

#: per profile: GEMM sources; a sibling profile whose GEMM table it takes (scaled, see module doc);
#: ``gemm_siblings``, {profile of the same die: dtypes} whose own measurements supply dtypes neither
#: the profile nor its ``sibling`` measured (B200's and B300's NVFP4: GB200's and GB300's cuBLASLt sweeps);
#: the attention row; collective sources (or a sibling's); the BabelStream GPU (or a sibling's); the
#: nvbandwidth GPU of its host link (``host``), or the profile whose measured link is the same kind
#: (``host_sibling``: PCIe Gen5 x16 to an x86 host); SM count (public datasheets); notes
SOURCES: dict[str, dict] = {
    "h100-sxm5-80gb": dict(gemm=["xla-h100-bf16", "mamf-h100-bf16", "azure-h100-fp8", "mamf-h100-fp8"],
                           attention="h100", coll=["azure-h100-ar", "xla-h100", "aws-p5-ar"], stream="H100-SXM5-80GB",
                           host="H100-SXM5-80GB", sm=132),
    "h100-sxm-96gb-grandteton": dict(sibling="h100-sxm5-80gb", attention="h100", coll_sibling="h100-sxm5-80gb",
                                     stream_sibling="h100-sxm5-80gb", host_sibling="h100-sxm5-80gb", sm=132,
                                     why="the same GH100 SXM part at 500 W instead of 700 W: its tables are H100 "
                                         "SXM5's as measured at 700 W, and compute.power_limit_w = 500 prices the "
                                         "cap at run time (HardwareProfile.compute_clock_scale); the only step times "
                                         "on this part, torchtitan's benchmarks, are held out of every fit, so "
                                         "[efficiency] is H100 SXM5's, copied"),
    "h800-sxm5-80gb": dict(sibling="h100-sxm5-80gb", attention="h100", stream_sibling="h100-sxm5-80gb",
                           host_sibling="h100-sxm5-80gb", sm=132,
                           why="H800 SXM5 has H100 SXM5's compute and HBM3; only NVLink (400 GB/s) differs, so "
                               "its collectives keep the formula"),
    "h100-pcie-80gb": dict(sibling="h100-sxm5-80gb", attention="h100", attention_scale=756.0 / 989.0, sm=114,
                           host_sibling="h100-sxm5-80gb",
                           why="H100 PCIe (114 SMs, 350 W): H100 SXM5's tables scaled by the dense-peak ratio of "
                               "gpu_specs.csv (756/989)"),
    "h200-sxm-141gb": dict(gemm=["azure-h200-fp8", "mamf-h200-fp8"], sibling="h100-sxm5-80gb", attention="h200",
                           coll=["azure-h200-ar"], coll_sibling="h100-sxm5-80gb", stream="H200-SXM", host="H200-SXM",
                           sm=132,
                           why="H200 has H100 SXM5's compute: its bf16 GEMMs and the collectives it has no "
                               "measurement of take H100 SXM5's"),
    "a100-sxm4-80gb": dict(attention="a100", stream="A100-SXM4-80GB", host="A100-SXM4-80GB", sm=108,
                           why="NO GEMM table: Azure's A100 cuBLASLt table has 8 shapes, all 1024-32768 with k >= 768, "
                               "and says nothing of the small and thin GEMMs (unfused attention at k = 64, narrow TP "
                               "shards) of vTrain's 1,440 single-node runs; priced from it, the A100 rows' in-sample "
                               "error rose from 6.2 % to 11 %, so A100's GEMMs stay on the roofline fitted to step "
                               "times until a fuller sweep (mofa profile) exists. NO COLLECTIVE TABLE either: two "
                               "single-node nccl-tests sweeps agree (Azure ND A100 v4 and an 8x A100 NVSwitch node: "
                               "all-reduce 170 GB/s bus bandwidth at 128 MB, 230 GB/s at 1 GB), but priced from them "
                               "Korthikanti's measured full-recompute cost per layer (22B, TP 8: 7.6 ms) comes out 8 % "
                               "slow and ZeroBubble's schedule order worse than with the fitted ring formula; the "
                               "disagreement is recorded in docs/profiling.md, not resolved. No multi-node A100 "
                               "measurement matches DGX A100's 8 x 200 Gb/s (AWS p4de has 4 x 100 Gb/s per node)"),
    "a800-sxm4-80gb": dict(attention="a100", stream_sibling="a100-sxm4-80gb", sm=108,
                           why="A800: A100 80GB's GA100 at the same clocks and HBM2e (NVLink cut to 400 GB/s): its "
                               "FlashAttention-2 row and BabelStream efficiency"),
    "a100-sxm4-40gb": dict(sibling="a100-sxm4-80gb", attention="a100", coll_sibling="a100-sxm4-80gb", sm=108,
                           why="A100 40GB has A100 80GB's compute and NVSwitch; its HBM2 (1.56 TB/s) takes "
                               "A100 80GB's BabelStream efficiency", stream_sibling="a100-sxm4-80gb"),
    "b200-sxm-180gb": dict(gemm=["xla-b200-bf16", "xla-b200-fp8", "mamf-b200-bf16", "mamf-b200-fp8"],
                           gemm_siblings={"gb200-nvl72": ["fp4"]},
                           attention="gb200", coll=["xla-b200", "aws-p6-ar-1", "aws-p6-ar-4"],
                           stream_sibling="h200-sxm-141gb", host_sibling="h100-sxm5-80gb", sm=148,
                           why="no B200 attention or BabelStream row: GB200's FlashAttention-2 row and "
                               "H200's HBM3e efficiency"),
    "gb200-nvl72": dict(gemm=["azure-gb200-fp8", "azure-gb200-fp4", "mamf-gb200-bf16", "mamf-gb200-fp8"],
                        sibling="b200-sxm-180gb", attention="gb200", coll=["xla-gb200"], stream_sibling="h200-sxm-141gb",
                        host="GB200 (one", sm=148,
                        why="the bf16 shapes come from B200's XLA table scaled to GB200's measured best shape; "
                            "no BabelStream row: H200's HBM3e efficiency"),
    "b300-sxm": dict(gemm=["mamf-b300-bf16", "mamf-b300-fp8"], sibling="b200-sxm-180gb",
                     gemm_siblings={"gb300-nvl72": ["fp4"]}, attention="gb300", stream_sibling="h200-sxm-141gb",
                     host_sibling="h100-sxm5-80gb", coll_sibling="b200-sxm-180gb", sm=160,
                     why="one measured shape per dtype: B200's XLA shapes scaled to it; GB300's attention row; "
                         "B200's scale-up collectives (the same HGX NVLink 5 switch board, 900 GB/s per GPU)"),
    "gb300-nvl72": dict(gemm=["azure-gb300-fp8", "azure-gb300-fp4", "mamf-b300-bf16"], sibling="b200-sxm-180gb",
                        attention="gb300", coll=["xla-gb300"], stream_sibling="h200-sxm-141gb", host="GB300 (one",
                        sm=160,
                        why="bf16: B300's measured best shape with B200's XLA shapes scaled to it"),
    "mi300x": dict(gemm=["xla-mi300x-bf16", "azure-mi300x-fp8", "mamf-mi300x-bf16"], attention="mi300x",
                   coll=["azure-mi300x-ar", "xla-mi300x"], stream="MI300X 192GB", sm=304),
    "mi325x": dict(gemm=["mamf-mi325x-bf16"], sibling="mi300x", attention="mi300x", coll_sibling="mi300x",
                   stream_sibling="mi300x", sm=304,
                   why="MI325X has MI300X's CDNA 3 compute and Infinity Fabric: MI300X's tables, its bf16 "
                       "scaled to MI325X's measured best shape"),
    # issue 18's parts (their [efficiency] is copied from the named sibling: see copy_sibling_efficiency)
    "gh200-96gb": dict(gemm=["mamf-gh200-bf16", "mamf-gh200-fp8"], sibling="h100-sxm5-80gb", attention="h100", sm=132,
                       why="GH200's Hopper GPU: H100 SXM5's GEMM shapes scaled to GH200's own measured best shapes; "
                           "H100's attention row"),
    "h100-nvl-pcie-94gb": dict(sibling="h100-sxm5-80gb", attention="h100", attention_scale=835.5 / 989.0, sm=132,
                               host_sibling="h100-sxm5-80gb",
                               why="H100 NVL: H100 SXM5's tables scaled by the dense-peak ratio (835.5/989)"),
    "h20-96gb": dict(sibling="h100-sxm5-80gb", attention="h100", attention_scale=148.0 / 989.0,
                     host_sibling="h100-sxm5-80gb", coll_sibling="h100-sxm5-80gb",
                     why="H20: no measurement of its own; H100 SXM5's tables scaled by the dense-peak ratio "
                         "(148/989): a cut-down Hopper whose shapes' relative rates are assumed H100's; H100's "
                         "scale-up collectives (the same HGX NVLink 4 board, 450 GB/s per direction)"),
    "l40s-48gb": dict(sibling="h100-sxm5-80gb", attention="h100", attention_scale=362.05 / 989.0,
                      why="L40S (Ada, GDDR6): no measurement of its own; H100 SXM5's tables scaled by the "
                          "dense-peak ratio (362/989) — a weak prior, another architecture"),
    "gaudi2": dict(gemm=["mamf-gaudi2-bf16", "mamf-gaudi2-fp8"]),
    "gaudi3": dict(gemm=["mamf-gaudi3-bf16", "mamf-gaudi3-fp8"]),
}


def rows(data: Path, name: str) -> list[dict]:
    with open(data / "microbench" / name, newline="") as fh:
        return [r for r in csv.DictReader(fh) if r["version_status"].startswith("current")]


def gemm_points(data: Path, key: str, peak: dict) -> tuple[list[dict], str]:
    f, gpu, system, dt_in, dt_out = G[key]
    out, dropped = [], 0
    for r in rows(data, f):
        if not (r["gpu"].startswith(gpu) and system in r["system"] and dt_in in r["dtype"]):
            continue
        if (r.get("batch") or "1") != "1":
            continue
        t = float(r["tflops"])
        if t > peak.get(dt_out, peak["bf16"]):
            dropped += 1
            continue
        out.append({"m": int(r["m"]), "n": int(r["n"]), "k": int(r["k"]), "tflops": t, "dtype": dt_out})
    src = f"{f} '{gpu}'{' ' + system if system else ''} {dt_in}: {len(out)} shapes"
    return out, src + (f" ({dropped} above the dense peak dropped)" if dropped else "")


def profile_data(name: str) -> dict:
    return tomllib.loads((PROFILES / f"{name}.toml").read_text())


def hardware(name: str, gemm: list[dict]):
    """The profile as the provider sees it, with `gemm` as its table (for scaling siblings)."""
    import attrs

    from mofa_framework.config import structure_file
    from mofa_framework.types import HardwareProfile

    d = profile_data(name)
    d = {k: v for k, v in d.items() if k not in ("gemm_profile", "attention_profile", "collective_profile")}
    hw = structure_file(d, HardwareProfile, name)
    from mofa_framework.types import GemmPoint

    return attrs.evolve(hw, gemm_profile=tuple(GemmPoint(**p) for p in gemm))


def sibling_gemm(name: str, own: list[dict], sibling: str, sib_gemm: list[dict]) -> tuple[list[dict], list[str]]:
    """The sibling's points of every dtype `own` lacks enough shapes of, scaled to `own`'s measured
    best shape in that dtype where there is one, else by the dense-peak ratio."""
    from mofa_plugins.profiled_gemm import model_tflops

    peak, sib_peak = profile_data(name)["compute"]["peak_tflops"], profile_data(sibling)["compute"]["peak_tflops"]
    sib_hw = hardware(sibling, sib_gemm)
    out, notes = [], []
    for dtype in sorted({p["dtype"] for p in sib_gemm}):
        mine = [p for p in own if p["dtype"] == dtype]
        if len(mine) >= 4 or dtype not in peak:
            continue
        theirs = [p for p in sib_gemm if p["dtype"] == dtype]
        from mofa_framework.types import GemmPoint

        pts = [GemmPoint(**p) for p in theirs]
        if mine:
            best = max(mine, key=lambda p: p["tflops"])
            at = float(model_tflops(pts, sib_hw, [best["m"]], [best["n"]], [best["k"]])[0])
            scale, how = best["tflops"] / at, f"scaled ×{best['tflops'] / at:.3f} to its own measured best shape"
        else:
            scale = peak[dtype] / sib_peak[dtype]
            how = f"scaled ×{scale:.3f} by the dense-peak ratio"
        have = {(p["m"], p["n"], p["k"]) for p in mine}
        out += [{**p, "tflops": round(p["tflops"] * scale, 3)} for p in theirs if (p["m"], p["n"], p["k"]) not in have]
        notes.append(f"{dtype} shapes from {sibling} ({len(theirs)}), {how}")
    return out, notes


def level_to_cublas(name: str, by_key: dict[str, list[dict]], peak: dict) -> list[str]:
    """Where one dtype has both an XLA table and a torch/cuBLAS best shape (MAMF) and the XLA
    table's model at that shape is slower than cuBLAS measured, scale the XLA points up to cuBLAS's
    level (in place): the shapes' relative rates are XLA's, the level is that of the library a
    PyTorch framework calls. B200: XLA's 1,417 TFLOPS at 4096³ against cuBLAS's 1,745 at
    1792×16128×3072. Never above the dense peak."""
    from mofa_framework.types import GemmPoint
    from mofa_plugins.profiled_gemm import model_tflops

    notes = []
    for xk in [k for k in by_key if k.startswith("xla-")]:
        for mk in [k for k in by_key if k.startswith("mamf-")]:
            xs, ms = by_key[xk], by_key[mk]
            if not xs or not ms or xs[0]["dtype"] != ms[0]["dtype"]:
                continue
            dtype, best = xs[0]["dtype"], ms[0]
            at = float(model_tflops([GemmPoint(**p) for p in xs], hardware(name, []), [best["m"]], [best["n"]],
                                    [best["k"]])[0])
            scale = min(best["tflops"] / at, peak.get(dtype, peak["bf16"]) / max(p["tflops"] for p in xs))
            if scale > 1.0:
                by_key[xk] = [{**p, "tflops": round(p["tflops"] * scale, 3)} for p in xs]
                notes.append(f"{xk} scaled ×{scale:.3f} to {mk}'s level (XLA's model at that shape: {at:.0f} "
                             f"TFLOPS against cuBLAS's {best['tflops']:g})")
    return notes


def coll_points(data: Path, key: str) -> tuple[list[dict], str]:
    f, gpu, system, coll, kind, scope = C[key]
    raw = defaultdict(list)
    kinds = {"all-reduce": "all_reduce", "all-gather": "all_gather", "reduce-scatter": "reduce_scatter",
             "all-to-all": "all_to_all", "collective-permute": "p2p"}
    picked = defaultdict(set)
    for r in rows(data, f):
        if not (r["gpu"].startswith(gpu) and system in r["system"] and coll in r["collective"]):
            continue
        if not r["busbw_gbps"] or float(r["busbw_gbps"]) <= 0:
            continue
        k = kind or next((v for s, v in kinds.items() if r["collective"].startswith(s)), None)
        if k is None:
            continue
        dtype = re.search(r"\((\w+)\)", r["collective"])
        group = int(r["group_size"] or r["n_gpus"])
        if group < 2:
            continue
        picked[(k, group)].add(dtype.group(1) if dtype else "")
        raw[(k, group, dtype.group(1) if dtype else "", float(r["message_bytes"]))].append(float(r["busbw_gbps"]))
    out = []
    for (k, group, dt, size), v in sorted(raw.items()):
        # one element type per curve: bf16 where measured, else what there is
        if dt != ("BF16" if "BF16" in picked[(k, group)] else sorted(picked[(k, group)])[0]):
            continue
        out.append({"kind": k, "scope": scope, "group_size": group, "message_bytes": size,
                    "busbw_gbps": round(statistics.median(v), 4)})
    curves = sorted({(p["kind"], p["group_size"]) for p in out})
    return out, f"{f} '{gpu}'{' ' + system if system else ''} ({scope}): {len(out)} points, " + ", ".join(
        f"{k} n={g}" for k, g in curves)


def attention_points(data: Path, key: str, scale: float = 1.0) -> tuple[list[dict], str]:
    out = []
    for r in rows(data, "microbench_attention.csv"):
        if r["gpu"].startswith(A[key]) and r["impl"].startswith("FlashAttention-2"):
            out.append({"head_dim": int(r["head_dim"]), "seq_len": int(r["seq_len"]),
                        "causal": r["causal"] == "True", "dtype": "bf16", "direction": "fwd",
                        "tflops": round(float(r["tflops"]) * scale, 3)})
    return out, (f"microbench_attention.csv FlashAttention-2 '{A[key]}' (pass not stated by the source: "
                 f"taken as the forward the benchmark prints first)")


def stream_efficiency(data: Path, gpu: str, spec_gbps: float) -> tuple[float, str]:
    tri = [float(r["tb_per_s"]) for r in rows(data, "microbench_memory.csv")
           if r["gpu"].startswith(gpu) and r["test"] == "BabelStream Triad"]
    tb = statistics.median(tri)
    return round(min(1.0, tb * 1000.0 / spec_gbps), 4), f"BabelStream Triad {tb:g} TB/s of {spec_gbps:g} GB/s ({gpu})"


#: nvbandwidth's copy-engine tests of the host link (``microbench_memory.csv``)
HOST_TESTS = ("nvbandwidth Host to Device", "nvbandwidth Device to Host")
#: the two directions of one link measured further apart than this are not taken: a PCIe or C2C link
#: moves about the same either way (H100 51 / 52, H200 55 / 55, GB200 201 / 193 GB/s); a reading
#: several times lower one way is its platform's (Azure ND A100 v4: 26.28 / 6.27), not the GPU's
HOST_AGREE = 0.10


def _gbps(row: dict) -> float:
    """nvbandwidth's figure as its test name states it ("(GB/s=26.28)"), else the rounded TB/s column."""
    m = re.search(r"GB/s=([0-9.]+)", row["test"])
    return float(m.group(1)) if m else float(row["tb_per_s"]) * 1000.0


def host_link(data: Path, gpu: str) -> tuple[float | None, float | None, str]:
    """(h2d, d2h) GB/s measured by nvbandwidth on `gpu` (median of the current rows), or (None,
    None) with the reason when the two directions disagree by more than :data:`HOST_AGREE`."""
    got, label = [], gpu
    for test in HOST_TESTS:
        hits = [r for r in rows(data, "microbench_memory.csv")
                if r["gpu"].startswith(gpu) and r["test"].startswith(test)]
        got.append(round(statistics.median(_gbps(r) for r in hits), 2) if hits else None)
        label = hits[0]["gpu"].split(" (")[0] if hits else label
    h2d, d2h = got
    if h2d is None or d2h is None:
        return None, None, f"no nvbandwidth host-link row for {gpu}"
    src = f"nvbandwidth host to device {h2d:g} / device to host {d2h:g} GB/s ({label}, {hits[0]['system']})"
    if abs(h2d - d2h) > HOST_AGREE * max(h2d, d2h):
        return None, None, f"{src} not taken (the directions disagree: the measured system's quirk)"
    return h2d, d2h, src


def measured_gemm(data: Path, name: str) -> tuple[list[dict], list[str]]:
    """(the GEMM points `name` measured itself — its ``gemm`` sources, XLA tables levelled to a
    cuBLAS best shape — none taken from a sibling; where each came from)."""
    peak = profile_data(name)["compute"]["peak_tflops"]
    by_key, notes = {}, []
    for key in SOURCES[name].get("gemm", []):
        by_key[key], src = gemm_points(data, key, peak)
        notes.append(src)
    notes += level_to_cublas(name, by_key, peak)
    return [p for pts in by_key.values() for p in pts], notes


def build(data: Path) -> dict[str, dict]:
    """name → {gemm, attention, collective, memory_efficiency, host_link, notes, sm_count} for every
    profile in SOURCES."""
    out: dict[str, dict] = {}
    order = sorted(SOURCES, key=lambda n: ("sibling" in SOURCES[n] or "coll_sibling" in SOURCES[n]
                                           or "stream_sibling" in SOURCES[n] or "host_sibling" in SOURCES[n], n))
    for name in order:
        spec = SOURCES[name]
        d = profile_data(name)
        gemm, notes = measured_gemm(data, name)
        for die, dtypes in spec.get("gemm_siblings", {}).items():  # the same die first; its own measurements
            theirs = [p for p in measured_gemm(data, die)[0] if p["dtype"] in dtypes]
            more, how = sibling_gemm(name, gemm, die, theirs)
            gemm += more
            notes += [f"{h} (measured on the same die)" for h in how]
        sib = spec.get("sibling")
        if sib:
            more, how = sibling_gemm(name, gemm, sib, out[sib]["gemm"] if sib in out else build_one(data, sib)["gemm"])
            gemm += more
            notes += how
        scale = spec.get("attention_scale", 1.0)
        att, src = attention_points(data, spec["attention"], scale) if "attention" in spec else ([], "")
        if src:
            notes.append(src + (f", scaled ×{scale:.3f}" if scale != 1.0 else ""))
        coll = []
        for key in spec.get("coll", []):
            pts, src = coll_points(data, key)
            # the first source of a curve (kind, scope, group size) keeps it: curves of two systems
            # are not mixed
            have = {(p["kind"], p["scope"], p["group_size"]) for p in coll}
            coll += [p for p in pts if (p["kind"], p["scope"], p["group_size"]) not in have]
            notes.append(src)
        cs = spec.get("coll_sibling")
        if cs:
            have = {(p["kind"], p["scope"]) for p in coll}
            theirs = [p for p in (out[cs] if cs in out else build_one(data, cs))["collective"]
                      if (p["kind"], p["scope"]) not in have and p["scope"] == "scaleup"]
            coll += theirs
            if theirs:
                notes.append(f"scale-up collectives {sorted({p['kind'] for p in theirs})} from {cs}")
        mem = None
        if "stream" in spec:
            mem, src = stream_efficiency(data, spec["stream"], d["memory"]["hbm_bandwidth_gbps"])
            notes.append(f"memory_efficiency {mem} = {src}")
        elif "stream_sibling" in spec:
            ss = spec["stream_sibling"]
            mem, src = stream_efficiency(data, SOURCES[ss]["stream"], profile_data(ss)["memory"]["hbm_bandwidth_gbps"])
            notes.append(f"memory_efficiency {mem} from sibling: {src}")
        link = (None, None)
        if "host" in spec:
            *link, src = host_link(data, spec["host"])
            notes.append(f"h2d / d2h_bandwidth_gbps = {src}" if link[0] else src)
        elif "host_sibling" in spec:
            *link, src = host_link(data, SOURCES[spec["host_sibling"]]["host"])
            notes.append(f"h2d / d2h_bandwidth_gbps from sibling {spec['host_sibling']} (the same PCIe Gen5 x16 "
                         f"host link): {src}")
        if spec.get("why"):
            notes.append(spec["why"])
        out[name] = {"gemm": gemm, "attention": att, "collective": coll, "memory_efficiency": mem,
                     "host_link": tuple(link), "notes": "; ".join(notes), "sm_count": spec.get("sm")}
    return out


_CACHE: dict[str, dict] = {}


def build_one(data: Path, name: str) -> dict:
    if name not in _CACHE:
        _CACHE.update(build(data))
    return _CACHE[name]


def rewrite(text: str, entry: dict) -> str:
    from mofa_plugins.profiler import set_host_link, set_memory_efficiency, tables_block, with_tables

    text = with_tables(text, tables_block(entry["gemm"], entry["attention"], entry["collective"], begin=BEGIN))
    note = (NOTE + " " + entry["notes"] + ".").replace('"', "'")
    text = re.sub(r'^(notes = ".*?)(?: Microbenchmarks:.*)?"$', lambda m: m.group(1) + note + '"', text, count=1,
                  flags=re.M)
    if entry["sm_count"]:
        text = re.sub(r"^sm_count = .*\n", "", text, flags=re.M)
        text = re.sub(r"^(\[compute\]\n(?:.*\n)*?peak_tflops = .*\n)", lambda m: m.group(1) +
                      f"sm_count = {entry['sm_count']}\n", text, count=1, flags=re.M)
    if entry["memory_efficiency"] is not None:
        text = set_memory_efficiency(text, entry["memory_efficiency"])
    if entry.get("host_link", (None, None))[0] is not None:
        text = set_host_link(text, *entry["host_link"])
    return text


COPIED = re.compile(r"^# \[efficiency\] copied from the fitted sibling `([a-z0-9.\-]+)`.*$", re.M)


EFFICIENCY = re.compile(r"^\[efficiency\]\n.*?(?=^\[|\Z)", flags=re.S | re.M)
MEMORY_EFFICIENCY = re.compile(r"^memory_efficiency = .*$", re.M)


def copy_sibling_efficiency(text: str) -> str:
    """A profile whose ``[efficiency]`` says it is copied from a fitted sibling gets the sibling's
    current table (so a refit of the sibling reaches its copies), except ``memory_efficiency``:
    the part's own BabelStream figure where it has one (``set_memory_efficiency``)."""
    m = COPIED.search(text)
    if not m:
        return text
    sib = (PROFILES / f"{m.group(1)}.toml").read_text()
    table = EFFICIENCY.search(sib).group(0).rstrip("\n") + "\n"
    own = EFFICIENCY.search(text)
    mine = MEMORY_EFFICIENCY.search(own.group(0)) if own else None
    if mine and MEMORY_EFFICIENCY.search(table):
        table = MEMORY_EFFICIENCY.sub(lambda _: mine.group(0), table)
    elif mine:
        table = table.replace("[efficiency]\n", f"[efficiency]\n{mine.group(0)}\n", 1)
    return EFFICIENCY.sub(lambda _: table, text, count=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--check", action="store_true", help="exit 1 if a profile is out of date")
    a = ap.parse_args(argv)
    stale = []
    for name, entry in build(a.data).items():
        path = PROFILES / f"{name}.toml"
        old = path.read_text()
        new = copy_sibling_efficiency(rewrite(old, entry))
        tomllib.loads(new)  # never write a file that does not parse
        if new != old:
            stale.append(name)
            if not a.check:
                path.write_text(new)
    for path in sorted(PROFILES.glob("*.toml")):  # copies of a fitted sibling outside SOURCES
        if path.stem in SOURCES:
            continue
        old = path.read_text()
        new = copy_sibling_efficiency(old)
        if new != old:
            stale.append(path.stem)
            if not a.check:
                path.write_text(new)
    print(("out of date: " if a.check else "rewrote: ") + (", ".join(stale) or "none"))
    return 1 if a.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
