"""Decoupled models (``model_transaction_policy { decoupled: true }``) as python_backend
r24.10 runs them: any number of responses per request through the request's response
sender, the last one flagged ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``.

A request to a decoupled model gets a :class:`ResponseStream`: the responses in the
order they were sent, each an :class:`Item` (an ``Ok``/``Err`` result, or None for a
flag-only final "empty" response) with its final flag. Clients read it whole
(:meth:`MockTriton.infer_stream`, like a gRPC stream with
``enable_empty_final_response``); BLS ``exec(decoupled=True)`` reads it lazily through
:class:`ResponseIterator`, as the stub's ``ResponseIterator`` does (r24.10
``pb_response_iterator.cc``: the final response is yielded too, an empty one without
output tensors; iterating again after the end starts from the first response).

Triton waits for ever for a final flag that never comes; the mock gives up after
``response_timeout`` seconds without a new response and ends the stream with an error
that says so.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import traceback
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Deque, List, NamedTuple, Optional

from orchestrator.testing.mock.errors import ErrorCode, format_exception
from orchestrator.testing.mock.logger import LOGGER_NAME
from orchestrator.testing.mock.records import BatchFailure, Err, Req, Result
from orchestrator.testing.mock.requests import FINAL, InferenceRequest, InferenceResponse

if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.testing.mock.host import Host
    from orchestrator.testing.mock.instances import LoadedModel

_LOG = logging.getLogger(LOGGER_NAME)


class Item(NamedTuple):
    """One response of a stream: ``result`` None for a flag-only (empty) final response."""

    result: Optional[Result]
    final: bool


class ResponseStream:
    """The responses of one request, thread-safe; producers :meth:`put`, one consumer
    :meth:`get`s them in order."""

    def __init__(self, model: str, timeout: float):
        self.model = model
        self.timeout = timeout
        self._items: Deque[Item] = deque()
        self._cond = threading.Condition()
        self._finished = False  # a final item was put (nothing is accepted after it)

    @classmethod
    def of(cls, model: str, result: Result, final: bool = True) -> "ResponseStream":
        """A finished stream holding one ``result`` (a non-decoupled answer); ``final``
        False: the response was sent without TRITONSERVER_RESPONSE_COMPLETE_FINAL (the
        flag came alone, or with an error response, and a gRPC stream shows neither)."""
        stream = cls(model, 0.0)
        stream.put(result, final)
        stream._finished = True
        return stream

    def put(self, result: Optional[Result], final: bool) -> None:
        with self._cond:
            if self._finished:  # pragma: no cover - the sender refuses this first
                return
            self._items.append(Item(result, final))
            self._finished = final
            self._cond.notify_all()

    def get(self) -> Item:
        """The next response, waiting up to ``timeout`` seconds for it; after that a final
        mock-only error (Triton would keep the request open)."""
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._items), timeout=self.timeout):
                self._finished = True
                return Item(Err(
                    f"mock_triton: decoupled model '{self.model}' sent no response for "
                    f"{self.timeout}s and never sent TRITONSERVER_RESPONSE_COMPLETE_FINAL "
                    "(real Triton keeps the request open; raise MockTriton(response_timeout=...) "
                    "for slower models)",
                    ErrorCode.INTERNAL, "exec",
                ), True)
            return self._items.popleft()

    def drain(self) -> List[Item]:
        """Every response up to and including the final one."""
        out = []
        while True:
            with self._cond:
                if self._finished and not self._items:
                    return out
            item = self.get()
            out.append(item)
            if item.final:
                return out


class ResponseIterator:
    """What ``exec(decoupled=True)`` returns: the responses of a BLS request, as
    ``pb_utils.InferenceResponse`` objects, read as they arrive.

    ``convert`` turns an :class:`Item` into the response the stub hands out (an empty one
    for a flag-only final). As the stub's iterator, a second ``iter()`` after the last
    response starts again from the first; one in the middle resumes.
    """

    def __init__(self, first: Any, first_final: bool, next_item: Callable[[], Any]):
        self._responses: List[Any] = [first]
        self._finished = first_final
        self._next_item = next_item  # () -> (InferenceResponse, final)
        self._idx = 0

    def __iter__(self) -> "ResponseIterator":
        if self._finished and self._idx >= len(self._responses):
            self._idx = 0
        return self

    def __next__(self) -> Any:
        if self._idx < len(self._responses):
            self._idx += 1
            return self._responses[self._idx - 1]
        if self._finished:
            raise StopIteration
        response, final = self._next_item()
        self._responses.append(response)
        self._finished = final
        self._idx += 1
        return response


def log_background_failure(future: "concurrent.futures.Future[Any]") -> None:
    """Done callback of a decoupled model's ``async def execute`` left running: its
    exception is only logged, with its traceback (stub ``BackgroundFutureDone``); the
    requests it did not finish stay open."""
    if future.cancelled():
        return
    exc = future.exception()
    if exc is not None:
        _LOG.error("%s", "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


def run_decoupled(
    server: "Host",
    model: "LoadedModel",
    reqs: List[Req],
    call_execute: Callable[..., Any],
    finish: Callable[["LoadedModel", Req, InferenceResponse, bool], Result],
) -> List[ResponseStream]:
    """``execute`` of a decoupled model on ``reqs`` (the caller holds the instance), as
    the r24.10 stub runs it; one stream per request, filled by its response sender.

    ``call_execute(model, requests, background=True)``: the model's ``execute`` (an
    ``async`` one is left running on the model's loop, as the stub does, so the instance
    takes the next batch at once). ``finish(model, req, response, strict)``: a sent
    response pruned to the requested outputs (and checked). When ``execute`` raises or
    returns anything but None (``Python model '<instance>' is using the decoupled mode
    and the execute function must return None.``), every request without its final
    response gets the error ``Failed to process the request(s) for model '<instance>',
    message: ...`` as its final response (what it was sent before stays), and every
    sender is closed.
    """
    streams = [ResponseStream(model.name, server.response_timeout) for _ in reqs]

    def sink_for(req: Req, stream: ResponseStream) -> Callable[[Optional[InferenceResponse], int], None]:
        def sink(response: Optional[InferenceResponse], flags: int) -> None:
            final = flags == FINAL
            if response is None:
                stream.put(None, final)
            elif response.has_error():
                error = response.error()
                assert error is not None
                stream.put(Err(error.message(), error.code(), "exec"), final)
            else:
                stream.put(finish(model, req, response, server.strict_outputs), final)
        return sink

    requests = [InferenceRequest._for_execute(model, r, sink_for(r, st)) for r, st in zip(reqs, streams)]
    try:
        returned = call_execute(model, requests, background=True)
        if returned is not None:
            raise BatchFailure(
                f"Python model '{model.instance_name}' is using the decoupled mode and the "
                "execute function must return None."
            )
    except BatchFailure as failure:
        _fail(model, requests, streams, failure.message)
    except Exception as exc:
        _fail(model, requests, streams, format_exception(exc))
    return streams


def _fail(model: "LoadedModel", requests: List[InferenceRequest], streams: List[ResponseStream],
          message: str) -> None:
    text = f"Failed to process the request(s) for model '{model.instance_name}', message: {message}"
    _LOG.error("%s", text)  # Triton logs it as an error (pb_stub.cc)
    for request, stream in zip(requests, streams):
        if request._sender._close():  # still open: the backend answers it with the error
            stream.put(Err(text, ErrorCode.INTERNAL, "exec"), True)
