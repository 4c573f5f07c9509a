"""``make gpu-check`` (lab.gpu_check): on a machine without a GPU it runs end
to end with the outcome "no GPU: not run" (exit 0, result file under .cache/ by default); the
parts a GPU run uses (nvidia-smi parsing, the KIND_GPU repository, the comparison) checked
without one."""

from __future__ import annotations

import json
import subprocess

import numpy as np

from lab import gpu_check
from orchestrator.tooling import repository
from tests.helpers import REPO


def test_no_gpu_runs_end_to_end_and_says_not_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check.shutil, "which", lambda name: None)
    assert gpu_check.main(["--out", str(tmp_path / "gc")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("gpu-check: no GPU: not run (nvidia-smi not found);")
    result = json.loads((tmp_path / "gc" / "result.json").read_text())
    assert result["outcome"] == "no-gpu" and result["gpus"] == [] and "nvidia-smi not found" in result["message"]
    assert gpu_check.DEFAULT_OUT.parts[-2:] == (".cache", "gpu_check")


def test_nvidia_smi_is_read(monkeypatch):
    monkeypatch.setattr(gpu_check.shutil, "which", lambda name: "/usr/bin/nvidia-smi")

    def fake(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 0, stdout="0, NVIDIA H100 80GB HBM3, 81559, 1024\n", stderr="")

    assert gpu_check.gpus(fake) == ([{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559.0,
                                      "memory_used_mib": 1024.0}], "")

    def failing(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 9, stdout="", stderr="NVIDIA-SMI has failed because it couldn't communicate")

    found, why = gpu_check.gpus(failing)
    assert found == [] and why.startswith("nvidia-smi failed: NVIDIA-SMI has failed")


def test_gpu_repository_sets_kind_gpu_on_the_embedded_classifiers_only(tmp_path):
    repo = gpu_check.gpu_repository(tmp_path / "r", REPO, native=False)
    for name in gpu_check.CLASSIFIERS:
        config = repository.read_config(repo / name / "configs" / "embedded.pbtxt")
        assert [g.kind for g in config.instance_group] == [config.instance_group[0].KIND_GPU]
    assert (repo / "router" / "config.pbtxt").read_text() == (REPO / "router" / "config.pbtxt").read_text()
    native = gpu_check.gpu_repository(tmp_path / "n", REPO, native=True)
    assert (native / "classifier" / "configs" / "embedded.pbtxt").read_text() == \
        (REPO / "classifier" / "configs" / "embedded.pbtxt").read_text()


def test_compare_flags_differences_beyond_tolerance():
    cpu = {m: {"probabilities": np.array([0.1, 0.9]), "verdicts": np.array([False, True]), "routes": ["a", "b"]}
           for m in gpu_check.MODELS}
    gpu = {m: {"probabilities": np.array([0.1, 0.9 + 1e-5]), "verdicts": np.array([False, True]), "routes": ["a", "b"]}
           for m in gpu_check.MODELS}
    assert all(c["within_tolerance"] for c in gpu_check.compare(cpu, gpu, 1e-3).values())
    gpu["router"] = {"probabilities": np.array([0.6, 0.9]), "verdicts": np.array([True, True]), "routes": ["x", "b"]}
    got = gpu_check.compare(cpu, gpu, 1e-3)["router"]
    assert got["verdicts_differ"] == 1 and got["routes_differ"] == 1 and not got["within_tolerance"]


def test_gpu_outputs_replace_the_classifiers_models_with_the_gpu_adapter(tmp_path):
    repo = gpu_check.gpu_repository(tmp_path / "r", REPO, native=False, gpu_outputs=True)
    for name in gpu_check.CLASSIFIERS:
        assert (repo / name / "1" / "model.py").read_text() == gpu_check.GPU_OUTPUT_ADAPTER
        assert (repo / name / "1" / "model.onnx").is_file()
    # the adapter names a class that exists, built on the embedded classifier
    source = (REPO.parent / "lab" / "gpu_models.py").read_text()
    assert "class GpuOutputClassifier(OnnxClassifier)" in source and "GpuOutputClassifier" in gpu_check.GPU_OUTPUT_ADAPTER
    for name in ("router", "tokenizer", "postprocess"):
        assert (repo / name / "1" / "model.py").read_text() == (REPO / name / "1" / "model.py").read_text()
    import pytest

    with pytest.raises(ValueError, match="native backend answers in GPU memory itself"):
        gpu_check.gpu_repository(tmp_path / "n", REPO, native=True, gpu_outputs=True)


def test_probe_repository_configs_parse_and_name_the_gpu_models(tmp_path):
    repo = gpu_check.probe_repository(tmp_path / "p")
    echo = repository.read_config(repo / "gpu_echo" / "config.pbtxt")
    caller = repository.read_config(repo / "bls_caller" / "config.pbtxt")
    assert [g.kind for g in echo.instance_group] == [echo.instance_group[0].KIND_GPU]
    assert [g.kind for g in caller.instance_group] == [caller.instance_group[0].KIND_CPU]
    assert [i.name for i in caller.input] == ["X", "ASK_CPU"] and [o.name for o in echo.output] == ["Y"]
    assert "import GpuEcho as TritonPythonModel" in (repo / "gpu_echo" / "1" / "model.py").read_text()
    assert "import BlsCaller as TritonPythonModel" in (repo / "bls_caller" / "1" / "model.py").read_text()
