"""The client side of :meth:`MockTriton.infer`: numpy inputs turned into a request as
``tritonclient`` would send it (``set_data_from_numpy``: the datatype comes from the
array, ``str`` elements of object arrays become UTF-8 ``bytes``, numpy unicode arrays
are refused)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from orchestrator.testing.mock.records import Req
from orchestrator.testing.mock.wire import deserialize, numpy_to_protocol, serialize


def _tensor(model: str, name: Any, array: Any) -> tuple:
    if not isinstance(name, str):
        raise TypeError(f"input names must be str, got {name!r}")
    if not isinstance(array, np.ndarray):
        raise TypeError(
            f"input '{name}' for model '{model}' must be a numpy array, got {type(array)} "
            "(tritonclient's set_data_from_numpy requires one)"
        )
    dtype = numpy_to_protocol(array.dtype)
    if dtype is None:
        hint = " -- use dtype=object for strings" if array.dtype.kind == "U" else ""
        raise ValueError(
            f"input '{name}': tritonclient cannot send numpy dtype {array.dtype} (got "
            f"unexpected datatype None from numpy array){hint}"
        )
    if dtype == "BYTES":
        return name, dtype, deserialize(serialize(array), array.shape)
    return name, dtype, np.array(array, copy=True, order="C")


def _parameters(parameters: Optional[dict]) -> dict:
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise TypeError("parameters must be a dict")
    for key, value in parameters.items():
        if not isinstance(key, str) or not isinstance(value, (bool, int, float, str)):
            raise TypeError(
                f"parameter {key!r}: KServe request parameters are str keys with bool, "
                "int, float or str values"
            )
    return dict(parameters)


def client_request(model: str, inputs: Any, parameters: Any = None, request_id: Any = "",
                   outputs: Any = None) -> Req:
    """A request to ``model`` from numpy ``inputs`` (name -> array), KServe
    ``parameters`` (str -> bool/int/float/str), ``request_id`` and the requested
    ``outputs`` (None: all). Raises TypeError/ValueError where tritonclient would refuse
    to send it."""
    if not isinstance(inputs, dict):
        raise TypeError(f"inputs must be a dict of name -> numpy array, got {type(inputs)}")
    if not isinstance(request_id, str):
        raise TypeError("request_id must be str")
    if outputs is not None and (
        isinstance(outputs, str) or not all(isinstance(o, str) for o in outputs)
    ):
        raise TypeError("outputs must be a list of output names")
    tensors = [_tensor(model, n, a) for n, a in inputs.items()]
    return Req(tensors, list(outputs) if outputs else None, _parameters(parameters), request_id)


def parse_item(item: Any, index: int) -> tuple:
    """(inputs, parameters, request_id, outputs) of one ``infer_batch`` item: an inputs
    dict, or ``{"inputs": {...}, "parameters", "request_id", "outputs"}``."""
    if not isinstance(item, dict):
        raise TypeError(f"infer_batch: request {index} must be a dict, got {type(item)}")
    if "inputs" in item and isinstance(item["inputs"], dict):
        unknown = set(item) - {"inputs", "parameters", "request_id", "outputs"}
        if unknown:
            raise TypeError(
                f"infer_batch: request {index} has unknown keys {sorted(unknown)} (allowed: "
                "inputs, parameters, request_id, outputs)"
            )
        return (
            item["inputs"], item.get("parameters"), item.get("request_id", ""),
            item.get("outputs"),
        )
    return item, None, "", None
