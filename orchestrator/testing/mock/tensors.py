"""``pb_utils.Tensor`` and the memory-placement names of the stub (CPU only)."""

from __future__ import annotations

import enum
from typing import Any, List

import numpy as np

from orchestrator.testing.mock.errors import TritonModelException
from orchestrator.testing.mock.wire import (
    PROTOCOL_TO_TRITON_INT,
    deserialize,
    numpy_to_protocol,
    serialize,
)

_KDLCPU = (1, 0)  # DLPack (device type kDLCPU, device 0)


class _DLPackCapsule:
    def __init__(self, capsule: Any):
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple:
        return _KDLCPU


class Tensor:
    """Mirror of ``pb_utils.Tensor(name, numpy_array)`` (CPU only).

    As in the stub: the name must be non-empty; the dtype must be one Triton supports
    (numpy unicode ``<U`` arrays raise ``TritonModelException("NumPy dtype is not
    supported.")`` -- use ``dtype=object``); non-contiguous arrays are made contiguous;
    ``as_numpy()`` returns the array given; a BYTES tensor is serialized when created,
    so later changes to its object array are not sent.
    """

    __slots__ = ("_name", "_dtype", "_array", "_serialized")

    def __init__(self, name: str, numpy_array: Any):
        if not isinstance(name, str):
            raise TypeError(
                f"Tensor(): incompatible constructor arguments: name must be str, got {type(name)}"
            )
        if name == "":
            raise TritonModelException("Tensor name cannot be an empty string.")
        array = np.asarray(numpy_array)
        dtype = numpy_to_protocol(array.dtype)
        if dtype is None:
            raise TritonModelException("NumPy dtype is not supported.")
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        self._name = name
        self._dtype = dtype
        self._array = array
        self._serialized = serialize(array) if dtype == "BYTES" else None

    @classmethod
    def _wire(cls, name: str, dtype: str, array: np.ndarray) -> "Tensor":
        """A tensor as Triton hands it over (input to execute, BLS output)."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._dtype = dtype
        tensor._array = array
        tensor._serialized = serialize(array) if dtype == "BYTES" else None
        return tensor

    def _wire_array(self) -> np.ndarray:
        """The data as it would arrive on the other side of shared memory."""
        if self._dtype == "BYTES":
            return deserialize(self._serialized or b"", self._array.shape)
        return np.array(self._array, copy=True, order="C")

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def triton_dtype(self) -> int:
        return PROTOCOL_TO_TRITON_INT[self._dtype]

    def shape(self) -> List[int]:
        return [int(d) for d in self._array.shape]

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        if self._dtype == "BYTES":
            raise TritonModelException("DLPack does not have support for string tensors.")
        return self._array.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple:
        return _KDLCPU

    @staticmethod
    def from_dlpack(name: str, tensor: Any) -> "Tensor":
        source = tensor if hasattr(tensor, "__dlpack__") else _DLPackCapsule(tensor)
        return Tensor(name, np.from_dlpack(source))

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._dtype}, shape={self.shape()})"


class PreferredMemory:
    """Mirror of ``pb_utils.PreferredMemory`` (accepted and ignored: all memory is CPU)."""

    def __init__(self, preferred_memory_type: Any, preferred_device_id: int = 0):
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class MemoryType(enum.IntEnum):
    """``pb_utils.TRITONSERVER_MEMORY_GPU/CPU`` (python_backend's
    ``PreferredMemory::MemoryType``: kGPU = 0, kCPU = 1)."""

    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1
