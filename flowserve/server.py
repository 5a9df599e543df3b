"""Composition root: engine -> data plane -> HTTP, gRPC and metrics front ends; lifecycle.

``flowserve serve`` runs :func:`serve`, which loads everything, starts the three listeners,
and on SIGINT/SIGTERM stops accepting (every listener at once), lets in-flight requests finish
(up to ``shutdown_grace_s``; the rest are cancelled), unloads the models and returns 0. A node
call that cannot be stopped (a hung thread) does not hold the exit: past ``EXIT_WAIT_S`` after
serving the process ends with status 0 anyway (see :func:`exit_watchdog`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from flowserve.core.errors import FlowserveError
from flowserve.dataplane.admission import Admission
from flowserve.dataplane.engine import Engine
from flowserve.dataplane.guard import ByteBudget, Guards
from flowserve.dataplane.plane import DataPlane
from flowserve.dataplane.shm import SharedMemoryRegistry
from flowserve.nodes.ratelimit import RateLimiter
from flowserve.repository.placement import Placement
from flowserve.repository.repository import Repository
from flowserve.runtime.registry import NEVER_LOADED, State, Status
from flowserve.settings import Settings

if TYPE_CHECKING:
    from flowserve.cluster.worker import WorkerPeers
    from flowserve.observability.otel import OtlpExporter

log = logging.getLogger("flowserve")

# how long unloading may take at shutdown, and how long the process may then take to end
UNLOAD_WAIT_S = 10.0
EXIT_WAIT_S = 5.0


class Listener(Protocol):
    """A started front end."""

    port: int

    async def stop(self, grace_s: float) -> None: ...


# the name the in-process API has always used for the server's settings
ServerOptions = Settings


class StartupError(Exception):
    """The server cannot start (a port in use, ...): one line for the operator, no traceback."""


def failed_models(plane: DataPlane) -> list[Status]:
    """Models and graphs that were to load and are unavailable (failed to load, or failed to
    compile), not the ones unloaded on purpose nor a version that failed beside a serving one."""
    return [
        s
        for s in plane.model_states()
        if s.state is State.UNAVAILABLE and s.reason != "unloaded" and not plane.has_model(s.name)
    ]


class ServerPlane(DataPlane):
    """The data plane with Triton's ``--strict-readiness``: not ready while a model or graph
    failed (see :func:`failed_models`)."""

    strict_readiness = True
    # a Server's plane: False from its start until the models it starts with have loaded (the
    # listeners answer before, live and not ready), and again as soon as shutdown begins
    serving = True

    def ready(self) -> bool:
        return self.serving and super().ready() and not (self.strict_readiness and failed_models(self))


class Server:
    def __init__(self, options: ServerOptions, peers: WorkerPeers | None = None, worker: int = 0) -> None:
        """``peers`` and ``worker``: this server is worker ``worker`` of several (started by
        flowserve/cluster/supervisor.py), and ``peers`` its view of the others."""
        self.options = options
        self.peers = peers
        self.worker = worker
        self.plane: ServerPlane | None = None
        self.listeners: list[Listener] = []
        # (protocol, address) of each started listener, as bound (port 0 becomes the real one)
        self.addresses: list[tuple[str, str]] = []
        self.exporter: OtlpExporter | None = None

    async def start(self) -> DataPlane:
        opts = self.options
        placement = None
        if self.peers is not None:  # a worker of several: pinned models load in one of them
            placement = Placement(self.worker, opts.workers, self.peers.forward, opts.rate_limit != "off")
        # the listeners answer while the models load (live, not ready: probes see what Triton
        # says during a long load), so the repository is opened once they are up
        repository = Repository(
            opts.model_repositories,
            opts.graph_dirs,
            opts.repository,
            rate_limiter=RateLimiter(opts.rate_limit_resources) if opts.rate_limit != "off" else None,
            placement=placement,
        )
        repository.progress_lines = self.worker == 0  # every worker loads the same: one set of lines
        engine = Engine(repository)
        # a worker of several writes its counts where the others read them (cluster/board.py)
        admit = Admission if self.peers is None else self.peers.admission
        admission = admit(opts.max_inflight_requests, opts.max_inflight_per_model)
        shm = SharedMemoryRegistry(enabled=opts.allow_shm)
        guards = Guards(
            opts.max_connections,
            ByteBudget(opts.max_buffered_request_bytes),
            max_connections_per_peer=opts.max_connections_per_peer,
            unsent=ByteBudget(opts.max_unsent_response_bytes, count_small=True),
        )
        open_files_for(opts.max_connections, regions=shm.max_regions if opts.allow_shm else 0)
        plane = ServerPlane(engine, shm, opts.limits, admission=admission, guards=guards)
        plane.strict_readiness = opts.strict_readiness
        plane.serving = False
        if opts.log_file:
            plane.update_log_settings({"log_file": opts.log_file}, from_network=False)
        plane.header_forward = dict(opts.header_forward)
        plane.peers = self.peers
        shared = self.peers is not None  # the workers of one server share its ports
        self._tracing(plane)
        self.plane = plane
        try:
            # a negative port turns that listener off
            if opts.http_port >= 0:
                from flowserve.frontends.http import start_http
                from flowserve.observability.ui import make_ui_app

                mounts = {"/ui": make_ui_app(plane)}
                await self._started(
                    "HTTP",
                    opts.http_port,
                    start_http(
                        plane,
                        opts.host,
                        opts.http_port,
                        mounts,
                        opts.http_restrictions,
                        opts.http_server,
                        idle_timeout_s=opts.http_idle_timeout_s,
                        body_timeout_s=opts.http_body_timeout_s,
                        max_json_bytes=opts.http_max_json_bytes,
                        reuse_port=shared,
                    ),
                )
            if opts.grpc_port >= 0:
                from flowserve.frontends.grpc import start_grpc

                await self._started(
                    "gRPC",
                    opts.grpc_port,
                    start_grpc(
                        plane,
                        opts.host,
                        opts.grpc_port,
                        opts.grpc_restrictions,
                        opts.grpc_server,
                        opts.grpc_tls,
                        opts.grpc_response_compression,
                        handshake_timeout_s=opts.grpc_handshake_timeout_s,
                        idle_timeout_s=opts.grpc_idle_timeout_s,
                        reuse_port=shared,
                        body_timeout_s=opts.grpc_body_timeout_s,
                    ),
                )
            if opts.metrics_port >= 0:
                from flowserve.observability.metrics import start_metrics

                await self._started(
                    "metrics", opts.metrics_port, start_metrics(plane, opts.host, opts.metrics_port, shared)
                )
            if opts.openai_port >= 0:
                from flowserve.frontends.openai import start_openai

                port = opts.openai_port
                await self._started("OpenAI", port, start_openai(plane, opts.host, port))
            if self.peers is not None:  # the supervisor's one line for the server (startup_summary)
                self.peers.serve_local("startup", lambda _: startup_summary(plane).as_dict())
            if self.worker == 0:
                shown = ", ".join(f"{protocol} {address}" for protocol, address in self.addresses)
                log.info("live (%s); loading models and graphs", shown or "no listener")
            # the supervisor polls for all workers at once
            await repository.open(poll=self.peers is None)
        except BaseException:
            await self.stop()
            raise
        # ready, unless --exit-on-error is about to stop the server
        plane.serving = startup_failures(plane, opts.exit_on_error) is None
        return plane

    async def _started(self, protocol: str, port: int, starting: Awaitable[Listener]) -> None:
        """Start one listener; a port that cannot be bound is a :class:`StartupError` naming it."""
        host = self.options.host
        try:
            listener = await starting
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if exc.errno == errno.EADDRINUSE:
                reason = "address already in use (another server on that port? choose one with "
                reason += f"--{protocol.lower()}-port, or -1 to turn the {protocol} listener off)"
            raise StartupError(f"cannot listen for {protocol} on {_address(host, port)}: {reason}") from exc
        self.listeners.append(listener)
        url = _address(host, listener.port)
        shown = {"HTTP": f"http://{url}", "metrics": f"http://{url}/metrics"}.get(protocol, url)
        self.addresses.append((protocol, shown))

    def _tracing(self, plane: DataPlane) -> None:
        """Trace outputs: Triton's trace files always; with --trace-config mode=opentelemetry,
        OTLP export too, and the W3C ``traceparent`` header read from every request."""
        from flowserve.dataplane.headers import also_forward
        from flowserve.observability.traces import TraceFileWriter, fan_out

        config = self.options.trace_config
        # trace_file / log_frequency of the trace settings; with several workers one file, the
        # supervisor's, holds every worker's traces
        files = TraceFileWriter(plane, sink=self.peers.trace_file if self.peers is not None else None)
        plane.on_trace = files
        if config is None:
            return
        if config.otel is not None:
            from flowserve.observability.otel import OtlpExporter

            self.exporter = OtlpExporter(plane, config.otel)
            plane.trace_modes.add("opentelemetry")
            plane.on_trace = fan_out(files, self.exporter)
            for kind in ("http", "grpc"):
                plane.header_forward[kind] = also_forward(plane.header_forward.get(kind), "traceparent")
        plane.update_trace_settings(config.settings, from_network=False)

    async def stop(self) -> None:
        """Stop accepting on every listener at once, give in-flight requests ``shutdown_grace_s``
        to finish, then unload (for at most UNLOAD_WAIT_S)."""
        if self.plane is not None:
            self.plane.serving = False  # not ready from now on, while the listeners wind down
        grace = self.options.shutdown_grace_s
        listeners, self.listeners = list(reversed(self.listeners)), []
        stopped = await asyncio.gather(*(x.stop(grace) for x in listeners), return_exceptions=True)
        for listener, outcome in zip(listeners, stopped, strict=True):
            if isinstance(outcome, BaseException):
                log.error("stopping %s failed: %r", type(listener).__name__, outcome)
        if self.plane is not None:
            plane, self.plane = self.plane, None
            try:
                await asyncio.wait_for(plane.stop(), UNLOAD_WAIT_S)
            except TimeoutError:
                log.error("unloading took longer than %.0f s at shutdown; exiting anyway", UNLOAD_WAIT_S)
            plane.shm.close()
            await asyncio.to_thread(_stop_ray)
        if self.exporter is not None:
            exporter, self.exporter = self.exporter, None
            await asyncio.to_thread(exporter.close)  # sends what is queued, for a few seconds


def _stop_ray() -> None:
    """Stop what ``--ray-address`` started in this process (nodes/rayinstances.py), if anything;
    ray is not imported when no model used it."""
    module = sys.modules.get("flowserve.nodes.rayinstances")
    if module is not None:
        try:
            module.disconnect()
        except Exception as exc:  # stopping anyway
            log.warning("stopping Ray failed: %s", exc)


def hide_command_line() -> None:
    """What Triton's python backend stub gives a model.py: ``sys.argv`` of an embedded
    interpreter (``[""]``), never the server's command line (which stays in ``sys.orig_argv``).
    Done by the server processes only: an application that uses the in-process API keeps its
    own ``sys.argv``."""
    sys.argv = [""]


def startup_failures(plane: DataPlane, exit_on_error: bool) -> str | None:
    """The one line to stop with when ``--exit-on-error`` is set and a model failed to load."""
    failed = startup_summary(plane).failed
    if not failed or not exit_on_error:
        return None
    return f"{len(failed)} model(s) failed to load ({', '.join(failed)}); exiting (--exit-on-error)"


@dataclass
class StartupSummary:
    """What the server serves once it has loaded, counted by name (a model with several
    versions counts once), the same counts in the table and in the line under it."""

    serving: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # failed to load (see failed_models)
    reasons: dict[str, str] = field(default_factory=dict)  # of the failed ones
    ready: bool = True  # what /v2/health/ready answers (this process; with --strict-readiness)
    strict: bool = True

    @property
    def clean(self) -> bool:
        """Ready, and everything it was to load serves."""
        return self.ready and not self.failed

    @property
    def empty(self) -> bool:
        return not self.serving and not self.failed

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def counts(self) -> str:
        """``serving 1 of 2; 1 failed: broken`` (``serving 2 of 2`` when nothing failed)."""
        text = f"serving {len(self.serving)} of {len(self.serving) + len(self.failed)}"
        return text + (f"; {len(self.failed)} failed: {', '.join(self.failed)}" if self.failed else "")

    def line(self, where: str) -> str:
        """The one line that ends the server's start (``where``: its listeners): ``flowserve
        ready`` only when /v2/health/ready says so, else what is not and why."""
        if self.empty:
            return f"flowserve ready, serving nothing (no models or graphs were loaded): {where}"
        if not self.failed:
            return f"flowserve ready: {where}"
        if self.ready:
            return f"flowserve ready: {self.counts()} (--strict-readiness=false): {where}"
        why = "not ready until they load (--strict-readiness), serving the others"
        return f"flowserve not ready: {self.counts()}; {why}: {where}"


def startup_summary(plane: DataPlane) -> StartupSummary:
    failed = failed_models(plane)
    reasons: dict[str, str] = {}
    for status in failed:
        reasons.setdefault(status.name, " ".join(status.reason.split()))
    serving = sorted({s.name for s in plane.model_states() if s.state is State.READY})
    strict = bool(getattr(plane, "strict_readiness", False))
    return StartupSummary(
        serving=serving,
        failed=sorted(reasons),
        reasons=reasons,
        ready=plane.engine.ready() and not (strict and failed),
        strict=strict,
    )


async def serve(options: ServerOptions) -> int:
    """Run the server until SIGINT/SIGTERM; 0 after a clean stop, 1 when it cannot start (the
    reason in one line on stderr: a port in use, a repository that cannot be read, with
    ``exit_on_error`` a model that failed to load)."""
    hide_command_line()
    if options.workers > 1:  # one server of several processes (flowserve/cluster/)
        from flowserve.cluster.supervisor import Supervisor

        return await Supervisor(options).run()
    server = Server(options)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    try:
        plane = await start_unless_stopped(server, stopping)
    except (StartupError, OSError) as exc:
        return _cannot_start(str(exc))
    except FlowserveError as exc:
        return _cannot_start(exc.message)
    if plane is None:  # SIGTERM while loading
        log.info("stopped while loading")
        return 0
    print(startup_table(plane, server.addresses), flush=True)
    stop_line = startup_failures(plane, options.exit_on_error)
    if stop_line is not None:
        await server.stop()
        return _cannot_start(stop_line)
    # Everything loaded so far lives as long as the server: move it out of the collector's
    # sight, so full collections scan only what requests leave behind (they took tens of ms
    # with the frameworks' modules on the heap, showing up as p99 spikes under load).
    gc.collect()
    gc.freeze()
    ports = ", ".join(f"{protocol} {address}" for protocol, address in server.addresses)
    summary = startup_summary(plane)
    if summary.empty:
        log.warning("nothing to serve: %s", _nothing_found(options))
    line = summary.line(ports or "no listener")
    (log.info if summary.clean else log.warning)("%s", line)
    print(line, flush=True)
    await stopping.wait()
    log.info("shutting down (in-flight requests get %.0f s)", options.shutdown_grace_s)
    await server.stop()
    log.info("stopped")
    return 0


async def start_unless_stopped(server: Server, stopping: asyncio.Event) -> DataPlane | None:
    """``server.start()``, unless SIGTERM/SIGINT comes first (a pod stopped during a long
    load): then the load is abandoned, the listeners stopped, and None returned."""
    starting = asyncio.ensure_future(server.start())
    stopped = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait((starting, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if starting.done():
        return starting.result()
    starting.cancel()
    with contextlib.suppress(Exception, asyncio.CancelledError):  # stopping anyway
        await starting
    await server.stop()
    return None


def _nothing_found(options: ServerOptions) -> str:
    """Why an empty start serves nothing: where it looked, or the explicit mode's choice."""
    repository = options.repository
    if repository.control_mode == "explicit" and not repository.load_models:
        return "explicit mode and no --load-model (load models through the repository API)"
    places = [str(p) for p in options.model_repositories] + [str(p) for p in options.graph_dirs]
    if not places:
        return "no --model-repository or --graphs given (and no ./model_repository or ./graphs here)"
    return f"no model directories or graph files in {', '.join(places)}"


