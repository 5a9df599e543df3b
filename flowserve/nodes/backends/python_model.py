"""Triton's python backend, in-process: loads ``<version>/model.py`` and calls its
``TritonPythonModel`` (``initialize(args)``, ``execute(requests)``, ``finalize()``) on the
instance's own thread. Each instance gets its own object, as each Triton instance does.

- A batch of N requests reaches ``execute`` as N :class:`pb_utils.InferenceRequest` objects
  (Triton's semantics), and must come back as N responses.
- ``async def execute`` works: it runs on an event loop owned by the instance's thread.
- BLS: ``pb_utils.InferenceRequest(...).exec()`` / ``async_exec()`` run other models of the
  same engine; the request is handed to the engine's event loop with
  ``asyncio.run_coroutine_threadsafe`` (the model waits on its own thread).
- ``auto_complete_config`` runs at scan time (see :mod:`flowserve.nodes.backends.autocomplete`).
- Every error raised by model.py, or returned in a response, names the model.
- A cheap ``execute`` runs on the event loop (``inline_ok``; see nodes/instances.py), unless
  model.py is async or calls other models (BLS), which must wait on a thread of their own.
- ``FORCE_CPU_ONLY_INPUT_TENSORS`` (config parameter, Triton's): "yes" (the default) hands
  model.py numpy inputs (device tensors copied to the host, counted); "no" hands it the inputs
  as their producers made them (``device_tensors``): a torch GPU model's output arrives as a GPU
  ``pb_utils.Tensor`` (``is_cpu()`` False, ``to_dlpack()`` without a copy). Outputs made with
  ``pb_utils.Tensor.from_dlpack`` flow on where they are either way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import inspect
import json
import logging
import sys
import threading
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flowserve.core.datatypes import to_numpy
from flowserve.core.device import tensor_map
from flowserve.core.errors import (
    ErrorCode,
    FlowserveError,
    InternalError,
    InvalidArgument,
    error_class,
)
from flowserve.core.importpath import drop_prepended, prepend_path
from flowserve.core.node import Context, TensorMap
from flowserve.nodes.backends import pb_utils
from flowserve.nodes.backends._support import Parameters, placement
from flowserve.nodes.backends.base import BackendNode
from flowserve.nodes.backends.python_replies import (
    RESCHEDULE,
    Answer,
    InstanceLoop,
    Reply,
    end_streams,
    settle,
    verbatim,
)
from flowserve.nodes.batching.runners import StreamSink
from flowserve.nodes.loading import ModelControl
from flowserve.runtime.registry import Registry
from flowserve.runtime.stats import ModelStats
from flowserve.spec.schema import ModelSpec
from flowserve.spec.triton import config_to_json

sys.modules.setdefault("triton_python_backend_utils", pb_utils)

log = logging.getLogger("flowserve.python_model")


class EngineLink:
    """BLS, readiness and model control from model.py threads into the engine that serves it."""

    def __init__(
        self, registry: Registry, loop: asyncio.AbstractEventLoop, control: ModelControl | None = None
    ) -> None:
        self.registry = registry
        self.loop = loop
        self.control = control

    def _off_loop(self, call: str) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            raise pb_utils.TritonModelException(
                f"{call} was called on the engine's event loop thread, where waiting would deadlock"
            )

    def _context(self, call: pb_utils.BlsCall, clock_ns: int) -> Context:
        deadline = clock_ns + call.timeout_us * 1000 if call.timeout_us > 0 else None
        return Context(request_id=call.request_id, parameters=call.parameters, deadline_ns=deadline)

    def submit(self, call: pb_utils.BlsCall) -> concurrent.futures.Future[TensorMap]:
        self._off_loop("BLS exec()")

        async def run() -> TensorMap:
            servable = self.registry.get(call.model, call.version)
            ctx = self._context(call, servable.clock.now_ns())
            return await servable.infer(call.inputs, ctx)

        return asyncio.run_coroutine_threadsafe(run(), self.loop)

    def stream(
        self, call: pb_utils.BlsCall, put: Callable[[TensorMap], None]
    ) -> concurrent.futures.Future[bool]:
        self._off_loop("BLS exec(decoupled=True)")

        async def run() -> bool:
            servable = self.registry.get(call.model, call.version)
            ctx = self._context(call, servable.clock.now_ns())
            async for outputs in servable.stream(call.inputs, ctx):
                put(outputs)
            return servable.decoupled

        return asyncio.run_coroutine_threadsafe(run(), self.loop)

    def is_model_ready(self, name: str, version: str) -> bool:
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            return self.registry.ready(name, version)

        async def ready() -> bool:
            return self.registry.ready(name, version)

        return asyncio.run_coroutine_threadsafe(ready(), self.loop).result()

    def _control(self, call: str) -> ModelControl:
        if self.control is None:
            raise pb_utils.TritonModelException(
                f"{call} is not available: this engine hands its python models no model control "
                "(flowserve's repository does not pass one to the python backend yet)"
            )
        self._off_loop(call)
        return self.control

    def load_model(self, name: str, config: str, files: dict[str, bytes]) -> None:
        control = self._control("pb_utils.load_model()")
        _wait(asyncio.run_coroutine_threadsafe(control.load_model(name, config, files), self.loop))

    def unload_model(self, name: str, unload_dependents: bool) -> None:
        control = self._control("pb_utils.unload_model()")
        _wait(asyncio.run_coroutine_threadsafe(control.unload_model(name, unload_dependents), self.loop))


def _wait(future: concurrent.futures.Future[Any]) -> None:
    try:
        future.result()
    except FlowserveError as exc:
        raise pb_utils.TritonModelException(exc.message) from exc


@dataclass
class PythonInstance:
    model: Any
    is_async: bool
    module: Any = None
    model_dir: str = ""
    name: str = ""  # Triton's instance name (<group>_<index>), as its errors say
    loop: InstanceLoop | None = field(default=None)  # an async execute's, made on first use
    link: pb_utils.BlsLink | None = None


class PythonModelBackend(BackendNode):
    inline_ok = True
    merges_rows = False  # execute(requests): one request per batch entry, shapes of their own
    _link: EngineLink | None = None

    def __init__(self, model: ModelSpec, version: int, stats: ModelStats, *args: Any, **kwargs: Any) -> None:
        super().__init__(model, version, stats, *args, **kwargs)
        # a decoupled model answers through request.get_response_sender(): see stream(); known
        # before start, so a batcher in front streams too
        self.decoupled = model.decoupled
        # FORCE_CPU_ONLY_INPUT_TENSORS "no": inputs as their producers made them (a GPU's too)
        self.device_tensors = not force_cpu_only_inputs(model)

    async def start(self) -> None:
        if self.registry is not None:
            self._link = EngineLink(self.registry, asyncio.get_running_loop(), self.load.model_control)
        # each declared output's numpy dtype and Triton datatype (BYTES, matched by kind, left out)
        self._declared = {
            t.name: (to_numpy(t.datatype), t.datatype) for t in self.model.outputs if t.datatype != "BYTES"
        }
        self._warned: set[str] = set()
        await super().start()

    async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
        """One request (no batcher): its id, parameters and cancellation reach model.py's
        ``InferenceRequest`` (``is_cancelled()`` turns true when the caller goes away or the
        deadline passes while execute runs, as in Triton)."""
        clock = self.clock
        queued = started = clock.now_ns()

        def acquired() -> None:
            nonlocal started
            started = clock.now_ns()

        if self._in_reshape:
            inputs = self._reshape(inputs, self._in_reshape)
        request = self._request(inputs, ctx)
        reply = Reply()
        request._reply_to = reply.deliver
        try:
            answer = await self.pool.run(self._execute_one, (request, reply), acquired)
            while answer is RESCHEDULE:  # back in the queue, behind the requests waiting
                answer = await self.pool.run(self._execute_one, (request, reply))
            if isinstance(answer, concurrent.futures.Future):
                cancel = _cancel_of(request)
                del request  # (see _later)
                answer = await self._later(cancel, answer)
        except asyncio.CancelledError:
            ctx.cancelled = True
            raise
        rows = next(iter(inputs.values())).shape[0] if self._batched and inputs else 1
        self.stats.queue.add(started - queued)
        self.stats.record_execution(rows, 0, clock.now_ns() - started, 0)
        result = self._answer(answer)
        if isinstance(result, BaseException):
            raise result
        return result

    def _execute_one(self, instance: PythonInstance, one: tuple[pb_utils.InferenceRequest, Reply]) -> Answer:
        """One request's ``execute`` (no batcher): the common case (one response returned, no
        sender asked for, not rescheduled) without :func:`settle`'s bookkeeping."""
        request, reply = one
        request._release_flags = pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL
        try:
            returned = _call_execute(instance, [request])
        except FlowserveError as exc:
            return settle([request], [reply], None, exc)[0]
        if (
            type(returned) is list
            and len(returned) == 1
            and request._sender is None
            and returned[0] is not None
            and request._release_flags == pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL
        ):
            return returned[0]
        return settle([request], [reply], returned, None)[0]

    async def _later(self, cancel: threading.Event | None, answer: concurrent.futures.Future[Any]) -> Any:
        """The response a model sends after ``execute`` returned (the instance already free).
        The server holds no request meanwhile: a sender the model let go of unsent ends the
        request with an error (InferenceResponseSender.__del__), not a wait for ever."""
        try:
            return await asyncio.wrap_future(answer)
        except asyncio.CancelledError:
            if cancel is not None:
                cancel.set()
            raise

    async def run_batch(  # type: ignore[override]
        self,
        batch: list[TensorMap],
        on_acquired: Callable[[], None] | None = None,
        contexts: Sequence[Context] | None = None,
    ) -> list[TensorMap | Exception]:
        """One ``execute(requests)`` of the batch on a free instance (a batcher's entry point):
        each request's answer, or the error of that request alone (python_replies). Responses
        sent after ``execute`` returned are awaited here, the instance already free; requests
        released to be rescheduled wait for a free instance again, behind the others waiting."""
        if self._in_reshape:
            batch = [self._reshape(b, self._in_reshape) for b in batch]
        requests = [
            self._request(inputs, contexts[i] if contexts is not None else None)
            for i, inputs in enumerate(batch)
        ]
        replies = [Reply() for _ in requests]
        for i, reply in enumerate(replies):
            requests[i]._reply_to = reply.deliver
        answers: list[Answer] = [None] * len(requests)
        todo = list(range(len(requests)))
        while todo:
            got = await self.pool.run(
                self._execute_some, ([requests[i] for i in todo], [replies[i] for i in todo]), on_acquired
            )
            on_acquired = None
            for i, answer in zip(todo, got, strict=True):
                answers[i] = answer
            todo = [i for i in todo if answers[i] is RESCHEDULE]
        waits = [
            (i, answer, _cancel_of(requests[i]))
            for i, answer in enumerate(answers)
            if isinstance(answer, concurrent.futures.Future)
        ]
        del requests  # (see _later)
        for i, answer, cancel in waits:
            answers[i] = await self._later(cancel, answer)
        return [self._answer(answer) for answer in answers]

    def _execute_some(
        self,
        instance: PythonInstance,
        some: tuple[list[pb_utils.InferenceRequest], list[Reply]],
    ) -> list[Answer]:
        requests, replies = some
        for request in requests:
            request._release_flags = pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL
        try:
            returned, error = _call_execute(instance, requests), None
        except FlowserveError as exc:
            returned, error = None, exc
        return settle(requests, replies, returned, error)

    def _answer(self, answer: Answer) -> TensorMap | Exception:
        """A request's answer as its outputs (reshaped as declared), or its error."""
        if isinstance(answer, Exception):
            return answer
        try:
            outputs = self._outputs(answer)
        except Exception as exc:
            return exc
        if self._out_reshape:
            outputs = self._reshape(outputs, self._out_reshape)
        return outputs

    async def stream(self, inputs: TensorMap, ctx: Context) -> AsyncGenerator[TensorMap, None]:
        """A decoupled model's responses for one request (no batcher), in the order model.py
        sends them, until it sends the final flag (which may come after ``execute`` returned)."""
        if not self.decoupled:
            yield await self(inputs, ctx)
            return
        sink = StreamSink(asyncio.get_running_loop())
        start = self.clock.now_ns()

        async def run() -> None:
            try:
                await self.run_stream_batch([inputs], (ctx,), (sink,))
            except Exception as exc:
                sink.fail(exc)

        running = asyncio.ensure_future(run())
        try:
            async for outputs in sink.responses():
                yield outputs
        finally:
            # the stream ended before the final response (the client went away, an error):
            # the model sees is_cancelled() and may stop early, as in Triton
            sink.leave()
            await running
        self.stats.record_execution(1, 0, self.clock.now_ns() - start, 0)

    async def run_stream_batch(
        self,
        batch: list[TensorMap],
        contexts: Sequence[Context],
        sinks: Sequence[StreamSink],
        on_acquired: Callable[[], None] | None = None,
    ) -> None:
        """One ``execute(requests)`` of a decoupled model on a free instance (a batcher's entry
        point, and :meth:`stream`'s): each request gets a response sender that feeds its sink;
        returns when ``execute`` returned, freeing the instance (responses may still come). A
        request released with ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` goes back in the queue
        for a free instance, and ``execute`` gets it again (Triton's iterative sequences)."""
        if self._in_reshape:
            batch = [self._reshape(b, self._in_reshape) for b in batch]
        requests = [self._request(inputs, ctx) for inputs, ctx in zip(batch, contexts, strict=True)]
        for request, sink in zip(requests, sinks, strict=True):
            sender = request._sender = pb_utils.InferenceResponseSender(
                self._deliver_to(sink), model=self.model.name
            )
            sink.cancel = sender.cancelled.set
        pending = requests
        while pending:
            pending = await self.pool.run(self._execute_streams, pending, on_acquired)
            on_acquired = None

    def _deliver_to(self, sink: StreamSink) -> Callable[[Any, bool], None]:
        def deliver(response: Any, final: bool) -> None:
            if isinstance(response, BaseException):  # the server ends the request
                sink.fail(response)
                return
            try:
                outputs = None if response is None else self._outputs(response)
            except Exception as exc:  # an error response ends this request's stream
                sink.fail(exc)
                return
            sink.put(outputs, final)

        return deliver

    def _execute_streams(
        self, instance: PythonInstance, requests: list[pb_utils.InferenceRequest]
    ) -> list[pb_utils.InferenceRequest]:
        """One decoupled ``execute``; the requests it released to run again."""
        for request in requests:
            request._release_flags = pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL
        try:
            returned, error = _call_execute(instance, requests), None
        except FlowserveError as exc:
            returned, error = None, exc
        return end_streams(requests, returned, error, instance.name)

    def _request(self, inputs: TensorMap, ctx: Context | None) -> pb_utils.InferenceRequest:
        parameters = dict(ctx.parameters) if ctx is not None and ctx.parameters else {}
        correlation: object = 0
        flags = 0
        if parameters:  # the sequence controls become the request's correlation id and flags
            correlation = parameters.pop("sequence_id", 0)
            if parameters.pop("sequence_start", False):
                flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
            if parameters.pop("sequence_end", False):
                flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
            # the scheduler's settings, as Triton's front ends take them: not the model's
            parameters.pop("priority", None)
            parameters.pop("timeout", None)
        return pb_utils.InferenceRequest._incoming(
            self.model.name,
            inputs,
            self.version,
            request_id=ctx.request_id if ctx is not None else "",
            parameters=parameters,
            correlation_id=correlation if isinstance(correlation, int | str) else 0,
            flags=flags,
            context=ctx,
            device_inputs=self.device_tensors,
        )

    def load_instance(self, index: int) -> PythonInstance:
        name = self.model.name
        pb_utils.set_link(self._link, default=self._link is not None)
        version_dir = Path(self.version_path)
        path = version_dir / (self.model.default_model_filename or "model.py")
        if not path.is_file():
            raise InvalidArgument(f"model '{name}': {path} does not exist")
        module = _import_model(name, path)
        cls = getattr(module, "TritonPythonModel", None)
        if cls is None:
            raise InvalidArgument(f"model '{name}': {path} defines no TritonPythonModel")
        place = placement(self.model, index, "python")
        config = config_to_json(self.model.config)
        with pb_utils.outside_execute(str(version_dir)), _as_model(module):
            obj = cls()
            init = getattr(obj, "initialize", None)
            if init is not None:
                args = {
                    "model_config": json.dumps(config),
                    "model_instance_kind": place.kind,
                    "model_instance_name": _instance_name(name, config, self.model.instances, index),
                    "model_instance_device_id": str(place.device),
                    "model_repository": str(version_dir.parent),
                    "model_version": str(self.version),
                    "model_name": name,
                }
                try:
                    init(args)
                except Exception as exc:
                    raise InternalError(
                        f"model '{name}': model.py initialize() raised {_describe(exc)}"
                    ) from exc
        execute = getattr(obj, "execute", None)
        if execute is None:
            raise InvalidArgument(f"model '{name}': TritonPythonModel in {path} has no execute()")
        is_async = inspect.iscoroutinefunction(execute)
        if is_async or _uses_bls(path):
            self.pool.policy.threshold_ns = 0  # BLS and async execute block: never on the loop
        instance_name = _instance_name(name, config, self.model.instances, index)
        return PythonInstance(obj, is_async, module, str(version_dir), instance_name, link=self._link)

    def execute(self, instance: PythonInstance, inputs: TensorMap) -> TensorMap:
        return self.execute_batch(instance, [inputs])[0]

    def execute_batch(self, instance: PythonInstance, batch: list[TensorMap]) -> list[TensorMap]:
        """Triton's semantics on this instance's thread, waiting here (the sequence batcher's and
        warmup's way in): one ``execute(requests)`` with one request per batch entry; the first
        request's error raises."""
        requests = [self._request(inputs, None) for inputs in batch]
        replies = [Reply() for _ in requests]
        for request, reply in zip(requests, replies, strict=True):
            request._reply_to = reply.deliver
        answers = self._execute_some(instance, (requests, replies))
        while any(a is RESCHEDULE for a in answers):
            todo = [i for i, a in enumerate(answers) if a is RESCHEDULE]
            again = self._execute_some(instance, ([requests[i] for i in todo], [replies[i] for i in todo]))
            for i, answer in zip(todo, again, strict=True):
                answers[i] = answer
        results: list[TensorMap] = []
        for answer in answers:
            done = self._answer(answer.result() if isinstance(answer, concurrent.futures.Future) else answer)
            if isinstance(done, Exception):
                raise done
            results.append(done)
        return results

    def _outputs(self, response: Any) -> TensorMap:
        if not isinstance(response, pb_utils.InferenceResponse):
            raise InternalError(
                "model.py execute() must return pb_utils.InferenceResponse objects, got "
                f"{type(response).__name__}"
            )
        error = response.error()
        if error is not None:
            # a TritonError's code -> the matching error (HTTP and gRPC answer Triton's status)
            kind = error_class(pb_utils.ERROR_CODES.get(error.code(), ErrorCode.INTERNAL))
            raise verbatim(kind(error.message()))  # the model's own words, as Triton answers them
        out = tensor_map({t._name: t._edge() for t in response.output_tensors()})  # DLPack: as they are
        declared = self._declared
        for key, array in out.items():
            found = declared.get(key)
            # a widening (FP16 for FP32) is served as declared, with a warning; a narrowing
            # (FP64 for FP32) is left to the executor (served as returned, with a warning)
            if (
                found is not None
                and type(array) is np.ndarray
                and array.dtype != found[0]
                and array.dtype.kind not in "OSU"
                and np.can_cast(array.dtype, found[0], "safe")
            ):
                self._warn_dtype(key, array.dtype, found[1])
                out[key] = array.astype(found[0])
        return out

    def _warn_dtype(self, output: str, got: Any, declared: str) -> None:
        if output in self._warned:
            return
        self._warned.add(output)
        log.warning(
            "model '%s': execute() returned output '%s' as %s, declared %s in the configuration; "
            "served as %s",
            self.model.name,
            output,
            got,
            declared,
            declared,
        )

    def unload_instance(self, instance: PythonInstance) -> None:
        try:
            fin = getattr(instance.model, "finalize", None)
            if fin is not None:
                with pb_utils.outside_execute(instance.model_dir), _as_model(instance.module):
                    try:
                        fin()
                    except Exception as exc:  # Triton logs it and unloads anyway
                        log.error(
                            "model '%s': model.py finalize() raised %s", self.model.name, _describe(exc)
                        )
        finally:
            if instance.loop is not None:
                instance.loop.close()


