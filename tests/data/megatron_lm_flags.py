"""Write ``megatron_lm_flags.txt``: every command-line flag Megatron-LM's training parser accepts
(``megatron.training.arguments.add_megatron_arguments``), which `tests/test_megatron_import.py`
holds MoFa's Megatron line to.

    python tests/data/megatron_lm_flags.py PATH/TO/Megatron-LM [COMMIT-LABEL]

Needs torch (``pip install torch``); the GPU-only packages Megatron-LM imports at module level
(Transformer Engine, Triton, apex, ...) are stood in for by empty modules, since only the parser
is built. Python < 3.12 gets ``typing.override`` as the identity.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import sys
import types
import typing
from pathlib import Path

#: top-level packages Megatron-LM imports that the parser does not need
STUBBED = {"triton", "transformer_engine", "apex", "flash_attn", "einops", "nvidia_resiliency_ext", "tensorstore",
           "zarr", "deep_ep", "grouped_gemm", "wandb", "onelogger", "one_logger_utils", "nvtx", "modelopt",
           "mamba_ssm", "causal_conv1d", "flashinfer", "emerging_optimizers", "flash_mla", "cuda", "nvshmem",
           "cutlass", "cudnn"}


class _Stand(type):
    """A stand-in class: any attribute is another stand-in; called on a function (a decorator) it
    returns the function; iterates as empty and is false."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stand(name, (), {})

    def __iter__(cls):
        return iter(())

    def __bool__(cls):
        return False

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _Stand("instance", (), {})


class _Module(types.ModuleType):
    __path__: list[str] = []
    __version__ = "99.0.0"

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stand(name, (), {})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name.split(".")[0] in STUBBED else None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__spec__ = spec
        return module

    def exec_module(self, module):
        pass


def flags(megatron_lm: Path) -> list[str]:
    if not hasattr(typing, "override"):
        typing.override = lambda f: f
    sys.meta_path.insert(0, _Finder())
    sys.path.insert(0, str(megatron_lm))
    argv, sys.argv = sys.argv, ["megatron"]
    try:
        from megatron.training.arguments import add_megatron_arguments
    finally:
        sys.argv = argv
    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    return sorted({opt for action in parser._actions for opt in action.option_strings})


def main() -> None:
    if len(sys.argv) < 2 or not (Path(sys.argv[1]) / "megatron" / "training" / "arguments.py").is_file():
        print(f"error: usage: python {Path(__file__).name} PATH/TO/Megatron-LM [COMMIT-LABEL] (a Megatron-LM checkout: "
                 "the folder holding megatron/training/arguments.py)", file=sys.stderr)
        sys.exit(2)
    root = Path(sys.argv[1])
    label = sys.argv[2] if len(sys.argv) > 2 else "(unlabelled checkout)"
    out = Path(__file__).with_suffix(".txt")
    header = (f"# Megatron-LM's training flags at {label}: megatron.training.arguments.add_megatron_arguments\n"
              f"# (written by tests/data/megatron_lm_flags.py; one flag per line)\n")
    out.write_text(header + "\n".join(flags(root)) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
