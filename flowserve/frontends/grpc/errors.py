"""The one table mapping the engine's transport-neutral error codes to gRPC status codes."""

from __future__ import annotations

import logging

import grpc

from flowserve.core.errors import ErrorCode, FlowserveError

log = logging.getLogger("flowserve.grpc")

STATUS: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorCode.UNKNOWN: grpc.StatusCode.UNKNOWN,
}


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status and message for an exception raised while serving a call.

    Engine errors keep their message; anything else is a bug, logged with its traceback and
    reported as INTERNAL with the exception's type and text.
    """
    if isinstance(exc, FlowserveError):
        return STATUS.get(exc.code, grpc.StatusCode.UNKNOWN), exc.message
    log.exception("unexpected error while serving a gRPC call", exc_info=exc)
    text = str(exc)
    return grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {text}" if text else type(exc).__name__
