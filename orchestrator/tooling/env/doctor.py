"""``orchestrator doctor``: will each Python model's stub run its environment?

For every Python-backend model of a repository (under ``--model-config-name``), it reports
the environment the model runs in (``EXECUTION_ENV_PATH`` or the server's own Python),
that environment's Python version, the stub Triton will start (``<model
dir>/triton_python_backend_stub`` when present, else the server's) and the libpython that
stub resolves (``ldd`` with the launcher's ``LD_LIBRARY_PATH``: the env's ``lib/`` first),
and diagnoses the failures seen with custom environments:

- ``libpython``: the stub's ``libpython3.X.so.1.0`` is not found in the env's ``lib/`` nor on
  the server's library path (a venv without the copied libpython: the stub then fails to
  start with "error while loading shared libraries: ... cannot open shared object file";
  ``tests/unit/test_doctor.py``, ``test_missing_libpython``);
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
  empty, numeric ones fail with "output tensor shape does not match size" (a real
  server here returns 0-byte outputs of the right shape: ``tests/server/test_env_server.py``). r24.11 moved to pybind11 2.12 (python_backend PR #384);
  such stubs contain ``numpy._core`` (pybind11 2.12 imports it under numpy 2);
- ``env-path``: ``EXECUTION_ENV_PATH`` escapes the model directory (README note 4:
  undefined), points at a missing file, is not a gzip tar (``src/pb_env.cc`` reads only
  gzip + tar), has ``$$TRITON_MODEL_DIRECTORY`` anywhere but at its start
  (``src/python_be.cc`` replaces ``pos + len(keyword)`` characters from it, which is only
  right at position 0), or lacks ``bin/activate`` (``src/stub_launcher.cc`` requires it);
- ``base-interpreter``: a venv-pack env's base interpreter (``pyvenv.cfg`` ``home``) does
  not exist on this machine;
- ``config``: the model's config does not parse as Triton's ``ModelConfig`` (read with
  :mod:`orchestrator.tooling.repository`, as the server would);
- ``repository``: what Triton refuses when it loads the repository, for every model
  (``repository.check_repository``): a config whose ``name`` is not its directory's (a
  copied router), a missing label file, a Python model without its ``model.py``, an
  ensemble whose steps do not fit; and a router whose ``labels.txt`` is not the labels its
  policy answers with (``policy check``'s check: clients asking ``class_count`` would get
  the wrong names).

The static checks against the stub are :mod:`orchestrator.tooling.env.checks`; each
diagnosis has a broken setup in ``tests/unit/test_doctor.py``.

Exit code 0 when every Python model is healthy, 1 otherwise (warnings do not count).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from orchestrator.tooling.cliutil import comma_list
from orchestrator.tooling.env.checks import OK, PROBLEM, WARNING, Finding, check_env, check_libpython, check_numpy
from orchestrator.tooling.env.common import ENV_PATH_PARAMETER, MODEL_DIR_KEYWORD, STUB_NAME, EnvError, version_text
from orchestrator.tooling.env.inspection import EnvInfo, inspect_env
from orchestrator.tooling.env.install import env_install_command, models_missing_env_config
from orchestrator.tooling.env.stubs import StubInfo, dispatcher_target, embedded_library_path, embedded_stub, inspect_stub
from orchestrator.tooling.errors import ConfigError, ToolingError
from orchestrator.tooling.repository import config_path, get_parameter, is_python_model, list_models, read_config, repository_problems

__all__ = ["Finding", "ModelReport", "check_env", "diagnose", "add_doctor_arguments", "doctor_command"]


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
        return (info if info.path == path else dataclasses.replace(info, path=path)), lib_dir


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
    server's, or this process's with ``backend_directory``). A config that does not parse
    is a ``config`` problem of its model. Raises EnvError when the repository is missing.
    """
    repo = Path(repo)
    if not repo.is_dir():
        raise EnvError(f"model repository {repo} is not a directory")
    if backend_directory is None:
        server = _Server(
            stub=embedded_stub(sys.version_info[:2]),
            python=tuple(sys.version_info[:2]),
            ld_path=list(ld_library_path) if ld_library_path is not None else embedded_library_path(),
            numpy=_installed_numpy(),
        )
    else:
        environ_path = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
        server = _Server(
            stub=Path(backend_directory) / "python" / STUB_NAME,
            python=None,
            ld_path=list(ld_library_path) if ld_library_path is not None else environ_path,
            numpy=None,
        )
    reports: list[ModelReport] = []
    skipped: list[str] = []
    names = list(models) if models is not None else list_models(repo, config_name)
    missing = [m for m in models_missing_env_config(repo, config_name) if m in names] if config_name else []
    for name in missing:  # added after `env install`: Triton would load their config.pbtxt instead
        path = config_path(repo / name, config_name)
        reports.append(ModelReport(name, path or repo / name, "-", "?", "-", "-", [Finding(
            PROBLEM, "env-config",
            f"no configs/{config_name}.pbtxt (other models have one: this model was added after the env was installed); "
            f"with --model-config-name={config_name} Triton loads its {path.name if path else 'config.pbtxt'} instead. "
            f"Fix: {env_install_command(repo, missing)}")]))
    names = [n for n in names if n not in missing]
    with tempfile.TemporaryDirectory(prefix="doctor-") as tmp:
        cache = _EnvCache(Path(tmp))
        for name in names:
            report = _diagnose_model(repo / name, name, config_name, server, cache)
            if report is None:
                skipped.append(name)
            else:
                reports.append(report)
    return reports, skipped


