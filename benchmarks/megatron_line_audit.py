"""Run `mofa tune`'s Megatron lines through Megatron-LM's own argument checks, offline.

For each case (model, hardware profile, GPUs, global batch, sequence), the top configurations of a
default search are written as Megatron-LM arguments (``tuner.megatron_arguments``), completed with
the model's shape (``--num-layers``, ``--hidden-size``, heads, experts, ...) and parsed and validated
by a Megatron-LM checkout's ``parse_args`` and ``validate_args`` — the checks a launch runs before
it builds anything. Prints one line per configuration: ``ok`` or the assertion Megatron-LM raises.

    python benchmarks/megatron_line_audit.py PATH/TO/Megatron-LM [--top 8] [--case NAME ...]

Needs torch (CPU is enough: the device queries Megatron-LM makes while validating — the GPU
generation — are answered from the case's hardware profile) and the checkout; the GPU-only
packages it imports are stood in for as in ``tests/data/megatron_lm_flags.py``. The environment
Megatron-LM reads is MoFa's own for the line (``tuner.megatron_environment``, what ``mofa tune`` prints
beside it: ``CUDA_DEVICE_MAX_CONNECTIONS=1`` for tensor or context parallelism before Blackwell, unset
under Megatron-FSDP, 32 with the MoE all-to-all overlap), so the audit checks it too.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import runpy
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: a hardware profile's ``compute.architecture`` → the CUDA major version Megatron-LM's device queries see
ARCH_MAJOR = {"ampere": 8, "ada": 8, "hopper": 9, "blackwell": 10, "blackwell-ultra": 10}
#: (name, model, hardware, GPUs, global batch, sequence, precision)
CASES = [
    ("llama3.1-405b-16k", "llama3.1-405b", "h100-sxm5-80gb", 16384, 2048, 8192, "bf16"),
    ("llama3.1-405b-1k-fp8", "llama3.1-405b", "h100-sxm5-80gb", 1024, 512, 8192, "fp8"),
    ("llama3.1-405b-b200-fp4", "llama3.1-405b", "b200-sxm-180gb", 512, 1024, 8192, "fp4"),
    ("llama3-70b-h100-16", "llama3-70b", "h100-sxm5-80gb", 16, 32, 4096, "bf16"),
    ("llama3-70b-a100-64", "llama3-70b", "a100-sxm4-80gb", 64, 64, 4096, "bf16"),
    ("deepseek-v3-h800", "deepseek-v3", "h800-sxm5-80gb", 2048, 15360, 4096, "bf16"),
    ("deepseek-v3-gb200-fp8", "deepseek-v3", "gb200-nvl72", 256, 4096, 4096, "fp8"),
    ("kimi-k2-h800", "kimi-k2", "h800-sxm5-80gb", 2048, 16384, 4096, "bf16"),
    ("qwen3-235b-b200", "qwen3-235b-a22b", "b200-sxm-180gb", 256, 1024, 4096, "bf16"),
    ("qwen3-30b-h100", "qwen3-30b-a3b", "h100-sxm5-80gb", 32, 256, 4096, "bf16"),
    ("mixtral-8x22b-h100", "mixtral-8x22b", "h100-sxm5-80gb", 512, 1024, 4096, "bf16"),
    ("gpt-oss-120b-h100", "gpt-oss-120b", "h100-sxm5-80gb", 1024, 1024, 4096, "bf16"),
]


def load_megatron(checkout: Path, arch: dict):
    """Megatron-LM's ``arguments`` module from `checkout`, with the GPU packages stood in for and the
    device queries answered with ``arch["major"]``."""
    import torch

    stubs = runpy.run_path(str(ROOT / "tests" / "data" / "megatron_lm_flags.py"))
    import typing
    if not hasattr(typing, "override"):
        typing.override = lambda f: f
    sys.meta_path.insert(0, stubs["_Finder"]())
    sys.path.insert(0, str(checkout))
    argv, sys.argv = sys.argv, ["megatron"]
    try:
        import megatron.training.arguments as arguments
    finally:
        sys.argv = argv
    arguments.get_device_arch_version = lambda: arch["major"]
    from megatron.training.argument_utils import core_transformer_config_from_args
    arguments.config_from_args = core_transformer_config_from_args
    torch.cuda.get_device_capability = lambda *a, **k: (arch["major"], 0)
    torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(
        major=arch["major"], minor=0, name="GPU", total_memory=80 << 30, multi_processor_count=132)
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 8
    return arguments


def model_arguments(model) -> list[str]:
    """The model's shape as Megatron-LM arguments (what a launch script adds to the tuned line)."""
    out = ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
           "--num-attention-heads", str(model.num_attention_heads), "--ffn-hidden-size", str(model.ffn_hidden_size),
           "--max-position-embeddings", "131072", "--train-iters", "10", "--lr", "1e-4",
           "--tokenizer-type", "NullTokenizer", "--vocab-size", str(model.vocab_size), "--mock-data"]
    # the architecture flags a launch script for these models carries (no linear biases, as every model
    # of the cases has none but GPT-OSS, whose experts' biases Megatron-LM supports at ETP 1 only)
    out += ["--disable-bias-linear"]
    if model.position_embedding == "rope":
        out += ["--position-embedding-type", "rope"]
    if model.activation.name == "swiglu":
        out += ["--swiglu"]
    if model.normalization == "rmsnorm":
        out += ["--normalization", "RMSNorm"]
    if not model.tied_embeddings:
        out += ["--untie-embeddings-and-output-weights"]
    if model.num_kv_heads != model.num_attention_heads:
        out += ["--group-query-attention", "--num-query-groups", str(model.num_kv_heads)]
    if model.is_moe:
        out += ["--num-experts", str(model.num_experts), "--moe-router-topk", str(model.experts_per_token),
                "--moe-ffn-hidden-size", str(model.moe_ffn_hidden_size)]
    if model.num_mtp_layers:
        out += ["--mtp-num-layers", str(model.num_mtp_layers)]
    return out