FORCE_CPU_ONLY = "FORCE_CPU_ONLY_INPUT_TENSORS"


def _cancel_of(request: pb_utils.InferenceRequest) -> threading.Event | None:
    """What tells the model its caller left, for a request whose answer is still to come."""
    sender = request._sender
    return sender.cancelled if sender is not None else None


def force_cpu_only_inputs(model: ModelSpec) -> bool:
    """Triton's ``FORCE_CPU_ONLY_INPUT_TENSORS`` parameter: "yes" (or absent) hands model.py
    host tensors, "no" the tensors as they come (InvalidArgument for any other value)."""
    raw = Parameters(model).text(FORCE_CPU_ONLY, "yes").lower()
    if raw in ("yes", "true", "1", "on", ""):
        return True
    if raw in ("no", "false", "0", "off"):
        return False
    raise InvalidArgument(
        f"model '{model.name}': parameter {FORCE_CPU_ONLY} must be \"yes\" or \"no\", got '{raw}'"
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, pb_utils.TritonModelException):
        return f"TritonModelException: {exc.message()}"
    return f"{type(exc).__name__}: {exc}"


def _instance_name(model: str, config: dict[str, Any], groups: Any, index: int) -> str:
    """Triton's ``<group name>_<index in group>``; a group named by no one is ``<model>_<group>``."""
    named = config.get("instance_group") or []
    start = 0
    for g, group in enumerate(groups):
        if index < start + group.count:
            given = named[g].get("name") if g < len(named) else None
            return f"{given or f'{model}_{g}'}_{group.first + index - start}"
        start += group.count
    return f"{model}_0_{index}"


