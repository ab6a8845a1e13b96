"""Render docs/hooks.md from the hookspecs (the meta-test keeps the file in step)."""

from __future__ import annotations

import inspect
import textwrap

from mofa_framework import hookspecs

HEADER = """# Hook reference

Generated from `mofa_framework/hookspecs.py` by
`python -m mofa_framework.testing.docs > docs/hooks.md`; a test fails when it is out of date.
Implement a hook with `@mofa_framework.hookimpl` on a function of the same name in a module
you declare under the `mofa` entry-point group (see [the plugin-author guide](plugin-guide.md)).

"""


def hookspec_names() -> list[str]:
    return [n for n in dir(hookspecs.MofaSpecs) if n.startswith("mofa_")]


def signature(name: str) -> str:
    fn = getattr(hookspecs.MofaSpecs, name)
    params = [p for p in inspect.signature(fn).parameters if p != "self"]
    return f"{name}({', '.join(params)})"


def render() -> str:
    mod_doc = textwrap.dedent(hookspecs.__doc__ or "").strip()
    out = [HEADER, mod_doc, ""]
    for name in hookspec_names():
        fn = getattr(hookspecs.MofaSpecs, name)
        opts = getattr(fn, "mofa_spec", {}) or {}
        out.append(f"## {signature(name)}\n")
        if opts.get("firstresult"):
            out.append("*firstresult: the first non-None answer wins*\n")
        out.append(inspect.cleandoc(fn.__doc__ or "") + "\n")
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(render(), end="")
