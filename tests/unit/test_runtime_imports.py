"""What the Python models import inside Triton's stub: the router's, tokenizer's and
postprocess's modules load numpy, PyYAML and ``tokenizers`` (and the standard library), never
``transformers`` (seconds per stub start, and torch where it is installed), torch,
onnxruntime, tritonclient or pytriton. Checked in a fresh interpreter, with Triton's own
``triton_python_backend_utils.py`` as the stub provides it (the mock's helpers where it is absent)."""

from __future__ import annotations

import json
import subprocess
import sys

from orchestrator.testing.mock import pb_helpers
from tests.helpers import REPO, ROOT
from tests.real_pb_utils import real_pb_utils_path

#: The repository's ``model.py`` adapters of the models that must stay lean.
LEAN_MODELS = ("router", "tokenizer", "postprocess")
FORBIDDEN = ("transformers", "torch", "onnxruntime", "tritonclient", "pytriton")

PROBE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("triton_python_backend_utils", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.modules["triton_python_backend_utils"] = module
for i, path in enumerate(sys.argv[2:]):  # as the stub does: each model.py by its path
    spec = importlib.util.spec_from_file_location(f"model_{i}", path)
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    assert hasattr(model, "TritonPythonModel"), path
print(json.dumps(sorted(sys.modules)))
"""


def test_the_router_tokenizer_and_postprocess_modules_import_no_heavy_package():
    # Triton's own file where installed, else the mock's helpers (the same pure-Python module)
    pb_utils_file = str(real_pb_utils_path() or pb_helpers.__file__)
    paths = [str(REPO / name / "1" / "model.py") for name in LEAN_MODELS]
    out = subprocess.run([sys.executable, "-c", PROBE, pb_utils_file, *paths], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    heavy = sorted(m for m in loaded if m.split(".")[0] in FORBIDDEN)
    assert not heavy, f"the lean models' modules imported {heavy}"
    tops = {m.split(".")[0] for m in loaded}
    assert {"numpy", "tokenizers", "orchestrator"} <= tops
