"""The plugin manager: loads entry points one at a time and survives broken plugins.

pluggy's own ``load_setuptools_entrypoints`` stops at the first plugin that fails to import
and silently picks one of two distributions that use the same entry-point name. This
loader records both cases as failed plugins instead (``mofa list-plugins`` shows them),
and a strict mode turns any failure into an error.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Callable, Iterable

from typing import TYPE_CHECKING

import attrs
import pluggy

from . import hookspecs
from .errors import ConfigError, PluginConflictError, PluginError, PluginLoadError
from .hookspecs import PROJECT
from .limits import env_flag
from .types import (
    ConfigSection,
    CostTransform,
    FaultRecoveryPolicy,
    Feature,
    FlopsConvention,
    HardwareProfile,
    MeasurementReader,
    MemoryOptimizer,
    ModelSpec,
    OverlapStrategy,
    PipelineSchedule,
)

if TYPE_CHECKING:  # pragma: no cover
    from .registry import Registry

ENTRY_POINT_GROUP = "mofa"
BUILTIN_DISTRIBUTION = "mofa"

ENV_DISABLED = "MOFA_DISABLED_PLUGINS"
ENV_STRICT = "MOFA_STRICT_PLUGINS"
ENV_TRACE = "MOFA_TRACE_PLUGINS"
ENV_NO_AUTOLOAD = "MOFA_DISABLE_PLUGIN_AUTOLOAD"


@attrs.define(kw_only=True)
class PluginInfo:
    """What `mofa list-plugins` shows for one plugin."""

    name: str
    distribution: str = ""
    version: str = ""
    entry_point: str = ""
    status: str = "active"  #: builtin | active | disabled | failed
    error: str = ""

    @property
    def builtin(self) -> bool:
        return self.distribution == BUILTIN_DISTRIBUTION


def _env_list(name: str) -> list[str]:
    return [x.strip() for x in os.environ.get(name, "").split(",") if x.strip()]


def _env_flag(name: str) -> bool:
    """A boolean environment variable; ConfigError for anything but 1/true/yes/on, 0/false/no/off, empty."""
    return env_flag(name, os.environ.get(name))


class MofaPluginManager(pluggy.PluginManager):
    """A :class:`pluggy.PluginManager` with a robust loader, statuses and the record registry."""

    def __init__(self, *, strict: bool | None = None, disabled: Iterable[str] = (), trace: bool | None = None):
        super().__init__(PROJECT)
        self.add_hookspecs(hookspecs.MofaSpecs)
        self.strict = _env_flag(ENV_STRICT) if strict is None else strict
        self.infos: dict[str, PluginInfo] = {}
        self._registry = None
        #: names asked to be disabled, and where each came from (checked against the entry points)
        self.requested_disabled: dict[str, str] = {}
        #: entry-point names seen by :meth:`load_entrypoints`
        self.entry_point_names: set[str] = set()
        for name in _env_list(ENV_DISABLED):
            self.requested_disabled.setdefault(name, ENV_DISABLED)
        for name in disabled:
            if not isinstance(name, str) or not name.strip():
                raise ConfigError(f"--disable-plugin: expected a plugin name, got {name!r} (see `mofa list-plugins`)")
            self.requested_disabled.setdefault(name.strip(), "--disable-plugin")
        for name in self.requested_disabled:
            self.disable(name)
        if _env_flag(ENV_TRACE) if trace is None else trace:
            self.trace.root.setwriter(sys.stderr.write)
            self.enable_tracing()

    # ------------------------------------------------------------------ loading
    def check_disabled(self, known: Iterable[str]) -> None:
        """ConfigError for a name asked to be disabled that no installed plugin has (a typo would
        otherwise silently disable nothing); the message lists the known names."""
        known = set(known)
        unknown = [n for n in self.requested_disabled if n not in known]
        if unknown:
            from .config import listing

            import difflib

            where = self.requested_disabled[unknown[0]]
            close = [c for n in unknown for c in difflib.get_close_matches(n, sorted(known), n=3, cutoff=0.6)]
            names = (f"closest: {listing(list(dict.fromkeys(close)))}" if close
                     else f"known: {listing(sorted(known), 60)}")
            # the pointer first: the listing may be cut to the error line's length
            raise ConfigError(f"{where}: no plugin named {listing(unknown)} (`mofa list-plugins` lists the {len(known)} "
                              f"installed); {names}")

    def disable(self, name: str) -> None:
        """Block plugin `name` (entry-point name): it is listed as disabled and never loaded."""
        self.set_blocked(name)
        info = self.infos.setdefault(name, PluginInfo(name=name))
        info.status = "disabled"
        self._registry = None

    def _fail(self, info: PluginInfo, message: str, exc_type=PluginLoadError) -> None:
        info.status = "failed"
        info.error = message
        self.infos[info.name] = info
        if self.strict:
            raise exc_type(message)

    def load_entrypoints(self, group: str = ENTRY_POINT_GROUP, *, builtin_only: bool = False) -> None:
        """Import and register every entry point of `group`, one at a time.

        `builtin_only` loads just MoFa's own plugins (what ``MOFA_DISABLE_PLUGIN_AUTOLOAD=1``
        gives, and the test fixtures use).
        """
        by_name: dict[str, list] = {}
        # parsing a distribution's METADATA (.metadata, .version) is the slow part: once each (the
        # value keeps the distribution alive, so its id stays its own)
        metas: dict[int, tuple] = {}

        def meta(d):
            if id(d) not in metas:
                metas[id(d)] = (d, d.metadata)
            return metas[id(d)][1]

        def dist_name(d) -> str:
            return meta(d)["Name"] or "?"

        def dist_version(d) -> str:
            return meta(d)["Version"] or ""

        for dist in importlib.metadata.distributions():
            eps = [ep for ep in dist.entry_points if ep.group == group]
            if not eps or (builtin_only and dist_name(dist) != BUILTIN_DISTRIBUTION):
                continue
            for ep in eps:
                if any(dist_name(d) == dist_name(dist) for _, d in by_name.get(ep.name, [])):
                    continue  # the same distribution seen twice on sys.path
                by_name.setdefault(ep.name, []).append((ep, dist))
        self.entry_point_names = set(by_name)
        for name in sorted(by_name):
            candidates = by_name[name]
            # a built-in keeps its name; an outsider using it is reported, never silently used
            candidates.sort(key=lambda pair: dist_name(pair[1]) != BUILTIN_DISTRIBUTION)
            ep, dist = candidates[0]
            info = PluginInfo(
                name=name,
                distribution=dist_name(dist),
                version=dist_version(dist),
                entry_point=ep.value,
                status="builtin" if dist_name(dist) == BUILTIN_DISTRIBUTION else "active",
            )
            for other_ep, other in candidates[1:]:
                clash = PluginInfo(
                    name=f"{name} ({dist_name(other)})",
                    distribution=dist_name(other),
                    version=dist_version(other),
                    entry_point=other_ep.value,
                )
                self._fail(
                    clash,
                    f"entry point name {name!r} is provided by both {info.distribution} {info.version} "
                    f"and {clash.distribution} {clash.version}; rename one (the second is not loaded)",
                    PluginConflictError,
                )
            if self.is_blocked(name):
                info.status = "disabled"
                self.infos[name] = info
                continue
            if self.get_plugin(name) is not None:
                self.infos[name] = info
                continue
            try:
                module = ep.load()
                self.register(module, name=name)
                self._plugin_distinfo.append((module, pluggy._manager.DistFacade(dist)))  # noqa: SLF001
            except Exception as exc:  # noqa: BLE001 - any import/registration failure is recorded
                if self.get_plugin(name) is not None:
                    self.unregister(name=name)
                self._fail(info, f"plugin {name!r} ({info.distribution} {info.version}) failed to load: "
                           f"{type(exc).__name__}: {exc}")
                continue
            self.infos[name] = info
        self._registry = None

    def register_plugin(self, plugin: object, name: str, *, distribution: str = "", version: str = "") -> str:
        """Register an in-process plugin object (programmatic predictor assembly, tests)."""
        registered = self.register(plugin, name=name)
        if registered is None:
            raise PluginError(f"plugin {name!r} is disabled")
        self.infos[name] = PluginInfo(name=name, distribution=distribution, version=version,
                                      entry_point=getattr(plugin, "__name__", type(plugin).__name__))
        self._registry = None
        return registered

    def unregister(self, plugin=None, name=None):  # noqa: D401 - pluggy signature
        out = super().unregister(plugin=plugin, name=name)
        if name is not None:
            self.infos.pop(name, None)
        self._registry = None
        return out

    # ------------------------------------------------------------------ provenance
    def hook_results(self, hook_name: str, plugins: Callable[[object], bool] | None = None,
                     **kwargs) -> list[tuple[str, object]]:
        """Call every implementation of a registry hook (of the plugin objects `plugins` accepts,
        when given), yielding (plugin name, result) pairs.

        A raising implementation marks its plugin failed (strict mode: raises) and its results
        are dropped; other plugins are unaffected.
        """
        out = []
        for impl in reversed(getattr(self.hook, hook_name).get_hookimpls()):
            if impl.hookwrapper or impl.wrapper or (plugins is not None and not plugins(impl.plugin)):
                continue
            name = impl.plugin_name
            try:
                res = impl.function(**{a: kwargs[a] for a in impl.argnames})
                res = list(res) if res is not None else []
            except Exception as exc:  # noqa: BLE001
                info = self.infos.setdefault(name, PluginInfo(name=name))
                self._fail(info, f"plugin {name!r} raised in {hook_name}: {type(exc).__name__}: {exc}", PluginError)
                continue
            out.append((name, res))
        return out

    # ------------------------------------------------------------------ registry
    @property
    def registry(self) -> Registry:
        if self._registry is None:
            from .registry import Registry

            self._registry = Registry.collect(self)
        return self._registry

    def plugin_hooks(self, name: str) -> list[str]:
        plugin = self.get_plugin(name)
        if plugin is None:
            return []
        hooks = []
        for caller in self.get_hookcallers(plugin) or []:
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin:
                    mark = "*" if (impl.wrapper or impl.hookwrapper) else "‡" if impl.trylast else "†" if impl.tryfirst else ""
                    hooks.append(caller.name.removeprefix("mofa_") + mark)
        return sorted(hooks)


RECORD_HOOKS: dict[str, tuple[str, type]] = {
    "hardware": ("mofa_register_hardware_profiles", HardwareProfile),
    "models": ("mofa_register_models", ModelSpec),
    "schedules": ("mofa_register_pipeline_schedules", PipelineSchedule),
    "overlaps": ("mofa_register_overlap_strategies", OverlapStrategy),
    "memory_optimizers": ("mofa_register_memory_optimizers", MemoryOptimizer),
    "transforms": ("mofa_register_cost_transforms", CostTransform),
    "policies": ("mofa_register_fault_recovery_policies", FaultRecoveryPolicy),
    "config_sections": ("mofa_register_config_sections", ConfigSection),
    "readers": ("mofa_register_measurement_readers", MeasurementReader),
    "flops_conventions": ("mofa_register_flops_conventions", FlopsConvention),
}

_default_pm: MofaPluginManager | None = None


def get_plugin_manager(*, disabled: Iterable[str] = (), strict: bool | None = None,
                       trace: bool | None = None, fresh: bool = False) -> MofaPluginManager:
    """The process-wide manager with every installed plugin loaded (cached unless `fresh`)."""
    global _default_pm
    disabled = tuple(disabled)
    if fresh or disabled or strict is not None or trace is not None or _default_pm is None:
        pm = MofaPluginManager(strict=strict, disabled=disabled, trace=trace)
        pm.load_entrypoints(builtin_only=_env_flag(ENV_NO_AUTOLOAD))
        pm.check_disabled(pm.entry_point_names)
        if fresh or disabled or strict is not None or trace is not None:
            return pm
        _default_pm = pm
    return _default_pm


__all__ = ["MofaPluginManager", "PluginInfo", "get_plugin_manager", "Feature", "RECORD_HOOKS"]
