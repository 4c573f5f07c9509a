"""Call ``router`` or ``ensemble`` through ``tritonclient`` (HTTP or gRPC).

Both models take ``TEXT`` (BYTES [N, 1]) and ``THRESHOLD`` (FP32 [N, 1]) and answer
``PROBABILITIES`` (FP32 [N, 1]) and ``VERDICTS`` (BOOL [N, 1]); ``router`` also answers
``ROUTE`` (BYTES [N, 1]).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

DEFAULT_URLS = {"http": "127.0.0.1:8000", "grpc": "127.0.0.1:8001"}


@dataclass(frozen=True)
class Prediction:
    """One text's answer: ``probability`` of the positive class in [0, 1], ``verdict``
    (probability >= threshold) and ``route`` (the router's branch; ``None`` for a model
    without a ``ROUTE`` output such as ``ensemble``)."""

    text: str
    probability: float
    verdict: bool
    route: Optional[str]


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


def classify(
    texts: Sequence[str],
    model: str = "router",
    url: Optional[str] = None,
    protocol: str = "http",
    threshold: float = 0.5,
    parameters: Optional[dict] = None,
    timeout_s: float = 60.0,
) -> List[Prediction]:
    """Classify ``texts`` with one inference request.

    Args:
        texts: one or more texts (sent as UTF-8 BYTES, shape [N, 1]).
        model: ``router`` or ``ensemble`` (or any model with the same contract).
        url: ``host:port`` of the server; default 127.0.0.1:8000 (HTTP) or :8001 (gRPC).
        protocol: ``http`` or ``grpc``.
        threshold: decision threshold, a probability in [0, 1], sent once per text.
        parameters: KServe v2 request parameters.
        timeout_s: network timeout in seconds.

    Raises:
        tritonclient.utils.InferenceServerException: the server answered with an error
            (its message names the input at fault) or could not be reached.
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
        result = client.infer(model, inputs, **kwargs)
    finally:
        client.close()
    probs = result.as_numpy("PROBABILITIES").reshape(len(texts), -1)[:, 0]
    verdicts = result.as_numpy("VERDICTS").reshape(len(texts), -1)[:, 0]
    route_array = result.as_numpy("ROUTE")  # None for a model without ROUTE (ensemble)
    routes = [None] * len(texts) if route_array is None else list(route_array.reshape(-1))
    return [
        Prediction(text, float(p), bool(v), r.decode("utf-8") if isinstance(r, bytes) else r)
        for text, p, v, r in zip(texts, probs, verdicts, routes)
    ]


def format_prediction(pred: Prediction, labels=("negative", "positive"), width: int = 70) -> str:
    """One line: verdict label, probability, route, and the text (shortened to ``width``)."""
    text = " ".join(pred.text.split())
    if len(text) > width:
        text = text[: width - 3] + "..."
    label = labels[1] if pred.verdict else labels[0]
    return f"{label:<9} {pred.probability:.4f}  {pred.route or '-':<24} {text!r}"
