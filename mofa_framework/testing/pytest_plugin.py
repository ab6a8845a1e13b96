"""Fixtures for MoFa's tests and for plugin authors (loaded via the ``pytest11`` entry point)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from mofa_framework.manager import MofaPluginManager


@pytest.fixture
def mofa_pm(monkeypatch) -> MofaPluginManager:
    """A fresh plugin manager with MoFa's built-in plugins only (no third-party autoload)."""
    for var in ("MOFA_DISABLED_PLUGINS", "MOFA_STRICT_PLUGINS", "MOFA_TRACE_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    pm = MofaPluginManager(strict=False)
    pm.load_entrypoints(builtin_only=True)
    return pm


@pytest.fixture
def mofa_predictor(mofa_pm):
    """A :class:`~mofa_framework.Predictor` over :func:`mofa_pm`."""
    from mofa_framework import Predictor

    return Predictor(pm=mofa_pm)


@pytest.fixture(scope="module")
def mofa_cli():
    """The ``mofa`` command line as ``mofa`` assembles it — every built-in command and the plugins'
    (``mofa import torchtitan`` …) — for ``click.testing.CliRunner().invoke(mofa_cli, [...])``."""
    from mofa_framework.cli import _builtin_commands, assemble

    _builtin_commands()
    return assemble()


@pytest.fixture
def mofa_fake_distribution(tmp_path, monkeypatch):
    """Write ``NAME-VERSION.dist-info`` with entry points plus modules into a directory on
    ``sys.path``, so entry-point discovery finds it without ``pip install``."""

    def make(name: str, version: str, entry_points: dict[str, str], modules: dict[str, str]) -> Path:
        root = tmp_path / f"site-{name}"
        root.mkdir()
        info = root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        eps = "[mofa]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items())
        (info / "entry_points.txt").write_text(eps)
        for mod, src in modules.items():
            path = root / (mod.replace(".", "/") + ".py")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(src))
        monkeypatch.syspath_prepend(str(root))
        return root

    return make
