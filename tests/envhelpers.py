"""Helpers of the execution-environment tests (tests/unit/test_env.py, test_doctor.py,
tests/server/test_env_server.py and the env fixtures in conftest.py):

- :func:`make_wheel` (a wheel of the tiny ``envprobe`` package, written with zipfile, no
  network), :func:`cached_wheel` (a binary wheel for another CPython version, downloaded
  once into ``<repo>/.cache/wheels``);
- :func:`build_probe_env`: a venv-pack'ed env of :data:`ENV_PY` with those wheels;
- :func:`fake_env` (an unpacked env laid out like a venv-pack/conda-pack env) and
  :func:`make_elf` (a minimal ELF64 shared object with chosen symbol versions);
- :func:`probe_repo`: the env-probe model in a repository.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Iterable, Sequence

from tests.helpers import FIXTURES, ROOT

ENV_FIXTURES = FIXTURES / "env"
WHEEL_CACHE = ROOT / ".cache" / "wheels"
SERVER_PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
# The env's Python must differ from the server's (whose stub is this interpreter's version).
ENV_PY = "3.12" if SERVER_PY != "3.12" else "3.11"

def make_wheel(dest: Path, name: str = "envprobe", version: str = "0.1.0") -> Path:
    """Zip ``tests/fixtures/env/<name>_src/<name>/`` into a pure-Python wheel in ``dest``
    (``_src``: so this directory on ``sys.path`` does not make ``<name>`` importable)."""
    dest.mkdir(parents=True, exist_ok=True)
    files: dict[str, bytes] = {}
    source = ENV_FIXTURES / f"{name}_src" / name
    for path in sorted(source.rglob("*.py")):
        files[f"{name}/{path.relative_to(source).as_posix()}"] = path.read_bytes()
    info = f"{name}-{version}.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: envhelpers\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for arc, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{arc},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for arc, data in files.items():
            zf.writestr(arc, data)
    return wheel


def cached_wheel(project: str, version: str, python: str) -> Path:
    """The manylinux x86_64 wheel of ``project==version`` for CPython ``python`` ("3.12") in
    the wheel cache, downloaded with pip the first time. Raises RuntimeError (with pip's
    output) when it cannot be had."""
    tag = "cp" + python.replace(".", "")
    pattern = f"{project}-{version}-{tag}-{tag}-*.whl"
    found = sorted(WHEEL_CACHE.glob(pattern))
    if found:
        return found[0]
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         "--python-version", python, "--implementation", "cp", "--platform", "manylinux2014_x86_64",
         "-d", str(WHEEL_CACHE), f"{project}=={version}"],
        capture_output=True, text=True,
    )
    found = sorted(WHEEL_CACHE.glob(pattern))
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"cannot download {project}=={version} for Python {python}: {proc.stdout}{proc.stderr}")
    return found[0]


def fake_env(
    root: Path,
    python: str = "3.12",
    *,
    numpy: str | None = "1.26.4",
    activate: bool = True,
    libpython: Path | None = None,
    home: str | None = None,
    flavour: str = "venv",
) -> Path:
    """An unpacked env directory at ``root`` with the files the doctor reads: ``pyvenv.cfg``
    (venv; ``home`` default: pyenv's bin of that version) or ``conda-meta/python-*.json``,
    ``bin/activate``, ``lib/python3.X/site-packages/numpy-<v>.dist-info/METADATA`` and
    ``lib/<libpython>`` when given (a copy)."""
    site = root / "lib" / f"python{python}" / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    (root / "bin").mkdir(parents=True, exist_ok=True)
    if flavour == "venv":
        if home is None:
            versions = sorted((Path.home() / ".pyenv" / "versions").glob(f"{python}.*"))
            home = str(versions[-1] / "bin") if versions else "/nonexistent/bin"
        (root / "pyvenv.cfg").write_text(f"home = {home}\ninclude-system-site-packages = false\nversion = {python}.0\n")
    else:
        (root / "conda-meta").mkdir(exist_ok=True)
        (root / "conda-meta" / f"python-{python}.0-h0_0.json").write_text("{}")
    if activate:
        (root / "bin" / "activate").write_text('export PATH="$(dirname "${BASH_SOURCE[0]}"):$PATH"\n')
    if numpy:
        dist = site / f"numpy-{numpy}.dist-info"
        dist.mkdir(exist_ok=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: numpy\nVersion: {numpy}\n")
    if libpython is not None:
        (root / "lib" / libpython.name).write_bytes(libpython.read_bytes())
    return root


def make_elf(path: Path, *, needs: Sequence[tuple[str, Iterable[str]]] = (), defs: Iterable[str] = ()) -> Path:
    """Write a minimal little-endian ELF64 shared object to ``path``.

    ``needs``: ``[(soname, [version names])]`` for ``.gnu.version_r`` (what a C++ extension
    built against a newer libstdc++ carries); ``defs``: version names for
    ``.gnu.version_d`` (what a ``libstdc++.so.6`` carries). No code, no dynamic section:
    enough for a reader of section headers (the doctor's), not for the loader.
    """
    strtab = bytearray(b"\0")

    def s(name: str) -> int:
        off = len(strtab)
        strtab.extend(name.encode() + b"\0")
        return off

    verneed = bytearray()
    needs = list(needs)
    for i, (soname, versions) in enumerate(needs):
        versions = list(versions)
        file_off = s(soname)
        aux = bytearray()
        for j, v in enumerate(versions):
            nxt = 16 if j < len(versions) - 1 else 0
            aux += struct.pack("<IHHII", 0, 0, 2 + j, s(v), nxt)
        nxt = 16 + len(aux) if i < len(needs) - 1 else 0
        verneed += struct.pack("<HHIII", 1, len(versions), file_off, 16, nxt) + aux
    verdef = bytearray()
    defs = ["libstdc++.so.6", *defs] if defs else []
    for i, v in enumerate(defs):
        nxt = 28 if i < len(defs) - 1 else 0
        flags = 1 if i == 0 else 0  # VER_FLG_BASE on the file's own entry
        verdef += struct.pack("<HHHHIII", 1, flags, i + 1, 1, 0, 20, nxt) + struct.pack("<II", s(v), 0)
    shstr = b"\0.dynstr\0.gnu.version_r\0.gnu.version_d\0.shstrtab\0"
    body = bytearray(64)
    sections = [(0, 0, 0, 0, 0, 0)]  # name, type, offset, size, link, info

    def add(name_off, stype, data, link=0, info=0):
        off = len(body)
        body.extend(data)
        sections.append((name_off, stype, off, len(data), link, info))

    add(1, 3, bytes(strtab))  # .dynstr (SHT_STRTAB), index 1
    if needs:
        add(9, 0x6FFFFFFE, bytes(verneed), link=1, info=len(needs))
    if defs:
        add(24, 0x6FFFFFFD, bytes(verdef), link=1, info=len(defs))
    add(39, 3, shstr)
    shoff = len(body)
    for name, stype, off, size, link, info in sections:
        body += struct.pack("<IIQQQQIIQQ", name, stype, 0, 0, off, size, link, info, 1, 0)
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(sections), len(sections) - 1)
    body[:64] = header
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(body))
    return path


def build_probe_env(tmp: Path, numpy_version: str, verify: bool, project: bool = False):
    """A venv-pack'ed env of ``ENV_PY`` with ``numpy_version`` and ``envprobe`` (and this
    checkout's package when ``project``); skips the test when the numpy wheel cannot be had."""
    from orchestrator.tooling.env.build import build_env
    from orchestrator.tooling.env.common import ENV_TARBALL_NAME

    probe = make_wheel(tmp / "wheels")
    try:
        numpy_wheel = cached_wheel("numpy", numpy_version, ENV_PY)
    except RuntimeError as exc:
        import pytest

        pytest.skip(str(exc))
    return build_env(
        ENV_PY,
        requirements=[f"numpy=={numpy_version}", "envprobe==0.1.0"],
        pip_args=["--no-index", "--find-links", str(probe.parent), "--find-links", str(numpy_wheel.parent)],
        install_project=project,
        imports=["numpy", "envprobe", "triton_python_backend_utils"]
        + (["orchestrator.runtime.request", "orchestrator.runtime.models.postprocess"] if project else []),
        verify=verify,
        output=tmp / "out" / ENV_TARBALL_NAME,
        quiet=True,
    )


def probe_repo(dest: Path, name: str = "probe") -> Path:
    """Add the env-probe model (tests/fixtures/env/models/probe) to ``dest`` as ``name``."""
    model = dest / name
    shutil.copytree(ENV_FIXTURES / "models" / "probe", model, ignore=shutil.ignore_patterns("__pycache__"))
    config = model / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "probe"', f'name: "{name}"'))
    return dest
