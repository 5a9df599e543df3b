"""What every model backend shares: instances on their own threads, reshape, statistics.

A backend subclass implements two synchronous methods, run on an instance's own thread::

    def load_instance(self, index: int) -> object          # a session, a module, a model.py
    def execute(self, instance: object, inputs: TensorMap) -> TensorMap

and may override ``unload_instance``. Everything else (queueing for a free instance, timing,
reshape between the client's ``dims`` and the model's ``reshape``) lives here once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from flowserve.core.clock import MONOTONIC, Clock
from flowserve.core.device import edges, tensor_map
from flowserve.core.node import Context, Node, TensorMap
from flowserve.graph.plan import Signature
from flowserve.nodes.batching.tensors import merge_rows, request_rows, split_rows
from flowserve.nodes.instances import InstancePool
from flowserve.nodes.loading import LoadSettings
from flowserve.nodes.warmup import warm_up_instances
from flowserve.runtime.registry import Registry
from flowserve.runtime.stats import ModelStats
from flowserve.spec.schema import ModelSpec, TensorSpec


def backend_signature(model: ModelSpec) -> Signature:
    mb = model.max_batch_size

    def full(t: TensorSpec) -> TensorSpec:
        return TensorSpec(t.name, t.datatype, t.full_shape(mb), t.optional)

    return Signature(
        inputs={t.name: full(t) for t in model.inputs},
        outputs={t.name: full(t) for t in model.outputs},
        optional=frozenset(t.name for t in model.inputs if t.optional),
    )


class BackendNode(Node):
    # May a cheap call run on the event loop (see nodes/instances.py)? Only for backends whose
    # framework is not thread-affine (no CUDA stream or thread-local session state).
    inline_ok: bool = False
    # execute_batch merges requests' rows into one tensor batch (so they need equal shapes);
    # False where the model takes a list of requests (Triton's python backend)
    merges_rows: bool = True
    # May several instances load at once (Triton's parallel instance loading)? Only for
    # backends whose loading is thread-safe; up to the engine's load thread count at once.
    parallel_instance_loading: bool = False
    # warmup runs done at start (model_warmup samples x count x instances)
    warmup_runs: int = 0

    def __init__(
        self,
        model: ModelSpec,
        version: int,
        stats: ModelStats,
        clock: Clock = MONOTONIC,
        registry: Registry | None = None,
        load: LoadSettings | None = None,
    ) -> None:
        self.name = model.name
        # load threads, inline threshold and rate limiter of the repository that builds it
        self.load = load = load or LoadSettings()
        self.model = model
        self.version = version
        self.version_path = model.versions[version]
        self.stats = stats
        self.clock = clock
        # the engine's loaded servables, for backends that call other models (python BLS)
        self.registry = registry
        self.pool: InstancePool[Any] = InstancePool(
            f"{model.name}-v{version}", inline=self.inline_ok, threshold_ns=load.inline_threshold_ns
        )
        batched = model.max_batch_size > 0
        self._in_reshape = {t.name: t.reshape for t in model.inputs if t.reshape is not None}
        self._out_reshape = {t.name: t.dims for t in model.outputs if t.reshape is not None}
        self._ragged = frozenset(t.name for t in model.inputs if t.allow_ragged_batch)
        self._batched = batched

    @property
    def instance_count(self) -> int:
        return sum(g.count for g in self.model.instances) or 1

    def runs_inline(self) -> bool:
        """Whether the next batch will run on the event loop, never suspending (a batcher then
        runs it in its own task)."""
        return self.pool.runs_inline()

    def load_instance(self, index: int) -> Any:
        raise NotImplementedError

    def execute(self, instance: Any, inputs: TensorMap) -> TensorMap:
        raise NotImplementedError

    def execute_batch(self, instance: Any, batch: list[TensorMap]) -> list[TensorMap]:
        """Run several requests' inputs at once (called by a batcher, on the instance's thread).

        The default merges rows along the batch axis (ragged inputs as the flat concatenation
        of their elements, as Triton hands them to a model), runs ``execute`` once and splits
        the outputs back by each request's row count, raising InternalError when the outputs'
        rows do not add up. Backends whose models take a list of requests (Triton's python
        backend) override this.
        """
        if len(batch) == 1 and not self._ragged:
            return [self.execute(instance, batch[0])]
        merged = merge_rows(batch, self._ragged, self.stats)  # its copies count as the model's
        rows = [request_rows(b, self.name) for b in batch]
        return split_rows(self.execute(instance, merged), rows, self.name)

    async def run_batch(
        self,
        batch: list[TensorMap],
        on_acquired: Callable[[], None] | None = None,
        contexts: Sequence[Context] | None = None,
    ) -> list[TensorMap]:
        """Run several requests on one free instance (a batcher's entry point): ``execute_batch``
        on the instance's thread, with the inputs' and outputs' reshapes applied per request.
        ``contexts`` are the requests' own (ids, parameters), for backends that hand them on
        (:meth:`batch_call`)."""
        if self._in_reshape:
            batch = [self._reshape(b, self._in_reshape) for b in batch]
        execute = self.execute_batch if contexts is None else self.batch_call(contexts)
        results: list[TensorMap] = await self.pool.run(execute, batch, on_acquired)
        if self._out_reshape:
            results = [self._reshape(r, self._out_reshape) for r in results]
        return results

    def batch_call(self, contexts: Sequence[Context]) -> Callable[[Any, list[TensorMap]], list[TensorMap]]:
        """What runs a batch whose requests carry ``contexts``: ``execute_batch`` (which sees no
        context) unless a backend hands the requests' ids and parameters to its model."""
        return self.execute_batch

    def unload_instance(self, instance: Any) -> None:
        """Release one instance (called on its own thread)."""

    async def start(self) -> None:
        """Load the instances, then run the model's warmup samples through each; on failure
        the instances already loaded are released before the error propagates."""
        parallel = max(self.load.load_threads, 1) if self.parallel_instance_loading else 1
        limiter = self.load.rate_limiter  # the server's rate limiter, when it has one
        tickets = limiter.tickets(self.model, self.instance_count, self.version) if limiter else None
        try:
            await self.pool.add_many(self.load_instance, self.instance_count, parallel)
            if self.model.warmup:
                self.warmup_runs += await warm_up_instances(
                    self.name, self.model.warmup, len(self.pool.instances), self._batched, self._warm_one
                )
            if tickets is not None:
                self.pool.limit(tickets)
        except BaseException:
            await self.pool.close(self.unload_instance)
            raise

    async def _warm_one(self, index: int, inputs: TensorMap) -> object:
        if self.decoupled:  # its responses come through stream(), on a free instance
            return [out async for out in self.stream(inputs, Context(request_id="warmup"))]
        if self._in_reshape:
            inputs = self._reshape(inputs, self._in_reshape)
        return await self.pool.run_on(index, self.execute_batch, [inputs])

    async def stop(self) -> None:
        await self.pool.close(self.unload_instance)

    async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
        return await self._run_one(inputs, self.execute)

    async def _run_one(self, inputs: TensorMap, execute: Callable[[Any, TensorMap], TensorMap]) -> TensorMap:
        """One request (no batcher) on a free instance with ``execute(instance, inputs)``: the
        reshapes applied, its queue and compute time counted in the model's statistics."""
        clock = self.clock
        queued = clock.now_ns()
        started = queued

        def acquired() -> None:
            nonlocal started
            started = clock.now_ns()

        if self._in_reshape:
            inputs = self._reshape(inputs, self._in_reshape)
        outputs: TensorMap = await self.pool.run(execute, inputs, acquired)
        if self._out_reshape:
            outputs = self._reshape(outputs, self._out_reshape)
        done = clock.now_ns()
        rows = next(iter(inputs.values())).shape[0] if self._batched and inputs else 1
        self.stats.queue.add(started - queued)
        self.stats.record_execution(rows, 0, done - started, 0)
        return outputs

    def _reshape(self, tensors: TensorMap, shapes: dict[str, tuple[int, ...]]) -> TensorMap:
        out = dict(edges(tensors))
        for name, shape in shapes.items():
            array = out.get(name)
            if array is not None:
                lead = (array.shape[0],) if self._batched else ()
                # numpy, or a DLPack tensor (device_tensors backends): its framework's view
                out[name] = array.reshape(lead + tuple(shape))
        return tensor_map(out)
