"""``pb_utils.Tensor`` and the memory-placement names of the stub.

Tensors are CPU memory, except the outputs of a ``KIND_GPU`` model that a BLS call receives
without asking for CPU memory (``InferenceRequest(preferred_memory=PreferredMemory(
TRITONSERVER_MEMORY_CPU, 0))``): those are marked as GPU tensors, whose ``as_numpy()`` raises
the stub's own error (python_backend r24.10 ``PbTensor::AsNumpy``).
"""

from __future__ import annotations

import enum
from typing import Any, List, Optional

import numpy as np

from orchestrator.testing.mock.errors import TritonModelException, as_str, incompatible
from orchestrator.testing.mock.wire import (
    PROTOCOL_TO_TRITON_INT,
    deserialize,
    numpy_to_protocol,
    serialize,
)

_KDLCPU = (1, 0)  # DLPack (device type kDLCPU, device 0)
_KDLCUDA = 2  # DLPack device type kDLCUDA
#: python_backend r24.10 ``PbTensor::AsNumpy`` (src/pb_tensor.cc), raised as TritonModelException.
GPU_AS_NUMPY = "Tensor is stored in GPU and cannot be converted to NumPy."
_SIGNATURE = "c_python_backend_utils.Tensor(arg0: str, arg1: numpy.ndarray)"
_NOT_SUPPORTED = (  # the stub's text, with the spaces its C++ line continuation leaves
    "Provided tensor is not supported. Tensor must be a DLPack capsule         or have "
    "`__dlpack__` and `__dlpack_device__` attributes"
)
_NOT_CONTIGUOUS = (
    "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in "
    "C-Order are supported."
)


class _Writable:
    """Exposes ``array``'s memory as writable (the stub's ``from_dlpack`` tensors wrap the
    producer's memory in a writable numpy array; numpy 1.x's ``from_dlpack`` is
    read-only) and keeps ``array`` alive as the base of the new view."""

    def __init__(self, array: np.ndarray):
        self._array = array
        interface = dict(array.__array_interface__)
        interface["data"] = (interface["data"][0], False)
        self.__array_interface__ = interface


def _is_c_order(array: np.ndarray) -> bool:
    """The stub's check of a DLPack tensor's strides (``FromDLPackCapsule``): every
    dimension but the first must be laid out in C order (dimensions of size 1 skipped)."""
    if array.itemsize == 0 or array.ndim < 2:
        return True
    expected = 1
    for i in range(1, array.ndim):
        dim = array.shape[array.ndim - i]
        if dim != 1:
            if array.strides[array.ndim - i] != expected * array.itemsize:
                return False
            expected *= dim
    return True


class _DLPackCapsule:
    def __init__(self, capsule: Any):
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple:
        return _KDLCPU


