"""The data plane: the one surface the front ends and the observability layer use.

One object holding the engine (and through it the repository), client shared memory, limits,
admission, connection guards, and the trace and log settings, with every operation of Triton's
protocol as a transport-neutral method (plain dicts in, plain dicts out, errors from
core.errors), and typed read-only queries of what is loaded (``servables``, ``servable``,
``model_states``, ``plan``, ``model_specs``) for metrics, health and the UI. Nothing above this
layer reaches into the engine or the repository: policy (control mode, shared memory,
restrictions) is decided here once, whatever the transport."""

from __future__ import annotations

import base64
import contextlib
import logging
import random
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flowserve.core.errors import FlowserveError, InvalidArgument, NotFound, Unsupported
from flowserve.core.limits import Limits as Limits  # re-exported: the plane holds them
from flowserve.core.node import Span
from flowserve.core.types import InferRequest, InferResponse
from flowserve.core.version import VERSION
from flowserve.dataplane import metadata
from flowserve.dataplane.admission import Admission
from flowserve.dataplane.cudashm import CudaSharedMemoryRegistry
from flowserve.dataplane.engine import Engine
from flowserve.dataplane.guard import Guards
from flowserve.dataplane.headers import HeaderPattern
from flowserve.dataplane.parameters import model_parameters
from flowserve.dataplane.peers import Peers
from flowserve.dataplane.shm import SharedMemoryRegistry
from flowserve.dataplane.streams import decouple
from flowserve.graph.plan import Plan
from flowserve.nodes.forward import Forwarded
from flowserve.nodes.split import parse_split_weights, set_split_weights
from flowserve.runtime.registry import Status
from flowserve.runtime.servable import Servable
from flowserve.spec.bounds import SETTINGS, TRACE_LEVELS
from flowserve.spec.schema import ModelSpec
from flowserve.spec.triton import check_config_override

log = logging.getLogger("flowserve")


@dataclass(slots=True)
class Trace:
    request_id: str
    model: str
    spans: list[Span]
    ok: bool = True
    error: str = ""
    traceparent: str = ""  # the caller's W3C trace context (opentelemetry mode), when it sent one


@dataclass
class TraceSettings:
    trace_level: list[str] = field(default_factory=lambda: ["OFF"])
    trace_rate: int = 1000
    trace_count: int = -1
    log_frequency: int = 0
    trace_file: str = ""
    trace_mode: str = "triton"

    def as_dict(self) -> dict[str, Any]:
        return {
            "trace_level": list(self.trace_level),
            "trace_rate": str(self.trace_rate),
            "trace_count": str(self.trace_count),
            "log_frequency": str(self.log_frequency),
            "trace_file": self.trace_file,
            "trace_mode": self.trace_mode,
        }


_TRACE_KEYS = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode")
_LOG_KEYS = {
    "log_file": str,
    "log_info": bool,
    "log_warning": bool,
    "log_error": bool,
    "log_verbose_level": int,
    "log_format": str,
}


