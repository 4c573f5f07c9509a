"""Execution environments (``EXECUTION_ENV_PATH``) and Python-backend stubs.

What this module does (``make env``, ``make stub``, ``orchestrator env``, ``orchestrator stub``):

- **build** a portable environment for our Python models (tokenizer, router, postprocess,
  the ONNX Runtime fallback classifiers): conda + conda-pack where ``conda`` exists, else
  a venv of the requested CPython (pyenv's ``~/.pyenv/versions/3.x.y`` or ``python3.x`` on
  ``PATH``) packed with venv-pack, with the interpreter's ``libpython3.x.so.1.0`` copied
  into the env's ``lib/``. Packages come from ``env/requirements-<target>.txt`` plus this
  checkout's ``orchestrator`` package (non-editable, no dependencies);
- **verify** a packed env the way the stub will run it (unpacked, ``source bin/activate``,
  env ``lib/`` first on ``LD_LIBRARY_PATH``, ``python3 -I``): interpreter version against
  the stub's libpython, imports, numpy against the stub, libpython and GLIBCXX;
- **install** it into model directories: ``<model>/triton_env.tar.gz``, the stub matching
  its Python version when that differs from the server's, and ``configs/env.pbtxt`` = the
  model's effective config plus ``EXECUTION_ENV_PATH`` (so ``--model-config-name=env``
  uses it and the default configs stay as they are);
- **stubs**: the embedded server's prebuilt stubs (``nvidia-pytriton`` wheel, Python 3.8 to
  3.13) copied offline into ``stub_build/out/<3.x>/``; other Triton releases are built
  by ``stub_build/build.sh`` in the matching NGC container (needs Docker).

Facts used, all from Triton's ``python_backend`` at the server's release branch (r24.10 =
Triton 2.51, the embedded server): ``src/stub_launcher.cc`` runs the stub as ``bash -c
"source <env>/bin/activate && exec env LD_LIBRARY_PATH=<env>/lib:$LD_LIBRARY_PATH
<stub> ..."``, where ``<stub>`` is ``<model dir>/triton_python_backend_stub`` when that file
exists, else the backend's; ``src/pb_env.cc`` extracts a gzip-compressed tar (libarchive,
gzip filter + tar format only) into ``/tmp/python_env_XXXXXX/<n>`` or uses a directory
as it is; ``src/python_be.cc`` replaces ``$$TRITON_MODEL_DIRECTORY`` by the model
directory; the README ("Creating Custom Execution Environments", "Building Custom Python
Backend Stub") requires ``PYTHONNOUSERSITE=True`` while installing, an env interpreter of
the stub's Python version, and says a path escaping the model directory is undefined.
Seen on these machines (FIELD_NOTES.md and ``tests/test_env.py``): a venv-pack'ed 3.12 env
with its copied libpython and the wheel's 3.12 stub runs under the 3.11 embedded server.

Errors are :class:`EnvError`; a failed build step names the command and its output.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

from orchestrator.tooling.files import copy_atomic
from orchestrator.tooling.server import PACKAGE_PARENT, ServerError, find_embedded_server, server_environment

__all__ = [
    "EnvError",
    "ENV_TARBALL_NAME",
    "ENV_PATH_VALUE",
    "STUB_NAME",
    "EMBEDDED_TRITON_RELEASE",
    "ElfInfo",
    "parse_elf",
    "ldd",
    "StubInfo",
    "inspect_stub",
    "PythonInfo",
    "find_python",
    "python_info",
    "EnvInfo",
    "inspect_env",
    "build_env",
    "verify_env",
    "install_env",
    "prepare_stub",
    "dispatcher_target",
    "triton_release_for_version",
    "add_env_arguments",
    "env_command",
    "add_stub_arguments",
    "stub_command",
]

#: File name of the packed env inside a model directory.
ENV_TARBALL_NAME = "triton_env.tar.gz"
#: Triton's keyword for the model directory inside ``EXECUTION_ENV_PATH`` (python_be.cc).
MODEL_DIR_KEYWORD = "$$TRITON_MODEL_DIRECTORY"
#: The ``EXECUTION_ENV_PATH`` value written into ``configs/env.pbtxt``.
ENV_PATH_VALUE = f"{MODEL_DIR_KEYWORD}/{ENV_TARBALL_NAME}"
#: The stub's file name; in a model directory it replaces the backend's stub.
STUB_NAME = "triton_python_backend_stub"
#: ``--model-config-name`` of the env config variant.
ENV_CONFIG_NAME = "env"
#: The NGC/python_backend release branch of the embedded server (Triton 2.51.0).
EMBEDDED_TRITON_RELEASE = "r24.10"

ENV_SPEC_DIR = PACKAGE_PARENT / "env"
STUB_OUT_DIR = PACKAGE_PARENT / "stub_build" / "out"
STUB_BUILD_SCRIPT = PACKAGE_PARENT / "stub_build" / "build.sh"
#: Where ``env build`` writes by default (a sidecar ``.json`` manifest goes beside it).
DEFAULT_ENV_OUTPUT = PACKAGE_PARENT / ".cache" / "env" / ENV_TARBALL_NAME

#: What ``verify`` imports in a full env (the models' modules import the rest).
#: ``triton_python_backend_utils`` comes from the server's backend directory, as in the stub.
DEFAULT_IMPORTS = (
    "numpy",
    "yaml",
    "tokenizers",
    "transformers",
    "onnxruntime",
    "triton_python_backend_utils",
    "orchestrator.runtime.models.tokenizer",
    "orchestrator.runtime.models.onnx_classifier",
    "orchestrator.runtime.models.postprocess",
    "orchestrator.runtime.router",
)


class EnvError(RuntimeError):
    """Building, checking or installing an execution environment or a stub failed.

    The message names the step, the command and its output where a command failed.
    """


# ----------------------------------------------------------------------------------------
# ELF: needed libraries and symbol versions (GLIBCXX), read without external tools

_SHT_DYNAMIC = 6
_SHT_GNU_VERDEF = 0x6FFFFFFD
_SHT_GNU_VERNEED = 0x6FFFFFFE
_DT_NEEDED, _DT_RPATH, _DT_RUNPATH = 1, 15, 29


@dataclass(frozen=True)
class ElfInfo:
    """What the dynamic loader needs from and finds in one ELF file.

    ``needed``: ``DT_NEEDED`` sonames in order; ``rpath``: ``DT_RPATH``/``DT_RUNPATH``
    entries; ``version_needs``: symbol versions it requires (``GLIBCXX_3.4.30``, ``GLIBC_2.34``,
    ...; from ``.gnu.version_r``); ``version_defs``: versions it defines (a
    ``libstdc++.so.6`` defines ``GLIBCXX_3.4`` .. ``GLIBCXX_3.4.N``; ``.gnu.version_d``).
    """

    needed: tuple[str, ...] = ()
    rpath: tuple[str, ...] = ()
    version_needs: frozenset[str] = frozenset()
    version_defs: frozenset[str] = frozenset()


def _cstr(data: bytes, offset: int) -> str:
    end = data.find(b"\0", offset)
    return data[offset : end if end >= 0 else len(data)].decode("utf-8", "replace")


def parse_elf(data: bytes) -> ElfInfo | None:
    """Parse an ELF file's dynamic section and GNU symbol-version sections.

    ``data``: the whole file. Returns None for anything that is not a well-formed ELF
    file (never raises on bad input). Layouts: the System V gABI and the LSB's
    ``.gnu.version_r``/``.gnu.version_d`` (Elf_Verneed/Vernaux 16 bytes each, Elf_Verdef 20,
    Elf_Verdaux 8), for 32/64-bit and either byte order.
    """
    try:
        if data[:4] != b"\x7fELF":
            return None
        is64 = data[4] == 2
        end = "<" if data[5] == 1 else ">"
        if is64:
            shoff, = struct.unpack_from(end + "Q", data, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", data, 0x3A)
            sh_fmt = end + "IIQQQQIIQQ"
        else:
            shoff, = struct.unpack_from(end + "I", data, 0x20)
            shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", data, 0x2E)
            sh_fmt = end + "IIIIIIIIII"
        sections = []
        for i in range(shnum):
            # name, type, flags, addr, offset, size, link, info, addralign, entsize
            sections.append(struct.unpack_from(sh_fmt, data, shoff + i * shentsize))

        def strtab(index: int) -> tuple[int, int]:
            s = sections[index]
            return s[4], s[5]

        needed: list[str] = []
        rpath: list[str] = []
        needs: set[str] = set()
        defs: set[str] = set()
        for s in sections:
            stype, offset, size, link, info = s[1], s[4], s[5], s[6], s[7]
            if stype == _SHT_DYNAMIC:
                str_off, _ = strtab(link)
                entry = 16 if is64 else 8
                dyn_fmt = end + ("qQ" if is64 else "iI")
                for pos in range(offset, offset + size, entry):
                    tag, val = struct.unpack_from(dyn_fmt, data, pos)
                    if tag == 0:
                        break
                    if tag == _DT_NEEDED:
                        needed.append(_cstr(data, str_off + val))
                    elif tag in (_DT_RPATH, _DT_RUNPATH):
                        rpath.extend(p for p in _cstr(data, str_off + val).split(":") if p)
            elif stype == _SHT_GNU_VERNEED:
                str_off, _ = strtab(link)
                pos = offset
                for _ in range(info):
                    _version, cnt, _file, aux, nxt = struct.unpack_from(end + "HHIII", data, pos)
                    apos = pos + aux
                    for _ in range(cnt):
                        _hash, _flags, _other, name, anext = struct.unpack_from(end + "IHHII", data, apos)
                        needs.add(_cstr(data, str_off + name))
                        if not anext:
                            break
                        apos += anext
                    if not nxt:
                        break
                    pos += nxt
            elif stype == _SHT_GNU_VERDEF:
                str_off, _ = strtab(link)
                pos = offset
                for _ in range(info):
                    _version, flags, _ndx, cnt, _hash, aux, nxt = struct.unpack_from(end + "HHHHIII", data, pos)
                    if cnt and not flags & 0x1:  # VER_FLG_BASE names the file itself
                        name, = struct.unpack_from(end + "I", data, pos + aux)
                        defs.add(_cstr(data, str_off + name))
                    if not nxt:
                        break
                    pos += nxt
        return ElfInfo(tuple(needed), tuple(rpath), frozenset(needs), frozenset(defs))
    except (struct.error, IndexError, ValueError):
        return None


def _read_elf(path: Path) -> ElfInfo | None:
    try:
        with open(path, "rb") as fh:
            if fh.read(4) != b"\x7fELF":
                return None
            fh.seek(0)
            return parse_elf(fh.read())
    except OSError:
        return None


_GLIBCXX = re.compile(r"^(GLIBCXX|CXXABI)_(\d+(?:\.\d+)*)$")


def cxx_versions(names: Iterable[str]) -> set[str]:
    """The ``GLIBCXX_*``/``CXXABI_*`` names among ``names`` (what libstdc++ provides)."""
    return {n for n in names if _GLIBCXX.match(n)}


def version_key(name: str) -> tuple:
    """Sort key for ``GLIBCXX_3.4.30``-style names: (prefix, (3, 4, 30))."""
    m = _GLIBCXX.match(name)
    return (m.group(1), tuple(int(x) for x in m.group(2).split("."))) if m else (name, ())


def ldd(path: str | os.PathLike, ld_library_path: Sequence[str] | str | None = None) -> dict[str, str | None]:
    """Run ``ldd`` on ``path`` with ``LD_LIBRARY_PATH`` = ``ld_library_path`` (a list or a
    ``:``-joined string; None: this process's value). Returns ``{soname: resolved path or
    None when "not found"}`` in ldd's order. Raises EnvError when ldd is missing or fails
    on a file that is not a dynamic executable."""
    exe = shutil.which("ldd")
    if exe is None:
        raise EnvError("ldd is not installed (Debian/Ubuntu package libc-bin); it checks which libpython the stub loads")
    env = dict(os.environ)
    if ld_library_path is not None:
        env["LD_LIBRARY_PATH"] = ld_library_path if isinstance(ld_library_path, str) else os.pathsep.join(ld_library_path)
    proc = subprocess.run([exe, str(path)], capture_output=True, text=True, env=env)
    if proc.returncode != 0 and "=>" not in proc.stdout:
        raise EnvError(f"ldd {path} failed: {(proc.stderr or proc.stdout).strip()}")
    out: dict[str, str | None] = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"\s*(\S+)\s+=>\s+(.*?)\s*(\(0x[0-9a-f]+\))?$", line)
        if m:
            target = m.group(2)
            out[m.group(1)] = None if target == "not found" else target
    return out


# ----------------------------------------------------------------------------------------
# Stubs

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
    version = _parse_version(python)
    if triton != EMBEDDED_TRITON_RELEASE:
        raise EnvError(
            f"the embedded server is Triton 2.51 ({EMBEDDED_TRITON_RELEASE}); its prebuilt stubs do not fit "
            f"{triton}. Build one in the NGC container: make stub PYTHON={version[0]}.{version[1]} TRITON={triton}"
        )
    source = embedded_stub(version)
    target_dir = Path(out_dir or STUB_OUT_DIR) / f"{version[0]}.{version[1]}"
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / STUB_NAME
    copy_atomic(source, target, mode=0o755)
    info = inspect_stub(target)
    if info.python_version != version:
        raise EnvError(f"{target} links {info.libpython or 'no libpython'}, not libpython{version[0]}.{version[1]}")
    # The libpython comes from the env's lib/ at run time; here, from an interpreter of that
    # version if this machine has one (pyenv), so ldd shows a real resolution.
    lib_path = list(ld_library_path) if ld_library_path is not None else embedded_library_path()
    try:
        interpreter = find_python(f"{version[0]}.{version[1]}")
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
        "python": f"{version[0]}.{version[1]}",
        "libpython": info.libpython,
        "ldd_libpython": libs.get(info.libpython or "", None),
        "numpy2_support": info.numpy2,
    }
    (target_dir / "stub.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return target


# ----------------------------------------------------------------------------------------
# Interpreters


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


def _parse_version(value: str | Sequence[int]) -> tuple[int, int]:
    if not isinstance(value, str):
        return (int(value[0]), int(value[1]))
    m = re.match(r"^(?:python)?(\d+)\.(\d+)(?:\.\d+)?$", value.strip())
    if not m:
        raise EnvError(f"not a Python version: {value!r} (expected e.g. 3.12)")
    return (int(m.group(1)), int(m.group(2)))


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
    major, minor = _parse_version(version)
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


# ----------------------------------------------------------------------------------------
# Inspecting an env (a tarball or a directory), without running it

_SO_NAME = re.compile(r"\.so(\.\d+)*$")
_DIST_INFO = re.compile(r"(?:^|/)site-packages/([A-Za-z0-9_.]+)-([^/-]+)\.dist-info/METADATA$")


@dataclass
class EnvInfo:
    """What a packed (``.tar.gz``) or unpacked env holds, read without running it.

    ``kind``: ``"tarball"`` or ``"directory"``; ``flavour``: ``"conda"`` (``conda-meta/``),
    ``"venv"`` (``pyvenv.cfg``) or ``"unknown"``; ``python_version``: (major, minor) from
    ``pyvenv.cfg`` / ``conda-meta/python-*.json`` / the single ``lib/python3.X``;
    ``packages``: {normalized name: version} from ``*.dist-info``; ``has_activate``:
    ``bin/activate`` exists; ``lib_files``: names of files/links directly in ``lib/`` (the
    launcher puts that directory first on ``LD_LIBRARY_PATH``); ``libstdcxx_defs``: the
    symbol versions of the env's own ``lib/libstdc++.so*`` (empty if it has none);
    ``cxx_needs``: {file: GLIBCXX/CXXABI versions it requires} for its ELF files;
    ``venv_home``: ``pyvenv.cfg``'s ``home`` (a venv's base interpreter directory);
    ``gzip``: the tarball is gzip-compressed (what python_backend can extract).
    """

    path: Path
    kind: str
    flavour: str = "unknown"
    python_version: tuple[int, int] | None = None
    packages: dict[str, str] = field(default_factory=dict)
    has_activate: bool = False
    lib_files: set[str] = field(default_factory=set)
    libstdcxx_defs: set[str] = field(default_factory=set)
    cxx_needs: dict[str, set[str]] = field(default_factory=dict)
    venv_home: str | None = None
    gzip: bool = True

    @property
    def numpy_version(self) -> str | None:
        return self.packages.get("numpy")

    def libpython_in_lib(self, soname: str) -> bool:
        return soname in self.lib_files


def _norm_dist(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class _EnvScan:
    """Accumulates :class:`EnvInfo` from (relative name, kind, reader) entries."""

    def __init__(self, info: EnvInfo):
        self.info = info
        self.python_dirs: set[tuple[int, int]] = set()
        self.pyvenv: str | None = None
        self.conda_python: tuple[int, int] | None = None

    def add(self, name: str, is_file: bool, is_link: bool, read) -> None:
        name = name[2:] if name.startswith("./") else name
        parts = name.split("/")
        info = self.info
        if name == "bin/activate":
            info.has_activate = True
        elif name == "pyvenv.cfg" and is_file:
            self.pyvenv = read().decode("utf-8", "replace")
        elif parts[0] == "conda-meta":
            info.flavour = "conda"
            m = re.match(r"^python-(\d+)\.(\d+)\.[^-]*-.*\.json$", parts[-1]) if len(parts) == 2 else None
            if m:
                self.conda_python = (int(m.group(1)), int(m.group(2)))
        if len(parts) >= 2 and parts[0] == "lib":
            m = re.match(r"^python(\d+)\.(\d+)$", parts[1])
            if m and len(parts) >= 3:
                self.python_dirs.add((int(m.group(1)), int(m.group(2))))
            if len(parts) == 2 and (is_file or is_link):
                info.lib_files.add(parts[1])
        m = _DIST_INFO.search(name)
        if m:
            info.packages[_norm_dist(m.group(1))] = m.group(2)
        if is_file and not is_link and _SO_NAME.search(parts[-1]):
            elf = parse_elf(read())
            if elf is None:
                return
            if len(parts) == 2 and parts[0] == "lib" and parts[1].startswith("libstdc++.so"):
                info.libstdcxx_defs |= cxx_versions(elf.version_defs)
            needs = cxx_versions(elf.version_needs)
            if needs:
                info.cxx_needs[name] = needs

    def finish(self) -> EnvInfo:
        info = self.info
        if self.pyvenv is not None:
            if info.flavour == "unknown":
                info.flavour = "venv"
            for line in self.pyvenv.splitlines():
                key, _, value = line.partition("=")
                key, value = key.strip().lower(), value.strip()
                if key == "home":
                    info.venv_home = value
                elif key in ("version", "version_info") and info.python_version is None:
                    m = re.match(r"^(\d+)\.(\d+)", value)
                    if m:
                        info.python_version = (int(m.group(1)), int(m.group(2)))
        if info.python_version is None:
            info.python_version = self.conda_python
        if info.python_version is None and len(self.python_dirs) == 1:
            info.python_version = next(iter(self.python_dirs))
        return info


def inspect_env(path: str | os.PathLike, *, extract_libs_to: str | os.PathLike | None = None) -> EnvInfo:
    """Read an env: a ``.tar.gz`` (streamed once, nothing written) or a directory.

    ``extract_libs_to``: for a tarball, also extract its ``lib/libpython*`` and
    ``lib/libstdc++*`` members into ``<dir>/lib`` so ``ldd`` can resolve the stub's
    libraries as the launcher would. Raises EnvError when the path is missing or the
    tarball is unreadable.
    """
    path = Path(path)
    if not path.exists():
        raise EnvError(f"{path} does not exist")
    if path.is_dir():
        info = EnvInfo(path=path, kind="directory")
        scan = _EnvScan(info)
        for root, dirs, files in os.walk(path):
            for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
                full = Path(root) / name
                rel = full.relative_to(path).as_posix()
                is_link = full.is_symlink()
                scan.add(rel, full.is_file(), is_link, full.read_bytes)
        return scan.finish()
    info = EnvInfo(path=path, kind="tarball")
    with open(path, "rb") as fh:
        info.gzip = fh.read(2) == b"\x1f\x8b"
    scan = _EnvScan(info)
    lib_dest = Path(extract_libs_to) / "lib" if extract_libs_to else None
    if lib_dest:
        lib_dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                name = member.name[2:] if member.name.startswith("./") else member.name
                data_cache: list[bytes] = []

                def read(member=member, cache=data_cache) -> bytes:
                    if not cache:
                        fh = tar.extractfile(member)
                        cache.append(fh.read() if fh else b"")
                    return cache[0]

                scan.add(name, member.isfile(), member.issym() or member.islnk(), read)
                parts = name.split("/")
                if lib_dest and len(parts) == 2 and parts[0] == "lib" and parts[1].startswith(("libpython", "libstdc++")):
                    if member.isfile():
                        (lib_dest / parts[1]).write_bytes(read())
                    elif member.issym() and "/" not in member.linkname:
                        try:
                            os.symlink(member.linkname, lib_dest / parts[1])
                        except FileExistsError:
                            pass
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise EnvError(f"cannot read the env tarball {path}: {exc}") from exc
    return scan.finish()


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
    """``conda`` (or ``mamba``/``micromamba`` is not used: their CLIs differ) on PATH."""
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


def build_env(
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
            "(docs/deployment.md)."
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
                shutil.copytree(PACKAGE_PARENT / "orchestrator", source / "orchestrator", ignore=shutil.ignore_patterns("__pycache__"))
                for name in ("pyproject.toml", "README.md"):
                    shutil.copy2(PACKAGE_PARENT / name, source / name)
                steps.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", wheel_dir, source], env=env)
                wheels = sorted(wheel_dir.glob("orchestrator-*.whl"))
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


# ----------------------------------------------------------------------------------------
# Verify

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
    in ``imports`` imports, and the static checks of :func:`orchestrator.tooling.env.doctor.check_env`
    (libpython resolvable by ``ldd``, numpy vs the stub, GLIBCXX, ``bin/activate``).
    ``stub``: default the embedded server's stub for the env's Python version.
    Returns a :class:`VerifyReport`; raises EnvError listing every problem unless
    ``raise_on_problems`` is False.
    """
    from orchestrator.tooling.env import doctor

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
        problems += [f.message for f in doctor.check_env(info, stub_info, server_ld_path=lib_path, lib_dir=root / "lib") if f.is_problem]
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


