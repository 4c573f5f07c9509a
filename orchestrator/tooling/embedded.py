"""The embedded Triton from the ``nvidia-pytriton==0.7.0`` wheel: where its pieces are, and
what a ``tritonserver`` child process and its Python-backend stubs need to run our models.

:mod:`orchestrator.tooling.server` starts the server with these; :mod:`orchestrator.tooling.env`
uses the wheel's stubs and library path. What the wheel holds and how the stub behaves were
read on these machines and are checked by ``tests/server/test_server.py``:

- The wheel carries ``pytriton/tritonserver/bin/tritonserver``,
  ``pytriton/tritonserver/backends/python/`` and one prebuilt Python-backend stub per
  CPython version under ``pytriton/tritonserver/python_backend_stubs/<3.x>/``; its shared
  libraries live in ``site-packages/nvidia_pytriton.libs`` (``LD_LIBRARY_PATH``)
  (``test_find_embedded_server_paths``).
- A backend directory is prepared in a cache: a copy of ``backends/python`` plus the stub
  matching the serving interpreter (``sys.version_info``)
  (``test_prepare_backend_directory_is_idempotent_and_concurrency_safe``). Other backends
  (Triton's ``onnxruntime`` built for this release) can be served beside it: a separate
  directory links them next to ``python/``, and the wheel's core library, which carries an
  auditwheel name, gets a ``libtritonserver.so`` alias for them
  (``tests/unit/test_native_backend_tooling.py``; the real server:
  ``tests/server/test_native_backend.py``).
- The stub embeds ``libpython3.X`` with an *isolated* configuration
  (``sys.flags.isolated == 1``): it ignores ``PYTHONPATH``, and a model's ``import numpy``
  fails (``ModuleNotFoundError``) although numpy is in the venv. The stub imports the
  model module before ``triton_python_backend_utils``, so the fix must act at interpreter
  startup: the embedded interpreter still searches ``PATH`` for ``python3`` to find
  ``sys.executable``, and ``site`` honours a ``pyvenv.cfg`` beside it. So a tiny "stub
  environment" (:func:`prepare_stub_environment`) goes first on ``PATH``; its ``.pth``
  adds the ``PYTHONPATH`` entries (this repository, the venv's site-packages) to
  ``sys.path`` (``test_prepare_stub_environment``; every real-server test imports numpy
  and this package in its models). The interpreter's own shared ``libpython`` (pyenv)
  goes on ``LD_LIBRARY_PATH`` so the stub runs the same CPython build; without it the stub
  falls back to the system's ``libpython3.X`` (Debian package ``libpython3.11``).

Errors are :class:`ServerError`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import site
import sys
import sysconfig
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from orchestrator.tooling.errors import ToolingError
from orchestrator.tooling.files import write_atomic
from orchestrator.tooling.paths import PROJECT_ROOT, in_checkout

# Python 3.11's sysconfig fills its variable cache on first use without a lock, so a second
# thread can read a half-filled cache (LIBDIR None): two servers started from two threads
# then gave one of them the system libpython (ImportError in _ssl). Fill it at import.
sysconfig.get_config_vars()

__all__ = [
    "ServerError",
    "EmbeddedServer",
    "find_embedded_server",
    "default_cache_dir",
    "extra_backends",
    "prepare_backend_directory",
    "prepare_core_library_alias",
    "prepare_stub_environment",
    "server_environment",
]


class ServerError(ToolingError):
    """The embedded server could not be found, prepared, started or driven.

    The message includes the log's error lines, the log path and the command line
    where a server process was involved.
    """


# ----------------------------------------------------------------------------------------
# The wheel and the backend directory

@dataclass(frozen=True)
class EmbeddedServer:
    """Paths inside an installed ``nvidia-pytriton`` wheel.

    ``server``: the ``tritonserver`` binary; ``backends``: the wheel's backend directory
    (holds ``python/``); ``stubs``: ``python_backend_stubs`` (one ``<3.x>/`` per CPython
    version); ``libs``: ``nvidia_pytriton.libs`` (goes on ``LD_LIBRARY_PATH``).
    """

    server: Path
    backends: Path
    stubs: Path
    libs: Path

    @property
    def caches(self) -> Path:
        """The wheel's cache implementations (``local/libtritoncache_local.so``), for
        ``--cache-dir``; Triton's default, ``/opt/tritonserver/caches``, is not there."""
        return self.server.parent.parent / "caches"

    def stub(self, version: Sequence[int] | None = None) -> Path:
        """The prebuilt stub for CPython ``version`` (default: this interpreter's).

        Raises ServerError when the wheel has no stub for it.
        """
        major, minor = tuple(version or sys.version_info[:2])[:2]
        path = self.stubs / f"{major}.{minor}" / "triton_python_backend_stub"
        if not path.is_file():
            have = sorted(p.name for p in self.stubs.iterdir() if p.is_dir()) if self.stubs.is_dir() else []
            raise ServerError(
                f"the nvidia-pytriton wheel has no Python-backend stub for Python {major}.{minor} "
                f"(it has: {', '.join(have) or 'none'}); serve from one of those interpreters"
            )
        return path


