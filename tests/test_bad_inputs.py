"""Every class of bad input through the command line: one line, naming the field, exit status 2.

A parametrised table of distinct bad inputs (docs/bad-inputs.md states how many; a test keeps
the two in step): job-file values outside each documented bound of ``mofa_framework.limits`` or
of the wrong type, every feature's and fault policy's options, flags, environment variables,
unreadable files and structural mistakes. Each case must give exactly one line starting with
``error:``, at most ``MAX_ERROR_CHARS`` long, containing the fragments that name the problem, and
exit status 2 — never a traceback, never ``internal error`` (exit 1), never silence (exit 0).
Cost: ~12 ms of CPU per case (a fresh plugin manager per command), ≈ 5 s in all.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import attrs
import pytest
from click.testing import CliRunner

from mofa_framework.cli import MAX_ERROR_CHARS, _builtin_commands, cli
from mofa_framework.limits import LIMITS, PROFILE_LIMITS
from mofa_framework.manager import MofaPluginManager

_builtin_commands()

_PM = MofaPluginManager(strict=False)
_PM.load_entrypoints(builtin_only=True)
REG = _PM.registry

# ---------------------------------------------------------------------- TOML from dicts


def _toml_value(x) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return repr(x)
    if isinstance(x, str):
        return json.dumps(x)
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in x) + "]"
    if isinstance(x, dict):  # an inline table (inside an array)
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in x.items()) + " }"
    raise TypeError(x)


def toml_text(doc: dict, prefix: str = "") -> str:
    """A TOML document for `doc` (scalars first, then sub-tables)."""
    scalars = {k: v for k, v in doc.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in doc.items() if isinstance(v, dict)}
    out = "".join(f"{json.dumps(k) if not re.fullmatch(r'[A-Za-z0-9_-]+', k) else k} = {_toml_value(v)}\n"
                  for k, v in scalars.items())
    for k, v in tables.items():
        name = f"{prefix}{k}"
        out += f"\n[{name}]\n" + toml_text(v, name + ".").lstrip("\n")
    return out


BASE = {
    "model": {"name": "llama3-8b"},
    "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 8},
    "parallel": {"tp": 2, "micro_batch_size": 1, "global_batch_size": 32, "sequence_length": 4096},
}
MOE = {**BASE, "model": {"name": "mixtral-8x7b"}, "parallel": {**BASE["parallel"], "ep": 2}}


def with_value(base: dict, path: str, value) -> dict:
    """`base` with `path` (dotted) set to `value` (None: removed)."""
    doc = json.loads(json.dumps(base))
    *parents, key = path.split(".")
    d = doc
    for p in parents:
        d = d.setdefault(p, {})
    if value is None:
        d.pop(key, None)
    else:
        d[key] = value
    return doc


@attrs.frozen
class Case:
    id: str
    argv: tuple[str, ...]
    fragments: tuple[str, ...]
    files: tuple[tuple[str, object], ...] = ()  # name → text (str) or raw bytes
    env: tuple[tuple[str, str], ...] = ()


CASES: list[Case] = []


def case(id_, argv, *fragments, files=(), env=()):
    CASES.append(Case(id_, tuple(argv), tuple(fragments), tuple(files), tuple(env)))


def job_case(id_, doc, *fragments, command="predict"):
    case(id_, [command, "{dir}/job.toml"], *fragments, files=[("job.toml", toml_text(doc))])


# ---------------------------------------------------------------------- 1. every documented bound

_SECTION_BASE = {"model": MOE, "hardware": BASE, "parallel": BASE, "training": BASE, "fault": BASE, "search": BASE}


def _bad_values(bound):
    """Values outside `bound` or of the wrong type: above, below, non-integer, a string, NaN, inf."""
    hi = bound.hi + 1 if bound.integer else bound.hi * 10.0
    out = [("above", hi), ("string", "eight")]
    if bound.integer:
        out += [("below", bound.lo - 1), ("float", 2.5), ("huge", 10**30)]
    else:
        out += [("below", bound.lo - 1.0), ("nan", float("nan")), ("inf", float("inf"))]
    return out


for key, bound in LIMITS.items():
    section, field = key.split(".")
    if key in PROFILE_LIMITS:
        continue  # a hardware profile's: section 1b
    base = _SECTION_BASE[section]
    if section == "model":
        base = with_value(base, "model.name", "mixtral-8x7b")
    for label, value in _bad_values(bound):
        job_case(f"{key}-{label}", with_value(base, key, value), field)

# ---------------------------------------------------------------------- 1b. every bound of a hardware profile

#: a user's profile (MOFA_HARDWARE_PATH), valid as written; each case puts one number out of bounds
PROFILE = {
    "name": "my-gpu", "gpus_per_node": 8,
    "compute": {"peak_tflops": {"bf16": 989.0}, "tdp_w": 700.0},
    "memory": {"hbm_gib": 80.0, "hbm_bandwidth_gbps": 3350.0},
    "interconnect": {"scaleup_domain_gpus": 8, "scaleup_bandwidth_gbps": 450.0, "scaleout_bandwidth_gbps": 50.0},
    "host": {"cpu_memory_gib": 2048.0},
    "efficiency": {"gemm_efficiency": 0.7},
}
_PROFILE_ARGV = ["--strict-plugins", "predict", "--model", "llama3-8b", "--hardware", "my-gpu", "--gpus", "8", "--gbs",
                 "32", "--seq", "4096"]


def profile_case(id_, doc, *fragments):
    case(f"profile:{id_}", _PROFILE_ARGV, *fragments, files=[("hw/my-gpu.toml", toml_text(doc))],
         env=[("MOFA_HARDWARE_PATH", "{dir}/hw")])


for key, bound in PROFILE_LIMITS.items():
    section, field = key.split(".")
    for label, value in _bad_values(bound):
        if key == "compute.peak_tflops":
            doc = with_value(PROFILE, "compute.peak_tflops", {"bf16": value})
        elif section == "profile":
            doc = {**PROFILE, field: value}
        else:
            doc = with_value(PROFILE, key, value)
        profile_case(f"{key}-{label}", doc, "my-gpu.toml", field)
profile_case("gemm_profile-above-peak", {**PROFILE, "gemm_profile": [{"m": 8192, "n": 8192, "k": 8192, "tflops": 1200.0}]},
             "gemm_profile[0]", "1200 TFLOPS", "peak of 989")
profile_case("attention_profile-above-peak",
             {**PROFILE, "attention_profile": [{"head_dim": 128, "seq_len": 8192, "causal": True, "tflops": 2000.0}]},
             "attention_profile[0]", "2000 TFLOPS")

job_case("parallel.tp-float-integer", with_value(BASE, "parallel.tp", 2.0), "parallel.tp", "integer")
job_case("hardware.num_gpus-1e30", with_value(BASE, "hardware.num_gpus", 1e30), "num_gpus")
job_case("parallel.global_batch_size-2**40", with_value(BASE, "parallel.global_batch_size", 2**40),
         "global_batch_size", "out of range")
job_case("parallel.sequence_length-1e18", with_value(BASE, "parallel.sequence_length", 10**18), "sequence_length")
job_case("parallel.micro_batch_size-2**40", with_value(BASE, "parallel.micro_batch_size", 2**40), "micro_batch_size")
job_case("fault.init_s-1e308", with_value(BASE, "fault.init_s", 1e308), "init_s")
for watts, frag in ((800, "above the rated compute.tdp_w = 700"), (50, "idle draw"), (-3, "positive number of watts"),
                    (float("nan"), "finite number"), ("500 W", "number")):
    job_case(f"hardware.power_limit_w-{watts}", with_value(BASE, "hardware.power_limit_w", watts), "power_limit_w", frag)
job_case("hardware.power_limit_w-no-tdp", with_value(with_value(BASE, "hardware.name", "l40s-48gb"),
                                                     "hardware.power_limit_w", 300), "power_limit_w", "compute.tdp_w")
job_case("e2e:training.tokens-inf", with_value(BASE, "training.tokens", float("inf")), "tokens", command="e2e")
job_case("parallel.precision-bogus", with_value(BASE, "parallel.precision", "fp3"), "precision")
job_case("parallel.attention_kernel-bogus", with_value(BASE, "parallel.attention_kernel", "fa4"), "attention_kernel")
job_case("parallel.precision-int", with_value(BASE, "parallel.precision", 16), "precision")
job_case("parallel.sequence_parallel-string", with_value(BASE, "parallel.sequence_parallel", "yes"),
         "sequence_parallel")
job_case("parallel.flash_attention-int", with_value(BASE, "parallel.flash_attention", 1), "flash_attention")
job_case("fault.async_checkpoint-string", with_value(BASE, "fault.async_checkpoint", "no"), "async_checkpoint")

# ---------------------------------------------------------------------- 2. every feature's and policy's options


def _option_bad_values(f):
    choices = f.metadata.get("choices")
    if choices:
        wrong_type = "three" if all(isinstance(c, int) for c in choices) else 3
        return [("choice", "bogus" if wrong_type == 3 else 99), ("type", wrong_type)]
    if isinstance(f.default, bool):
        return [("type", "yes")]
    if isinstance(f.default, int):
        return [("huge", 10**30), ("float", 2.5), ("string", "x")]
    if isinstance(f.default, float):
        return [("nan", float("nan")), ("huge", 1e300), ("string", "x")]
    return []


for fname, feat in REG.features.items():
    fields = attrs.fields(feat.options_type) if attrs.has(feat.options_type) else ()
    base = MOE if fname in ("memfine", "flex_dispatcher") else BASE
    for f in fields:
        for label, value in _option_bad_values(f):
            job_case(f"features.{fname}.{f.name}-{label}", with_value(base, f"features.{fname}.{f.name}", value),
                     f"features.{fname}", f.name)
    job_case(f"features.{fname}-unknown-option", with_value(base, f"features.{fname}.no_such_option", 1),
             f"features.{fname}", "no_such_option")
    job_case(f"features.{fname}-enabled-string", with_value(base, f"features.{fname}.enabled", "yes"),
             f"features.{fname}.enabled")

for pname, pol in REG.policies.items():
    for f in attrs.fields(pol.options_type):
        for label, value in _option_bad_values(f):
            doc = with_value(with_value(BASE, "fault.policy", pname), f"fault.options.{f.name}", value)
            job_case(f"fault.options.{pname}.{f.name}-{label}", doc, "fault.options", f.name)

# ---------------------------------------------------------------------- 3. flags

FLAGS = ["predict", "--model", "llama3-8b", "--hardware", "h100-sxm5-80gb", "--gpus", "8", "--gbs", "32",
         "--seq", "4096"]
MOE_FLAGS = ["predict", "--model", "mixtral-8x7b", "--hardware", "h100-sxm5-80gb", "--gpus", "8", "--gbs", "32",
             "--seq", "4096", "--ep", "2"]


def flag_case(id_, extra, *fragments, base=FLAGS):
    argv = list(base)
    for i in range(0, len(extra), 2):
        if extra[i] in base and i + 1 < len(extra):  # a flag the base gives: replace its value
            argv[argv.index(extra[i]) + 1] = extra[i + 1]
        else:
            argv += extra[i:i + 2]
    case(f"flag:{id_}", argv, *fragments)


for flag, field in (("--gpus", "num_gpus"), ("--tp", "tp"), ("--pp", "pp"), ("--vpp", "vpp"), ("--cp", "cp"),
                    ("--ep", "ep"), ("--mbs", "micro_batch_size"), ("--gbs", "global_batch_size"),
                    ("--seq", "sequence_length")):
    flag_case(f"{flag}-huge", [flag, "99999999999999999999"], field)
    flag_case(f"{flag}-zero", [flag, "0"], field)
    flag_case(f"{flag}-negative", [flag, "-3"], field)
    flag_case(f"{flag}-word", [flag, "eight"], flag)
flag_case("--etp-negative", ["--etp", "-1"], "etp")
flag_case("--tp-2.0", ["--tp", "2.0"], "--tp")
flag_case("--precision-fp3", ["--precision", "fp3"], "--precision")
flag_case("--attention-kernel-fa4", ["--attention-kernel", "fa4"], "--attention-kernel")
flag_case("--precision-fp8-a100", ["--precision", "fp8", "--hardware", "a100-sxm4-80gb"], "precision", "fp8")
flag_case("--precision-fp4-h100", ["--precision", "fp4"], "precision", "fp4")
flag_case("--moe-load-factor-dense", ["--moe-load-factor", "2"], "moe_load_factor", "MoE")
flag_case("--moe-load-factor-inf", ["--moe-load-factor", "inf"], "moe_load_factor", base=MOE_FLAGS)
flag_case("--moe-load-factor-below-1", ["--moe-load-factor", "0.5"], "moe_load_factor", base=MOE_FLAGS)
flag_case("--moe-load-factor-word", ["--moe-load-factor", "high"], "--moe-load-factor", base=MOE_FLAGS)
flag_case("--feature-twice-conflicting", ["--feature", "recompute", "--feature", 'recompute:granularity="full"'],
          "--feature recompute", "twice")
flag_case("--feature-unknown", ["--feature", "no_such_feature"], "features.no_such_feature")
flag_case("--feature-bad-syntax", ["--feature", "recompute:granularity"], "--feature", "key=value")
flag_case("--feature-recompute-huge", ["--feature", "recompute:num_layers=1000000000000000000000000000000"],
          "num_layers")
flag_case("--feature-compute-factor-inf", ["--feature", "kernel_scaling:compute_factor=inf"], "compute_factor")
flag_case("--feature-contention-inf", ["--feature", "dp_overlap:contention_comm=inf"], "contention_comm")
flag_case("--feature-contention-nan", ["--feature", "dp_overlap:contention_comm=nan"], "contention_comm")
flag_case("--feature-fp8-a100", ["--feature", "fp8", "--hardware", "a100-sxm4-80gb"], "features.fp8")
flag_case("--feature-nvfp4-h100", ["--feature", "nvfp4"], "features.nvfp4")
flag_case("--feature-conflict", ["--feature", "cpu_optimizer", "--feature", "distributed_optimizer"],
          "cannot be combined")
flag_case("--first-stage-layers-negative", ["--pp", "2", "--first-stage-layers", "-1"], "parallel.first_stage_layers")
flag_case("--last-stage-layers-too-many", ["--pp", "2", "--last-stage-layers", "100000"], "last_stage_layers")
flag_case("--first-stage-layers-word", ["--first-stage-layers", "seven"], "--first-stage-layers")
flag_case("--feature-activation-offload-pp2", ["--pp", "2", "--feature", "activation_offload"],
          "features.activation_offload", "pp = 1")
flag_case("--feature-activation-offload-recompute", ["--feature", "activation_offload", "--feature", "recompute"],
          "features.activation_offload", "recompute")
flag_case("--feature-ep-overlap-1f1b-pp2", ["--pp", "2", "--feature", "ep_overlap"], "features.ep_overlap",
          "interleaved-1f1b", base=MOE_FLAGS)
flag_case("--feature-ep-overlap-full-recompute", ["--feature", "ep_overlap", "--feature", "recompute:granularity=full"],
          "features.ep_overlap", "full", base=MOE_FLAGS)
flag_case("--schedule-unknown", ["--schedule", "nonesuch"], "pipeline.schedule")
flag_case("--vpp-with-1f1b", ["--pp", "2", "--vpp", "2", "--schedule", "1f1b"], "does not interleave")
flag_case("--model-unknown", ["--model", "llama9-1t"], "model.name")
flag_case("--hardware-unknown", ["--hardware", "h900"], "hardware.name")
flag_case("--format-bogus", ["--format", "yaml"], "--format")
flag_case("--no-such-flag", ["--bogus", "1"], "--bogus")
case("flag:missing-job", ["predict", "--model", "llama3-8b"], "job file")
case("flag:file-and-flags", ["predict", "{dir}/job.toml", "--model", "llama3-8b"], "not both",
     files=[("job.toml", toml_text(BASE))])
case("flag:--disable-plugin-bogus", ["--disable-plugin", "bogus", "list-models"], "--disable-plugin", "bogus",
     "mofa list-plugins", "known: activation_offload")
case("flag:--disable-plugin-typo", ["--disable-plugin", "rooflin", "list-models"], "rooflin", "closest: roofline")
case("flag:--disable-plugin-empty", ["--disable-plugin", "", "list-models"], "--disable-plugin")
E2E = ["e2e", "{dir}/job.toml"]
_E2E_FILES = [("job.toml", toml_text(with_value(BASE, "training.tokens", 1e12)))]
for flag, value, frag in (("--tokens", "inf", "--tokens"), ("--tokens", "-1", "--tokens"),
                          ("--tokens", "nan", "--tokens"), ("--init-s", "1e308", "init_s"),
                          ("--save-s", "-5", "--save-s"), ("--failure-rate", "inf", "--failure-rate"),
                          ("--failure-rate", "1e9", "node_failures_per_day"), ("--interval", "0", "--interval"),
                          ("--sweep", "nodes=abc", "--sweep"), ("--sweep", "interval=0.5", "--sweep"),
                          ("--sweep", "nodes=99999999999", "nodes"), ("--sweep", "bogus=1", "--sweep"),
                          ("--sweep", "failure_rate=", "--sweep"), ("--fault-option", "novalue", "--fault-option"),
                          ("--fault-option", "pod_probability=2", "pod_probability")):
    case(f"e2e:{flag}={value}", [*E2E, flag, value], frag, files=_E2E_FILES)
TUNE = ["tune", "--model", "llama3-8b", "--hardware", "h100-sxm5-80gb", "--gpus", "8", "--gbs", "32", "--seq", "4096"]
for flag, value in (("--tp-values", "0"), ("--tp-values", "99999999999999999999"), ("--pp-values", "x"),
                    ("--mbs-values", "1,,-2"), ("--cp-values", "1.5"), ("--vpp-values", "1000000"),
                    ("--lighter-last-values", "-1"), ("--lighter-last-values", "99999999")):
    case(f"tune:{flag}={value}", [*TUNE, flag, value], flag)
case("tune:--schedules-unknown", [*TUNE, "--schedules", "nonesuch"], "--schedules")
case("tune:--power-limit-w-above-tdp", [*TUNE, "--power-limit-w", "900"], "--power-limit-w", "at most 700")
case("predict:--power-limit-w-idle", [*FLAGS, "--power-limit-w", "40"], "power_limit_w", "idle draw")
case("predict:--sensitivity-with-megatron-format", [*FLAGS, "--format", "megatron", "--sensitivity"], "--sensitivity",
     "--format megatron")
case("tune:--features-unknown", [*TUNE, "--features", "nonesuch"], "--features")

# ---------------------------------------------------------------------- 4. environment variables

for var, value, frag in (("MOFA_STRICT_PLUGINS", "maybe", "MOFA_STRICT_PLUGINS"),
                         ("MOFA_STRICT_PLUGINS", "2", "MOFA_STRICT_PLUGINS"),
                         ("MOFA_TRACE_PLUGINS", "garbage", "MOFA_TRACE_PLUGINS"),
                         ("MOFA_DISABLE_PLUGIN_AUTOLOAD", "perhaps", "MOFA_DISABLE_PLUGIN_AUTOLOAD"),
                         ("MOFA_DISABLED_PLUGINS", "bogus", "MOFA_DISABLED_PLUGINS"),
                         ("MOFA_DISABLED_PLUGINS", "roofline,bogus2", "bogus2")):
    case(f"env:{var}={value}", FLAGS, frag, env=[(var, value)])
# a user directory that is not one is warned about (the shipped profiles still work; strict mode refuses)
for var in ("MOFA_HARDWARE_PATH", "MOFA_MODEL_PATH"):
    case(f"env:{var}=/nonexistent+strict", ["--strict-plugins", *FLAGS], var, env=[(var, "/nonexistent/mofa-dir")])

# ---------------------------------------------------------------------- 5. unreadable or malformed files

_VALID = toml_text(BASE)
for id_, content, frag in (
        ("non-utf8", b"\xff\xfe" + _VALID.encode(), "UTF-8"),
        ("latin-1", _VALID.replace('"llama3-8b"', '"llama3-8b"\nnotes = "caf\xe9"').encode("latin-1"), "UTF-8"),
        ("binary", bytes(range(256)) * 4, "job.toml"),
        ("utf-16", _VALID.encode("utf-16"), "job.toml"),
        ("empty", b"", "required key"),
        ("malformed", b"[model\nname = ", "malformed TOML"),
        ("duplicate-key", (_VALID + '\n[model]\nname = "x"\n').encode(), "malformed TOML"),
        ("deep-nesting", b"x = " + b"[" * 100000 + b"]" * 100000, "job.toml"),
        ("200000-unknown-keys", (_VALID + "".join(f"k{i} = 1\n" for i in range(200000))).encode(),
         "unknown key"),
        ("model-not-table", (_VALID.replace('[model]\nname = "llama3-8b"\n', "") + "model = 5\n").encode(), "model"),
        ("model-name-int", _VALID.replace('name = "llama3-8b"', "name = 0").encode(), "model.name"),
        ("model-name-bool", _VALID.replace('name = "llama3-8b"', "name = true").encode(), "model.name"),
        ("model-config-int", _VALID.replace('name = "llama3-8b"', "config = 5").encode(), "model.config"),
        ("hardware-name-int", _VALID.replace('name = "h100-sxm5-80gb"', "name = 5").encode(), "hardware.name"),
        ("parallel-missing", toml_text({k: v for k, v in BASE.items() if k != "parallel"}).encode(), "parallel"),
        ("unknown-section", (_VALID + "\n[bogus]\nx = 1\n").encode(), "bogus"),
        ("features-not-table", (_VALID + "\n[features]\nrecompute = 5\n").encode(), "features.recompute"),
        ("fault-policy-int", (_VALID + "\n[fault]\npolicy = 5\n").encode(), "policy"),
        ("fault-policy-unknown", (_VALID + '\n[fault]\npolicy = "pray"\n').encode(), "fault.policy"),
        ("schedule-int", (_VALID + "\n[pipeline]\nschedule = 5\n").encode(), "schedule"),
        ("search-empty-list", (_VALID + "\n[search]\nmicro_batch_size = []\n").encode(), "micro_batch_size"),
        ("search-zero", (_VALID + "\n[search]\ntp = [0]\n").encode(), "search.tp"),
        ("search-huge", (_VALID + "\n[search]\npp = [1000000000000]\n").encode(), "search.pp"),
        ("search-features-empty", (_VALID + "\n[search]\nfeatures = []\n").encode(), "search.features"),
        ("search-schedules-int", (_VALID + "\n[search]\nschedules = [1]\n").encode(), "search.schedules"),
        ("search-lighter-last-negative", (_VALID + "\n[search]\nlighter_last = [-2]\n").encode(),
         "search.lighter_last"),
        ("name-int", ("name = 5\n" + _VALID).encode(), "name"),
):
    case(f"file:{id_}", ["predict", "{dir}/job.toml"], frag, files=[("job.toml", content)])
case("file:missing", ["predict", "{dir}/nope.toml"], "no such file")
case("file:directory", ["predict", "{dir}/adir"], "adir", files=[("adir/x.toml", _VALID)])
case("file:symlink-loop", ["predict", "{dir}/loop.toml"], "loop.toml", files=[("loop.toml", "@symlink:loop.toml")])
case("file:5000-char-path", ["predict", "{dir}/" + "d" * 5000 + ".toml"], "characters")

# ---------------------------------------------------------------------- 6. structural mistakes

L405 = {**BASE, "model": {"name": "llama3.1-405b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 128},
        "parallel": {"tp": 8, "pp": 16, "global_batch_size": 64, "sequence_length": 4096}}
#: the same job with the attention the ZeroBubble fork runs (FlashAttention-2)
ZB405 = with_value(L405, "parallel.attention_kernel", "fa2")
for id_, doc, frags in (
        ("tp-not-dividing-heads", with_value(with_value(BASE, "parallel.tp", 3), "hardware.num_gpus", 6),
         ("parallel.tp must divide", "(here tp 3)")),
        ("gpus-not-multiple", with_value(with_value(BASE, "parallel.tp", 8), "hardware.num_gpus", 60), ("num_gpus",)),
        ("pp-over-layers", with_value(with_value(with_value(BASE, "parallel.tp", 1), "parallel.pp", 64),
                                      "hardware.num_gpus", 64), ("parallel.pp",)),
        ("gbs-not-divisible", with_value(BASE, "parallel.global_batch_size", 33),
         ("global_batch_size", "here 33 against data-parallel size 4 × micro-batch 1 = 4", "of 32 or 36")),
        ("cp-not-dividing-seq", with_value(with_value(BASE, "parallel.cp", 2), "parallel.sequence_length", 4097),
         ("sequence_length", "(here sequence_length 4097, cp 2)")),
        ("sp-not-dividing-seq", with_value(with_value(BASE, "parallel.sequence_parallel", True),
                                           "parallel.sequence_length", 4097),
         ("sequence_parallel", "(here sequence_length 4097, cp 1, tp 2)")),
        ("ep-on-dense", with_value(BASE, "parallel.ep", 2), ("parallel.ep",)),
        ("ep-not-dividing-experts", with_value(with_value(with_value(MOE, "parallel.ep", 3), "hardware.num_gpus", 6),
                                               "parallel.global_batch_size", 36),
         ("parallel.ep", "ep 3 × etp 2 = 6", "8 experts")),
        ("ep-over-a-stage", with_value(with_value(with_value(MOE, "parallel.ep", 8), "parallel.tp", 1),
                                       "hardware.num_gpus", 4), ("parallel.ep", "dp 4 = 4 GPUs per pipeline stage")),
        ("tp-over-output-groups", with_value(with_value(with_value(BASE, "model.name", "deepseek-v4-flash"),
                                                        "parallel.tp", 16), "hardware.num_gpus", 16),
         ("parallel.tp", "model.o_groups (8)")),
        ("vpp-without-pp", with_value(BASE, "parallel.vpp", 2), ("vpp",)),
        ("end-stages-pp2", with_value(with_value(with_value(L405, "parallel.pp", 2), "parallel.first_stage_layers", 7),
                                      "parallel.last_stage_layers", 7), ("first_stage_layers", "126")),
        ("end-stages-over-layers", with_value(with_value(L405, "parallel.first_stage_layers", 100),
                                              "parallel.last_stage_layers", 100), ("first_stage_layers",)),
        ("end-stages-pp1", with_value(BASE, "parallel.first_stage_layers", 16), ("first_stage_layers", "pp > 1")),
        ("layout-unequal-middle", with_value(with_value(L405, "parallel.pp", 4), "parallel.pipeline_layout",
                                             "Et*30|t*33|t*31|t*32L"), ("pipeline_layout", "middle ranks [33, 31]")),
        ("layout-wrong-layer-count", with_value(with_value(L405, "parallel.pp", 4), "parallel.pipeline_layout",
                                                "Et*30|(t*32|)*2t*30L"), ("pipeline_layout", "places 124 layers")),
        ("layout-not-a-string", with_value(L405, "parallel.pipeline_layout", 8), ("pipeline_layout", "string")),
        ("zero-bubble-end-stages", with_value(with_value(with_value(ZB405, "pipeline.schedule", "zb-h1"),
                                                         "parallel.first_stage_layers", 6),
                                              "parallel.last_stage_layers", 8),
         ("first_stage_layers / last_stage_layers (6 / 8)", "7 / 7 on 16 stages", "1f1b")),
        # what the ZeroBubble fork (legacy GPT model, local transformer) cannot run: each row's cause and fix
        ("zero-bubble-cudnn", with_value(L405, "pipeline.schedule", "zb-h1"),
         ("sail-sg", "FlashAttention-2", "attention_kernel = 'fa2'")),
        ("zero-bubble-cp", with_value(with_value(with_value(ZB405, "pipeline.schedule", "zb-h1"), "parallel.cp", 2),
                                      "hardware.num_gpus", 256),
         ("sail-sg", "no context parallelism", "parallel.cp = 1")),
        ("zero-bubble-fp8", with_value(with_value(ZB405, "pipeline.schedule", "zb-h1"), "parallel.precision", "fp8"),
         ("sail-sg", "Transformer Engine", "parallel.precision = 'bf16' or 'fp16'")),
        ("zero-bubble-post-validation-bf16", with_value(with_value(with_value(ZB405, "pipeline.schedule", "zb-v"),
                                                                   "parallel.vpp", 2), "parallel.pp", 9)
         | {"hardware": {"name": "h100-sxm5-80gb", "num_gpus": 144}},
         ("sail-sg", "post-validation", "--fp16", "zb-h1")),
        ("zero-bubble-dp-overlap", with_value(with_value(ZB405, "pipeline.schedule", "zb-h1"), "features.dp_overlap", {}),
         ("sail-sg", "no dp_overlap", "features.dp_overlap off")),
        ("zero-bubble-shard-gradients", with_value(with_value(ZB405, "pipeline.schedule", "zb-h1"),
                                                   "features.distributed_optimizer", {"shard_gradients": True}),
         ("sail-sg", "distributed_optimizer only with shard_gradients = False")),
        ("zero-bubble-moe", {**with_value(ZB405, "pipeline.schedule", "zb-h1"), "model": {"name": "mixtral-8x7b"},
                             "parallel": {"tp": 2, "pp": 4, "ep": 8, "global_batch_size": 64, "sequence_length": 4096,
                                          "attention_kernel": "fa2"}},
         ("sail-sg", "Switch MLP", "interleaved-1f1b")),
        ("zero-bubble-tied", {**with_value(ZB405, "pipeline.schedule", "zb-h1"), "model": {"name": "gpt3-175b"}},
         ("sail-sg", "untie-embeddings", "tied_embeddings = false")),
        ("zbv-zero-bubble-vpp3", with_value(with_value(with_value(with_value(ZB405, "pipeline.schedule", "zbv-zero-bubble"),
                                                                   "parallel.vpp", 3), "parallel.pp", 7),
                                            "hardware.num_gpus", 112),
         ("zbv-zero-bubble", "parallel.vpp = 2")),
        ("zero-bubble-pp1", with_value(with_value(with_value(ZB405, "pipeline.schedule", "zb-h1"), "parallel.pp", 1),
                                       "hardware.num_gpus", 8),
         ("sail-sg", "parallel.pp ≥ 2")),
        ("end-stage-all-layers-pp2", with_value(with_value(L405, "parallel.pp", 2), "parallel.first_stage_layers", 126),
         ("first_stage_layers",)),
        ("moe-load-factor-dense", with_value(BASE, "model.moe_load_factor", 2.0), ("moe_load_factor",)),
        ("parallel-block-string", with_value(BASE, "model.parallel_attention_mlp", "yes"),
         ("parallel_attention_mlp", "true or false")),
        ("hidden-16-heads-32", {**BASE, "model": {"name": "tiny", "num_layers": 2, "hidden_size": 16,
                                                  "num_attention_heads": 32, "num_kv_heads": 32,
                                                  "ffn_hidden_size": 64, "vocab_size": 1000}},
         ("hidden_size", "head")),
        ("hidden-100-heads-32", {**BASE, "model": {"name": "tiny", "num_layers": 2, "hidden_size": 100,
                                                   "num_attention_heads": 32, "num_kv_heads": 32,
                                                   "ffn_hidden_size": 64, "vocab_size": 1000}},
         ("hidden_size", "head")),
        ("kv-heads-not-dividing", with_value(BASE, "model.num_kv_heads", 5), ("num_kv_heads",)),
        ("top-k-over-experts", with_value(MOE, "model.experts_per_token", 9), ("experts_per_token",)),
        ("first-k-dense-over-layers", with_value(MOE, "model.first_k_dense_layers", 33), ("first_k_dense_layers",)),
        ("mla-without-dims", with_value(BASE, "model.kv_lora_rank", 512), ("kv_lora_rank",)),
        ("model-name-not-kebab", with_value(BASE, "model.name", "My Model"), ("name",)),
        ("feature-two-spellings", with_value(with_value(BASE, "features.recompute", {}), "features.Recompute", {}),
         ("same feature",)),
        ("cpu-optimizer-host-memory", with_value(with_value(with_value(L405, "parallel.pp", 1), "hardware.num_gpus", 8),
                                                 "features.cpu_optimizer.shard", False), ("256.0 GiB per GPU",)),
        ("nvfp4-bf16-layers", with_value(with_value(BASE, "hardware.name", "b200-sxm-180gb"),
                                         "features.nvfp4.bf16_layers_at_end", 33), ("bf16_layers_at_end",)),
        ("dense-features-conflict", with_value(with_value(BASE, "features.cpu_optimizer", {}),
                                               "features.distributed_optimizer", {}), ("cannot be combined",)),
):
    job_case(f"struct:{id_}", doc, *frags)

DISTINCT_CASES = len(CASES)


def _write(tmp: Path, name: str, content) -> None:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if content == f"@symlink:{name}":
        os.symlink(path, path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


def test_case_ids_are_distinct():
    assert len({c.id for c in CASES}) == len(CASES) >= 300


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_exit_2(c: Case, tmp_path, monkeypatch):
    for var in ("MOFA_DISABLED_PLUGINS", "MOFA_STRICT_PLUGINS", "MOFA_TRACE_PLUGINS", "MOFA_HARDWARE_PATH",
                "MOFA_MODEL_PATH", "MOFA_DISABLE_PLUGIN_AUTOLOAD"):
        monkeypatch.delenv(var, raising=False)
    for var, value in c.env:
        monkeypatch.setenv(var, value.replace("{dir}", str(tmp_path)))
    for name, content in c.files:
        _write(tmp_path, name, content)
    argv = [a.replace("{dir}", str(tmp_path)) for a in c.argv]
    r = CliRunner().invoke(cli, argv, catch_exceptions=False)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2, r.output[:2000]
    assert len(lines) == 1, r.output[:2000]
    line = lines[0]
    assert line.startswith("error: ") and "Traceback" not in line and "internal error" not in line, line
    assert len(line) <= MAX_ERROR_CHARS + 200, len(line)
    for f in c.fragments:
        assert f in line, line


def test_docs_table_of_bounds_is_generated_from_limits():
    from mofa_framework.limits import markdown_table

    text = (Path(__file__).resolve().parents[1] / "docs" / "bad-inputs.md").read_text()
    section = text.split("<!-- limits:begin -->\n", 1)[1].split("<!-- limits:end -->", 1)[0]
    assert section == markdown_table(), "docs/bad-inputs.md's bounds are stale: paste limits.markdown_table()"


def test_docs_state_how_many_bad_inputs_the_suite_tries():
    text = (Path(__file__).resolve().parents[1] / "docs" / "bad-inputs.md").read_text()
    assert f"**{DISTINCT_CASES} distinct bad inputs through the CLI**" in text


@pytest.mark.parametrize("var", ["MOFA_HARDWARE_PATH", "MOFA_MODEL_PATH"])
def test_a_missing_user_directory_is_warned_about_once(var, monkeypatch):
    monkeypatch.setenv(var, "/nonexistent/mofa-dir")
    r = CliRunner().invoke(cli, [*FLAGS, "--format", "json"], catch_exceptions=False)
    assert r.exit_code == 0
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and var in warnings[0] and "user_profiles" in warnings[0]


def test_the_base_user_profile_of_the_profile_cases_is_accepted(tmp_path, monkeypatch):
    """Section 1b's cases each break one number of PROFILE; as written it predicts (exit 0)."""
    _write(tmp_path, "hw/my-gpu.toml", toml_text(PROFILE))
    monkeypatch.setenv("MOFA_HARDWARE_PATH", str(tmp_path / "hw"))
    r = CliRunner().invoke(cli, [*_PROFILE_ARGV, "--format", "json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output[:2000]
    assert json.loads(r.stdout)["hardware"] == "my-gpu"
