"""``KIND_RAY``: a node's instances as Ray actors, behind the instance seam (nodes/instances.py).

A python node (YAML ``instances: {count: 4, kind: KIND_RAY, resources: {...}}``), a python
model or any backend model (``flowserve.ray.*`` parameters; see :mod:`flowserve.spec.rayspec`)
may run its instances on a Ray cluster (``--ray-address``). The node object stays here, built as
usual; only its pool changes (:func:`place_on_ray`): a :class:`RayPool` is an
:class:`~flowserve.nodes.instances.InstancePool` whose instances are actor handles, so the
executor, the batcher, statistics, traces and errors are the same as for local instances.

- **One load per actor.** Each actor builds a copy of the node from a :class:`Recipe` (the same
  constructor, with one local instance) and starts it, so the node's own factory
  (``load_instance``, ``initialize``) runs inside the actor, once; after Ray restarts a dead
  actor, its first call builds it again.
- **A call** is ``pool.run(fn, arg)`` as for a local pool: ``fn`` (the node's
  ``execute_batch``, a closure over the request's context...) is pickled with the node itself
  (and a request's :class:`~flowserve.core.node.Context`) replaced by a reference that the actor
  resolves to its copy, and ``arg`` (the tensors) travels as a Ray argument; the actor runs
  ``fn(its instance, arg)`` on its copy's instance thread. ``run`` awaits the call's ObjectRef on
  the event loop: no thread of this process waits on Ray. One call at a time per actor, as for a
  local instance; a free actor is taken per call.
- **Tensors** go through Ray's object store: numpy arrays are serialized out of band (pickle
  protocol 5) and read zero-copy (read-only) on the other side; inputs and outputs above Ray's
  inline limit (100 KiB) are written once into the object store and never pickled. Measured
  (benchmarks/ray_instances.py, benchmarks/README.md "Instances on Ray"): on a 2-core machine
  an empty call costs a median 2.7 ms through the hop against 72 us for a local instance, and a
  4 MiB input with a 4 MiB output 14 ms (each written once into the object store; the actor
  reads its input as a read-only view of it, tests/ray/test_instances.py checks that).
- **Errors.** What the node raises comes back as it was raised (same type and message; a type
  that does not survive pickling as an INTERNAL error with its text). An actor that dies (its
  process or its Ray node) fails its in-flight call with UNAVAILABLE naming the node and saying
  that the Ray actor died; Ray restarts it (``max_restarts``, -1: always), the instance takes no
  call until it has loaded again (the others serve meanwhile), then serves as before. An
  unsatisfiable resource request (``num_gpus: 1`` on a cluster without
  GPUs) fails the load at once, naming the resources.
- **Not on Ray:** decoupled nodes (their responses stream from the instance), BLS from a python
  model inside an actor (the actor has no engine), the server's rate limiter (Ray's resources
  govern the actors). Paths (model files, ``nodes/`` modules) must be the same on every Ray
  node: the actors get this process's ``sys.path``.

Ray is imported only when a KIND_RAY node loads (flowserve imports without it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import io
import logging
import os
import pickle
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from flowserve.core.errors import FlowserveError, InternalError, InvalidArgument, Unavailable, Unsupported
from flowserve.core.node import Context, Node
from flowserve.nodes.backends import backend_class
from flowserve.nodes.backends.base import BackendNode
from flowserve.nodes.instances import InstancePool, Worker
from flowserve.nodes.loading import LoadSettings
from flowserve.nodes.python import PythonNode
from flowserve.nodes.sequence import SequenceBatcher
from flowserve.runtime.stats import ModelStats
from flowserve.spec.model_config import ModelConfig, new_config
from flowserve.spec.rayspec import KIND_RAY, local_instance
from flowserve.spec.schema import InstanceSpec, ModelSpec, NodeSpec, RaySpec

if TYPE_CHECKING:
    from flowserve.nodes.ratelimit import Ticket

A = TypeVar("A")
R = TypeVar("R")

log = logging.getLogger("flowserve")

# an actor that cannot be placed (the cluster is full) makes the load fail after this long
LOAD_TIMEOUT_S = 300.0
# an actor's copy of the node gets this long to stop (finalize) when its node unloads
STOP_TIMEOUT_S = 30.0
NAMESPACE = "flowserve"

_OWNER = "flowserve.ray:node"
_CONTEXT = "flowserve.ray:context"
_BLOB_CACHE = 64


# ------------------------------------------------------------------ placing a node


def ray_group(spec: NodeSpec, model: ModelSpec | None) -> InstanceSpec | None:
    """The KIND_RAY instances a node asks for: a YAML node's ``instances``, or a repository
    model's (its ``flowserve.ray.*`` parameters, see spec/rayspec.py ``ray_instances``)."""
    if spec.instances.kind == KIND_RAY:
        return spec.instances
    if spec.kind == "backend" and model is not None:
        return next((g for g in model.instances if g.kind == KIND_RAY), None)
    return None