def find_embedded_server() -> EmbeddedServer:
    """Locate Triton inside the installed ``nvidia-pytriton`` wheel.

    Returns the paths as an :class:`EmbeddedServer`. Raises ServerError naming the
    missing piece (and the install command) when the wheel or part of it is absent.
    """
    # find_spec does not import pytriton (its import pulls in much more than we need).
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServerError(
            "the embedded Triton server needs the nvidia-pytriton wheel, which is not installed "
            f"for {sys.executable}: pip install 'triton-orchestrator[serve]' (in a checkout: `make demo`)"
        )
    package = Path(next(iter(spec.submodule_search_locations)))
    root = package / "tritonserver"
    found = EmbeddedServer(
        server=root / "bin" / "tritonserver",
        backends=root / "backends",
        stubs=root / "python_backend_stubs",
        libs=package.parent / "nvidia_pytriton.libs",
    )
    for what, path in (
        ("server binary", found.server),
        ("Python backend", found.backends / "python" / "libtriton_python.so"),
        ("Python backend stubs", found.stubs),
        ("shared libraries", found.libs),
    ):
        if not path.exists():
            raise ServerError(
                f"the nvidia-pytriton wheel at {package} is incomplete: no {what} at {path}; "
                "reinstall it: pip install --force-reinstall 'nvidia-pytriton==0.7.0'"
            )
    return found


def default_cache_dir() -> Path:
    """``$ORCHESTRATOR_CACHE_DIR``, else ``<repo>/.cache/triton`` in a checkout, else
    ``~/.cache/orchestrator/triton`` (an installed, non-editable package)."""
    env = os.environ.get("ORCHESTRATOR_CACHE_DIR")
    if env:
        return Path(env).expanduser().resolve()
    if in_checkout():
        return PROJECT_ROOT / ".cache" / "triton"
    return Path.home() / ".cache" / "orchestrator" / "triton"


# The module the stub environment's .pth imports at interpreter startup (see module doc).
_STUB_PATH_MODULE = '''\
"""Written by orchestrator.tooling.embedded. The Python-backend stub embeds CPython with an isolated
configuration, which ignores PYTHONPATH. This runs at startup (a .pth import line in the
stub environment, before any model module) and adds the PYTHONPATH entries in front of
sys.path, as PYTHONPATH would; site.addsitedir, so their .pth files (editable installs)
work too."""
import os
import site
import sys

_before = list(sys.path)
for _entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    if _entry and os.path.isdir(_entry) and _entry not in _before:
        site.addsitedir(_entry)
sys.path[:] = [p for p in sys.path if p not in _before] + _before
'''


def _symlink(target: Path, points_to: str) -> None:
    """Make ``target`` a symlink to ``points_to`` atomically (temp link + rename)."""
    try:
        if os.readlink(target) == points_to:
            return
    except OSError:
        pass
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(points_to, tmp)
    os.replace(tmp, target)


def extra_backends(backend_dirs: Iterable[str | os.PathLike]) -> dict[str, Path]:
    """The backends found in other backend directories, to serve beside the wheel's Python
    backend: ``{name: <dir>/<name>}`` for every ``<dir>/<name>/libtriton_<name>.so`` (the
    layout of Triton's ``--backend-directory``, e.g. ``/opt/tritonserver/backends`` or a
    locally built ``onnxruntime_backend`` installed as ``<dir>/onnxruntime/``).

    Raises ServerError naming the directory when one is not a directory or holds no
    backend, when it holds ``python`` (this package serves the wheel's own, matched to its
    stub), or when two directories hold a backend of the same name.
    """
    found: dict[str, Path] = {}
    for given in backend_dirs:
        root = Path(given).expanduser().resolve()
        if not root.is_dir():
            raise ServerError(f"backend directory {given} is not a directory")
        names = sorted(p.name for p in root.iterdir() if (p / f"libtriton_{p.name}.so").is_file())
        if not names:
            raise ServerError(
                f"backend directory {given} holds no backend: expected <name>/libtriton_<name>.so "
                f"(e.g. {root / 'onnxruntime' / 'libtriton_onnxruntime.so'})"
            )
        for name in names:
            if name == "python":
                raise ServerError(
                    f"backend directory {given} holds a python backend; the embedded server uses "
                    "the nvidia-pytriton wheel's (matched to its stub), so name a directory without it"
                )
            if name in found:
                raise ServerError(f"backend {name!r} is in both {found[name].parent} and {root}")
            found[name] = root / name
    return found


