"""Python-backend stubs (``triton_python_backend_stub``): what Python a stub embeds, the
embedded server's prebuilt ones, ``make stub``, and the stub a model directory gets.

A stub in a model directory replaces the backend's for *every* config of that model
(python_backend r24.10, ``src/stub_launcher.cc``), so :func:`place_stub` writes, by
default, a small bash dispatcher there that runs the env's stub only when the launcher
activated the env (``tests/unit/test_env.py``, ``tests/server/test_env_server.py``).

Errors are :class:`~orchestrator.tooling.env.common.EnvError`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from orchestrator.tooling.embedded import ServerError, find_embedded_server, server_environment
from orchestrator.tooling.env.common import (
    EMBEDDED_TRITON_RELEASE,
    STUB_NAME,
    STUB_OUT_DIR,
    EnvError,
    parse_version,
    version_text,
)
from orchestrator.tooling.env.elf import ElfInfo, ldd, parse_elf
from orchestrator.tooling.env.interpreters import find_python
from orchestrator.tooling.files import copy_atomic, write_atomic

__all__ = [
    "StubInfo",
    "inspect_stub",
    "embedded_stub",
    "embedded_library_path",
    "triton_release_for_version",
    "prepare_stub",
    "built_stub_release",
    "stub_for",
    "DISPATCHER_MARKER",
    "dispatcher_target",
    "place_stub",
]


# libpython3.12.so.1.0, libpython3.7m.so.1.0, and auditwheel's renamed copies such as
# libpython3-419a3a08.13.so.1.0 (the wheel's 3.13 stub bundles one in nvidia_pytriton.libs).
_LIBPYTHON = re.compile(r"^libpython(\d+)(?:-[0-9a-f]{8})?\.(\d+)m?\.so(\.[\d.]+)?$")


@dataclass
class StubInfo:
    """A ``triton_python_backend_stub`` binary.

    ``python_version``: (major, minor) of the ``libpython3.X.so.1.0`` it links (DT_NEEDED),
    None if it links none. ``libpython``: that soname. ``numpy2``: True when it was built with
    pybind11 >= 2.12 (it contains ``numpy._core``, the module pybind11 2.12 imports under
    numpy 2), False when it was built with an older pybind11 (only the literal
    ``numpy.core.multiarray``), None when neither string is found. ``elf``: its
    :class:`ElfInfo`.
    """

    path: Path
    python_version: tuple[int, int] | None
    libpython: str | None
    numpy2: bool | None
    elf: ElfInfo


def inspect_stub(path: str | os.PathLike) -> StubInfo:
    """Read a stub binary. Raises EnvError when it is missing or not an ELF file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise EnvError(f"cannot read the stub {path}: {exc}") from exc
    elf = parse_elf(data)
    if elf is None:
        raise EnvError(f"{path} is not an ELF executable (a triton_python_backend_stub is one)")
    version = libpython = None
    for name in elf.needed:
        m = _LIBPYTHON.match(name)
        if m:
            version, libpython = (int(m.group(1)), int(m.group(2))), name
            break
    if b"numpy._core" in data:
        numpy2: bool | None = True
    elif b"numpy.core.multiarray" in data:
        numpy2 = False
    else:
        numpy2 = None
    return StubInfo(path, version, libpython, numpy2, elf)


def embedded_stub(version: Sequence[int]) -> Path:
    """The embedded server's prebuilt stub for CPython ``version`` (nvidia-pytriton wheel).
    Raises EnvError when the wheel or that stub is missing."""
    try:
        return find_embedded_server().stub(tuple(version)[:2])
    except ServerError as exc:
        raise EnvError(str(exc)) from exc


def embedded_library_path() -> list[str]:
    """``LD_LIBRARY_PATH`` entries the embedded server gives its stubs (the wheel's libs and
    the serving interpreter's libpython dir), for ``ldd`` checks; [] without the wheel."""
    try:
        value = server_environment(find_embedded_server(), base={})["LD_LIBRARY_PATH"]
    except ServerError:
        return []
    return [p for p in value.split(os.pathsep) if p]


