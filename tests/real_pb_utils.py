"""Triton's own ``triton_python_backend_utils.py`` where one is installed: the file the
``nvidia-pytriton`` wheel carries (Triton 2.51, r24.10), or ``$MOCK_TRITON_PB_UTILS``. Tests
compare the mock's helpers with it and skip without it."""

from __future__ import annotations

import importlib.util
import os
import types
from pathlib import Path
from typing import Optional

_loaded: Optional[types.ModuleType] = None


def real_pb_utils_path() -> Optional[Path]:
    """The path of Triton's file, or None when none is installed."""
    env = os.environ.get("MOCK_TRITON_PB_UTILS")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("pytriton")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "tritonserver" / "backends" / "python" / "triton_python_backend_utils.py"
        if candidate.is_file():
            return candidate
    return None


def real_pb_utils() -> Optional[types.ModuleType]:
    """Triton's file as a module of its own (never put in ``sys.modules``), or None."""
    global _loaded
    path = real_pb_utils_path()
    if path is None:
        return None
    if _loaded is None:
        spec = importlib.util.spec_from_file_location("_real_triton_python_backend_utils", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _loaded = module
    return _loaded