def place_on_ray(
    node: Node, spec: NodeSpec, graph: str, model: ModelSpec | None, version: int, load: LoadSettings
) -> Node:
    """``node`` with its instances on Ray when its spec asks for KIND_RAY (else unchanged).
    Raises a FlowserveError naming the node or model when it cannot be: no Ray address
    configured, ray not installed, a kind or a decoupled node that cannot run there."""
    group = ray_group(spec, model)
    if group is None or group.ray is None:
        return node
    backend = spec.kind == "backend" and model is not None
    who = (
        f"model '{model.name}'" if backend and model is not None else f"node '{spec.name}' of graph '{graph}'"
    )
    if not load.ray_address:
        raise Unavailable(
            f"{who} asks for KIND_RAY instances, but no Ray cluster is configured: serve with "
            "--ray-address ADDRESS ('auto' for a local Ray) or set FLOWSERVE_RAY_ADDRESS"
        )
    if importlib.util.find_spec("ray") is None:
        raise Unsupported(f"{who} asks for KIND_RAY instances, which need ray: pip install 'flowserve[ray]'")
    target = node.inner if isinstance(node, SequenceBatcher) else node
    if isinstance(target, PythonNode):
        recipe = Recipe.python(spec, graph)
    elif isinstance(target, BackendNode) and model is not None:
        recipe = Recipe.backend(model, version)
    else:
        raise InvalidArgument(f"{who}: only python nodes and repository models can run on Ray")
    if target.decoupled or (model is not None and backend and model.decoupled):
        raise Unsupported(
            f"{who} is decoupled: its responses stream from the instance, which cannot be a Ray actor"
        )
    target.pool = RayPool(target.pool.name, who, target, recipe, group.count, group.ray, load.ray_address)
    return node


@dataclass(frozen=True)
class Recipe:
    """How an actor builds its copy of the node: the node's own constructor, with one local
    instance. ``sys_path``: this process's, so the actor imports what the node imports."""

    kind: str  # "python" or "backend"
    graph: str
    spec: NodeSpec | None
    model: ModelSpec | None
    version: int
    sys_path: tuple[str, ...]

    @classmethod
    def python(cls, spec: NodeSpec, graph: str) -> Recipe:
        local = dataclasses.replace(spec, instances=InstanceSpec(count=1))
        return cls("python", graph, local, None, 0, _search_path())

    @classmethod
    def backend(cls, model: ModelSpec, version: int) -> Recipe:
        # the actor's working directory is not this one: absolute paths to the model's files
        versions = {v: str(Path(path).resolve()) for v, path in model.versions.items()}
        local = dataclasses.replace(
            local_instance(model), versions=versions, source=str(Path(model.source).resolve())
        )
        return cls("backend", model.name, None, local, version, _search_path())

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled with the model's config (a protobuf message, which does not pickle) as bytes."""
        model, config = self.model, b""
        if model is not None:
            config = model.config.SerializeToString()  # type: ignore[attr-defined]
            model = dataclasses.replace(model, config=cast(ModelConfig, None))
        return _recipe, (self.kind, self.graph, self.spec, model, config, self.version, self.sys_path)

    def build(self) -> PythonNode | BackendNode:
        load = LoadSettings(inline_threshold_us=0)  # an actor's calls wait on its instance thread
        if self.kind == "python":
            assert self.spec is not None
            return PythonNode(self.spec, self.graph, load)
        assert self.model is not None
        backend_type = backend_class(self.model.backend, self.model.name)
        return backend_type(self.model, self.version, ModelStats(), registry=None, load=load)


def _recipe(
    kind: str,
    graph: str,
    spec: NodeSpec | None,
    model: ModelSpec | None,
    config: bytes,
    version: int,
    sys_path: tuple[str, ...],
) -> Recipe:
    if model is not None:
        message = new_config()
        message.ParseFromString(config)  # type: ignore[attr-defined]
        model = dataclasses.replace(model, config=message)
    return Recipe(kind, graph, spec, model, version, sys_path)


