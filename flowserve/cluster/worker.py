"""One worker process of a server started with ``--workers N``.

A worker is a whole flowserve server (repository, data plane, the HTTP, gRPC and metrics front
ends on the server's ports, shared with the other workers through SO_REUSEPORT) plus
:class:`WorkerPeers`, its view of the rest of the server (``dataplane/peers.py``):

- a link to the supervisor (``cluster/supervisor.py``), which holds the server's control state:
  a change made through this worker (load, unload, shared memory, trace and log settings) goes
  to the supervisor, which applies it in every worker and answers once all have; statistics and
  metrics are gathered from every worker through it; it tells every worker whether all are
  ready;
- links to the other workers, over which requests for a model this worker does not load
  (``repository/placement.py``) run on the worker that owns it (``nodes/forward.py``), and
  requests it decoded run where a core is free for them (*spilling*: ``cluster/routing.py``
  decides from the load board, ``cluster/board.py``, which every worker writes its requests in
  flight to); large tensors cross through shared memory (``cluster/arena.py``).

Started by the supervisor as ``python -m flowserve.cluster.worker DIR INDEX``: ``DIR`` holds the
server's pickled settings and the Unix sockets (``supervisor.sock``, ``worker-<i>.sock``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import pickle
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowserve.cluster import affinity, routing
from flowserve.cluster.board import BOARD_FILE, Board, BoardAdmission
from flowserve.cluster.link import Link, serve
from flowserve.cluster.merge import merge_metrics, merge_statistics
from flowserve.core.errors import InternalError, NotFound, Unavailable
from flowserve.core.types import InferRequest, InferResponse
from flowserve.dataplane.plane import DataPlane, Trace
from flowserve.nodes.forward import Forwarded
from flowserve.repository.placement import owner_of
from flowserve.runtime.servable import Servable
from flowserve.settings import Settings

log = logging.getLogger("flowserve.cluster")

SUPERVISOR_SOCKET = "supervisor.sock"
# how long a forwarded request may wait for its owner past its own deadline (none: this)
FORWARD_TIMEOUT_S = 3600.0


def worker_socket(directory: Path, index: int) -> Path:
    return directory / f"worker-{index}.sock"


class WorkerPeers:
    """What one worker knows of the others (implements :class:`flowserve.dataplane.peers.Peers`)."""

    def __init__(self, index: int, workers: int, directory: Path) -> None:
        self.index = index
        self.workers = workers
        self.directory = directory
        self.supervisor: Link | None = None
        self.plane: DataPlane | None = None
        self._owners: dict[int, Link] = {}
        self._connecting: dict[int, asyncio.Lock] = {}
        self._cluster: dict[str, Any] = {"ready": False, "up": 0, "workers": workers, "restarts": 0}
        self._others = [i for i in range(workers) if i != index]
        self._spilled = dict.fromkeys(self._others, 0)  # requests this worker has running there
        self._up = [True] * workers  # workers whose link answered (a gone one: False until ready)
        self.board: Board | None = None
        self.spills = 0
        self._tasks: set[asyncio.Task[None]] = set()  # trace notifications being sent
        self._views: dict[str, Callable[[dict[str, Any]], Any]] = {}  # answers to gather()
        self._attached = asyncio.Event()
        self._apply = asyncio.Lock()  # changes apply one at a time, in the supervisor's order
        self._server: asyncio.Server | None = None
        self.gone = asyncio.Event()  # the supervisor went away: this worker ends

    # ------------------------------------------------------------ start and stop

    async def connect(self) -> list[tuple[str, dict[str, Any]]]:
        """Link to the supervisor and to the peers' calls; returns the changes made so far (to
        apply, with :meth:`attach`, once the plane exists)."""
        self.board = Board(self.directory / BOARD_FILE, self.workers, self.index)
        path = worker_socket(self.directory, self.index)
        path.unlink(missing_ok=True)  # the socket of this worker's previous life
        self._server = await serve(str(path), self.handle, name="worker")
        link = await Link.connect(str(self.directory / SUPERVISOR_SOCKET), self.handle, "the supervisor")
        link.on_close = lambda _: self.gone.set()
        self.supervisor = link
        hello = await link.call("hello", {"index": self.index, "pid": os.getpid()})
        self._cluster.update(hello["cluster"])
        changes: list[tuple[str, dict[str, Any]]] = hello["changes"]
        return changes

    async def attach(self, plane: DataPlane, changes: list[tuple[str, dict[str, Any]]]) -> None:
        """Apply the changes made before this worker started (a restarted worker catches up),
        then serve the supervisor's and the peers' calls and say this worker is ready."""
        self.plane = plane
        self.serve_local("statistics", lambda args: plane.statistics(args["name"], args["version"]))
        async with self._apply:
            for op, args in changes:
                try:
                    await plane.apply(op, args)
                except Exception as exc:  # as it failed (or not) when it was first made
                    log.warning("worker %d: replaying %s %s: %s", self.index, op, args.get("name", ""), exc)
        self._attached.set()
        assert self.supervisor is not None
        await self.supervisor.call("ready", {"index": self.index})

    async def close(self) -> None:
        for link in list(self._owners.values()):
            await link.close()
        if self.supervisor is not None:
            await self.supervisor.close()
        if self._server is not None:
            self._server.close()

    def admission(self, max_in_flight: int, max_per_model: int) -> BoardAdmission:
        """This worker's admission control, which writes its counts to the load board."""
        if self.board is None:
            raise InternalError("the worker's admission was asked for before it connected")
        return BoardAdmission(self.board, max_in_flight, max_per_model)

    # ------------------------------------------------------------ Peers

    def all_ready(self) -> bool:
        return bool(self._cluster["ready"])

    def status(self) -> dict[str, Any]:
        """The supervisor's last word on the workers: ready, up, workers, restarts."""
        return dict(self._cluster)

    async def broadcast(self, op: str, args: dict[str, Any]) -> None:
        await self._supervisor().call("broadcast", {"op": op, "args": args})

    async def statistics(self, name: str, version: str) -> dict[str, Any]:
        return merge_statistics(await self.gather("statistics", {"name": name, "version": version}))

    async def gather(self, kind: str, args: dict[str, Any]) -> list[Any]:
        answers: list[Any] = await self._supervisor().call("gather", {"kind": kind, "args": args})
        return answers

    def serve_local(self, kind: str, view: Callable[[dict[str, Any]], Any]) -> None:
        self._views[kind] = view

    async def metrics(self) -> str:
        return merge_metrics(await self.gather("metrics", {}))

    async def forward(self, request: Forwarded) -> Any:
        """Run ``request`` on the worker that owns its model (the Forwarder of placement)."""
        owner = owner_of(request.model, self.workers)
        if owner == self.index:  # placement loads it here; a forwarding node is not built then
            raise InternalError(f"model '{request.model}' is owned by this worker but was forwarded")
        link = await self._link_to(owner)
        timeout = FORWARD_TIMEOUT_S if request.timeout_ns is None else request.timeout_ns / 1e9 + 1.0
        return await link.call("run", request, timeout=timeout)

    def spill_target(self, model: str, in_flight: int) -> int | None:
        """Another worker for a request that found ``in_flight`` requests of ``model`` running
        here, where a core is free for it sooner (``cluster/routing.py``); None: here."""
        board, plane = self.board, self.plane
        if board is None or plane is None or not self._others or not self._cluster["ready"]:
            return None
        servable = plane.servable(model)
        if servable is None or servable.forwarded or servable.decoupled:
            return None  # not here, owned by one worker, or a stream: it runs where it is
        loads = board.loads(model)
        loads[self.index] = in_flight
        for other in self._others:  # a request on its way there is not on the board yet
            loads[other] = max(loads[other], self._spilled[other])
        relaying = sum(self._spilled.values())
        return routing.route(self.index, loads, self._up, _routing_model(servable), relaying)

    async def spill(self, target: int, request: InferRequest) -> InferResponse:
        """Run ``request`` on worker ``target``; if that worker is gone, here after all."""
        self._spilled[target] += 1
        link: Link | None = None
        try:
            link = await self._link_to(target)
            response: InferResponse = await link.call("spill", request)
            self.spills += 1
            return response
        except Unavailable:
            if link is not None and not link.closed:
                raise  # the other worker's own answer (overloaded, unavailable model)
        finally:
            self._spilled[target] -= 1
        assert self.plane is not None
        return await self.plane.infer(request, spill=False)

    def trace_taken(self, model: str) -> None:
        self._notify("trace_taken", model)

    def _notify(self, kind: str, message: Any) -> None:
        """Tell the supervisor without waiting (from code that cannot await)."""
        link = self.supervisor
        if link is None or link.closed:
            return
        task = asyncio.get_running_loop().create_task(link.notify(kind, message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def trace_file(self, path: str, log_frequency: int, trace: Trace) -> None:
        """A finished trace for the server's trace file, which the supervisor writes."""
        self._notify("trace", (path, log_frequency, trace))

    def _supervisor(self) -> Link:
        link = self.supervisor
        if link is None or link.closed:
            raise Unavailable("the server's supervisor process is gone; this worker is stopping")
        return link

    async def _link_to(self, index: int) -> Link:
        link = self._owners.get(index)
        if link is not None and not link.closed:
            return link
        lock = self._connecting.setdefault(index, asyncio.Lock())
        async with lock:
            link = self._owners.get(index)
            if link is None or link.closed:
                try:
                    link = await Link.connect(
                        str(worker_socket(self.directory, index)), None, f"worker {index}"
                    )
                except OSError:
                    self._up[index] = False  # no spills there until the supervisor says ready
                    raise Unavailable(f"worker {index} is not running (it is being restarted)") from None
                self._owners[index] = link
            return link

    # ------------------------------------------------------------ calls from the others

    async def handle(self, kind: str, message: Any) -> Any:
        if kind == "cluster":  # the supervisor's readiness news: no need to be attached
            self._cluster.update(message)
            if message.get("ready"):
                self._up = [True] * self.workers
            return None
        if kind == "trace_count":  # the server's trace count after another worker's trace
            await self._attached.wait()
            assert self.plane is not None
            await self.plane.apply("trace_count", message)
            return None
        await self._attached.wait()
        plane = self.plane
        assert plane is not None
        if kind == "run":
            return await plane.run_forwarded(message)
        if kind == "spill":  # a request another worker had too many of: run here
            return await plane.infer(message, spill=False)
        if kind == "apply":
            async with self._apply:
                await plane.apply(message["op"], message["args"])
            return None
        if kind == "local":
            view = self._views.get(message["kind"])
            if view is None:
                raise NotFound(f"worker {self.index}: no view '{message['kind']}'")
            return view(message["args"])
        raise NotFound(f"worker {self.index}: unknown call '{kind}'")


def _routing_model(servable: Servable) -> routing.Model:
    """What the routing decision needs of a servable: its slots and its cost so far."""
    compute = servable.stats.compute_infer
    instances = sum(group.count for group in servable.config.instance_group)
    return routing.Model(
        routing.slots_of(servable.kind, servable.platform, instances),
        routing.mean_compute_ns(compute.ns, compute.count),
        routing.locked(servable.kind, servable.platform),
    )


def _first_to_load(directory: Path) -> bool:
    """Whether this worker is the first to finish loading (it prints the startup table). Not
    worker 0 by rule: with ``--exit-on-error`` the first worker to find a failed model ends the
    server, and a worker still loading then is stopped before it could print anything."""
    try:
        os.close(os.open(directory / "startup-table", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


async def run_worker(directory: Path, index: int) -> int:
    """A worker's life: connect, load, serve until SIGTERM (or the supervisor is gone), drain."""
    from flowserve.server import (
        Server,
        StartupError,
        hide_command_line,
        start_unless_stopped,
        startup_failures,
        startup_table,
    )

    hide_command_line()
    settings: Settings = pickle.loads((directory / "settings.pickle").read_bytes())
    if settings.cpu_affinity == "spread":  # before anything loads: its threads inherit it
        cpus = affinity.pin(index, settings.workers)
        if cpus is not None:
            log.info("worker %d runs on CPUs %s", index, affinity.describe(cpus))
    peers = WorkerPeers(index, settings.workers, directory)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    changes = await peers.connect()
    server = Server(settings, peers=peers, worker=index)
    try:
        try:  # SIGTERM during a long load abandons it, as one process does (a pod stopped while starting)
            plane = await start_unless_stopped(server, stopping)
        except (OSError, StartupError) as exc:  # e.g. a port in use: one line, the supervisor stops
            log.error("worker %d cannot serve: %s", index, exc)
            return 1
        if plane is None:
            log.info("worker %d stopped while loading", index)
            return 0
        if _first_to_load(directory):  # every worker loads the same models: one table for the server
            print(startup_table(plane, server.addresses), flush=True)
        stop_line = startup_failures(plane, settings.exit_on_error)
        if stop_line is not None:  # before ready: the supervisor stops the whole server
            log.error("worker %d: %s", index, stop_line)
            return 1
        gc.collect()  # what is loaded lives as long as the worker (see server.serve)
        gc.freeze()
        await peers.attach(plane, changes)
        log.info("worker %d ready (pid %d)", index, os.getpid())
        done = {asyncio.ensure_future(stopping.wait()), asyncio.ensure_future(peers.gone.wait())}
        _, pending = await asyncio.wait(done, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        if peers.gone.is_set() and not stopping.is_set():
            log.error("worker %d: the supervisor is gone; stopping", index)
    finally:
        await server.stop()
        await peers.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    directory, index = Path(args[0]), int(args[1])
    from flowserve.observability.logs import configure

    configure(
        os.environ.get("FLOWSERVE_LOG_LEVEL", "INFO"), json_lines=os.environ.get("FLOWSERVE_LOG_JSON") == "1"
    )
    if os.environ.get("FLOWSERVE_LOOP", "uvloop") == "uvloop":
        import uvloop

        code = int(uvloop.run(run_worker(directory, index)))
    else:
        code = asyncio.run(run_worker(directory, index))
    with contextlib.suppress(Exception):
        from flowserve.server import exit_watchdog

        exit_watchdog()
    return code


if __name__ == "__main__":
    sys.exit(main())
