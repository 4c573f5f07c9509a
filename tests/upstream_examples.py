"""python_backend's own examples (a checkout named by ``ORCHESTRATOR_PYTHON_BACKEND_SRC``,
never committed), laid out in a model repository as their READMEs say. ``pytorch``, which
the BLS examples call, needs torch; :data:`PYTORCH_STANDIN` is a numpy model with its
configuration and answers (OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Dict, Tuple

import pytest

UPSTREAM = os.environ.get("ORCHESTRATOR_PYTHON_BACKEND_SRC", "")

needs_upstream = pytest.mark.skipif(
    not UPSTREAM or not (Path(UPSTREAM) / "examples" / "add_sub").is_dir(),
    reason="set ORCHESTRATOR_PYTHON_BACKEND_SRC to a triton-inference-server/python_backend checkout (r24.10) "
           "to run its examples",
)

#: model name -> (model.py, config.pbtxt or None) under examples/, as the READMEs copy them
LAYOUT: Dict[str, Tuple[str, "str | None"]] = {
    "add_sub": ("add_sub/model.py", "add_sub/config.pbtxt"),
    "nobatch_auto_complete": ("auto_complete/nobatch_model.py", None),
    "batch_auto_complete": ("auto_complete/batch_model.py", None),
    "bls_sync": ("bls/sync_model.py", "bls/sync_config.pbtxt"),
    "bls_async": ("bls/async_model.py", "bls/async_config.pbtxt"),
    "custom_metrics": ("custom_metrics/model.py", "custom_metrics/config.pbtxt"),
    "repeat_int32": ("decoupled/repeat_model.py", "decoupled/repeat_config.pbtxt"),
    "square_int32": ("decoupled/square_model.py", "decoupled/square_config.pbtxt"),
    "bls_decoupled_sync": ("bls_decoupled/sync_model.py", "bls_decoupled/sync_config.pbtxt"),
    "bls_decoupled_async": ("bls_decoupled/async_model.py", "bls_decoupled/async_config.pbtxt"),
    "resnet50": ("instance_kind/model.py", "instance_kind/config.pbtxt"),  # examples/instance_kind
}

PYTORCH_STANDIN = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", (a + b).astype(np.float32)),
                                                   pb_utils.Tensor("OUTPUT1", (a - b).astype(np.float32))]))
        return out
'''


def upstream_repository(where: Path, names=None, pytorch_standin: bool = True) -> Path:
    """A model repository at ``where`` with upstream's example models (``names``: all)."""
    examples = Path(UPSTREAM) / "examples"
    for name, (model_py, config) in LAYOUT.items():
        if names is not None and name not in names:
            continue
        (where / name / "1").mkdir(parents=True)
        shutil.copy(examples / model_py, where / name / "1" / "model.py")
        if config is not None:
            shutil.copy(examples / config, where / name / "config.pbtxt")
    if pytorch_standin:
        (where / "pytorch" / "1").mkdir(parents=True)
        shutil.copy(examples / "pytorch" / "config.pbtxt", where / "pytorch" / "config.pbtxt")
        (where / "pytorch" / "1" / "model.py").write_text(PYTORCH_STANDIN, encoding="utf-8")
    return where
