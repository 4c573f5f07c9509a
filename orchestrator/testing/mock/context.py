"""Which server (and which of its models) the running code belongs to.

The real stub is one process per model instance, so ``pb_utils.load_model`` or a
``MetricFamily`` always reaches "its" server. In the mock every model shares one
interpreter: a context variable names the server and model while the mock runs model
code (``initialize``, ``execute``, ``finalize``), and code outside any model (a test)
gets the most recently opened MockTriton that is not closed.
"""

from __future__ import annotations

import contextvars
import threading
from typing import TYPE_CHECKING, Any, FrozenSet, List, NamedTuple, Optional

from orchestrator.testing.mock.releases import DEFAULT, PROFILES

if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.testing.mock.host import Host
    from orchestrator.testing.mock.instances import LoadedModel


class Ctx(NamedTuple):
    server: "Host"
    model: Optional["LoadedModel"]


CTX: contextvars.ContextVar[Optional[Ctx]] = contextvars.ContextVar(
    "mock_triton_ctx", default=None
)
_ACTIVE: List["Host"] = []
_ACTIVE_LOCK = threading.Lock()


def activate(server: "Host") -> None:
    """Make ``server`` the one code outside models reaches (until :func:`deactivate`)."""
    with _ACTIVE_LOCK:
        _ACTIVE.append(server)


def deactivate(server: "Host") -> None:
    with _ACTIVE_LOCK:
        if server in _ACTIVE:
            _ACTIVE.remove(server)


def current_server() -> "Host":
    """The server of the running model, else the newest open one.

    Raises RuntimeError when no MockTriton is open.
    """
    ctx = CTX.get()
    if ctx is not None:
        return ctx.server
    with _ACTIVE_LOCK:
        for server in reversed(_ACTIVE):
            if not server.closed:
                return server
    raise RuntimeError(
        "no MockTriton is active: create MockTriton(model_repository) before using "
        "triton_python_backend_utils server functions"
    )


def current_features() -> FrozenSet[str]:
    """The release features (``releases``) of the server the running code belongs to; the
    default release's when no MockTriton is open."""
    try:
        return current_server().features
    except RuntimeError:
        return PROFILES[DEFAULT]


def current_model() -> Optional["LoadedModel"]:
    """The model whose code is running, None outside model code."""
    ctx = CTX.get()
    return ctx.model if ctx is not None else None


class running:
    """``with running(server, model):`` marks the code inside as ``model``'s code."""

    def __init__(self, server: "Host", model: Optional["LoadedModel"]):
        self._ctx = Ctx(server, model)
        self._token: Any = None

    def __enter__(self) -> None:
        self._token = CTX.set(self._ctx)

    def __exit__(self, *exc: Any) -> None:
        CTX.reset(self._token)
