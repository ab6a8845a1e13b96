"""Fuzzing the job-document path: 10,000 mutated job documents through the loader and predict.

Seeds are the shipped examples and small dense/MoE jobs. 7,000 documents are structural
mutations (a value replaced by one of a pool of types and sizes — 0, negative, huge, NaN, ±inf,
strings, booleans, lists, tables — a key removed or renamed, a section replaced by a scalar, an
unknown key added); 3,000 are byte-level mutations of the seeds' TOML text (bytes inserted,
deleted, flipped or truncated, non-UTF-8 bytes, Latin-1 text). Every document goes through
``config.parse_toml`` (byte-level) and ``Predictor.job``; the accepted ones through the
predict path — ``jobs_to_batch``, every feasibility rule, the engine — batched into one engine
call per model and hardware. The only exception allowed is the project's error type
(:class:`~mofa_framework.errors.MofaError`), never an invariant violation
(:class:`~mofa_framework.invariants.InvariantError`: an impossible number). The RNG is seeded:
a failure reproduces. Cost: ≈ 6 s of CPU.
"""

from __future__ import annotations

import copy
import random
import tomllib
from collections import defaultdict
from pathlib import Path

import numpy as np

from mofa_framework import Predictor
from mofa_framework.config import jobs_to_batch, parse_toml
from mofa_framework.errors import MofaError
from mofa_framework.invariants import InvariantError, mfu_ceiling
from mofa_framework.manager import MofaPluginManager

ROOT = Path(__file__).resolve().parents[1]
_PM = MofaPluginManager(strict=False)
_PM.load_entrypoints(builtin_only=True)
PRED = Predictor(pm=_PM)

N_STRUCTURAL = 7000
N_BYTES = 3000


def _seeds() -> list[dict]:
    out = [tomllib.loads((ROOT / "examples" / name).read_text()) for name in
           ("gpt3-175b-a100.toml", "llama3-405b-e2e.toml", "deepseek-v3-h800.toml", "llama3-405b-h100.toml")]
    out.append({"model": {"name": "llama3-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 16,
                                                           "scaleout_bandwidth_gbps": 25.0},
                "parallel": {"tp": 2, "pp": 2, "micro_batch_size": 1, "global_batch_size": 32,
                             "sequence_length": 4096},
                "features": {"recompute": {"granularity": "full"}, "tp_overlap": {}, "distributed_optimizer": {}}})
    out.append({"model": {"name": "mixtral-8x7b"}, "hardware": {"name": "b200-sxm-180gb", "num_gpus": 16},
                "parallel": {"tp": 2, "pp": 2, "ep": 4, "micro_batch_size": 1, "global_batch_size": 64,
                             "sequence_length": 4096, "precision": "fp8"},
                "features": {"memfine": {}, "ep_overlap": {}, "fp8": {}, "kernel_scaling": {"compute_factor": 1.5}},
                "training": {"tokens": 1e12}})
    out.append({"model": {"name": "tiny", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
                          "num_kv_heads": 2, "ffn_hidden_size": 1024, "vocab_size": 32000},
                "hardware": {"name": "a100-sxm4-80gb", "num_gpus": 4},
                "parallel": {"tp": 2, "pp": 2, "global_batch_size": 8, "sequence_length": 1024},
                "features": {"activation_offload": {}, "kernel_scaling": {"compute_factor": 10.0}}})
    return out


SEEDS = _seeds()
POOL = [0, -1, 1, 2, 3, 7, 8, 16, 64, 1000, 2**31, 2**63, 2**64, 10**30, -(10**30), 0.0, 0.5, 1.5, 2.0, -0.5,
        1e30, 1e300, float("nan"), float("inf"), float("-inf"), "", "x", "bf16", "fp8", "fp4", "1f1b", "full",
        "selective", "zb-v", True, False, [], [1, 2], {}, {"x": 1}, "a" * 5000]
