"""Errors: the stub's ``TritonModelException`` and ``TritonError``, and what a client of
the mock sees (:class:`InferError` responses, :class:`LoadError` on load)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import os
import traceback

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class TritonModelException(Exception):
    """Mirror of ``pb_utils.TritonModelException`` (raised by stub functions)."""


class ErrorCode(enum.IntEnum):
    """``pb_utils.TritonError`` codes (python_backend ``pb_error.h``, r24.10)."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class TritonError:
    """Mirror of ``pb_utils.TritonError(message, code=TritonError.INTERNAL)``.

    Not an exception: it goes into ``InferenceResponse(error=...)``. Raises TypeError
    for a non-``str`` message or a code that is not one of ``TritonError.UNKNOWN`` ...
    """

    UNKNOWN = ErrorCode.UNKNOWN
    INTERNAL = ErrorCode.INTERNAL
    NOT_FOUND = ErrorCode.NOT_FOUND
    INVALID_ARG = ErrorCode.INVALID_ARG
    UNAVAILABLE = ErrorCode.UNAVAILABLE
    UNSUPPORTED = ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = ErrorCode.ALREADY_EXISTS
    CANCELLED = ErrorCode.CANCELLED

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INTERNAL):
        if not isinstance(message, str):
            raise TypeError(
                "TritonError(): incompatible constructor arguments: message must be str, "
                f"got {type(message)}"
            )
        if not isinstance(code, ErrorCode):
            raise TypeError(
                "TritonError(): incompatible constructor arguments: code must be one of "
                f"TritonError.UNKNOWN/INTERNAL/..., got {code!r}"
            )
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> ErrorCode:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code=TritonError.{self._code.name})"


class InferError(Exception):
    """An error response, as a client of the server would see it.

    ``message`` is the error text; ``code`` the Triton error code name
    (``"INVALID_ARG"``, ``"NOT_FOUND"``, ``"INTERNAL"`` ...).
    """

    def __init__(self, message: str, code: str = "INTERNAL"):
        super().__init__(message)
        self.message = message
        self.code = code

    def __repr__(self) -> str:
        return f"InferError({self.message!r}, code={self.code!r})"


class LoadError(RuntimeError):
    """A model failed to load; the message names the model and the cause.

    ``reason``: what the repository index shows for the model (Triton's state reason;
    the message when not given).
    """

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


def incompatible(function: str, signature: str, invoked_with: str, constructor: bool = False) -> TypeError:
    """The ``TypeError`` pybind11 raises when no overload of a stub function accepts the
    arguments (``None`` for an argument declared ``.none(false)``, a wrong type ...).

    ``function``: the Python name (``"__init__"`` for constructors); ``signature``: the
    one supported signature as pybind prints it; ``invoked_with``: the arguments shown.
    """
    what = "constructor" if constructor else "function"
    return TypeError(
        f"{function}(): incompatible {what} arguments. The following argument types are "
        f"supported:\n    1. {signature}\n\nInvoked with: {invoked_with}"
    )


def as_str(value: object) -> object:
    """What pybind11's ``std::string`` caster makes of ``value``: ``bytes`` decoded as
    UTF-8 (as the stub accepts them), anything else unchanged for the caller to check."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value


def format_exception(exc: BaseException) -> str:
    """Approximation of pybind11's ``error_already_set::what()`` for an execute error:
    ``"Type: message"`` then ``At:`` with the model's frames, innermost first (frames of
    the mock, asyncio and concurrent.futures left out)."""
    text = f"{type(exc).__name__}: {exc}"
    skip_dirs = (
        _PACKAGE_DIR,
        os.path.dirname(asyncio.__file__) + os.sep,
        os.path.dirname(concurrent.futures.__file__) + os.sep,
    )
    frames = []
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        filename = frame.f_code.co_filename
        if os.path.abspath(filename).startswith(skip_dirs):
            continue
        frames.append(f"  {filename}({lineno}): {frame.f_code.co_name}\n")
    if frames:
        text += "\n\nAt:\n" + "".join(reversed(frames))
    return text
