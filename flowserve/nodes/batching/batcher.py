"""The batcher: a node that wraps another node and feeds it batches (house rule 1: wrap).

::

    batcher = Batcher(inner, spec, clock=clock)   # inner: any Node; spec: a BatchingSpec
    await batcher.start()                         # starts inner, then the batching task
    outputs = await batcher(inputs, ctx)          # queued; resolved with exactly this request's rows
    await batcher.stop()                          # stops the task, fails what is queued, stops inner

A call queues its request (failing at once with UNAVAILABLE when its priority level or the
batcher is full) and awaits a future. One background task, started by ``start`` and cancelled
and awaited by ``stop``, loops:

1. apply queue timeouts (REJECT fails the request with "Request timeout expired"; DELAY
   moves it back);
2. while an instance is free, ask the pure policy (:func:`~.policy.decide`) which requests form
   the next batch, and run it on that instance as a child task of the loop's TaskGroup, so N
   instances run N batches at once;
3. sleep until a request arrives, an instance frees, the policy's delay ends or a timeout is due.

**At once.** A model that asks for no queue delay gets a batch as soon as an instance is free
(Triton's rule), so a request that finds the queue empty and an instance free whose calls run on
the event loop is run at once, as a batch of one, in its caller's coroutine: no wake of the
batching task and back (about 11 us of a 45 us call, in-process). That gives up merging with
requests that arrive in the same loop iteration, so it is used only while batches formed from
the queue average under two requests (``AT_ONCE_BELOW``); every ``AT_ONCE_SAMPLE``-th such
request goes through the queue anyway, and the batch it forms keeps that average current.

A batch's results go back to its callers as soon as it finishes or, with ``preserve_ordering``,
once every batch formed before it has finished. Every executed batch is counted in
``node_stats`` and, for a repository model, in its ``ModelStats`` as Triton does: queue time
per request, one execution of ``rows`` inferences, compute time per request and per batch size.

**Decoupled nodes** (a decoupled python model with ``dynamic_batching``) batch too, as in
Triton: their callers use :meth:`Batcher.stream`; the policy forms batches of requests the same
way (preferred sizes, queue delay, priorities, timeouts), a batch runs as one
``execute(requests)`` on a free instance (:class:`~.runners.StreamRunner`), and each request's
responses come back through its own :class:`~.runners.StreamSink` as the model sends them. The
instance takes the next batch once ``execute`` returns, even while responses are still coming.

**Device tensors.** The batcher takes tensors as its inner node does (``device_tensors``, see
:mod:`flowserve.core.device`): in front of a torch or ONNX Runtime node it queues the DLPack
tensors its producers made, a batch of them is merged where they are (``torch.cat`` on their
GPU, ordered after each part's event; on the host when their framework cannot), the merge's
bytes counted as the node's bytes copied, and each request gets views of the outputs.

Times come from the injected clock. The asyncio waits derive from it, so with a
:class:`~flowserve.core.clock.FakeClock` a test moves the clock and calls :meth:`Batcher.wake`.
Waits run on a :class:`~flowserve.runtime.timer.PreciseTimer`: a 500 us queue delay lasts
500 us, not the whole millisecond uvloop's own timers would give it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from flowserve.core.clock import MONOTONIC, Clock
from flowserve.core.device import ordered_device
from flowserve.core.errors import InternalError, InvalidArgument, Unavailable
from flowserve.core.node import Context, Node, TensorMap
from flowserve.nodes.batching.policy import Take, decide, policy_from_spec
from flowserve.nodes.batching.queues import Entry, PriorityQueue, levels_from_spec
from flowserve.nodes.batching.runners import (
    BatchExecutor,
    BatchRunner,
    InstanceRunner,
    NodeRunner,
    Phases,
    StreamBatchExecutor,
    StreamRunner,
    StreamSink,
)
from flowserve.nodes.batching.tensors import request_key, request_rows
from flowserve.runtime.stats import ModelStats, NodeStats
from flowserve.runtime.timer import PreciseTimer
from flowserve.spec.schema import BatchingSpec

log = logging.getLogger("flowserve")

# requests one batcher holds when its queue policies set no smaller bound (house rule 5)
DEFAULT_MAX_QUEUED = 65536
# run a request at once while queued batches average fewer requests than this ...
AT_ONCE_BELOW = 2.0
# ... and send every this many of those through the queue, to keep the average current
AT_ONCE_SAMPLE = 16


@dataclass(eq=False, slots=True)
class _Call:
    inputs: TensorMap
    ctx: Context
    future: asyncio.Future[TensorMap]
    sink: StreamSink | None = field(default=None)  # a streamed request's responses


@dataclass(eq=False, slots=True)
class _Batch:
    entries: list[Entry[_Call]]
    # each request's outputs or its own error, or the error of the whole batch
    outcome: list[TensorMap | Exception] | BaseException | None = None


class Batcher(Node):
    """Dynamic batching in front of ``inner`` (Triton's ``dynamic_batching`` semantics).

    ``runner`` defaults to running batches through the inner node's instances when it has them
    (a BackendNode), else through its ``__call__`` with ``capacity`` merged calls at once.
    ``ragged`` names inputs that allow ragged batching. ``stats``, when given, is the model's
    ModelStats to count executions in.
    """

    def __init__(
        self,
        inner: Node,
        spec: BatchingSpec,
        *,
        clock: Clock = MONOTONIC,
        ragged: frozenset[str] = frozenset(),
        capacity: int = 1,
        runner: BatchRunner | None = None,
        stats: ModelStats | None = None,
        max_queued: int | None = None,
    ) -> None:
        self._streams: StreamRunner | None = None
        if inner.decoupled:
            if not isinstance(inner, StreamBatchExecutor):
                raise InvalidArgument(
                    f"node '{inner.name}' is decoupled: its responses cannot be split back by rows, "
                    "so it cannot batch"
                )
            self._streams = StreamRunner(inner, clock)
            self.decoupled = True
        self.name = inner.name
        self.inner = inner
        # the inner node takes DLPack tensors as they come (torch, ONNX Runtime): so does the
        # batcher, which queues, merges (on their device where it can) and splits them
        self.device_tensors = ordered_device(inner)
        self.spec = spec
        self.clock = clock
        self.ragged = ragged
        self.policy = policy_from_spec(spec)
        levels, default_level = levels_from_spec(spec)
        bound = max_queued or max(DEFAULT_MAX_QUEUED, sum(p.max_queue_size for p in levels))
        self._queue: PriorityQueue[_Call] = PriorityQueue(levels, default_level, bound)
        self.model_stats = stats
        self.node_stats = NodeStats()
        self.runner: BatchRunner | StreamRunner
        if self._streams is not None:
            self.runner = self._streams
        elif runner is not None:
            self.runner = runner
        elif isinstance(inner, BatchExecutor):
            self.runner = InstanceRunner(inner, clock)  # the backend counts its merges itself
        else:
            self.runner = NodeRunner(inner, clock, ragged, capacity, meter=self.node_stats)
        self._preserve = spec.preserve_ordering
        self._order: deque[_Batch] = deque()
        self._wake = asyncio.Event()
        self._free = 0
        self._task: asyncio.Task[None] | None = None
        self._timer: PreciseTimer | None = None
        self._direct: _Batch | None = None  # a batch to run in the batching task itself
        # at once (module docstring): only with no queue delay; the average is an EWMA
        self._at_once = self.policy.max_queue_delay_ns == 0 and self._streams is None
        self._mean_batch = 1.0
        self._at_once_seen = 0

    @property
    def queued(self) -> int:
        """Requests waiting in the queue (not yet in a batch)."""
        return len(self._queue)

    @property
    def free_instances(self) -> int:
        return self._free

    # ------------------------------------------------------------------ lifespan

    async def start(self) -> None:
        await self.inner.start()
        self._free = self.runner.capacity
        self._task = asyncio.create_task(self._loop(), name=f"batcher:{self.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        stopped = Unavailable(f"'{self.name}' stopped before the request was scheduled")
        for entry in self._queue.drain():
            _fail(entry.payload.future, stopped)
        self._order.clear()
        await self.inner.stop()

    def wake(self) -> None:
        """Look at the queue again now (after a fake clock moved, in tests)."""
        self._wake.set()

    # ------------------------------------------------------------------ requests

    async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
        if self._task is None:
            raise Unavailable(f"'{self.name}' is not accepting requests: its batcher is not running")
        if self._streams is not None:
            return await _single(self.stream(inputs, ctx), self.name)
        rows = request_rows(inputs, self.name)
        now = self.clock.now_ns()
        if (
            self._at_once
            and self._free
            and not self._queue
            and self._direct is None
            and not self._order  # nothing in flight to keep the order of
            and self._alone()
        ):
            return await self._run_at_once(inputs, ctx, rows, now)
        key = request_key(inputs, self.ragged)
        future: asyncio.Future[TensorMap] = asyncio.get_running_loop().create_future()
        call = _Call(inputs, ctx, future)
        entry = self._queue.push(call, rows, key, now, ctx.priority, _timeout_us(ctx))
        self._wake.set()
        try:
            return await future
        except asyncio.CancelledError:  # the caller went away or its deadline passed
            self._queue.remove(entry)
            ctx.cancelled = True  # a running batch's model may see it (is_cancelled)
            raise

    async def stream(self, inputs: TensorMap, ctx: Context) -> AsyncGenerator[TensorMap, None]:
        """A decoupled node's responses to one request, batched with others (module docstring)."""
        if self._streams is None:
            yield await self(inputs, ctx)
            return
        if self._task is None:
            raise Unavailable(f"'{self.name}' is not accepting requests: its batcher is not running")
        rows = request_rows(inputs, self.name)
        loop = asyncio.get_running_loop()
        sink = StreamSink(loop)
        future: asyncio.Future[TensorMap] = loop.create_future()
        future.add_done_callback(lambda f: _to_sink(f, sink))
        call = _Call(inputs, ctx, future, sink)
        key = request_key(inputs, self.ragged)
        entry = self._queue.push(call, rows, key, self.clock.now_ns(), ctx.priority, _timeout_us(ctx))
        self._wake.set()
        final = False
        try:
            async for outputs in sink.responses():
                yield outputs
            final = True
        finally:
            if not final:  # the caller went away or the request failed
                self._queue.remove(entry)
                sink.leave()

    def _alone(self) -> bool:
        """Whether a request that could run at once should (module docstring, "At once")."""
        if self._mean_batch >= AT_ONCE_BELOW or not self.runner.runs_inline():
            return False
        self._at_once_seen += 1
        return self._at_once_seen % AT_ONCE_SAMPLE != 0

    async def _run_at_once(self, inputs: TensorMap, ctx: Context, rows: int, now: int) -> TensorMap:
        """A batch of this one request, run by its caller: no queue entry, future or batch."""
        self._free -= 1
        phases = Phases()
        try:
            runner = self.runner
            assert not isinstance(runner, StreamRunner)  # streams never run at once
            results = await runner.run([inputs], [rows], (ctx,), phases)
        finally:
            self._free += 1
            if self._queue:
                self._wake.set()
        self._count(1, rows, phases.start_ns - now, phases)
        result = results[0]
        if isinstance(result, Exception):
            raise result
        return result

    # ------------------------------------------------------------------ the batching task

    async def _loop(self) -> None:
        # sub-millisecond queue delays need a precise timer (uvloop's are whole milliseconds)
        self._timer = PreciseTimer(self._wake.set)
        try:
            await self._batch_forever()
        finally:
            self._timer.close()
            self._timer = None

    async def _batch_forever(self) -> None:
        async with asyncio.TaskGroup() as group:
            while True:
                self._wake.clear()
                now = self.clock.now_ns()
                try:
                    wake_at, again = self._schedule(now, group)
                except Exception as exc:  # a bug here must not strand the callers
                    log.exception("batcher of '%s' failed", self.name)
                    failed = InternalError(f"batcher of node '{self.name}' failed: {exc!r}")
                    for entry in self._queue.drain():
                        _fail(entry.payload.future, failed)
                    continue
                direct, self._direct = self._direct, None
                if direct is not None:
                    # the only instance runs it: in this task, no task of its own to create
                    # (nothing else could be dispatched until it is done anyway)
                    await self._run(direct)
                elif not again:
                    await self._sleep(wake_at, now)

    def _schedule(self, now: int, group: asyncio.TaskGroup) -> tuple[int | None, bool]:
        """Expire, then dispatch one batch if possible; returns (when to look again, at once?)."""
        queue = self._queue
        for entry in queue.expire(now):
            _fail(entry.payload.future, Unavailable("Request timeout expired"))
        wake_at = queue.next_timeout()
        if self._free and len(queue):
            decision = decide(queue, now, self.policy)
            if isinstance(decision, Take):
                self._dispatch(queue.pop(decision.count), group)
                return None, True
            if decision is not None:
                wake_at = decision.until_ns if wake_at is None else min(wake_at, decision.until_ns)
        return wake_at, False

    async def _sleep(self, wake_at: int | None, now: int) -> None:
        if wake_at is None:
            await self._wake.wait()
            return
        if wake_at <= now:
            return
        timer = self._timer
        assert timer is not None
        # left armed when something else wakes the batcher: the next sleep most often wants
        # the same expiry (the oldest request's), and a stale one only wakes it once for nothing
        timer.arm(wake_at - now)
        await self._wake.wait()

    def _dispatch(self, entries: list[Entry[_Call]], group: asyncio.TaskGroup) -> None:
        self._free -= 1
        self._mean_batch = 0.75 * self._mean_batch + 0.25 * len(entries)
        batch = _Batch(entries)
        if self._preserve:
            self._order.append(batch)
        if self.runner.capacity == 1 and self.runner.runs_inline():
            # the only instance runs it on the loop without suspending: nothing else (not even
            # expiring a timed-out request) could happen before it ends anyway
            self._direct = batch
        else:
            group.create_task(self._run(batch))

    async def _run(self, batch: _Batch) -> None:
        """Run one batch on a free instance; never raises but for cancellation."""
        calls = [e.payload for e in batch.entries]
        rows = [e.rows for e in batch.entries]
        phases = Phases()
        try:
            inputs = [c.inputs for c in calls]
            contexts = [c.ctx for c in calls]
            runner = self.runner
            if isinstance(runner, StreamRunner):
                sinks = [c.sink for c in calls if c.sink is not None]
                await runner.run_streams(inputs, contexts, sinks, phases)
                results: list[TensorMap | Exception] = [{} for _ in calls]  # the responses went to the sinks
            else:
                results = await runner.run(inputs, rows, contexts, phases)
            self._record(batch.entries, phases)
            batch.outcome = results
        except asyncio.CancelledError:
            batch.outcome = Unavailable(f"'{self.name}' stopped while the request was running")
            raise
        except Exception as exc:
            batch.outcome = exc
        finally:
            self._free += 1
            if self._queue:  # else nothing waits for the instance
                self._wake.set()
            self._finish(batch)

    def _finish(self, batch: _Batch) -> None:
        if not self._preserve:
            _resolve(batch)
            return
        order = self._order
        while order and order[0].outcome is not None:
            _resolve(order.popleft())

    def _record(self, entries: list[Entry[_Call]], phases: Phases) -> None:
        queue_ns = sum(phases.start_ns - e.enqueued_ns for e in entries)
        self._count(len(entries), sum(e.rows for e in entries), queue_ns, phases)

    def _count(self, requests: int, rows: int, queue_ns: int, phases: Phases) -> None:
        """One executed batch in the node's and the model's statistics (as Triton counts)."""
        input_ns = phases.infer_start_ns - phases.start_ns
        infer_ns = phases.infer_end_ns - phases.infer_start_ns
        output_ns = phases.end_ns - phases.infer_end_ns
        for stats in (self.node_stats, self.model_stats):
            if stats is not None:
                stats.queue.add(queue_ns, requests)
                stats.record_execution(rows, input_ns, infer_ns, output_ns, requests=requests)


def _timeout_us(ctx: Context) -> int | None:
    """The request's ``timeout`` parameter (microseconds), when it sets one."""
    value = ctx.parameters.get("timeout") if ctx.parameters else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


async def _single(responses: AsyncGenerator[TensorMap, None], name: str) -> TensorMap:
    """The one response of a decoupled node's request, for a caller that wants one."""
    got = [r async for r in responses]
    if len(got) != 1:
        raise InternalError(f"node '{name}' is decoupled and sent {len(got)} responses; stream it instead")
    return got[0]


def _to_sink(future: asyncio.Future[TensorMap], sink: StreamSink) -> None:
    """A streamed request's failure before or during its batch (timeout, stop, execute raised)."""
    error = None if future.cancelled() else future.exception()
    if error is not None:
        sink.fail(error)


def _resolve(batch: _Batch) -> None:
    outcome = batch.outcome
    for index, entry in enumerate(batch.entries):
        future = entry.payload.future
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        elif outcome is not None:
            result = outcome[index]
            if isinstance(result, Exception):  # this request's own error (python models)
                future.set_exception(result)
            else:
                future.set_result(result)


def _fail(future: asyncio.Future[TensorMap], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
