"""Sending soak requests to the router over HTTP and gRPC (``tritonclient``).

Each client thread owns one client of its protocol. HTTP requests use binary tensors
(``tritonclient.http``'s default) and block; gRPC requests use ``async_infer`` so every
response arrives through a callback that the ledger counts (a second response to one
request would be seen). Both send the request id and check the id the response carries.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

MODEL = "router"


def _module(protocol: str):
    if protocol == "http":
        import tritonclient.http as module
    else:
        import tritonclient.grpc as module
    return module


def make_inputs(protocol: str, texts: Sequence[bytes], thresholds: Sequence[float]) -> list:
    """``TEXT`` BYTES [N, 1] and ``THRESHOLD`` FP32 [N, 1] inputs for ``protocol``."""
    module = _module(protocol)
    text = np.empty((len(texts), 1), dtype=np.object_)
    text[:, 0] = list(texts)
    thr = np.asarray(thresholds, dtype=np.float32).reshape(-1, 1)
    inputs = [module.InferInput("TEXT", list(text.shape), "BYTES"), module.InferInput("THRESHOLD", list(thr.shape), "FP32")]
    inputs[0].set_data_from_numpy(text)
    inputs[1].set_data_from_numpy(thr)
    return inputs


def decode_routes(array) -> List[str]:
    return [r.decode("utf-8", "replace") if isinstance(r, bytes) else str(r) for r in np.asarray(array).reshape(-1)]


def result_fields(protocol: str, result) -> Tuple[Optional[str], np.ndarray, np.ndarray, List[str]]:
    """``(response id, PROBABILITIES, VERDICTS, ROUTE strings)`` of a tritonclient result;
    a missing output gives an empty array (the check then reports the shape)."""
    response = result.get_response()
    carried = response.get("id") if protocol == "http" else (response.id or None)

    def get(name):
        value = result.as_numpy(name)
        return np.zeros((0,)) if value is None else value

    return carried, get("PROBABILITIES"), get("VERDICTS"), decode_routes(get("ROUTE"))


class Client:
    """One protocol's client with a per-request timeout of ``timeout_s`` seconds.

    :meth:`send` sends one request and calls exactly one of ``on_result(result, t)``,
    ``on_error(status, message, t)`` (an error response) or
    ``on_lost(reason)`` (no response in time; the client is rebuilt after a transport
    error). For gRPC, a later callback for the same request still reaches
    ``on_result``/``on_error`` (so the ledger can count it).
    """

    def __init__(self, protocol: str, url: str, timeout_s: float) -> None:
        self.protocol, self.url, self.timeout_s = protocol, url, timeout_s
        self._client = None

    def _connect(self):
        module = _module(self.protocol)
        if self.protocol == "http":
            return module.InferenceServerClient(self.url, connection_timeout=self.timeout_s, network_timeout=self.timeout_s)
        return module.InferenceServerClient(self.url)

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
            self._client = None

    def send(self, request_id: str, inputs: list, parameters: Optional[dict], on_result: Callable,
             on_error: Callable, on_lost: Callable) -> None:
        from tritonclient.utils import InferenceServerException

        if self._client is None:
            self._client = self._connect()
        if self.protocol == "grpc":
            self._send_grpc(request_id, inputs, parameters, on_result, on_error, on_lost)
            return
        try:
            result = self._client.infer(MODEL, inputs, request_id=request_id, parameters=parameters)
        except InferenceServerException as exc:
            now = time.monotonic()
            status = str(exc.status())
            if status in ("None", "") and "timed out" in str(exc.message()).lower():
                self.close()
                on_lost(f"client: {exc.message()}")
            else:
                on_error(status, str(exc.message()), now)
            return
        except BaseException as exc:  # geventhttpclient: socket.timeout, gevent Timeout (a BaseException)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            self.close()
            on_lost(f"client: {type(exc).__name__}: {exc}")
            return
        on_result(result, time.monotonic())

    def _send_grpc(self, request_id, inputs, parameters, on_result, on_error, on_lost) -> None:
        done = threading.Event()

        def callback(result, error):
            now = time.monotonic()
            try:
                if error is None:
                    on_result(result, now)
                elif "DEADLINE_EXCEEDED" in str(error.status()) and not done.is_set():
                    on_lost(f"client: gRPC deadline of {self.timeout_s:g} s exceeded")
                else:
                    on_error(str(error.status()), str(error.message()), now)
            finally:
                done.set()

        self._client.async_infer(
            MODEL, inputs, callback, request_id=request_id, parameters=parameters, client_timeout=self.timeout_s
        )
        # the deadline callback comes at timeout_s; a little more for a busy machine
        if not done.wait(self.timeout_s + 10.0):
            on_lost(f"client: no gRPC callback within {self.timeout_s + 10:g} s")
            self.close()