def _cannot_start(message: str) -> int:
    log.debug("startup failed", exc_info=True)
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 1


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def startup_table(plane: DataPlane, addresses: list[tuple[str, str]]) -> str:
    """What the server loaded, as Triton prints it at start: every model and graph with its
    version, state and (when unavailable) why, then the addresses the listeners are bound to."""
    statuses = plane.model_states()
    models = plane.model_specs()
    rows = [("MODEL", "KIND", "VERSION", "STATUS")]
    for status in statuses:
        state = status.state.value
        if status.reason and status.state is not State.READY:
            state += f": {' '.join(status.reason.split())}"
        model = models.get(status.name)
        if plane.is_graph(status.name):
            kind = "graph"
        elif model is not None:
            kind = model.platform if model.platform == "ensemble" else model.backend or model.platform
        else:
            kind = "-"
        rows.append((status.name, kind, status.version or "-", state))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [
        f"{name:<{widths[0]}}  {kind:<{widths[1]}}  {version:<{widths[2]}}  {state}"
        for name, kind, version, state in rows
    ]
    if len(rows) == 1:
        lines.append("(no models or graphs)")
    summary = startup_summary(plane)
    never = len({s.name for s in statuses if s.reason == NEVER_LOADED} - set(summary.serving))
    lines.append(summary.counts() + (f" ({never} not loaded: explicit mode)" if never else ""))
    lines += [f"{protocol:<8}{address}" for protocol, address in addresses]
    return "\n".join(lines)