def _search_path() -> tuple[str, ...]:
    return tuple(str(Path(p).resolve()) if p else str(Path.cwd()) for p in sys.path)


# ------------------------------------------------------------------ connecting

_connect_lock = threading.Lock()
_connected = False  # this process called ray.init (and so must call ray.shutdown)


def connect(address: str) -> None:
    """Connect this process to Ray once (blocking: call it off the event loop). ``auto``: the
    cluster this machine runs, else a new local one; ``local``: a new local one."""
    import ray

    global _connected
    with _connect_lock:
        if ray.is_initialized():
            return
        log.info("connecting to Ray at %s", address)
        ray.init(
            address=None if address == "auto" else address,
            namespace=NAMESPACE,
            configure_logging=False,
            ignore_reinit_error=True,
        )
        _connected = True


def disconnect() -> None:
    """Undo :func:`connect` at the server's stop (blocking: call it off the event loop):
    ``ray.shutdown()`` stops the Ray processes a ``local`` (or ``auto`` without a cluster)
    start began here, and only disconnects from a cluster that was already running. Without it
    the process's end could leave them running (the exit watchdog ends it without atexit)."""
    global _connected
    with _connect_lock:
        if not _connected:
            return
        import ray

        _connected = False
        log.info("disconnecting from Ray")
        ray.shutdown()


def _feasible(ray_spec: RaySpec) -> str | None:
    """Why no node of the cluster could ever hold one actor (None: some node can)."""
    import ray

    wanted = {"CPU": ray_spec.num_cpus, "GPU": ray_spec.num_gpus, **dict(ray_spec.resources)}
    wanted = {k: v for k, v in wanted.items() if v > 0}
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
    if not wanted or any(all(have.get(k, 0.0) >= v for k, v in wanted.items()) for have in nodes):
        return None
    asked = ", ".join(f"{k}: {v:g}" for k, v in wanted.items())
    return f"no node of the Ray cluster has {{{asked}}} ({len(nodes)} alive nodes)"


# ------------------------------------------------------------------ the actor


class InstanceActor:
    """One instance on Ray (made a Ray actor class by :func:`_actor_class`): a copy of the node
    with one local instance, built on first use. Async methods, one call at a time."""

    def __init__(self, recipe: Recipe) -> None:
        for entry in recipe.sys_path:
            if entry not in sys.path:
                sys.path.append(entry)
        self._recipe = recipe
        self._node: PythonNode | BackendNode | None = None

    async def load(self) -> dict[str, Any]:
        """Build and start the node's copy (once); where this actor runs."""
        if self._node is None:
            node = self._recipe.build()
            await node.start()
            self._node = node
        import ray

        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}

    async def call(self, blob: bytes, on_loop: bool, arg: Any) -> Any:
        """``fn(instance, arg)`` with ``fn`` unpickled from ``blob`` against this actor's copy;
        an ``async`` one (``on_loop``) is awaited on the actor's loop. What it raises comes
        back as a :class:`Failure` value (so the caller re-raises it as it was)."""
        try:
            if self._node is None:
                await self.load()
            node = self._node
            assert node is not None
            fn = _loads(blob, node)
            if on_loop:
                return await fn(node.pool.instances[0], arg)
            return await node.pool.run_on(0, fn, arg)
        except Exception as exc:
            return Failure.of(exc)

    async def stop(self) -> None:
        node, self._node = self._node, None
        if node is not None:
            await node.stop()


@dataclass
class Failure:
    """An exception raised inside an actor, handed back as a value: the exception itself when it
    survives pickling unchanged, else its type and text."""

    error: BaseException | None
    text: str

    @classmethod
    def of(cls, exc: BaseException) -> Failure:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        try:
            copy = pickle.loads(pickle.dumps(exc))
            same = type(copy) is type(exc) and str(copy) == str(exc)
        except Exception:
            same = False
        return cls(exc if same else None, text)

    def exception(self) -> BaseException:
        return self.error if self.error is not None else InternalError(self.text)


_actor_cls: Any = None


def _actor_class() -> Any:
    global _actor_cls
    if _actor_cls is None:
        import ray

        _actor_cls = ray.remote(InstanceActor)
    return _actor_cls


