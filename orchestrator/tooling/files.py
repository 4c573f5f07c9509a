"""File helpers shared by the tooling: SHA-256 of a file, atomic writes and copies.

Atomic: the new content goes to a temporary file in the target's directory, which is then
renamed over the target (``os.replace``, atomic on POSIX), so a concurrent reader (a
starting server, another test worker) sees the old file or the new one, never a part.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Optional

__all__ = ["sha256_file", "write_atomic", "copy_atomic"]


def sha256_file(path: Path | str) -> str:
    """Hex SHA-256 of the file at ``path``, read in 1 MiB blocks. Raises OSError."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _replace(target: Path, fill: Callable[[str], None], mode: Optional[int]) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        fill(tmp)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(target: Path | str, data: bytes, mode: Optional[int] = None, *, if_changed: bool = False) -> None:
    """Write ``data`` to ``target`` atomically; ``mode``: permission bits (None: mkstemp's 0600).

    ``if_changed``: leave an identical file alone (only its mode is set), so a running
    process that has it open or mapped keeps a consistent file. Raises OSError.
    """
    target = Path(target)
    if if_changed:
        try:
            if target.stat().st_size == len(data) and target.read_bytes() == data:
                if mode is not None and target.stat().st_mode & 0o777 != mode:
                    os.chmod(target, mode)
                return
        except FileNotFoundError:
            pass
    _replace(target, lambda tmp: Path(tmp).write_bytes(data), mode)


def copy_atomic(source: Path | str, target: Path | str, mode: Optional[int] = None) -> None:
    """Copy ``source``'s bytes to ``target`` atomically (``mode`` as in :func:`write_atomic`). Raises OSError."""
    _replace(Path(target), lambda tmp: shutil.copyfile(source, tmp), mode)
