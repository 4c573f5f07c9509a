"""ELF files and the dynamic loader: the libraries a binary needs, the symbol versions
(``GLIBCXX_*``) it needs or defines, and what ``ldd`` resolves under a given
``LD_LIBRARY_PATH``. ELF is read with :mod:`struct`, no external tools; ``ldd`` is
glibc's (Debian/Ubuntu package ``libc-bin``).

Errors are :class:`~orchestrator.tooling.env.common.EnvError` (``ldd`` only; the readers
return None for a file that is not a well-formed ELF file).
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from dataclasses import dataclass
from typing import Iterable, Sequence

from orchestrator.tooling.env.common import EnvError

__all__ = ["ElfInfo", "parse_elf", "read_elf", "cxx_versions", "version_key", "ldd"]


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


def parse_elf(data: bytes) -> ElfInfo | None:  # noqa: C901 (one pass over the ELF sections)
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


def read_elf(path: str | os.PathLike) -> ElfInfo | None:
    """:func:`parse_elf` of the file at ``path``; None when it cannot be read or is not ELF."""
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
