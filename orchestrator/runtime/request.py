"""One request's input and answer: parsing and validating what a client sent.

Inputs (full shapes, batch first):
    TEXT       TYPE_STRING [N, 1]  UTF-8 texts
    THRESHOLD  FP32        [N, 1]  decision threshold per text, a probability in [0, 1]
Request parameters (KServe v2 ``parameters``): the ones the policy declares in
``request_parameters`` (``route`` in the shipped policy) and ``describe_policy``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Mapping, Optional, Sequence

import numpy as np

from orchestrator.runtime.errors import InputError
from orchestrator.runtime.validation import check_thresholds, decode_texts, parse_bool

# Request parameter that asks for the optional POLICY output (``orchestrator policy show``).
DESCRIBE_PARAMETER = "describe_policy"


@dataclass
class Work:
    """One request's validated input.

    Attributes:
        texts: N strings.
        thresholds: float32 [N], each in [0, 1].
        parameters: the request's parameters (``describe_policy`` removed).
        request_id: Triton's request id (may be empty).
        describe: the request asked for the POLICY output.
    """

    texts: List[str]
    thresholds: np.ndarray
    parameters: Mapping[str, object]
    request_id: str = ""
    describe: bool = False


@dataclass
class Result:
    """One request's answer: PROBABILITIES float32 [N, 1], VERDICTS bool [N, 1], ROUTE [N]."""

    probabilities: np.ndarray
    verdicts: np.ndarray
    routes: List[str]


def parse_request(
    texts_array: Optional[np.ndarray],
    thresholds_array: Optional[np.ndarray],
    parameters: Optional[Mapping[str, object]] = None,
    exposed: Optional[Mapping[str, Sequence[str]]] = None,
    request_id: str = "",
) -> Work:
    """Validate one request's ``TEXT``, ``THRESHOLD`` and the request parameters the policy
    exposes.

    Raises:
        InputError: a missing input, an empty batch, invalid UTF-8, a threshold that is not
            one finite probability per text, or an exposed request parameter with a value
            the policy does not offer.
    """
    if texts_array is None:
        raise InputError("TEXT: required input is missing")
    if thresholds_array is None:
        raise InputError("THRESHOLD: required input is missing")
    texts = decode_texts(texts_array, "TEXT")
    thresholds = check_thresholds(thresholds_array, len(texts), "THRESHOLD")
    parameters = dict(parameters or {})
    for name, allowed in (exposed or {}).items():
        if name in parameters and str(parameters[name]) not in allowed:
            raise InputError(
                f"parameter {name}={parameters[name]!r}: not a route this policy exposes (choose one of: {', '.join(allowed)})"
            )
    describe = parse_bool(parameters.pop(DESCRIBE_PARAMETER, False), DESCRIBE_PARAMETER)
    return Work(texts=texts, thresholds=thresholds, parameters=parameters, request_id=request_id, describe=describe)


def policy_path(model_dir: Path, params: Mapping[str, str]) -> Path:
    """The policy file named by the config parameter ``policy`` (default ``policy.yaml``),
    relative to the model directory.

    Raises:
        ValueError: the path leaves the model directory.
    """
    name = params.get("policy", "policy.yaml")
    path = (model_dir / name).resolve()
    if model_dir.resolve() not in path.parents:
        raise ValueError(f"router: parameter policy={name!r} points outside the model directory")
    return path
