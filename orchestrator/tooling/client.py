"""Call ``router`` or an ensemble through ``tritonclient`` (HTTP or gRPC).

Both take ``TEXT`` (BYTES [N, 1]) and ``THRESHOLD`` (FP32 [N, 1]) and answer
``PROBABILITIES`` (FP32 [N, C]) and ``VERDICTS`` (BOOL [N, C]); C = 1 for a binary head
(the positive label's probability), the number of labels for multiclass and multilabel
heads (``orchestrator.runtime.heads``). ``router`` also answers ``ROUTE`` (BYTES [N, 1]).
Each column's label comes from Triton's classification extension: ``PROBABILITIES`` is
asked with ``class_count`` = its columns and answers ``score:index:label`` strings, the
label from the model's ``label_filename`` (``score:index`` for a model without one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

DEFAULT_URLS = {"http": "127.0.0.1:8000", "grpc": "127.0.0.1:8001"}
#: ``class_count`` for an output whose columns the config leaves open (dims [-1]): Triton
#: returns at most the tensor's columns (seen in the embedded Triton 2.51).
ALL_CLASSES = 1 << 16


class ServerUnavailable(ConnectionError):
    """No Triton server answers at the URL (the message says how to start one)."""


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
    """``(columns, has_route)`` from the model's config: the columns of ``PROBABILITIES``
    (:data:`ALL_CLASSES` when they are variable, ``[-1]``) and whether it has ``ROUTE``."""
    config = client.get_model_config(model)
    if protocol == "http":
        outputs = [(o["name"], [int(d) for d in o.get("dims", [])]) for o in config.get("config", config)["output"]]
    else:
        outputs = [(o.name, list(o.dims)) for o in config.config.output]
    dims = dict(outputs).get("PROBABILITIES", [])
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
        parameters: KServe v2 request parameters.
        timeout_s: network timeout in seconds.

    Returns:
        one :class:`Prediction` per text, with every column's probability, verdict and label.

    Raises:
        ServerUnavailable: no server answers at ``url``.
        tritonclient.utils.InferenceServerException: the server answered with an error
            (its message names the input at fault).
    """
    tc = client_module(protocol)
    url = url or DEFAULT_URLS[protocol]
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
        unavailable = _unavailable(url, exc)
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
