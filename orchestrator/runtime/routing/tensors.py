"""The router's own tensors, as its ``config.pbtxt`` declares them (``args['model_config']``),
and the values a pipeline fills them with: what a tensor pipeline (``routing.pipeline``)
checks at load. Numpy and the standard library only."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from orchestrator.runtime.errors import PolicyError

__all__ = ["DTYPES", "TensorSpec", "RouterSpec", "router_spec", "Callee", "callee_config", "fill_array"]

#: Triton data type -> numpy dtype (BYTES: object arrays of ``bytes``). BF16 has none.
DTYPES: Dict[str, Any] = {
    "TYPE_BOOL": np.bool_, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


@dataclass(frozen=True)
class TensorSpec:
    """A router input or output from its config: numpy ``dtype`` (None: BF16), ``dims``
    (per row when the router batches; -1 variable), ``optional`` (inputs)."""

    name: str
    data_type: str
    dims: Tuple[int, ...]
    optional: bool = False

    @property
    def dtype(self) -> Any:
        """The numpy dtype (``np.object_`` for BYTES; None: no numpy type, BF16)."""
        return DTYPES.get(self.data_type)


@dataclass(frozen=True)
class RouterSpec:
    """The router's own configuration, as the pipeline needs it."""

    name: str
    max_batch_size: int
    inputs: Tuple[TensorSpec, ...]
    outputs: Tuple[TensorSpec, ...]
    callee_batch: Dict[str, int] = field(default_factory=dict)

    def output(self, name: str) -> Optional[TensorSpec]:
        """The router output ``name`` (None: not one)."""
        return next((o for o in self.outputs if o.name == name), None)


def _specs(entries: Any) -> Tuple[TensorSpec, ...]:
    """The tensors as the model sees them: an input's or output's ``reshape`` where it has one
    (Triton reshapes an input before the model gets it, and an output after)."""
    out = []
    for e in entries or []:
        dims = e.get("dims") or []
        # `reshape: { shape: [] }` (a scalar per row) comes as an empty mapping
        shape = (e["reshape"] or {}).get("shape") or [] if "reshape" in e else dims
        out.append(TensorSpec(str(e["name"]), str(e.get("data_type", "")), tuple(int(d) for d in shape), bool(e.get("optional", False))))
    return tuple(out)


def router_spec(config: Mapping[str, Any]) -> RouterSpec:
    """The router's :class:`RouterSpec` from its configuration (``args['model_config']`` as a dict)."""
    return RouterSpec(str(config.get("name", "router")), int(config.get("max_batch_size", 0) or 0),
                      _specs(config.get("input")), _specs(config.get("output")))


_MBS = re.compile(r"^\s*max_batch_size\s*:\s*(\d+)", re.MULTILINE)
_DECOUPLED = re.compile(r"model_transaction_policy\s*\{[^}]*decoupled\s*:\s*true", re.MULTILINE)


@dataclass(frozen=True)
class Callee:
    """What the router reads of a step's model from its ``config.pbtxt`` (``max_batch_size``,
    ``decoupled``); an autofilled model has no file to read: nothing is known of it."""

    max_batch_size: int
    decoupled: bool


def callee_config(repository: Path, model: str) -> Optional[Callee]:
    """``model``'s :class:`Callee` from ``repository/model/config.pbtxt`` (None: no readable file)."""
    try:
        text = (Path(repository) / model / "config.pbtxt").read_text(encoding="utf-8")
    except OSError:
        return None
    found = _MBS.search(text)
    return Callee(int(found.group(1)) if found else 0, bool(_DECOUPLED.search(text)))


def fill_array(value: Any, spec: TensorSpec, batched: bool, where: str) -> Any:
    """A ``fill`` value as the row it fills (numpy, the output's data type), checked."""
    dtype = spec.dtype
    row_dims = spec.dims
    if isinstance(value, (bool, int, float, str)) and any(d < 0 for d in row_dims):
        raise PolicyError(f"{where}: '{spec.name}' has variable dims {list(spec.dims)}; give the fill as a list, the "
                          "row it fills")
    kind = "bytes" if dtype is np.object_ else "bool" if dtype is np.bool_ else "number"
    flat: List[Any] = []

    def walk(v: Any) -> None:
        if isinstance(v, list):
            for x in v:
                walk(x)
        else:
            flat.append(v)
    walk(value)
    if kind == "bytes" and not all(isinstance(v, str) for v in flat):
        raise PolicyError(f"{where}: '{spec.name}' is BYTES: fill it with strings")
    if kind == "bool" and not all(isinstance(v, bool) for v in flat):
        raise PolicyError(f"{where}: '{spec.name}' is BOOL: fill it with true or false")
    if kind == "number" and not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat):
        raise PolicyError(f"{where}: '{spec.name}' is {spec.data_type}: fill it with numbers")
    if kind == "bytes":
        arr = np.empty(len(flat), dtype=np.object_)
        arr[:] = [v.encode("utf-8") for v in flat]
        arr = arr.reshape(np.asarray(value, dtype=object).shape) if isinstance(value, list) else arr.reshape(())
    else:
        arr = np.asarray(value).astype(dtype)
        if kind == "number" and np.issubdtype(arr.dtype, np.integer) and not np.array_equal(arr, np.asarray(value, dtype=np.float64)):
            raise PolicyError(f"{where}: {value!r} does not fit {spec.data_type}")
    if isinstance(value, list):
        if len(arr.shape) != len(row_dims) or any(d >= 0 and d != s for d, s in zip(row_dims, arr.shape)):
            raise PolicyError(f"{where}: a fill of shape {list(arr.shape)} is not a row of '{spec.name}' (dims {list(row_dims)})")
        return arr
    return np.broadcast_to(arr, tuple(row_dims)).copy()
