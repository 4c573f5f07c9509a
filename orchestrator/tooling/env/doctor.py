"""``orchestrator doctor``: will each Python model's stub run its environment?

For every Python-backend model of a repository (under ``--model-config-name``), it reports
the environment the model runs in (``EXECUTION_ENV_PATH`` or the server's own Python),
that environment's Python version, the stub Triton will start (``<model
dir>/triton_python_backend_stub`` when present, else the server's) and the libpython that
stub resolves (``ldd`` with the launcher's ``LD_LIBRARY_PATH``: the env's ``lib/`` first),
and diagnoses the failures seen with custom environments:

- ``libpython``: the stub's ``libpython3.X.so.1.0`` is not found (FIELD_NOTES: "cannot open
  shared object file" without the copied libpython);
- ``version``: the env's interpreter is another Python version than the stub's libpython
  (python_backend README, "Important Notes" 1);
- ``glibcxx``: a shared library of the env (or the stub) needs a ``GLIBCXX_*``/``CXXABI_*``
  version that the libstdc++ the stub will load does not define (the env's own
  ``lib/libstdc++.so.6``, which the launcher puts first, else the system's) (README note 7);
- ``numpy``: numpy >= 2 in the env with a stub built with pybind11 < 2.12 (all stubs of
  Triton <= r24.10, the embedded server's included). Cause, read in python_backend r24.10:
  ``triton_python_backend_utils.serialize_byte_tensor`` returns a Python ``bytes``, which
  ``src/pb_tensor.cc`` wraps as a ``py::array`` and sizes with ``nbytes()``; pybind11 2.10
  (``CMakeLists.txt``) computes that from the numpy 1.x ``PyArray_Descr`` layout, whose
  ``elsize`` offset holds the low half of numpy 2's 64-bit ``flags`` (0 for plain
  dtypes). So every output tensor leaves the stub with 0 bytes: BYTES outputs come back
  empty, numeric ones fail with "output tensor shape does not match size" (both seen
  here, ``tests/test_env.py``). r24.11 moved to pybind11 2.12 (python_backend PR #384);
  such stubs contain ``numpy._core`` (pybind11 2.12 imports it under numpy 2);
- ``env-path``: ``EXECUTION_ENV_PATH`` escapes the model directory (README note 4:
  undefined), points at a missing file, is not a gzip tar (``src/pb_env.cc`` reads only
  gzip + tar), has ``$$TRITON_MODEL_DIRECTORY`` anywhere but at its start
  (``src/python_be.cc`` replaces ``pos + len(keyword)`` characters from it, which is only
  right at position 0), or lacks ``bin/activate`` (``src/stub_launcher.cc`` requires it);
- ``base-interpreter``: a venv-pack env's base interpreter (``pyvenv.cfg`` ``home``) does
  not exist on this machine.

Exit code 0 when every Python model is healthy, 1 otherwise (warnings do not count).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from orchestrator.tooling.env.envtools import (
    MODEL_DIR_KEYWORD,
    STUB_NAME,
    EnvError,
    EnvInfo,
    StubInfo,
    cxx_versions,
    effective_config,
    embedded_library_path,
    embedded_stub,
    execution_env_path,
    inspect_env,
    inspect_stub,
    is_python_model,
    ldd,
    version_key,
    _read_elf,
    dispatcher_target,
)

__all__ = ["Finding", "ModelReport", "check_env", "diagnose", "add_doctor_arguments", "doctor_command"]

PROBLEM, WARNING, OK = "problem", "warning", "ok"


@dataclass(frozen=True)
class Finding:
    """One diagnosis: ``level`` (``problem``/``warning``/``ok``), ``kind`` (``libpython``,
    ``version``, ``glibcxx``, ``numpy``, ``env-path``, ``base-interpreter``, ``stub``) and a
    sentence that says what is wrong and how to fix it."""

    level: str
    kind: str
    message: str

    @property
    def is_problem(self) -> bool:
        return self.level == PROBLEM


@dataclass
class ModelReport:
    """The doctor's view of one Python model: its ``config`` file, ``env`` (a description),
    ``env_python`` (``"3.12"`` or ``"?"``), ``stub`` path, ``libpython`` (``"libpython3.12.so.1.0
    => /path"`` or ``"... => not found"``) and ``findings``."""

    name: str
    config: Path
    env: str
    env_python: str
    stub: str
    libpython: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not any(f.is_problem for f in self.findings)


def _v(version) -> str:
    return ".".join(map(str, version)) if version else "?"


def _libstdcxx_of(stub: StubInfo, ld_path: Sequence[str]) -> tuple[str | None, set[str]]:
    """The libstdc++ the stub resolves with ``ld_path`` and the versions it defines."""
    try:
        resolved = ldd(stub.path, list(ld_path)).get("libstdc++.so.6")
    except EnvError:
        return None, set()
    if not resolved:
        return None, set()
    elf = _read_elf(Path(resolved))
    return resolved, cxx_versions(elf.version_defs) if elf else set()


def check_numpy(numpy_version: str | None, stub: StubInfo, where: str) -> Finding | None:
    """The numpy diagnosis for ``numpy_version`` (None = absent) run by ``stub``."""
    if numpy_version is None:
        return Finding(PROBLEM, "numpy", f"numpy is not installed in {where}: triton_python_backend_utils imports it (pip install 'numpy<2')")
    try:
        major = int(numpy_version.split(".")[0])
    except ValueError:
        return None
    if major < 2:
        return None
    if stub.numpy2 is False:
        return Finding(
            PROBLEM,
            "numpy",
            f"numpy {numpy_version} in {where}, but the stub {stub.path} was built with pybind11 < 2.12 (numpy 1 only): it "
            "sizes output tensors from numpy 1's dtype layout, so every output leaves the stub with 0 bytes (BYTES outputs "
            "come back empty, numeric ones fail 'output tensor shape does not match size'). Install numpy<2 "
            "(env/requirements-*.txt pins 1.26.4) or use a stub of Triton r24.11 or later",
        )
    if stub.numpy2 is None:
        return Finding(WARNING, "numpy", f"numpy {numpy_version} in {where}; cannot tell whether {stub.path} supports numpy 2")
    return None


def check_env(
    info: EnvInfo,
    stub: StubInfo,
    *,
    server_ld_path: Sequence[str] = (),
    lib_dir: str | os.PathLike | None = None,
) -> list[Finding]:
    """Static checks of an env against the stub that will run it (nothing is executed).

    ``server_ld_path``: the server's ``LD_LIBRARY_PATH`` entries (the launcher prepends the
    env's ``lib/``); ``lib_dir``: where the env's ``lib/`` files are on disk (default
    ``<env>/lib``; for a tarball, the directory :func:`inspect_env` extracted its libs to).
    Returns findings; an ``ok`` ``libpython`` finding carries the ldd line.
    """
    findings: list[Finding] = []
    where = f"the env {info.path}"
    if not info.gzip:
        findings.append(Finding(PROBLEM, "env-path", f"{info.path} is not gzip-compressed: python_backend extracts only .tar.gz"))
    if not info.has_activate:
        findings.append(
            Finding(PROBLEM, "env-path", f"{where} has no bin/activate; the stub launcher sources it (pack with conda-pack or venv-pack)")
        )
    if info.python_version is None:
        findings.append(Finding(PROBLEM, "version", f"cannot tell the Python version of {where} (no pyvenv.cfg, conda-meta or lib/python3.X)"))
    elif stub.python_version and info.python_version != stub.python_version:
        v = _v(info.python_version)
        findings.append(
            Finding(
                PROBLEM,
                "version",
                f"{where} is Python {v} but the stub {stub.path} links {stub.libpython} (Python {_v(stub.python_version)}): "
                f"put the Python {v} stub in the model directory (make stub PYTHON={v}; orchestrator env install does it)",
            )
        )
    if stub.python_version is None:
        findings.append(Finding(PROBLEM, "stub", f"the stub {stub.path} links no libpython3.X: not a Python-backend stub"))
    lib_dir = Path(lib_dir) if lib_dir is not None else info.path / "lib"
    ld_path = [str(lib_dir), *server_ld_path]
    if stub.libpython:
        try:
            resolved = ldd(stub.path, ld_path).get(stub.libpython)
        except EnvError as exc:
            resolved = None
            findings.append(Finding(WARNING, "libpython", str(exc)))
        if resolved:
            # A tarball's libs were extracted to a temp dir: name them as the env's.
            shown = "<env>/lib/" + Path(resolved).name if Path(resolved).parent == lib_dir else resolved
            findings.append(Finding(OK, "libpython", f"{stub.libpython} => {shown}"))
        else:
            findings.append(
                Finding(
                    PROBLEM,
                    "libpython",
                    f"missing libpython: the stub needs {stub.libpython}, found neither in the env's lib/ nor on the server's "
                    f"library path: copy the base interpreter's {stub.libpython} into the env's lib/ (make env does) or "
                    f"install libpython{_v(stub.python_version)} on the server",
                )
            )
    numpy_finding = check_numpy(info.numpy_version, stub, where)
    if numpy_finding:
        findings.append(numpy_finding)
    # GLIBCXX: the stub loads one libstdc++ at start, the env's own if its lib/ has one.
    if info.libstdcxx_defs:
        provider, defs = "the env's lib/libstdc++.so.6", info.libstdcxx_defs
    else:
        resolved, defs = _libstdcxx_of(stub, list(server_ld_path))
        provider = f"the system's {resolved}" if resolved else None
    if provider and defs:
        needs = {f"stub {stub.path.name}": cxx_versions(stub.elf.version_needs), **info.cxx_needs}
        missing = {name: sorted(n - defs, key=version_key) for name, n in needs.items() if n - defs}
        if missing:
            newest = max(defs, key=version_key) if defs else "none"
            worst = sorted(missing.items(), key=lambda kv: version_key(kv[1][-1]), reverse=True)
            listed = "; ".join(f"{name} needs {', '.join(vs[-2:])}" for name, vs in worst[:3])
            more = f" (and {len(worst) - 3} more files)" if len(worst) > 3 else ""
            fix = (
                "install a newer libstdc++ into the env (conda: libstdcxx-ng>=12, as env/environment.yml does) or drop "
                "the env's lib/libstdc++.so.6 so the system's is used"
                if info.libstdcxx_defs
                else "use a server image with a newer libstdc++ or ship one in the env's lib/ (conda: libstdcxx-ng>=12)"
            )
            findings.append(
                Finding(
                    PROBLEM,
                    "glibcxx",
                    f"GLIBCXX too old: {provider} defines up to {newest}, but {listed}{more}: {fix}",
                )
            )
    if info.flavour == "venv" and info.venv_home:
        home = Path(info.venv_home)
        exe = home / f"python{_v(info.python_version)}"
        if not home.is_dir() or (info.python_version and not exe.exists()):
            findings.append(
                Finding(
                    PROBLEM,
                    "base-interpreter",
                    f"{where} is a venv whose base interpreter {exe} does not exist here: a venv-pack env needs the same "
                    "interpreter at the same path on the server (or build it with conda-pack)",
                )
            )
    return findings


class _EnvCache:
    """inspect_env results per file (by device, inode, size, mtime), libs extracted once."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.items: dict[tuple, tuple[EnvInfo, Path]] = {}

    def get(self, path: Path) -> tuple[EnvInfo, Path]:
        st = path.stat()
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key not in self.items:
            if path.is_dir():
                info = inspect_env(path)
                self.items[key] = (info, path / "lib")
            else:
                dest = self.tmp / str(len(self.items))
                info = inspect_env(path, extract_libs_to=dest)
                self.items[key] = (info, dest / "lib")
        info, lib_dir = self.items[key]
        return (info if info.path == path else _with_path(info, path)), lib_dir


def _with_path(info: EnvInfo, path: Path) -> EnvInfo:
    from dataclasses import replace

    return replace(info, path=path)


def _resolve_env_path(value: str, model_dir: Path) -> tuple[Path | None, list[Finding]]:
    """Resolve an ``EXECUTION_ENV_PATH`` value as python_be.cc does, and check it."""
    findings: list[Finding] = []
    loc = value.find(MODEL_DIR_KEYWORD)
    if loc > 0:
        return None, [
            Finding(
                PROBLEM,
                "env-path",
                f"EXECUTION_ENV_PATH {value!r}: {MODEL_DIR_KEYWORD} must start the value (Triton replaces "
                f"{MODEL_DIR_KEYWORD} correctly only at position 0)",
            )
        ]
    if loc == 0:
        raw = str(model_dir.resolve()) + value[len(MODEL_DIR_KEYWORD) :]
        path = Path(os.path.normpath(raw))
        base = os.path.realpath(model_dir)
        real = os.path.realpath(path)
        if os.path.commonpath([base, real]) != base:
            findings.append(
                Finding(
                    PROBLEM,
                    "env-path",
                    f"EXECUTION_ENV_PATH {value!r} escapes the model directory (resolves to {real}); Triton leaves that "
                    f"undefined: put the env inside {model_dir} (orchestrator env install does)",
                )
            )
            return None, findings
    else:
        if not os.path.isabs(value):
            findings.append(
                Finding(
                    WARNING,
                    "env-path",
                    f"EXECUTION_ENV_PATH {value!r} is relative without {MODEL_DIR_KEYWORD}: Triton resolves it against its "
                    "working directory",
                )
            )
        path = Path(value)
    if not path.exists():
        findings.append(Finding(PROBLEM, "env-path", f"EXECUTION_ENV_PATH points at a missing file: {path} does not exist"))
        return None, findings
    return path, findings


def diagnose(
    repo: str | os.PathLike,
    config_name: str | None = "embedded",
    *,
    models: Sequence[str] | None = None,
    backend_directory: str | os.PathLike | None = None,
    ld_library_path: Sequence[str] | None = None,
) -> tuple[list[ModelReport], list[str]]:
    """Diagnose the Python models of ``repo`` as a server with ``--model-config-name=
    config_name`` would run them. Returns (reports of the Python models, names of the
    models skipped because they are not Python-backend ones).

    ``backend_directory``: the server's ``--backend-directory`` (its
    ``python/triton_python_backend_stub`` is the default stub; e.g. ``/opt/tritonserver/backends``
    in an NGC container); default: the embedded server (the wheel's stub for this
    interpreter, which is also the models' Python when they have no env).
    ``ld_library_path``: the server's ``LD_LIBRARY_PATH`` entries (default: the embedded
    server's, or this process's with ``backend_directory``). Raises EnvError when the
    repository is missing.
    """
    from orchestrator.tooling.server import list_models

    repo = Path(repo)
    if not repo.is_dir():
        raise EnvError(f"model repository {repo} is not a directory")
    if backend_directory is None:
        server_stub = embedded_stub(sys.version_info[:2])
        server_python: tuple[int, int] | None = tuple(sys.version_info[:2])  # type: ignore[assignment]
        ld_path = list(ld_library_path) if ld_library_path is not None else embedded_library_path()
        try:
            from importlib.metadata import version

            server_numpy: str | None = version("numpy")
        except Exception:  # noqa: BLE001 - not installed
            server_numpy = None
        server_desc = "server's Python"
    else:
        server_stub = Path(backend_directory) / "python" / STUB_NAME
        server_python = None
        ld_path = list(ld_library_path) if ld_library_path is not None else [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
        server_numpy = None
        server_desc = "server's Python"
    reports: list[ModelReport] = []
    skipped: list[str] = []
    names = list(models) if models is not None else list_models(repo, config_name)
    with tempfile.TemporaryDirectory(prefix="doctor-") as tmp:
        cache = _EnvCache(Path(tmp))
        for name in names:
            model_dir = repo / name
            config = effective_config(model_dir, config_name)
            if config is None:
                reports.append(ModelReport(name, model_dir, "-", "?", "-", "-", [Finding(PROBLEM, "env-path", f"{model_dir} has no config")]))
                continue
            text = config.read_text()
            if not is_python_model(text):
                skipped.append(name)
                continue
            value = execution_env_path(text)
            report = ModelReport(name, config, server_desc, _v(server_python), str(server_stub), "-")
            reports.append(report)
            info = lib_dir = None
            if value is not None:
                report.env = value
                path, found = _resolve_env_path(value, model_dir)
                report.findings += found
                if path is not None:
                    try:
                        info, lib_dir = cache.get(path)
                        report.env_python = _v(info.python_version)
                    except EnvError as exc:
                        report.findings.append(Finding(PROBLEM, "env-path", str(exc)))
                if info is None:
                    report.env_python = "?"
                    continue
            stub_path = _stub_to_run(model_dir, server_stub, info)
            report.stub = str(stub_path)
            try:
                stub = inspect_stub(stub_path)
            except EnvError as exc:
                report.findings.append(Finding(PROBLEM, "stub", str(exc)))
                continue
            if info is None:
                report.findings += _check_server_python(stub, server_python, server_numpy, ld_path, server_desc)
            else:
                report.findings += check_env(info, stub, server_ld_path=ld_path, lib_dir=lib_dir)
            libline = next((f.message for f in report.findings if f.kind == "libpython" and f.level == OK), None)
            missing = next((f for f in report.findings if f.kind == "libpython" and f.is_problem), None)
            report.libpython = libline or (f"{stub.libpython} => not found" if missing else (stub.libpython or "none"))
    return reports, skipped


def _stub_to_run(model_dir: Path, server_stub: Path, info: EnvInfo | None) -> Path:
    """The stub Triton will start for this model: the model directory's (through its
    dispatcher, if it is one: the binary beside it when the env has the dispatcher's
    Python version, else the server's), else the server's."""
    own = model_dir / STUB_NAME
    if not own.exists():
        return server_stub
    target = dispatcher_target(own)
    if target is None:
        return own
    version, binary = target
    if info is not None and info.python_version == version:
        return binary
    return server_stub


def _check_server_python(stub: StubInfo, server_python, server_numpy, ld_path, where) -> list[Finding]:
    findings: list[Finding] = []
    if server_python and stub.python_version and stub.python_version != server_python:
        findings.append(
            Finding(
                PROBLEM,
                "version",
                f"the stub {stub.path} links {stub.libpython} (Python {_v(stub.python_version)}) but the model has no "
                f"EXECUTION_ENV_PATH and the server's Python is {_v(server_python)}: remove the stub from the model "
                "directory or give the model an env of that version",
            )
        )
    if stub.libpython:
        try:
            resolved = ldd(stub.path, list(ld_path)).get(stub.libpython)
        except EnvError as exc:
            resolved = None
            findings.append(Finding(WARNING, "libpython", str(exc)))
        if resolved:
            findings.append(Finding(OK, "libpython", f"{stub.libpython} => {resolved}"))
        else:
            findings.append(
                Finding(PROBLEM, "libpython", f"missing libpython: the stub needs {stub.libpython}, not found on the server's library path")
            )
    if server_python is not None:
        numpy_finding = check_numpy(server_numpy, stub, where)
        if numpy_finding:
            findings.append(numpy_finding)
    return findings


# ----------------------------------------------------------------------------------------
# `orchestrator doctor`


def _stub_version(path: str) -> str:
    try:
        return f" ({_v(inspect_stub(path).python_version)})"
    except EnvError:
        return ""


def add_doctor_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``orchestrator doctor`` options to ``parser``."""
    parser.add_argument("--repo", default="model_repository", help="model repository (default: %(default)s)")
    parser.add_argument(
        "--config-name", default="embedded", help="--model-config-name the server uses (default: %(default)s; '' for config.pbtxt)"
    )
    parser.add_argument("--models", default=None, help="comma-separated model names (default: all)")
    parser.add_argument(
        "--backend-directory",
        default=None,
        help="the server's --backend-directory, e.g. /opt/tritonserver/backends (default: the embedded server)",
    )
    return parser


