"""Where the tooling finds things: one rule for the project root and the model repository.

``PROJECT_ROOT`` is the directory that holds the ``orchestrator`` package: the checkout's
root in a source checkout or an editable install (where ``pyproject.toml``,
``model_repository/``, ``env/`` and ``.cache/`` live). ``default_model_repository()`` is
``./model_repository`` when the working directory has one, else the checkout's.
"""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MODEL_REPOSITORY_NAME = "model_repository"


def in_checkout() -> bool:
    """True when the package runs from a source checkout (``pyproject.toml`` beside it)."""
    return (PROJECT_ROOT / "pyproject.toml").is_file()


def default_model_repository() -> Path:
    """``./model_repository`` if it is a directory, else ``<PROJECT_ROOT>/model_repository``."""
    local = Path(MODEL_REPOSITORY_NAME)
    return local if local.is_dir() else PROJECT_ROOT / MODEL_REPOSITORY_NAME