def prepare_backend_directory(
    cache_dir: str | os.PathLike | None = None,
    *,
    embedded: EmbeddedServer | None = None,
    python_version: Sequence[int] | None = None,
    backend_dirs: Sequence[str | os.PathLike] = (),
) -> Path:
    """Prepare ``<cache>/backends`` for ``--backend-directory`` and return its path.

    ``<cache>/backends/python/`` gets the wheel's ``backends/python`` files and the stub
    for ``python_version`` (default ``sys.version_info``) as
    ``triton_python_backend_stub`` (mode 755). Idempotent and safe under concurrent
    calls: every file is written to a temporary name and renamed into place, and only
    when its content differs.

    ``backend_dirs``: other backend directories whose backends (:func:`extra_backends`)
    are served too. Triton takes one ``--backend-directory``, so then the directory is
    ``<cache>/backends-<digest of those paths>/``: the same ``python/`` plus a symlink
    ``<name> -> <dir>/<name>`` per extra backend (a link, so the backend's own libraries
    beside it, found through its ``$ORIGIN`` run path, stay where they were built). The
    plain ``<cache>/backends`` never gets extra backends, so a server started without
    them cannot load a model for one by accident.

    Raises ServerError (no wheel, no stub for that Python version, unwritable cache, a
    backend directory :func:`extra_backends` refuses).
    """
    embedded = embedded or find_embedded_server()
    version = tuple(python_version or sys.version_info[:2])[:2]
    stub = embedded.stub(version)
    extras = extra_backends(backend_dirs)
    name = "backends"
    if extras:
        digest = hashlib.sha256("\n".join(f"{k}={v}" for k, v in sorted(extras.items())).encode()).hexdigest()
        name = f"backends-{digest[:12]}"
    target = Path(cache_dir or default_cache_dir()) / name / "python"
    try:
        target.mkdir(parents=True, exist_ok=True)
        source = embedded.backends / "python"
        for path in sorted(source.iterdir()):
            if path.is_file():  # not __pycache__
                write_atomic(target / path.name, path.read_bytes(), 0o755 if path.suffix == ".so" else 0o644, if_changed=True)
        write_atomic(target / "triton_python_backend_stub", stub.read_bytes(), 0o755, if_changed=True)
        for backend, path in extras.items():
            _symlink(target.parent / backend, str(path))
    except OSError as exc:
        raise ServerError(f"cannot prepare the Triton backend directory {target}: {exc}") from exc
    return target.parent


def prepare_core_library_alias(
    cache_dir: str | os.PathLike | None = None, *, embedded: EmbeddedServer | None = None
) -> Path:
    """Prepare ``<cache>/core_lib/libtritonserver.so`` and return its directory, for
    ``LD_LIBRARY_PATH`` when other backends are served (:func:`prepare_backend_directory`).

    A backend built from Triton's sources needs ``libtritonserver.so`` (ELF ``NEEDED``); the
    wheel carries Triton's core under an auditwheel name, ``libtritonserver-<hash>.so``, so
    the name resolves to nothing and the model fails to load ("unable to load shared
    library: libtritonserver.so"). The alias is a symlink to that file: the dynamic loader
    sees the file the server has already loaded (same device and inode) and does not load
    a second copy. Raises ServerError when the wheel has no such library or the cache is
    not writable.
    """
    embedded = embedded or find_embedded_server()
    found = sorted(embedded.libs.glob("libtritonserver*.so*"))
    if not found:
        raise ServerError(f"the nvidia-pytriton wheel has no libtritonserver*.so in {embedded.libs}")
    target = Path(cache_dir or default_cache_dir()) / "core_lib"
    try:
        target.mkdir(parents=True, exist_ok=True)
        _symlink(target / "libtritonserver.so", str(found[0]))
    except OSError as exc:
        raise ServerError(f"cannot prepare {target}: {exc}") from exc
    return target


