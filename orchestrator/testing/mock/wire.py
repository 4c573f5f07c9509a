"""Datatypes and byte tensors as they cross the wire.

The datatype tables follow Triton 2.51 (r24.10): ``model_config.proto``'s ``TYPE_*``
names, the KServe protocol names and the ``TRITONSERVER_DataType`` values that
``Tensor.triton_dtype()`` returns (``tritonserver.h``). BYTES tensors are serialized with
the mock's own ``pb_utils`` helpers (:mod:`orchestrator.testing.mock.pb_helpers`: 4-byte
little-endian length, then the bytes, per element).
"""

from __future__ import annotations

import threading
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from orchestrator.testing.mock.pb_helpers import deserialize_bytes_tensor, serialize_byte_tensor

PB_MODULE_NAME = "triton_python_backend_utils"

# config data_type -> KServe protocol datatype
CONFIG_TO_PROTOCOL = {
    "TYPE_BOOL": "BOOL",
    "TYPE_UINT8": "UINT8",
    "TYPE_UINT16": "UINT16",
    "TYPE_UINT32": "UINT32",
    "TYPE_UINT64": "UINT64",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_FP16": "FP16",
    "TYPE_FP32": "FP32",
    "TYPE_FP64": "FP64",
    "TYPE_STRING": "BYTES",
    "TYPE_BF16": "BF16",
}
# protocol datatype -> TRITONSERVER_DataType value (what Tensor.triton_dtype() returns)
PROTOCOL_TO_TRITON_INT = {
    "BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7,
    "INT32": 8, "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14,
}
_NUMPY_TO_PROTOCOL = [
    (np.dtype(np.bool_), "BOOL"),
    (np.dtype(np.uint8), "UINT8"),
    (np.dtype(np.uint16), "UINT16"),
    (np.dtype(np.uint32), "UINT32"),
    (np.dtype(np.uint64), "UINT64"),
    (np.dtype(np.int8), "INT8"),
    (np.dtype(np.int16), "INT16"),
    (np.dtype(np.int32), "INT32"),
    (np.dtype(np.int64), "INT64"),
    (np.dtype(np.float16), "FP16"),
    (np.dtype(np.float32), "FP32"),
    (np.dtype(np.float64), "FP64"),
]


def numpy_to_protocol(dtype: Any) -> Optional[str]:
    """Protocol datatype of a numpy dtype, with the stub's rules (None if unsupported).

    Like ``numpy_to_triton_type`` in the stub, comparisons are dtype equality, so a
    byte-swapped dtype is unsupported, ``object_`` and ``bytes_`` ('S') are BYTES and
    unicode ('U') is unsupported.
    """
    dtype = np.dtype(dtype)
    if dtype == np.dtype(np.object_) or dtype.type == np.bytes_:
        return "BYTES"
    for candidate, name in _NUMPY_TO_PROTOCOL:
        if dtype == candidate:
            return name
    return None


def config_to_protocol(data_type: str) -> str:
    """KServe datatype of a config ``data_type`` (``"TYPE_FP32"`` -> ``"FP32"``)."""
    return CONFIG_TO_PROTOCOL.get(data_type, data_type)


def dims_str(dims: Iterable[int]) -> str:
    """Dims as Triton's core prints them: ``[-1,4]``."""
    return "[" + ",".join(str(int(d)) for d in dims) + "]"


MODULE_LOCK = threading.RLock()


def serialize(array: np.ndarray) -> bytes:
    """A BYTES array as Triton's wire format (``b""`` for an empty array)."""
    out = serialize_byte_tensor(array)
    return b"" if out is None or len(out) == 0 else bytes(out)


def deserialize(blob: bytes, shape: Sequence[int]) -> np.ndarray:
    """The object array of ``bytes`` that :func:`serialize` wrote, in ``shape``."""
    if len(blob) == 0:
        return np.empty(tuple(shape), dtype=np.object_)
    flat = deserialize_bytes_tensor(blob)
    return flat.reshape(tuple(shape))
