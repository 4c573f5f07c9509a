"""One request's input and answer: parsing and validating what a client sent, and the
input checks the tokenizer and postprocess models share with the router.

Every check raises :class:`InputError` whose message names the input (and the element
index where one element is at fault) and says what was wrong, so that the Python-backend
models can turn it into a per-request ``INVALID_ARG`` error instead of failing the batch.

Inputs (full shapes, batch first):
    TEXT       TYPE_STRING [N, 1]  UTF-8 texts
    THRESHOLD  FP32        [N, 1]  decision threshold per text, a probability in [0, 1];
                           [N, K]  or one per label (multiclass and multilabel heads)
Request parameters (KServe v2 ``parameters``): the ones the policy declares in
``request_parameters`` (``route`` in the shipped policy) and ``describe_policy``.
"""

from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set

import numpy as np
from numpy.typing import NDArray

from orchestrator.runtime.errors import InputError, LimitError
from orchestrator.runtime.execution.deadlines import RequestContext

__all__ = [
    "InputError", "decode_texts", "check_thresholds", "request_parameters", "parse_bool", "config_parameters",
    "Work", "Result", "Limits", "check_sizes", "check_parameters", "parse_request", "policy_path",
]

# Request parameter that asks for the optional POLICY output (``orchestrator policy show``).
DESCRIBE_PARAMETER = "describe_policy"
POLICY_OUTPUT = "POLICY"


@dataclass
class Work:
    """One request's validated input.

    Attributes:
        texts: N strings.
        thresholds: float32 [N, 1] or [N, C] (one per label), each in [0, 1].
        parameters: the request's parameters (``describe_policy`` removed).
        request_id: Triton's request id (may be empty).
        describe: the request asked for the POLICY output.
        context: its trace, deadline and cancellation (:class:`RequestContext`).
    """

    texts: List[str]
    thresholds: NDArray[Any]
    parameters: Mapping[str, object]
    request_id: str = ""
    describe: bool = False
    context: RequestContext = field(default_factory=RequestContext)


@dataclass
class Result:
    """One request's answer: PROBABILITIES float32 [N, C], VERDICTS bool [N, C], ROUTE [N]
    (C: the policy head's columns, ``heads.Head.columns``)."""

    probabilities: NDArray[Any]
    verdicts: NDArray[Any]
    routes: List[str]


@dataclass(frozen=True)
class Limits:
    """Input sizes the router accepts (the policy's ``limits`` block).

    A request over a limit gets INVALID_ARG naming the text, its size and the limit; the
    byte limits are checked before anything is decoded or tokenized, so rejected input
    costs no tokenizer or model time and leaves no memory behind.

    The field defaults below are the policy keys' defaults (``policy.LIMITS`` reads them;
    docs/reference/policy.md shows them with each key's meaning).

    Attributes:
        max_text_bytes: UTF-8 bytes per text (the demo corpus's longest text has 855 bytes).
        max_request_bytes: UTF-8 bytes of all texts of one request.
        max_windows_per_text: windows a ``chunk`` node may make of one text, which bounds a
            text's model time.
    """

    max_text_bytes: int = 65536
    max_request_bytes: int = 4 * 1024 * 1024
    max_windows_per_text: int = 256


def check_sizes(texts_array: NDArray[Any], limits: Limits, name: str = "TEXT") -> None:
    """Refuse texts over the byte limits before decoding them.

    Raises:
        InputError: a text over ``max_text_bytes`` (the first one, by index) or all texts
            together over ``max_request_bytes``.
    """
    total = 0
    for i, item in enumerate(np.asarray(texts_array).reshape(-1)):
        size = len(item) if isinstance(item, (bytes, bytearray, np.bytes_)) else len(str(item).encode("utf-8"))
        if size > limits.max_text_bytes:
            raise LimitError(
                f"{name}[{i}]: {size} bytes, over the limit of {limits.max_text_bytes} bytes per text (policy limits.max_text_bytes)",
                "max_text_bytes",
            )
        total += size
    if total > limits.max_request_bytes:
        raise LimitError(
            f"{name}: {total} bytes in all texts, over the limit of {limits.max_request_bytes} bytes per request "
            "(policy limits.max_request_bytes)",
            "max_request_bytes",
        )


