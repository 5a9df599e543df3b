"""The asyncio driver: takes one token (a request's tensors) through a plan.

Decisions come from :class:`~flowserve.runtime.flow.Flow`; this module only starts nodes,
awaits them and records what happened. A lone ready node is awaited inline (no task); several
ready nodes run as tasks, concurrently. When a node fails, its siblings are cancelled and the
caller gets a :class:`NodeError` naming the graph and the node.

Decoupled nodes (zero or more responses per request) run last: once nothing else can run,
the first ready decoupled node is streamed, and each of its responses continues a copy of the
token's state through the rest of the graph, so every response yields one graph response.
Several decoupled nodes in one token therefore multiply their responses.

Tensors stay where they are (see :mod:`flowserve.core.device`): a node that takes DLPack
tensors as they come (``device_tensors = True``) gets what its producers made (a torch tensor,
an OrtValue, on the CPU or a GPU); any other node gets numpy, converted here just before it runs
(a view for host memory, a copy for device memory, its bytes counted as that node's
``bytes_copied``). A request's outputs are numpy for the front ends (``run(host=True)``, the
copies counted on the producing nodes) or left as they are for a graph step (``host=False``).
For numpy tensors all this costs one type check per tensor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Collection
from dataclasses import dataclass

import numpy as np

from flowserve.core.clock import MONOTONIC, Clock
from flowserve.core.datatypes import to_numpy
from flowserve.core.device import DeviceTensor, host_map, ordered_device, to_host
from flowserve.core.errors import (
    FlowserveError,
    InternalError,
    NodeError,
    Unavailable,
    Unsupported,
    code_location,
    code_traceback,
)
from flowserve.core.node import Context, Node, Span, TensorMap
from flowserve.core.ratelog import LimitedLog
from flowserve.graph.plan import Plan, PlanNode
from flowserve.runtime.flow import Flow
from flowserve.runtime.stats import NodeStats

log = logging.getLogger("flowserve.executor")


@dataclass(frozen=True, slots=True)
class OutputCheck:
    name: str
    key: str
    dtype: np.dtype[np.generic] | None
    rank: int
    # (axis, size) of every declared dimension that is not variable (-1)
    fixed: tuple[tuple[int, int], ...] = ()
    # a repository model's output has the shape and dtype it returns: Triton compares neither
    # with the config (a Python model answering [1] for a batched dims [1], or INT64 for a
    # declared INT32, as Triton's own bls_decoupled example does, is served so), and neither
    # does flowserve for such a model: a difference is logged once, not refused
    lenient_shape: bool = False


def output_checks(node: PlanNode) -> tuple[OutputCheck, ...]:
    checks = []
    lenient = node.spec.kind == "backend"  # a repository model (spec/schema.py model_graph)
    for name in node.outputs:
        spec = node.signature.outputs.get(name)
        dtype = to_numpy(spec.datatype) if spec is not None else None
        fixed = tuple((i, d) for i, d in enumerate(spec.dims) if d >= 0) if spec is not None else ()
        rank = len(spec.dims) if spec else -1
        checks.append(OutputCheck(name, f"{node.name}.{name}", dtype, rank, fixed, lenient))
    return tuple(checks)


def _shape_problem(check: OutputCheck, array: np.ndarray) -> str:
    """How ``array``'s shape differs from the declared one ("" when it does not)."""
    if check.rank >= 0 and array.ndim != check.rank:
        return f"output '{check.name}' has shape {list(array.shape)}, declared rank {check.rank}"
    for axis, size in check.fixed:
        if array.shape[axis] != size:
            return f"output '{check.name}' has shape {list(array.shape)}, declared dimension {axis} is {size}"
    return ""


@dataclass(frozen=True, slots=True)
class _SingleNode:
    """A plan of one node fed only by graph inputs, for requests that give every input
    ``keys`` names: the node's inputs and the graph's outputs map straight to names."""

    keys: frozenset[str]
    inputs: tuple[tuple[str, str], ...]  # node input name -> request input name
    outputs: tuple[tuple[str, str], ...]  # graph output name -> node output name


