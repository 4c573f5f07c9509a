"""Release profiles: which python_backend features the mock's ``pb_utils`` has.

``MockTriton(release=...)`` (or the environment variable ``MOCK_TRITON_RELEASE``) picks one;
the default is ``24.10`` (Triton 2.51, the release the embedded server runs). Each feature is
named after the python_backend release branch that added it (read in its sources):

* ``response_parameters`` -- r25.02, python_backend PR #394: ``pb_utils.InferenceResponse(
  output_tensors, error=None, parameters=None)`` and ``InferenceResponse.parameters()`` (a
  JSON string); the values must be ``bool``/``int``/``str``. Before r25.02 the stub's
  constructor has no ``parameters`` argument and pybind refuses it with a ``TypeError``.
* ``is_ready`` -- r26.03, python_backend PR #430: when the model class defines
  ``is_ready()`` (sync or ``async``), the server's readiness check of the model calls it;
  anything but a ``bool``, or an exception, reports the model not ready. Before r26.03 the
  method is never called.
"""

from __future__ import annotations

import os
from typing import Dict, FrozenSet

#: The environment variable that sets the default profile.
ENV = "MOCK_TRITON_RELEASE"

RESPONSE_PARAMETERS = "response_parameters"
IS_READY = "is_ready"

#: Release (NGC container name) -> the features the mock gives its pb_utils.
PROFILES: Dict[str, FrozenSet[str]] = {
    "24.10": frozenset(),
    "26.08": frozenset({RESPONSE_PARAMETERS, IS_READY}),
}
#: Triton server versions accepted as names of the profiles above.
ALIASES = {"2.51": "24.10"}
DEFAULT = "24.10"


def resolve(release: "str | None") -> str:
    """The profile name for ``release`` (None: ``$MOCK_TRITON_RELEASE``, else the default).

    Raises ValueError naming the known profiles for any other value.
    """
    value = release if release is not None else os.environ.get(ENV, "") or DEFAULT
    value = ALIASES.get(value, value)
    if value not in PROFILES:
        known = sorted(PROFILES) + sorted(ALIASES)
        raise ValueError(f"unknown mock release {value!r} (MockTriton(release=...)/{ENV}): use one of {known}")
    return value
