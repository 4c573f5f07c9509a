"""CPython interpreters on this machine: find one of a given version (pyenv first, then
``python3.X`` on ``PATH``) and ask it for its exact version and shared ``libpython``.

Errors are :class:`~orchestrator.tooling.env.common.EnvError`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from orchestrator.tooling.env.common import EnvError, parse_version

__all__ = ["PythonInfo", "python_info", "find_python"]


@dataclass(frozen=True)
class PythonInfo:
    """A CPython interpreter: ``executable`` (the real binary), ``version`` (major, minor,
    micro), ``libdir`` and ``soname`` of its shared ``libpython`` (None for a static build)."""

    executable: Path
    version: tuple[int, int, int]
    libdir: Path | None
    soname: str | None

    @property
    def short(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"

    @property
    def libpython(self) -> Path | None:
        if self.libdir and self.soname and (self.libdir / self.soname).exists():
            return self.libdir / self.soname
        return None


_PROBE_INTERPRETER = (
    "import json, sys, sysconfig; v = sysconfig.get_config_var; "
    "print(json.dumps({'executable': sys.executable, 'base': getattr(sys, '_base_executable', sys.executable), "
    "'version': list(sys.version_info[:3]), 'shared': bool(v('Py_ENABLE_SHARED')), "
    "'libdir': v('LIBDIR'), 'soname': v('INSTSONAME')}))"
)


def python_info(executable: str | os.PathLike) -> PythonInfo:
    """Ask ``executable`` for its version and shared-libpython location. Raises EnvError."""
    try:
        proc = subprocess.run([str(executable), "-I", "-c", _PROBE_INTERPRETER], capture_output=True, text=True, timeout=60)
        data = json.loads(proc.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        raise EnvError(f"cannot run {executable}: {exc}") from exc
    shared = data["shared"] and data["libdir"] and data["soname"]
    return PythonInfo(
        executable=Path(os.path.realpath(data["base"] or data["executable"])),
        version=tuple(data["version"]),  # type: ignore[arg-type]
        libdir=Path(data["libdir"]) if shared else None,
        soname=data["soname"] if shared else None,
    )


def find_python(version: str) -> PythonInfo:
    """Find a CPython ``version`` (``"3.12"`` or ``"3.12.1"``): pyenv first
    (``$PYENV_ROOT/versions/3.12.*``, newest patch), then ``python3.12`` on ``PATH``.
    Raises EnvError naming where it looked."""
    major, minor = parse_version(version)
    exact = version.strip() if re.match(r"^\d+\.\d+\.\d+$", version.strip()) else None
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    candidates: list[Path] = []
    if root.is_dir():
        found = []
        for d in root.iterdir():
            m = re.match(rf"^{major}\.{minor}\.(\d+)$", d.name)
            if m and (exact is None or d.name == exact):
                exe = d / "bin" / f"python{major}.{minor}"
                if exe.exists():
                    found.append((int(m.group(1)), exe))
        candidates += [exe for _, exe in sorted(found, reverse=True)]
    which = shutil.which(f"python{major}.{minor}")
    if which and exact is None:
        candidates.append(Path(which))
    for exe in candidates:
        info = python_info(exe)
        if info.version[:2] == (major, minor):
            return info
    raise EnvError(
        f"no Python {version} found: looked in {root}/{major}.{minor}.*/bin and for python{major}.{minor} on PATH "
        f"(install it, e.g. `pyenv install {major}.{minor}`)"
    )
