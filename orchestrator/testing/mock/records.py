"""What the mock server passes around: requests as Triton holds them, results, and the
record of each ``execute()`` call."""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Union

import numpy as np

from orchestrator.testing.mock.errors import ErrorCode, InferError


class Call(NamedTuple):
    """One ``execute()`` call: the model and the batch size of each request in it
    (the first dimension; 1 for models with ``max_batch_size: 0``).

    Compares equal to a plain tuple: ``Call("add_one", (2, 1)) == ("add_one", (2, 1))``.
    """

    model: str
    batch_sizes: tuple

    @property
    def requests(self) -> int:
        """How many requests the call got."""
        return len(self.batch_sizes)


class Req:
    """A request inside the server (already converted to what Triton would hold).

    ``inputs``: ``[(name, protocol datatype, array)]`` as sent; ``model_inputs``: the
    same after validation (reshaped where the config says ``reshape``); ``batch_size``:
    the first dimension for batching models, else 0 (set by validation).
    """

    __slots__ = (
        "inputs", "requested", "parameters", "request_id", "correlation_id", "flags",
        "timeout", "batch_size", "model_inputs",
    )

    def __init__(
        self,
        inputs: List[tuple],
        requested: Optional[List[str]],
        parameters: dict,
        request_id: str = "",
        correlation_id: Union[int, str] = 0,
        flags: int = 0,
        timeout: int = 0,
    ):
        self.inputs = inputs
        self.requested = requested or None
        self.parameters = parameters
        self.request_id = request_id
        self.correlation_id = correlation_id
        self.flags = flags
        self.timeout = timeout
        self.batch_size = 0
        self.model_inputs: List[tuple] = []

    def input_dict(self) -> Dict[str, np.ndarray]:
        return {name: array for name, _, array in self.inputs}

    def derived(self, inputs: List[tuple], requested: Optional[List[str]]) -> "Req":
        """A request with the same parameters, id, correlation id, flags and timeout
        (what an ensemble sends to a composing model)."""
        return Req(
            inputs, requested, dict(self.parameters), self.request_id, self.correlation_id,
            self.flags, self.timeout,
        )


class Ok(NamedTuple):
    outputs: List[tuple]  # [(name, protocol dtype, array)]


class Err(NamedTuple):
    """An error result. ``stage``: ``"notready"`` (no such model), ``"validation"``
    (the core refused the request) or ``"exec"`` (the model or a fault failed it); BLS
    callers see the first two behind a "Model <name> - Error when running inference: "
    prefix."""

    message: str
    code: ErrorCode
    stage: str


Result = Union[Ok, Err]


def to_client(result: Result) -> Union[Dict[str, np.ndarray], InferError]:
    """What a client gets: name -> array, or the error response."""
    if isinstance(result, Err):
        return InferError(result.message, result.code.name)
    return {name: array for name, _, array in result.outputs}


class BatchFailure(Exception):
    """The whole ``execute()`` failed (every request of the batch gets ``message``)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message
