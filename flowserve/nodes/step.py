"""A graph node that runs another servable: a repository model (``model:``), a Triton ensemble
step, or another graph (``graph:``). The target is looked up per call, so a reloaded model is
picked up without reloading the graphs that use it; its own validation, batching and
statistics apply, as with Triton's ensemble steps."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from flowserve.core.node import Context, Node, TensorMap
from flowserve.graph.plan import Plan, Signature
from flowserve.runtime.registry import Registry


def step_signature(plan: Plan) -> Signature:
    return Signature(
        inputs=dict(plan.inputs),
        outputs={o.name: o.tensor for o in plan.outputs},
        optional=frozenset(n for n, t in plan.inputs.items() if t.optional),
    )


class StepNode(Node):
    def __init__(self, name: str, registry: Registry, target: str, version: str) -> None:
        self.name = name
        self.registry = registry
        self.target = target
        self.version = version
        # a step on a decoupled model streams its responses on to the nodes behind it; such a
        # model may leave outputs out of a response (Triton's vLLM backend: its return_* outputs
        # unless asked for): the nodes behind that wait on them are skipped
        self.decoupled = registry.has(target) and registry.get(target, version).decoupled
        self.partial_outputs = self.decoupled

    # tensors pass through a step as they are (a torch tensor, an OrtValue, on a GPU or not):
    # the target's own nodes take them or have them converted (flowserve/core/device.py)
    device_tensors = True

    async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
        servable = self.registry.get(self.target, self.version)
        return await servable.infer(inputs, ctx, host=False)

    async def stream(self, inputs: TensorMap, ctx: Context) -> AsyncGenerator[TensorMap, None]:
        servable = self.registry.get(self.target, self.version)
        async for outputs in servable.stream(inputs, ctx):
            yield outputs
