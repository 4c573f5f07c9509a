"""One exception hierarchy for the tooling (CLI, server, env, bench, modeling).

Every error the tooling raises on purpose derives from :class:`ToolingError`, so a caller
(the CLI, a test, a user's script) can catch them all in one place; each module's own
subclass says where it came from. The runtime (``orchestrator.runtime``) has its own,
smaller set (``InputError``, ``PolicyError``, ``DownstreamError``): it must not import
the tooling.
"""

from __future__ import annotations


class ToolingError(RuntimeError):
    """Base of every error the tooling raises on purpose; the message says what to do."""


class ConfigError(ToolingError):
    """A Triton model configuration (``config.pbtxt``) is missing, unreadable or invalid
    against ``model_config.proto``; the message names the file and the location."""


class TuneError(ToolingError):
    """A policy tune cannot run (message says what and where)."""
