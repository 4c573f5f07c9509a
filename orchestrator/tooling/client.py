"""Call ``router`` or an ensemble through ``tritonclient`` (HTTP or gRPC).

Both take ``TEXT`` (BYTES [N, 1]) and ``THRESHOLD`` (FP32 [N, 1]) and answer
``PROBABILITIES`` (FP32 [N, C]) and ``VERDICTS`` (BOOL [N, C]); C = 1 for a binary head
(the positive label's probability), the number of labels for multiclass and multilabel
heads (``orchestrator.runtime.routing.heads``). ``router`` also answers ``ROUTE`` (BYTES [N, 1]).
Each column's label comes from Triton's classification extension: ``PROBABILITIES`` is
asked with ``class_count`` = its columns and answers ``score:index:label`` strings, the
label from the model's ``label_filename`` (``score:index`` for a model without one).

Where the server is: ``orchestrator serve`` records its URLs in ``.cache/serve.json``
(:func:`serve_record_path`) while it runs; without ``--url`` the client uses them, else
Triton's standard ports. A service on the port that is not Triton is named as such
(:func:`not_triton`), instead of a parse error.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

DEFAULT_URLS = {"http": "127.0.0.1:8000", "grpc": "127.0.0.1:8001"}
#: ``class_count`` for an output whose columns the config leaves open (dims [-1]): Triton
#: returns at most the tensor's columns (seen in the embedded Triton 2.51).
ALL_CLASSES = 1 << 16


class ServerUnavailable(ConnectionError):
    """No Triton server answers at the URL (the message says how to start one)."""


def serve_record_path() -> Path:
    """``.cache/serve.json`` beside the embedded server's cache (``$ORCHESTRATOR_CACHE_DIR/..``)."""
    from orchestrator.tooling.embedded import default_cache_dir

    return default_cache_dir().parent / "serve.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def write_serve_record(urls: Dict[str, str], pid: int, path: Optional[Path] = None) -> Path:
    """Record where ``orchestrator serve`` (process ``pid``) listens: ``{"pid", "http", "grpc", "metrics"}``."""
    path = path or serve_record_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": pid, **urls}, indent=2) + "\n")
    return path


def remove_serve_record(pid: int, path: Optional[Path] = None) -> None:
    """Remove the record if it is still process ``pid``'s (another serve may have replaced it)."""
    path = path or serve_record_path()
    record = read_serve_record(path, check_alive=False)
    if record is not None and record.get("pid") == pid:
        path.unlink(missing_ok=True)


def read_serve_record(path: Optional[Path] = None, check_alive: bool = True) -> Optional[dict]:
    """The record of a running ``orchestrator serve``, or None (none, unreadable, or its process gone)."""
    path = path or serve_record_path()
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
        return None
    if check_alive and not _alive(record["pid"]):
        return None
    return record


def default_url(protocol: str, path: Optional[Path] = None) -> str:
    """The running ``orchestrator serve``'s URL for ``protocol`` (its record), else Triton's standard port."""
    record = read_serve_record(path)
    if record and isinstance(record.get(protocol), str):
        return record[protocol]
    return DEFAULT_URLS[protocol]


