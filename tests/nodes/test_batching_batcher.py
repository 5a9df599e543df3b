"""The Batcher node around fake inner nodes, driven by a FakeClock.

Nothing sleeps: tests move the fake clock and call ``batcher.wake()``; ``settle`` only yields
to the event loop until a condition holds. Concurrency is proven with barriers and events."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

from flowserve.core.clock import FakeClock
from flowserve.core.errors import ErrorCode, FlowserveError, InternalError, InvalidArgument, Unavailable
from flowserve.core.node import Context, Node, TensorMap
from flowserve.nodes.backends.base import BackendNode
from flowserve.nodes.batching import Batcher
from flowserve.runtime.stats import ModelStats
from flowserve.spec.schema import BatchingSpec, InstanceSpec, ModelSpec, QueuePolicy, TensorSpec

US = 1000
LONG_US = 10_000_000  # a delay/timeout the real event loop never reaches during a test


async def settle(done: Callable[[], bool] = lambda: False, turns: int = 200) -> None:
    """Yield to the event loop until ``done()`` holds (or ``turns`` times): never sleeps."""
    for _ in range(turns):
        if done():
            return
        await asyncio.sleep(0)


def rows(n: int, start: float = 0.0, width: int = 2) -> np.ndarray:
    return (np.arange(n * width, dtype=np.float32) + start).reshape(n, width)


class Doubler(Node):
    """y = 2x; records every (merged) batch; waits on ``gate`` when one is set."""

    def __init__(self, name: str = "net") -> None:
        self.name = name
        self.batches: list[TensorMap] = []
        self.gate: asyncio.Event | None = None
        self.started = self.stopped = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
        self.batches.append(inputs)
        if self.gate is not None:
            await self.gate.wait()
        return {"y": inputs["x"] * 2}

    def sizes(self) -> list[int]:
        return [int(b["x"].shape[0]) for b in self.batches]

    def firsts(self) -> list[float]:
        return [float(b["x"].reshape(-1)[0]) for b in self.batches]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000)


@pytest.fixture
def inner() -> Doubler:
    return Doubler()


Factory = Callable[..., Batcher]


@pytest.fixture
async def make(clock: FakeClock, inner: Doubler) -> AsyncIterator[Factory]:
    made: list[Batcher] = []

    def factory(spec: BatchingSpec, node: Node | None = None, **kwargs: Any) -> Batcher:
        batcher = Batcher(node or inner, spec, clock=clock, **kwargs)
        made.append(batcher)
        return batcher

    yield factory
    for batcher in made:
        await batcher.stop()


def call(batcher: Batcher, x: np.ndarray, **params: Any) -> asyncio.Task[TensorMap]:
    priority = params.pop("priority", 0)
    return asyncio.ensure_future(batcher({"x": x}, Context(parameters=params, priority=priority)))


async def blocked(batcher: Batcher, inner: Doubler) -> asyncio.Task[TensorMap]:
    """Occupy the (single) instance with a request that waits on ``inner.gate``."""
    inner.gate = asyncio.Event()
    first = call(batcher, rows(1, -100))
    await settle(lambda: len(inner.batches) == 1)
    assert batcher.free_instances == 0
    return first


# ------------------------------------------------------------------------- merging


async def test_concurrent_rows_merge_up_to_max_batch_size(
    make: Factory, inner: Doubler, clock: FakeClock
) -> None:
    batcher = make(BatchingSpec(8, max_queue_delay_us=LONG_US))
    await batcher.start()
    assert inner.started
    inputs = [rows(1, 0), rows(2, 10), rows(3, 20), rows(2, 30), rows(1, 40)]
    tasks = [call(batcher, x) for x in inputs]
    await settle(lambda: len(inner.batches) == 1 and tasks[0].done())
    assert inner.sizes() == [8]  # 1+2+3+2 rows; the fifth request would make 9
    for task, x in zip(tasks[:4], inputs[:4], strict=True):
        np.testing.assert_array_equal(task.result()["y"], x * 2)
    assert not tasks[4].done()  # one row waits for company until the delay passes
    clock.advance(LONG_US * US)
    batcher.wake()
    np.testing.assert_array_equal((await tasks[4])["y"], inputs[4] * 2)
    assert inner.sizes() == [8, 1]


async def test_a_preferred_size_goes_without_waiting(make: Factory, inner: Doubler) -> None:
    batcher = make(BatchingSpec(8, (4,), max_queue_delay_us=LONG_US))
    await batcher.start()
    tasks = [call(batcher, rows(1, i)) for i in range(5)]
    await settle(lambda: all(t.done() for t in tasks[:4]))
    assert inner.sizes() == [4]
    assert batcher.queued == 1


async def test_the_queue_delay_holds_a_small_batch_back(
    make: Factory, inner: Doubler, clock: FakeClock
) -> None:
    batcher = make(BatchingSpec(8, max_queue_delay_us=100))
    await batcher.start()
    first = call(batcher, rows(1, 0))
    await settle()
    clock.advance(60 * US)
    second = call(batcher, rows(2, 5))
    await settle()
    assert inner.batches == []  # the oldest has waited 60 of 100 us
    clock.advance(40 * US)
    batcher.wake()
    await asyncio.gather(first, second)
    assert inner.sizes() == [3]


async def test_zero_delay_sends_at_once(make: Factory, inner: Doubler) -> None:
    batcher = make(BatchingSpec(8, (4,)))
    await batcher.start()
    result = await call(batcher, rows(1))
    np.testing.assert_array_equal(result["y"], rows(1) * 2)


async def test_unequal_shapes_or_dtypes_never_share_a_batch(make: Factory, inner: Doubler) -> None:
    batcher = make(BatchingSpec(8))
    await batcher.start()
    first = await blocked(batcher, inner)
    shapes: list[np.ndarray] = [
        np.zeros((1, 3), np.float32),
        np.zeros((1, 4), np.float32),
        np.zeros((1, 4), np.float64),
    ]
    tasks = [call(batcher, x) for x in shapes]
    await settle(lambda: batcher.queued == 3)
    assert inner.gate is not None
    inner.gate.set()
    await asyncio.gather(first, *tasks)
    assert [b["x"].shape[1:] for b in inner.batches[1:]] == [(3,), (4,), (4,)]
    assert [b["x"].dtype for b in inner.batches[1:]] == [np.float32, np.float32, np.float64]


async def test_ragged_inputs_share_a_batch(make: Factory) -> None:
    class Lengths(Node):
        name = "ragged"
        seen: list[TensorMap] = []

        async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
            self.seen.append(inputs)
            return {"n": inputs["n"] + 0}

    node = Lengths()
    batcher = make(BatchingSpec(8), node, ragged=frozenset({"x"}))
    await batcher.start()
    ctx = Context()
    a = asyncio.ensure_future(batcher({"x": np.ones((1, 3)), "n": np.array([[3]])}, ctx))
    b = asyncio.ensure_future(batcher({"x": np.ones((1, 5)), "n": np.array([[5]])}, ctx))
    assert [r["n"].tolist() for r in await asyncio.gather(a, b)] == [[[3]], [[5]]]
    assert len(node.seen) == 1
    assert node.seen[0]["x"].shape == (8,)  # flat concatenation, as Triton hands ragged inputs


# ------------------------------------------------------------------------- priorities, queue policies


async def test_priorities_reorder_the_queue(make: Factory, inner: Doubler) -> None:
    batcher = make(BatchingSpec(1, priority_levels=2, default_priority_level=2))
    await batcher.start()
    first = await blocked(batcher, inner)
    tasks = [
        call(batcher, rows(1, 1), priority=2),
        call(batcher, rows(1, 2), priority=1),
        call(batcher, rows(1, 3)),  # default level 2
        call(batcher, rows(1, 4), priority=1),
    ]
    await settle(lambda: batcher.queued == 4)
    assert inner.gate is not None
    inner.gate.set()
    await asyncio.gather(first, *tasks)
    assert inner.firsts()[1:] == [2, 4, 1, 3]


async def test_a_full_queue_answers_unavailable_at_once(make: Factory, inner: Doubler) -> None:
    batcher = make(BatchingSpec(1, default_queue_policy=QueuePolicy(max_queue_size=2)))
    await batcher.start()
    first = await blocked(batcher, inner)
    queued = [call(batcher, rows(1, 1)), call(batcher, rows(1, 2))]
    await settle(lambda: batcher.queued == 2)
    with pytest.raises(Unavailable, match="exceeds maximum queue size") as info:
        await batcher({"x": rows(1, 3)}, Context())
    assert info.value.code is ErrorCode.UNAVAILABLE
    assert inner.gate is not None
    inner.gate.set()
    await asyncio.gather(first, *queued)


async def test_reject_fails_a_request_whose_queue_timeout_expired(
    make: Factory, inner: Doubler, clock: FakeClock
) -> None:
    spec = BatchingSpec(1, default_queue_policy=QueuePolicy("REJECT", default_timeout_us=1_000))
    batcher = make(spec)
    await batcher.start()
    first = await blocked(batcher, inner)
    doomed = call(batcher, rows(1, 1))
    await settle()
    clock.advance(1_000 * US + 1)
    fresh = call(batcher, rows(1, 2))
    await settle(doomed.done)
    with pytest.raises(Unavailable, match="Request timeout expired"):
        doomed.result()
    assert inner.gate is not None
    inner.gate.set()
    await asyncio.gather(first, fresh)
    assert inner.firsts() == [-100, 2]


async def test_the_timeout_parameter_can_lower_the_queue_timeout(
    make: Factory, inner: Doubler, clock: FakeClock
) -> None:
    policy = QueuePolicy("REJECT", default_timeout_us=1_000, allow_timeout_override=True)
    batcher = make(BatchingSpec(1, default_queue_policy=policy))
    await batcher.start()
    first = await blocked(batcher, inner)
    short = call(batcher, rows(1, 1), timeout=100)
    long = call(batcher, rows(1, 2), timeout=5_000)  # cannot raise the default
    await settle()
    clock.advance(101 * US)
    batcher.wake()
    await settle(short.done)
    assert isinstance(short.exception(), Unavailable)
    assert not long.done()
    clock.advance(900 * US)
    batcher.wake()
    await settle(long.done)
    assert isinstance(long.exception(), Unavailable)
    assert inner.gate is not None
    inner.gate.set()
    await first


async def test_delay_serves_an_expired_request_after_the_unexpired(
    make: Factory, inner: Doubler, clock: FakeClock
) -> None:
    spec = BatchingSpec(1, default_queue_policy=QueuePolicy("DELAY", default_timeout_us=1_000))
    batcher = make(spec)
    await batcher.start()
    first = await blocked(batcher, inner)
    late = call(batcher, rows(1, 1))
    await settle()
    clock.advance(2_000 * US)
    fresh = call(batcher, rows(1, 2))
    await settle(lambda: batcher.queued == 2)
    assert inner.gate is not None
    inner.gate.set()
    await asyncio.gather(first, late, fresh)
    assert inner.firsts() == [-100, 2, 1]


# ------------------------------------------------------------------------- instances, ordering


async def test_n_instances_run_n_batches_at_once(make: Factory) -> None:
    class Meet(Node):
        """Every batch waits until three are inside at once (fails rather than hangs)."""

        name = "meet"

        def __init__(self) -> None:
            self.barrier = asyncio.Barrier(3)

        async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
            async with asyncio.timeout(10):
                await self.barrier.wait()
            return {"y": inputs["x"]}

    batcher = make(BatchingSpec(2), Meet(), capacity=3)
    await batcher.start()
    results = await asyncio.gather(*(call(batcher, rows(2, i)) for i in range(3)))
    assert [r["y"].shape for r in results] == [(2, 2)] * 3


def backend_model(count: int, max_batch: int = 2) -> ModelSpec:
    tensor = TensorSpec("x", "FP32", (-1,))
    return ModelSpec(
        name="threads",
        source="test",
        backend="test",
        platform="",
        max_batch_size=max_batch,
        inputs=(tensor,),
        outputs=(TensorSpec("y", "FP32", (-1,)),),
        versions={1: "/nonexistent"},
        instances=(InstanceSpec(count, "KIND_CPU"),),
    )


class ThreadBackend(BackendNode):
    """Each execution waits on a thread barrier: only concurrent instances get through."""

    barrier: threading.Barrier

    def load_instance(self, index: int) -> int:
        return index

    def execute(self, instance: Any, inputs: TensorMap) -> TensorMap:
        self.barrier.wait()
        return {"y": inputs["x"] + instance * 0}


async def test_backend_instances_execute_batches_concurrently_on_their_threads(
    make: Factory, clock: FakeClock
) -> None:
    stats = ModelStats()
    backend = ThreadBackend(backend_model(3), 1, stats, clock)
    backend.barrier = threading.Barrier(3, timeout=10)
    batcher = make(BatchingSpec(2), backend, stats=stats)
    await batcher.start()
    inputs = [rows(2, 10 * i) for i in range(3)]
    results = await asyncio.gather(*(batcher({"x": x}, Context()) for x in inputs))
    for result, x in zip(results, inputs, strict=True):
        np.testing.assert_array_equal(result["y"], x)
    assert (stats.execution_count, stats.inference_count) == (3, 6)


async def test_preserve_ordering_holds_later_batches_back(make: Factory) -> None:
    class SlowFirst(Node):
        name = "ordered"

        def __init__(self) -> None:
            self.release = asyncio.Event()
            self.finished: list[float] = []

        async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
            first = float(inputs["x"][0, 0])
            if first == 0:
                await self.release.wait()
            self.finished.append(first)
            return {"y": inputs["x"]}

    for preserve in (False, True):
        node = SlowFirst()
        batcher = make(BatchingSpec(1, preserve_ordering=preserve), node, capacity=2)
        await batcher.start()
        a, b = call(batcher, rows(1, 0)), call(batcher, rows(1, 1))
        await settle(lambda node=node: node.finished == [1.0])  # type: ignore[misc]
        await settle(turns=20)
        assert b.done() is not preserve
        node.release.set()
        await asyncio.gather(a, b)
        await batcher.stop()


# ------------------------------------------------------------------------- errors, lifespan, stats


async def test_a_split_that_does_not_add_up_fails_every_caller_naming_the_node(make: Factory) -> None:
    class Short(Node):
        name = "short"

        async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
            return {"y": inputs["x"][:-1]}

    batcher = make(BatchingSpec(8, (4,), max_queue_delay_us=LONG_US), Short())
    await batcher.start()
    results = await asyncio.gather(*(call(batcher, rows(2)) for _ in range(2)), return_exceptions=True)
    for result in results:
        assert isinstance(result, InternalError)
        assert "node 'short': output 'y' has 3 rows but the batch merged 4 rows" in str(result)


async def test_an_inner_failure_reaches_every_caller_of_the_batch(make: Factory) -> None:
    class Broken(Node):
        name = "broken"

        async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
            raise FlowserveError("boom")

    batcher = make(BatchingSpec(8, (2,), max_queue_delay_us=LONG_US), Broken())
    await batcher.start()
    results = await asyncio.gather(call(batcher, rows(1)), call(batcher, rows(1)), return_exceptions=True)
    assert [str(r) for r in results] == ["boom", "boom"]
    with pytest.raises(FlowserveError, match="boom"):  # and the batcher keeps serving
        await call(batcher, rows(2))


async def test_calls_before_start_fail_unavailable(make: Factory) -> None:
    batcher = make(BatchingSpec(4))
    with pytest.raises(Unavailable, match="not running"):
        await batcher({"x": rows(1)}, Context())


async def test_stop_fails_queued_requests_and_stops_the_inner_node(make: Factory, inner: Doubler) -> None:
    batcher = make(BatchingSpec(1))
    await batcher.start()
    first = await blocked(batcher, inner)
    queued = call(batcher, rows(1, 1))
    await settle(lambda: batcher.queued == 1)
    await batcher.stop()
    assert inner.stopped
    await settle(lambda: first.done() and queued.done())
    assert isinstance(queued.exception(), Unavailable)
    assert isinstance(first.exception(), Unavailable)  # its batch was cancelled with the task
    with pytest.raises(Unavailable):
        await batcher({"x": rows(1)}, Context())


async def test_a_cancelled_caller_leaves_the_queue(make: Factory, inner: Doubler) -> None:
    batcher = make(BatchingSpec(1))
    await batcher.start()
    first = await blocked(batcher, inner)
    gone, kept = call(batcher, rows(1, 1)), call(batcher, rows(1, 2))
    await settle(lambda: batcher.queued == 2)
    gone.cancel()
    await settle(gone.done)
    assert batcher.queued == 1
    assert inner.gate is not None
    inner.gate.set()
    await asyncio.gather(first, kept)
    assert inner.firsts() == [-100, 2]


async def test_every_execution_is_counted_by_rows_batches_and_requests(
    make: Factory, inner: Doubler, clock: FakeClock
) -> None:
    stats = ModelStats()
    batcher = make(BatchingSpec(8, (4,)), stats=stats)
    await batcher.start()
    first = await blocked(batcher, inner)  # 1 row, runs from t0
    tasks = [call(batcher, rows(1)), call(batcher, rows(3))]  # 4 rows: a preferred batch
    await settle(lambda: batcher.queued == 2)
    clock.advance(7 * US)  # the blocker computes for 7 us while the others queue
    assert inner.gate is not None
    inner.gate.set()
    await asyncio.gather(first, *tasks)
    for counted in (stats, batcher.node_stats):
        assert counted.execution_count == 2
        assert counted.inference_count == 5
        assert counted.queue.count == 3
        assert counted.queue.ns == 2 * 7 * US
        assert counted.compute_infer.count == 3  # per request, as Triton counts it
        assert counted.compute_infer.ns == 7 * US
        assert sorted(counted.batches) == [1, 4]
        assert counted.batches[4].compute_infer.count == 1  # per execution


def test_a_decoupled_node_cannot_batch() -> None:
    class Streaming(Node):
        name = "streaming"
        decoupled = True

    with pytest.raises(InvalidArgument, match="node 'streaming' is decoupled"):
        Batcher(Streaming(), BatchingSpec(4))


class SumBackend(BackendNode):
    """Records what ``execute`` gets; answers one row per input row (or one too few)."""

    short = False

    def load_instance(self, index: int) -> int:
        return index

    def execute(self, instance: Any, inputs: TensorMap) -> TensorMap:
        self.seen = inputs
        n = inputs["n"]
        return {"y": n[:-1] if self.short else n * 10}


def test_the_default_execute_batch_merges_and_splits_exactly(clock: FakeClock) -> None:
    ragged_x = TensorSpec("x", "FP32", (-1,), allow_ragged_batch=True)
    n = TensorSpec("n", "INT32", (1,))
    model = dataclasses.replace(backend_model(1, max_batch=8), inputs=(ragged_x, n))
    backend = SumBackend(model, 1, ModelStats(), clock)
    batch = [
        {"x": np.ones((1, 3), np.float32), "n": np.array([[3]], np.int32)},
        {"x": np.ones((2, 2), np.float32), "n": np.array([[2], [2]], np.int32)},
    ]
    results = backend.execute_batch(0, batch)
    assert backend.seen["x"].shape == (7,)  # ragged: the flat concatenation
    assert [r["y"].tolist() for r in results] == [[[30]], [[20], [20]]]
    backend.short = True
    with pytest.raises(InternalError, match="node 'threads': output 'y' has 2 rows but the batch merged 3"):
        backend.execute_batch(0, batch)


class LoopBackend(BackendNode):
    """Records the task each execution ran in."""

    tasks: list[asyncio.Task[Any] | None]

    def load_instance(self, index: int) -> int:
        return index

    def execute(self, instance: Any, inputs: TensorMap) -> TensorMap:
        try:
            self.tasks.append(asyncio.current_task())
        except RuntimeError:  # on the instance's thread: no loop there
            self.tasks.append(None)
        return {"y": inputs["x"] * 2}


async def test_a_lone_inline_instance_runs_batches_in_the_batching_task(
    make: Factory, clock: FakeClock
) -> None:
    stats = ModelStats()
    backend = LoopBackend(backend_model(1), 1, stats, clock)
    backend.tasks = []
    backend.pool.policy.threshold_ns = 10**9  # every call is cheap: inline after probing
    # a queue delay (never reached: preferred size 1 sends each at once), so none runs "at once"
    batcher = make(BatchingSpec(4, (1,), max_queue_delay_us=LONG_US), backend, stats=stats)
    await batcher.start()
    for i in range(12):
        result = await batcher({"x": rows(1, i)}, Context())
        np.testing.assert_array_equal(result["y"], rows(1, i) * 2)
    inline = backend.tasks[backend.pool.policy.probe :]
    assert inline and all(t is batcher._task for t in inline)  # no task per batch
    assert all(t is None for t in backend.tasks[: backend.pool.policy.probe])  # probes: thread
    assert stats.execution_count == 12


async def probed(
    make: Factory, clock: FakeClock, spec: BatchingSpec
) -> tuple[Batcher, LoopBackend, ModelStats]:
    """A started batcher over an inline LoopBackend whose probe calls are done."""
    stats = ModelStats()
    backend = LoopBackend(backend_model(1), 1, stats, clock)
    backend.tasks = []
    backend.pool.policy.threshold_ns = 10**9
    batcher = make(spec, backend, stats=stats)
    await batcher.start()
    for i in range(backend.pool.policy.probe):
        await batcher({"x": rows(1, i)}, Context())
    backend.tasks.clear()
    return batcher, backend, stats


async def test_with_no_queue_delay_a_lone_request_runs_at_once_in_its_callers_task(
    make: Factory, clock: FakeClock
) -> None:
    batcher, backend, stats = await probed(make, clock, BatchingSpec(4))
    before = (stats.execution_count, stats.queue.count)
    result = await batcher({"x": rows(2, 5)}, Context())
    np.testing.assert_array_equal(result["y"], rows(2, 5) * 2)
    assert backend.tasks == [asyncio.current_task()]  # not the batching task
    # counted as Triton counts any batch: one execution, one queued request (for 0 ns here)
    assert (stats.execution_count, stats.queue.count) == (before[0] + 1, before[1] + 1)
    assert stats.batches[2].compute_infer.count >= 1
    assert batcher.free_instances == 1 and batcher.queued == 0


async def test_at_once_gives_way_to_batching_when_requests_arrive_together(
    make: Factory, clock: FakeClock
) -> None:
    batcher, backend, stats = await probed(make, clock, BatchingSpec(8))
    # seven at a time: each runs alone until a sampled request (the 16th) waits in the
    # queue, the others of its round queue behind it, and that batch's size turns the
    # at-once path off
    for _ in range(4):
        xs = [rows(1, i) for i in range(7)]
        results = await asyncio.gather(*(batcher({"x": x}, Context()) for x in xs))
        for result, x in zip(results, xs, strict=True):
            np.testing.assert_array_equal(result["y"], x * 2)
    assert max(stats.batches) > 1
    executions = stats.execution_count
    await asyncio.gather(*(batcher({"x": rows(1, i)}, Context()) for i in range(8)))
    assert stats.execution_count == executions + 1  # one batch of eight, from the queue
    assert backend.tasks[-1] is batcher._task


async def test_a_queue_delay_or_a_busy_instance_means_no_at_once(make: Factory, clock: FakeClock) -> None:
    batcher, backend, _ = await probed(make, clock, BatchingSpec(4, (1,), max_queue_delay_us=LONG_US))
    await batcher({"x": rows(1)}, Context())
    assert backend.tasks == [batcher._task]


async def test_at_once_keeps_preserve_ordering(make: Factory, clock: FakeClock) -> None:
    batcher, backend, _ = await probed(make, clock, BatchingSpec(4, preserve_ordering=True))
    results = [await batcher({"x": rows(1, i)}, Context()) for i in range(3)]
    assert [float(r["y"][0, 0]) for r in results] == [0.0, 2.0, 4.0]
    assert backend.tasks == [asyncio.current_task()] * 3
