"""Shared loader for the TOML records shipped with MoFa (hardware profiles, models)."""

from __future__ import annotations

import functools
import tomllib
from importlib import resources

from mofa_framework.config import structure_file


def load_records(package: str, cls):
    """Every ``*.toml`` of `package` read into `cls`, sorted by file name (read once per process:
    the records are frozen, and every command builds its registry from them)."""
    return list(_load(package, cls))


@functools.cache
def _load(package: str, cls) -> tuple:
    out = []
    for entry in sorted(resources.files(package).iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".toml"):
            with entry.open("rb") as fh:
                data = tomllib.load(fh)
            out.append(structure_file(data, cls, entry.name))
    return tuple(out)
