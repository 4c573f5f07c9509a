"""The pure-Python part of ``triton_python_backend_utils`` (``pb_utils``), written here.

In Triton the module is a Python file (python_backend ``src/resources/
triton_python_backend_utils.py``) to which the stub adds its C++ classes. These are that
file's functions, class and constants with the same behaviour, results and error messages
as r24.10 (Triton 2.51), so the mock needs no copy of Triton's file and no Linux-only wheel.
tests/mock/test_pb_helpers.py checks them against the real file where one is installed
(the ``nvidia-pytriton`` wheel carries it): the same bytes for the same random tensors, the
same dtype tables, the same ``ModelConfig`` results and ``ValueError`` messages.

BYTES wire format (``serialize_byte_tensor``): per element in C order, a 4-byte
little-endian unsigned length, then the element's bytes. An ``object`` element that is
exactly ``bytes`` is taken as is; anything else (``str``, numbers, a ``bytes`` subclass such
as ``np.bytes_``) is ``str(item).encode("utf-8")``, as in Triton.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

#: config ``data_type`` -> numpy type (``TYPE_BF16`` has none, as in Triton).
TRITON_STRING_TO_NUMPY: Dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# TRITONSERVER_DataType values (tritonserver.h) <-> numpy, in the order Triton compares them.
_TRITON_NUMPY: Tuple[Tuple[int, Any], ...] = (
    (1, np.bool_), (2, np.uint8), (3, np.uint16), (4, np.uint32), (5, np.uint64),
    (6, np.int8), (7, np.int16), (8, np.int32), (9, np.int64), (10, np.float16),
    (11, np.float32), (12, np.float64), (13, np.object_),
)
_NUMPY_BY_TRITON = dict(_TRITON_NUMPY)

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

_LENGTH = struct.Struct("<I")


def serialize_byte_tensor(input_tensor: "np.ndarray[Any, Any]") -> Union[bytes, Tuple[()], None]:
    """A BYTES tensor (dtype ``object`` or ``bytes_``) as Triton's wire format.

    Returns ``()`` for an empty tensor, ``None`` for any other dtype (Triton's results).
    ``bytes_`` ('S') elements lose trailing NUL bytes (numpy strips them), so use ``object``.
    """
    if input_tensor.size == 0:
        return ()
    dtype = input_tensor.dtype
    if dtype == np.object_:
        parts: List[bytes] = []
        for item in input_tensor.ravel(order="C"):
            data = item if type(item) is bytes else str(item).encode("utf-8")
            parts.append(_LENGTH.pack(len(data)))
            parts.append(data)
        return b"".join(parts)
    if dtype.type == np.bytes_:
        parts = []
        for item in input_tensor.ravel(order="C"):
            data = bytes(item)
            parts.append(_LENGTH.pack(len(data)))
            parts.append(data)
        return b"".join(parts)
    return None


def deserialize_bytes_tensor(encoded_tensor: Any) -> "np.ndarray[Any, Any]":
    """The flat ``object`` array of ``bytes`` that :func:`serialize_byte_tensor` wrote.

    ``encoded_tensor``: ``bytes`` or any buffer. Raises ``struct.error`` when a length runs
    past the end of the buffer (as Triton's helper does).
    """
    items: List[bytes] = []
    offset = 0
    size = len(encoded_tensor)
    while offset < size:
        (length,) = _LENGTH.unpack_from(encoded_tensor, offset)
        offset += 4
        (item,) = struct.unpack_from(f"<{length}s", encoded_tensor, offset)
        offset += length
        items.append(item)
    return np.array(items, dtype=np.object_)


def get_input_tensor_by_name(inference_request: Any, name: str) -> Any:
    """The input ``Tensor`` of ``inference_request`` named ``name``, or None."""
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: Any, name: str) -> Any:
    """The output ``Tensor`` of ``inference_response`` named ``name``, or None."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: Dict[str, Any], name: str) -> Optional[Dict[str, Any]]:
    """The ``input`` entry of a model configuration dict named ``name``, or None."""
    if "input" in model_config:
        for properties in model_config["input"]:
            if properties["name"] == name:
                return properties  # type: ignore[no-any-return]
    return None


def get_output_config_by_name(model_config: Dict[str, Any], name: str) -> Optional[Dict[str, Any]]:
    """The ``output`` entry of a model configuration dict named ``name``, or None."""
    if "output" in model_config:
        for properties in model_config["output"]:
            if properties["name"] == name:
                return properties  # type: ignore[no-any-return]
    return None


def using_decoupled_model_transaction_policy(model_config: Dict[str, Any]) -> bool:
    """``model_transaction_policy.decoupled`` of a configuration dict (False when absent;
    KeyError when the policy has no ``decoupled`` key, as in Triton)."""
    if "model_transaction_policy" in model_config:
        return model_config["model_transaction_policy"]["decoupled"]  # type: ignore[no-any-return]
    return False


def triton_to_numpy_type(data_type: int) -> Any:
    """The numpy type of a ``TRITONSERVER_DataType`` value (1 ``BOOL`` ... 13 ``BYTES``;
    None for any other value, BF16 = 14 included)."""
    for number, numpy_type in _TRITON_NUMPY:
        if data_type == number:
            return numpy_type
    return None


def numpy_to_triton_type(data_type: Any) -> Optional[int]:
    """The ``TRITONSERVER_DataType`` value of a numpy type or dtype (``object_`` and
    ``bytes_`` are 13, BYTES; None when unsupported). Compared with ``==`` as Triton does."""
    for number, numpy_type in _TRITON_NUMPY[:-1]:
        if data_type == numpy_type:
            return number
    if data_type == np.object_ or data_type == np.bytes_:
        return 13
    return None


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """The numpy type of a config ``data_type`` (``"TYPE_FP32"`` -> ``np.float32``);
    KeyError for ``TYPE_BF16`` and unknown names."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


class ModelConfig:
    """The configuration ``auto_complete_config(auto_complete_model_config)`` gets and returns.

    ``model_config``: the configuration as a JSON string. Only ``max_batch_size``, inputs,
    outputs, the dynamic batcher and the transaction policy can be changed; the ``set_*``/
    ``add_*`` methods raise ``ValueError`` with Triton's messages on a conflict.
    """

    def __init__(self, model_config: str) -> None:
        self._model_config: Dict[str, Any] = json.loads(model_config)

    def as_dict(self) -> Dict[str, Any]:
        """The configuration as a dict (the object itself, not a copy, as in Triton)."""
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set ``max_batch_size``; ValueError when the configuration already sets a larger one."""
        config = self._model_config
        if config["max_batch_size"] > max_batch_size:
            raise ValueError(
                "configuration specified max_batch_size " + str(config["max_batch_size"])
                + ", but in auto-complete-config function for model '" + config["name"]
                + "' specified max_batch_size " + str(max_batch_size)
            )
        config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Add an empty ``dynamic_batching`` unless one is set; ValueError when the model uses
        ``sequence_batching`` or ``ensemble_scheduling``."""
        config = self._model_config
        found = None
        if "sequence_batching" in config:
            found = "sequence_batching"
        elif "ensemble_scheduling" in config:
            found = "ensemble_scheduling"
        if found is not None:
            raise ValueError(
                "Configuration specified scheduling_choice as '" + found
                + "', but auto-complete-config function for model '" + config["name"]
                + "' tries to set scheduling_choice as 'dynamic_batching'"
            )
        if "dynamic_batching" not in config:
            config["dynamic_batching"] = {}

    def _check_tensor(self, kind: str, tensor: Dict[str, Any], valid: List[str], listed: str) -> None:
        name = self._model_config["name"]
        for key in tensor:
            if key not in valid:
                raise ValueError(
                    kind + " '" + tensor["name"] + "' in auto-complete-config function for model '"
                    + name + "' contains property other than " + listed + "."
                )
        if "name" not in tensor:
            raise ValueError(
                kind + " in auto-complete-config function for model '" + name
                + "' is missing 'name' property."
            )
        for required in ("data_type", "dims"):
            if required not in tensor:
                raise ValueError(
                    kind + " '" + tensor["name"] + "' in auto-complete-config function for model '"
                    + name + "' is missing '" + required + "' property."
                )

    def _merge(self, kind: str, tensor: Dict[str, Any]) -> bool:
        """Merge ``tensor`` into the configured one of the same name (True), else False."""
        name = self._model_config["name"]
        for current in self._model_config[kind]:
            if tensor["name"] != current["name"]:
                continue
            if current["data_type"] != "TYPE_INVALID" and current["data_type"] != tensor["data_type"]:
                raise ValueError(
                    "unable to load model '" + name + "', configuration expects datatype "
                    + current["data_type"] + " for " + kind + " '" + tensor["name"]
                    + "', model provides " + tensor["data_type"]
                )
            if current["dims"] and current["dims"] != tensor["dims"]:
                raise ValueError(
                    "model '" + name + "', tensor '" + tensor["name"] + "': the model expects dims "
                    + str(tensor["dims"]) + " but the model configuration specifies dims "
                    + str(current["dims"])
                )
            if (
                kind == "input" and "optional" in current and "optional" in tensor
                and current["optional"] != tensor["optional"]
            ):
                raise ValueError(
                    "model '" + name + "', tensor '" + tensor["name"]
                    + "': the model expects optional " + str(tensor["optional"])
                    + " but the model configuration specifies optional " + str(current["optional"])
                )
            current["data_type"] = tensor["data_type"]
            current["dims"] = tensor["dims"]
            if kind == "input" and "optional" in tensor:
                current["optional"] = tensor["optional"]
            return True
        return False

    def add_input(self, input: Dict[str, Any]) -> None:  # noqa: A002 - Triton's name
        """Add an input (keys ``name``, ``data_type``, ``dims``, ``optional``) or complete the
        configured one of that name; ValueError on another key, a missing key or a conflict."""
        self._check_tensor("input", input, ["name", "data_type", "dims", "optional"],
                           "'name', 'data_type', 'dims' and 'optional'")
        if not self._merge("input", input):
            self._model_config["input"].append(input)

    def add_output(self, output: Dict[str, Any]) -> None:
        """Add an output (keys ``name``, ``data_type``, ``dims``) or complete the configured one
        of that name; ValueError on another key, a missing key or a conflict."""
        self._check_tensor("output", output, ["name", "data_type", "dims"], "'name', 'data_type' and 'dims'")
        if not self._merge("output", output):
            self._model_config["output"].append(output)

    def set_model_transaction_policy(self, transaction_policy_dict: Dict[str, Any]) -> None:
        """Set ``model_transaction_policy`` (only ``decoupled``); ValueError on another key or
        when it changes a ``decoupled`` already set."""
        config = self._model_config
        for key in transaction_policy_dict.keys():
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model '"
                    + config["name"] + "' contains property other than 'decoupled'."
                )
        policy = config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict.keys():
            if "decoupled" in policy and policy["decoupled"] != transaction_policy_dict["decoupled"]:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model '"
                    + config["name"] + "', which is already set to '" + str(policy["decoupled"]) + "'."
                )
            policy["decoupled"] = transaction_policy_dict["decoupled"]


#: The names this module gives ``pb_utils`` (the real file's public names).
__all__ = [
    "TRITON_STRING_TO_NUMPY",
    "serialize_byte_tensor",
    "deserialize_bytes_tensor",
    "get_input_tensor_by_name",
    "get_output_tensor_by_name",
    "get_input_config_by_name",
    "get_output_config_by_name",
    "using_decoupled_model_transaction_policy",
    "triton_to_numpy_type",
    "numpy_to_triton_type",
    "triton_string_to_numpy",
    "ModelConfig",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
]
