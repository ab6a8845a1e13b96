"""The published measurements shipped inside MoFa (``measurements/``, installed as
``mofa_measurements``) are exact copies of the shared measurement set ``../shared/data``.

This test needs ``../shared``: it fails, never skips, when the checkout has none."""

from __future__ import annotations

import importlib
from pathlib import Path

from mofa_framework.measurements import builtin_data_dir, builtin_files

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.suffix in (".csv", ".md")}


def test_shipped_measurements_equal_the_shared_set():
    assert SHARED.is_dir(), f"{SHARED} is missing: the shipped copies cannot be checked against the shared set"
    shared, shipped = _files(SHARED), _files(builtin_data_dir())
    assert "microbench/microbench_gemm.csv" in shared
    assert sorted(shipped) == sorted(shared), "measurements/ and ../shared/data hold different files"
    stale = [name for name in shared if shipped[name] != shared[name]]
    assert not stale, f"copies differ from ../shared/data: {stale} (copy them again)"


def test_named_sets_name_shipped_files():
    sets = importlib.import_module("mofa_measurements").SETS
    for name in sets:
        files = builtin_files(name)
        assert files and all(f.is_file() for f in files), name
    assert set(sets["all"]) == set(sets["calibration"]) | set(sets["newer"]) | set(sets["duplicates"])
    every = {p.name for p in builtin_data_dir().glob("*.csv")} - {"gpu_specs.csv"}
    assert every == set(sets["all"]), "a measurement file belongs to no set"