class Tensor:
    """Mirror of ``pb_utils.Tensor(name, numpy_array)`` (CPU memory; see the module docs
    for the GPU outputs of BLS calls).

    As in the stub: ``numpy_array`` must be a ``numpy.ndarray`` and the name a ``str``
    (or UTF-8 ``bytes``), else ``TypeError`` (pybind's "incompatible constructor
    arguments"); the name must be non-empty; the dtype must be one Triton supports
    (numpy unicode ``<U`` arrays raise ``TritonModelException("NumPy dtype is not
    supported.")`` -- use ``dtype=object``); non-contiguous arrays are made contiguous;
    ``as_numpy()`` returns the array given; a BYTES tensor is serialized when created,
    so later changes to its object array are not sent.
    """

    # _gpu: the GPU device id of a BLS output left in GPU memory, else None
    __slots__ = ("_name", "_dtype", "_array", "_serialized", "_gpu")

    def __init__(self, name: str, numpy_array: Any):
        name = as_str(name)
        if not isinstance(name, str) or not isinstance(numpy_array, np.ndarray):
            raise incompatible("__init__", _SIGNATURE, f"{name!r}, {numpy_array!r}", constructor=True)
        if name == "":
            raise TritonModelException("Tensor name cannot be an empty string.")
        array = numpy_array
        dtype = numpy_to_protocol(array.dtype)
        if dtype is None:
            raise TritonModelException("NumPy dtype is not supported.")
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        self._name = name
        self._dtype = dtype
        self._array = array
        self._serialized = serialize(array) if dtype == "BYTES" else None
        self._gpu: Optional[int] = None

    @classmethod
    def _wire(cls, name: str, dtype: str, array: np.ndarray) -> "Tensor":
        """A tensor as Triton hands it over (input to execute, BLS output)."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._dtype = dtype
        tensor._array = array
        tensor._serialized = serialize(array) if dtype == "BYTES" else None
        tensor._gpu = None
        return tensor

    @classmethod
    def _on_gpu(cls, name: str, dtype: str, array: np.ndarray, device_id: int) -> "Tensor":
        """A BLS output left in GPU memory ``device_id`` (what a ``KIND_GPU`` model answers
        when the request did not ask for CPU memory): ``as_numpy()`` refuses it."""
        tensor = cls._wire(name, dtype, array)
        tensor._gpu = device_id
        return tensor

    def _wire_array(self) -> np.ndarray:
        """The data as it would arrive on the other side of shared memory."""
        if self._dtype == "BYTES":
            return deserialize(self._serialized or b"", self._array.shape)
        return np.array(self._array, copy=True, order="C")

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if self._gpu is not None:
            raise TritonModelException(GPU_AS_NUMPY)
        return self._array

    def triton_dtype(self) -> int:
        return PROTOCOL_TO_TRITON_INT[self._dtype]

    def shape(self) -> List[int]:
        return [int(d) for d in self._array.shape]

    def is_cpu(self) -> bool:
        return self._gpu is None

    def to_dlpack(self) -> Any:
        if self._dtype == "BYTES":
            raise TritonModelException("DLPack does not have support for string tensors.")
        if self._gpu is not None:  # the stub hands out a CUDA capsule; the mock has no GPU memory
            raise TritonModelException("mock_triton: a GPU tensor has no memory to share in the mock")
        return self._array.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple:
        return _KDLCPU if self._gpu is None else (_KDLCUDA, self._gpu)

    @staticmethod
    def from_dlpack(name: str, tensor: Any) -> "Tensor":
        """A tensor sharing the memory of ``tensor`` (a DLPack capsule or an object with
        ``__dlpack__``/``__dlpack_device__``, CPU only), as the stub's ``from_dlpack``:
        its ``as_numpy()`` is a writable view of that memory. Raises
        ``TritonModelException`` for an empty name, an unsupported object, or strides the
        stub refuses (not C order beyond the first dimension)."""
        if name == "":
            raise TritonModelException("Tensor name cannot be an empty string.")
        if type(tensor).__name__ == "PyCapsule":
            source: Any = _DLPackCapsule(tensor)
        elif hasattr(tensor, "__dlpack__") and hasattr(tensor, "__dlpack_device__"):
            source = tensor
        else:
            raise TritonModelException(_NOT_SUPPORTED)
        array = np.from_dlpack(source)
        if not _is_c_order(array):
            raise TritonModelException(_NOT_CONTIGUOUS)
        if not array.flags.writeable:
            array = np.asarray(_Writable(array))
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._dtype}, shape={self.shape()})"


class PreferredMemory:
    """Mirror of ``pb_utils.PreferredMemory(preferred_memory_type, preferred_device_id=0)``
    (r24.10 ``pb_stub.cc``: both ``.none(false)``; the type is ``TRITONSERVER_MEMORY_CPU`` or
    ``TRITONSERVER_MEMORY_GPU``). A BLS request that carries one with
    ``TRITONSERVER_MEMORY_CPU`` gets its outputs in CPU memory (``request_executor.cc``
    ``ResponseAlloc``)."""

    def __init__(self, preferred_memory_type: Any, preferred_device_id: int = 0):
        if not isinstance(preferred_memory_type, MemoryType) or isinstance(preferred_device_id, bool) \
                or not isinstance(preferred_device_id, int):
            raise incompatible(
                "__init__",
                "c_python_backend_utils.PreferredMemory(preferred_memory_type: "
                "c_python_backend_utils.MemoryType, preferred_device_id: int = 0)",
                f"{preferred_memory_type!r}, {preferred_device_id!r}", constructor=True,
            )
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id

    def is_cpu(self) -> bool:
        """True when the outputs are asked for in CPU memory (mock helper, not in the stub)."""
        return self.preferred_memory_type == MemoryType.TRITONSERVER_MEMORY_CPU


class MemoryType(enum.IntEnum):
    """``pb_utils.TRITONSERVER_MEMORY_GPU/CPU`` (python_backend's
    ``PreferredMemory::MemoryType``: kGPU = 0, kCPU = 1)."""

    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1
