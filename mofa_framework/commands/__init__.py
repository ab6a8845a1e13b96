"""Core sub-commands that live in their own modules (e2e, tune, validate, ...)."""

from __future__ import annotations

import importlib

import click

#: module name → attribute holding a click command
_COMMANDS: tuple[tuple[str, str], ...] = (
    ("e2e", "e2e"),
    ("tune", "tune_cmd"),
    ("validate", "validate_cmd"),
    ("validate", "calibrate_cmd"),
    ("importer", "import_cmd"),
)


def register_builtin_commands(cli: click.Group) -> None:
    for module, attr in _COMMANDS:
        cli.add_command(getattr(importlib.import_module(f"{__name__}.{module}"), attr))
