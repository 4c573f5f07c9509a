"""Serving other backends (Triton's ``onnxruntime``) beside the embedded server's Python
backend: the merged backend directory, the core library alias, the command line, the
``orchestrator serve`` options and the KIND_CPU copy of the repository. The real server
with a built backend: tests/server/test_native_backend.py."""

from __future__ import annotations

import argparse
import filecmp
import os
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2

from orchestrator.tooling import repository
from orchestrator.tooling.embedded import (
    EmbeddedServer,
    ServerError,
    extra_backends,
    prepare_backend_directory,
    prepare_core_library_alias,
)
from orchestrator.tooling.serve import add_serve_arguments, cpu_instance_copy, resolve_model_config_name
from orchestrator.tooling.server import TritonServer
from tests.helpers import REPO

GPU = model_config_pb2.ModelInstanceGroup.KIND_GPU
CPU = model_config_pb2.ModelInstanceGroup.KIND_CPU


def fake_wheel(root: Path) -> EmbeddedServer:
    """The layout of the nvidia-pytriton wheel, with placeholder files."""
    wheel = EmbeddedServer(server=root / "bin" / "tritonserver", backends=root / "backends",
                           stubs=root / "stubs", libs=root / "libs")
    (wheel.backends / "python").mkdir(parents=True)
    (wheel.backends / "python" / "libtriton_python.so").write_bytes(b"python backend")
    (wheel.stubs / "3.11").mkdir(parents=True)
    (wheel.stubs / "3.11" / "triton_python_backend_stub").write_bytes(b"stub")
    wheel.libs.mkdir()
    return wheel


def backend_dir(root: Path, *names: str) -> Path:
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / f"libtriton_{name}.so").write_bytes(name.encode())
    return root


def test_extra_backends_finds_each_backend_of_a_directory(tmp_path):
    ort = backend_dir(tmp_path / "ort", "onnxruntime")
    (ort / "not_a_backend").mkdir()  # no libtriton_not_a_backend.so
    other = backend_dir(tmp_path / "other", "openvino")
    assert extra_backends([ort, other]) == {"onnxruntime": ort / "onnxruntime", "openvino": other / "openvino"}
    assert extra_backends([]) == {}


@pytest.mark.parametrize("case,message", [
    ("missing", "is not a directory"),
    ("empty", "holds no backend: expected <name>/libtriton_<name>.so"),
    ("python", "holds a python backend"),
    ("twice", "backend 'onnxruntime' is in both"),
])
def test_extra_backends_refuses_what_it_cannot_serve(tmp_path, case, message):
    dirs = {
        "missing": lambda: [tmp_path / "nowhere"],
        "empty": lambda: [tmp_path / "empty"] if (tmp_path / "empty").mkdir() is None else [],
        "python": lambda: [backend_dir(tmp_path / "py", "python", "onnxruntime")],
        "twice": lambda: [backend_dir(tmp_path / "a", "onnxruntime"), backend_dir(tmp_path / "b", "onnxruntime")],
    }[case]()
    with pytest.raises(ServerError, match=message) as info:
        extra_backends(dirs)
    assert str(dirs[-1]) in str(info.value)  # names the directory


def test_backend_directory_with_an_extra_backend_is_separate_and_links_it(tmp_path):
    wheel = fake_wheel(tmp_path / "wheel")
    ort = backend_dir(tmp_path / "ort", "onnxruntime")
    plain = prepare_backend_directory(tmp_path / "cache", embedded=wheel, python_version=(3, 11))
    merged = prepare_backend_directory(tmp_path / "cache", embedded=wheel, python_version=(3, 11), backend_dirs=[ort])
    assert plain == tmp_path / "cache" / "backends" and sorted(os.listdir(plain)) == ["python"]
    assert merged.parent == plain.parent and merged.name.startswith("backends-") and merged != plain
    assert sorted(os.listdir(merged)) == ["onnxruntime", "python"]
    assert os.readlink(merged / "onnxruntime") == str(ort / "onnxruntime")
    assert (merged / "python" / "libtriton_python.so").read_bytes() == b"python backend"
    assert (merged / "python" / "triton_python_backend_stub").read_bytes() == b"stub"
    # idempotent: the same directory for the same backends
    again = prepare_backend_directory(tmp_path / "cache", embedded=wheel, python_version=(3, 11), backend_dirs=[str(ort)])
    assert again == merged


def test_core_library_alias_points_at_the_wheels_libtritonserver(tmp_path):
    wheel = fake_wheel(tmp_path / "wheel")
    with pytest.raises(ServerError, match="no libtritonserver"):
        prepare_core_library_alias(tmp_path / "cache", embedded=wheel)
    core = wheel.libs / "libtritonserver-717102f0.so"
    core.write_bytes(b"core")
    alias = prepare_core_library_alias(tmp_path / "cache", embedded=wheel) / "libtritonserver.so"
    assert alias.resolve() == core.resolve()