@dataclass(frozen=True)
class _Server:
    """What the doctor knows of the server: its own stub, its Python (None: unknown), its
    ``LD_LIBRARY_PATH`` entries and its numpy version (None: unknown or absent)."""

    stub: Path
    python: tuple[int, int] | None
    ld_path: list[str]
    numpy: str | None


def _installed_numpy() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("numpy")
    except PackageNotFoundError:
        return None


def _diagnose_model(model_dir: Path, name: str, config_name: str | None, server: _Server, cache: _EnvCache) -> ModelReport | None:
    """The report of one model; None when it is not a Python-backend model."""
    path = config_path(model_dir, config_name)
    if path is None:
        return ModelReport(name, model_dir, "-", "?", "-", "-", [Finding(PROBLEM, "env-path", f"{model_dir} has no config")])
    try:
        config = read_config(path)
    except ConfigError as exc:
        return ModelReport(name, path, "-", "?", "-", "-", [Finding(PROBLEM, "config", str(exc))])
    if not is_python_model(config):
        return None
    value = get_parameter(config, ENV_PATH_PARAMETER)
    report = ModelReport(name, path, "server's Python", version_text(server.python), str(server.stub), "-")
    info = lib_dir = None
    if value is not None:
        report.env = value
        env_path, found = _resolve_env_path(value, model_dir)
        report.findings += found
        if env_path is not None:
            try:
                info, lib_dir = cache.get(env_path)
            except EnvError as exc:
                report.findings.append(Finding(PROBLEM, "env-path", str(exc)))
        report.env_python = version_text(info.python_version) if info is not None else "?"
        if info is None:
            return report
    stub_path = _stub_to_run(model_dir, server.stub, info)
    report.stub = str(stub_path)
    try:
        stub = inspect_stub(stub_path)
    except EnvError as exc:
        report.findings.append(Finding(PROBLEM, "stub", str(exc)))
        return report
    if info is None:
        report.findings += _check_server_python(stub, server)
    else:
        report.findings += check_env(info, stub, server_ld_path=server.ld_path, lib_dir=lib_dir)
    libline = next((f.message for f in report.findings if f.kind == "libpython" and f.level == OK), None)
    missing = next((f for f in report.findings if f.kind == "libpython" and f.is_problem), None)
    report.libpython = libline or (f"{stub.libpython} => not found" if missing else (stub.libpython or "none"))
    return report


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


def _check_server_python(stub: StubInfo, server: _Server) -> list[Finding]:
    """A model without env runs on the server's Python: the stub must be of that version."""
    findings: list[Finding] = []
    if server.python and stub.python_version and stub.python_version != server.python:
        findings.append(
            Finding(
                PROBLEM,
                "version",
                f"the stub {stub.path} links {stub.libpython} (Python {version_text(stub.python_version)}) but the model has no "
                f"EXECUTION_ENV_PATH and the server's Python is {version_text(server.python)}: remove the stub from the model "
                "directory or give the model an env of that version",
            )
        )
    findings += check_libpython(stub, server.ld_path)
    if server.python is not None:
        numpy_finding = check_numpy(server.numpy, stub, "server's Python")
        if numpy_finding:
            findings.append(numpy_finding)
    return findings


# ----------------------------------------------------------------------------------------
# `orchestrator doctor`


def _stub_version(path: str) -> str:
    try:
        return f" ({version_text(inspect_stub(path).python_version)})"
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
    models = comma_list(getattr(args, "models", None))
    try:
        reports, skipped = diagnose(
            args.repo, args.config_name or None, models=models, backend_directory=getattr(args, "backend_directory", None)
        )
    except ToolingError as exc:
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
    repository = repository_problems(Path(args.repo)) + _label_problems(Path(args.repo), args.config_name or None)
    for problem in repository:
        console.print(f"[red]{PROBLEM}[/red] {escape(f'[repository]: {problem}')}", highlight=False)
    for r in reports:
        for f in r.findings:
            if f.level in (PROBLEM, WARNING):
                color = "red" if f.is_problem else "yellow"
                console.print(f"[{color}]{f.level}[/{color}] {escape(f'{r.name} [{f.kind}]: {f.message}')}", highlight=False)
        bad += not r.healthy
    if bad:
        console.print(f"[red]{bad} of {len(reports)} Python models have problems[/red]")
        return 1
    if repository:
        console.print(f"[red]the repository has {len(repository)} problems Triton would refuse at load[/red]")
        return 1
    console.print(f"[green]all {len(reports)} Python models healthy[/green]")
    return 0


def _label_problems(repo: Path, config_name: str | None) -> list[str]:
    """Routers whose ``labels.txt`` disagrees with their heads (``policy check``'s check)."""
    from orchestrator.tooling.policy_cli import label_file_problems

    return label_file_problems(repo, config_name)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m orchestrator.tooling.env.doctor [options]``."""
    parser = add_doctor_arguments(argparse.ArgumentParser(prog="orchestrator doctor", description=__doc__.split("\n\n")[0]))
    return doctor_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
