"""Names, paths and errors shared by the :mod:`orchestrator.tooling.env` modules.

The file names and the ``$$TRITON_MODEL_DIRECTORY`` keyword are python_backend's (r24.10:
``src/stub_launcher.cc``, ``src/python_be.cc``); the paths are this checkout's
(:data:`orchestrator.tooling.paths.PROJECT_ROOT`).
"""

from __future__ import annotations

import re
from typing import Sequence

from orchestrator.tooling.errors import ToolingError
from orchestrator.tooling.paths import PROJECT_ROOT

__all__ = [
    "EnvError",
    "ENV_TARBALL_NAME",
    "MODEL_DIR_KEYWORD",
    "ENV_PATH_PARAMETER",
    "ENV_PATH_VALUE",
    "STUB_NAME",
    "ENV_CONFIG_NAME",
    "EMBEDDED_TRITON_RELEASE",
    "ENV_SPEC_DIR",
    "STUB_OUT_DIR",
    "STUB_BUILD_SCRIPT",
    "DEFAULT_ENV_OUTPUT",
    "DEFAULT_IMPORTS",
    "parse_version",
    "version_text",
]

#: File name of the packed env inside a model directory.
ENV_TARBALL_NAME = "triton_env.tar.gz"
#: Triton's keyword for the model directory inside ``EXECUTION_ENV_PATH`` (python_be.cc).
MODEL_DIR_KEYWORD = "$$TRITON_MODEL_DIRECTORY"
#: The model-config parameter naming a model's execution environment.
ENV_PATH_PARAMETER = "EXECUTION_ENV_PATH"
#: The ``EXECUTION_ENV_PATH`` value written into ``configs/env.pbtxt``.
ENV_PATH_VALUE = f"{MODEL_DIR_KEYWORD}/{ENV_TARBALL_NAME}"
#: The stub's file name; in a model directory it replaces the backend's stub.
STUB_NAME = "triton_python_backend_stub"
#: ``--model-config-name`` of the env config variant.
ENV_CONFIG_NAME = "env"
#: The NGC/python_backend release branch of the embedded server (Triton 2.51.0).
EMBEDDED_TRITON_RELEASE = "r24.10"

ENV_SPEC_DIR = PROJECT_ROOT / "env"
STUB_OUT_DIR = PROJECT_ROOT / "stub_build" / "out"
STUB_BUILD_SCRIPT = PROJECT_ROOT / "stub_build" / "build.sh"
#: Where ``env build`` writes by default (a sidecar ``.json`` manifest goes beside it).
DEFAULT_ENV_OUTPUT = PROJECT_ROOT / ".cache" / "env" / ENV_TARBALL_NAME

#: What ``verify`` imports in a full env (the models' modules import the rest).
#: ``triton_python_backend_utils`` comes from the server's backend directory, as in the stub.
DEFAULT_IMPORTS = (
    "numpy",
    "yaml",
    "tokenizers",
    "onnxruntime",
    "tritonclient.grpc",
    "triton_python_backend_utils",
    "orchestrator.runtime.models.tokenizer",
    "orchestrator.runtime.models.onnx_classifier",
    "orchestrator.runtime.models.postprocess",
    "orchestrator.runtime.serving.router",
)


class EnvError(ToolingError):
    """Building, checking or installing an execution environment or a stub failed.

    The message names the step, the command and its output where a command failed.
    """


def parse_version(value: str | Sequence[int]) -> tuple[int, int]:
    """(major, minor) of a Python version: ``"3.12"``, ``"3.12.1"``, ``"python3.12"`` or a
    sequence such as ``sys.version_info``. Raises EnvError for anything else."""
    if not isinstance(value, str):
        return (int(value[0]), int(value[1]))
    m = re.match(r"^(?:python)?(\d+)\.(\d+)(?:\.\d+)?$", value.strip())
    if not m:
        raise EnvError(f"not a Python version: {value!r} (expected e.g. 3.12)")
    return (int(m.group(1)), int(m.group(2)))


def version_text(version: Sequence[int] | None) -> str:
    """``(3, 12)`` -> ``"3.12"``; ``"?"`` for None or an empty version."""
    return ".".join(map(str, version)) if version else "?"