def check_parameters(parameters: Mapping[str, object], exposed: Mapping[str, Sequence[str]], ignored: Sequence[str]) -> Dict[str, object]:
    """The request parameters the policy declares, validated; ``describe_policy`` and
    parameters matching an ``ignored`` pattern are dropped.

    Triton's own request parameters (``priority``, ``timeout``, ``sequence_id`` ...) never
    reach a model's ``parameters()``: Triton consumes them.

    Raises:
        InputError: a parameter the policy neither declares nor ignores, or a declared one
            with a value the policy does not offer.
    """
    accepted = {}
    for name, value in parameters.items():
        if name in exposed:
            if str(value) not in exposed[name]:
                raise InputError(
                    f"parameter {name}={value!r}: not a route this policy exposes (choose one of: {', '.join(exposed[name])})"
                )
            accepted[name] = value
        elif name != DESCRIBE_PARAMETER and not any(fnmatch.fnmatchcase(name, p) for p in ignored):
            known = ", ".join(sorted(set(exposed) | {DESCRIBE_PARAMETER}))
            raise InputError(f"parameter {name!r}: not a parameter of this router (it accepts: {known})")
    return accepted


def parse_request(
    texts_array: Optional[NDArray[Any]],
    thresholds_array: Optional[NDArray[Any]],
    parameters: Optional[Mapping[str, object]] = None,
    exposed: Optional[Mapping[str, Sequence[str]]] = None,
    request_id: str = "",
    limits: Optional[Limits] = None,
    ignored: Sequence[str] = (),
    explicit_outputs: Optional[Set[str]] = None,
    columns: int = 1,
) -> Work:
    """Validate one request: ``TEXT`` (sizes first), ``THRESHOLD``, request parameters and
    the outputs it asked for.

    Args:
        texts_array: TEXT, object [N, 1] of UTF-8 bytes (None: missing).
        thresholds_array: THRESHOLD, float32 [N, 1] (None: missing).
        parameters: the request's parameters.
        exposed: parameter name -> the values the policy offers (``request_parameters``).
        request_id: Triton's request id.
        limits: input size limits (default :class:`Limits`).
        ignored: ``fnmatch`` patterns of parameters to accept and ignore.
        explicit_outputs: the outputs the client named, when it named a subset (None: all).
        columns: the answer's columns (the policy head's); THRESHOLD may have one per column.

    Raises:
        InputError: a missing input, an empty batch, a text or request over a size limit,
            invalid UTF-8, a threshold that is not one finite probability per text, an
            unknown parameter or a value the policy does not offer, or the ``POLICY``
            output asked for without ``describe_policy``.
    """
    if texts_array is None:
        raise InputError("TEXT: required input is missing")
    if thresholds_array is None:
        raise InputError("THRESHOLD: required input is missing")
    check_sizes(texts_array, limits or Limits())
    texts = decode_texts(texts_array, "TEXT")
    thresholds = check_thresholds(thresholds_array, len(texts), "THRESHOLD", columns)
    parameters = dict(parameters or {})
    accepted = check_parameters(parameters, exposed or {}, ignored)
    describe = parse_bool(parameters.get(DESCRIBE_PARAMETER, False), DESCRIBE_PARAMETER)
    if explicit_outputs is not None and POLICY_OUTPUT in explicit_outputs and not describe:
        raise InputError(f"{POLICY_OUTPUT}: this output is only produced for requests with the parameter {DESCRIBE_PARAMETER}=true")
    return Work(texts=texts, thresholds=thresholds, parameters=accepted, request_id=request_id, describe=describe)


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


# ----------------------------------------------------------------------------- input checks