# ----------------------------------------------------------------------------------------
# Install into model directories

_BACKEND_PYTHON = re.compile(r'^\s*backend\s*:\s*"python"', re.MULTILINE)
_ENV_PARAM = re.compile(
    r'parameters\s*:?\s*\{\s*key\s*:\s*"EXECUTION_ENV_PATH"\s*,?\s*value\s*:?\s*\{\s*string_value\s*:\s*"((?:[^"\\]|\\.)*)"\s*\}\s*\}',
    re.DOTALL,
)


def strip_pbtxt_comments(text: str) -> str:
    """``text`` without ``#`` comments (outside double-quoted strings)."""
    out_lines = []
    for line in text.splitlines():
        in_str, escaped, cut = False, False, len(line)
        for i, ch in enumerate(line):
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = not in_str
            elif ch == "#" and not in_str:
                cut = i
                break
        out_lines.append(line[:cut])
    return "\n".join(out_lines)


def effective_config(model_dir: str | os.PathLike, config_name: str | None) -> Path | None:
    """The config file Triton reads for ``--model-config-name=config_name``:
    ``configs/<name>.pbtxt`` where it exists, else ``config.pbtxt``; None if neither."""
    model_dir = Path(model_dir)
    if config_name:
        candidate = model_dir / "configs" / f"{config_name}.pbtxt"
        if candidate.is_file():
            return candidate
    default = model_dir / "config.pbtxt"
    return default if default.is_file() else None


