"""The supervisor of a server started with ``--workers N``: N worker processes, one server.

The supervisor serves no request itself (a model that crashes takes a worker down, never it). It

- starts the workers (``python -m flowserve.cluster.worker DIR INDEX``), each a whole server on
  the same ports (SO_REUSEPORT: the kernel spreads connections over them);
- owns the server's control state: a change made through any worker (model load and unload,
  shared-memory registrations, trace and log settings) comes here, is applied in every worker
  (one change at a time, in one order) and answered once all have applied it; the changes are
  kept (compacted: the last word per model or region) and replayed to a worker that starts later;
- gathers statistics and metrics from every worker and merges them (``cluster/merge.py``);
- drives poll mode (one re-scan, applied in every worker, every ``poll_secs``);
- tells every worker whether all are ready (a server is ready only when every worker is);
- restarts a worker that dies (its in-flight requests fail: its own clients see their
  connection close, requests forwarded to it get UNAVAILABLE naming it), with a back-off;
- on SIGTERM or SIGINT, asks every worker to drain and stop, as one process does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowserve.cluster import board
from flowserve.cluster.arena import remove_leftovers
from flowserve.cluster.link import Link, serve
from flowserve.cluster.worker import SUPERVISOR_SOCKET, worker_socket
from flowserve.core.errors import FlowserveError, NotFound, Unavailable
from flowserve.observability.traces import TraceFiles
from flowserve.settings import Settings

log = logging.getLogger("flowserve.cluster")

# changes kept for workers that start later; anything else a worker is asked is not a change
CHANGES = ("load", "unload", "register_shm", "unregister_shm", "trace_settings", "log_settings")
RESTART_DELAY_S = (0.5, 1.0, 2.0, 5.0, 10.0)  # back-off after successive quick deaths
STABLE_S = 30.0  # a worker that lived this long starts the back-off over
START_TIMEOUT_S = 600.0  # a worker must be ready within this (models load first)


@dataclass
class WorkerProcess:
    index: int
    process: asyncio.subprocess.Process | None = None
    link: Link | None = None
    ready: bool = False
    started: float = 0.0
    deaths: int = 0  # quick deaths in a row (for the back-off)
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        pid = self.process.pid if self.process is not None else "-"
        return f"worker {self.index} (pid {pid})"


_SYSTEM = ("register_shm", "unregister_shm")
_CUDA = ("register_cuda_shm", "unregister_cuda_shm")
_REGION_OPS = {op: kinds for kinds in (_SYSTEM, _CUDA) for op in kinds}


def compact(changes: list[tuple[str, dict[str, Any]]], op: str, args: dict[str, Any]) -> None:
    """Add a change, dropping the ones it makes moot: a model's load or unload replaces the
    earlier ones of that model; a region's register or unregister the earlier ones of that
    region (an unregister of all regions, every earlier one); what is left of a trace count the
    earlier word on it."""
    if op in ("load", "unload") and not (op == "load" and "split_weights" in (args.get("parameters") or {})):
        name = args["name"]
        changes[:] = [
            c
            for c in changes
            if not (c[0] in ("load", "unload") and c[1]["name"] == name and not _weights(c))
        ]
    elif op == "trace_settings" and set(args["settings"]) == {"trace_count"}:
        model = args.get("model", "")
        changes[:] = [
            c
            for c in changes
            if not (
                c[0] == "trace_settings"
                and c[1]["model"] == model
                and set(c[1]["settings"]) == {"trace_count"}
            )
        ]
    elif op in _REGION_OPS:
        kinds = _REGION_OPS[op]  # system and CUDA regions each replace their own kind's
        region = args.get("name", "")
        changes[:] = [
            c for c in changes if not (c[0] in kinds and (not region or c[1].get("name") == region))
        ]
        if op.startswith("unregister"):
            return  # nothing left to replay for it
    changes.append((op, args))


def _integer(value: Any) -> int | None:
    """A trace setting's integer as the protocols send it (an int, a string, a list of one)."""
    if isinstance(value, list):
        value = value[0] if value else None
    try:
        return int(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


def _weights(change: tuple[str, dict[str, Any]]) -> bool:
    return change[0] == "load" and "split_weights" in (change[1].get("parameters") or {})


class Supervisor:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.count = settings.workers
        self.workers = [WorkerProcess(i) for i in range(self.count)]
        self.changes: list[tuple[str, dict[str, Any]]] = []
        self.restarts = 0
        self.trace_files = TraceFiles()  # every worker's traces, in one file per trace_file
        self.trace_counts: dict[str, int] = {}  # what is left of a limited trace count, by model
        self.stopping = False
        self._change = asyncio.Lock()  # one change at a time, everywhere in one order
        self._all_ready = asyncio.Event()
        self._failed = asyncio.Event()  # a worker ended before the server was first ready
        self.directory = Path(tempfile.mkdtemp(prefix="flowserve-"))
        self._server: asyncio.Server | None = None

    # ------------------------------------------------------------ life cycle

    async def run(self) -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        poller: asyncio.Task[None] | None = None
        s = self.settings
        if 0 in (s.http_port, s.grpc_port, s.metrics_port):
            log.error("--workers needs fixed ports: port 0 would give each worker a port of its own")
            shutil.rmtree(self.directory, ignore_errors=True)
            return 2
        try:
            (self.directory / "settings.pickle").write_bytes(pickle.dumps(self.settings))
            board.create(self.directory / board.BOARD_FILE, self.count)
            self._server = await serve(
                str(self.directory / SUPERVISOR_SOCKET), self.handle, self._linked, "worker"
            )
            for worker in self.workers:
                await self._start(worker)
            waits = [asyncio.ensure_future(e.wait()) for e in (self._all_ready, stop, self._failed)]
            await asyncio.wait(waits, timeout=START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
            for task in waits:
                task.cancel()
            if self._failed.is_set():
                log.error("a worker failed to start; stopping the server (its output says why)")
                return 1
            if not stop.is_set():
                if not self._all_ready.is_set():
                    log.error("the workers were not all ready after %.0f s", START_TIMEOUT_S)
                    return 1
                clean, line = await self._ready_line()
                (log.info if clean else log.warning)("%s", line)
                print(line, flush=True)
                if self.settings.repository.control_mode == "poll":
                    poller = asyncio.create_task(self._poll(), name="flowserve-cluster-poll")
                await stop.wait()
            log.info(
                "shutting down %d workers (in-flight requests get %.0f s)",
                self.count,
                self.settings.shutdown_grace_s,
            )
        finally:
            self.stopping = True
            if poller is not None:
                poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poller
            await self._stop_all()
            if self._server is not None:
                self._server.close()
            shutil.rmtree(self.directory, ignore_errors=True)
        return 0

    async def _ready_line(self) -> tuple[bool, str]:
        """The line that ends the server's start: ``flowserve ready: N workers, ...`` only when
        every worker answers ready, else what failed (worker 0's summary; every worker loads
        the same models); and whether all is well (ready, nothing failed)."""
        from flowserve.server import StartupSummary

        where = f"{self.count} workers, {self._ports()}"
        try:
            answers = await self._gather("local", {"kind": "startup", "args": {}})
        except Exception as exc:  # an old worker, or one gone meanwhile: readiness says the rest
            log.warning("could not ask the workers what they serve: %s", exc)
            return True, f"flowserve ready: {where}"
        if not answers:
            return True, f"flowserve ready: {where}"
        summary = StartupSummary(**answers[0])
        summary.ready = all(answer["ready"] for answer in answers)
        return summary.clean, summary.line(where)

    def _ports(self) -> str:
        s = self.settings
        named = (("HTTP", s.http_port), ("gRPC", s.grpc_port), ("metrics", s.metrics_port))
        return ", ".join(f"{name} :{port}" for name, port in named if port >= 0)

    async def _start(self, worker: WorkerProcess) -> None:
        env = dict(os.environ)
        env["FLOWSERVE_LOG_LEVEL"] = logging.getLevelName(logging.getLogger().level)
        worker.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "flowserve.cluster.worker", str(self.directory), str(worker.index), env=env
        )
        worker.started = time.monotonic()
        worker.ready = False
        worker.watcher = asyncio.create_task(self._watch(worker), name=f"flowserve-worker-{worker.index}")

    async def _watch(self, worker: WorkerProcess) -> None:
        """Wait for the worker to end; unless the server is stopping, start it again."""
        process = worker.process
        assert process is not None
        code = await process.wait()
        worker.ready = False
        remove_leftovers(process.pid)  # the shared memory its links sent through, if it died
        if worker.link is not None:
            await worker.link.close()
            worker.link = None
        if self.stopping:
            return
        if not self._all_ready.is_set():  # it never came up: starting it again would not help
            log.error("%s exited with status %s before the server was ready", worker.name, code)
            self._failed.set()
            return
        self.restarts += 1
        lived = time.monotonic() - worker.started
        worker.deaths = 0 if lived > STABLE_S else worker.deaths + 1
        delay = RESTART_DELAY_S[min(worker.deaths, len(RESTART_DELAY_S) - 1)]
        log.error(
            "%s exited with status %s after %.1f s; restarting in %.1f s", worker.name, code, lived, delay
        )
        await self._tell_readiness()
        await asyncio.sleep(delay)
        if not self.stopping:
            await self._start(worker)

    async def _stop_all(self) -> None:
        """SIGTERM every worker (each drains as one process does), then wait; past the drain's
        time a worker is killed."""
        for worker in self.workers:
            if worker.process is not None and worker.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(signal.SIGTERM)
        wait_s = self.settings.shutdown_grace_s + 20.0  # the drain, then unloading
        for worker in self.workers:
            process = worker.process
            if process is None:
                continue
            try:
                await asyncio.wait_for(process.wait(), wait_s)
            except TimeoutError:
                log.error("%s did not stop within %.0f s; killing it", worker.name, wait_s)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        for worker in self.workers:
            if worker.watcher is not None:
                worker.watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker.watcher

    async def _poll(self) -> None:
        """Poll mode: every worker re-scans, one re-scan at a time, every ``poll_secs``."""
        while True:
            await asyncio.sleep(self.settings.repository.poll_secs)
            try:
                async with self._change:
                    await self._everywhere("apply", {"op": "poll", "args": {}})
            except Exception:  # a bad scan must never stop the polling
                log.exception("repository poll failed")

    # ------------------------------------------------------------ calls from workers

    def _linked(self, link: Link) -> None:
        """A worker connected: its calls are answered knowing the link (it says which worker it
        is with 'hello')."""

        async def handler(kind: str, message: Any) -> Any:
            return await self.handle(kind, message, link)

        link.handler = handler

    async def handle(self, kind: str, message: Any, link: Link | None = None) -> Any:
        if kind == "hello":
            worker = self.workers[message["index"]]
            if link is None:
                raise Unavailable(f"worker {worker.index}: hello without a link")
            link.name = f"worker {worker.index} (pid {message['pid']})"
            async with self._change:  # the changes so far, then every later one
                worker.link = link
                return {"changes": list(self.changes), "cluster": self._cluster()}
        if kind == "trace_taken":  # a worker took one of the server's trace count
            await self._trace_taken(message)
            return None
        if kind == "trace":  # a worker's finished trace, for the one trace file
            path, log_frequency, trace = message
            self.trace_files.add(path, log_frequency, trace)
            return None
        if kind == "ready":
            self.workers[message["index"]].ready = True
            await self._tell_readiness()
            return None
        if kind == "broadcast":
            return await self._broadcast(message["op"], message["args"])
        if kind == "gather":  # every worker's view of one kind (statistics, metrics, the UI's)
            return await self._gather("local", message)
        raise NotFound(f"supervisor: unknown call '{kind}'")

    async def _broadcast(self, op: str, args: dict[str, Any]) -> None:
        """Apply one change in every worker; answer once all have (the first failure, if any)."""
        async with self._change:
            await self._everywhere("apply", {"op": op, "args": args})
            if op in CHANGES:
                compact(self.changes, op, args)
            if op == "trace_settings" and "trace_count" in args["settings"]:
                count = _integer(args["settings"]["trace_count"])
                if count is not None:
                    self.trace_counts[args["model"]] = count

    async def _trace_taken(self, model: str) -> None:
        """One trace of a limited trace count was taken somewhere: every worker learns what is
        left (each counted its own down already, so at most one per worker too many are taken
        while the news travels), and so will a worker that starts later."""
        left = self.trace_counts.get(model)
        if left is None or left <= 0:
            return
        left -= 1
        self.trace_counts[model] = left
        compact(self.changes, "trace_settings", {"settings": {"trace_count": str(left)}, "model": model})
        await self._notify_all("trace_count", {"model": model, "count": left})

    def _links(self) -> list[Link]:
        """The links of the workers connected now."""
        return [w.link for w in self.workers if w.link is not None and not w.link.closed]

    async def _notify_all(self, kind: str, message: Any) -> None:
        """Tell every connected worker, without waiting for answers (a worker gone meanwhile
        hears it when it starts again)."""
        for link in self._links():
            with contextlib.suppress(Exception):
                await link.notify(kind, message)

    async def _everywhere(self, kind: str, message: dict[str, Any]) -> list[Any]:
        links = self._links()
        results = await asyncio.gather(*(link.call(kind, message) for link in links), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return list(results)

    async def _gather(self, kind: str, message: dict[str, Any]) -> list[Any]:
        """Every worker's answer; a worker that is down is left out, a NotFound everywhere is
        the answer."""
        links = self._links()
        results = await asyncio.gather(*(link.call(kind, message) for link in links), return_exceptions=True)
        answers = [r for r in results if not isinstance(r, BaseException)]
        errors = [r for r in results if isinstance(r, BaseException)]
        if not answers and errors:
            raise errors[0]
        for error in errors:
            if not isinstance(error, FlowserveError):
                raise error
        return answers

    def _cluster(self) -> dict[str, Any]:
        up = sum(1 for w in self.workers if w.ready)
        return {"ready": up == self.count, "up": up, "workers": self.count, "restarts": self.restarts}

    async def _tell_readiness(self) -> None:
        state = self._cluster()
        if state["ready"]:
            self._all_ready.set()
        await self._notify_all("cluster", state)


__all__ = ["CHANGES", "Supervisor", "compact", "worker_socket"]
