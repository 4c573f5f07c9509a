"""The runtime's errors: what a request, a policy file or a downstream model did wrong.

Each message names the culprit (the input and element, the policy key's location, the
model or node) so that it can be returned to the client or logged as it is.
"""

from __future__ import annotations


class InputError(ValueError):
    """A request's input is malformed; the message names the input and the fault.

    The Python-backend models turn it into a per-request ``INVALID_ARG`` error response.
    """


class LimitError(InputError):
    """A request over one of the policy's input ``limits``; ``limit`` names it
    (``max_text_bytes``, ``max_request_bytes`` or ``max_windows_per_text``)."""

    def __init__(self, message: str, limit: str):
        super().__init__(message)
        self.limit = limit


class PolicyError(ValueError):
    """An invalid routing policy; the message starts with the location of the bad key
    (``root.steps[1].stages[0].model``), prefixed by the file name when read from a file."""


class DownstreamError(RuntimeError):
    """A BLS call failed, a node timed out or a model is unavailable; the message names
    the model or node. The router turns it into an ``INTERNAL`` error response unless a
    ``fallback`` node answers instead.

    ``retryable`` is False when retrying the same call cannot help (the model's circuit
    is open, the model is in no repository, its stub is not healthy): the router then
    does not retry the requests one by one.
    """

    def __init__(self, message: str, *, retryable: bool = True):
        super().__init__(message)
        self.retryable = retryable


class RequestStopped(Exception):
    """A request the router stopped before its answer was complete; ``code`` names the
    ``pb_utils.TritonError`` code of its one error response."""

    code = "INTERNAL"


class RequestCancelled(RequestStopped):
    """The client cancelled the request (``request.is_cancelled()``) and a later stage was
    not run for it: answered with Triton's ``CANCELLED`` error (python_backend r24.10
    ``TritonError.CANCELLED``), the code Triton itself gives a request cancelled in its
    queue (core r24.10 ``DynamicBatchScheduler``)."""

    code = "CANCELLED"


class DeadlineExceeded(RequestStopped):
    """No stage answered the request before its deadline (its ``timeout``): answered with
    ``UNAVAILABLE``, the code of Triton's own queue timeout (core r24.10
    ``PolicyQueue``: "Request timeout expired")."""

    code = "UNAVAILABLE"