def triton_release_for_version(server_version: str) -> str:
    """NGC release branch of a Triton server version: ``"2.51.0"`` -> ``"r24.10"``.

    Triton has released monthly since 22.01 = 2.18.0 (release notes), so release =
    22.01 + (minor - 18) months. Raises EnvError for versions before 2.18 or malformed ones.
    """
    m = re.match(r"^2\.(\d+)(\.\d+)?$", server_version.strip())
    if not m or int(m.group(1)) < 18:
        raise EnvError(f"cannot map Triton server version {server_version!r} to a release (known from 2.18.0 = r22.01)")
    months = int(m.group(1)) - 18
    return f"r{22 + months // 12}.{months % 12 + 1:02d}"


def prepare_stub(
    python: str | Sequence[int],
    out_dir: str | os.PathLike | None = None,
    *,
    triton: str = EMBEDDED_TRITON_RELEASE,
    ld_library_path: Sequence[str] | None = None,
) -> Path:
    """Copy the embedded server's stub for Python ``python`` (``"3.12"``) to
    ``<out_dir>/<3.x>/triton_python_backend_stub`` (default ``stub_build/out``), write
    ``stub.json`` beside it (source, release, Python version, ldd line) and check with
    ``ldd`` that it links ``libpython3.x``. Returns the stub's path.

    Raises EnvError when ``triton`` is not the embedded server's release (another
    release needs ``stub_build/build.sh`` and Docker), when the wheel has no stub for that
    version, or when the stub does not link ``libpython3.x``.
    """
    version = parse_version(python)
    if triton != EMBEDDED_TRITON_RELEASE:
        raise EnvError(
            f"the embedded server is Triton 2.51 ({EMBEDDED_TRITON_RELEASE}); its prebuilt stubs do not fit "
            f"{triton}. Build one in the NGC container: make stub PYTHON={version_text(version)} TRITON={triton}"
        )
    source = embedded_stub(version)
    target_dir = Path(out_dir or STUB_OUT_DIR) / version_text(version)
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / STUB_NAME
    copy_atomic(source, target, mode=0o755)
    info = inspect_stub(target)
    if info.python_version != version:
        raise EnvError(f"{target} links {info.libpython or 'no libpython'}, not libpython{version_text(version)}")
    # The libpython comes from the env's lib/ at run time; here, from an interpreter of that
    # version if this machine has one (pyenv), so ldd shows a real resolution.
    lib_path = list(ld_library_path) if ld_library_path is not None else embedded_library_path()
    try:
        interpreter = find_python(version_text(version))
    except EnvError:
        interpreter = None
    if interpreter is not None and interpreter.libdir is not None:
        lib_path = [str(interpreter.libdir), *lib_path]
    libs = ldd(target, lib_path)
    if interpreter is not None and interpreter.libpython is not None and not libs.get(info.libpython or ""):
        raise EnvError(f"ldd {target}: {info.libpython} not found even with {interpreter.libdir} on LD_LIBRARY_PATH")
    manifest = {
        "source": f"nvidia-pytriton wheel: {source}",
        "triton_release": triton,
        "python": version_text(version),
        "libpython": info.libpython,
        "ldd_libpython": libs.get(info.libpython or "", None),
        "numpy2_support": info.numpy2,
    }
    (target_dir / "stub.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return target


# ----------------------------------------------------------------------------------------
# Stubs in model directories

#: First line after the shebang of a dispatcher written by :func:`place_stub`.
DISPATCHER_MARKER = "# orchestrator-stub-dispatcher"

_DISPATCHER = """#!/usr/bin/env bash
{marker} python={version}
# Written by `orchestrator env install`. Triton's Python backend starts
# <model dir>/triton_python_backend_stub for every config of this model (python_backend
# src/stub_launcher.cc), so a Python {version} stub placed here would also run the configs
# without an execution env and fail there. This script picks the stub at each launch:
# the Python {version} stub beside it when the launcher activated this model's env (it
# runs `source <env>/bin/activate && exec env LD_LIBRARY_PATH=<env>/lib:... <stub> ARGS`,
# so the env's lib/ is the first LD_LIBRARY_PATH entry), else the server's own stub
# (argument 6 is the Python backend's directory).
[ "$#" -ge 9 ] || exit 1  # Triton probes the stub without arguments and expects status 1
first="${{LD_LIBRARY_PATH%%:*}}"
if [ -n "$first" ] && [ -f "$first/../bin/activate" ] && [ -d "$first/python{version}" ]; then
    exec "$(dirname "$0")/{binary}" "$@"
fi
exec "$6/triton_python_backend_stub" "$@"
"""


def dispatcher_target(path: str | os.PathLike) -> tuple[tuple[int, int], Path] | None:
    """For a stub dispatcher written by :func:`place_stub`: (its Python version, the
    stub binary it runs under that version's env). None for anything else."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(200).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    if len(head) < 2 or not head[1].startswith(DISPATCHER_MARKER):
        return None
    m = re.search(r"python=(\d+)\.(\d+)", head[1])
    if not m:
        return None
    return (int(m.group(1)), int(m.group(2))), path.with_name(f"{STUB_NAME}.py{m.group(1)}.{m.group(2)}")


def built_stub_release(directory: Path) -> str | None:
    """The ``triton_release`` of ``<directory>/stub.json`` beside a stub, or None."""
    try:
        if (directory / STUB_NAME).is_file():
            return json.loads((directory / "stub.json").read_text()).get("triton_release")
    except (OSError, ValueError):
        pass
    return None


def stub_for(version: Sequence[int], triton: str = EMBEDDED_TRITON_RELEASE, stub: str | os.PathLike | None = None) -> Path:
    """The stub to put in a model directory for an env of CPython ``version``: ``stub`` if
    given, else ``stub_build/out/<3.x>/`` if its ``stub.json`` says release ``triton``, else
    (for the embedded server's release) the wheel's prebuilt one.

    Raises EnvError when there is none for that release, or when the stub's libpython is
    not ``version``'s.
    """
    version = parse_version(version)
    built = STUB_OUT_DIR / version_text(version)
    if stub:
        source = Path(stub)
    elif built_stub_release(built) == triton:
        source = built / STUB_NAME
    elif triton == EMBEDDED_TRITON_RELEASE:
        source = embedded_stub(version)
    else:
        raise EnvError(
            f"no Python {version_text(version)} stub for Triton {triton} in {STUB_OUT_DIR}: "
            f"make stub PYTHON={version_text(version)} TRITON={triton}"
        )
    info = inspect_stub(source)
    if info.python_version != version:
        raise EnvError(f"the stub {source} links {info.libpython}, but the env is Python {version_text(version)}")
    return source


def place_stub(model_dir: Path, source: Path | None, version: Sequence[int], dispatch: bool = True) -> Path | None:
    """Give ``model_dir`` the stub for an env of CPython ``version``; returns the
    ``triton_python_backend_stub`` placed there, or None when the server's own stub is to run.

    ``source`` (from :func:`stub_for`; None: the server's stub matches the env): with
    ``dispatch``, the binary goes to ``triton_python_backend_stub.py3.X`` and
    ``triton_python_backend_stub`` is a bash dispatcher that runs it only when the launcher
    activated the env, else the server's stub, so the model's other configs keep working;
    without, the binary itself (python_backend's documented layout: the model then runs
    only with the env). Stubs of ours for another Python version are removed, and so is a
    stub left there that would not run this env.
    """
    version = parse_version(version)
    existing = model_dir / STUB_NAME
    binary = model_dir / f"{STUB_NAME}.py{version_text(version)}"
    for old in model_dir.glob(f"{STUB_NAME}.py*"):
        if old != binary or source is None or not dispatch:
            old.unlink()  # ours, for another Python version
    if source is not None and dispatch:
        copy_atomic(source, binary, mode=0o755)
        script = _DISPATCHER.format(marker=DISPATCHER_MARKER, version=version_text(version), binary=binary.name)
        write_atomic(existing, script.encode(), 0o755)
        return existing
    if source is not None:
        copy_atomic(source, existing, mode=0o755)
        return existing
    if existing.exists():
        if dispatcher_target(existing) is not None:
            stale = True
        else:
            try:
                stale = inspect_stub(existing).python_version != version
            except EnvError:
                stale = True
        if stale:
            existing.unlink()
    return None