def check(arguments, words: list[str], gpus: int, environment) -> str:
    """"ok", or the first error Megatron-LM's parse_args / validate_args raises for `words`, run in the
    environment MoFa prints for the line (``tuner.megatron_environment``: a ``LaunchEnvironment``)."""
    os.environ.update(WORLD_SIZE=str(gpus), RANK="0")
    for name, value in environment.settings.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    argv, sys.argv = sys.argv, ["megatron", *words]
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # Megatron-LM prints every argument it validated
            parsed = arguments.parse_args()
            arguments.validate_args(parsed, {})
            # the model's configuration, whose own checks run when the model is built
            arguments.config_from_args(parsed)
        return "ok"
    except SystemExit as exc:  # argparse: an unknown flag or a bad value
        return f"argument parsing stopped ({exc})"
    except Exception as exc:  # noqa: BLE001 - the assertion is the answer
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    finally:
        sys.argv = argv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("megatron_lm", type=Path, help="a Megatron-LM checkout")
    ap.add_argument("--top", type=int, default=8, help="configurations per case")
    ap.add_argument("--case", action="append", choices=[c[0] for c in CASES])
    args = ap.parse_args()
    if not (args.megatron_lm / "megatron" / "training" / "arguments.py").is_file():
        ap.error(f"megatron_lm {args.megatron_lm}: not a Megatron-LM checkout (no megatron/training/arguments.py); "
                 "give the folder a `git clone https://github.com/NVIDIA/Megatron-LM` made")
    try:
        import torch  # noqa: F401 - Megatron-LM imports it at module level
    except ImportError:
        ap.error("torch is not installed: `pip install torch` (a CPU build is enough)")
    sys.path.insert(0, str(ROOT))
    from mofa_framework import Predictor
    from mofa_framework.tuner import megatron_arguments, megatron_environment

    arch = {"major": 9}
    arguments = load_megatron(args.megatron_lm, arch)
    predictor = Predictor()
    reg = predictor.registry
    failed = 0
    for name, model_name, hw, gpus, gbs, seq, precision in CASES:
        if args.case and name not in args.case:
            continue
        profile = reg.hardware_profile(hw)
        arch["major"] = ARCH_MAJOR[profile.compute.architecture]
        job = predictor.job({"model": {"name": model_name}, "hardware": {"name": hw, "num_gpus": gpus},
                             "parallel": {"global_batch_size": gbs, "sequence_length": seq, "precision": precision}})
        model = reg.model(model_name)
        for cand in predictor.tune(job, top_k=args.top).best:
            line, _ = megatron_arguments(model, cand, reg, profile)
            environment = megatron_environment(model, cand, reg, profile)
            words = " ".join(line).split()
            verdict = check(arguments, model_arguments(model) + words, gpus, environment)
            failed += verdict != "ok"
            print(f"{name}: {cand.schedule} TP{cand.parallel['tp']} PP{cand.parallel['pp']} "
                  f"VPP{cand.parallel['vpp']} {'+'.join(sorted(cand.features))}: {verdict}")
            if verdict != "ok":
                print(f"    {'; '.join(environment.shell())}; {' '.join(words)}")
    print(f"{failed} configuration(s) Megatron-LM refuses")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
