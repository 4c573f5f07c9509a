"""What the running python_backend offers beyond r24.10 (Triton 2.51), found out at load.

The router runs on Triton 2.51 and on newer releases; newer ones add features that serve
routing. Each is detected in the running stub, never assumed from a version number
(docs/reference/compatibility.md "Releases" has the table):

* CPU outputs of BLS calls (:func:`cpu_outputs`, in every release the router supports):
  ``PreferredMemory(TRITONSERVER_MEMORY_CPU, 0)`` makes python_backend allocate a BLS
  response's outputs in CPU memory (r24.10 ``request_executor.cc`` ``ResponseAlloc``); without
  it a ``KIND_GPU`` model's outputs stay in GPU memory and ``as_numpy()`` raises
  "Tensor is stored in GPU and cannot be converted to NumPy." (``pb_tensor.cc``).
* Response parameters (python_backend r25.02, PR #394): ``InferenceResponse(...,
  parameters={...})`` sends KServe v2 response ``parameters``; :func:`has_response_parameters`
  asks the stub's constructor, :func:`route_parameters` says what the router puts there.
* ``is_ready()`` (python_backend r26.03, PR #430): the model's own readiness hook, called by
  the server's readiness check when the model class defines it; an older stub never calls it,
  so the router defines it in every release (``router.TritonPythonModel.is_ready``).
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Sequence, Union

#: A KServe v2 response parameter value as python_backend takes it (bool, int or str).
ParamValue = Union[bool, int, str]


def cpu_outputs(pb: Any) -> Any:
    """The ``pb_utils.PreferredMemory`` that asks for a BLS response's outputs in CPU memory
    (device 0), for ``InferenceRequest(preferred_memory=...)``."""
    return pb.PreferredMemory(pb.TRITONSERVER_MEMORY_CPU, 0)


def has_response_parameters(pb: Any) -> bool:
    """True when ``pb.InferenceResponse`` takes ``parameters=`` (python_backend r25.02 and
    later); the r24.10 stub's constructor refuses the argument with pybind's TypeError."""
    try:
        pb.InferenceResponse(output_tensors=[], parameters={})
    except TypeError:
        return False
    return True


def route_parameters(routes: Sequence[str]) -> Dict[str, ParamValue]:
    """The KServe v2 response parameters of one request's answer (its ``ROUTE`` values, one
    per text, in order).

    Keys: ``route`` (str): the route when every text took the same one, else the JSON array
    of the routes, one per text; and only when some text has them: ``degraded`` (True: a
    text answered by a ``:degraded`` route), ``deadline`` (True: a text answered by an
    earlier stage because of the request's deadline, ``:deadline``), ``windows_used`` and
    ``windows_made`` (int: summed over the texts whose chunked route says
    ``:windows=<used>/<made>``, i.e. a text settled before its last window).
    """
    out: Dict[str, ParamValue] = {}
    distinct = list(dict.fromkeys(routes))
    out["route"] = distinct[0] if len(distinct) == 1 else json.dumps(list(routes))
    parts: List[str] = [p for r in routes for p in r.split(":")]
    if "degraded" in parts:
        out["degraded"] = True
    if "deadline" in parts:
        out["deadline"] = True
    used = made = 0
    counted = False
    for part in parts:
        if part.startswith("windows="):
            u, _, m = part[len("windows="):].partition("/")
            if u.isdigit() and m.isdigit():
                used, made, counted = used + int(u), made + int(m), True
    if counted:
        out["windows_used"], out["windows_made"] = used, made
    return out
