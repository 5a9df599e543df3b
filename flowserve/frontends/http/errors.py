"""The one table from the engine's error codes to HTTP statuses, and the error body.

Triton's mapping (docs/protocol/README.md): INTERNAL 500, NOT_FOUND 404, UNAVAILABLE 503,
UNSUPPORTED 501, everything else 400. RESOURCE_EXHAUSTED (a request over a size limit) is 413.
"""

from __future__ import annotations

from flowserve.core.errors import ErrorCode, FlowserveError
from flowserve.frontends.http import jsonfmt

STATUS: dict[ErrorCode, int] = {
    ErrorCode.INTERNAL: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
    ErrorCode.RESOURCE_EXHAUSTED: 413,
}
DEFAULT_STATUS = 400


class HttpStatusError(FlowserveError):
    """An HTTP-only condition with its own status (405 method not allowed)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def http_status(exc: FlowserveError) -> int:
    if isinstance(exc, HttpStatusError):
        return exc.status
    return STATUS.get(exc.code, DEFAULT_STATUS)


def error_body(message: str) -> bytes:
    return jsonfmt.dumps({"error": message})
