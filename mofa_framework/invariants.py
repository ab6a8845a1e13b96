"""Output invariants the engine enforces on every row it evaluates, and the plugin that broke one.

An accepted job never yields an impossible number (architecture.md: "the engine checks its own
outputs"). Three places check, each naming the one plugin at fault:

- **providers** (:func:`provider_result`): ``mofa_operator_latency`` and ``mofa_collective_latency``
  answer an array of the batch's length, finite and ≥ 0. A provider that raises is named from
  the traceback; one whose answer is NaN, infinite or negative is found by asking each
  implementation alone (the first answering one, then each wrapper around it).
- **feature transforms** (:func:`check_transform`): after each transform, every array it changed
  (layer costs, pipeline inputs, optimizer costs, memory) is finite and ≥ 0.
- **the prediction** (:func:`check_prediction`), once at the end of ``evaluate``:

  ===========================  ==========================================================
  step time                    finite and > 0; tokens/s/GPU finite and > 0
  step breakdown               every component finite and ≥ 0 (``schedule_adjust``, a
                               schedule's reordering, may be negative), summing to the step
  memory breakdown             every component finite and ≥ 0, summing to the peak
  MFU                          > 0 and ≤ the MFU ceiling (below), against the peak of the
                               fastest format the row's GEMMs run in
  HFU                          ≥ MFU: hardware FLOPs = model FLOPs + recomputed FLOPs
  layers                       the stages hold the model's layers exactly once
  ===========================  ==========================================================

  A violation re-evaluates the row with each of its features turned off in turn; the feature
  whose removal mends it is named (its plugin), else the provider or engine part that produced
  the broken quantity.

**MFU ceiling.** Model FLOPs count attention as the full s×s square (Megatron's and PaLM's
convention, which published MFUs use); a fused causal kernel executes about half of it. The
kernels cannot run faster than the peak, so ``MFU ≤ model FLOPs / (model FLOPs − attention's model
FLOPs + attention's executed FLOPs)``: exactly 1 with unfused attention, slightly above 1 at long
sequences with flash attention (``mfu_ceiling``). Everything but attention is held to MFU ≤ 1.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import numpy as np

from .batch import sequence_shapes
from .decompose import (ATTENTION_BWD_FACTOR, Geometry, attention_mixer_operators, document_tokens,
                        training_flops_per_sequence)
from .errors import PluginError, PluginResultError
from .types import ConstraintResult, positional_count

#: relative tolerance of the additivity checks (float64 sums of a few dozen terms)
REL_TOL = 1e-6


class InvariantError(PluginResultError):
    """An output invariant failed: an internal error whose message names the plugin at fault."""


# ====================================================================== providers


def raiser(exc: BaseException, impls) -> str | None:
    """The plugin whose hook implementation raised `exc` (the innermost one in its traceback)."""
    codes = {i.function.__code__: i.plugin_name for i in impls}
    name = None
    tb = exc.__traceback__
    while tb is not None:
        name = codes.get(tb.tb_frame.f_code, name)
        tb = tb.tb_next
    return name


def answer_problem(out, n: int) -> str:
    """What is wrong with a provider's answer, or '' if nothing."""
    if out is None:
        return "no answer (None)"
    try:
        arr = np.asarray(out, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        return f"not an array of numbers ({type(exc).__name__})"
    if arr.shape != (n,):
        return f"shape {arr.shape}, expected ({n},)"
    bad = ~(np.isfinite(arr) & (arr >= 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        return f"{int(bad.sum())} negative or non-finite values (e.g. {arr[i]!r} at row {i})"
    return ""


def blame_provider(pm, hook: str, kwargs: Mapping, n: int) -> str:
    """The one plugin whose answer to the firstresult `hook` is broken: the first implementation
    that answers, asked alone; if its answer is sound, each wrapper around it, alone."""
    caller = getattr(pm.hook, hook)
    impls = caller.get_hookimpls()
    wrappers = [i for i in impls if i.wrapper or i.hookwrapper]
    for impl in reversed([i for i in impls if not (i.wrapper or i.hookwrapper)]):
        try:
            res = impl.function(**{a: kwargs[a] for a in impl.argnames})
        except Exception:  # noqa: BLE001
            return impl.plugin_name
        if res is None:
            continue
        if answer_problem(res, n):
            return impl.plugin_name
        break
    for w in wrappers:
        alone = pm.subset_hook_caller(hook, remove_plugins=[x.plugin for x in wrappers if x is not w])
        try:
            if answer_problem(alone(**kwargs), n):
                return w.plugin_name
        except Exception:  # noqa: BLE001
            return w.plugin_name
    names = [i.plugin_name for i in impls]
    return names[0] if len(names) == 1 else f"one of {', '.join(names)} (together)"


def provider_result(pm, hook: str, n: int, **kwargs) -> np.ndarray:
    """Call the firstresult provider `hook`; its answer as float64, or PluginError naming the
    one plugin that raised or answered something other than `n` finite, non-negative numbers."""
    caller = getattr(pm.hook, hook)
    try:
        out = caller(**kwargs)
    except PluginError:
        raise
    except Exception as exc:  # a provider raising must name itself, not crash the CLI
        who = raiser(exc, caller.get_hookimpls()) or "?"
        raise PluginError(f"plugin {who!r} failed in {hook}: {type(exc).__name__}: {exc}") from exc
    if out is None:
        raise PluginError(f"no plugin answered {hook}: is the built-in provider disabled?")
    problem = answer_problem(out, n)
    if problem:
        who = blame_provider(pm, hook, kwargs, n)
        raise PluginResultError(f"plugin {who!r} broke {hook}'s contract: {problem}")
    return np.asarray(out, dtype=np.float64)


# ====================================================================== feature transforms


def bad_arrays(new, old=None, prefix: str = "") -> list[str]:
    """Names of the arrays in `new` (attrs records and mappings, recursively) that are not all
    finite and ≥ 0, skipping those identical to `old`'s (already checked)."""
    if new is old:
        return []
    if isinstance(new, np.ndarray):
        if new.dtype.kind != "f" or not new.size:
            return []
        return [] if new.min() >= 0 and new.max() < np.inf else [prefix or "value"]  # NaN fails min() >= 0
    if isinstance(new, Mapping):
        return [b for k, x in new.items()
                for b in bad_arrays(x, old.get(k) if isinstance(old, Mapping) else None, f"{prefix}{k}.")]
    if attrs.has(type(new)):
        return [b for f in attrs.fields(type(new)) if f.init
                for b in bad_arrays(getattr(new, f.name), getattr(old, f.name, None) if old is not None else None,
                                    f"{prefix}{f.name}")]
    return []


def check_transform(feature: str, plugin: str, phase: str, new, old) -> None:
    """PluginResultError naming `feature` (plugin `plugin`) if its `phase` transform left an array
    NaN, infinite or negative."""
    bad = bad_arrays(new, old)
    if bad:
        raise InvariantError(f"plugin {plugin!r}: feature {feature!r}'s {phase} transform made "
                             f"{', '.join(b.rstrip('.') for b in bad[:4])} negative or non-finite")


# ====================================================================== the prediction


def mfu_ceiling(model, batch, frozen=None) -> np.ndarray:
    """Per row, the largest MFU the kernels allow: model FLOPs over the FLOPs they execute at least
    (attention causal with fused kernels, the full square without); 1 without attention savings.
    `frozen` marks rows that train none of the model's weights (their model FLOPs lack the weight
    gradients: ``decompose.training_flops_per_sequence``)."""
    (seq, doc), inv = sequence_shapes(batch)
    d = document_tokens(seq, doc)  # packed documents: s/d sequences of d tokens each
    one = np.ones_like(seq)
    geo = lambda flash: Geometry(b=one, s=d, t=one, c=one, e=one, etp=one, dp=one,  # noqa: E731
                                 sp=np.zeros(len(seq), bool), dt=2.0 * one, precision=np.zeros(len(seq), int),
                                 flash=np.full(len(seq), flash))
    attn_model = 3.0 * seq / d * _core_attention_flops(model, geo(False))
    attn_exec = (1.0 + ATTENTION_BWD_FACTOR) * seq / d * _core_attention_flops(model, geo(True))
    saved = np.maximum(attn_model - attn_exec, 0.0)
    ratio = lambda total: total / np.maximum(total - saved, 1e-300)  # noqa: E731
    ceiling = ratio(training_flops_per_sequence(model, seq, doc=doc))[inv]
    if frozen is not None and np.any(frozen):
        ceiling = np.where(frozen, ratio(training_flops_per_sequence(model, seq, True, doc))[inv], ceiling)
    return np.where(np.asarray(batch.flash_attention, bool), ceiling, 1.0)


def _core_attention_flops(model, g: Geometry) -> np.ndarray:
    """Forward core-attention FLOPs of one sequence through every attention layer of the stack, each
    kind by its own attention (full, sliding, chunked; the MTP modules as their own layers);
    layers without attention (Mamba, linear attention) execute what model FLOPs count."""
    out = np.zeros(len(g.s))
    for kind, count in model.executed_kind_counts.items():
        block = model.block_kinds[kind]
        if not block.is_attention:
            continue
        ops = attention_mixer_operators(model, g, block)
        out = out + count * sum((np.asarray(o.flops, dtype=np.float64) for o in ops if o.name == "core_attention"),
                                np.zeros(len(g.s)))
    return out


@attrs.frozen
class Violation:
    row: int
    #: which invariant (``step``, ``breakdown.<k>``, ``step_sum``, ``mem.<k>``, ``mem_sum``, ``tokens``,
    #: ``mfu``, ``hfu``, ``layers``)
    key: str
    what: str


def _close(total: np.ndarray, parts: np.ndarray) -> np.ndarray:
    return np.abs(total - parts) <= REL_TOL * np.maximum(np.abs(total), np.abs(parts)) + 1e-300


def violations(pred) -> list[Violation]:
    """Every invariant of the module docstring over all rows of `pred`: the first bad row of each."""
    out: list[Violation] = []

    def first(mask, key, what):
        bad = np.flatnonzero(~np.asarray(mask, bool))
        if len(bad):
            out.append(Violation(int(bad[0]), key, what(int(bad[0]))))

    n = len(pred.step_time_s)
    step = pred.step_time_s
    first(np.isfinite(step) & (step > 0), "step", lambda i: f"step time {step[i]!r} s is not finite and > 0")
    keys = [k for k in pred.breakdown if k != "schedule_adjust"]
    # component by component, not stacked: a million rows' (components, rows) copy costs more than the
    # checks; the sum accumulates in the components' order, as ``np.stack(...).sum(axis=0)`` does
    floor = -REL_TOL * np.abs(step)
    signed_ok, total = True, np.zeros(n)
    for k in keys:
        a = np.asarray(pred.breakdown[k], dtype=np.float64)
        signed_ok = signed_ok and bool(np.isfinite(a).all() and (a >= floor).all())
        total = total + a
    if not signed_ok:  # name the component
        for k in keys:
            a = pred.breakdown[k]
            first(np.isfinite(a) & (a >= -REL_TOL * np.abs(step)), f"breakdown.{k}",
                  lambda i, k=k, a=a: f"step-time component {k!r} is {a[i]!r} s")
    adjust = pred.breakdown.get("schedule_adjust", np.zeros(n))
    first(np.isfinite(adjust), "breakdown.schedule_adjust", lambda i: f"schedule_adjust is {adjust[i]!r} s")
    parts = total + adjust
    first(_close(step, parts), "step_sum",
          lambda i: f"the step breakdown sums to {parts[i]!r} s, not the step time {step[i]!r} s")
    peak = pred.peak_memory_bytes
    if not all(np.min(a) >= 0 and np.max(a) < np.inf for a in pred.memory_breakdown.values()):
        for k, a in pred.memory_breakdown.items():
            first(np.isfinite(a) & (a >= 0), f"mem.{k}",
                  lambda i, k=k, a=a: f"memory component {k!r} is {a[i]!r} bytes")
    mem = sum((a for k, a in pred.memory_breakdown.items() if k != "host"), np.zeros(n))
    first(_close(peak, mem), "mem_sum", lambda i: f"the memory breakdown sums to {mem[i]!r} bytes, not the peak "
                                                  f"{peak[i]!r}")
    tok = pred.tokens_per_s_per_gpu
    first(np.isfinite(tok) & (tok > 0), "tokens", lambda i: f"tokens/s/GPU is {tok[i]!r}")
    from .engine import frozen_weight_rows

    ceiling = mfu_ceiling(pred.model, pred.batch, frozen_weight_rows(pred.batch, pred.state.ctx.pm.registry))
    mfu, hfu = pred.mfu, pred.hfu
    first(np.isfinite(mfu) & (mfu > 0) & (mfu <= ceiling * (1 + REL_TOL)), "mfu",
          lambda i: f"MFU {mfu[i]:.4g} exceeds what the peak allows ({ceiling[i]:.4g})")
    first(np.isfinite(hfu) & (hfu >= mfu * (1 - REL_TOL)), "hfu", lambda i: f"HFU {hfu[i]!r} is below MFU {mfu[i]!r}")
    lay = pred.state.layout
    if lay is not None:
        from .engine import stage_layer_totals

        placed = stage_layer_totals(pred.batch, lay.total)
        first(placed == pred.model.num_layers, "layers",
              lambda i: f"the pipeline stages hold {placed[i]:g} layers, not the model's {pred.model.num_layers}")
    return out


#: the breakdown component (provenance key) whose producer is named when no feature is to blame
_SOURCE = {"step": "compute_fwd", "tokens": "compute_fwd", "mfu": "compute_fwd", "hfu": "recompute",
           "step_sum": None, "mem_sum": None, "layers": None}


def _feature_culprit(pred, row: int, pm, key: str) -> str | None:
    """The feature on `row` whose removal mends invariant `key` (a one-row re-evaluation each)."""
    from .engine import evaluate

    batch = pred.batch.take(np.array([row]))
    for name, rows in batch.features.items():
        if not rows.enabled[0]:
            continue
        off = attrs.evolve(batch, features={**batch.features, name: attrs.evolve(rows, enabled=np.zeros(1, bool))})
        try:
            if not any(v.key == key for v in violations(evaluate(off, pred.model, pred.hardware, pm, check=False))):
                return name
        except Exception:  # noqa: BLE001 - the diagnosis must not hide the violation
            continue
    return None


def _producer(pred, registry, v: Violation) -> str:
    """Who made the broken quantity when no feature is to blame: a provider, a schedule, or the core."""
    key = _SOURCE.get(v.key, v.key.split(".", 1)[-1] if v.key.startswith("breakdown.") else None)
    source = pred.provenance.get(key) if key else None
    if source == "schedule":
        name = list(registry.schedules)[int(pred.batch.schedule[v.row])]
        return f"plugin {registry.provided_by.get(('schedules', name), name)!r} (schedule {name!r})"
    if source and source not in ("engine", "hardware profile"):
        return f"plugin {source!r}"
    return "the MoFa core (engine)"


def check_prediction(pred, pm) -> None:
    """InvariantError for the first violated invariant, naming the plugin whose output broke it."""
    found = violations(pred)
    if not found:
        return
    v = found[0]
    registry = pm.registry
    culprit = _feature_culprit(pred, v.row, pm, v.key)
    if culprit is not None:
        who = f"plugin {registry.provided_by.get(('features', culprit), culprit)!r} (feature {culprit!r})"
    else:
        who = _producer(pred, registry, v)
    raise InvariantError(f"internal error: {who} broke an output invariant on row {v.row}: {v.what} "
                         "(please report it; --disable-plugin leaves a plugin out)")


# ====================================================================== feasibility callables


def schedule_result(registry, feature, batch, rows):
    """The rows of `feature` (on in ``rows.enabled``) that run a pipeline (pp > 1) under a schedule
    outside ``feature.schedules`` as infeasible, or None when the feature runs under any schedule."""
    if not feature.schedules:
        return None
    allowed = np.array([name in feature.schedules for name in registry.schedules], bool)
    ok = ~np.asarray(rows.enabled, bool) | (np.asarray(batch.pp) <= 1) | allowed[np.asarray(batch.schedule)]
    names = " / ".join(feature.schedules)
    return ConstraintResult(
        name=f"{feature.name}_schedules", feasible=ok,
        reason=f"features.{feature.name} runs a pipeline only under the {names} schedule: set pipeline.schedule "
               f"= {feature.schedules[0]!r}, or parallel.pp = 1")


def feature_rules(registry, feature, batch, rows) -> list[ConstraintResult]:
    """A feature's feasibility rules — its ``feasible`` callable and its ``schedules`` — over a batch
    where `rows` say where it is on (rows where it is off pass every rule)."""
    out = []
    if feature.feasible is not None:
        r = feasible_result(registry, "features", feature, batch, rows)
        out.append(attrs.evolve(r, feasible=r.feasible | ~np.asarray(rows.enabled, bool)))
    sched = schedule_result(registry, feature, batch, rows)
    return out if sched is None else [*out, sched]


def schedule_rules(registry, batch, model, hardware) -> list[ConstraintResult]:
    """Each pipeline schedule's ``feasible`` rule over the rows that use it (the others pass), with
    the model and hardware profile for a rule that takes them."""
    out = []
    for code, sched in enumerate(registry.schedules.values()):
        rows = np.asarray(batch.schedule) == code
        if sched.feasible is None or not rows.any():
            continue
        extra = (model, hardware) if positional_count(sched.feasible) >= 4 else ()
        r = feasible_result(registry, "schedules", sched, batch, rows, "feasible", *extra)
        out.append(attrs.evolve(r, feasible=r.feasible | ~rows))
    return out


def feasible_result(registry, kind: str, record, batch, rows, rule: str = "feasible", *args):
    """``record.feasible(batch, rows)`` of a feature or schedule (`kind`: "features" | "schedules"),
    or its other `rule` called with `args` after them (a schedule's ``end_stages``), with a raising
    or malformed answer reported as a PluginError naming the record's plugin."""
    plugin = registry.provided_by.get((kind, record.name), record.name)
    try:
        r = getattr(record, rule)(batch, rows, *args)
        mask = np.asarray(r.feasible, dtype=bool)
    except Exception as exc:  # noqa: BLE001
        raise PluginError(f"plugin {plugin!r}: {kind[:-1]} {record.name!r}'s feasibility rule failed: "
                          f"{type(exc).__name__}: {exc}") from exc
    if mask.shape != (len(batch),):
        raise PluginResultError(f"plugin {plugin!r}: {kind[:-1]} {record.name!r}'s feasibility rule has shape "
                                f"{mask.shape}, expected ({len(batch)},)")
    return attrs.evolve(r, feasible=mask)
