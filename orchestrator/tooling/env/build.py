"""``env build``: create, pack and verify an execution environment for our Python models.

conda + conda-pack where ``conda`` is installed, else a venv of the requested CPython
packed with venv-pack, the base interpreter's ``libpython`` copied into ``lib/`` (the stub
needs it there: ``tests/unit/test_env.py``, ``test_build_env_venv_fallback``). Steps are
numbered on stderr; every command's output goes to a log file beside the output, and a
failed step raises :class:`~orchestrator.tooling.env.common.EnvError` naming the command
and its last lines.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from orchestrator.tooling.env.common import DEFAULT_ENV_OUTPUT, ENV_SPEC_DIR, EnvError
from orchestrator.tooling.env.inspection import inspect_env
from orchestrator.tooling.env.interpreters import find_python
from orchestrator.tooling.env.verify import verify_env
from orchestrator.tooling.paths import PROJECT_ROOT

__all__ = ["BuiltEnv", "build_env", "requirements_file", "conda_executable"]


# ----------------------------------------------------------------------------------------
# Progress and commands


class _Steps:
    """Numbered steps with a rich status line and timings; commands log to a file."""

    def __init__(self, total: int, log_path: Path, console=None, quiet: bool = False):
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self.total = total
        self.n = 0
        self.log_path = log_path
        self.quiet = quiet
        self._status = None
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text("")

    def say(self, text: str) -> None:
        if not self.quiet:
            self.console.print(text)

    @contextmanager
    def step(self, title: str) -> Iterator["_Steps"]:
        self.n += 1
        label = f"[{self.n}/{self.total}] {title}"
        started = time.monotonic()
        if self.quiet:
            yield self
            return
        with self.console.status(label) as status:
            self._status, self._label = status, label
            try:
                yield self
            except BaseException:
                self.console.print(f"[red]✗[/red] {label}")
                raise
            finally:
                self._status = None
        self.console.print(f"[green]✓[/green] {label} ({time.monotonic() - started:.1f} s)")

    def run(self, cmd: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
        """Run ``cmd``, stream its output to the log and the status line; return the output.
        Raises EnvError with the command, exit code and the output's last 40 lines."""
        cmd = [str(c) for c in cmd]
        lines: list[str] = []
        with open(self.log_path, "a") as log:
            log.write(f"$ {shlex.join(cmd)}\n")
            log.flush()
            try:
                proc = subprocess.Popen(
                    cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(env) if env else None, cwd=cwd
                )
            except OSError as exc:
                raise EnvError(f"step {self.n}/{self.total} failed: cannot run `{shlex.join(cmd)}`: {exc}") from exc
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                lines.append(line.rstrip("\n"))
                if self._status is not None and line.strip():
                    self._status.update(f"{self._label}: {line.strip()[:90]}")
            rc = proc.wait()
        if rc != 0:
            tail = "\n".join(f"  {line}" for line in lines[-40:]) or "  (no output)"
            raise EnvError(
                f"step {self.n}/{self.total} failed: `{shlex.join(cmd)}` exited with status {rc}\n"
                f"output (last lines):\n{tail}\nfull log: {self.log_path}"
            )
        return "\n".join(lines)


def _install_environ(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for installing into an env: ``PYTHONNOUSERSITE=True`` (Triton's
    README requires it while installing), and no ``PYTHONPATH``/``PYTHONHOME``/
    ``VIRTUAL_ENV``/``PIP_USER``, so packages outside the env can neither satisfy a
    requirement nor receive one."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_USER", "CONDA_PREFIX")}
    env["PYTHONNOUSERSITE"] = "True"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra or {})
    return env


def conda_executable() -> str | None:
    """``conda`` on PATH, or None (``mamba``/``micromamba`` are not used: their CLIs differ)."""
    return shutil.which("conda")


# ----------------------------------------------------------------------------------------
# Build


@dataclass
class BuiltEnv:
    """A packed env: ``path`` (``.tar.gz``), ``python`` (``"3.12.1"``), ``tool``
    (``"conda-pack"`` or ``"venv-pack"``), ``target`` (``cpu``/``gpu``), ``packages``
    ({name: version}), ``base_interpreter`` (venv-pack: the interpreter the env links to)."""

    path: Path
    python: str
    tool: str
    target: str
    packages: dict[str, str]
    base_interpreter: str | None = None

    def manifest(self) -> dict:
        return {**dataclasses.asdict(self), "path": str(self.path)}