# ------------------------------------------------------------------ pickling calls


class _CallPickler(pickle.Pickler):
    """Pickles a call's function with the node (``owner``) and request contexts by reference."""

    def __init__(self, file: io.BytesIO, owner: object) -> None:
        super().__init__(file, protocol=5)
        self.owner = owner

    def persistent_id(self, obj: Any) -> Any:
        if obj is self.owner:
            return _OWNER
        if isinstance(obj, Context):
            # the deadline is this process's clock (the caller enforces it); no trace spans
            return (_CONTEXT, obj.request_id, dict(obj.parameters), obj.priority)
        return None


class _CallUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, node: object) -> None:
        super().__init__(file)
        self.node = node

    def persistent_load(self, pid: Any) -> Any:
        if pid == _OWNER:
            return self.node
        if isinstance(pid, tuple) and pid and pid[0] == _CONTEXT:
            return Context(request_id=pid[1], parameters=pid[2], priority=pid[3])
        raise pickle.UnpicklingError(f"unknown reference {pid!r}")


_pickler_cls: Any = None


def _dumps(fn: Callable[..., Any], owner: object) -> bytes:
    """``fn`` pickled by value where it must be (cloudpickle: lambdas, closures), with
    ``owner`` and contexts by reference (see :class:`_CallPickler`)."""
    global _pickler_cls
    if _pickler_cls is None:
        from ray import cloudpickle

        _pickler_cls = type(
            "CallPickler", (cloudpickle.CloudPickler,), {"persistent_id": _CallPickler.persistent_id}
        )
    buffer = io.BytesIO()
    pickler = _pickler_cls(buffer, protocol=5)
    pickler.owner = owner
    pickler.dump(fn)
    return buffer.getvalue()


def _loads(blob: bytes, node: object) -> Any:
    return _CallUnpickler(io.BytesIO(blob), node).load()


def _cache_key(fn: Callable[..., Any], owner: object) -> object | None:
    """What identifies ``fn``'s pickle for reuse: a bound method of the owner, or a function
    without closure or defaults (a fresh lambda per call still has the same code)."""
    func = getattr(fn, "__func__", None)
    if func is not None:
        return ("method", func) if getattr(fn, "__self__", None) is owner else None
    code = getattr(fn, "__code__", None)
    if code is not None and not getattr(fn, "__closure__", None) and not getattr(fn, "__defaults__", None):
        return ("code", code, id(getattr(fn, "__globals__", None)))
    return None


# ------------------------------------------------------------------ the pool


