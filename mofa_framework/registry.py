"""The registry: every record the installed plugins registered, validated and indexed."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping

import attrs

from .errors import PluginConflictError, PluginError, UnknownRecordError
from .types import (
    ConfigSection,
    FaultRecoveryPolicy,
    Feature,
    FlopsConvention,
    HardwareProfile,
    LazyRecord,
    MeasurementReader,
    ModelSpec,
    Phase,
    PipelineSchedule,
)


_SINGULAR = {"hardware": "hardware profile", "models": "model", "schedules": "pipeline schedule",
             "features": "feature", "policies": "fault-recovery policy", "config_sections": "config section",
             "readers": "measurement reader", "flops_conventions": "FLOPs convention"}


def _check_options(rec) -> str:
    """A record's options type must be a frozen attrs class constructible with defaults."""
    opts = getattr(rec, "options_type", None)
    if opts is None:
        return ""
    if not attrs.has(opts):
        return f"options_type {opts!r} is not an attrs class"
    try:
        opts()
    except Exception as exc:  # noqa: BLE001
        return f"options_type {opts.__name__} cannot be built with its defaults: {type(exc).__name__}: {exc}"
    return ""


#: an organisation prefix as HuggingFace writes it ("meta-llama/", "nvidia/"), its separators as a
#: name's may be respelled ("zai org/"): no space next to the "/" (a "530B / GPT" alias is no prefix)
_ORG_PREFIX = re.compile(r"^[\w.\- ]*[\w.\-]/(?=[^\s/][^/]*$)")
#: the tokens of a name: runs of letters, and numbers (a dot only inside a number: "3.1")
_TOKEN = re.compile(r"[a-z]+|\d+(?:\.\d+)*")
#: trailing words a published name may add to a registered one without changing what it names
#: (the instruction-tuned or base release of a pretrained architecture); dropped only as a fallback
_VARIANT_SUFFIXES = ("instruct", "base", "chat", "hf")


def normalize_name(name: str) -> str:
    """The key every registered name and alias is looked up by.

    Case, spaces, dots, dashes and underscores do not matter, nor where a number meets a word
    ("Llama3.1 405b" = "llama-3.1-405B" = "LLAMA3.1_405B"), nor an organisation prefix
    ("meta-llama/Llama-3.1-70B"): the name becomes its letter runs and numbers (a dot inside a
    number is kept: "3.1" ≠ "31"), joined by "-". One rule for every kind of record.
    """
    text = _ORG_PREFIX.sub("", name.strip().lower())
    return "-".join(_TOKEN.findall(text))


_norm = normalize_name


def _without_variant(key: str) -> str:
    parts = key.split("-")
    while len(parts) > 1 and parts[-1] in _VARIANT_SUFFIXES:
        parts.pop()
    return "-".join(parts)


def _loaded(rec: LazyRecord, rtype: type):
    """The record `rec` stands for, checked to be an `rtype` of the name and aliases it was indexed by."""
    out = rec.load()
    if not isinstance(out, rtype) or out.name != rec.name or tuple(getattr(out, "aliases", ())) != rec.aliases:
        raise PluginError(f"the {rtype.__name__} registered as {rec.name!r} read as "
                          f"{type(out).__name__} {getattr(out, 'name', '?')!r} with other names or aliases")
    return out


class LazyTable(Mapping):
    """Records by name; a :class:`~mofa_framework.types.LazyRecord` is read the first time it is
    looked up (iterating names or counting them reads nothing)."""

    def __init__(self, records: Mapping, rtype: type):
        self._records, self._rtype = dict(records), rtype

    def __getitem__(self, name: str):
        rec = self._records[name]
        if isinstance(rec, LazyRecord):
            rec = self._records[name] = _loaded(rec, self._rtype)
        return rec

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)


#: the kinds whose hooks may return :class:`~mofa_framework.types.LazyRecord` (files read on demand)
_LAZY_KINDS = ("hardware", "models")


