"""The error taxonomy. Every user-facing error is one line the CLI prints with exit status 2."""

from __future__ import annotations


class MofaError(Exception):
    """Base class: a problem the user can fix; the CLI prints `error: <message>` and exits 2."""


class ConfigError(MofaError):
    """A job file, flag or option is malformed; the message names the key's path and the fix."""


class UnknownRecordError(ConfigError):
    """A name (model, GPU, schedule, feature, policy) that no installed plugin registers."""


class PluginError(MofaError):
    """A plugin misbehaved; the message names the plugin."""


class PluginLoadError(PluginError):
    """An entry point failed to import or register (fatal only in strict mode)."""


class PluginConflictError(PluginError):
    """Two plugins registered the same entry-point or record name; names both distributions."""


class PluginResultError(PluginError):
    """A plugin returned something that breaks its hook's contract (shape, NaN, negative time)."""