#: values a user might well mean (the plausible half of the value mutations): they pass the types and
#: bounds more often, so the mutated job reaches the feasibility rules and the engine
PLAUSIBLE = [1, 2, 4, 8, 16, 32, 0, 3, 1.0, 1.25, 2.0, 0.5, True, False, "full", "selective", "fp8", "bf16",
             "interleaved-1f1b", "job-restart", "three-level", "mxfp8"]
#: paths mutated besides those the seeds hold (a seed's own keys are mutated too)
EXTRA_PATHS = ["parallel.vpp", "parallel.cp", "parallel.ep", "parallel.etp", "parallel.first_stage_layers",
               "parallel.last_stage_layers", "parallel.sequence_parallel", "parallel.flash_attention",
               "parallel.precision", "pipeline.schedule", "training.tokens", "fault.policy", "fault.init_s",
               "fault.node_failures_per_day", "fault.options.pod_probability", "model.moe_load_factor",
               "model.num_mtp_layers", "model.num_layers", "model.hidden_size", "model.head_dim",
               "features.recompute.num_layers", "features.recompute.granularity", "features.memfine.chunks",
               "features.kernel_scaling.compute_factor", "features.dp_overlap.contention_comm",
               "features.tp_overlap.chunks", "features.fp8.recipe", "features.cpu_optimizer.shard",
               "search.micro_batch_size", "search.tp", "name"]


def _paths(doc, prefix="") -> list[str]:
    out = []
    for k, v in doc.items():
        p = f"{prefix}{k}"
        out.append(p)
        if isinstance(v, dict):
            out += _paths(v, p + ".")
    return out


def _set(doc, path, value):
    *parents, key = path.split(".")
    d = doc
    for p in parents:
        if not isinstance(d.get(p), dict):
            d[p] = {}
        d = d[p]
    d[key] = value


def _parent(doc, path):
    *parents, key = path.split(".")
    d = doc
    for p in parents:
        d = d.get(p) if isinstance(d, dict) else None
    return d, key


def mutate(doc: dict, rng: random.Random) -> dict:
    doc = copy.deepcopy(doc)
    for _ in range(rng.choice((1, 1, 1, 1, 2, 3))):
        paths = _paths(doc)
        op = rng.random()
        if op < 0.6:
            pool = PLAUSIBLE if rng.random() < 0.75 else POOL
            _set(doc, rng.choice(paths + EXTRA_PATHS), copy.deepcopy(rng.choice(pool)))
        elif op < 0.72 and paths:
            d, key = _parent(doc, rng.choice(paths))
            if isinstance(d, dict):
                d.pop(key, None)
        elif op < 0.84 and paths:
            d, key = _parent(doc, rng.choice(paths))
            if isinstance(d, dict) and key in d:
                d[rng.choice((key.upper(), key + "s", key.replace("_", "-"), "x" + key))] = d.pop(key)
        elif op < 0.92:
            _set(doc, rng.choice(paths), rng.choice((5, "x", [], True, 1e30)))
        else:
            _set(doc, rng.choice(paths + EXTRA_PATHS) + "_extra", rng.choice(POOL[:10]))
    return doc


def _toml(doc: dict, prefix: str = "") -> str:
    import json

    def val(x):
        if isinstance(x, bool):
            return str(x).lower()
        if isinstance(x, float):
            return "nan" if x != x else ("inf" if x == float("inf") else "-inf" if x == float("-inf") else repr(x))
        if isinstance(x, (list, tuple)):
            return "[" + ", ".join(val(v) for v in x) + "]"
        return json.dumps(x) if isinstance(x, str) else str(x)

    out = "".join(f"{k} = {val(v)}\n" for k, v in doc.items() if not isinstance(v, dict))
    for k, v in doc.items():
        if isinstance(v, dict):
            out += f"[{prefix}{k}]\n" + _toml(v, f"{prefix}{k}.")
    return out


