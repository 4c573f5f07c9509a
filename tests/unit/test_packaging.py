"""What ``pip install triton-orchestrator`` installs: the wheel holds the package and no lab code
(benchmarks, soak, profiler, mutations, preflight, training), and with no extra the models'
modules load none of the heavy packages the tools need."""

import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: What the router's, the tokenizer's and the postprocess' model.py import (model_repository/*/1/model.py).
MODEL_MODULES = ("orchestrator.runtime.serving.router", "orchestrator.runtime.models.tokenizer", "orchestrator.runtime.models.postprocess")
#: Packages of the extras that a model module must not load on the base install.
HEAVY = ("transformers", "torch", "onnxruntime", "tritonclient", "pytriton")


def _source_copy(dest: Path) -> Path:
    """The checkout's tracked and untracked, not ignored files in ``dest`` (a build there
    leaves no build/ or egg-info in the checkout)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True, capture_output=True,
                           text=True).stdout.splitlines()
    for name in files:
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel ``pip wheel .`` builds from this checkout (offline, no build isolation)."""
    src = _source_copy(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(out),
                           str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (path,) = out.glob("triton_orchestrator-*.whl")
    return path


def test_the_wheel_holds_the_package_and_no_lab_code(wheel):
    with zipfile.ZipFile(wheel) as zf:
        files = zf.namelist()
    modules = [n for n in files if n.endswith(".py")]
    assert "orchestrator/runtime/serving/router.py" in modules
    assert "orchestrator/runtime/models/tokenizer.py" in modules and "orchestrator/runtime/models/postprocess.py" in modules
    assert "orchestrator/tooling/cli.py" in modules
    assert [n for n in modules if not n.startswith("orchestrator/")] == []
    lab_words = ("bench", "soak", "mutations", "profile", "preflight", "gpu_check")
    assert [n for n in modules if any(w in part for part in n.split("/") for w in lab_words)] == []
    assert not any(n.startswith(("lab/", "tests/")) for n in files)
    assert "orchestrator/tooling/frontdoor_check.lua" in files  # orchestrator frontdoor render reads it


def test_the_wheel_declares_the_runtime_and_the_extras(wheel):
    from email.parser import Parser

    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(name).decode())
    base = [r for r in meta.get_all("Requires-Dist") if "extra ==" not in r]
    assert sorted(re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in base) == ["numpy", "pyyaml", "tokenizers"]
    assert {"serve", "client", "export", "tune", "env", "test", "train"} <= set(meta.get_all("Provides-Extra"))


@pytest.mark.slow
@pytest.mark.network
def test_the_models_modules_load_no_heavy_package_on_the_base_install(tmp_path):
    """A fresh virtualenv, ``pip install .`` with no extra, then the three model modules in a
    new interpreter (Triton's ``triton_python_backend_utils`` stood in for by an empty module,
    as the stub provides it): none of transformers, torch, onnxruntime, tritonclient, pytriton
    is in ``sys.modules`` after the imports."""
    src = _source_copy(tmp_path / "src")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", str(src)], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    stub_dir = tmp_path / "stub"
    stub_dir.mkdir()
    (stub_dir / "triton_python_backend_utils.py").write_text('"""Stands in for the module Triton\'s stub provides."""\n')
    results = {}
    for module in MODEL_MODULES:
        code = textwrap.dedent(f"""
            import importlib, json, sys
            importlib.import_module({module!r})
            print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))
        """)
        # cwd and PYTHONPATH away from the checkout: the installed package is the one imported
        run = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=600, cwd=stub_dir,
                             env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(stub_dir)})
        results[module] = run.stdout.strip() if run.returncode == 0 else f"import failed: {run.stderr.strip().splitlines()[-1:]}"
    assert results == {m: "[]" for m in MODEL_MODULES}
