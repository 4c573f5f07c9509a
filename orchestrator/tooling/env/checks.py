"""Static checks of an execution environment against the stub that will run it: nothing is
executed but ``ldd``. ``orchestrator doctor`` (:mod:`.doctor`, whose docstring explains each
diagnosis) and ``env verify`` (:mod:`.verify`) both use them.

A check returns :class:`Finding` objects: ``level`` ``problem`` (the model will not load or
will answer wrongly), ``warning`` (cannot tell) or ``ok`` (a fact worth showing).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from orchestrator.tooling.env.common import EnvError, version_text
from orchestrator.tooling.env.elf import cxx_versions, ldd, read_elf, version_key
from orchestrator.tooling.env.inspection import EnvInfo
from orchestrator.tooling.env.stubs import StubInfo

__all__ = ["PROBLEM", "WARNING", "OK", "Finding", "check_libpython", "check_numpy", "check_env"]

PROBLEM, WARNING, OK = "problem", "warning", "ok"


@dataclass(frozen=True)
class Finding:
    """One diagnosis: ``level`` (``problem``/``warning``/``ok``), ``kind`` (``libpython``,
    ``version``, ``glibcxx``, ``numpy``, ``env-path``, ``base-interpreter``, ``stub``,
    ``config``) and a
    sentence that says what is wrong and how to fix it."""

    level: str
    kind: str
    message: str

    @property
    def is_problem(self) -> bool:
        return self.level == PROBLEM


def _libstdcxx_of(stub: StubInfo, ld_path: Sequence[str]) -> tuple[str | None, set[str]]:
    """The libstdc++ the stub resolves with ``ld_path`` and the versions it defines."""
    try:
        resolved = ldd(stub.path, list(ld_path)).get("libstdc++.so.6")
    except EnvError:
        return None, set()
    if not resolved:
        return None, set()
    elf = read_elf(Path(resolved))
    return resolved, cxx_versions(elf.version_defs) if elf else set()


def check_libpython(stub: StubInfo, ld_path: Sequence[str], lib_dir: Path | None = None) -> list[Finding]:
    """Does ``ldd`` resolve the stub's ``libpython3.X.so.1.0`` with ``LD_LIBRARY_PATH`` =
    ``ld_path``? ``lib_dir``: the env's ``lib/`` (first in ``ld_path``; None for a model
    without env). Returns an ``ok`` finding with the ldd line (``"libpython3.12.so.1.0 =>
    <env>/lib/libpython3.12.so.1.0"`` for the env's own copy), a ``problem`` saying where to
    get it, or a ``warning`` when ldd cannot run; [] for a stub without libpython."""
    if not stub.libpython:
        return []
    findings: list[Finding] = []
    try:
        resolved = ldd(stub.path, list(ld_path)).get(stub.libpython)
    except EnvError as exc:
        resolved = None
        findings.append(Finding(WARNING, "libpython", str(exc)))
    if resolved:
        # A tarball's libs were extracted to a temp dir: name them as the env's.
        shown = "<env>/lib/" + Path(resolved).name if lib_dir is not None and Path(resolved).parent == lib_dir else resolved
        findings.append(Finding(OK, "libpython", f"{stub.libpython} => {shown}"))
    elif lib_dir is not None:
        findings.append(
            Finding(
                PROBLEM,
                "libpython",
                f"missing libpython: the stub needs {stub.libpython}, found neither in the env's lib/ nor on the server's "
                f"library path: copy the base interpreter's {stub.libpython} into the env's lib/ (make env does) or "
                f"install libpython{version_text(stub.python_version)} on the server",
            )
        )
    else:
        findings.append(
            Finding(PROBLEM, "libpython", f"missing libpython: the stub needs {stub.libpython}, not found on the server's library path")
        )
    return findings

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
        v = version_text(info.python_version)
        findings.append(
            Finding(
                PROBLEM,
                "version",
                f"{where} is Python {v} but the stub {stub.path} links {stub.libpython} (Python {version_text(stub.python_version)}): "
                f"put the Python {v} stub in the model directory (make stub PYTHON={v}; orchestrator env install does it)",
            )
        )
    if stub.python_version is None:
        findings.append(Finding(PROBLEM, "stub", f"the stub {stub.path} links no libpython3.X: not a Python-backend stub"))
    lib_dir = Path(lib_dir) if lib_dir is not None else info.path / "lib"
    ld_path = [str(lib_dir), *server_ld_path]
    findings += check_libpython(stub, ld_path, lib_dir)
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
        exe = home / f"python{version_text(info.python_version)}"
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