def mutate_bytes(text: bytes, rng: random.Random) -> bytes:
    b = bytearray(text)
    for _ in range(rng.choice((1, 1, 2, 4))):
        op = rng.random()
        i = rng.randrange(len(b) + 1)
        if op < 0.25:
            b[i:i] = bytes([rng.choice((0xFF, 0xFE, 0xC3, 0x00, 0x80, ord("="), ord("["), ord('"'), ord("\n"),
                                        rng.randrange(256)))])
        elif op < 0.45 and b:
            del b[i:i + rng.randrange(1, 12)]
        elif op < 0.6 and b:
            b[min(i, len(b) - 1)] ^= 1 << rng.randrange(8)
        elif op < 0.7:
            del b[i:]
        elif op < 0.8:
            b[i:i] = "é".encode("latin-1")
        elif op < 0.9:
            b[i:i] = rng.choice((b"9999999999999999999999", b"1e400", b"nan", b"-0", b"0.0", b"inf"))
        else:
            lines = bytes(b).split(b"\n")
            k = rng.randrange(len(lines))
            lines.insert(k, lines[k])
            b = bytearray(b"\n".join(lines))
    return bytes(b)


def _documents():
    rng = random.Random(20261124)
    for i in range(N_STRUCTURAL):
        yield f"structural-{i}", mutate(SEEDS[i % len(SEEDS)], rng)
    texts = [_toml(s).encode() for s in SEEDS]
    for i in range(N_BYTES):
        yield f"bytes-{i}", mutate_bytes(texts[i % len(texts)], rng)


def _predict_all(jobs) -> tuple[int, int]:
    """The predict path over accepted jobs, one engine call per (model, hardware); (feasible, refused)."""
    groups = defaultdict(list)
    for j in jobs:
        groups[(repr(j.model), j.hardware.name)].append(j)
    feasible = refused = 0
    for group in groups.values():
        model, hw = group[0].model, group[0].hardware
        try:
            batch = jobs_to_batch(group, PRED.registry)
            ok = np.ones(len(group), bool)
            for r in PRED.constraints(batch, model, hw):
                ok &= np.asarray(r.feasible, bool)
        except MofaError:
            refused += len(group)
            continue
        refused += int((~ok).sum())
        if not ok.any():
            continue
        pred = PRED.evaluate(batch.take(np.flatnonzero(ok)), model, hw)  # raises InvariantError on any violation
        assert np.all(np.isfinite(pred.step_time_s) & (pred.step_time_s > 0))
        assert np.all(pred.mfu <= mfu_ceiling(model, pred.batch) * (1 + 1e-9))
        assert np.all(pred.tokens_per_s_per_gpu > 0)
        feasible += int(ok.sum())
    return feasible, refused


def test_ten_thousand_mutated_job_documents():
    accepted, rejected, crashes = [], 0, []
    for where, doc in _documents():
        try:
            data = parse_toml(doc, where) if isinstance(doc, bytes) else doc
            accepted.append(PRED.job(data, name=where))
        except InvariantError:
            raise
        except MofaError:
            rejected += 1
        except Exception as exc:  # noqa: BLE001 - collected, reported below
            crashes.append(f"{where}: {type(exc).__name__}: {exc}"[:300])
    assert not crashes, f"{len(crashes)} crashes, e.g.:\n" + "\n".join(crashes[:10])
    assert len(accepted) + rejected == N_STRUCTURAL + N_BYTES
    feasible, refused = _predict_all(accepted)
    # the fuzzer reaches both sides of every gate: parsing, resolution, feasibility and the engine
    # (seeded: 8,892 refused while reading, 736 evaluated, 372 refused by a feasibility rule; 8,815 /
    # 1,052 / 133 before the DeepSeek-V3 example ran DualPipe, whose rules refuse more of its mutants)
    assert rejected > 5000 and feasible > 600 and refused > 50, (rejected, feasible, refused)
    # the real entry point (raises on the first infeasible job) agrees on a sample
    for job in accepted[:: max(1, len(accepted) // 150)]:
        try:
            PRED.predict(job)
        except InvariantError:
            raise
        except MofaError:
            pass
