"""Core sub-commands that live in their own modules (e2e, tune, validate, ...)."""

from __future__ import annotations

import importlib

import click

#: command name → (module, attribute holding the click command): imported when the command runs
#: (or ``mofa --help`` lists it), so ``mofa tune`` does not import ``validate``'s modules
COMMANDS: dict[str, tuple[str, str]] = {
    "e2e": ("e2e", "e2e"),
    "tune": ("tune", "tune_cmd"),
    "validate": ("validate", "validate_cmd"),
    "calibrate": ("validate", "calibrate_cmd"),
    "import": ("importer", "import_cmd"),
}


def load_command(name: str) -> click.Command:
    """The built-in command `name` (imports its module)."""
    module, attr = COMMANDS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), attr)


def register_builtin_commands(cli) -> None:
    """Name the built-ins in `cli` (a :class:`~mofa_framework.cli.MofaGroup`), which loads each
    when it is first asked for."""
    cli.lazy.update(dict.fromkeys(COMMANDS, load_command))
