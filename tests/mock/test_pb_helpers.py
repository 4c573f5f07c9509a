"""The mock's own pb_utils helpers against Triton's real ``triton_python_backend_utils.py``
(where installed): the same bytes, values and errors on random inputs (numpy's RNG, seeded,
a few thousand cases in well under a second), and the mock's ``model_config.proto`` layout
against tritonclient's compiled one."""

from __future__ import annotations

import copy
import json
import struct

import numpy as np
import pytest

from orchestrator.testing.mock import install, pb_helpers
from tests.real_pb_utils import real_pb_utils

REAL = real_pb_utils()
needs_real = pytest.mark.skipif(REAL is None, reason="Triton's triton_python_backend_utils.py is not installed "
                                "(the nvidia-pytriton wheel, or MOCK_TRITON_PB_UTILS=<path>)")
CASES = 1500


class BytesChild(bytes):
    """A bytes subclass: Triton str()s it (``type(x) == bytes`` is False)."""


def _element(rng: np.random.Generator):
    kind = int(rng.integers(0, 8))
    raw = rng.integers(0, 256, size=int(rng.integers(0, 12)), dtype=np.uint8).tobytes()
    if kind == 0:
        return raw
    if kind == 1:
        return raw + b"\x00" * int(rng.integers(0, 3))  # trailing NULs survive in object arrays
    if kind == 2:
        return "".join(chr(int(c)) for c in rng.integers(32, 0x3000, size=int(rng.integers(0, 6))))
    if kind == 3:
        return int(rng.integers(-10**6, 10**6))
    if kind == 4:
        return float(rng.normal())
    if kind == 5:
        return np.bytes_(raw)
    if kind == 6:
        return BytesChild(raw)
    return None


def _random_tensor(rng: np.random.Generator) -> np.ndarray:
    shape = tuple(int(d) for d in rng.integers(0, 4, size=int(rng.integers(0, 4))))
    size = int(np.prod(shape)) if shape else 1
    choice = int(rng.integers(0, 5))
    if choice <= 2:
        flat = np.empty(size, dtype=np.object_)
        for i in range(size):
            flat[i] = _element(rng)
        array = flat.reshape(shape)
    elif choice == 3:
        array = np.array([rng.integers(0, 256, size=int(rng.integers(0, 6)), dtype=np.uint8).tobytes()
                          for _ in range(size)], dtype=np.bytes_).reshape(shape)
    else:
        dtype = rng.choice(["float32", "int64", "bool", "uint8", "float16", "U3"])
        array = np.zeros(shape, dtype=dtype)
    if array.ndim >= 2 and rng.random() < 0.3:
        array = array.T  # not C-contiguous: serialized in C order of the view
    return array


@needs_real
def test_serialize_byte_tensor_gives_tritons_bytes_on_random_tensors():
    rng = np.random.default_rng(20241028)
    for case in range(CASES):
        tensor = _random_tensor(rng)
        ours, theirs = pb_helpers.serialize_byte_tensor(tensor), REAL.serialize_byte_tensor(tensor)
        assert type(ours) is type(theirs) and ours == theirs, (case, tensor)


@needs_real
def test_deserialize_bytes_tensor_agrees_on_random_and_truncated_blobs():
    rng = np.random.default_rng(7)
    for case in range(CASES):
        tensor = _random_tensor(rng)
        blob = REAL.serialize_byte_tensor(tensor)
        if not isinstance(blob, bytes):
            continue
        if rng.random() < 0.2 and blob:
            blob = blob[: int(rng.integers(0, len(blob)))]  # truncated: both raise struct.error
        results = []
        for module in (pb_helpers, REAL):
            try:
                results.append(("ok", module.deserialize_bytes_tensor(blob)))
            except struct.error as exc:
                results.append(("error", type(exc)))
        (kind_a, a), (kind_b, b) = results
        assert kind_a == kind_b, (case, blob)
        if kind_a == "ok":
            assert a.dtype == b.dtype and a.shape == b.shape and list(a) == list(b), case


def test_bytes_round_trip_keeps_every_byte():
    rng = np.random.default_rng(3)
    for _ in range(300):
        items = [rng.integers(0, 256, size=int(rng.integers(0, 20)), dtype=np.uint8).tobytes() for _ in range(5)]
        tensor = np.array(items + [b""], dtype=np.object_)
        back = pb_helpers.deserialize_bytes_tensor(pb_helpers.serialize_byte_tensor(tensor))
        assert list(back) == items + [b""]
    assert pb_helpers.serialize_byte_tensor(np.array([], dtype=np.object_)) == ()
    assert pb_helpers.serialize_byte_tensor(np.zeros(2, np.float32)) is None
    with pytest.raises(struct.error):
        pb_helpers.deserialize_bytes_tensor(b"\x05\x00\x00\x00ab")


DTYPE_PROBES = [np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32, np.int64,
                np.float16, np.float32, np.float64, np.object_, np.bytes_, np.str_, bool, int, float, str, bytes,
                np.dtype("S5"), np.dtype("U2"), np.dtype(">i4"), np.dtype("<f8"), np.dtype("O"), "float32", None, 3]