def _single_node(plan: Plan, nodes: list[Node]) -> _SingleNode | None:
    if len(plan.nodes) != 1 or nodes[0].decoupled or nodes[0].partial_outputs:
        return None
    node = plan.nodes[0]
    if any(len(c) != 1 or not c[0].startswith("$") for _, c in node.bindings):
        return None
    if any(len(out.keys) != 1 for out in plan.outputs):
        return None
    keys = frozenset(c[0][1:] for _, c in node.bindings)
    if Flow(plan).start({f"${k}" for k in keys}) != [0]:
        return None
    prefix = f"{node.name}."
    if not all(out.keys[0].startswith(prefix) for out in plan.outputs):
        return None
    return _SingleNode(
        keys,
        tuple((name, c[0][1:]) for name, c in node.bindings),
        tuple((out.name, out.keys[0][len(prefix) :]) for out in plan.outputs),
    )


def _own_stats(node: Node) -> NodeStats | None:
    stats = getattr(node, "node_stats", None)
    return stats if isinstance(stats, NodeStats) else None


class Executor:
    """Runs tokens through one plan with its node objects (aligned with ``plan.nodes``)."""

    def __init__(
        self, plan: Plan, nodes: list[Node], clock: Clock = MONOTONIC, error_traceback: bool = False
    ) -> None:
        """``error_traceback``: a node's error message carries the traceback of the node's own
        code (``--error-traceback``); the log always has it."""
        self.plan = plan
        self.error_traceback = error_traceback
        self.nodes = nodes
        self.clock = clock
        # a node that keeps statistics of its own (a batcher: queue, compute, batch sizes)
        # shares them, so one NodeStats per node holds everything known about it
        self.stats = [_own_stats(n) or NodeStats() for n in nodes]
        self._checks = [output_checks(n) for n in plan.nodes]
        self._warned: set[str] = set()  # outputs whose shape or dtype difference was logged
        # node failures, which any client can cause at will: at most one line a second per graph
        self._failures = LimitedLog(log, lambda: clock.now_ns() / 1e9)
        # a node with partial outputs (a switch) produces some of what it declares, others all
        self._partial = [node.partial_outputs for node in nodes]
        self._decoupled = [node.decoupled for node in nodes]
        self._any_decoupled = any(self._decoupled)
        self._single = _single_node(plan, nodes)
        # which nodes take DLPack tensors as they come; every other node gets numpy (any node
        # may return a DLPack tensor: a batcher hands on what its torch model made)
        self._device = [ordered_device(n) for n in nodes]
        self._host_in = [not d for d in self._device]
        self._copying = False  # see copy_edges
        # graph output key -> the node that produced it (a host copy of it counts there)
        self._producer = {f"{n.name}.{o}": n.index for n in plan.nodes for o in n.outputs}

    @property
    def decoupled(self) -> bool:
        return any(self._decoupled)

    async def run(
        self, inputs: TensorMap, ctx: Context, host: bool = True, keep: Collection[str] = ()
    ) -> TensorMap:
        """The graph's outputs for one request: numpy (``host``, for a front end; but the
        outputs named in ``keep`` as they are, e.g. for CUDA shared memory) or the tensors as
        the nodes made them (for a graph step that passes them on)."""
        single = self._single
        if single is not None and single.keys.issubset(inputs):
            return await self._run_single(single, inputs, ctx, host, keep)
        flow = Flow(self.plan)
        env: dict[str, np.ndarray] = {f"${k}": v for k, v in inputs.items()}
        deferred = await self._drive(flow, env, ctx, flow.start(env))
        if deferred and not flow.done:
            names = ", ".join(self.plan.nodes[i].name for i in deferred)
            raise Unsupported(
                f"graph '{self.plan.name}' has decoupled node(s) {names}: use the streaming API "
                "(gRPC ModelStreamInfer or HTTP generate_stream)"
            )
        return self._finish(flow, env, ctx, host, keep)

    async def _run_single(
        self, single: _SingleNode, inputs: TensorMap, ctx: Context, host: bool, keep: Collection[str]
    ) -> TensorMap:
        """The one node of a one-node plan whose inputs are all given: no dataflow to decide
        (a model or a one-step graph; most requests), so no per-request Flow or tensor keys."""
        given = {name: inputs[key] for name, key in single.inputs}
        if self._host_in[0]:
            given = self._host_inputs(0, given)
        outputs = await self._call_node(0, given, ctx)
        result = {name: outputs[produced] for name, produced in single.outputs if produced in outputs}
        if host:
            for name, value in result.items():
                if type(value) is not np.ndarray and name not in keep:
                    result[name], copied = to_host(value)
                    if copied:
                        self.stats[0].add_copied(copied)
        return result

    def copy_edges(self, on: bool) -> None:
        """For measurements (benchmarks/zero_copy_cpu.py): hand every node an owned host copy
        of each input, as every edge was before tensors stayed where they are (on a GPU, the
        device -> host -> device round trip of each edge); counted as bytes copied."""
        self._copying = on
        self._host_in = [True] * len(self.nodes) if on else [not d for d in self._device]

    def _host_inputs(self, index: int, inputs: TensorMap) -> TensorMap:
        """Numpy inputs for a node that takes numpy: DLPack tensors converted (views for host
        memory, copies for device memory, counted as the node's bytes copied)."""
        if self._copying:
            owned = {name: np.array(to_host(value)[0], copy=True) for name, value in inputs.items()}
            self.stats[index].add_copied(sum(int(a.nbytes) for a in owned.values()))
            return owned
        for value in inputs.values():
            if type(value) is not np.ndarray:
                break
        else:
            return inputs
        converted, copied = host_map(inputs)
        if copied:
            self.stats[index].add_copied(copied)
        return converted

    async def stream(self, inputs: TensorMap, ctx: Context) -> AsyncIterator[TensorMap]:
        """Every response of the graph for one request (one, unless a node is decoupled)."""
        flow = Flow(self.plan)
        env: dict[str, np.ndarray] = {f"${k}": v for k, v in inputs.items()}
        async for outputs in self._stream_from(flow, env, ctx, flow.start(env)):
            yield outputs

    async def _stream_from(
        self, flow: Flow, env: dict[str, np.ndarray], ctx: Context, ready: list[int]
    ) -> AsyncIterator[TensorMap]:
        deferred = await self._drive(flow, env, ctx, ready)
        if not deferred or flow.done:
            yield self._finish(flow, env, ctx, True)
            return
        index, rest = deferred[0], deferred[1:]
        plan_node = self.plan.nodes[index]
        stats = self.stats[index]
        inputs = {name: env[key] for name, key in flow.chosen[index].items() if key}
        if self._host_in[index]:
            inputs = self._host_inputs(index, inputs)
        stats.calls += 1
        start = self.clock.now_ns()
        try:
            responses = self.nodes[index].stream(inputs, ctx)
            if ctx.deadline_ns is not None:
                responses = self._stream_by_deadline(responses, ctx)
            async for produced in responses:
                try:
                    self._check_outputs(index, produced)
                except Exception as exc:
                    raise NodeError(self.plan.name, plan_node.name, exc) from exc
                fork, fork_env = flow.copy(), dict(env)
                for check in self._checks[index]:
                    if check.name in produced:
                        fork_env[check.key] = produced[check.name]
                async for outputs in self._stream_from(
                    fork, fork_env, ctx, rest + fork.finish(index, produced)
                ):
                    yield outputs
        except NodeError:
            stats.errors += 1
            raise
        except Exception as exc:
            raise self._failed(index, exc, ctx) from exc
        finally:
            stats.total.add(self.clock.now_ns() - start)

    async def _drive(
        self, flow: Flow, env: dict[str, np.ndarray], ctx: Context, ready: list[int]
    ) -> list[int]:
        """Run ready nodes until nothing more can run; returns the ready decoupled nodes, unstarted."""
        deferred: list[int] = []
        pending: dict[asyncio.Task[TensorMap], int] = {}
        decoupled = self._decoupled
        # tasks that ended, in order, and a future to wake this loop when one does (lighter
        # than asyncio.wait, which registers and removes a callback on every pending task)
        ended: list[asyncio.Task[TensorMap]] = []
        waiter: asyncio.Future[None] | None = None
        loop = asyncio.get_running_loop()

        def on_done(task: asyncio.Task[TensorMap]) -> None:
            ended.append(task)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

        try:
            while ready or pending:
                if self._any_decoupled:
                    deferred += [i for i in ready if decoupled[i]]
                    ready = [i for i in ready if not decoupled[i]]
                if flow.done:
                    break
                if len(ready) == 1 and not pending:
                    index = ready[0]
                    produced = await self._run_node(index, flow, env, ctx)
                    ready = flow.finish(index, produced)
                    continue
                for index in ready:
                    task = loop.create_task(self._run_node(index, flow, env, ctx))
                    task.add_done_callback(on_done)
                    pending[task] = index
                ready = []
                if not pending:
                    break
                if not ended:
                    waiter = loop.create_future()
                    await waiter
                done, ended[:] = list(ended), []
                for task in done:
                    index = pending.pop(task)
                    ready.extend(flow.finish(index, task.result()))
        finally:
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        return deferred

    def _finish(
        self, flow: Flow, env: dict[str, np.ndarray], ctx: Context, host: bool, keep: Collection[str] = ()
    ) -> TensorMap:
        plan = self.plan
        for name in flow.skipped:
            self.stats[plan.node(name).index].skipped += 1
            if ctx.trace is not None:
                now = self.clock.now_ns()
                ctx.trace.append(Span(plan.name, name, now, now, skipped=True))
        result: TensorMap = {}
        for out in plan.outputs:
            key = flow.output_key(out.keys)
            if key:
                value = env[key]
                if host and type(value) is not np.ndarray and out.name not in keep:
                    value, copied = to_host(value)
                    producer = self._producer.get(key)
                    if producer is not None and copied:
                        self.stats[producer].add_copied(copied)
                result[out.name] = value
        return result

    async def _run_node(self, index: int, flow: Flow, env: dict[str, np.ndarray], ctx: Context) -> TensorMap:
        """Run a node on the tensors its bindings chose; its outputs join the token's ``env``."""
        inputs = {name: env[key] for name, key in flow.chosen[index].items() if key}
        if self._host_in[index]:
            inputs = self._host_inputs(index, inputs)
        outputs = await self._call_node(index, inputs, ctx)
        for check in self._checks[index]:
            if check.name in outputs:
                env[check.key] = outputs[check.name]
        return outputs

    async def _call_node(self, index: int, inputs: TensorMap, ctx: Context) -> TensorMap:
        """Call a node: deadline, statistics, trace span, output check, errors named."""
        plan_node = self.plan.nodes[index]
        stats = self.stats[index]
        clock = self.clock
        start = clock.now_ns()
        if ctx.deadline_ns is not None and start > ctx.deadline_ns:
            raise NodeError(self.plan.name, plan_node.name, Unavailable("request timeout expired"))
        span = Span(self.plan.name, plan_node.name, start) if ctx.trace is not None else None
        stats.calls += 1
        stats.in_flight += 1
        try:
            if ctx.deadline_ns is None:
                outputs = await self.nodes[index](inputs, ctx)
            else:
                outputs = await self._call_by_deadline(self.nodes[index], inputs, ctx, start)
            self._check_outputs(index, outputs)
        except asyncio.CancelledError:
            # cancelled because a sibling failed or the caller went away: not this node's error
            if span is not None and ctx.trace is not None:
                span.end_ns, span.error = clock.now_ns(), "cancelled"
                ctx.trace.append(span)
            raise
        except Exception as exc:
            error = self._failed(index, exc, ctx)
            if span is not None and ctx.trace is not None:
                span.end_ns, span.error = clock.now_ns(), error.detail
                ctx.trace.append(span)
            raise error from exc
        finally:
            stats.in_flight -= 1
        end = clock.now_ns()
        stats.total.add(end - start)
        if span is not None and ctx.trace is not None:
            span.end_ns = end
            ctx.trace.append(span)
        return outputs

    def _failed(self, index: int, exc: Exception, ctx: Context) -> NodeError:
        """The error of node ``index`` that raised ``exc``: counted, logged (rate-limited, with
        the traceback of the node's own code when it raised from there) and named."""
        node = self.plan.nodes[index].name
        stats = self.stats[index]
        stats.errors += 1
        shown = ""
        if self.error_traceback and _from_code(exc):
            shown = code_traceback(exc)
        error = NodeError(self.plan.name, node, exc, shown)
        stats.last_error = error.detail
        self._failures(
            logging.WARNING,
            "node failed: %s%s",
            error.detail,
            _LoggedTraceback(exc),
            extra={"request_id": ctx.request_id, "graph": self.plan.name, "node": node},
        )
        return error

    async def _call_by_deadline(self, node: Node, inputs: TensorMap, ctx: Context, now_ns: int) -> TensorMap:
        """Await the node, but no longer than the request's deadline (its ``timeout``): past it
        the wait is abandoned with UNAVAILABLE. The node's work is cancelled; a call already
        running on an instance's thread cannot be stopped, and that instance stays busy until
        the call returns (see InstancePool.run)."""
        assert ctx.deadline_ns is not None
        timer = asyncio.timeout((ctx.deadline_ns - now_ns) / 1e9)
        try:
            async with timer:
                return await node(inputs, ctx)
        except TimeoutError:
            if not timer.expired():
                raise  # the node's own TimeoutError
            raise _abandoned(ctx, "running") from None

    async def _stream_by_deadline(
        self, responses: AsyncGenerator[TensorMap, None], ctx: Context
    ) -> AsyncGenerator[TensorMap, None]:
        """A decoupled node's responses, but none later than the request's deadline: past it
        the node's next response is waited for no more (UNAVAILABLE) and its stream is closed.
        The wait is per response, not around the ``yield``: while the responses before it
        travel on, the deadline is not this node's to enforce."""
        assert ctx.deadline_ns is not None
        clock = self.clock
        try:
            while True:
                left_ns = ctx.deadline_ns - clock.now_ns()
                if left_ns <= 0:
                    raise _abandoned(ctx, "streaming")
                try:
                    produced = await asyncio.wait_for(anext(responses), left_ns / 1e9)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    if clock.now_ns() < ctx.deadline_ns:
                        raise  # the node's own TimeoutError
                    raise _abandoned(ctx, "streaming") from None
                yield produced
        finally:
            with contextlib.suppress(Exception):
                await responses.aclose()

    def _check_outputs(self, index: int, outputs: TensorMap) -> None:
        """What a node returned matches what it declares; else INTERNAL (the server's fault,
        not the client's), and the caller names the node."""
        if not isinstance(outputs, dict):
            raise InternalError(f"returned {type(outputs).__name__}, expected a dict of tensors")
        for check in self._checks[index]:
            array = outputs.get(check.name)
            if array is None:
                if self._partial[index]:
                    continue
                raise InternalError(
                    f"did not produce output '{check.name}' (produced: {', '.join(outputs) or 'none'})"
                )
            if not isinstance(array, np.ndarray | DeviceTensor):
                raise InternalError(
                    f"output '{check.name}' is a {type(array).__name__}, expected a numpy array"
                )
            if (
                check.dtype is not None
                and array.dtype != check.dtype
                and not (check.dtype.kind == "O" and array.dtype.kind in "OSU")
            ):
                problem = f"output '{check.name}' has dtype {array.dtype}, declared {check.dtype}"
                if not check.lenient_shape:
                    raise InternalError(problem)
                self._warn_once(f"{check.key}:dtype", problem)
            if check.rank < 0 or array.ndim == check.rank:
                shape = array.shape
                for axis, size in check.fixed:
                    if shape[axis] != size:
                        break
                else:
                    continue  # as declared: the common case, checked inline as before
            problem = _shape_problem(check, array)
            if not check.lenient_shape:
                raise InternalError(problem)
            self._warn_once(check.key, problem)

    def _warn_once(self, key: str, problem: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(
                "model '%s': %s (in its config); served as it returned it, as Triton does (logged once)",
                self.plan.name,
                problem,
            )


def _from_code(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by a node's own code (a user's Python), not by flowserve."""
    return not isinstance(exc, FlowserveError) and bool(code_location(exc))


class _LoggedTraceback:
    """The traceback of a node's own code, formatted only when the log line is written (a
    flood of failures costs no formatting for the lines the rate limit leaves out)."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __str__(self) -> str:
        return "\n" + code_traceback(self.exc) if _from_code(self.exc) else ""


def _abandoned(ctx: Context, doing: str) -> Unavailable:
    """The error of a node whose request's deadline passed while it was ``doing`` its work."""
    timeout = ctx.parameters.get("timeout", "?")
    return Unavailable(f"request timeout expired ({timeout} us) while the node was {doing}; abandoned")


__all__ = ["Executor", "NodeError"]