def _table(records: dict, rtype: type) -> Mapping:
    return LazyTable(records, rtype) if any(isinstance(r, LazyRecord) for r in records.values()) else records


#: (phase, ids of the feature records) -> (the records, their order in the phase)
_PHASE_ORDER: dict[tuple, tuple[tuple, list]] = {}


@attrs.frozen(kw_only=True)
class Registry:
    """Records by kind and name, plus which plugin provided each and what went wrong."""

    hardware: Mapping[str, HardwareProfile]
    models: Mapping[str, ModelSpec]
    schedules: Mapping[str, PipelineSchedule]
    features: Mapping[str, Feature]
    policies: Mapping[str, FaultRecoveryPolicy]
    config_sections: Mapping[str, ConfigSection]
    provided_by: Mapping[tuple[str, str], str]
    aliases: Mapping[tuple[str, str], str]
    problems: tuple[str, ...] = ()
    readers: Mapping[str, MeasurementReader] = attrs.field(factory=dict)
    flops_conventions: Mapping[str, FlopsConvention] = attrs.field(factory=dict)

    @classmethod
    def collect(cls, pm) -> Registry:
        from .manager import RECORD_HOOKS

        tables: dict[str, dict] = {k: {} for k in RECORD_HOOKS}
        provided_by: dict[tuple[str, str], str] = {}
        aliases: dict[tuple[str, str], str] = {}
        problems: list[str] = []

        def dist(plugin: str) -> str:
            info = pm.infos.get(plugin)
            return f"{plugin} ({info.distribution} {info.version})".replace(" ( )", "") if info else plugin

        for kind, (hook, rtype) in RECORD_HOOKS.items():
            alias_kind = "features" if kind in ("overlaps", "memory_optimizers", "transforms") else kind
            for plugin, records in pm.hook_results(hook):
                for rec in records:
                    if not (isinstance(rec, rtype) or (isinstance(rec, LazyRecord) and kind in _LAZY_KINDS)):
                        msg = (f"plugin {plugin!r} returned {type(rec).__name__} from {hook}; "
                               f"expected {rtype.__name__}")
                        problems.append(msg)
                        if pm.strict:
                            raise PluginError(msg)
                        continue
                    bad = _check_options(rec)
                    if bad:
                        msg = f"plugin {plugin!r}: {kind} record {rec.name!r}: {bad}"
                        problems.append(msg)
                        info = pm.infos.get(plugin)
                        if info is not None:
                            info.status, info.error = "failed", msg
                        if pm.strict:
                            raise PluginError(msg)
                        continue
                    keys = [rec.name, *getattr(rec, "aliases", ())]
                    clash = next((k for k in keys if (alias_kind, _norm(k)) in aliases), None)
                    if clash is not None:
                        owner_name = aliases[(alias_kind, _norm(clash))]
                        owner = provided_by[(alias_kind, owner_name)]
                        msg = (f"{alias_kind} name {clash!r} is registered by both {dist(owner)} and {dist(plugin)}; "
                               f"the second is ignored — disable one with --disable-plugin")
                        problems.append(msg)
                        info = pm.infos.get(plugin)
                        if info is not None and info.status != "failed":
                            info.status = "failed"
                            info.error = msg
                        if pm.strict:
                            raise PluginConflictError(msg)
                        continue
                    tables[kind][rec.name] = rec
                    provided_by[(alias_kind, rec.name)] = plugin
                    for k in keys:
                        aliases[(alias_kind, _norm(k))] = rec.name
        features = {**tables["overlaps"], **tables["memory_optimizers"], **tables["transforms"]}
        return cls(
            hardware=_table(tables["hardware"], HardwareProfile),
            models=_table(tables["models"], ModelSpec),
            schedules=dict(sorted(tables["schedules"].items())),
            features=dict(sorted(features.items())),
            policies=tables["policies"],
            config_sections=tables["config_sections"],
            provided_by=provided_by,
            aliases=aliases,
            problems=tuple(problems),
            readers=dict(sorted(tables["readers"].items())),
            flops_conventions=dict(sorted(tables["flops_conventions"].items())),
        )

    # ------------------------------------------------------------------ look-ups
    def _lookup(self, kind: str, table: Mapping, name: str, field: str, listing: str):
        norm = _norm(name)
        key = self.aliases.get((kind, norm)) or self.aliases.get((kind, _without_variant(norm)))
        if key is None:
            close = self.closest(kind, name)
            hint = f"closest: {', '.join(close)}; " if close else ""
            known = "" if close else " (" + (", ".join(sorted(table)[:12]) + (" ..." if len(table) > 12 else "")
                                           or "none installed") + ")"
            raise UnknownRecordError(
                f"{field}: unknown {_SINGULAR[kind]} {name!r}; {hint}run `mofa {listing}` to see the installed "
                f"ones{known}"
            )
        return table[key]

    def closest(self, kind: str, name: str, n: int = 3) -> list[str]:
        """Up to `n` registered names of `kind` whose names or aliases are most like `name`
        (difflib's ratio on the normalised keys; nothing below 0.5)."""
        keys = {k: rec for (knd, k), rec in self.aliases.items() if knd == kind}
        out: list[str] = []
        for k in difflib.get_close_matches(_norm(name), list(keys), n=4 * n, cutoff=0.5):
            if keys[k] not in out:
                out.append(keys[k])
        return out[:n]

    def hardware_profile(self, name: str, field: str = "hardware.name") -> HardwareProfile:
        return self._lookup("hardware", self.hardware, name, field, "list-hardware")

    def model(self, name: str, field: str = "model.name") -> ModelSpec:
        return self._lookup("models", self.models, name, field, "list-models")

    def schedule(self, name: str, field: str = "pipeline.schedule") -> PipelineSchedule:
        return self._lookup("schedules", self.schedules, name, field, "list-plugins")

    def feature(self, name: str, field: str = "features") -> Feature:
        return self._lookup("features", self.features, name, field, "list-plugins")

    def policy(self, name: str, field: str = "fault.policy") -> FaultRecoveryPolicy:
        return self._lookup("policies", self.policies, name, field, "list-plugins")

    def reader(self, name: str, field: str = "--reader") -> MeasurementReader:
        return self._lookup("readers", self.readers, name, field, "list-plugins")

    def flops_convention(self, name: str, field: str = "flops_convention") -> FlopsConvention:
        return self._lookup("flops_conventions", self.flops_conventions, name, field, "list-plugins")

    def schedule_code(self, name: str) -> int:
        return list(self.schedules).index(name)

    def features_in_phase(self, phase: Phase) -> list[Feature]:
        """Features acting in `phase`, ordered by their after/before constraints (stable by name);
        computed once per set of feature records (the engine asks once per phase per batch)."""
        key = (phase, tuple(map(id, self.features.values())))
        hit = _PHASE_ORDER.get(key)
        if hit is None:  # the cache holds the records themselves: their ids stay theirs
            hit = _PHASE_ORDER[key] = (tuple(self.features.values()), self._features_in_phase(phase))
        return list(hit[1])

    def _features_in_phase(self, phase: Phase) -> list[Feature]:
        feats = [f for f in self.features.values() if f.acts_in(phase) is not None]
        names = {f.name for f in feats}
        deps: dict[str, set[str]] = {f.name: {a for a in f.after if a in names} for f in feats}
        for f in feats:
            for b in f.before:
                if b in names:
                    deps[b].add(f.name)
        order: list[str] = []
        ready = sorted(n for n, d in deps.items() if not d)
        while ready:
            n = ready.pop(0)
            order.append(n)
            for m, d in deps.items():
                if n in d:
                    d.discard(n)
                    if not d and m not in order and m not in ready:
                        ready.append(m)
                        ready.sort()
        if len(order) != len(feats):
            cycle = sorted(names - set(order))
            raise PluginError(f"features {cycle} have circular after/before constraints in phase {phase.value}")
        by = {f.name: f for f in feats}
        return [by[n] for n in order]
