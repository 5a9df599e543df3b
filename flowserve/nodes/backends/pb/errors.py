"""``TritonModelException`` and ``TritonError``, and their codes as flowserve's error codes."""

from __future__ import annotations

from flowserve.core.errors import ErrorCode


class TritonModelException(Exception):
    def __init__(self, msg: str = "") -> None:
        super().__init__(msg)
        self._msg = msg

    def message(self) -> str:
        return self._msg


class _GpuOnly(TritonModelException):
    """A call that needs a GPU, which flowserve's in-process Python backend never hands out."""

    def __init__(self, call: str) -> None:
        super().__init__(
            f"{call} is not supported: flowserve's Python backend keeps tensors in CPU memory "
            "(no GPU tensors, no CUDA memory)"
        )


class TritonError:
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        if message is None or code is None:
            raise TypeError("TritonError(): message and code must not be None")
        self._message = message
        self._code = int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code})"


# TritonError codes <-> flowserve error codes
_CODES: dict[ErrorCode, int] = {
    ErrorCode.UNKNOWN: TritonError.UNKNOWN,
    ErrorCode.INTERNAL: TritonError.INTERNAL,
    ErrorCode.NOT_FOUND: TritonError.NOT_FOUND,
    ErrorCode.INVALID_ARG: TritonError.INVALID_ARG,
    ErrorCode.UNAVAILABLE: TritonError.UNAVAILABLE,
    ErrorCode.UNSUPPORTED: TritonError.UNSUPPORTED,
    ErrorCode.ALREADY_EXISTS: TritonError.ALREADY_EXISTS,
    ErrorCode.CANCELLED: TritonError.CANCELLED,
}
ERROR_CODES: dict[int, ErrorCode] = {v: k for k, v in _CODES.items()}
