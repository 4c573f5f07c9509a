"""The shipped image's conditions for a local server, so tests and the soak run as production.

What the image has that a fresh copy of ``model_repository`` has not (docs/guides/reliability.md):

- the Python models' bytecode compiled at build time and a read-only file system, so no file
  in a model directory changes after the first load. Triton 2.51 skips a repository-API load
  of a loaded model whose directory did not change (it starts no new stub); on a fresh copy
  the bytecode the first stub writes counts as a change, and a repair there passes where the
  image's fails. :func:`freeze` gives a copy the image's state;
- a restricted control plane: ``--http-restricted-api`` and ``--grpc-restricted-protocol``
  with a key for :data:`RESTRICTED_GROUPS` (:func:`restricted_args`), plus
  ``--model-control-mode=explicit`` and ``--strict-readiness=true``, which
  :class:`~orchestrator.tooling.server.TritonServer` always passes.
"""

from __future__ import annotations

import compileall
import os
import secrets
import stat
from pathlib import Path
from typing import List, Sequence

#: The API groups the image restricts, in one flag per protocol (deploy/entrypoint.sh).
RESTRICTED_GROUPS = ("model-repository", "model-config", "shared-memory", "statistics", "trace", "logging")
#: The header name (HTTP) and, prefixed by Triton with ``triton-grpc-protocol-``, the gRPC
#: metadata key that carries the key.
KEY_HEADER = "admin-key"


def new_key() -> str:
    """A random control-plane key (32 hex digits)."""
    return secrets.token_hex(16)


def restricted_args(key: str, groups: Sequence[str] = RESTRICTED_GROUPS, header: str = KEY_HEADER) -> List[str]:
    """The ``tritonserver`` flags that restrict ``groups`` on HTTP and gRPC to clients that
    send ``header: key`` (gRPC: ``triton-grpc-protocol-<header>: key``)."""
    spec = f"{','.join(groups)}:{header}={key}"
    return [f"--http-restricted-api={spec}", f"--grpc-restricted-protocol={spec}"]


def freeze(repository: Path) -> Path:
    """Compile every ``.py`` under ``repository`` to bytecode (``__pycache__``, as an image
    build does) and make the tree read-only; returns ``repository``. (Root ignores the
    modes, but with valid bytecode in place a stub has nothing to write anyway.) :func:`thaw` undoes
    the read-only part (to delete the copy). Raises OSError."""
    repository = Path(repository)
    if not compileall.compile_dir(str(repository), quiet=1, workers=1):
        raise OSError(f"compileall failed under {repository}")
    _chmod_tree(repository, writable=False)
    return repository


def thaw(repository: Path) -> None:
    """Make a tree made read-only by :func:`freeze` writable again (missing: no-op)."""
    if Path(repository).exists():
        _chmod_tree(Path(repository), writable=True)


def _chmod_tree(root: Path, writable: bool) -> None:
    write = stat.S_IWUSR
    paths = [root]
    for base, dirs, files in os.walk(root):
        paths += [Path(base) / n for n in dirs + files]
    for path in paths:  # chmod needs no write permission on the directory
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        path.chmod(mode | write if writable else mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