def requirements_file(target: str) -> Path:
    """``env/requirements-<target>.txt``; raises EnvError for an unknown target."""
    path = ENV_SPEC_DIR / f"requirements-{target}.txt"
    if not path.is_file():
        have = sorted(p.stem.replace("requirements-", "") for p in ENV_SPEC_DIR.glob("requirements-*.txt"))
        raise EnvError(f"unknown env target {target!r}: no {path} (targets: {', '.join(have) or 'none'})")
    return path


def build_env(  # noqa: C901 (the build's steps in order, each with its own error)
    python: str | None = None,
    target: str = "cpu",
    *,
    output: str | os.PathLike | None = None,
    tool: str = "auto",
    requirements: Sequence[str] | None = None,
    pip_args: Sequence[str] = (),
    install_project: bool = True,
    imports: Sequence[str] | None = None,
    verify: bool = True,
    stub: str | os.PathLike | None = None,
    work_dir: str | os.PathLike | None = None,
    console=None,
    quiet: bool = False,
) -> BuiltEnv:
    """Build, pack and verify an execution environment; return it.

    ``python``: ``"3.12"`` (default: this interpreter's version, which is the embedded
    server's stub version). ``target``: ``cpu``/``gpu`` (``env/requirements-<target>.txt``).
    ``output``: the ``.tar.gz`` (default ``.cache/env/triton_env.tar.gz``; a ``.json``
    manifest is written beside it). ``tool``: ``conda`` (conda + conda-pack), ``venv``
    (venv + venv-pack, the base interpreter's libpython copied into ``lib/``) or ``auto``
    (conda where installed, else venv, saying so). ``requirements``: pip requirement
    strings/paths instead of the requirements file; ``pip_args``: extra ``pip install``
    arguments (e.g. ``--no-index --find-links DIR``; venv only, conda installs the pip list
    of its environment file). ``install_project``: also install this
    checkout's ``orchestrator`` package (non-editable, ``--no-deps``). ``verify``: run
    :func:`verify_env` on the result (``imports``: modules to import, default
    :data:`DEFAULT_IMPORTS`; ``stub``: the stub that will run it, default the embedded
    server's for that Python version). Progress goes to stderr (rich) unless ``quiet``.

    Raises EnvError: no such Python, conda requested but absent, a failed step (naming its
    command and output), or a failed verification.
    """
    version = python or f"{sys.version_info[0]}.{sys.version_info[1]}"
    if tool not in ("auto", "conda", "venv"):
        raise EnvError(f"unknown env tool {tool!r} (auto, conda, venv)")
    conda = conda_executable()
    if tool == "conda" and conda is None:
        raise EnvError("conda is not installed on this machine (no `conda` on PATH); use --tool venv (venv + venv-pack)")
    use_conda = conda is not None and tool in ("auto", "conda")
    reqs = list(requirements) if requirements is not None else ["-r", str(requirements_file(target))]
    output = Path(output or DEFAULT_ENV_OUTPUT).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    work_root = Path(work_dir or output.parent / "build")
    work_root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"py{version}-{target}-", dir=work_root))
    prefix = work / "env"
    steps = _Steps(7 if verify else 6, work_root / f"build-py{version}-{target}.log", console=console, quiet=quiet)
    if not use_conda and tool == "auto":
        steps.say(
            "[yellow]conda is not installed here[/yellow]: building a venv packed with venv-pack instead. "
            "Limit: the env links its base interpreter, which must exist at the same path on the server "
            "(docs/guides/env-and-stub.md)."
        )
    env = _install_environ()
    base_interpreter = None
    outer_pip = False
    try:
        with steps.step(f"find Python {version}"):
            if use_conda:
                info = None
                py_spec = version
            else:
                info = find_python(version)
                base_interpreter = str(info.executable)
                if info.libpython is None:
                    raise EnvError(
                        f"{info.executable} is not a shared-libpython build (Py_ENABLE_SHARED=0); the stub needs "
                        f"libpython{info.short}.so.1.0: rebuild it with --enable-shared (pyenv: "
                        f"PYTHON_CONFIGURE_OPTS=--enable-shared pyenv install {info.short})"
                    )
                py_spec = ".".join(map(str, info.version))
        with steps.step(f"create the {'conda env' if use_conda else 'venv'} (Python {py_spec})"):
            if use_conda:
                yml = _render_environment_yml(version, reqs, work)
                steps.run([conda, "env", "create", "-p", prefix, "-f", yml], env=env)
            else:
                # No pip inside the env where this interpreter's pip can drive it
                # (`pip --python`, pip >= 22.3, targets >= 3.9): faster, and a smaller env.
                outer_pip = info.version[:2] >= (3, 9) and _pip_supports_python_option()
                steps.run([info.executable, "-m", "venv", *(["--without-pip"] if outer_pip else []), prefix], env=env)
        env_python = prefix / "bin" / "python"
        if use_conda or not outer_pip:
            pip = [env_python, "-m", "pip"]
        else:
            pip = [sys.executable, "-m", "pip", "--python", env_python]
        with steps.step("install the packages (PYTHONNOUSERSITE=True)"):
            if not use_conda:
                steps.run([*pip, "install", "--no-input", *pip_args, *reqs], env=env)
        with steps.step("install the orchestrator package" if install_project else "no project install"):
            if install_project:
                wheel_dir = work / "wheel"
                # A wheel built by this interpreter, installed with --no-deps: non-editable
                # (packers refuse editable installs) and without the client-side dependencies.
                # Built from a copy, so the checkout gets no build/ or egg-info changes.
                source = work / "src"
                shutil.copytree(PROJECT_ROOT / "orchestrator", source / "orchestrator", ignore=shutil.ignore_patterns("__pycache__"))
                for name in ("pyproject.toml", "README.md"):
                    shutil.copy2(PROJECT_ROOT / name, source / name)
                steps.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", wheel_dir, source], env=env)
                wheels = sorted(wheel_dir.glob("triton_orchestrator-*.whl"))
                steps.run([*pip, "install", "--no-input", "--no-deps", "--force-reinstall", *wheels], env=env)
        with steps.step("pack" + (" with conda-pack" if use_conda else " with venv-pack (libpython copied into lib/)")):
            # Packed and verified in the work dir; only a verified env replaces `output`.
            tmp_out = work / output.name
            if use_conda:
                _require_module("conda_pack", "conda-pack==0.9.2")
                # conda_pack has no __main__; its console script is conda_pack.cli:main.
                pack = [sys.executable, "-c", "import sys; from conda_pack.cli import main; sys.exit(main())"]
                steps.run([*pack, "-p", prefix, "-o", tmp_out, "--force", "--ignore-missing-files"], env=env)
            else:
                assert info is not None and info.libpython is not None
                shutil.copy2(info.libpython, prefix / "lib" / info.soname)
                _require_module("venv_pack", "venv-pack==0.2.0")
                steps.run([sys.executable, "-m", "venv_pack", "-p", prefix, "-o", tmp_out, "--force"], env=env)
            os.chmod(tmp_out, 0o644)
        with steps.step("read the packed env"):
            env_info = inspect_env(tmp_out)
        built = BuiltEnv(
            path=output,
            python=py_spec if not use_conda else ".".join(map(str, env_info.python_version or ())),
            tool="conda-pack" if use_conda else "venv-pack",
            target=target,
            packages=dict(sorted(env_info.packages.items())),
            base_interpreter=base_interpreter,
        )
        if verify:
            with steps.step("verify: unpack, activate, import, check against the stub"):
                verify_env(tmp_out, stub=stub, imports=imports)
        shutil.move(str(tmp_out), str(output))
        output.with_name(output.name + ".json").write_text(json.dumps(built.manifest(), indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    steps.say(f"env: {output} (Python {built.python}, {built.tool}, {len(built.packages)} packages)")
    return built


def _pip_supports_python_option() -> bool:
    """True when this interpreter's pip has ``--python`` (pip >= 22.3)."""
    try:
        from importlib.metadata import version

        major, minor = (int(x) for x in version("pip").split(".")[:2])
    except Exception:  # noqa: BLE001 - no pip, or an odd version string
        return False
    return (major, minor) >= (22, 3)


def _require_module(module: str, requirement: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise EnvError(f"{module} is not installed in {sys.prefix}: pip install '{requirement}' (or pip install -e '.[env]')")


def _render_environment_yml(version: str, reqs: Sequence[str], work: Path) -> Path:
    """``env/environment.yml`` with ``python=<version>`` and the pip list replaced by
    ``reqs`` (absolute paths), written to ``work``."""
    import yaml

    spec = yaml.safe_load((ENV_SPEC_DIR / "environment.yml").read_text())
    deps = []
    for dep in spec.get("dependencies", []):
        if isinstance(dep, str) and re.match(r"^python([=<> ]|$)", dep):
            deps.append(f"python={version}")
        elif isinstance(dep, dict) and "pip" in dep:
            continue
        else:
            deps.append(dep)
    pip_list, it = [], iter(reqs)
    for item in it:
        pip_list.append(f"-r {next(it)}" if item == "-r" else item)
    deps.append({"pip": pip_list})
    spec["dependencies"] = deps
    spec.pop("name", None)  # created with -p
    path = work / "environment.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
