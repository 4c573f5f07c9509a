"""Input checks shared by the router, tokenizer and postprocess models.

Every check raises :class:`InputError` whose message names the input (and the element
index where one element is at fault) and says what was wrong, so that the Python-backend
models can turn it into a per-request ``INVALID_ARG`` error instead of failing the batch.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, List, Mapping

import numpy as np
from numpy.typing import NDArray

from orchestrator.runtime.errors import InputError

__all__ = ["InputError", "decode_texts", "check_thresholds", "request_parameters", "parse_bool", "config_parameters"]


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
