"""``env verify``: check a packed or unpacked env the way the Python-backend stub will run it.

Errors are :class:`~orchestrator.tooling.env.common.EnvError`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from orchestrator.tooling.embedded import ServerError, find_embedded_server
from orchestrator.tooling.env.checks import check_env
from orchestrator.tooling.env.common import DEFAULT_IMPORTS, EnvError
from orchestrator.tooling.env.inspection import inspect_env
from orchestrator.tooling.env.stubs import StubInfo, embedded_library_path, embedded_stub, inspect_stub

__all__ = ["VerifyReport", "verify_env"]


_PROBE_ENV = r"""
import importlib, json, sys
sys.path.append(sys.argv[1]) if sys.argv[1] else None
out = {"version": list(sys.version_info[:3]), "executable": sys.executable, "prefix": sys.prefix,
       "isolated": sys.flags.isolated, "imports": {}}
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
        out["imports"][name] = None
    except BaseException as exc:
        out["imports"][name] = f"{type(exc).__name__}: {exc}"
try:
    import numpy
    out["numpy"] = numpy.__version__
except BaseException:
    out["numpy"] = None
print("PROBE" + json.dumps(out))
"""


@dataclass
class VerifyReport:
    """Result of :func:`verify_env`: the interpreter the activated env runs (``python``:
    ``"3.12.1"``, ``executable``), ``numpy`` version, ``imports`` ({module: None or the
    error}), ``stub`` (:class:`StubInfo`) and ``problems`` (sentences; empty = good)."""

    python: str
    executable: str
    numpy: str | None
    imports: dict[str, str | None]
    stub: StubInfo | None
    problems: list[str]


def verify_env(
    env_path: str | os.PathLike,
    *,
    stub: str | os.PathLike | None = None,
    imports: Sequence[str] | None = None,
    backend_python_dir: str | os.PathLike | None = None,
    ld_library_path: Sequence[str] | None = None,
    raise_on_problems: bool = True,
) -> VerifyReport:
    """Check a packed or unpacked env the way the Python-backend stub will use it.

    Unpacks a tarball into a temp dir, then runs ``bash -c "source <env>/bin/activate &&
    exec env LD_LIBRARY_PATH=<env>/lib:... python3 -I -c PROBE"`` (stub_launcher.cc's
    command with ``python3`` in place of the stub; ``-I`` because the stub's interpreter is
    isolated) with the server's ``backends/python`` on ``sys.path`` (so
    ``triton_python_backend_utils`` imports, as in the stub). Checks: that ``python3`` is the
    env's own interpreter, its version equals the stub's libpython version, every module
    in ``imports`` imports, and the static checks of :func:`orchestrator.tooling.env.checks.check_env`
    (libpython resolvable by ``ldd``, numpy vs the stub, GLIBCXX, ``bin/activate``).
    ``stub``: default the embedded server's stub for the env's Python version.
    Returns a :class:`VerifyReport`; raises EnvError listing every problem unless
    ``raise_on_problems`` is False.
    """
    env_path = Path(env_path)
    imports = list(DEFAULT_IMPORTS if imports is None else imports)
    if backend_python_dir is None:
        try:
            backend_python_dir = find_embedded_server().backends / "python"
        except ServerError:
            backend_python_dir = ""
    lib_path = list(ld_library_path) if ld_library_path is not None else embedded_library_path()
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="verify-env-") as tmp:
        root = env_path
        if env_path.is_file():
            root = Path(tmp) / "env"
            root.mkdir()
            try:
                with tarfile.open(env_path, "r:*") as tar:
                    # "tar" filter: venv-pack keeps bin/python as an absolute symlink to the
                    # base interpreter, which the stricter "data" filter refuses.
                    kwargs = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
                    tar.extractall(root, **kwargs)
            except (tarfile.TarError, OSError) as exc:
                raise EnvError(f"cannot unpack {env_path}: {exc}") from exc
        info = dataclasses.replace(inspect_env(root), path=env_path)
        if info.python_version is None:
            raise EnvError(f"{env_path}: cannot tell the env's Python version (no pyvenv.cfg, conda-meta or lib/python3.X)")
        stub_path = Path(stub) if stub else embedded_stub(info.python_version)
        stub_info = inspect_stub(stub_path)
        problems += [f.message for f in check_env(info, stub_info, server_ld_path=lib_path, lib_dir=root / "lib") if f.is_problem]
        command = (
            f"source {shlex.quote(str(root / 'bin' / 'activate'))} && exec env "
            f"LD_LIBRARY_PATH={shlex.quote(str(root / 'lib'))}:\"$LD_LIBRARY_PATH\" python3 -I -c {shlex.quote(_PROBE_ENV)} "
            + " ".join(shlex.quote(x) for x in [str(backend_python_dir), *imports])
        )
        run_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        run_env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_path)
        proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=run_env, timeout=600)
        probe = next((json.loads(line[5:]) for line in proc.stdout.splitlines() if line.startswith("PROBE")), None)
        if probe is None:
            raise EnvError(
                f"{env_path}: the activated env's python3 did not run (exit {proc.returncode}):\n"
                f"{(proc.stderr or proc.stdout).strip()[-3000:]}"
            )
        version = tuple(probe["version"])
        if not os.path.realpath(probe["prefix"]).startswith(os.path.realpath(root)):
            problems.append(
                f"after `source bin/activate`, python3 runs from {probe['prefix']}, not from the env: "
                "its bin/python3 is missing or not first on PATH"
            )
        if stub_info.python_version and version[:2] != stub_info.python_version:
            problems.append(
                f"the env's interpreter is Python {'.'.join(map(str, version))} but the stub {stub_path} links "
                f"{stub_info.libpython}: use the stub for {version[0]}.{version[1]} (make stub PYTHON={version[0]}.{version[1]})"
            )
        for name, error in probe["imports"].items():
            if error:
                problems.append(f"`import {name}` fails in the env: {error}")
    report = VerifyReport(
        python=".".join(map(str, version)),
        executable=probe["executable"],
        numpy=probe.get("numpy"),
        imports=probe["imports"],
        stub=stub_info,
        problems=problems,
    )
    if problems and raise_on_problems:
        raise EnvError(f"{env_path} failed verification:\n" + "\n".join(f"  - {p}" for p in problems))
    return report
