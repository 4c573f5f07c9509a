"""``pb_utils.Logger``: messages go to ``MockTriton.logs`` and to ``logging``."""

from __future__ import annotations

import enum
import logging

from orchestrator.testing.mock.context import CTX, current_server
from orchestrator.testing.mock.records import LogRecord

#: Parent of the ``logging`` loggers the mock writes to (``<LOGGER_NAME>.<model>``).
LOGGER_NAME = "orchestrator.testing.mock"


class LogLevel(enum.IntEnum):
    """``pb_utils.Logger.LogLevel`` (python_backend ``pb_log.h``)."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_PY_LEVELS = {
    LogLevel.INFO: logging.INFO,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.ERROR: logging.ERROR,
    LogLevel.VERBOSE: logging.DEBUG,
}


def _emit(level: LogLevel, message: str) -> None:
    if not isinstance(message, str):
        raise TypeError("Logger: message must be str")
    ctx = CTX.get()
    model_name = ctx.model.name if ctx is not None and ctx.model is not None else None
    try:
        server = current_server()
    except RuntimeError:
        server = None
    if server is not None and not server.recorder.log(LogRecord(model_name, level.name, message)):
        return  # Triton drops VERBOSE messages unless started with --log-verbose > 0
    logging.getLogger(f"{LOGGER_NAME}.{model_name or 'stub'}").log(_PY_LEVELS[level], message)


class Logger:
    """Mirror of ``pb_utils.Logger``: messages go to ``MockTriton.logs`` and to the
    ``logging`` logger ``orchestrator.testing.mock.<model>`` (``.stub`` outside models;
    VERBOSE is ``logging.DEBUG``). VERBOSE messages are dropped, as by a Triton started
    with the default ``--log-verbose=0``, unless ``MockTriton(log_verbose=1)``."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: LogLevel = LogLevel.INFO) -> None:
        if not isinstance(level, LogLevel):
            raise TypeError("Logger.log(): level must be a pb_utils.Logger.LogLevel")
        _emit(level, message)

    @staticmethod
    def log_info(message: str) -> None:
        _emit(LogLevel.INFO, message)

    @staticmethod
    def log_warn(message: str) -> None:
        _emit(LogLevel.WARNING, message)

    @staticmethod
    def log_error(message: str) -> None:
        _emit(LogLevel.ERROR, message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _emit(LogLevel.VERBOSE, message)
