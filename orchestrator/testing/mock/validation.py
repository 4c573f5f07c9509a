"""Request validation as Triton's core does it (``InferenceRequest::Normalize``, r24.10,
``src/infer_request.cc``), in its order and with its messages.

Including its gap: with ``optional`` inputs only the *number* of inputs is checked, so a
request that omits a required input but sends an optional one passes (in Triton too).

The core keeps a request's inputs in a ``std::unordered_map`` and checks them in its
iteration order, which names the first bad input in an error and orders the "Got input(s)"
list. For the few inputs of a request, libstdc++ iterates a map in the reverse of the order
the inputs were added (each new key goes to the front when its bucket is empty), so the mock
checks them last-sent first; two input names hashing into the same bucket could make Triton
differ (seen in none of tests/server/test_mock_agrees_generated.py's cases).
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np

from orchestrator.testing.mock.errors import ErrorCode
from orchestrator.testing.mock.instances import LoadedModel
from orchestrator.testing.mock.records import Err, Req
from orchestrator.testing.mock.wire import config_to_protocol, dims_str

_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a "
    "batch dimension to be prepended to each input shape. If you want to "
    "specify the full shape including the batch dim in your input dims "
    "config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)


def _bad(message: str) -> Err:
    return Err(message, ErrorCode.INVALID_ARG, "validation")


def _log_prefix(req: Req) -> str:
    return f"[request id: {req.request_id or '<id_unknown>'}] "


def _core_order(req: Req) -> List[tuple]:
    """The request's inputs in the order the core iterates them (see the module docs)."""
    return list(reversed(req.inputs))


def _check_names(model: LoadedModel, req: Req) -> Optional[Err]:
    """Duplicate inputs, unknown requested outputs, and the number of inputs."""
    name = model.name
    seen = set()
    for input_name, _, _ in req.inputs:
        if input_name in seen:
            return _bad(f"input '{input_name}' already exists in request")
        seen.add(input_name)
    for output_name in req.requested or ():
        if output_name not in model.outputs:
            return _bad(f"unexpected inference output '{output_name}' for model '{name}'")
    n_config = len(model.inputs)
    n_required = sum(1 for i in model.inputs.values() if not i.get("optional"))
    n_given = len(req.inputs)
    if n_required <= n_given <= n_config:
        return None
    missing = [f"'{n}'" for n, i in model.inputs.items() if not i.get("optional") and n not in seen]
    got = "[" + ",".join(f"'{n}'" for n, _, _ in _core_order(req)) + "]"
    # the core pops the trailing "," and so the "[" of an empty list: "]"
    missing_str = "[" + ",".join(missing) + "]" if missing else "]"
    log = _log_prefix(req)
    if n_config == n_required:
        return _bad(
            f"{log}expected {n_config} inputs but got {n_given} inputs for model "
            f"'{name}'. Got input(s) {got}, but missing required input(s) "
            f"{missing_str}. Please provide all required input(s)."
        )
    return _bad(
        f"{log}expected number of inputs between {n_required} and {n_config} but got "
        f"{n_given} inputs for model '{name}'. Got input(s) {got}, but missing "
        f"required input(s) {missing_str}. Please provide all required input(s)."
    )


def _batch_size(model: LoadedModel, req: Req) -> "int | Err":
    """The request's batch size (0 for non-batching models), or the error."""
    name, mbs, log = model.name, model.max_batch_size, _log_prefix(req)
    batch = 0
    for input_name, _, array in _core_order(req):
        cfg = model.inputs.get(input_name)
        if cfg is None:
            return _bad(f"unexpected inference input '{input_name}' for model '{name}'")
        if mbs == 0 or cfg.get("is_shape_tensor"):
            continue
        if array.ndim == 0:
            return _bad(
                f"{log}input '{input_name}' has no shape but model requires batch "
                f"dimension for '{name}'"
            )
        if batch == 0:
            batch = int(array.shape[0])
        elif int(array.shape[0]) != batch:
            return _bad(
                f"{log}input '{input_name}' batch size does not match other inputs for "
                f"'{name}'"
            )
    if batch > mbs:
        return _bad(f"{log}inference request batch-size must be <= {mbs} for '{name}'")
    return batch


def _model_input(model: LoadedModel, req: Req, tensor: tuple, batch: int = 1) -> "tuple | Err":
    """One input checked against its config (datatype, shape), reshaped, and its data
    against its shape (``batch``: the request's batch size, 0 when the first dimension of a
    batching model's inputs is 0)."""
    input_name, dtype, array = tensor
    name, mbs, log = model.name, model.max_batch_size, _log_prefix(req)
    cfg = model.inputs[input_name]
    expected = config_to_protocol(cfg["data_type"])
    if dtype != expected:
        return _bad(
            f"{log}inference input '{input_name}' data-type is '{dtype}', but model "
            f"'{name}' expects '{expected}'"
        )
    batched = mbs > 0 and not cfg.get("is_shape_tensor")
    shape = list(array.shape[1:]) if batched else list(array.shape)
    dims = [int(d) for d in cfg.get("dims", [])]
    if len(dims) != len(shape) or not all(d == -1 or d == s for d, s in zip(dims, shape)):
        full = ([-1] if mbs > 0 else []) + dims
        note = _BATCH_NOTE if mbs > 0 else ""
        return _bad(
            f"{log}unexpected shape for input '{input_name}' for model '{name}'. "
            f"Expected {dims_str(full)}, got {dims_str(array.shape)}. {note}"
        )
    if "reshape" in cfg:
        target = [int(d) for d in cfg["reshape"].get("shape", [])]
        variable = iter([s for d, s in zip(dims, shape) if d == -1])
        resolved = [next(variable, -1) if d == -1 else d for d in target]
        lead = [int(array.shape[0])] if batched else []
        array = array.reshape(lead + resolved)
    if batched and batch == 0:
        # the core's shape "with batch dim" is then the shape without it, and the data (none)
        # must fill it: input byte size / string element count checks
        inner = array.shape[1:]
        count = int(np.prod(inner)) if inner else 1
        if count:
            if dtype == "BYTES":
                return _bad(
                    f"{log}expected {count} string elements for inference input '{input_name}' "
                    f"for model '{name}', got 0"
                )
            return _bad(
                f"{log}input byte size mismatch for input '{input_name}' for model '{name}'. "
                f"Expected {count * array.dtype.itemsize}, got 0"
            )
        array = array.reshape(inner)
    return input_name, dtype, array


def normalize(model: LoadedModel, req: Req) -> Optional[Err]:
    """Check ``req`` against ``model``'s configuration; on success set
    ``req.batch_size`` and ``req.model_inputs`` and return None, else the
    ``INVALID_ARG`` error (stage ``"validation"``)."""
    problem = _check_names(model, req)
    if problem is not None:
        return problem
    batch = _batch_size(model, req)
    if isinstance(batch, Err):
        return batch
    checked_inputs = {}
    for tensor in _core_order(req):
        checked = _model_input(model, req, tensor, batch)
        if isinstance(checked, Err):
            return checked
        checked_inputs[tensor[0]] = checked
    # the model sees them in the order sent
    model_inputs: List[tuple] = [checked_inputs[name] for name, _, _ in req.inputs]
    req.batch_size = batch
    req.model_inputs = model_inputs
    return None
