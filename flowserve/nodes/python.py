"""Python nodes: user classes from ``nodes/`` (or any importable module) run in-process.

The contract (all optional but ``execute``)::

    class Scale:
        inputs = {"x": {"datatype": "FP32", "dims": [-1]}}    # or a list of names
        outputs = {"y": {"datatype": "FP32", "dims": [-1]}}   # or a list of names

        def initialize(self, config: dict) -> None: ...       # name, graph, parameters, instance
        def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...
        # or: async def execute(self, inputs) -> dict[str, np.ndarray]
        def finalize(self) -> None: ...

``dims`` are full shapes (with any batch dimension). YAML ``outputs`` on the node override the
class's. A sync ``execute`` runs on the instance's own thread, so a slow node never stalls the
event loop; an ``async`` one runs on the loop. ``instances.count`` copies run concurrently.
A cheap sync ``execute`` may run on the event loop (see nodes/instances.py); a class whose
``execute`` may block sets ``inline = False`` to stay on its thread.

``inputs`` are numpy arrays by default (a tensor a torch or ONNX Runtime node left on the
device is copied to the host for it, counted as the node's bytes copied). A class attribute
``tensors = "dlpack"`` (or ``parameters: {tensors: dlpack}`` on the YAML node) hands them over
as they come instead: a torch tensor stays a torch tensor (on the CPU or a GPU, already ordered
after its producer's stream for work on the calling thread's current stream), numpy stays
numpy; ``execute`` may then return any DLPack-capable arrays (torch, cupy, numpy), which go on
to the next node as they are (see flowserve/core/device.py)::

    class Normalize:
        tensors = "dlpack"
        def execute(self, inputs):
            x = torch.as_tensor(inputs["x"])         # torch from a torch node: no copy
            return {"y": (x - x.mean()) / x.std()}

An ``execute`` that is a generator (``yield`` instead of ``return``, sync or async) makes the
node *decoupled*: each yielded dict is one response, and the nodes behind it run once per
response (reach it through a streaming API).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import logging
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import Any

import numpy as np

from flowserve.core.datatypes import DATATYPES
from flowserve.core.device import CPU, DeviceTensor, edges, on_current_stream, produced, wrap
from flowserve.core.errors import InvalidArgument, SpecError, SpecIssue, code_location, code_traceback
from flowserve.core.node import Context, Node, TensorMap
from flowserve.graph.plan import Signature
from flowserve.nodes.instances import InstancePool, Worker
from flowserve.nodes.loading import LoadSettings
from flowserve.spec.schema import NodeSpec, TensorSpec
from flowserve.spec.suggest import did_you_mean

log = logging.getLogger("flowserve")


def import_target(target: str) -> Any:
    """``module:attr`` -> the object, with an error that says what could not be found."""
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the module's own code failed (any error), or it is not there
        raise _import_error(module_name, exc) from None
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            hint = did_you_mean(part, [n for n in dir(obj) if not n.startswith("_")])
            raise InvalidArgument(f"module '{module_name}' has no attribute '{attr}'{hint}") from None
    return obj


def _import_error(module_name: str, exc: Exception) -> InvalidArgument:
    """Why ``module_name`` cannot be imported, with where in its code (file:line) when its own
    code failed; the log gets the traceback of that code."""
    where = code_location(exc)
    if where:
        log.error("cannot import module '%s':\n%s", module_name, code_traceback(exc))
    text = str(exc) if isinstance(exc, ImportError) else f"{type(exc).__name__}: {exc}"
    return InvalidArgument(
        f"cannot import module '{module_name}': {text}" + (f" (at {where})" if where else "")
    )


def _tensor_table(raw: Any, what: str) -> dict[str, TensorSpec | None] | None:
    if raw is None:
        return None
    if isinstance(raw, list | tuple):
        return dict.fromkeys(str(n) for n in raw)
    if not isinstance(raw, dict):
        raise InvalidArgument(f"class attribute '{what}' must be a list of names or a dict")
    table: dict[str, TensorSpec | None] = {}
    for name, spec in raw.items():
        if spec is None:
            table[name] = None
            continue
        datatype, dims = (spec["datatype"], spec["dims"]) if isinstance(spec, dict) else spec
        if datatype not in DATATYPES:
            raise InvalidArgument(f"{what} '{name}': unknown datatype {datatype!r}")
        table[name] = TensorSpec(name, datatype, tuple(dims))
    return table


def python_signature(spec: NodeSpec) -> Signature:
    cls = import_target(spec.target)
    if not callable(getattr(cls, "execute", None)):
        raise InvalidArgument(f"'{spec.target}' has no execute(inputs) method")
    inputs = _tensor_table(getattr(cls, "inputs", None), "inputs")
    outputs = dict(_tensor_table(getattr(cls, "outputs", None), "outputs") or {})
    for name, tensor in spec.outputs.items():
        outputs[name] = tensor if tensor is not None else outputs.get(name)
    if not outputs:
        raise SpecError(
            [
                SpecIssue(
                    "",
                    f"'{spec.target}' declares no outputs: set an 'outputs' class attribute or "
                    "list them under the node's 'outputs'",
                    spec.name,
                    "outputs",
                )
            ]
        )
    optional = frozenset(getattr(cls, "optional_inputs", ()))
    return Signature(inputs=inputs, outputs=outputs, optional=optional)


class PythonNode(Node):
    def __init__(self, spec: NodeSpec, graph: str, load: LoadSettings | None = None) -> None:
        self.name = spec.name
        self.spec = spec
        self.graph = graph
        self.cls = import_target(spec.target)
        execute = self.cls.execute
        self._async = inspect.iscoroutinefunction(execute)
        self._async_gen = inspect.isasyncgenfunction(execute)
        self.decoupled = self._async_gen or inspect.isgeneratorfunction(execute)
        self._with_ctx = len(inspect.signature(execute).parameters) >= 3
        # a class that may block (I/O, locks, sleeps) sets ``inline = False``: a cheap call that
        # runs on the event loop and then blocks would stall every request, and no deadline can
        # interrupt it there (see nodes/instances.py)
        inline = bool(getattr(self.cls, "inline", True))
        # a class (or node) that may crash its process runs each instance in a child process
        self.isolated = bool(getattr(self.cls, "isolated", False) or spec.parameters.get("isolated") is True)
        if self.isolated and (self.decoupled or self._async):
            raise InvalidArgument(
                f"node '{spec.name}': an isolated node needs a plain (not async, not generator) execute"
            )
        # "numpy" (the default) or "dlpack": tensors handed over as they come
        self.device_tensors = tensors_option(self.cls, spec)
        if self.device_tensors and self.isolated:
            raise InvalidArgument(
                f"node '{spec.name}': tensors: dlpack cannot reach an isolated node (another process)"
            )
        self.pool: InstancePool[Any] = InstancePool(
            f"{graph}.{spec.name}",
            inline=inline and not self.isolated,
            threshold_ns=(load or LoadSettings()).inline_threshold_ns,
        )

    async def start(self) -> None:
        for _ in range(self.spec.instances.count):
            await self.pool.add(self._create)

    def _create(self, index: int) -> Any:
        config = {
            "name": self.spec.name,
            "graph": self.graph,
            "parameters": dict(self.spec.parameters),
            "instance": index,
        }
        if self.isolated:
            from flowserve.nodes.isolated import IsolatedInstance

            return IsolatedInstance(self.spec.target, config, f"{self.graph}.{self.spec.name}-{index}")
        obj = self.cls()
        init = getattr(obj, "initialize", None)
        if init is not None:
            init(config)
        return obj

    async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
        if self.device_tensors:
            return await self._call_dlpack(inputs, ctx)
        if self._async:
            if self._with_ctx:
                return await self.pool.run_async(lambda o, a: o.execute(a, ctx), inputs)
            return await self.pool.run_async(lambda o, a: o.execute(a), inputs)
        if self._with_ctx:
            return await self.pool.run(lambda o, a: o.execute(a, ctx), inputs)
        return await self.pool.run(_execute, inputs)

    async def _call_dlpack(self, inputs: TensorMap, ctx: Context) -> TensorMap:
        """``execute`` on the framework objects of its inputs; its outputs described for the
        engine (dtype, shape, device; an event recorded after them on a GPU)."""
        given = framework_inputs(inputs)
        if self._async:
            if self._with_ctx:
                out = await self.pool.run_async(lambda o, a: o.execute(a, ctx), given)
            else:
                out = await self.pool.run_async(lambda o, a: o.execute(a), given)
        elif self._with_ctx:
            out = await self.pool.run(lambda o, a: _described(o.execute(a, ctx)), given)
            return out  # type: ignore[no-any-return]
        else:
            out = await self.pool.run(lambda o, a: _described(o.execute(a)), given)
            return out  # type: ignore[no-any-return]
        return _described(out)

    async def stream(self, inputs: TensorMap, ctx: Context) -> AsyncGenerator[TensorMap, None]:
        if self.device_tensors:
            inputs = framework_inputs(inputs)
        if not self.decoupled:
            yield await self(inputs, ctx)
            return
        args = (inputs, ctx) if self._with_ctx else (inputs,)
        async with self.pool.lease() as (obj, worker):
            if self._async_gen:
                # closed here when the stream is abandoned, not later by the collector
                async with contextlib.aclosing(obj.execute(*args)) as items:
                    async for item in items:
                        yield _described(item) if self.device_tensors else item
                return
            async for item in _drain_on_thread(worker, lambda: obj.execute(*args)):
                yield _described(item) if self.device_tensors else item

    async def stop(self) -> None:
        await self.pool.close(_finalize)


TENSOR_OPTIONS = ("numpy", "dlpack")


def tensors_option(cls: Any, spec: NodeSpec) -> bool:
    """Whether a Python node takes its tensors as they come: ``tensors = "dlpack"`` on the
    class or ``parameters: {tensors: dlpack}`` on the node (the node's wins); numpy otherwise."""
    raw = spec.parameters.get("tensors", getattr(cls, "tensors", "numpy"))
    if raw not in TENSOR_OPTIONS:
        raise InvalidArgument(
            f"node '{spec.name}': tensors must be one of {', '.join(TENSOR_OPTIONS)}, got {raw!r}"
        )
    return bool(raw == "dlpack")


def framework_inputs(inputs: TensorMap) -> TensorMap:
    """The framework objects behind a node's inputs (a torch tensor as a torch tensor), each
    ordered for work on the calling thread's current stream; numpy as it is."""
    out: dict[str, Any] = {}
    for name, value in edges(inputs).items():
        out[name] = on_current_stream(value) if isinstance(value, DeviceTensor) else value
    return out


def _described(outputs: Any) -> TensorMap:
    """What a dlpack node returned, as the engine hands it on: numpy as is, any other DLPack
    array wrapped with its dtype, shape and device (on a GPU, with an event recorded after it
    on the current stream, so the next node's stream waits for it, not the device)."""
    if not isinstance(outputs, dict):
        return outputs  # type: ignore[no-any-return]  # the executor names the mistake
    out: dict[str, Any] = {}
    for name, value in outputs.items():
        if isinstance(value, np.ndarray | DeviceTensor) or not hasattr(value, "__dlpack_device__"):
            out[name] = value
            continue
        tensor = wrap(value)
        if tensor.device != CPU:
            from flowserve.nodes.backends.cuda import cuda_ops, cuda_to_numpy

            ops = cuda_ops()
            if ops is not None:
                stream = ops.current(tensor.device)
                tensor = produced(
                    value, stream, ops, tensor.dtype, tensor.shape, tensor.device, cuda_to_numpy
                )
        out[name] = tensor
    return out


_DONE = object()


async def _drain_on_thread(worker: Worker, make: Callable[[], Iterator[Any]]) -> AsyncIterator[Any]:
    """Run a sync generator on the instance's thread, handing items over through a small
    bounded queue (the generator waits while the consumer is behind)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=4)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in make():
                if stop.is_set():
                    return
                asyncio.run_coroutine_threadsafe(queue.put(item), loop).result()
        except BaseException as exc:  # handed to the consumer, re-raised there
            asyncio.run_coroutine_threadsafe(queue.put(_Raised(exc)), loop).result()
        else:
            asyncio.run_coroutine_threadsafe(queue.put(_DONE), loop).result()

    running = asyncio.ensure_future(worker.call(produce))
    try:
        while True:
            item = await queue.get()
            if item is _DONE:
                break
            if isinstance(item, _Raised):
                raise item.exc
            yield item
    finally:
        stop.set()
        # unblock a producer waiting on a full queue: take (and drop) what it still hands over
        # until its thread returns, woken by whichever comes first
        while not running.done():
            taken = asyncio.ensure_future(queue.get())
            try:
                await asyncio.wait((running, taken), return_when=asyncio.FIRST_COMPLETED)
            finally:
                taken.cancel()
        await running


class _Raised:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _execute(obj: Any, inputs: TensorMap) -> Any:
    return obj.execute(inputs)


def _finalize(obj: Any) -> None:
    fin = getattr(obj, "finalize", None)
    if fin is not None:
        fin()
