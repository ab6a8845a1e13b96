"""Registers one GPU profile from a TOML file shipped in this package."""

import tomllib
from importlib import resources

from mofa_framework import hookimpl
from mofa_framework.config import structure_file
from mofa_framework.types import HardwareProfile


@hookimpl
def mofa_register_hardware_profiles():
    entry = resources.files(__package__) / "example-h100-nvl16.toml"
    with entry.open("rb") as fh:
        return [structure_file(tomllib.load(fh), HardwareProfile, entry.name)]
