"""Registers the user's own hardware profiles and models: every ``*.toml`` in the directories of
``MOFA_HARDWARE_PATH`` and ``MOFA_MODEL_PATH`` (``os.pathsep``-separated, like ``PATH``).

The files have the format of ``hardware_profiles/`` and ``model_zoo/``; a profile written by
``mofa calibrate --name NAME --write DIR/NAME.toml`` is one. A record whose name or alias is
already registered is a conflict, as between any two plugins. A directory that does not exist
or a malformed file fails this plugin only (``mofa list-plugins`` gives the reason; the shipped
profiles and models keep working; ``--strict-plugins`` makes it an error).
"""

from __future__ import annotations

from mofa_framework import hookimpl
from mofa_framework.config import HARDWARE_PATH, MODEL_PATH, read_toml, structure_file, user_toml_files
from mofa_framework.types import HardwareProfile, ModelSpec


def _records(variable: str, cls) -> list:
    return [structure_file(read_toml(p), cls, str(p)) for p in user_toml_files(variable)]


@hookimpl
def mofa_register_hardware_profiles():
    return _records(HARDWARE_PATH, HardwareProfile)


@hookimpl
def mofa_register_models():
    return _records(MODEL_PATH, ModelSpec)
