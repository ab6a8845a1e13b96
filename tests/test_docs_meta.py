"""Meta-tests: every hookspec is documented, in docs/hooks.md and with a test of its own."""

import re
from pathlib import Path

from mofa_framework import hookspecs
from mofa_framework.testing.docs import hookspec_names, render, signature

ROOT = Path(__file__).resolve().parents[1]


def test_every_hookspec_states_composition_and_contract():
    for name in hookspec_names():
        doc = getattr(hookspecs.MofaSpecs, name).__doc__ or ""
        assert re.search(r"Composition: (registry|provider|contribution|lifecycle)", doc), name
        assert "Called" in doc and "Return" in doc, f"{name}: say when it is called and what it returns"


def test_hooks_reference_is_up_to_date():
    assert (ROOT / "docs" / "hooks.md").read_text() == render(), (
        "docs/hooks.md is stale: run python -m mofa_framework.testing.docs > docs/hooks.md")


def test_every_hookspec_has_its_own_test():
    text = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    missing = [n for n in hookspec_names() if f"def test_hook_{n}(" not in text]
    assert not missing, f"hookspecs without a test_hook_<name>: {missing}"


def test_headings_are_signatures():
    text = (ROOT / "docs" / "hooks.md").read_text()
    for name in hookspec_names():
        assert f"## {signature(name)}" in text