@needs_real
def test_dtype_tables_agree():
    for probe in DTYPE_PROBES:
        assert pb_helpers.numpy_to_triton_type(probe) == REAL.numpy_to_triton_type(probe), probe
    for value in range(-1, 17):
        assert pb_helpers.triton_to_numpy_type(value) == REAL.triton_to_numpy_type(value), value
    assert pb_helpers.TRITON_STRING_TO_NUMPY == REAL.TRITON_STRING_TO_NUMPY
    for name in REAL.TRITON_STRING_TO_NUMPY:
        assert pb_helpers.triton_string_to_numpy(name) is REAL.triton_string_to_numpy(name)
    for name in ("TYPE_BF16", "FP32"):
        with pytest.raises(KeyError):
            pb_helpers.triton_string_to_numpy(name)


def _random_config(rng: np.random.Generator) -> dict:
    types = ["TYPE_FP32", "TYPE_INT64", "TYPE_STRING", "TYPE_INVALID"]
    config = {"name": "m", "max_batch_size": int(rng.integers(0, 9)), "input": [], "output": []}
    for kind in ("input", "output"):
        for i in range(int(rng.integers(0, 3))):
            entry = {"name": f"{kind[0].upper()}{i}", "data_type": str(rng.choice(types)),
                     "dims": [int(d) for d in rng.integers(-1, 4, size=int(rng.integers(0, 3)))]}
            if kind == "input" and rng.random() < 0.5:
                entry["optional"] = bool(rng.random() < 0.5)
            config[kind].append(entry)
    extra = rng.choice(["", "sequence_batching", "ensemble_scheduling", "dynamic_batching", "model_transaction_policy"])
    if extra == "model_transaction_policy":
        config[extra] = {"decoupled": bool(rng.random() < 0.5)}
    elif extra:
        config[str(extra)] = {}
    return config


def _random_call(rng: np.random.Generator):
    op = int(rng.integers(0, 5))
    if op == 0:
        return "set_max_batch_size", (int(rng.integers(0, 9)),)
    if op == 1:
        return "set_dynamic_batching", ()
    if op == 4:
        policy = {"decoupled": bool(rng.random() < 0.5)}
        if rng.random() < 0.2:
            policy["other"] = 1
        return "set_model_transaction_policy", (policy,)
    kind = "input" if op == 2 else "output"
    tensor = {"name": f"{kind[0].upper()}{int(rng.integers(0, 3))}", "data_type": str(rng.choice(["TYPE_FP32", "TYPE_INT64"])),
              "dims": [int(d) for d in rng.integers(-1, 4, size=int(rng.integers(1, 3)))]}
    if rng.random() < 0.3:
        tensor["optional"] = bool(rng.random() < 0.5)
    for key in ("data_type", "dims"):
        if rng.random() < 0.1:
            del tensor[key]
    return ("add_input" if kind == "input" else "add_output"), (tensor,)


@needs_real
def test_model_config_helpers_agree_on_random_call_sequences():
    rng = np.random.default_rng(11)
    for case in range(CASES // 3):
        text = json.dumps(_random_config(rng))
        ours, theirs = pb_helpers.ModelConfig(text), REAL.ModelConfig(text)
        for _ in range(4):
            method, args = _random_call(rng)
            outcomes = []
            for config in (ours, theirs):
                try:
                    getattr(config, method)(*copy.deepcopy(args))
                    outcomes.append(None)
                except (ValueError, KeyError) as exc:
                    outcomes.append((type(exc), str(exc)))
            assert outcomes[0] == outcomes[1], (case, method, args)
            assert ours.as_dict() == theirs.as_dict(), (case, method, args)
    assert pb_helpers.using_decoupled_model_transaction_policy({}) is False


@needs_real
def test_lookups_and_constants_agree():
    config = {"input": [{"name": "A"}, {"name": "B"}], "output": [{"name": "C"}]}
    for name in ("A", "B", "C", "Z"):
        assert pb_helpers.get_input_config_by_name(config, name) == REAL.get_input_config_by_name(config, name)
        assert pb_helpers.get_output_config_by_name(config, name) == REAL.get_output_config_by_name(config, name)
    for policy in ({}, {"model_transaction_policy": {"decoupled": True}}):
        assert (pb_helpers.using_decoupled_model_transaction_policy(policy)
                == REAL.using_decoupled_model_transaction_policy(policy))
    public = {n for n in vars(REAL) if not n.startswith("_")} - {"json", "struct", "np"}
    assert public == set(pb_helpers.__all__)
    for name in public:
        if name.startswith("TRITONSERVER_"):
            assert getattr(pb_helpers, name) == getattr(REAL, name), name


def test_the_installed_module_has_every_name_of_the_stub_and_no_wheel():
    module = install()
    for name in pb_helpers.__all__ + ["Tensor", "InferenceRequest", "InferenceResponse", "TritonError",
                                      "TritonModelException", "Logger", "MetricFamily", "load_model",
                                      "unload_model", "is_model_ready", "get_model_dir", "PreferredMemory",
                                      "TRITONSERVER_MEMORY_CPU", "TRITONSERVER_MEMORY_GPU"]:
        assert hasattr(module, name), name
    assert install() is module


def test_the_model_config_layout_is_tritonclients():
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2",
                                           reason="tritonclient is not installed")
    from google.protobuf import descriptor_pb2

    from orchestrator.testing.mock.model_config import FILE_PROTO

    theirs = descriptor_pb2.FileDescriptorProto()
    model_config_pb2.DESCRIPTOR.CopyToProto(theirs)
    theirs.name = FILE_PROTO.name
    theirs.ClearField("options")
    assert theirs == FILE_PROTO