def prepare_stub_environment(cache_dir: str | os.PathLike | None = None) -> Path:
    """Prepare ``<cache>/stub_env/py3.X`` for this interpreter and return its path.

    The stub's embedded CPython finds its ``sys.executable`` by searching ``PATH`` for
    ``python3`` (seen: ``/root/.pyenv/shims/python3``), and ``site`` then treats a
    ``pyvenv.cfg`` next to that executable's directory as a virtual environment (the same
    mechanism Triton's ``EXECUTION_ENV_PATH`` relies on after ``source bin/activate``).
    This environment has ``bin/python3`` (a symlink to this interpreter's base
    executable), a ``pyvenv.cfg`` whose ``home`` is that executable's directory (the
    stdlib comes from there), and in its ``site-packages`` a ``.pth`` that imports
    ``_orchestrator_stub_path`` (adds ``PYTHONPATH``). :func:`server_environment` puts its
    ``bin`` first on ``PATH``. Idempotent and safe under concurrent calls (temp + rename).
    Raises ServerError when the cache is not writable.
    """
    major, minor = sys.version_info[:2]
    base = Path(getattr(sys, "_base_executable", "") or os.path.realpath(sys.executable))
    root = Path(cache_dir or default_cache_dir()) / "stub_env" / f"py{major}.{minor}"
    site_packages = root / "lib" / f"python{major}.{minor}" / "site-packages"
    try:
        (root / "bin").mkdir(parents=True, exist_ok=True)
        site_packages.mkdir(parents=True, exist_ok=True)
        cfg = (
            f"home = {base.parent}\n"
            "include-system-site-packages = false\n"
            f"version = {'.'.join(map(str, sys.version_info[:3]))}\n"
            f"executable = {base}\n"
        )
        write_atomic(root / "pyvenv.cfg", cfg.encode(), 0o644, if_changed=True)
        for name in ("python3", f"python{major}.{minor}", "python"):
            _symlink(root / "bin" / name, str(base))
        write_atomic(site_packages / "_orchestrator_stub_path.py", _STUB_PATH_MODULE.encode(), 0o644, if_changed=True)
        write_atomic(site_packages / "_orchestrator_stub_path.pth", b"import _orchestrator_stub_path\n", 0o644, if_changed=True)
    except OSError as exc:
        raise ServerError(f"cannot prepare the stub environment {root}: {exc}") from exc
    return root


def _libpython_dir() -> str | None:
    """This interpreter's ``LIBDIR`` when it holds its shared ``libpython3.X.so.1.0`` and is
    not a system directory, so the stub loads the same libpython build as this
    interpreter (pyenv builds with ``--enable-shared``; else the stub falls back to the
    system's ``libpython3.X``)."""
    libdir = sysconfig.get_config_var("LIBDIR")
    soname = sysconfig.get_config_var("INSTSONAME")
    if not (sysconfig.get_config_var("Py_ENABLE_SHARED") and libdir and soname):
        return None
    if not (Path(libdir) / soname).exists() or libdir.startswith(("/usr/lib", "/lib")):
        return None
    return libdir


# ----------------------------------------------------------------------------------------
# The process environment


def _dedupe(items: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for item in items:
        if item and item not in seen:
            seen.add(item)
            out.append(item)
    return out


def server_environment(
    embedded: EmbeddedServer | None = None,
    env: Mapping[str, str] | None = None,
    base: Mapping[str, str] | None = None,
    stub_env: str | os.PathLike | None = None,
) -> dict[str, str]:
    """The environment for ``tritonserver`` and its Python-backend stubs.

    ``base`` (default ``os.environ``) plus: ``LD_LIBRARY_PATH`` = the wheel's libs dir
    (and this interpreter's shared-libpython dir, see :func:`_libpython_dir`) in front of
    the existing value; ``PYTHONPATH`` = the directory holding the ``orchestrator``
    package, then the existing value, then this interpreter's site-packages
    (``site.getsitepackages()``, ``sysconfig`` purelib/platlib): the order this interpreter
    itself uses, so a package on ``PYTHONPATH`` (numpy 1.x beside an image's numpy 2, say)
    wins in the stubs as it does here; ``PATH`` = ``<stub_env>/bin`` first when
    ``stub_env`` (:func:`prepare_stub_environment`) is given; ``HF_HUB_OFFLINE=1``,
    ``TRANSFORMERS_OFFLINE=1``, ``TOKENIZERS_PARALLELISM=false``. ``env`` is merged last.
    """
    embedded = embedded or find_embedded_server()
    out = dict(os.environ if base is None else base)
    out["LD_LIBRARY_PATH"] = os.pathsep.join(
        _dedupe([str(embedded.libs), _libpython_dir() or "", *out.get("LD_LIBRARY_PATH", "").split(os.pathsep)])
    )
    if stub_env is not None:
        out["PATH"] = os.pathsep.join(_dedupe([str(Path(stub_env) / "bin"), *out.get("PATH", "").split(os.pathsep)]))
    try:
        site_dirs = list(site.getsitepackages())
    except AttributeError:  # some embedded/virtualenv builds lack it
        site_dirs = []
    paths = sysconfig.get_paths()
    out["PYTHONPATH"] = os.pathsep.join(
        _dedupe(
            [
                str(PROJECT_ROOT),
                *out.get("PYTHONPATH", "").split(os.pathsep),
                *site_dirs,
                paths.get("purelib", ""),
                paths.get("platlib", ""),
            ]
        )
    )
    out.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    out.update(env or {})
    return out
