"""orchestrator.tooling.production: the image's conditions for a local server."""

from __future__ import annotations

from pathlib import Path

from orchestrator.runtime.bls.control import ServerOptions
from orchestrator.tooling import production


def test_restricted_args_are_the_images_two_flags_and_the_router_reads_them():
    args = production.restricted_args("K")
    groups = "model-repository,model-config,shared-memory,statistics,trace,logging"
    assert args == [f"--http-restricted-api={groups}:admin-key=K", f"--grpc-restricted-protocol={groups}:admin-key=K"]
    options = ServerOptions.parse(["tritonserver", *args], Path("/"))
    assert options.header("grpc") == ("triton-grpc-protocol-admin-key", "K") and options.header("http", "model-config") == ("admin-key", "K")
    assert len(production.new_key()) == 32 and production.new_key() != production.new_key()


def test_freeze_compiles_and_sets_read_only_modes(tmp_path):
    model = tmp_path / "repo" / "m" / "1"
    model.mkdir(parents=True)
    (model / "model.py").write_text("X = 1\n")
    production.freeze(tmp_path / "repo")
    assert list((model / "__pycache__").glob("model.cpython-*.pyc"))
    for path in [model, model / "model.py", tmp_path / "repo"]:
        assert not path.stat().st_mode & 0o222, path
    production.thaw(tmp_path / "repo")
    (model / "new").write_text("")  # writable again (and deletable by pytest)
    production.thaw(tmp_path / "absent")  # no-op