def is_python_model(config_text: str) -> bool:
    """True when a config (pbtxt text) says ``backend: "python"``."""
    return bool(_BACKEND_PYTHON.search(strip_pbtxt_comments(config_text)))


def execution_env_path(config_text: str) -> str | None:
    """The ``EXECUTION_ENV_PATH`` parameter's string value in a pbtxt config, or None."""
    m = _ENV_PARAM.search(strip_pbtxt_comments(config_text))
    return m.group(1) if m else None


@dataclass
class InstalledModel:
    """One model directory after :func:`install_env`: the env config written, the tarball,
    the stub placed there (None when the server's own stub matches) and how the tarball got
    there (``hardlink`` or ``copy``)."""

    name: str
    config: Path
    tarball: Path
    stub: Path | None
    how: str


#: First line after the shebang of a dispatcher written by :func:`install_env`.
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
    """For a stub dispatcher written by :func:`install_env`: (its Python version, the
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


def _built_stub_release(directory: Path) -> str | None:
    """The ``triton_release`` of ``<directory>/stub.json`` beside a stub, or None."""
    try:
        if (directory / STUB_NAME).is_file():
            return json.loads((directory / "stub.json").read_text()).get("triton_release")
    except (OSError, ValueError):
        pass
    return None


def _place(source: Path, target: Path, link: bool) -> str:
    """Put ``source`` at ``target``: a hard link when possible (one copy on disk; Triton
    still extracts per path), else a copy; atomic either way."""
    if target.exists() and os.path.samefile(source, target):
        return "hardlink"
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    how = "copy"
    if link:
        try:
            os.link(source, tmp)
            how = "hardlink"
        except OSError:
            pass
    if how == "copy":
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)
    return how


def install_env(
    repo: str | os.PathLike,
    models: Sequence[str] | None = None,
    *,
    tarball: str | os.PathLike | None = None,
    stub: str | os.PathLike | None = None,
    server_python: str | Sequence[int] | None = None,
    base_config_name: str | None = "embedded",
    config_name: str = ENV_CONFIG_NAME,
    link: bool = True,
    triton: str = EMBEDDED_TRITON_RELEASE,
    dispatch: bool = True,
) -> list[InstalledModel]:
    """Install a packed env into model directories and write their env config variant.

    For each model of ``models`` (default: every model whose effective config for
    ``base_config_name`` is a Python-backend one): ``<model>/triton_env.tar.gz`` (a hard link
    to ``tarball`` where possible, default ``.cache/env/triton_env.tar.gz``);
    ``<model>/configs/<config_name>.pbtxt`` = that effective config with
    ``EXECUTION_ENV_PATH = $$TRITON_MODEL_DIRECTORY/triton_env.tar.gz`` (replacing any
    existing one); and, when the env's Python version differs from ``server_python`` (the
    version of the server's own stub; default: this interpreter's, as for the embedded
    server), ``<model>/triton_python_backend_stub``: ``stub`` if given, else
    ``stub_build/out/<3.x>/`` if its ``stub.json`` says release ``triton``, else (for the
    embedded server's release) the wheel's prebuilt one. Triton runs a model directory's
    stub for *every* config of that model, so with ``dispatch`` (default) the binary goes
    to ``triton_python_backend_stub.py3.X`` and ``triton_python_backend_stub`` is a small
    bash dispatcher that runs it only when the launcher activated the env, else the
    server's stub: the default configs keep working. ``dispatch=False`` places the binary
    itself (python_backend's documented layout; the model then runs only with the env).
    Stubs left in the model directory for another Python version are removed.

    Raises EnvError: no tarball, an unknown or non-Python model, no stub for that version,
    or a stub whose libpython does not match the env's Python.
    """
    repo = Path(repo)
    tarball = Path(tarball or DEFAULT_ENV_OUTPUT)
    if not tarball.is_file():
        raise EnvError(f"no env tarball at {tarball}: build one first (make env, or orchestrator env build)")
    info = inspect_env(tarball)
    if info.python_version is None:
        raise EnvError(f"{tarball}: cannot tell the env's Python version")
    env_py = info.python_version
    server_py = _parse_version(server_python) if server_python else tuple(sys.version_info[:2])
    stub_source: Path | None = None
    if env_py != server_py:
        if stub:
            stub_source = Path(stub)
        elif _built_stub_release(STUB_OUT_DIR / f"{env_py[0]}.{env_py[1]}") == triton:
            stub_source = STUB_OUT_DIR / f"{env_py[0]}.{env_py[1]}" / STUB_NAME
        elif triton == EMBEDDED_TRITON_RELEASE:
            stub_source = embedded_stub(env_py)
        else:
            raise EnvError(
                f"no Python {env_py[0]}.{env_py[1]} stub for Triton {triton} in {STUB_OUT_DIR}: "
                f"make stub PYTHON={env_py[0]}.{env_py[1]} TRITON={triton}"
            )
        stub_info = inspect_stub(stub_source)
        if stub_info.python_version != env_py:
            raise EnvError(
                f"the stub {stub_source} links {stub_info.libpython}, but the env is Python {env_py[0]}.{env_py[1]}"
            )
    if models is None:
        from orchestrator.tooling.server import list_models

        models = []
        for name in list_models(repo, base_config_name):
            cfg = effective_config(repo / name, base_config_name)
            if cfg is not None and is_python_model(cfg.read_text()):
                models.append(name)
    results = []
    for name in models:
        model_dir = repo / name
        base = effective_config(model_dir, base_config_name)
        if base is None:
            raise EnvError(f"{model_dir}: no config.pbtxt (not a model of {repo})")
        text = base.read_text()
        if not is_python_model(text):
            raise EnvError(f"{base}: not a Python-backend model (EXECUTION_ENV_PATH applies to backend: \"python\" only)")
        how = _place(tarball, model_dir / ENV_TARBALL_NAME, link)
        placed_stub = None
        existing = model_dir / STUB_NAME
        binary = model_dir / f"{STUB_NAME}.py{env_py[0]}.{env_py[1]}"
        for old in model_dir.glob(f"{STUB_NAME}.py*"):
            if old != binary or stub_source is None or not dispatch:
                old.unlink()  # ours, for another Python version
        if stub_source is not None and dispatch:
            copy_atomic(stub_source, binary, mode=0o755)
            script = _DISPATCHER.format(marker=DISPATCHER_MARKER, version=f"{env_py[0]}.{env_py[1]}", binary=binary.name)
            tmp = existing.with_name(f".{STUB_NAME}.{os.getpid()}.tmp")
            tmp.write_text(script)
            os.chmod(tmp, 0o755)
            os.replace(tmp, existing)
            placed_stub = existing
        elif stub_source is not None:
            copy_atomic(stub_source, existing, mode=0o755)
            placed_stub = existing
        elif existing.exists():
            if dispatcher_target(existing) is not None:
                stale = True
            else:
                try:
                    stale = inspect_stub(existing).python_version != env_py
                except EnvError:
                    stale = True
            if stale:
                existing.unlink()
        body = _ENV_PARAM.sub("", text).rstrip() + "\n"
        rel = base.relative_to(model_dir).as_posix()
        config = (
            f"# Generated by `orchestrator env install` from {rel}: the same model with its own packed Python\n"
            f"# environment (env Python {env_py[0]}.{env_py[1]}). Used with --model-config-name={config_name}.\n"
            + body
            + f'parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{ENV_PATH_VALUE}" }} }}\n'
        )
        target = model_dir / "configs" / f"{config_name}.pbtxt"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(config)
        results.append(InstalledModel(name, target, model_dir / ENV_TARBALL_NAME, placed_stub, how))
    return results


# ----------------------------------------------------------------------------------------
# Command line: `orchestrator env build|install|verify`, `orchestrator stub`


def add_env_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``orchestrator env`` subcommands (``build``, ``install``, ``verify``) to ``parser``."""
    sub = parser.add_subparsers(dest="env_command", required=True)
    build = sub.add_parser("build", help="build, pack and verify the models' execution environment")
    build.add_argument("--python", default=None, help="Python version of the env, e.g. 3.12 (default: this interpreter's)")
    build.add_argument("--target", default="cpu", help="cpu or gpu: env/requirements-<target>.txt (default: %(default)s)")
    build.add_argument("--tool", choices=("auto", "conda", "venv"), default="auto", help="conda-pack or venv-pack (default: conda where installed)")
    build.add_argument("--output", default=None, help=f"the .tar.gz (default: {DEFAULT_ENV_OUTPUT.relative_to(PACKAGE_PARENT)})")
    build.add_argument("--no-verify", action="store_true", help="skip the verification of the packed env")
    build.add_argument("--install", metavar="REPO", default=None, help="then install it into REPO's Python models (env install)")
    verify = sub.add_parser("verify", help="check a packed env against the stub that will run it")
    verify.add_argument("tarball", nargs="?", default=None, help="the env (.tar.gz or directory)")
    verify.add_argument("--stub", default=None, help="the stub that will run it (default: the embedded server's for its Python)")
    verify.add_argument("--import", dest="imports", action="append", default=None, metavar="MODULE", help="module to import (repeatable)")
    install = sub.add_parser("install", help="copy the env (and a matching stub) into model directories, write configs/env.pbtxt")
    for p in (install, build):
        p.add_argument("--models", default=None, help="comma-separated model names (default: every Python model)")
        p.add_argument("--server-python", default=None, help="the server stub's Python version (default: this interpreter's)")
        p.add_argument("--stub", default=None, help="stub to place when the versions differ (default: stub_build/out or the wheel's)")
        p.add_argument("--triton", default=EMBEDDED_TRITON_RELEASE, help="the server's release branch (default: %(default)s, the embedded server)")
    install.add_argument("--repo", default="model_repository", help="model repository (default: %(default)s)")
    install.add_argument("--tarball", default=None, help=f"the env (default: {DEFAULT_ENV_OUTPUT.relative_to(PACKAGE_PARENT)})")
    install.add_argument("--base-config-name", default="embedded", help="config to copy: configs/NAME.pbtxt, else config.pbtxt (default: %(default)s)")
    install.add_argument("--config-name", default=ENV_CONFIG_NAME, help="name of the written variant (default: %(default)s)")
    install.add_argument("--copy", action="store_true", help="copy the tarball instead of hard-linking it")
    install.add_argument(
        "--plain-stub",
        action="store_true",
        help="place the stub binary itself, not the dispatcher (the model then loads only with the env config)",
    )
    return parser


def _print_installed(results: Sequence[InstalledModel], repo: Path, config_name: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"execution env installed in {repo}")
    for col in ("model", "config", "tarball", "stub"):
        table.add_column(col)
    for r in results:
        if r.stub is None:
            stub = "server's"
        else:
            target = dispatcher_target(r.stub)
            stub = f"dispatcher -> {target[1].name}" if target else r.stub.name
        table.add_row(r.name, r.config.relative_to(r.config.parent.parent).as_posix(), f"{r.tarball.name} ({r.how})", stub)
    console = Console()
    console.print(table)
    console.print(f"Start the server with --model-config-name={config_name} to use it (orchestrator doctor --config-name {config_name} checks it).")


def env_command(args: argparse.Namespace) -> int:
    """Run ``orchestrator env ...``; returns 0, or 1 with the error on stderr."""
    models = [m.strip() for m in args.models.split(",") if m.strip()] if getattr(args, "models", None) else None
    try:
        if args.env_command == "build":
            built = build_env(args.python, args.target, output=args.output, tool=args.tool, verify=not args.no_verify, stub=args.stub)
            if args.install:
                results = install_env(
                    args.install, models, tarball=built.path, stub=args.stub, server_python=args.server_python, triton=args.triton
                )
                _print_installed(results, Path(args.install), ENV_CONFIG_NAME)
        elif args.env_command == "install":
            results = install_env(
                args.repo,
                models,
                tarball=args.tarball,
                stub=args.stub,
                server_python=args.server_python,
                base_config_name=args.base_config_name or None,
                config_name=args.config_name,
                link=not args.copy,
                triton=args.triton,
                dispatch=not args.plain_stub,
            )
            _print_installed(results, Path(args.repo), args.config_name)
        elif args.env_command == "verify":
            report = verify_env(args.tarball or DEFAULT_ENV_OUTPUT, stub=args.stub, imports=args.imports, raise_on_problems=False)
            print(f"env Python {report.python} ({report.executable}), numpy {report.numpy}, stub {report.stub.path if report.stub else '-'}")
            for name, error in report.imports.items():
                print(f"  import {name}: {'ok' if error is None else error}")
            for problem in report.problems:
                print(f"problem: {problem}", file=sys.stderr)
            return 1 if report.problems else 0
    except EnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def add_stub_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``orchestrator stub`` options to ``parser``."""
    parser.add_argument("--python", required=True, help="Python version the stub must embed, e.g. 3.12")
    parser.add_argument(
        "--triton",
        default=None,
        help=f"server release branch, e.g. r24.10 (default: the embedded server's, {EMBEDDED_TRITON_RELEASE}: "
        "its prebuilt stub, offline); another release is built with Docker (stub_build/build.sh)",
    )
    parser.add_argument("--out", default=None, help=f"output root (default: {STUB_OUT_DIR.relative_to(PACKAGE_PARENT)})")
    return parser


def stub_command(args: argparse.Namespace) -> int:
    """Run ``orchestrator stub``: the embedded server's stub for ``--python`` into
    ``<out>/<3.x>/`` with the ldd check, or ``stub_build/build.sh`` for another release.
    Returns 0, or the failure's exit status with the message on stderr."""
    triton = args.triton or EMBEDDED_TRITON_RELEASE
    try:
        version = _parse_version(args.python)
        if args.triton and args.triton != "embedded":
            cmd = ["bash", str(STUB_BUILD_SCRIPT), f"{version[0]}.{version[1]}", triton]
            if args.out:
                cmd.append(str(args.out))
            return subprocess.call(cmd)
        path = prepare_stub(version, args.out)
    except EnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    manifest = json.loads((path.parent / "stub.json").read_text())
    print(f"stub: {path}")
    print(f"  ldd: {manifest['libpython']} => {manifest['ldd_libpython'] or 'not found on this machine (an env lib/ provides it at run time)'}")
    if manifest["numpy2_support"] is False:
        print("  built with pybind11 < 2.12: numpy<2 only in the env it runs (orchestrator doctor explains)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m orchestrator.tooling.env.envtools env ...|stub ...`` (what the Makefile runs)."""
    parser = argparse.ArgumentParser(prog="python -m orchestrator.tooling.env.envtools", description=__doc__.split("\n\n")[0])
    from orchestrator.tooling.cli import add_subcommand

    sub = parser.add_subparsers(dest="command", required=True)
    add_subcommand(sub, "env", "execution environments", add_env_arguments, env_command)
    add_subcommand(sub, "stub", "Python-backend stubs", add_stub_arguments, stub_command)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
