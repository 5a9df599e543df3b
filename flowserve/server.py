"""Composition root: engine -> data plane -> HTTP, gRPC and metrics front ends; lifecycle.

``flowserve serve`` runs :func:`serve`, which loads everything, starts the three listeners,
and on SIGINT/SIGTERM stops accepting, lets in-flight requests finish (up to
``shutdown_grace_s``), unloads the models and returns 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from flowserve.dataplane.engine import Engine
from flowserve.dataplane.plane import DataPlane, Limits
from flowserve.dataplane.shm import SharedMemoryRegistry
from flowserve.nodes.instances import configure_inline

log = logging.getLogger("flowserve")


class Listener(Protocol):
    """A started front end."""

    port: int

    async def stop(self, grace_s: float) -> None: ...


@dataclass
class ServerOptions:
    model_repositories: list[Path] = field(default_factory=list)
    graph_dirs: list[Path] = field(default_factory=list)
    host: str = "0.0.0.0"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    control_mode: str = "none"
    load_models: list[str] = field(default_factory=list)
    poll_secs: float = 15.0
    cache_bytes: int = 0
    inline_threshold_us: float = 100.0
    allow_shm: bool = False
    limits: Limits = field(default_factory=Limits)
    shutdown_grace_s: float = 30.0


class Server:
    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.plane: DataPlane | None = None
        self.listeners: list[Listener] = []

    async def start(self) -> DataPlane:
        opts = self.options
        configure_inline(opts.inline_threshold_us)
        engine = await Engine.start(
            opts.model_repositories,
            opts.graph_dirs,
            control_mode=opts.control_mode,
            load_models=opts.load_models if opts.control_mode == "explicit" else ["*"],
            poll_secs=opts.poll_secs,
            cache_bytes=opts.cache_bytes,
        )
        plane = DataPlane(engine, SharedMemoryRegistry(enabled=opts.allow_shm), opts.limits)
        self.plane = plane
        try:
            # a negative port turns that listener off
            if opts.http_port >= 0:
                from flowserve.frontends.http import start_http
                from flowserve.observability.ui import make_ui_app

                mounts = {"/ui": make_ui_app(plane)}
                self.listeners.append(await start_http(plane, opts.host, opts.http_port, mounts))
            if opts.grpc_port >= 0:
                from flowserve.frontends.grpc import start_grpc

                self.listeners.append(await start_grpc(plane, opts.host, opts.grpc_port))
            if opts.metrics_port >= 0:
                from flowserve.observability.metrics import start_metrics

                self.listeners.append(await start_metrics(plane, opts.host, opts.metrics_port))
        except BaseException:
            await self.stop()
            raise
        return plane

    async def stop(self) -> None:
        grace = self.options.shutdown_grace_s
        for listener in reversed(self.listeners):
            await listener.stop(grace)
        self.listeners.clear()
        if self.plane is not None:
            await self.plane.engine.stop()
            self.plane.shm.close()
            self.plane = None


async def serve(options: ServerOptions) -> int:
    server = Server(options)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    await server.start()
    ports = ", ".join(f"{type(x).__name__} :{x.port}" for x in server.listeners)
    log.info("flowserve ready (%s)", ports)
    print(f"flowserve ready: {ports}", flush=True)
    await stopping.wait()
    log.info("shutting down")
    await server.stop()
    return 0
