"""What becomes of a python model's requests once ``execute`` returned or raised, as in Triton.

A **non-decoupled** request gets exactly one answer, whichever comes first:
- a response sent through its response sender, during ``execute`` or after it returned (from
  a thread or a task of the model): the response execute returns for it, if any, is then dropped;
- the response ``execute`` returned for it;
- the error ``execute`` raised (a request already answered keeps its answer: in a batch, only
  the requests still unanswered fail).
A request ``execute`` returned None for, that asked for its sender, waits for the response the
model sends later (:class:`Reply`); one that did neither gets an error, never a wait.

A **decoupled** request's responses go through its sender only. ``execute`` must return None:
anything else ends each request still open with Triton's error ("... is using the decoupled
mode and the execute function must return None."), as a raise ends it with the error raised.

Either kind may release a request with ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` (a
non-decoupled one returning None for it): it is answered by a later ``execute`` (see
:data:`RESCHEDULE`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Sequence
from typing import Any

from flowserve.core.errors import FlowserveError, InternalError
from flowserve.nodes.backends import pb_utils

# what an answer is: a response, the error that ends the request, a response still to come, or
# the request going back in the queue
Answer = Any
RESCHEDULE: Any = object()

RESCHEDULE_NOT_NONE = (
    "Expected a None object in the execute function return list for reschduled request"  # (sic, Triton's)
)


def verbatim(error: FlowserveError) -> FlowserveError:
    """``error``, whose message reaches the client as Triton words it (no "in model '...'")."""
    error.verbatim = True
    return error


class Reply:
    """A non-decoupled request's one response, when it comes through its sender (any thread).
    The future is made only for a request whose model asked for its sender (most never do)."""

    __slots__ = ("_future",)

    def __init__(self) -> None:
        self._future: concurrent.futures.Future[Any] | None = None

    @property
    def future(self) -> concurrent.futures.Future[Any]:
        future = self._future
        if future is None:
            with _REPLY_LOCK:
                future = self._future
                if future is None:
                    future = self._future = concurrent.futures.Future()
        return future

    def answered(self) -> bool:
        future = self._future
        return future is not None and future.done()

    def deliver(self, response: Any, final: bool) -> None:
        if response is not None:
            with contextlib.suppress(concurrent.futures.InvalidStateError):  # already answered
                self.future.set_result(response)


_REPLY_LOCK = threading.Lock()


def rescheduled(request: pb_utils.InferenceRequest) -> bool:
    return request.release_flags() == pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE


def settle(
    requests: Sequence[pb_utils.InferenceRequest],
    replies: Sequence[Reply],
    returned: Any,
    error: BaseException | None,
) -> list[Answer]:
    """Each non-decoupled request's answer once ``execute`` returned ``returned`` (or raised
    ``error``): a response, an error, the future of a response still to come, or RESCHEDULE."""
    count = len(requests)
    if (
        error is None
        and returned is not None
        and (not isinstance(returned, list | tuple) or len(returned) != count)
    ):
        got = len(returned) if isinstance(returned, list | tuple) else type(returned).__name__
        error = InternalError(f"model.py execute() returned {got} responses for {count} requests")
    answers: list[Answer] = []
    for index, (request, reply) in enumerate(zip(requests, replies, strict=True)):
        sender = request._sender
        if reply.answered():  # answered through its sender, during execute
            answers.append(reply.future.result())
            continue
        item = returned[index] if error is None and returned is not None else None
        if error is None and rescheduled(request):
            if item is None:
                answers.append(RESCHEDULE)
                continue
            error_here: BaseException | None = verbatim(InternalError(RESCHEDULE_NOT_NONE))
        else:
            error_here = error
        if error_here is not None or item is not None:
            if sender is not None:
                sender._close()  # what the model sends later raises "closed"
            answers.append(error_here if error_here is not None else item)
        elif sender is not None and not sender.closed:
            answers.append(reply.future)  # sent after execute returned
        else:
            answers.append(
                InternalError(
                    f"model.py execute() returned None for request {index} of {count} and sent it no "
                    "response through its response sender"
                )
            )
    return answers


def end_streams(
    requests: Sequence[pb_utils.InferenceRequest], returned: Any, error: BaseException | None, instance: str
) -> list[pb_utils.InferenceRequest]:
    """A decoupled ``execute`` returned ``returned`` (or raised ``error``): the requests it
    released to run again; every other request still open ends with the error, if any."""
    if error is None and returned is not None:
        error = verbatim(
            InternalError(
                f"Python model '{instance}' is using the decoupled mode and the execute function must "
                "return None."
            )
        )
    if error is None:
        return [r for r in requests if rescheduled(r) and _reading(r)]
    for request in requests:
        sender = request._sender
        if sender is not None:
            sender._close(error)
    return []


def _reading(request: pb_utils.InferenceRequest) -> bool:
    sender = request._sender
    return sender is not None and not (sender.closed or sender.is_cancelled())


class InstanceLoop:
    """The event loop of an instance whose ``execute`` is ``async def``: it runs on its own thread
    for the instance's lifetime, so tasks model.py starts keep running after ``execute``
    returned (responses sent later, as Triton's stub keeps its loop)."""

    def __init__(self, name: str, model_dir: str, link: pb_utils.BlsLink | None) -> None:
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            pb_utils.set_link(link)
            pb_utils.set_model_dir(model_dir)
            self.loop.call_soon(ready.set)
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, name=f"{name}-async", daemon=True)
        self.thread.start()
        ready.wait()

    def run(self, coroutine: Any) -> Any:
        """Run ``execute(requests)`` on the loop and wait for it (from the instance's thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        loop = self.loop
        if loop.is_closed():
            return
        loop.call_soon_threadsafe(loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            loop.close()
