"""Reading an execution environment (a packed ``.tar.gz`` or a directory) without running
it: its flavour (conda or venv), Python version, packages, ``bin/activate``, the files in
``lib/`` and the C++ symbol versions its shared libraries need or provide.

Errors are :class:`~orchestrator.tooling.env.common.EnvError`.
"""

from __future__ import annotations

import os
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.tooling.env.common import EnvError
from orchestrator.tooling.env.elf import cxx_versions, parse_elf

__all__ = ["EnvInfo", "inspect_env"]


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


def _norm_dist(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class _EnvScan:
    """Accumulates :class:`EnvInfo` from (relative name, kind, reader) entries."""

    def __init__(self, info: EnvInfo):
        self.info = info
        self.python_dirs: set[tuple[int, int]] = set()
        self.pyvenv: str | None = None
        self.conda_python: tuple[int, int] | None = None

    def add(self, name: str, is_file: bool, is_link: bool, read) -> None:  # noqa: C901 (one branch per kind of file an env holds)
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


def inspect_env(path: str | os.PathLike, *, extract_libs_to: str | os.PathLike | None = None) -> EnvInfo:  # noqa: C901 (directory or tarball, each read in one pass)
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