def test_command_serves_config_pbtxt_from_the_merged_backend_directory(tmp_path):
    wheel = fake_wheel(tmp_path / "wheel")
    srv = TritonServer(REPO, model_config_name=None, backend_dirs=[tmp_path / "ort"], cache_dir=tmp_path / "cache")
    srv._ports = {"http": 18000, "grpc": 18001, "metrics": 18002}
    cmd = srv.build_command(wheel, tmp_path / "merged")
    assert srv.backend_dirs == [tmp_path / "ort"]
    assert f"--backend-directory={tmp_path / 'merged'}" in cmd
    assert not [a for a in cmd if a.startswith("--model-config-name")]
    assert srv.startup_models == repository.list_models(REPO, None)
    assert TritonServer(REPO).backend_dirs == [] and TritonServer(REPO).model_config_name == "embedded"


@pytest.mark.parametrize("given,backends,expected", [
    (None, [], "embedded"),
    (None, ["onnxruntime"], None),
    (None, ["openvino"], "embedded"),
    ("", [], None),
    ("", ["onnxruntime"], None),
    ("embedded", ["onnxruntime"], "embedded"),
    ("gpu", [], "gpu"),
])
def test_model_config_name_defaults_to_config_pbtxt_with_the_onnxruntime_backend(given, backends, expected):
    assert resolve_model_config_name(given, backends) == expected


def test_serve_arguments():
    parser = add_serve_arguments(argparse.ArgumentParser())
    args = parser.parse_args([])
    assert (args.backend_dir, args.model_config_name, args.instance_kind_cpu) == (None, None, False)
    args = parser.parse_args(["--backend-dir", "/a", "--backend-dir=/b", "--instance-kind-cpu", "--model-config-name="])
    assert (args.backend_dir, args.model_config_name, args.instance_kind_cpu) == (["/a", "/b"], "", True)


def test_cpu_instance_copy_changes_only_the_kind(tmp_path):
    """The shipped repository: the three classifiers' config.pbtxt are KIND_GPU; in the copy
    they are KIND_CPU and otherwise the same message; every other file is byte-identical."""
    dest = tmp_path / "model_repository"
    changed = cpu_instance_copy(REPO, dest)
    assert sorted(str(p.relative_to(dest)) for p in changed) == [
        "classifier/config.pbtxt", "classifier_fast/config.pbtxt", "classifier_fp16/config.pbtxt"]
    for path in changed:
        shipped = repository.read_config(REPO / path.relative_to(dest))
        assert [g.kind for g in shipped.instance_group] == [GPU]
        copied = repository.read_config(path)
        assert [g.kind for g in copied.instance_group] == [CPU]
        shipped.instance_group[0].kind = CPU
        assert copied == shipped
    for root, _dirs, files in os.walk(REPO):
        for name in files:
            source = Path(root) / name
            target = dest / source.relative_to(REPO)
            assert target.exists(), target
            if target not in changed:
                assert filecmp.cmp(source, target, shallow=False), target
    with pytest.raises(FileExistsError):
        cpu_instance_copy(REPO, dest)  # never into an existing directory


def test_start_merges_the_backend_dirs_and_puts_the_core_alias_on_the_library_path(tmp_path, monkeypatch):
    """What start() hands the process, without starting one: the merged backend directory in
    the command, the libtritonserver.so alias first on LD_LIBRARY_PATH."""
    from orchestrator.tooling import server as server_module

    wheel = fake_wheel(tmp_path / "wheel")
    (wheel.libs / "libtritonserver-717102f0.so").write_bytes(b"core")
    ort = backend_dir(tmp_path / "ort", "onnxruntime")
    seen = {}
    monkeypatch.setattr(server_module, "find_embedded_server", lambda: wheel)
    monkeypatch.setattr(TritonServer, "_spawn", lambda self, env: seen.update(env=env, command=list(self.command)))
    monkeypatch.setattr(TritonServer, "_wait_ready", lambda self: None)
    srv = TritonServer(REPO, model_config_name=None, backend_dirs=[ort], cache_dir=tmp_path / "cache")
    srv.start()
    [flag] = [a for a in seen["command"] if a.startswith("--backend-directory=")]
    merged = Path(flag.split("=", 1)[1])
    assert os.readlink(merged / "onnxruntime") == str(ort / "onnxruntime")
    first = seen["env"]["LD_LIBRARY_PATH"].split(os.pathsep)[0]
    assert (Path(first) / "libtritonserver.so").resolve() == (wheel.libs / "libtritonserver-717102f0.so").resolve()
    plain = TritonServer(REPO, cache_dir=tmp_path / "cache")
    plain.start()  # without backend_dirs: the plain directory, no alias
    assert f"--backend-directory={tmp_path / 'cache' / 'backends'}" in seen["command"]
    assert not (Path(seen["env"]["LD_LIBRARY_PATH"].split(os.pathsep)[0]) / "libtritonserver.so").exists()
