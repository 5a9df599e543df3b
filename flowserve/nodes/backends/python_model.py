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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import inspect
import json
import sys
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowserve.core.errors import (
    FlowserveError,
    InternalError,
    InvalidArgument,
    NotFound,
    Unavailable,
    Unsupported,
)
from flowserve.core.node import Context, TensorMap
from flowserve.nodes.backends import pb_utils
from flowserve.nodes.backends._support import placement
from flowserve.nodes.backends.base import BackendNode
from flowserve.runtime.registry import Registry
from flowserve.spec.triton import config_to_json

sys.modules.setdefault("triton_python_backend_utils", pb_utils)

_ERRORS: dict[int, type[FlowserveError]] = {
    pb_utils.TritonError.INVALID_ARG: InvalidArgument,
    pb_utils.TritonError.NOT_FOUND: NotFound,
    pb_utils.TritonError.UNAVAILABLE: Unavailable,
    pb_utils.TritonError.UNSUPPORTED: Unsupported,
}


class EngineLink:
    """BLS from model.py threads into the engine that serves the model."""

    def __init__(self, registry: Registry, loop: asyncio.AbstractEventLoop) -> None:
        self.registry = registry
        self.loop = loop

    def submit(
        self, model: str, version: str, inputs: TensorMap, parameters: dict[str, Any], request_id: str
    ) -> concurrent.futures.Future[TensorMap]:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            raise pb_utils.TritonModelException(
                "BLS exec() was called on the engine's event loop thread, where waiting would deadlock"
            )

        async def run() -> TensorMap:
            servable = self.registry.get(model, version)
            return await servable.infer(inputs, Context(request_id=request_id, parameters=parameters))

        return asyncio.run_coroutine_threadsafe(run(), self.loop)


@dataclass
class PythonInstance:
    model: Any
    is_async: bool
    loop: asyncio.AbstractEventLoop | None = field(default=None)


