"""Registers the model architectures of ``model_zoo/`` (one TOML file per model)."""

from mofa_framework import hookimpl
from mofa_framework.types import ModelSpec

from ._data import load_records


@hookimpl
def mofa_register_models():
    return load_records("mofa_model_zoo", ModelSpec)