def not_triton(url: str, timeout_s: float = 5.0) -> Optional[ServerUnavailable]:
    """A :class:`ServerUnavailable` naming what answers at ``url`` when it is not a Triton
    (KServe v2) server: ``GET /v2`` must answer JSON with a ``name`` and ``extensions``.
    None when it is one, or when nothing answers (the caller's error says that)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{url}/v2", timeout=timeout_s) as resp:
            status, ctype, body = resp.status, resp.headers.get("Content-Type", ""), resp.read(400)
    except urllib.error.HTTPError as exc:
        status, ctype, body = exc.code, exc.headers.get("Content-Type", "") if exc.headers else "", exc.read(400)
    except (OSError, ValueError):
        return None
    try:
        doc = json.loads(body)
        if isinstance(doc, dict) and "name" in doc and "extensions" in doc:
            return None
    except ValueError:
        pass
    shown = " ".join(body.decode("utf-8", "replace").split())[:80]
    record = read_serve_record()
    hint = (f"`orchestrator serve` is listening at {record['http']} (.cache/serve.json): drop --url or pass that one"
            if record and record.get("http") and record.get("http") != url else
            "start one with `orchestrator serve` (it picks free ports when 8000-8002 are taken) or pass its --url")
    return ServerUnavailable(f"the service at {url} is not a Triton server (GET /v2 answered HTTP {status}, "
                             f"{ctype or 'no content type'}: {shown!r}); {hint}")


@dataclass(frozen=True)
class Prediction:
    """One text's answer.

    Attributes:
        text: the text sent.
        probability: the probability of the first column (binary heads: of the positive
            label), in [0, 1]; see ``probabilities`` for every column.
        verdict: whether any column's verdict is true (binary heads: probability >=
            threshold; multiclass: the top label reached the threshold).
        route: the router's branch; ``None`` for a model without a ``ROUTE`` output.
        probabilities: per column, in column order.
        verdicts: per column.
        labels: per column: the model's label, or the column index as text when the model
            has no label file.
    """

    text: str
    probability: float
    verdict: bool
    route: Optional[str]
    probabilities: Tuple[float, ...] = ()
    verdicts: Tuple[bool, ...] = ()
    labels: Tuple[str, ...] = ()


def client_module(protocol: str):
    """``tritonclient.http`` or ``tritonclient.grpc`` for ``protocol`` (``http``/``grpc``).
    Raises ValueError for another protocol."""
    if protocol == "http":
        import tritonclient.http as module
    elif protocol == "grpc":
        import tritonclient.grpc as module
    else:
        raise ValueError(f"protocol must be 'http' or 'grpc', got {protocol!r}")
    return module


def text_inputs(tc, texts: Sequence[str], threshold: float = 0.5) -> list:
    """The ``TEXT`` (BYTES [N, 1], UTF-8) and ``THRESHOLD`` (FP32 [N, 1], ``threshold`` per
    text) inputs of ``router``/``ensemble`` for client module ``tc`` (:func:`client_module`)."""
    data = np.array([t.encode("utf-8") for t in texts], dtype=np.object_).reshape(-1, 1)
    thresholds = np.full((len(texts), 1), threshold, dtype=np.float32)
    inputs = [tc.InferInput("TEXT", list(data.shape), "BYTES"), tc.InferInput("THRESHOLD", list(thresholds.shape), "FP32")]
    inputs[0].set_data_from_numpy(data)
    inputs[1].set_data_from_numpy(thresholds)
    return inputs


def model_outputs(client, model: str, protocol: str) -> Tuple[int, bool]:
    """``(columns, has_route)`` from the model's metadata (KServe v2; not the model config,
    which the image's entrypoint restricts to the admin key): the columns of
    ``PROBABILITIES`` (:data:`ALL_CLASSES` when they are variable, ``[-1]``) and whether it
    has ``ROUTE``. Shapes include the batch dimension, ``[-1, C]``."""
    meta = client.get_model_metadata(model)
    if protocol == "http":
        outputs = [(o["name"], [int(d) for d in o.get("shape", [])]) for o in meta["outputs"]]
    else:
        outputs = [(o.name, [int(d) for d in o.shape]) for o in meta.outputs]
    shape = dict(outputs).get("PROBABILITIES", [])
    dims = shape[1:] if len(shape) == 2 else shape
    columns = dims[0] if len(dims) == 1 and dims[0] > 0 else ALL_CLASSES
    return columns, "ROUTE" in dict(outputs)


def parse_classes(row: Sequence, columns: int) -> Tuple[Tuple[float, ...], Tuple[str, ...]]:
    """Probabilities and labels in column order from one row of classification strings
    ``score:index[:label]`` (bytes or str); a missing label is the index."""
    probs, labels = [0.0] * columns, [str(i) for i in range(columns)]
    for item in row:
        parts = (item.decode("utf-8") if isinstance(item, bytes) else str(item)).split(":", 2)
        index = int(parts[1])
        probs[index] = float(parts[0])
        if len(parts) == 3:
            labels[index] = parts[2]
    return tuple(probs), tuple(labels)


_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")


def request_parameter(text: str) -> Tuple[str, object]:
    """``KEY=VALUE`` (``orchestrator classify --param``) as ``(key, value)``: the value as a
    bool (``true``/``false``, any case), an int or a float when it reads as one, else the
    string. Raises ``argparse.ArgumentTypeError`` without ``=`` or with an empty key."""
    import argparse

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE, e.g. route=fast")
    if value.lower() in ("true", "false"):
        return key, value.lower() == "true"
    if _INT.fullmatch(value):
        return key, int(value)
    if _FLOAT.fullmatch(value):
        return key, float(value)
    return key, value


def _unavailable(url: str, exc: BaseException) -> Optional[ServerUnavailable]:
    """A :class:`ServerUnavailable` when ``exc`` says no server listens at ``url``."""
    from tritonclient.utils import InferenceServerException

    if isinstance(exc, ConnectionRefusedError):
        reason = "connection refused"
    elif isinstance(exc, OSError):
        reason = exc.strerror or type(exc).__name__
    elif isinstance(exc, InferenceServerException) and "UNAVAILABLE" in str(exc.status()):
        reason = "connection refused or unreachable"
    else:
        return None
    return ServerUnavailable(f"no Triton server answers at {url} ({reason}); start one with `orchestrator serve`")


def classify(
    texts: Sequence[str],
    model: str = "router",
    url: Optional[str] = None,
    protocol: str = "http",
    threshold: float = 0.5,
    parameters: Optional[dict] = None,
    timeout_s: float = 60.0,
) -> List[Prediction]:
    """Classify ``texts`` with one inference request (and one for the model's config).

    Args:
        texts: one or more texts (sent as UTF-8 BYTES, shape [N, 1]).
        model: ``router``, ``ensemble``, ``NAME_ensemble`` (or any model with the same contract).
        url: ``host:port`` of the server; default 127.0.0.1:8000 (HTTP) or :8001 (gRPC).
        protocol: ``http`` or ``grpc``.
        threshold: decision threshold, a probability in [0, 1], sent once per text.
        parameters: KServe v2 request parameters (name -> str, bool, int or float; see
            :func:`request_parameter`), e.g. ``{"route": "fast"}`` for the shipped router.
        timeout_s: network timeout in seconds.

    Returns:
        one :class:`Prediction` per text, with every column's probability, verdict and label.

    Raises:
        ServerUnavailable: no server answers at ``url``.
        tritonclient.utils.InferenceServerException: the server answered with an error
            (its message names the input at fault).
    """
    tc = client_module(protocol)
    url = url or default_url(protocol)
    inputs = text_inputs(tc, texts, threshold)
    if protocol == "http":
        client = tc.InferenceServerClient(url, connection_timeout=timeout_s, network_timeout=timeout_s)
    else:
        client = tc.InferenceServerClient(url)
    kwargs = {"parameters": parameters} if parameters else {}
    if protocol == "grpc":
        kwargs["client_timeout"] = timeout_s
    try:
        columns, has_route = model_outputs(client, model, protocol)
        outputs = [tc.InferRequestedOutput("PROBABILITIES", class_count=columns), tc.InferRequestedOutput("VERDICTS")]
        outputs += [tc.InferRequestedOutput("ROUTE")] if has_route else []
        result = client.infer(model, inputs, outputs=outputs, **kwargs)
    except Exception as exc:  # noqa: BLE001 (connection errors differ by protocol; others re-raised)
        unavailable = _unavailable(url, exc) or (not_triton(url) if protocol == "http" else None)
        if unavailable is None:
            raise
        raise unavailable from None
    finally:
        client.close()
    verdicts = result.as_numpy("VERDICTS").reshape(len(texts), -1)
    classes = result.as_numpy("PROBABILITIES").reshape(len(texts), -1)
    route_array = result.as_numpy("ROUTE")  # None for a model without ROUTE (ensemble)
    routes = [None] * len(texts) if route_array is None else list(route_array.reshape(-1))
    out = []
    for text, row, v, r in zip(texts, classes, verdicts, routes):
        probs, labels = parse_classes(row, verdicts.shape[1])
        out.append(Prediction(text, probs[0], bool(v.any()), r.decode("utf-8") if isinstance(r, bytes) else r,
                              probs, tuple(bool(x) for x in v), labels))
    return out


def format_prediction(pred: Prediction, width: int = 70) -> str:
    """One line: the verdict (binary: the positive label or ``not <label>``; otherwise the
    labels whose verdict is true, or ``none``), the probabilities with their labels, the
    route, and the text (shortened to ``width``)."""
    text = " ".join(pred.text.split())
    if len(text) > width:
        text = text[: width - 3] + "..."
    labels = pred.labels or ("positive",)
    if len(pred.probabilities) <= 1:
        verdict = labels[0] if pred.verdict else f"not {labels[0]}"
        scores = f"{pred.probability:.4f}"
    else:
        verdict = ",".join(lab for lab, v in zip(labels, pred.verdicts) if v) or "none"
        top = sorted(zip(pred.probabilities, labels), reverse=True)[:3]
        scores = " ".join(f"{lab}={p:.4f}" for p, lab in top)
    return f"{verdict:<16} {scores}  {pred.route or '-':<24} {text!r}"