class DataPlane:
    def __init__(
        self,
        engine: Engine,
        shm: SharedMemoryRegistry | None = None,
        limits: Limits | None = None,
        keep_traces: int = 200,
        admission: Admission | None = None,
        guards: Guards | None = None,
        cuda_shm: CudaSharedMemoryRegistry | None = None,
    ) -> None:
        self.engine = engine
        # the other worker processes of this server (--workers N; dataplane/peers.py), or None
        self.peers: Peers | None = None
        # pb_utils.load_model/unload_model inside a model: through this plane's own door
        engine.repository.control.target = _ModelControl(self)
        # connection caps per listener and the server-wide budget of buffered request bytes
        self.guards = guards or Guards()
        self.shm = shm or SharedMemoryRegistry(enabled=False)
        # CUDA shared memory where CUDA is present (dataplane/cudashm.py), on with system shm;
        # one namespace of region names with it
        self.cuda_shm = cuda_shm or CudaSharedMemoryRegistry(enabled=self.shm.enabled)
        self.shm.cuda = self.cuda_shm
        self.cuda_shm.taken = self.shm.names
        self.limits = limits or Limits()
        self.admission = admission or Admission()
        self.trace_settings = TraceSettings()
        # "http"/"grpc" -> which request headers become request parameters (dataplane/headers.py)
        self.header_forward: dict[str, HeaderPattern] = {}
        self.model_trace_settings: dict[str, TraceSettings] = {}
        # called with every finished trace (the observability layer writes trace files)
        self.on_trace: Callable[[Trace], None] | None = None
        # trace modes with an output behind them: "triton" (trace files); the server adds
        # "opentelemetry" when it exports (--trace-config mode=opentelemetry)
        self.trace_modes: set[str] = {"triton"}
        self.traces: deque[Trace] = deque(maxlen=keep_traces)
        self._traced = 0
        self.log_settings: dict[str, Any] = {
            "log_file": "",
            "log_info": True,
            "log_warning": True,
            "log_error": True,
            "log_verbose_level": 0,
            "log_format": "default",
        }

    # ------------------------------------------------------------ health and metadata

    def live(self) -> bool:
        return self.engine.live

    def ready(self) -> bool:
        """This process is ready and, with several workers, every worker is."""
        return self.engine.ready() and (self.peers is None or self.peers.all_ready())

    def server_metadata(self) -> dict[str, Any]:
        cuda = self.cuda_shm.available and self.cuda_shm.enabled  # said only where it works
        return metadata.server_metadata(VERSION, metadata.extensions(cuda_shared_memory=cuda))

    def model_ready(self, name: str, version: str = "") -> bool:
        return self.engine.model_ready(name, version)

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        servable = self.engine.registry.get(name, version)
        return metadata.model_metadata(self.engine.registry, servable)

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        return metadata.model_config(self.engine.registry.get(name, version))

    def model_config_proto(self, name: str, version: str = "") -> Any:
        return self.engine.registry.get(name, version).config

    def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """This process's statistics (with several workers: this worker's share of them; a
        model another worker runs for this one is counted there, not here)."""
        stats = metadata.statistics(self.engine.registry, name, version)
        forwarded = {(s.name, str(s.version)) for s in self.engine.registry.servables() if s.forwarded}
        if forwarded:
            stats["model_stats"] = [
                m for m in stats["model_stats"] if (m["name"], m["version"]) not in forwarded
            ]
        return stats

    async def server_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """The whole server's statistics: with several workers, every worker's summed."""
        if self.peers is None:
            return self.statistics(name, version)
        return await self.peers.statistics(name, version)

    # ------------------------------------------------------------ inference

    async def infer(self, request: InferRequest, spill: bool = True) -> InferResponse:
        """Run one request. With several workers, a request that would wait here behind others
        of its model may run on a less busy worker instead (``spill``; see
        :meth:`Peers.spill_target`), so the requests of one connection use every worker."""
        if request.parameters:  # what the model sees (dataplane/parameters.py)
            request.parameters = model_parameters(request.parameters)
        model = request.model
        peers = self.peers
        if spill and peers is not None and _movable(request):
            target = peers.spill_target(model, self.admission.of(model))
            if target is not None:
                return await peers.spill(target, request)
        admission = self.admission
        admission.enter(model)  # Unavailable at once when the server or the model is full
        try:
            trace = self._maybe_trace(request)
            if trace is None:
                return await self.engine.infer_request(request)
            try:
                return await self.engine.infer_request(request, trace=trace.spans)
            except Exception as exc:
                trace.ok, trace.error = False, str(exc)
                raise
            finally:
                self._record(trace)
        finally:
            admission.leave(model)

    async def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """Every response to one request (several for a decoupled model or graph). With several
        workers, the one response of a model that is not decoupled may come from another worker,
        as in :meth:`infer` (a decoupled model's stream runs here)."""
        if request.parameters:
            request.parameters = model_parameters(request.parameters)
        model = request.model
        peers = self.peers
        if peers is not None:
            target = peers.spill_target(model, self.admission.of(model))
            if target is not None:
                yield await peers.spill(target, request)
                return
        self.admission.enter(model)
        trace = self._maybe_trace(request)
        try:
            source = self.engine.stream_request(request, trace=trace.spans if trace is not None else None)
            # a decoupled graph never waits for a slow client (streams.py)
            decoupled = self.engine.registry.get(model, request.version).decoupled
            responses = decouple(source, model, self.guards.budget) if decoupled else source
            async with contextlib.aclosing(responses):  # a client gone cancels the graph's work now
                async for response in responses:
                    yield response
        except Exception as exc:
            if trace is not None:
                trace.ok, trace.error = False, str(exc)
            raise
        finally:
            self.admission.leave(model)
            if trace is not None:
                self._record(trace)

    def check_request(self, request: InferRequest) -> None:
        """Refuse now (InvalidArgument) a request the model would refuse, before anything runs:
        its parameters (reserved keys) and its inputs (names, count, types, shapes). For a front
        end that answers a refused request otherwise than a failed one (``generate_stream``: a
        JSON error, not an event); :meth:`stream` checks the same again."""
        if request.parameters:
            request.parameters = model_parameters(request.parameters)
        self.engine.registry.get(request.model, request.version).validate(request.inputs)

    def _record(self, trace: Trace) -> None:
        self.traces.append(trace)
        if self.on_trace is not None:
            try:
                self.on_trace(trace)
            except Exception:  # writing a trace must never fail the request
                log.exception("trace output failed")

    def trace_file_settings(self, model: str) -> TraceSettings:
        """The trace settings that apply to ``model`` (its own, else the global ones)."""
        return self.model_trace_settings.get(model, self.trace_settings)

    def _maybe_trace(self, request: InferRequest) -> Trace | None:
        """A trace for this request when the settings sample it: every ``trace_rate``-th
        request (0: none) while ``trace_count`` lasts; in opentelemetry mode also every
        request that carries its caller's trace context (``traceparent``), as Triton does."""
        model = request.model
        settings = self.model_trace_settings.get(model, self.trace_settings)
        if "OFF" in settings.trace_level or not settings.trace_level:
            return None
        if settings.trace_mode == "opentelemetry":
            context = request.parameters.get("traceparent")
            if isinstance(context, str) and len(context) == 55:  # version-traceid-spanid-flags
                return Trace(request.id, model, [], traceparent=context)
        rate = settings.trace_rate
        if settings.trace_count == 0 or rate <= 0:
            return None
        if rate > 1 and random.randrange(rate) != 0:
            return None
        if settings.trace_count > 0:
            settings.trace_count -= 1
            if self.peers is not None:  # the count is the whole server's: the others hear of it
                self.peers.trace_taken(model if model in self.model_trace_settings else "")
        return Trace(request.id, model, [])

    # ------------------------------------------------------------ repository

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        return metadata.repository_index(self.engine.registry, ready_only)

    def _check_control(self, action: str, name: str) -> None:
        mode = self.engine.settings.control_mode
        if mode != "explicit":
            raise Unsupported(
                f"failed to {action} '{name}': explicit model {action} is not allowed in model control "
                f"mode '{mode}' (start the server with --model-control-mode=explicit)"
            )

    async def load(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """``parameters``: ``config`` (ModelConfig JSON) and ``file:<path>`` (bytes) entries;
        or ``split_weights`` alone, which changes a graph's split weights without a reload (in
        any control mode: nothing is loaded). With several workers, in effect in every worker
        when it returns."""
        if parameters and "split_weights" in parameters:
            if len(parameters) > 1:
                raise InvalidArgument(f"load of '{name}': 'split_weights' cannot be combined with a load")
            parse_split_weights(name, parameters["split_weights"])  # refused here, before anywhere
        else:
            self._check_control("load", name)
            config = (parameters or {}).get("config")
            if isinstance(config, str):
                check_config_override(name, config)  # refused here, before any worker reads it
        if self.peers is not None:
            await self.peers.broadcast("load", {"name": name, "parameters": parameters or {}})
        else:
            await self._load_here(name, parameters)

    async def _load_here(self, name: str, parameters: dict[str, Any] | None) -> None:
        if parameters and "split_weights" in parameters:
            weights = parse_split_weights(name, parameters["split_weights"])
            set_split_weights(self.engine.registry, name, weights)
            return
        parameters = parameters or {}
        config = parameters.get("config")
        files: dict[str, bytes] = {}
        for key, value in parameters.items():
            if key.startswith("file:"):
                if not isinstance(value, bytes | bytearray):
                    raise InvalidArgument(f"load of '{name}': '{key}' must carry bytes")
                files[key[len("file:") :]] = bytes(value)
        if config is not None and not isinstance(config, str):
            raise InvalidArgument(f"load of '{name}': 'config' must be a JSON string")
        await self.engine.load_model(name, config, files or None)

    async def unload(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        self._check_control("unload", name)
        if self.peers is not None:
            await self.peers.broadcast("unload", {"name": name, "parameters": parameters or {}})
        else:
            await self._unload_here(name, parameters)

    async def _unload_here(self, name: str, parameters: dict[str, Any] | None) -> None:
        dependents = bool((parameters or {}).get("unload_dependents", False))
        await self.engine.unload_model(name, dependents)

    # ------------------------------------------------------------ changes made everywhere

    async def register_shm(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Register a system shared-memory region (with several workers: in every worker)."""
        if self.peers is None:
            self.shm.register(name, key, offset, byte_size)
            return
        self.shm.check_register(name, key, offset, byte_size)  # refused here, before anywhere
        await self.peers.broadcast(
            "register_shm", {"name": name, "key": key, "offset": offset, "size": byte_size}
        )

    async def unregister_shm(self, name: str = "") -> None:
        if self.peers is None:
            self.shm.unregister(name)
        else:
            await self.peers.broadcast("unregister_shm", {"name": name})

    async def register_cuda_shm(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Register a CUDA shared-memory region (with several workers: opened in every worker)."""
        if self.peers is None:
            self.cuda_shm.register(name, raw_handle, device_id, byte_size)
            return
        self.cuda_shm.check_register(name, raw_handle, device_id, byte_size)  # refused here first
        await self.peers.broadcast(
            "register_cuda_shm",
            {
                "name": name,
                "handle": base64.b64encode(raw_handle).decode(),
                "device": device_id,
                "size": byte_size,
            },
        )

    async def unregister_cuda_shm(self, name: str = "") -> None:
        if self.peers is None or not self.cuda_shm.available:
            self.cuda_shm.unregister(name)
        else:
            await self.peers.broadcast("unregister_cuda_shm", {"name": name})

    async def set_trace_settings(self, settings: dict[str, Any], model: str = "") -> dict[str, Any]:
        """Update trace settings from the network (with several workers: in every worker)."""
        result = self.update_trace_settings(settings, model)  # checked (and applied) here first
        if self.peers is not None:
            await self.peers.broadcast("trace_settings", {"settings": settings, "model": model})
        return result

    async def set_log_settings(self, settings: dict[str, Any]) -> dict[str, Any]:
        """Update log settings from the network (with several workers: in every worker)."""
        result = self.update_log_settings(settings)
        if self.peers is not None:
            await self.peers.broadcast("log_settings", {"settings": settings})
        return result

    async def apply(self, op: str, args: dict[str, Any]) -> None:
        """Apply one change in this process (a worker, asked by the supervisor: every worker
        applies each change the server makes, in one order)."""
        if op == "load":
            await self._load_here(args["name"], args["parameters"])
        elif op == "unload":
            await self._unload_here(args["name"], args["parameters"])
        elif op == "register_shm":
            self.shm.register(args["name"], args["key"], args["offset"], args["size"])
        elif op == "unregister_shm":
            self.shm.unregister(args["name"])
        elif op == "register_cuda_shm":
            handle = base64.b64decode(args["handle"])
            self.cuda_shm.register(args["name"], handle, args["device"], args["size"])
        elif op == "unregister_cuda_shm":
            self.cuda_shm.unregister(args["name"])
        elif op == "trace_settings":
            self.update_trace_settings(args["settings"], args["model"])
        elif op == "log_settings":
            self.update_log_settings(args["settings"])
        elif op == "trace_count":  # what is left of the server's trace count, after a trace
            model = args["model"]
            target = self.model_trace_settings.get(model) if model else self.trace_settings
            if target is not None:
                target.trace_count = args["count"]
        elif op == "poll":
            await self.engine.poll_once()
        else:
            raise InvalidArgument(f"unknown change '{op}'")

    async def run_forwarded(self, request: Forwarded) -> Any:
        """Run a request another worker forwarded to this one, the owner of its model."""
        return await self.engine.run_forwarded(request)

    # ------------------------------------------------------------ trace and log settings

    def get_trace_settings(self, model: str = "") -> dict[str, Any]:
        if model:
            self.engine.registry.get(model)
            return self.model_trace_settings.get(model, self.trace_settings).as_dict()
        return self.trace_settings.as_dict()

    def update_trace_settings(
        self, settings: dict[str, Any], model: str = "", from_network: bool = True
    ) -> dict[str, Any]:
        """Values may be strings, lists of strings or None (None: back to the global value).

        ``trace_file`` names a file the server writes: from the network (``from_network``, the
        front ends' calls) it cannot be changed, as in Triton; only the command line
        (``--trace-config triton,file=PATH``) sets it. Sending the value in force is accepted."""
        if model:
            self.engine.registry.get(model)
        if from_network:
            _refuse_file_change(settings, "trace_file", self.get_trace_settings(model)["trace_file"], "trace")
        base = self.model_trace_settings.get(model) if model else self.trace_settings
        target = TraceSettings(**vars(base if base is not None else self.trace_settings))
        for key, value in settings.items():
            if key not in _TRACE_KEYS:
                raise InvalidArgument(f"unknown trace setting '{_shown(key)}'")
            if value is None:
                setattr(target, key, getattr(self.trace_settings, key))
                continue
            if key == "trace_level":
                levels = trace_levels(value)
                if levels:  # an empty list changes nothing, as in Triton
                    target.trace_level = levels
                continue
            if isinstance(value, list):  # gRPC sends every value as a list
                if len(value) != 1:
                    raise InvalidArgument(f"expect only 1 value for '{key}'")
                value = value[0]
            if key in SETTINGS:
                setattr(target, key, trace_number(key, value))
            elif key == "trace_mode" and value not in self.trace_modes:
                raise InvalidArgument(
                    f"trace_mode '{_shown(value)}' is not available: this server traces in "
                    f"{' or '.join(sorted(self.trace_modes))} mode (opentelemetry needs "
                    "--trace-config mode=opentelemetry at start)"
                )
            elif isinstance(value, str):
                setattr(target, key, value)
            else:
                raise InvalidArgument(f"trace setting '{key}' must be a string, got {value!r}")
        if model:
            self.model_trace_settings[model] = target
        else:
            self.trace_settings = target
        return target.as_dict()

    def get_log_settings(self) -> dict[str, Any]:
        return dict(self.log_settings)

    def update_log_settings(self, settings: dict[str, Any], from_network: bool = True) -> dict[str, Any]:
        """``log_file`` cannot be changed from the network (``from_network``), as in Triton:
        only the command line (``--log-file``) sets it. Sending the value in force is accepted."""
        if from_network:
            _refuse_file_change(settings, "log_file", self.log_settings["log_file"], "log")
        for key, value in settings.items():  # every value is checked before any is applied
            _check_log_setting(key, value)
        self.log_settings.update(settings)
        self._apply_log_settings()
        return dict(self.log_settings)

    def _apply_log_settings(self) -> None:
        s = self.log_settings
        if s["log_verbose_level"] > 0:
            level = logging.DEBUG
        elif s["log_info"]:
            level = logging.INFO
        elif s["log_warning"]:
            level = logging.WARNING
        elif s["log_error"]:
            level = logging.ERROR
        else:
            level = logging.CRITICAL + 1
        logging.getLogger().setLevel(level)
        logging.getLogger("flowserve").setLevel(level)
        if s["log_file"]:
            root = logging.getLogger()
            if not any(
                isinstance(h, logging.FileHandler) and h.baseFilename == s["log_file"] for h in root.handlers
            ):
                try:
                    root.addHandler(logging.FileHandler(s["log_file"]))
                except OSError as exc:
                    raise InvalidArgument(f"cannot open log_file '{s['log_file']}': {exc.strerror}") from None

    def recent_traces(self, model: str = "") -> list[Trace]:
        return [t for t in self.traces if not model or t.model == model]

    def require_model(self, name: str) -> None:
        if not self.engine.registry.has(name):
            raise NotFound(f"Request for unknown model: '{name}' is not found")

    # ------------------------------------------------------------ what is loaded (read-only)

    def has_model(self, name: str) -> bool:
        """Whether ``name`` has a version loaded."""
        return self.engine.registry.has(name)

    def is_decoupled(self, name: str, version: str = "") -> bool:
        """Whether the model answers with a stream (raises NotFound when not loaded)."""
        return self.engine.registry.get(name, version).decoupled

    def servables(self) -> list[Servable]:
        """Every loaded model or graph version this process runs, sorted by (name, version)
        (with several workers, not the ones another worker runs for it)."""
        return sorted(
            (s for s in self.engine.registry.servables() if not s.forwarded),
            key=lambda s: (s.name, s.version),
        )

    def servable(self, name: str, version: str = "") -> Servable | None:
        """The loaded version that serves ``name`` (``version`` "": the newest), or None."""
        registry = self.engine.registry
        if not registry.has(name):
            return None
        try:
            return registry.get(name, version)
        except FlowserveError:
            return None

    def model_states(self) -> list[Status]:
        """Every model and graph the repository knows, with its load state and reason."""
        return self.engine.registry.index()

    def plan(self, name: str) -> Plan | None:
        """The compiled graph of ``name`` (loaded or not), or None."""
        return self.engine.plans.get(name)

    def is_graph(self, name: str) -> bool:
        """Whether ``name`` comes from a YAML graph (not a repository model)."""
        return name in self.engine.graphs

    def model_specs(self) -> Mapping[str, ModelSpec]:
        """The repository's model specs by name."""
        return self.engine.models

    async def stop(self) -> None:
        """Stop serving: every servable is stopped (the repository's and the engine's end);
        the CUDA shared-memory regions opened here are closed."""
        try:
            await self.engine.stop()
        finally:
            self.cuda_shm.close()


class _ModelControl:
    """``pb_utils.load_model``/``unload_model`` as the load and unload API (Triton's: the
    control mode decides, a config override and files as the API's parameters)."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    async def load_model(self, name: str, config: str, files: dict[str, bytes]) -> None:
        parameters: dict[str, Any] = {f"file:{path}": data for path, data in files.items()}
        if config:
            parameters["config"] = config
        await self.plane.load(name, parameters or None)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        await self.plane.unload(name, {"unload_dependents": unload_dependents})


def _refuse_file_change(settings: dict[str, Any], key: str, current: str, kind: str) -> None:
    """Refuse a network request that would change which file the server writes.

    A file location from the network is a remote file write (create, truncate or append to
    any path the server can write, with content the client steers), so, as Triton does, file
    locations come only from the command line. Sending the value in force (or nothing) is
    fine, so clients that send back what they read keep working."""
    if key not in settings:
        return
    value = settings[key]
    if isinstance(value, list) and len(value) == 1:  # gRPC sends every value as a list
        value = value[0]
    if value is None or value == current:
        return
    raise Unsupported(
        f"{kind} file location can not be updated through network protocol: '{key}' is set only "
        f"on the command line ({'--trace-config triton,file=PATH' if kind == 'trace' else '--log-file PATH'})"
    )


def _movable(request: InferRequest) -> bool:
    """Whether a request may run in another worker: not one whose tensors live on a GPU
    (inputs read from, or outputs kept for, CUDA shared memory): they stay in this process."""
    return not request.keep_device and all(isinstance(v, np.ndarray) for v in request.inputs.values())


# ------------------------------------------------------------ checks of trace and log settings
# (bounds: spec/bounds.py SETTINGS; wording: Triton's, where it has one)


def _shown(value: Any) -> str:
    """A client's value as an error message shows it (at most 64 characters of it)."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 64 else text[:61] + "..."


def trace_levels(value: Any) -> list[str]:
    """A ``trace_level`` setting: a level or a list of them, each known, repeats dropped,
    ``OFF`` alone (a list of more than SETTINGS["trace_level"] entries is refused unread)."""
    levels = [value] if isinstance(value, str) else value
    if not isinstance(levels, list):
        raise InvalidArgument(f"trace_level must be a string or a list of strings, got {_shown(levels)}")
    most = int(SETTINGS["trace_level"].high)
    if len(levels) > most:
        raise InvalidArgument(
            f"trace_level has {len(levels)} entries, more than {most}: give each of "
            f"{', '.join(TRACE_LEVELS)} at most once"
        )
    if not all(isinstance(v, str) for v in levels):
        raise InvalidArgument(f"trace_level must be a string or a list of strings, got {_shown(levels)}")
    unknown = [v for v in levels if v not in TRACE_LEVELS]
    if unknown:
        raise InvalidArgument(f"trace_level must be OFF, TIMESTAMPS or TENSORS, got {_shown(unknown)}")
    unique = list(dict.fromkeys(levels))
    if "OFF" in unique and len(unique) > 1:
        raise InvalidArgument("Expect only one trace level 'OFF' is specified")
    return unique


def trace_number(key: str, value: Any) -> int:
    """``trace_rate``, ``trace_count`` or ``log_frequency`` (an integer or its digits) within its
    bound, or InvalidArgument in Triton's words naming the setting and the range."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidArgument(f"Unable to parse '{key}', got: {_shown(value)}")
    try:
        number = int(value)
    except ValueError:
        raise InvalidArgument(f"Unable to parse '{key}', got: {_shown(value)}") from None
    bound = SETTINGS[key]
    if key == "trace_count" and number < bound.low:
        raise InvalidArgument(
            f"Unable to parse 'trace_count'. Expecting value >= {bound.low}, got:{_shown(value)}"
        )
    if not bound.holds(number):
        raise InvalidArgument(
            f"Unable to parse '{key}', value is out of range [ {bound.low}, {bound.high} ], "
            f"got: {_shown(value)}"
        )
    return number


def _check_log_setting(key: str, value: Any) -> None:
    """One log setting from the network: known, of its type, within its bound."""
    kind = _LOG_KEYS.get(key)
    if kind is None:
        raise InvalidArgument(f"unknown log setting '{_shown(key)}'")
    if kind is bool and not isinstance(value, bool):
        raise InvalidArgument(f"log setting '{key}' must be a boolean")
    if kind is int:
        bound = SETTINGS[key]
        if not isinstance(value, int) or isinstance(value, bool) or not bound.holds(value):
            raise InvalidArgument(
                f"log setting '{key}' must be an integer between {bound.low} and {bound.high} "
                f"({bound.what}), got {_shown(value)}"
            )
    if kind is str and not isinstance(value, str):
        raise InvalidArgument(f"log setting '{key}' must be a string")
    if key == "log_format" and value not in ("default", "ISO8601"):
        raise InvalidArgument(f"invalid argument for log_format, got: {_shown(value)}")