class RayPool(InstancePool[Any]):
    """Instances that are Ray actors (see the module's docs); the interface of InstancePool."""

    def __init__(
        self, name: str, who: str, owner: object, recipe: Recipe, count: int, ray_spec: RaySpec, address: str
    ) -> None:
        """``owner``: the node whose calls this pool runs (its calls name it; each actor stands
        in its own copy); ``who``: how errors name it."""
        super().__init__(name)
        self.who = who
        self.owner = owner
        self.recipe = recipe
        self.count = count
        self.ray_spec = ray_spec
        self.address = address
        self._handles: list[Any] = []
        self._places: list[dict[str, Any]] = []
        self._idle: list[int] = []
        self._slots: asyncio.Semaphore | None = None
        self._held: set[int] = set()
        self._recovering: set[asyncio.Task[None]] = set()
        self._blobs: dict[object, bytes] = {}

    # ------------------------------------------------------------ loading

    async def add(self, factory: Callable[[int], Any]) -> Any:
        """One more actor (``factory`` runs inside it, through the node's copy)."""
        await self._create(1)
        return self._handles[-1]

    async def add_many(self, factory: Callable[[int], Any], count: int, parallel: int = 1) -> None:
        """The pool's actors (``count`` as the node says; all load at once, each in its own
        process): the first failure is raised once every actor created is killed."""
        await self._create(count)

    async def _create(self, count: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, connect, self.address)
        except Exception as exc:
            raise Unavailable(f"{self.who}: cannot connect to Ray at '{self.address}': {exc}") from None
        problem = await loop.run_in_executor(None, _feasible, self.ray_spec)
        if problem is not None:
            raise Unavailable(f"{self.who} cannot be placed on Ray: {problem}")
        actor = _actor_class().options(
            num_cpus=self.ray_spec.num_cpus,
            num_gpus=self.ray_spec.num_gpus,
            resources=dict(self.ray_spec.resources) or None,
            max_restarts=self.ray_spec.max_restarts,
            max_concurrency=1,
        )
        try:
            handles = [actor.remote(self.recipe) for _ in range(count)]
        except Exception as exc:
            raise InternalError(f"{self.who}: cannot create its Ray actors: {_short(exc)}") from None
        loads = [asyncio.wait_for(_awaitable(h.load.remote()), LOAD_TIMEOUT_S) for h in handles]
        results = await asyncio.gather(*loads, return_exceptions=True)
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            for handle in handles:
                _kill(handle)
            raise self._load_error(failure)
        for handle, place in zip(handles, results, strict=True):
            assert isinstance(place, dict)
            self._idle.append(len(self._handles))
            self._handles.append(handle)
            self._places.append(place)
        self._slots = asyncio.Semaphore(len(self._idle))
        log.info(
            "%s: %d instance(s) on Ray (%s)",
            self.who,
            len(self._handles),
            ", ".join(f"pid {p['pid']} on node {str(p['node_id'])[:8]}" for p in self._places),
        )

    def _load_error(self, exc: BaseException) -> FlowserveError:
        if isinstance(exc, TimeoutError):
            return Unavailable(
                f"{self.who}: its Ray actors were not placed and loaded within {LOAD_TIMEOUT_S:.0f} s "
                "(is the cluster full?)"
            )
        cause = getattr(exc, "cause", None) or exc
        if isinstance(cause, FlowserveError):
            return cause
        return InternalError(f"{self.who}: its Ray actor failed to load: {_short(cause)}")

    @property
    def instances(self) -> list[Any]:
        return list(self._handles)

    @property
    def places(self) -> list[dict[str, Any]]:
        """Where each actor was loaded: ``pid`` and Ray ``node_id`` (as of its first load)."""
        return [dict(p) for p in self._places]

    # ------------------------------------------------------------ calls

    def _blob(self, fn: Callable[..., Any]) -> bytes:
        key = _cache_key(fn, self.owner)
        blob = self._blobs.get(key) if key is not None else None
        if blob is None:
            blob = _dumps(fn, self.owner)
            if key is not None and len(self._blobs) < _BLOB_CACHE:
                self._blobs[key] = blob
        return blob

    async def run(
        self, fn: Callable[[Any, A], R], arg: A, on_acquired: Callable[[], None] | None = None
    ) -> R:
        result: R = await self._call(self._blob(fn), False, arg, on_acquired)
        return result

    async def run_async(self, fn: Callable[[Any, A], Awaitable[R]], arg: A) -> R:
        result: R = await self._call(self._blob(fn), True, arg, None)
        return result

    async def run_on(self, index: int, fn: Callable[[Any, A], R], arg: A) -> R:
        result: R = await self._invoke(index, self._blob(fn), False, arg, None)
        return result

    async def _call(
        self, blob: bytes, on_loop: bool, arg: Any, on_acquired: Callable[[], None] | None
    ) -> Any:
        slots = self._slots
        if slots is None:
            raise RuntimeError(f"{self.name}: no instance loaded")
        await slots.acquire()
        index = self._idle.pop()
        try:
            if on_acquired is not None:
                on_acquired()
            return await self._invoke(index, blob, on_loop, arg, slots)
        finally:
            if index not in self._held:
                self._idle.append(index)
                slots.release()

    async def _invoke(
        self, index: int, blob: bytes, on_loop: bool, arg: Any, slots: asyncio.Semaphore | None
    ) -> Any:
        ref = self._handles[index].call.remote(blob, on_loop, arg)
        waiting = asyncio.ensure_future(_awaitable(ref))
        try:
            result = await asyncio.shield(waiting)
        except asyncio.CancelledError:
            if slots is not None:
                self._hold(index, waiting, slots)
            raise
        except Exception as exc:
            error = self._call_error(index, exc)
            if slots is not None and _died(exc):
                self._recover(index, slots)
            raise error from None
        if isinstance(result, Failure):
            raise result.exception()
        return result

    def _hold(self, index: int, waiting: asyncio.Future[Any], slots: asyncio.Semaphore) -> None:
        """The caller gave up on a running call: the actor takes no new call until it returns
        (as a local instance's thread does), so no request queues unseen behind it."""
        self._held.add(index)
        log.warning("%s: a Ray instance is still running a call its request abandoned", self.name)

        def returned(_: object) -> None:
            self._held.discard(index)
            if self._slots is slots:  # not closed meanwhile
                self._idle.append(index)
                slots.release()

        waiting.add_done_callback(returned)

    def _recover(self, index: int, slots: asyncio.Semaphore) -> None:
        """An actor died under a call: it takes no call until Ray has restarted it and it has
        loaded the node again (other instances serve meanwhile; with none, calls wait for it,
        within their deadlines). An actor Ray will not restart goes back as it is: its calls
        then fail at once with Ray's reason."""
        if index in self._held:
            return
        self._held.add(index)
        handle = self._handles[index]

        async def recover() -> None:
            delay = 0.05
            try:
                while self._slots is slots:
                    try:
                        place = await _awaitable(handle.load.remote())
                    except Exception as exc:
                        if not _restarting(exc):
                            log.error(
                                "%s: its Ray actor %d will not come back: %s", self.who, index, _short(exc)
                            )
                            return
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 1.0)
                        continue
                    if isinstance(place, dict) and index < len(self._places):
                        self._places[index] = place
                    log.info("%s: its Ray actor %d is back (pid %s)", self.who, index, place.get("pid"))
                    return
            finally:
                self._held.discard(index)
                if self._slots is slots:  # not closed meanwhile
                    self._idle.append(index)
                    slots.release()

        task = asyncio.ensure_future(recover())
        self._recovering.add(task)
        task.add_done_callback(self._recovering.discard)

    def _call_error(self, index: int, exc: BaseException) -> FlowserveError:
        place = self._places[index] if index < len(self._places) else {}
        where = f"instance {index} of {len(self._handles)}"
        if place:
            where += f", pid {place['pid']} on Ray node {str(place['node_id'])[:8]}"
        if _died(exc):
            restarts = self.ray_spec.max_restarts
            again = "always" if restarts < 0 else f"up to {restarts} times"
            return Unavailable(
                f"{self.who}: its Ray actor ({where}) died while running the request "
                f"({_short(exc)}); Ray restarts it ({again}) and later requests go to it"
            )
        cause = getattr(exc, "cause", None) or exc
        return InternalError(f"{self.who}: its Ray instance ({where}) failed: {_short(cause)}")

    def runs_inline(self) -> bool:
        return False

    @property
    def abandoned(self) -> int:
        return len(self._held)

    def limit(self, tickets: Sequence[Ticket | None]) -> None:
        """Ray's resources govern the actors; the server's rate limiter does not apply."""
        if any(t is not None for t in tickets):
            log.info("%s: instances on Ray are not rate limited (Ray's resources place them)", self.who)

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[tuple[Any, Worker]]:
        raise Unsupported(f"{self.who}: a streamed (decoupled) call cannot run on a Ray instance")
        yield  # type: ignore[unreachable]  # an async generator, for the context manager

    async def close(self, finalize: Callable[[Any], None] | None = None) -> None:
        """Stop each actor's copy of the node (its finalize / unload) and end the actors."""
        handles, self._handles = self._handles, []
        self._slots = None
        for task in list(self._recovering):
            task.cancel()
        self._idle.clear()
        self._places.clear()
        self._held.clear()

        async def stop(handle: Any) -> None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(_awaitable(handle.stop.remote()), STOP_TIMEOUT_S)
            _kill(handle)

        await asyncio.gather(*(stop(h) for h in handles))


def _died(exc: BaseException) -> bool:
    """Whether a call failed because its actor (its process or its node) died."""
    import ray.exceptions as rex

    return isinstance(
        exc, rex.RayActorError | rex.WorkerCrashedError | rex.ObjectLostError | rex.NodeDiedError
    )


def _restarting(exc: BaseException) -> bool:
    """Whether a call failed because its actor is being restarted (or is unreachable for now)."""
    import ray.exceptions as rex

    return isinstance(exc, rex.ActorUnavailableError)


async def _awaitable(ref: Any) -> Any:
    return await ref


def _kill(handle: Any) -> None:
    import ray

    with contextlib.suppress(Exception):
        ray.kill(handle, no_restart=True)


def _short(exc: BaseException) -> str:
    """An exception in one line (Ray's own messages run over many)."""
    text = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


__all__ = ["InstanceActor", "RayPool", "Recipe", "connect", "place_on_ray", "ray_group"]