# model.py imports one at a time: sys.path and sys.modules are changed around each
_IMPORT_LOCK = threading.Lock()


def _import_model(name: str, path: Path) -> Any:
    """model.py as Triton's stub loads it: its version directory and model directory on
    ``sys.path`` (sibling modules import), registered as module ``model`` while it runs. (The
    server processes set ``sys.argv`` as the stub's: see ``server.hide_command_line``.)"""
    with _IMPORT_LOCK:
        return _import_locked(name, path)


def _import_locked(name: str, path: Path) -> Any:
    version_dir = str(path.parent)
    model_dir = str(path.parent.parent)
    # a sibling module another model imported under the same name must not stand in for ours
    for entry in path.parent.iterdir():
        sibling = entry.stem if entry.suffix == ".py" else entry.name if entry.is_dir() else ""
        if not sibling or sibling == path.stem:
            continue
        loaded = sys.modules.get(sibling)
        origin = getattr(loaded, "__file__", None) or ""
        if loaded is not None and origin and not origin.startswith(version_dir):
            del sys.modules[sibling]
    spec = importlib.util.spec_from_file_location("model", path)
    if spec is None or spec.loader is None:
        raise InvalidArgument(f"model '{name}': cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    prepend_path(version_dir, model_dir)  # never in place: other threads import meanwhile
    try:
        with _as_model(module):
            spec.loader.exec_module(module)
    except Exception as exc:
        raise InternalError(f"model '{name}': importing {path} raised {_describe(exc)}") from exc
    finally:
        drop_prepended(version_dir, model_dir)
    return module


class _as_model:  # noqa: N801 - a context manager
    """``sys.modules["model"]`` is this model.py while its code runs (Triton's stub imports it
    so; test models call ``unittest.main("model")``)."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def __enter__(self) -> None:
        if self.module is not None:
            sys.modules["model"] = self.module

    def __exit__(self, *_: object) -> None:
        pass


def _call_execute(instance: PythonInstance, requests: list[Any]) -> Any:
    """model.py's ``execute(requests)``; an async one runs on the instance's own loop. What it
    raises becomes Triton's "Failed to process the request(s)" error (a FlowserveError, e.g.
    from BLS, as it is)."""
    if instance.module is not None:
        sys.modules["model"] = instance.module
    pb_utils.set_model_dir(instance.model_dir)
    try:
        if instance.is_async:
            if instance.loop is None:
                instance.loop = InstanceLoop(instance.name, instance.model_dir, instance.link)
            return instance.loop.run(instance.model.execute(requests))
        return instance.model.execute(requests)
    except FlowserveError:
        raise
    except Exception as exc:
        raise verbatim(
            InternalError(
                f"Failed to process the request(s) for model '{instance.name}', message: {_describe(exc)}"
            )
        ) from exc


def _uses_bls(path: Path) -> bool:
    """Whether model.py calls other models (BLS), judged from its text."""
    try:
        text = path.read_text()
    except OSError:
        return True
    return (
        "exec(" in text or "InferenceRequest(" in text or "load_model(" in text or "is_model_ready(" in text
    )