def doctor_command(args: argparse.Namespace) -> int:
    """Run ``orchestrator doctor``: print a table and the diagnoses. Returns 0 when every
    Python model is healthy, 1 otherwise (also on an error, printed on stderr)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    models = [m.strip() for m in args.models.split(",") if m.strip()] if getattr(args, "models", None) else None
    try:
        reports, skipped = diagnose(
            args.repo, args.config_name or None, models=models, backend_directory=getattr(args, "backend_directory", None)
        )
    except EnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    table = Table(title=f"Python models of {args.repo} (--model-config-name={args.config_name or '(none)'})")
    for col in ("model", "env", "env Python", "stub", "libpython (ldd)", "status"):
        table.add_column(col, overflow="fold")
    server_stub = None
    for r in reports:
        in_model_dir = Path(r.stub).parent in (r.config.parent, r.config.parent.parent)
        stub_col = f"model dir{_stub_version(r.stub)}" if in_model_dir else f"server's{_stub_version(r.stub)}"
        server_stub = server_stub or (None if in_model_dir else r.stub)
        env_col = r.env.replace(MODEL_DIR_KEYWORD, "<model dir>") if r.env.startswith(MODEL_DIR_KEYWORD) else r.env
        lib_col = r.libpython.split(" => ", 1)[-1] if " => " in r.libpython else r.libpython
        problems = [f for f in r.findings if f.is_problem]
        warnings = [f for f in r.findings if f.level == WARNING]
        status = (
            "[red]" + ", ".join(sorted({f.kind for f in problems})) + "[/red]"
            if problems
            else ("[yellow]warning[/yellow]" if warnings else "[green]ok[/green]")
        )
        table.add_row(r.name, env_col, r.env_python, stub_col, lib_col, status)
    console.print(table)
    if server_stub:
        console.print(f"server's stub: {server_stub}", highlight=False)
    if skipped:
        console.print(f"not Python-backend models (not checked): {', '.join(skipped)}")
    bad = 0
    for r in reports:
        for f in r.findings:
            if f.level in (PROBLEM, WARNING):
                color = "red" if f.is_problem else "yellow"
                console.print(f"[{color}]{f.level}[/{color}] {escape(f'{r.name} [{f.kind}]: {f.message}')}", highlight=False)
        bad += not r.healthy
    if bad:
        console.print(f"[red]{bad} of {len(reports)} Python models have problems[/red]")
        return 1
    console.print(f"[green]all {len(reports)} Python models healthy[/green]")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m orchestrator.tooling.env.doctor [options]``."""
    parser = add_doctor_arguments(argparse.ArgumentParser(prog="python -m orchestrator.tooling.env.doctor", description=__doc__.split("\n\n")[0]))
    return doctor_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
