"""One error tree for the whole engine, with transport-neutral codes.

::

    FlowserveError (code)
     +-- InvalidArgument      INVALID_ARG   bad request: unknown input, wrong dtype/shape, ...
     +-- NotFound             NOT_FOUND     unknown model / version / region
     +-- Unavailable          UNAVAILABLE   not ready, queue full, timed out in queue
     +-- Unsupported          UNSUPPORTED   feature not available here (e.g. no GPU)
     +-- InternalError        INTERNAL      a bug or a failing node
     |    +-- NodeError                     a node raised; names the graph and the node (and,
     |                                      with --error-traceback, carries its code's traceback)
     +-- AlreadyExists        ALREADY_EXISTS
     +-- Cancelled            CANCELLED
     +-- ResourceExhausted    RESOURCE_EXHAUSTED  request over a configured size limit
    SpecError                                   invalid configuration (lists every problem)

Each front end owns exactly one table mapping :class:`ErrorCode` to its own status codes; the
core never imports a transport.
"""

from __future__ import annotations

import enum
import os
import sysconfig
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


class ErrorCode(enum.Enum):
    """Triton's status codes (core/src/status.h), plus RESOURCE_EXHAUSTED for size limits."""

    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"


class FlowserveError(Exception):
    """Base of every error the engine reports to a caller."""

    code: ErrorCode = ErrorCode.UNKNOWN
    # the message is the model's own, to reach a client of the model as it is (Triton's python
    # backend: a TritonError's text, "Failed to process the request(s) for model ..."): a model
    # served alone adds no "in model '...'" before it (a step of a graph still says where)
    verbatim: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidArgument(FlowserveError):
    code = ErrorCode.INVALID_ARG


class NotFound(FlowserveError):
    code = ErrorCode.NOT_FOUND


class Unavailable(FlowserveError):
    code = ErrorCode.UNAVAILABLE


class Unsupported(FlowserveError):
    code = ErrorCode.UNSUPPORTED


class InternalError(FlowserveError):
    code = ErrorCode.INTERNAL


class AlreadyExists(FlowserveError):
    code = ErrorCode.ALREADY_EXISTS


class Cancelled(FlowserveError):
    code = ErrorCode.CANCELLED


class ResourceExhausted(FlowserveError):
    code = ErrorCode.RESOURCE_EXHAUSTED


class NodeError(InternalError):
    """A node failed while running; the message names the graph and the node.

    ``path`` lists the graph/node hops from the outermost graph, so an error inside a
    sub-graph or an ensemble step reads ``in graph 'outer', node 'sub' -> graph 'inner', node 'x'``.
    """

    def __init__(self, graph: str, node: str, cause: BaseException | str, shown_traceback: str = "") -> None:
        """``shown_traceback``: the traceback of the node's own code, appended to the message
        (``--error-traceback``); ``detail`` stays the one line that says what failed."""
        detail = cause if isinstance(cause, str) else _describe(cause)
        self.graph = graph
        self.node = node
        self.detail = detail
        # the caller sees the cause's code: a queue-full step is UNAVAILABLE, not INTERNAL
        self.code = cause.code if isinstance(cause, FlowserveError) else ErrorCode.INTERNAL
        # a repository model is a one-node graph of the same name: say "model" once
        where = f"in model '{graph}'" if graph == node else f"in graph '{graph}', node '{node}'"
        if graph == node and isinstance(cause, FlowserveError) and cause.verbatim:
            where = ""
        head = f"{where}: {detail}" if where else detail
        super().__init__(head + (f"\n{shown_traceback}" if shown_traceback else ""))


def error_class(code: ErrorCode) -> type[FlowserveError]:
    """The error class that carries ``code`` (for codes that arrive as data: a python model's
    TritonError, a worker's reply)."""
    return _BY_CODE.get(code, InternalError)


_BY_CODE: dict[ErrorCode, type[FlowserveError]] = {
    cls.code: cls
    for cls in (
        FlowserveError,
        InvalidArgument,
        NotFound,
        Unavailable,
        Unsupported,
        InternalError,
        AlreadyExists,
        Cancelled,
        ResourceExhausted,
    )
}


def _describe(exc: BaseException) -> str:
    if isinstance(exc, FlowserveError):
        return exc.message
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# frames of these folders are left out of a traceback shown for a user's code: flowserve's own
# and the standard library's (asyncio, threading, importlib)
_INTERNAL = tuple(
    str(Path(p).resolve()) + os.sep
    for p in (Path(__file__).resolve().parent.parent, sysconfig.get_paths()["stdlib"])
)


def internal_file(filename: str) -> bool:
    """Whether ``filename`` is flowserve's own code or the standard library's (not a user's)."""
    return filename.startswith("<frozen ") or os.path.realpath(filename).startswith(_INTERNAL)


def code_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` trimmed to the frames that matter to whoever wrote the code
    that raised it: flowserve's frames and the standard library's are left out (all frames are
    kept when that would leave none), chained causes included. For a node's failure in the log
    (or, with ``--error-traceback``, in the error's message)."""
    shown = traceback.TracebackException.from_exception(exc)
    seen: set[int] = set()
    part: traceback.TracebackException | None = shown
    while part is not None and id(part) not in seen:
        seen.add(id(part))
        kept = [f for f in part.stack if not internal_file(f.filename)]
        if kept and len(kept) < len(part.stack):
            part.stack = traceback.StackSummary.from_list(kept)
        part = part.__cause__ or (None if part.__suppress_context__ else part.__context__)
    return "".join(shown.format()).rstrip()


def code_location(exc: BaseException) -> str:
    """``file:line`` of the innermost frame of a user's code in ``exc``'s traceback (for a
    SyntaxError, where the bad line is), or "" when no frame is outside flowserve."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not internal_file(f.filename)]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""


@dataclass(frozen=True, slots=True)
class SpecIssue:
    """One configuration problem: where it is (file, node, field) and what is wrong."""

    file: str
    message: str
    node: str | None = None
    field: str | None = None

    def __str__(self) -> str:
        where = self.file
        if self.node is not None:
            where += f": node '{self.node}'"
        if self.field is not None:
            where += f": field '{self.field}'"
        return f"{where}: {self.message}"


class SpecError(FlowserveError):
    """Invalid configuration; carries every problem found, not just the first."""

    code = ErrorCode.INVALID_ARG

    def __init__(self, issues: Iterable[SpecIssue]) -> None:
        self.issues = list(issues)
        super().__init__("; ".join(str(i) for i in self.issues) or "invalid configuration")