# file descriptors beyond the listeners' connections: models, logs, shared memory, the loop
SPARE_FDS = 256


def open_files_for(max_connections: int, listeners: int = 3, regions: int = 0) -> int:
    """Raise the soft limit on open files so that every listener can hold ``max_connections``
    (a cap the kernel's limit undercuts would never be reached: accept() fails with EMFILE
    first, for every listener at once, with nothing in the log), and ``regions`` shared-memory
    regions (each keeps its object open) on top; warn when the hard limit does not allow it.
    Returns the soft limit in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = listeners * max_connections + regions + SPARE_FDS if max_connections else soft
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as exc:
            log.warning("could not raise the open files limit to %d: %s", target, exc)
        if soft < needed:
            log.warning(
                "the open files limit (%d) is below what --max-connections %d needs on %d listeners "
                "(%d): lower --max-connections or raise the limit (ulimit -n)",
                soft, max_connections, listeners, needed,
            )  # fmt: skip
    return soft


def exit_watchdog(wait_s: float = EXIT_WAIT_S) -> None:
    """End the process with status 0 if it has not ended ``wait_s`` from now.

    A node call running on a worker thread cannot be interrupted; if one is still running
    (a hung node, already abandoned by its request), the interpreter would wait for it at exit,
    forever. This daemon thread ends the process instead, once everything else has stopped."""

    def watch() -> None:
        threading.Event().wait(wait_s)
        busy = [t.name for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()]
        log.warning("exiting with %d thread(s) still busy (hung node calls?): %s", len(busy), ", ".join(busy))
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    threading.Thread(target=watch, name="flowserve-exit-watchdog", daemon=True).start()
