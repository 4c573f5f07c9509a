"""Errors: the stub's ``TritonModelException`` and ``TritonError``, and what a client of
the mock sees (:class:`InferError` responses, :class:`LoadError` on load)."""

from __future__ import annotations

import enum


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
    """A model failed to load; the message names the model and the cause."""
