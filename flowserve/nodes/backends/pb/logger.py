"""``pb_utils.Logger``: model.py's log lines, through python logging."""

from __future__ import annotations

import enum
import logging

from flowserve.nodes.backends.pb.errors import TritonModelException

_log = logging.getLogger("flowserve.python_model")


class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LEVELS = {
    LogLevel.INFO: logging.INFO,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.ERROR: logging.ERROR,
    LogLevel.VERBOSE: logging.DEBUG,
}


class Logger:
    """Triton's ``pb_utils.Logger``, writing to python logging (logger ``flowserve.python_model``;
    VERBOSE is DEBUG), each record naming the model.py line that logged it."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        try:
            py_level = _LEVELS[LogLevel(int(level))]
        except ValueError:
            raise TritonModelException(f"Logger.log(): unknown log level {level!r}") from None
        _log.log(py_level, message, stacklevel=2)

    @staticmethod
    def log_info(message: str) -> None:
        _log.info(message, stacklevel=2)

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning(message, stacklevel=2)

    @staticmethod
    def log_error(message: str) -> None:
        _log.error(message, stacklevel=2)

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug(message, stacklevel=2)
