"""What every model backend shares: instances on their own threads, reshape, statistics.

A backend subclass implements two synchronous methods, run on an instance's own thread::

    def load_instance(self, index: int) -> object          # a session, a module, a model.py
    def execute(self, instance: object, inputs: TensorMap) -> TensorMap

and may override ``unload_instance``. Everything else (queueing for a free instance, timing,
reshape between the client's ``dims`` and the model's ``reshape``) lives here once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flowserve.core.clock import MONOTONIC, Clock
from flowserve.core.node import Context, Node, TensorMap
from flowserve.graph.plan import Signature
from flowserve.nodes.instances import InstancePool
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
    def __init__(self, model: ModelSpec, version: int, stats: ModelStats, clock: Clock = MONOTONIC) -> None:
        self.name = model.name
        self.model = model
        self.version = version
        self.version_path = model.versions[version]
        self.stats = stats
        self.clock = clock
        self.pool: InstancePool[Any] = InstancePool(f"{model.name}-v{version}")
        batched = model.max_batch_size > 0
        self._in_reshape = {t.name: t.reshape for t in model.inputs if t.reshape is not None}
        self._out_reshape = {t.name: t.dims for t in model.outputs if t.reshape is not None}
        self._batched = batched

    @property
    def instance_count(self) -> int:
        return sum(g.count for g in self.model.instances) or 1

    def load_instance(self, index: int) -> Any:
        raise NotImplementedError

    def execute(self, instance: Any, inputs: TensorMap) -> TensorMap:
        raise NotImplementedError

    def execute_batch(self, instance: Any, batch: list[TensorMap]) -> list[TensorMap]:
        """Run several requests' inputs at once (called by a batcher, on the instance's thread).

        The default merges rows along the batch axis, runs ``execute`` once and splits the
        outputs back by each request's row count. Backends whose models take a list of
        requests (Triton's python backend) override this.
        """
        if len(batch) == 1:
            return [self.execute(instance, batch[0])]
        rows = [next(iter(b.values())).shape[0] for b in batch]
        merged = {name: np.concatenate([b[name] for b in batch]) for name in batch[0]}
        outputs = self.execute(instance, merged)
        bounds = np.cumsum(rows)[:-1]
        parts = {name: np.split(array, bounds) for name, array in outputs.items()}
        return [{name: parts[name][i] for name in parts} for i in range(len(batch))]

    def unload_instance(self, instance: Any) -> None:
        """Release one instance (called on its own thread)."""

    async def start(self) -> None:
        for _ in range(self.instance_count):
            await self.pool.add(self.load_instance)

    async def stop(self) -> None:
        await self.pool.close(self.unload_instance)

    async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
        clock = self.clock
        queued = clock.now_ns()
        started = queued

        def acquired() -> None:
            nonlocal started
            started = clock.now_ns()

        if self._in_reshape:
            inputs = self._reshape(inputs, self._in_reshape)
        outputs: TensorMap = await self.pool.run(self.execute, inputs, acquired)  # type: ignore[assignment]
        if self._out_reshape:
            outputs = self._reshape(outputs, self._out_reshape)
        done = clock.now_ns()
        rows = next(iter(inputs.values())).shape[0] if self._batched and inputs else 1
        self.stats.queue.add(started - queued)
        self.stats.record_execution(rows, 0, done - started, 0)
        return outputs

    def _reshape(self, tensors: TensorMap, shapes: dict[str, tuple[int, ...]]) -> TensorMap:
        out = dict(tensors)
        for name, shape in shapes.items():
            array = out.get(name)
            if array is not None:
                lead = (array.shape[0],) if self._batched else ()
                out[name] = np.reshape(array, lead + tuple(shape))
        return out
