"""Registers the hardware profiles of ``hardware_profiles/`` (one TOML file per accelerator)."""

from mofa_framework import hookimpl
from mofa_framework.types import HardwareProfile

from ._data import load_records


@hookimpl
def mofa_register_hardware_profiles():
    return load_records("mofa_hardware_profiles", HardwareProfile)
