"""Shared loader for the TOML records shipped with MoFa (hardware profiles, models).

Each file is registered by its ``name`` and ``aliases`` alone, read from the file's own lines
(:func:`names_of`); the whole file is parsed the first time the record is looked up, so start-up
reads no microbenchmark table it does not use. Records are read once per process (they are frozen).
"""

from __future__ import annotations

import functools
from importlib import resources

from mofa_framework.config import TOMLDecodeError, structure_file, toml_loads
from mofa_framework.types import LazyRecord


def load_records(package: str, cls) -> list:
    """Every ``*.toml`` of `package`, sorted by file name, as a record of `cls` read on demand."""
    return [LazyRecord(name=name, aliases=aliases, load=functools.partial(_read, package, file, cls))
            if name is not None else _read(package, file, cls) for file, name, aliases in _index(package)]


@functools.cache
def _index(package: str) -> tuple:
    """(file name, record name, aliases) of every ``*.toml``; name None where :func:`names_of` cannot tell."""
    out = []
    for entry in sorted(resources.files(package).iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".toml"):
            out.append((entry.name, *names_of(entry.read_text(encoding="utf-8"))))
    return tuple(out)


def names_of(text: str) -> tuple[str | None, tuple[str, ...]]:
    """A record file's top-level ``name`` and ``aliases``, each written on one line at the start of
    a line before any table header (as every shipped file has them); ``(None, ())`` otherwise."""
    found: dict = {}
    for line in text.splitlines():
        if line.startswith("["):  # a table header: top-level keys are all above it
            break
        if line.startswith(("name", "aliases")):
            try:
                found.update(toml_loads(line))
            except TOMLDecodeError:
                return None, ()
    name, aliases = found.get("name"), found.get("aliases", [])
    if not isinstance(name, str) or not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        return None, ()
    return name, tuple(aliases)


@functools.cache
def _read(package: str, file: str, cls):
    with resources.files(package).joinpath(file).open("rb") as fh:
        data = toml_loads(fh.read().decode())
    return structure_file(data, cls, file)