class PythonModelBackend(BackendNode):
    inline_ok = True
    merges_rows = False  # execute(requests): one request per batch entry, shapes of their own
    _link: EngineLink | None = None

    async def start(self) -> None:
        if self.registry is not None:
            self._link = EngineLink(self.registry, asyncio.get_running_loop())
        # a decoupled model answers through request.get_response_sender(): see stream()
        self.decoupled = self.model.decoupled
        await super().start()

    async def stream(self, inputs: TensorMap, ctx: Context) -> AsyncGenerator[TensorMap, None]:
        """A decoupled model's responses for one request, in the order model.py sends them,
        until it sends the final flag (which may come after ``execute`` returned)."""
        if not self.decoupled:
            yield await self(inputs, ctx)
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[Any, bool] | BaseException] = asyncio.Queue()

        def deliver(response: Any, final: bool) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (response, final))

        request = pb_utils.InferenceRequest(
            model_name=self.model.name,
            inputs=[pb_utils.Tensor(k, v) for k, v in inputs.items()],
            request_id=ctx.request_id,
            parameters=dict(ctx.parameters),
            model_version=self.version,
        )
        sender = request._sender = pb_utils.InferenceResponseSender(deliver)

        def run(instance: PythonInstance) -> None:
            try:
                _call_execute(instance, [request])
            except Exception as exc:
                error = InternalError(f"model.py execute() raised {type(exc).__name__}: {exc}")
                loop.call_soon_threadsafe(queue.put_nowait, error)

        start = self.clock.now_ns()
        count = 0
        async with self.pool.lease() as (instance, worker):
            running = asyncio.ensure_future(worker.call(run, instance))
            try:
                while True:
                    item = await queue.get()
                    if isinstance(item, BaseException):
                        raise item
                    response, final = item
                    if response is not None:
                        count += 1
                        yield self._outputs(response)
                    if final:
                        break
            finally:
                # the stream ended before the final response (the client went away, an error):
                # the model sees is_cancelled() and may stop early, as in Triton
                sender.cancelled.set()
                await running
        self.stats.record_execution(1, 0, self.clock.now_ns() - start, 0)

    def load_instance(self, index: int) -> PythonInstance:
        name = self.model.name
        pb_utils.set_link(self._link, default=self._link is not None)
        path = Path(self.version_path) / (self.model.default_model_filename or "model.py")
        if not path.is_file():
            raise InvalidArgument(f"model '{name}': {path} does not exist")
        module_name = f"flowserve_model_{name}_{self.version}_{index}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise InvalidArgument(f"model '{name}': cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise InternalError(
                f"model '{name}': importing {path} raised {type(exc).__name__}: {exc}"
            ) from exc
        cls = getattr(module, "TritonPythonModel", None)
        if cls is None:
            raise InvalidArgument(f"model '{name}': {path} defines no TritonPythonModel")
        obj = cls()
        place = placement(self.model, index, "python")
        init = getattr(obj, "initialize", None)
        if init is not None:
            args = {
                "model_config": json.dumps(config_to_json(self.model.config)),
                "model_instance_kind": place.kind,
                "model_instance_name": f"{name}_{index}",
                "model_instance_device_id": str(place.device),
                "model_repository": str(Path(self.version_path).parent),
                "model_version": str(self.version),
                "model_name": name,
            }
            try:
                init(args)
            except Exception as exc:
                raise InternalError(
                    f"model '{name}': model.py initialize() raised {type(exc).__name__}: {exc}"
                ) from exc
        execute = getattr(obj, "execute", None)
        if execute is None:
            raise InvalidArgument(f"model '{name}': TritonPythonModel in {path} has no execute()")
        is_async = inspect.iscoroutinefunction(execute)
        if is_async or _uses_bls(path):
            self.pool.policy.threshold_ns = 0  # BLS and async execute block: never on the loop
        return PythonInstance(obj, is_async)

    def execute(self, instance: PythonInstance, inputs: TensorMap) -> TensorMap:
        return self.execute_batch(instance, [inputs])[0]

    def execute_batch(self, instance: PythonInstance, batch: list[TensorMap]) -> list[TensorMap]:
        """Triton's semantics: one ``execute(requests)`` call with one request per batch entry."""
        name = self.model.name
        requests = [
            pb_utils.InferenceRequest(
                model_name=name,
                inputs=[pb_utils.Tensor(k, v) for k, v in inputs.items()],
                model_version=self.version,
            )
            for inputs in batch
        ]
        try:
            responses = _call_execute(instance, requests)
        except FlowserveError:
            raise
        except pb_utils.TritonModelException as exc:
            raise InternalError(f"model.py execute() raised: {exc.message()}") from exc
        except Exception as exc:
            raise InternalError(f"model.py execute() raised {type(exc).__name__}: {exc}") from exc
        if responses is None or len(responses) != len(requests):
            got = 0 if responses is None else len(responses)
            raise InternalError(f"model.py execute() returned {got} responses for {len(requests)} requests")
        return [self._outputs(response) for response in responses]

    def _outputs(self, response: Any) -> TensorMap:
        error = response.error()
        if error is not None:
            kind = _ERRORS.get(error.code(), InternalError)
            raise kind(error.message())
        return {t.name(): t.as_numpy() for t in response.output_tensors()}

    def unload_instance(self, instance: PythonInstance) -> None:
        try:
            fin = getattr(instance.model, "finalize", None)
            if fin is not None:
                fin()
        finally:
            if instance.loop is not None:
                instance.loop.close()


def _call_execute(instance: PythonInstance, requests: list[Any]) -> Any:
    """model.py's ``execute(requests)``; an async one runs on the instance's own loop."""
    if instance.is_async:
        if instance.loop is None:
            instance.loop = asyncio.new_event_loop()
        return instance.loop.run_until_complete(instance.model.execute(requests))
    return instance.model.execute(requests)


def _uses_bls(path: Path) -> bool:
    """Whether model.py calls other models (BLS), judged from its text."""
    try:
        text = path.read_text()
    except OSError:
        return True
    return "exec(" in text or "InferenceRequest(" in text
