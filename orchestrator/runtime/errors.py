"""The runtime's errors: what a request, a policy file, a downstream model or the server's
control API did wrong. One tree: every error the runtime raises on purpose is an
:class:`OrchestratorError` with its Triton error code (:attr:`OrchestratorError.code`), and the
router turns any of them into an error response in one place (``router``); anything else
reaching the router is a bug, answered ``INTERNAL`` and logged.

Each message names the culprit (the input and element, the policy key's location, the
model or node) so that it can be returned to the client or logged as it is. Each error a
request can end with has one Triton error code (:attr:`InputError.code`,
:attr:`DownstreamError.code`), which the router answers with (``router``):

- :class:`InputError` (``INVALID_ARG``): the request is malformed or over a ``limits``
  bound;
- :class:`UnavailableError` (``UNAVAILABLE``): a model cannot serve now (:class:`Cause`);
- :class:`DownstreamError` (``INTERNAL``): a model failed or answered something the
  policy cannot use, or a node timed out;
- :class:`Overloaded` (``UNAVAILABLE``): the router's admission control refused the request
  before any model ran for it.

``UNAVAILABLE`` is the code gRPC clients (and Triton's own clients) treat as "try again
later"; ``INTERNAL`` is not.
"""

from __future__ import annotations

from enum import Enum
from typing import ClassVar


class OrchestratorError(Exception):
    """The root of the runtime's errors; ``code`` is the ``pb_utils.TritonError`` code name a
    request ending with it is answered with."""

    #: The Triton error code (``pb_utils.TritonError`` constant name) of the response.
    code: ClassVar[str] = "INTERNAL"


class InputError(OrchestratorError, ValueError):
    """A request's input is malformed; the message names the input and the fault.

    The Python-backend models turn it into a per-request ``INVALID_ARG`` error response.
    """

    #: The Triton error code (``pb_utils.TritonError`` constant name) of the response.
    code: ClassVar[str] = "INVALID_ARG"


class LimitError(InputError):
    """A request over one of the policy's input ``limits``; ``limit`` names it
    (``max_text_bytes``, ``max_request_bytes`` or ``max_windows_per_text``)."""

    def __init__(self, message: str, limit: str):
        super().__init__(message)
        self.limit = limit


class PolicyError(OrchestratorError, ValueError):
    """An invalid routing policy; the message starts with the location of the bad key
    (``root.steps[1].stages[0].model``), prefixed by the file name when read from a file."""


class TokenizerFilesError(OrchestratorError, ValueError):
    """A tokenizer directory cannot be served (``orchestrator.runtime.execution.tokenize``): a file is
    missing or malformed, or a setting is not one ``transformers`` accepts; the message
    names the file. Raised at load, where it fails the model's ``initialize``."""


class DownstreamError(OrchestratorError, RuntimeError):
    """A BLS call failed, a model answered something the policy cannot use, or a node
    timed out; the message names the model or node. The router turns it into an
    ``INTERNAL`` error response unless a ``fallback`` node answers instead.
    """

    #: The Triton error code (``pb_utils.TritonError`` constant name) of the response.
    code: ClassVar[str] = "INTERNAL"


class Cause(Enum):
    """Why a model cannot serve (:class:`UnavailableError`)."""

    #: Its Python-backend stub process exited or hangs (python_backend's
    #: ``Stub process '<instance>' is not healthy.``, or ``stubs.StubWatch`` saw it exit).
    STUB_DEAD = "stub_dead"
    #: The server reports it not ready, unloaded or unknown.
    NOT_READY = "not_ready"
    #: Its circuit is open (``downstream.CircuitBreaker``): it failed just now.
    CIRCUIT_OPEN = "circuit_open"
    #: An on-demand load failed, or on-demand loading is unavailable (``ondemand``).
    NOT_LOADED = "not_loaded"


class UnavailableError(DownstreamError):
    """A model cannot serve now (``cause``); retrying the same call at once cannot help.

    Raised by ``downstream.CircuitBreaker`` (open circuit, dead stub, an error text that says
    the model is not ready), ``downstream.Downstream`` and ``ondemand.ModelManager`` (a
    failed load). The router answers ``UNAVAILABLE`` (clients may retry later) unless a
    ``fallback`` node answers instead; the router's per-request retries after a failed
    batch do not call such a model again (its circuit is open, or its load is in
    back-off).
    """

    code: ClassVar[str] = "UNAVAILABLE"

    def __init__(self, message: str, cause: Cause):
        super().__init__(message)
        self.cause = cause


class ControlError(OrchestratorError, RuntimeError):
    """A load, unload or config request to the server's repository API failed; the
    message is the server's (``control.RepositoryControl``).

    Attributes:
        refused: True when the server refused the request for want of the restricted
            API's key (HTTP 403, gRPC "This protocol is restricted"), not because the
            model failed.
    """

    def __init__(self, message: str, refused: bool = False):
        super().__init__(message)
        self.refused = refused


class RequestStopped(OrchestratorError):
    """A request the router stopped before its answer was complete; ``code`` names the
    ``pb_utils.TritonError`` code of its one error response."""

    code: ClassVar[str] = "INTERNAL"


class RequestCancelled(RequestStopped):
    """The client cancelled the request (``request.is_cancelled()``) and a later stage was
    not run for it: answered with Triton's ``CANCELLED`` error (python_backend r24.10
    ``TritonError.CANCELLED``), the code Triton itself gives a request cancelled in its
    queue (core r24.10 ``DynamicBatchScheduler``)."""

    code: ClassVar[str] = "CANCELLED"


class DeadlineExceeded(RequestStopped):
    """No stage answered the request before its deadline (its ``timeout``): answered with
    ``UNAVAILABLE``, the code of Triton's own queue timeout (core r24.10
    ``PolicyQueue``: "Request timeout expired")."""

    code: ClassVar[str] = "UNAVAILABLE"


class Overloaded(RequestStopped):
    """The router refused the request before any model ran for it: it would have waited
    past the policy's ``admission.max_wait_ms`` (``admission``). Answered with
    ``UNAVAILABLE``, the code of Triton's own queue refusals (core r24.10 ``PolicyQueue``:
    "Exceeds maximum queue size"): retryable."""

    code: ClassVar[str] = "UNAVAILABLE"
