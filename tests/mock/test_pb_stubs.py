"""The shipped type stubs for ``triton_python_backend_utils``: they name what the module
exposes (the mock's module, itself checked against Triton's file and pb_stub.cc's list), and
``mypy --strict`` passes on fully annotated models (the example repository's) and on
upstream's add_sub and BLS examples (``ORCHESTRATOR_PYTHON_BACKEND_SRC``)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.testing.mock import install
from tests.helpers import ROOT

STUB = ROOT / "triton_python_backend_utils-stubs" / "__init__.pyi"
EXAMPLE_MODELS = ROOT / "examples" / "test-your-python-models" / "model_repository"
UPSTREAM = os.environ.get("ORCHESTRATOR_PYTHON_BACKEND_SRC", "")
# upstream's examples leave their functions unannotated: everything else of --strict applies
# (--check-untyped-defs checks their bodies against the stubs)
UNANNOTATED = ("--allow-untyped-defs", "--allow-incomplete-defs")


def _stub_names() -> set:
    tree = ast.parse(STUB.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


def test_the_stubs_name_exactly_what_the_module_exposes():
    module = install()
    exposed = {n for n in vars(module) if not n.startswith("_")}
    assert _stub_names() == exposed


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory) -> Path:
    """One mypy cache for the module's runs (numpy's stubs are read once, seconds saved)."""
    return tmp_path_factory.mktemp("mypy_cache")


def _mypy(tmp_path: Path, files: dict, *flags: str, cache: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("mypy", reason="mypy is not installed (the test extra)")
    stubs = tmp_path / "stubs" / "triton_python_backend_utils"
    stubs.mkdir(parents=True)
    shutil.copy(STUB, stubs / "__init__.pyi")  # as the installed -stubs package provides it
    sources = tmp_path / "src"
    sources.mkdir()
    for name, path in files.items():  # every model is model.py: give each its own module name
        shutil.copy(path, sources / f"{name}.py")
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n", encoding="utf-8")
    env = dict(os.environ, MYPYPATH=str(tmp_path / "stubs"))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", str(config), "--cache-dir",
         str(cache), "--ignore-missing-imports", *flags, *[str(p) for p in sorted(sources.iterdir())]],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )


def test_mypy_strict_passes_on_the_example_models_and_finds_a_wrong_use_of_pb_utils(tmp_path, mypy_cache):
    files = {f"{d.name}_model": d / "1" / "model.py" for d in sorted(EXAMPLE_MODELS.iterdir())}
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import triton_python_backend_utils as pb_utils\n"
        "def f(request: pb_utils.InferenceRequest) -> None:\n"
        "    pb_utils.Tensor('X', [1, 2])\n"  # a list, not an ndarray
        "    request.exec(decoupled=True).output_tensors()\n",  # an iterator of responses
        encoding="utf-8",
    )
    result = _mypy(tmp_path, {**files, "bad": bad}, cache=mypy_cache)
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert all(line.startswith("src/bad.py:") for line in errors), result.stdout  # the examples are clean
    assert any('Argument 2 to "Tensor" has incompatible type "list[int]"' in line for line in errors), result.stdout
    assert any('"_ResponseIterator" has no attribute "output_tensors"' in line for line in errors), result.stdout


@pytest.mark.skipif(not UPSTREAM, reason="set ORCHESTRATOR_PYTHON_BACKEND_SRC to a triton-inference-server/python_backend "
                    "checkout (r24.10) to type-check its examples")
def test_mypy_strict_passes_on_upstream_add_sub_and_bls(tmp_path, mypy_cache):
    examples = Path(UPSTREAM) / "examples"
    files = {"add_sub": examples / "add_sub" / "model.py", "bls_sync": examples / "bls" / "sync_model.py",
             "bls_async": examples / "bls" / "async_model.py"}
    result = _mypy(tmp_path, files, *UNANNOTATED, cache=mypy_cache)
    assert result.returncode == 0, result.stdout + result.stderr
