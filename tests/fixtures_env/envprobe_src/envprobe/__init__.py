"""A package that exists only inside the test execution environment (tests/test_env.py).

The test model imports it; the project's own virtualenv does not have it, so an answer
that uses it proves the model ran in the packed env.
"""

import sys

MARKER = "envprobe-0.1.0"


def scale(values):
    """``values`` (numpy FP32 [N, K]) times 3, as FP32."""
    import numpy as np

    return (np.asarray(values, dtype=np.float32) * 3).astype(np.float32)


def describe() -> str:
    """``"<MARKER> on Python X.Y.Z"``."""
    return f"{MARKER} on Python {sys.version.split()[0]}"
