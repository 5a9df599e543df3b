"""Traffic splitting (canary, A/B) and shadow traffic: a node that calls one of several servables.

::

    roll:
      split:
        arms:
          stable: {model: classifier, version: 1, weight: 90}
          canary: {model: classifier, version: 2, weight: 10}
        by_parameter: arm            # a request parameter naming the arm wins
        sticky: $user                # or sticky_parameter: user: one key, always one arm
        shadow: {graph: classifier_next, fraction: 1.0}
      inputs: {INPUT0: $a, INPUT1: $b}

Which arm a request takes is decided by the pure :func:`choose_arm` (a named arm, else the arm a
sticky key's hash falls into by weight, else a weighted draw from an injected random source),
so it is tested without randomness. The arm's servable is looked up per call, like a model step
(``nodes/step.py``): its own validation, batching and statistics apply, and a reloaded target is
picked up at once. Every arm must have the same inputs and outputs (checked at load by
:func:`split_signature`).

The shadow gets a copy of the request in a task of its own (bounded: ``max_in_flight``; more are
dropped and counted); its answer and its errors never reach the client, and the request never
waits for it. Per-arm and shadow statistics (calls, errors, time) are kept on the node and
exported as metrics with an ``arm`` label (``observability/metrics.py``). Weights change at run
time through :meth:`SplitNode.set_weights` (the repository load API's ``split_weights``
parameter), without a reload.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from flowserve.core.clock import MONOTONIC, Clock
from flowserve.core.errors import FlowserveError, InvalidArgument, SpecError, SpecIssue
from flowserve.core.node import Context, Node, TensorMap
from flowserve.graph.compile import shapes_compatible
from flowserve.graph.plan import Plan, Signature
from flowserve.nodes.step import step_signature
from flowserve.runtime.registry import Registry
from flowserve.runtime.stats import Duration
from flowserve.spec.schema import STICKY_INPUT, NodeSpec, ShadowSpec, SplitArm, SplitTarget, TensorSpec

log = logging.getLogger("flowserve")

# ------------------------------------------------------------------------ the pure decision


def key_position(key: bytes) -> float:
    """Where a sticky key falls in [0, 1): a stable hash (the same on every process and run)."""
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def pick_by_weight(weights: Sequence[float], position: float) -> int:
    """The arm whose share of [0, 1) (in order, sized by weight) holds ``position``. Arms of
    weight 0 are never picked; changing one weight moves only the keys near the boundaries."""
    total = sum(weights)
    if total <= 0:
        raise InvalidArgument("every arm has weight 0")
    point = position * total
    cumulative = 0.0
    last = 0
    for index, weight in enumerate(weights):
        if weight <= 0:
            continue
        cumulative += weight
        last = index
        if point < cumulative:
            return index
    return last  # position rounding up to 1.0


def choose_arm(
    names: Sequence[str],
    weights: Sequence[float],
    *,
    named: str | None = None,
    key: bytes | None = None,
    draw: Callable[[], float] = random.random,
) -> int:
    """Which arm a request takes: the arm ``named`` (a request parameter) when given; else, with
    a sticky ``key``, the arm its hash falls into by weight (the same key always gets the same
    arm while the weights stay); else a weighted draw (``draw()`` in [0, 1), injected)."""
    if named is not None:
        try:
            return list(names).index(named)
        except ValueError:
            raise InvalidArgument(f"no arm named '{named}' (arms: {', '.join(names)})") from None
    position = key_position(key) if key is not None else draw()
    return pick_by_weight(weights, position)


def tensor_key(array: np.ndarray) -> bytes:
    """The bytes of a sticky key tensor (BYTES elements joined, numbers as their raw bytes)."""
    if array.dtype.kind == "O":
        return b"\x00".join(x if isinstance(x, bytes) else str(x).encode() for x in array.flat)
    return np.ascontiguousarray(array).tobytes()


def parameter_key(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


# ------------------------------------------------------------------------ validation at load


def split_signature(node: NodeSpec, plans: Mapping[str, Plan]) -> Signature:
    """The split's signature: its arms' (which must all agree), plus the sticky key input.
    Raises SpecError naming each arm that is unknown or differs from the first."""
    split = node.split
    assert split is not None
    issues: list[SpecIssue] = []
    signatures: dict[str, Signature] = {}
    for arm in split.arms:
        plan = plans.get(arm.target.target)
        if plan is None:
            issues.append(_issue(node, f"{arm.target} is unknown or failed to load", f"arms.{arm.name}"))
        else:
            signatures[arm.name] = step_signature(plan)
    if issues:
        raise SpecError(issues)
    first_name, first = next(iter(signatures.items()))
    for name, sig in list(signatures.items())[1:]:
        for problem in _differences(first, sig, first_name):
            issues.append(_issue(node, problem, f"arms.{name}"))
    if split.shadow is not None:
        issues += _check_shadow(node, split.shadow, first, plans)
    if issues:
        raise SpecError(issues)
    inputs: dict[str, TensorSpec | None] = dict(first.inputs or {})
    if split.sticky is not None:
        inputs[STICKY_INPUT] = None
    optional = frozenset.intersection(*(s.optional for s in signatures.values()))
    return Signature(inputs=inputs, outputs=dict(first.outputs), optional=optional)


def _issue(node: NodeSpec, message: str, field: str) -> SpecIssue:
    return SpecIssue("", message, node.name, f"split.{field}")


def _differences(want: Signature, have: Signature, first: str) -> list[str]:
    out: list[str] = []
    for what, a, b in (
        ("inputs", want.inputs or {}, have.inputs or {}),
        ("outputs", want.outputs, have.outputs),
    ):
        if set(a) != set(b):
            out.append(f"{what} {sorted(b)} differ from arm '{first}''s {sorted(a)}")
            continue
        for name, spec in a.items():
            problem = _tensor_mismatch(spec, b[name])
            if problem:
                out.append(f"{what[:-1]} '{name}' {problem} (arm '{first}')")
    return out


def _tensor_mismatch(want: TensorSpec | None, have: TensorSpec | None) -> str:
    if want is None or have is None:
        return ""
    if want.datatype != have.datatype:
        return f"is {have.datatype}, not {want.datatype} as in"
    if not shapes_compatible(want.dims, have.dims):
        return f"has shape {list(have.dims)}, not {list(want.dims)} as in"
    return ""


def _check_shadow(
    node: NodeSpec, shadow: ShadowSpec, arms: Signature, plans: Mapping[str, Plan]
) -> list[SpecIssue]:
    plan = plans.get(shadow.target.target)
    if plan is None:
        return [_issue(node, f"{shadow.target} is unknown or failed to load", "shadow")]
    sig = step_signature(plan)
    issues = []
    given = arms.inputs or {}
    wanted = sig.inputs or {}
    for name in sorted(set(wanted) - set(given) - sig.optional):
        issues.append(_issue(node, f"the shadow needs input '{name}', which the arms do not take", "shadow"))
    for name in sorted(set(given) & set(wanted)):
        problem = _tensor_mismatch(given[name], wanted[name])
        if problem:
            issues.append(_issue(node, f"shadow input '{name}' {problem} the arms", "shadow"))
    return issues


# ------------------------------------------------------------------------ statistics


@dataclass(slots=True)
class ArmStats:
    """What one arm (or the shadow) did: requests sent, failed, and their time."""

    calls: int = 0
    errors: int = 0
    duration: Duration = field(default_factory=Duration)
    # shadow only: copies not sent because max_in_flight were running
    dropped: int = 0
    last_error: str = ""

    def record(self, ns: int, error: BaseException | None) -> None:
        self.calls += 1
        self.duration.add(ns)
        if error is not None:
            self.errors += 1
            self.last_error = str(error)


# ------------------------------------------------------------------------ the node


class Shadow:
    """Mirrors requests to one target in background tasks it owns; never raises to the caller."""

    def __init__(self, spec: ShadowSpec, registry: Registry, clock: Clock, draw: Callable[[], float]) -> None:
        self.spec = spec
        self.registry = registry
        self.clock = clock
        self.draw = draw
        self.stats = ArmStats()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def send(self, inputs: TensorMap, ctx: Context) -> None:
        spec = self.spec
        if spec.fraction < 1.0 and self.draw() >= spec.fraction:
            return
        if len(self._tasks) >= spec.max_in_flight:
            self.stats.dropped += 1
            return
        # arrays the primary could change in place are copied; read-only request buffers are shared
        copy = {k: (v.copy() if v.flags.writeable else v) for k, v in inputs.items()}
        shadow_ctx = Context(
            request_id=ctx.request_id,
            parameters=ctx.parameters,
            deadline_ns=ctx.deadline_ns,
            priority=ctx.priority,
        )
        task = asyncio.get_running_loop().create_task(self._run(copy, shadow_ctx))
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        """A copy ended: forget it; what escaped ``_run`` (a bug, never a target's error) is logged."""
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("shadow task to %s failed", self.spec.target, exc_info=exc)

    async def _run(self, inputs: TensorMap, ctx: Context) -> None:
        target = self.spec.target
        start = self.clock.now_ns()
        error: BaseException | None = None
        try:
            servable = self.registry.get(target.target, target.version)
            if servable.decoupled:
                async for _ in servable.stream(inputs, ctx):
                    pass
            else:
                await servable.infer(inputs, ctx)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a shadow's failure is counted, never propagated
            error = exc
            log.debug("shadow request to %s failed: %s", target, exc)
        self.stats.record(self.clock.now_ns() - start, error)

    async def drain(self) -> None:
        """Wait for the copies running now (tests, shutdown)."""
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class SplitNode(Node):
    """Sends each request to one arm (see :func:`choose_arm`), and a copy to the shadow."""

    def __init__(
        self,
        spec: NodeSpec,
        registry: Registry,
        clock: Clock = MONOTONIC,
        rng: random.Random | None = None,
    ) -> None:
        if spec.split is None:
            raise InvalidArgument(f"node '{spec.name}' has no split settings")
        split = spec.split
        self.name = spec.name
        self.registry = registry
        self.clock = clock
        self.arms: tuple[SplitArm, ...] = split.arms
        self.names = tuple(a.name for a in split.arms)
        self.weights: tuple[float, ...] = tuple(a.weight for a in split.arms)
        self.by_parameter = split.by_parameter
        self.sticky_tensor = split.sticky is not None
        self.sticky_parameter = split.sticky_parameter
        self.rng = rng or random.Random()
        self.arm_stats = [ArmStats() for _ in split.arms]
        self.shadow = Shadow(split.shadow, registry, clock, self.rng.random) if split.shadow else None
        for arm in split.arms:
            _check_version(registry, arm.target, f"arm '{arm.name}'")
        if split.shadow is not None:
            _check_version(registry, split.shadow.target, "the shadow")
        decoupled = {self._decoupled(a.target) for a in split.arms}
        if len(decoupled) > 1:
            raise InvalidArgument("the arms must all be decoupled or all not (their responses differ)")
        self.decoupled = decoupled.pop()

    def _decoupled(self, target: SplitTarget) -> bool:
        registry = self.registry
        return registry.has(target.target) and registry.get(target.target, target.version).decoupled

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Change some arms' weights (others keep theirs); takes effect for the next request."""
        self.weights = self.checked_weights(weights)

    def checked_weights(self, weights: Mapping[str, float]) -> tuple[float, ...]:
        """The weights after applying ``weights`` (validated; nothing is changed)."""
        unknown = sorted(set(weights) - set(self.names))
        if unknown:
            raise InvalidArgument(f"node '{self.name}' has no arm {unknown} (arms: {', '.join(self.names)})")
        new = []
        for name, old in zip(self.names, self.weights, strict=True):
            value = weights.get(name, old)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise InvalidArgument(f"node '{self.name}': the weight of arm '{name}' must be a number >= 0")
            new.append(float(value))
        if sum(new) <= 0:
            raise InvalidArgument(f"node '{self.name}': the weights must not all be 0")
        return tuple(new)

    def choose(self, inputs: TensorMap, ctx: Context) -> int:
        params = ctx.parameters
        named = None
        if self.by_parameter and params:
            value = params.get(self.by_parameter)
            named = None if value is None else str(value)
        key = None
        if self.sticky_tensor:
            key = tensor_key(inputs[STICKY_INPUT])
        elif self.sticky_parameter and params:
            value = params.get(self.sticky_parameter)
            key = None if value is None else parameter_key(value)
        try:
            return choose_arm(self.names, self.weights, named=named, key=key, draw=self.rng.random)
        except InvalidArgument as exc:
            raise InvalidArgument(f"request parameter '{self.by_parameter}': {exc.message}") from None

    def _route(self, inputs: TensorMap, ctx: Context) -> tuple[int, TensorMap]:
        index = self.choose(inputs, ctx)
        if self.sticky_tensor:
            inputs = {k: v for k, v in inputs.items() if k != STICKY_INPUT}
        if self.shadow is not None:
            self.shadow.send(inputs, ctx)
        return index, inputs

    async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
        index, inputs = self._route(inputs, ctx)
        target = self.arms[index].target
        start = self.clock.now_ns()
        error: BaseException | None = None
        try:
            servable = self.registry.get(target.target, target.version)
            return await servable.infer(inputs, ctx)
        except BaseException as exc:
            error = exc
            raise
        finally:
            self.arm_stats[index].record(self.clock.now_ns() - start, error)

    async def stream(self, inputs: TensorMap, ctx: Context) -> AsyncGenerator[TensorMap, None]:
        index, inputs = self._route(inputs, ctx)
        target = self.arms[index].target
        start = self.clock.now_ns()
        error: BaseException | None = None
        try:
            servable = self.registry.get(target.target, target.version)
            async for outputs in servable.stream(inputs, ctx):
                yield outputs
        except BaseException as exc:
            error = exc
            raise
        finally:
            self.arm_stats[index].record(self.clock.now_ns() - start, error)

    async def stop(self) -> None:
        if self.shadow is not None:
            await self.shadow.stop()


def parse_split_weights(name: str, value: object) -> dict[str, dict[str, float]]:
    """The repository load API's ``split_weights`` parameter: a JSON object (or its text),
    ``{"node": {"arm": weight}}``, or ``{"arm": weight}`` for a graph with one split node
    (returned under the node name "")."""
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise InvalidArgument(f"load of '{name}': 'split_weights' is not valid JSON: {exc}") from None
    if not isinstance(value, dict) or not value:
        raise InvalidArgument(f"load of '{name}': 'split_weights' must be a non-empty JSON object")
    if all(isinstance(v, dict) for v in value.values()):
        return {str(k): {str(a): w for a, w in v.items()} for k, v in value.items()}
    return {"": {str(a): w for a, w in value.items()}}


def set_split_weights(registry: Registry, name: str, weights: Mapping[str, Mapping[str, float]]) -> None:
    """Change the arm weights of the split nodes of every loaded version of graph ``name`` at
    once, without a reload (all are validated before any changes). Node "" means the graph's
    only split node. A later (re)load of the graph reads the weights from its file again."""
    servables = [s for s in registry.servables() if s.name == name]
    if not servables:
        registry.get(name)  # raises NotFound or Unavailable with the reason
    nodes = [n for s in servables for n in s.executor.nodes if isinstance(n, SplitNode)]
    if not nodes:
        raise InvalidArgument(f"'{name}' has no split node whose weights could change")
    names = sorted({n.name for n in nodes})
    if "" in weights:
        if len(names) != 1:
            raise InvalidArgument(f"'{name}' has several split nodes ({', '.join(names)}): name the node")
        weights = {names[0]: weights[""]}
    unknown = sorted(set(weights) - set(names))
    if unknown:
        raise InvalidArgument(f"'{name}' has no split node {unknown} (split nodes: {', '.join(names)})")
    planned = [(n, n.checked_weights(weights[n.name])) for n in nodes if n.name in weights]
    for node, new in planned:
        node.weights = new
        log.info(
            "split '%s' node '%s': weights now %s", name, node.name, dict(zip(node.names, new, strict=True))
        )


def _check_version(registry: Registry, target: SplitTarget, what: str) -> None:
    """A named version must be loaded when the split loads (the target itself is checked by
    the compiler)."""
    if target.kind != "model" or not target.version or not registry.has(target.target):
        return
    try:
        registry.get(target.target, target.version)
    except FlowserveError as exc:
        raise InvalidArgument(f"{what}: {exc.message}") from None


__all__ = [
    "ArmStats",
    "Shadow",
    "SplitNode",
    "choose_arm",
    "key_position",
    "parameter_key",
    "parse_split_weights",
    "pick_by_weight",
    "set_split_weights",
    "split_signature",
    "tensor_key",
]
