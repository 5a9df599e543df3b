"""Process-isolated Python node instances, opt-in, for code that may take its process down.

flowserve runs Python nodes in-process by design (no stub process, no shared-memory hop per
step). The price: a node that calls ``os._exit``, segfaults in a native extension or runs out
of memory takes the whole server with it. A node whose class sets ``isolated = True`` (or whose
YAML ``parameters`` set ``isolated: true``) runs each instance in a child process instead:

- the instance's worker thread (nodes/instances.py) sends the inputs through a pipe and waits
  for the outputs, so the executor, the batcher and the front ends see an ordinary instance;
- if the child dies while running a request, that request fails with an error naming the node
  and saying how the child ended (exit code, or the signal: SIGSEGV, SIGKILL...), and the next
  request starts a fresh child (``initialize`` runs again); other requests and models go on;
- if a request is abandoned past its deadline (a hung node), the child is killed and replaced,
  so unlike an in-process thread the instance comes back at once;
- children are started with ``spawn`` (no fork of a threaded server) and end when the server
  does (they see the pipe close).

Tensors are pickled across the pipe, so isolation costs a copy of the inputs and outputs and a
process hop per call: use it for untrusted or crash-prone code, not for cheap glue.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import signal
import sys
import threading
from typing import Any

from flowserve.core.errors import InternalError
from flowserve.core.node import Context

_SPAWN = multiprocessing.get_context("spawn")
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 5.0


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def how_it_ended(exitcode: int | None) -> str:
    if exitcode is None:
        return "it stopped answering"
    if exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


class IsolatedInstance:
    """One instance of a Python node class living in a child process.

    Its methods are called on the instance's own worker thread, one call at a time, except
    :meth:`abandon`, which the event loop calls when a request gives up on a running call.
    """

    def __init__(self, target: str, config: dict[str, Any], name: str) -> None:
        self.target = target
        self.config = config
        self.name = name
        self.starts = 0
        self._proc: Any = None
        self._conn: multiprocessing.connection.Connection | None = None
        self._lock = threading.Lock()
        self._start()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else int(self._proc.pid)

    def _start(self) -> None:
        parent, child = _SPAWN.Pipe()
        proc = _SPAWN.Process(
            target=_child_main,
            args=(child, self.target, self.config, list(sys.path)),
            name=f"flowserve-node-{self.name}",
            daemon=True,
        )
        proc.start()
        child.close()
        with self._lock:
            self._proc, self._conn = proc, parent
        self.starts += 1
        if not parent.poll(START_TIMEOUT_S):
            self._kill()
            raise InternalError(f"isolated worker process did not start within {START_TIMEOUT_S:.0f} s")
        reply = self._receive("starting")
        if reply[0] != "ready":
            self._kill()
            raise InternalError(f"isolated worker process failed to start: {reply[1]}")

    def execute(self, inputs: dict[str, Any], ctx: Context | None = None) -> dict[str, Any]:
        """Run the class's ``execute`` in the child (with the request's context, less its trace,
        when the class takes one)."""
        if self._proc is None or not self._proc.is_alive():
            self._start()  # the previous child died (or was killed): replace it
        conn = self._conn
        assert conn is not None
        if ctx is not None:
            ctx = Context(ctx.request_id, dict(ctx.parameters), ctx.deadline_ns, ctx.priority)
        try:
            conn.send(("execute", inputs, ctx))
        except (OSError, ValueError):
            raise self._died("receiving the request") from None
        reply = self._receive("running the request")
        if reply[0] == "ok":
            outputs: dict[str, Any] = reply[1]
            return outputs
        raise InternalError(str(reply[1]))

    def _receive(self, doing: str) -> tuple[Any, ...]:
        conn = self._conn
        assert conn is not None
        try:
            reply: tuple[Any, ...] = conn.recv()
        except (EOFError, OSError):
            raise self._died(doing) from None
        return reply

    def _died(self, doing: str) -> InternalError:
        proc = self._proc
        if proc is not None:
            proc.join(STOP_TIMEOUT_S)
        exitcode = None if proc is None else proc.exitcode
        self._clear()
        return InternalError(
            f"its isolated worker process died while {doing} ({how_it_ended(exitcode)}); "
            "a new one starts with the next request"
        )

    def abandon(self) -> None:
        """A request gave up on the running call (its deadline passed): kill the child, so the
        call returns (as an error) and the next request gets a fresh one."""
        self._kill()

    def _kill(self) -> None:
        with self._lock:
            proc = self._proc
        if proc is not None and proc.is_alive():
            proc.kill()

    def _clear(self) -> None:
        with self._lock:
            conn, self._conn, self._proc = self._conn, None, None
        if conn is not None:
            conn.close()

    def finalize(self) -> None:
        """Let the child run the class's ``finalize`` and exit (killed if it takes too long)."""
        proc, conn = self._proc, self._conn
        if proc is None or conn is None:
            return
        try:
            conn.send(("finalize",))
            if conn.poll(STOP_TIMEOUT_S):
                conn.recv()
        except (OSError, EOFError, ValueError):
            pass
        proc.join(STOP_TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
            proc.join(STOP_TIMEOUT_S)
        self._clear()


def _child_main(
    conn: multiprocessing.connection.Connection, target: str, config: dict[str, Any], path: list[str]
) -> None:
    """The child: create the instance, then execute requests until told to stop or the parent
    goes away (the pipe closes)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # shutdown is the parent's business
    sys.path[:0] = [p for p in path if p not in sys.path]
    try:
        from flowserve.nodes.python import import_target

        obj = import_target(target)()
        init = getattr(obj, "initialize", None)
        if init is not None:
            init(config)
    except BaseException as exc:
        conn.send(("error", _describe(exc)))
        return
    conn.send(("ready",))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "finalize":
            fin = getattr(obj, "finalize", None)
            try:
                if fin is not None:
                    fin()
            finally:
                conn.send(("done",))
            return
        try:
            outputs = obj.execute(message[1]) if message[2] is None else obj.execute(message[1], message[2])
            conn.send(("ok", outputs))
        except BaseException as exc:
            conn.send(("error", _describe(exc)))