def decode_texts(array: NDArray[Any], name: str = "TEXT") -> List[str]:
    """Decode a TYPE_STRING tensor into one Python string per row.

    Args:
        array: the tensor as the Python backend delivers it: ``np.object_`` of ``bytes``
            (``str`` is accepted too), shape ``[N, 1]`` or ``[N]``.
        name: the input's name, used in error messages.

    Returns:
        ``N`` strings, row order kept.

    Raises:
        InputError: ``N == 0`` (empty batch), more than one element per row, or an
            element that is not valid UTF-8 (the message gives the row and byte offset).
    """
    arr = np.asarray(array)
    if arr.ndim == 0:
        raise InputError(f"{name}: expected shape [N, 1], got a scalar")
    if arr.shape[0] == 0:
        raise InputError(f"{name}: empty batch (shape {list(arr.shape)}); send at least one text")
    if arr.ndim > 2 or (arr.ndim == 2 and arr.shape[1] != 1):
        raise InputError(f"{name}: expected shape [N, 1] (one text per row), got {list(arr.shape)}")
    texts = []
    for i, item in enumerate(arr.reshape(-1)):
        if isinstance(item, (bytes, bytearray, np.bytes_)):
            try:
                texts.append(bytes(item).decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise InputError(
                    f"{name}[{i}]: invalid UTF-8 (byte 0x{item[exc.start]:02x} at offset {exc.start})"
                ) from None
        elif isinstance(item, str):
            texts.append(item)
        else:
            raise InputError(f"{name}[{i}]: expected a UTF-8 string, got {type(item).__name__}")
    return texts


def check_thresholds(array: NDArray[Any], count: int, name: str = "THRESHOLD", columns: int = 1) -> NDArray[Any]:
    """Validate the decision thresholds of ``count`` texts.

    Args:
        array: FP32 tensor of shape ``[count, 1]`` or ``[count]`` (one threshold per text)
            or, when ``columns`` > 1, ``[count, columns]`` (one per label of a multiclass or
            multilabel head, ``orchestrator.runtime.routing.heads``).
        count: the number of texts (rows of ``TEXT`` or ``logits``) in the same request.
        name: the input's name, used in error messages.
        columns: the answer's columns (labels); 1 for binary heads.

    Returns:
        float32 array of shape ``[count, 1]`` or ``[count, columns]``; each value is a
        probability in ``[0, 1]``.

    Raises:
        InputError: a shape other than those above, or an element that is NaN, infinite,
            negative or greater than 1 (a threshold is compared with a probability).
    """
    arr = np.asarray(array, dtype=np.float32)
    per_label = columns > 1 and arr.ndim == 2 and arr.shape == (count, columns)
    if not per_label and (arr.ndim == 0 or arr.shape[0] != count or arr.size != count):
        also = f" or [{count}, {columns}] (one per label)" if columns > 1 else ""
        raise InputError(f"{name}: expected shape [{count}, 1] (one threshold per text){also}, got {list(arr.shape)}")
    out = arr.reshape(count, -1)
    for i, value in enumerate(out.reshape(-1)):
        if not math.isfinite(float(value)) or value < 0.0 or value > 1.0:
            where = f"{name}[{i // out.shape[1]}]" if out.shape[1] == 1 else f"{name}[{i // out.shape[1]}, {i % out.shape[1]}]"
            raise InputError(f"{where} = {float(value)!r}: must be a finite probability in [0, 1]")
    return out


def request_parameters(raw: Any) -> Mapping[str, Any]:
    """Parse a request's KServe v2 ``parameters`` (a JSON object string in the Python backend).

    Raises:
        InputError: the string is not a JSON object.
    """
    if raw is None or raw == "":
        return {}
    if isinstance(raw, Mapping):
        return raw
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        raise InputError(f"parameters: not a JSON object: {raw!r}") from None
    if not isinstance(value, dict):
        raise InputError(f"parameters: expected a JSON object, got {type(value).__name__}")
    return value


def parse_bool(value: Any, name: str) -> bool:
    """Read a boolean request or config parameter given as bool, int or string.

    Raises:
        InputError: the value is not one of true/false/1/0/yes/no.
    """
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise InputError(f"parameter {name}: expected true or false, got {value!r}")


def config_parameters(model_config: Mapping[str, Any]) -> Dict[str, str]:
    """Flatten a model config's ``parameters { key, value { string_value } }`` into str -> str."""
    params = model_config.get("parameters") or {}
    return {key: (val.get("string_value", "") if isinstance(val, Mapping) else str(val)) for key, val in params.items()}
