"""Where a node's work runs: a pool of instances, each with its own worker thread.

This is the one seam for placement. The executor and batcher only ``await pool.run(...)``;
an instance today is a thread (one per instance, so thread-affine frameworks and CUDA
streams stay put), and could be a process or a remote actor without anything above changing.
A call waits for a free instance, so an instance runs one batch at a time, as in Triton.

Handing a call to a thread and back costs tens of microseconds of CPU (:class:`Worker`), and
more in latency while the thread waits for the interpreter lock, several times the work of a
cheap Python node or model. A pool created with ``inline=True`` therefore runs a
call directly on the event loop while its measured execution time stays under a threshold
(default 1 ms: ``LoadSettings.inline_threshold_us``), and on the worker thread otherwise: see
:class:`InlinePolicy`. Python work holds the GIL, so on a thread it does not leave the loop
free anyway; the threshold only sends calls that block (I/O, sleeps, long native work) to
their threads. Measured in-process (benchmarks/inline.py, benchmarks/README.md): the bundled
"simple" model 12.7k -> 47.2k infer/s (78 -> 21 us of CPU each), add_sub with dynamic
batching 9.7k -> 10.8k. Backends whose frameworks are thread-affine keep inline off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from flowserve.nodes.ratelimit import Ticket

T = TypeVar("T")  # an instance
A = TypeVar("A")  # the argument a call hands to an instance
R = TypeVar("R")  # what the call returns

log = logging.getLogger("flowserve")

DEFAULT_INLINE_THRESHOLD_NS = 1_000_000


class InlinePolicy:
    """Whether the next call may run on the event loop, from the durations seen so far.

    Pure bookkeeping, no clock of its own: ``observe(ns)`` after each call on the thread,
    ``observe_inline(ns)`` after each call on the loop, ``inline()`` before each call.
    The first ``probe`` calls run on the thread to measure; after that a call runs inline while
    the moving average (weight 1/10 for the newest call) stays under the threshold. A slow call
    lifts the average in proportion to how slow it was, so a node that turns slow goes back to
    its thread after one slow call, for as long as the average needs to decay (a 50 ms call
    over a 20 us habit: about 40 calls), while a brief preemption costs only a few calls.

    A call timed on its thread also counts the time that thread waited for the GIL while the
    loop ran: a cheap Python call looks slow there (measured: 100 us calls timed at several
    ms while the loop was busy), and would stay on the thread for good. So while the average
    is under ``reprobe_below_ns``, every ``reprobe_every``-th call is tried on the loop again,
    where it holds the GIL and its time is its own: a cheap result resets the average. A re-probe
    that finds the call slow doubles the interval to the next one (up to ``reprobe_most``): each
    holds the loop for the whole call, and a 2 ms model re-probed every 32nd call ran 3 % of its
    calls on the loop, stalling every other request of the worker for 2 ms each time.
    """

    __slots__ = (
        "_avg",
        "_every",
        "_probing",
        "_seen",
        "_since",
        "probe",
        "reprobe_below_ns",
        "reprobe_every",
        "reprobe_most",
        "threshold_ns",
    )

    def __init__(
        self,
        threshold_ns: int,
        probe: int = 8,
        reprobe_every: int = 32,
        reprobe_below_ns: int = 10_000_000,
        reprobe_most: int = 4096,
    ) -> None:
        self.threshold_ns = threshold_ns
        self.probe = probe
        self.reprobe_every = reprobe_every
        self.reprobe_below_ns = reprobe_below_ns
        self.reprobe_most = reprobe_most
        self._avg = 0.0
        self._seen = 0
        self._since = 0
        self._every = reprobe_every
        self._probing = False

    def inline(self) -> bool:
        if self.threshold_ns <= 0 or self._seen < self.probe:
            return False
        if self._avg < self.threshold_ns:
            return True
        self._since += 1
        if self._since >= self._every and self._avg < self.reprobe_below_ns:
            self._since = 0
            self._probing = True
            return True
        return False

    def likely_inline(self) -> bool:
        """What ``inline()`` would answer while the average is under the threshold, without
        counting a call (when it is over, the call may or may not be a re-probe: False)."""
        return self.threshold_ns > 0 and self._seen >= self.probe and self._avg < self.threshold_ns

    def observe(self, ns: int) -> None:
        self._seen += 1
        self._avg = ns if self._seen == 1 else 0.9 * self._avg + 0.1 * ns

    def observe_inline(self, ns: int) -> None:
        """A call that ran on the loop: its time is trusted over the thread's (see above)."""
        if self._probing:
            self._probing = False
            if ns < self.threshold_ns:
                self._seen += 1
                self._avg = ns
                self._every = self.reprobe_every
                return
            self._every = min(2 * self._every, self.reprobe_most)
        self.observe(ns)


class Call(Generic[R]):
    """One call handed to a :class:`Worker`'s thread, its outcome awaited on the event loop
    (``future``). The thread and the loop each take the call's one token to decide its fate,
    so exactly one of them does: the thread to run it, or :meth:`cancel` to drop it unstarted.
    (``list.pop`` is one step under the interpreter lock.)"""

    __slots__ = ("args", "dropped", "ended", "finished", "fn", "future", "loop", "token")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, fn: Callable[..., R], args: tuple[object, ...]
    ) -> None:
        self.loop = loop
        self.fn = fn
        self.args = args
        self.future: asyncio.Future[R] = loop.create_future()
        self.token: list[None] = [None]
        self.dropped = False  # the loop took the token: the thread never runs it
        self.finished = False  # the thread is done with it (its outcome may not be on the loop yet)
        # run on the loop once the call is over: its outcome there, or dropped unstarted
        self.ended: list[Callable[[], None]] = []

    def run(self) -> None:
        """On the worker's thread."""
        try:
            self.token.pop()
        except IndexError:
            return  # dropped before it started
        result: Any = None
        error: BaseException | None = None
        try:
            result = self.fn(*self.args)
        except BaseException as exc:  # handed to the awaiting side, as an executor does
            error = exc
        self.finished = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: no one waits any more
            self.loop.call_soon_threadsafe(self._settle, result, error)

    def _settle(self, result: Any, error: BaseException | None) -> None:
        future = self.future
        if not future.done():
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
        self._end()

    def _end(self) -> None:
        for callback in self.ended:
            callback()

    def drop(self) -> bool:
        """Take the call from its thread if the thread has not started it (from any thread)."""
        try:
            self.token.pop()
        except IndexError:
            return False
        self.dropped = True
        return True

    def cancel(self) -> bool:
        """On the loop: drop the call if its thread has not started it (True), its future
        cancelled; a started one runs on (False)."""
        if not self.drop():
            return False
        self._abort()
        return True

    def _abort(self) -> None:
        """On the loop, for a dropped call."""
        self.future.cancel()
        self._end()

    @property
    def running(self) -> bool:
        """Taken by its thread and not finished there (read on the loop, which alone drops)."""
        return not self.token and not self.dropped and not self.finished


_STOP = None  # what ends a worker's thread
_LIVE: weakref.WeakSet[Worker] = weakref.WeakSet()


def _stop_all() -> None:
    """At interpreter exit, before it joins the threads: every worker's thread ends once its
    current call returns, shut down or not (what ``concurrent.futures`` does for its own)."""
    for worker in list(_LIVE):
        worker._queue.put(_STOP)


threading._register_atexit(_stop_all)  # type: ignore[attr-defined]


class Worker:
    """One dedicated thread, fed through a queue.

    A call hands the thread its function and takes the outcome back on the event loop with one
    ``call_soon_threadsafe``: 23 us of CPU per round trip here against 68 us through a
    ``ThreadPoolExecutor`` and ``asyncio.wrap_future`` (a ``concurrent.futures.Future`` with its
    condition variable, and a chain of callbacks each way), for every call of every instance
    that computes on its thread (``benchmarks/README.md``, "The hand-off to an instance's
    thread"). As an executor's, the thread is not a daemon: the interpreter waits at exit for a
    call still running (never cut short inside a framework), and the server's exit watchdog
    ends a process whose hung call would hold it (``server.exit_watchdog``)."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[Call[Any] | None] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=f"{name}_0")
        self._thread.start()
        _LIVE.add(self)

    def _serve(self) -> None:
        get = self._queue.get
        while (job := get()) is not _STOP:
            job.run()
            del job  # nothing of the last call stays alive while the thread waits

    def start(self, fn: Callable[..., R], *args: object) -> Call[R]:
        """Hand ``fn(*args)`` to the thread; await the returned call's ``future``."""
        if self._closed:
            raise RuntimeError("cannot start a call on a worker that was shut down")
        job = Call(asyncio.get_running_loop(), fn, args)
        self._queue.put(job)
        return job

    async def call(self, fn: Callable[..., R], *args: object) -> R:
        """``fn(*args)`` on the thread; a caller cancelled before it started drops it."""
        return await _outcome(self.start(fn, *args))

    def shutdown(self) -> None:
        """Drop the calls not started (their callers see them cancelled) and end the thread
        once its current call returns."""
        self._closed = True
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not _STOP and job.drop():
                with contextlib.suppress(RuntimeError):  # the loop is closed: no one waits
                    job.loop.call_soon_threadsafe(job._abort)
        self._queue.put(_STOP)


class InstancePool(Generic[T]):
    """N instances (each paired with a worker thread); a call takes a free one."""

    def __init__(
        self, name: str, inline: bool = False, threshold_ns: int = DEFAULT_INLINE_THRESHOLD_NS
    ) -> None:
        """``inline``: cheap calls may run on the event loop, while they take under
        ``threshold_ns`` (0: never)."""
        self.name = name
        self.policy = InlinePolicy(threshold_ns if inline else 0)
        self._free: list[tuple[T, Worker]] = []
        self._all: list[tuple[T, Worker]] = []
        self._sem: asyncio.Semaphore | None = None
        self._abandoned: set[Worker] = set()
        # the rate limiter's ticket of each instance that needs resources (nodes/ratelimit.py);
        # None when none does, so the calls below pay one attribute test for it
        self._tickets: dict[Worker, Ticket] | None = None

    async def add(self, factory: Callable[[int], T]) -> T:
        """Create one instance by calling ``factory(index)`` on the instance's own thread."""
        index = len(self._all)
        worker = Worker(f"{self.name}-{index}")
        try:
            instance = await worker.call(factory, index)
        except BaseException:
            worker.shutdown()
            raise
        self._all.append((instance, worker))
        self._free.append((instance, worker))
        self._sem = asyncio.Semaphore(len(self._free))
        return instance

    async def add_many(self, factory: Callable[[int], T], count: int, parallel: int = 1) -> None:
        """Create ``count`` instances, up to ``parallel`` at once (each on its own thread).

        With ``parallel`` 1 this is ``add`` in a loop (stops at the first failure). In parallel,
        every instance is attempted; the ones created join the pool in index order (so ``close``
        releases them) and the first failure, by index, is raised."""
        if parallel <= 1 or count <= 1:
            for _ in range(count):
                await self.add(factory)
            return
        base = len(self._all)
        workers = [Worker(f"{self.name}-{base + i}") for i in range(count)]
        gate = asyncio.Semaphore(parallel)

        async def one(i: int) -> T:
            async with gate:
                return await workers[i].call(factory, base + i)

        results = await asyncio.gather(*(one(i) for i in range(count)), return_exceptions=True)
        error: BaseException | None = None
        for result, worker in zip(results, workers, strict=True):
            if isinstance(result, BaseException):
                worker.shutdown()
                error = error or result
                continue
            self._all.append((result, worker))
            self._free.append((result, worker))
        if self._free:
            self._sem = asyncio.Semaphore(len(self._free))
        if error is not None:
            raise error

    @property
    def instances(self) -> list[T]:
        return [i for i, _ in self._all]

    async def run(self, fn: Callable[[T, A], R], arg: A, on_acquired: Callable[[], None] | None = None) -> R:
        """Run ``fn(instance, arg)`` with a free instance: on the loop when the inline policy
        allows, else on the instance's thread.

        If the caller is cancelled (request timeout, client gone) while the call runs on the
        thread, the call cannot be stopped: the instance stays out of the pool until it returns
        (``abandoned`` counts such instances), so no new request queues unseen behind a hung
        call; an instance with an ``abandon()`` method (a child process) is told to stop."""
        sem = self._sem
        if sem is None:
            raise RuntimeError(f"{self.name}: no instance loaded")
        if self._tickets is not None:
            return await self._run_limited(sem, fn, arg, on_acquired)
        policy = self.policy
        await sem.acquire()
        pair = self._free.pop()
        try:
            if on_acquired is not None:
                on_acquired()
            if policy.inline():
                start = time.perf_counter_ns()
                try:
                    return fn(pair[0], arg)
                finally:
                    policy.observe_inline(time.perf_counter_ns() - start)
            return await self._wait(pair, pair[1].start(_timed, policy, fn, pair[0], arg), sem)
        finally:
            self._give_back(pair, sem)

    async def _wait(self, pair: tuple[T, Worker], job: Call[R], sem: asyncio.Semaphore) -> R:
        """Await a call on ``pair``'s thread. If the caller gives up (request timeout, client
        gone, sibling failed), a call that has not started is dropped; one that is running
        cannot be stopped, so its instance stays out of the pool until the call returns."""
        try:
            return await job.future
        except asyncio.CancelledError:
            if not job.cancel() and job.running:
                self._abandon(pair, job, sem)
            raise

    def _give_back(self, pair: tuple[T, Worker], sem: asyncio.Semaphore) -> None:
        """Return an instance to the pool, unless ``_wait`` left it with an abandoned call."""
        if pair[1] not in self._abandoned:
            self._free.append(pair)
            sem.release()

    def runs_inline(self) -> bool:
        """Whether the next call will run on the event loop (see InlinePolicy.likely_inline)."""
        return self._tickets is None and self._sem is not None and self.policy.likely_inline()

    @property
    def abandoned(self) -> int:
        """Instances busy with a call whose caller gave up (a hung node): they take no new work."""
        return len(self._abandoned)

    def _abandon(self, pair: tuple[T, Worker], job: Call[Any], sem: asyncio.Semaphore) -> None:
        worker = pair[1]
        self._abandoned.add(worker)
        log.warning(
            "%s: an instance is still running a call that its request abandoned; it takes no new "
            "work until that call returns (%d of %d instances held so)",
            self.name,
            len(self._abandoned),
            len(self._all),
        )
        abandon = getattr(pair[0], "abandon", None)
        if callable(abandon):  # an instance that can stop its call (a child process) does so
            with contextlib.suppress(Exception):
                abandon()

        job.ended.append(lambda: self._returned(pair, sem))  # on the loop, once it returns

    def _returned(self, pair: tuple[T, Worker], sem: asyncio.Semaphore) -> None:
        self._abandoned.discard(pair[1])
        if self._sem is sem:  # not closed meanwhile
            log.info("%s: an abandoned call returned; the instance serves again", self.name)
            self._free.append(pair)
            sem.release()

    async def run_async(self, fn: Callable[[T, A], Awaitable[R]], arg: A) -> R:
        """Await ``fn(instance, arg)`` on the event loop with a free instance (async user code)."""
        sem = self._sem
        if sem is None:
            raise RuntimeError(f"{self.name}: no instance loaded")
        async with sem:
            pair = self._free.pop()
            try:
                return await fn(pair[0], arg)
            finally:
                self._free.append(pair)

    async def run_on(self, index: int, fn: Callable[[T, A], R], arg: A) -> R:
        """Run ``fn(instance, arg)`` on instance ``index``'s thread (a sequence stays on one
        instance). The caller keeps calls to one instance one at a time."""
        instance, worker = self._all[index]
        if self._tickets is not None and worker in self._tickets:
            ticket = self._tickets[worker]
            await ticket.acquire()
            return await _outcome(_start_admitted(worker, ticket, fn, instance, arg))
        return await worker.call(fn, instance, arg)

    # ---------------------------------------------------------------- rate limiter

    def limit(self, tickets: Sequence[Ticket | None]) -> None:
        """From now on instance ``i`` runs only holding ``tickets[i]``'s resources (None: it
        needs none); see nodes/ratelimit.py."""
        held = {w: t for (_, w), t in zip(self._all, tickets, strict=True) if t is not None}
        self._tickets = held or None

    async def _run_limited(
        self,
        sem: asyncio.Semaphore,
        fn: Callable[[T, A], R],
        arg: A,
        on_acquired: Callable[[], None] | None,
    ) -> R:
        """``run`` under the rate limiter, always on the instance's thread: the instance's
        resources are taken before the call and given back when the call ends on the thread
        (even when its caller gave up meanwhile), so instances that share a resource never
        run at the same time."""
        tickets = self._tickets
        assert tickets is not None
        await sem.acquire()
        pair = self._free.pop()
        try:
            ticket = tickets.get(pair[1])
            if ticket is None:
                job = pair[1].start(fn, pair[0], arg)
            else:
                await ticket.acquire()
                job = _start_admitted(pair[1], ticket, fn, pair[0], arg)
            if on_acquired is not None:
                on_acquired()
            return await self._wait(pair, job, sem)
        finally:
            self._give_back(pair, sem)

    @contextlib.asynccontextmanager
    async def _lease_limited(self, sem: asyncio.Semaphore) -> AsyncIterator[tuple[T, Worker]]:
        tickets = self._tickets
        assert tickets is not None
        async with sem:
            pair = self._free.pop()
            try:
                ticket = tickets.get(pair[1])
                if ticket is None:
                    yield pair
                    return
                await ticket.acquire()
                try:
                    yield pair
                finally:
                    ticket.release()
            finally:
                self._free.append(pair)

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[tuple[T, Worker]]:
        """Hold a free instance (and its worker thread) for a whole streamed request."""
        sem = self._sem
        if sem is None:
            raise RuntimeError(f"{self.name}: no instance loaded")
        if self._tickets is not None:
            async with self._lease_limited(sem) as pair:
                yield pair
            return
        async with sem:
            pair = self._free.pop()
            try:
                yield pair
            finally:
                self._free.append(pair)

    async def close(self, finalize: Callable[[T], None] | None = None) -> None:
        for instance, worker in self._all:
            if worker in self._abandoned:
                # finalize would wait behind a call that may never return: leave it be
                log.warning("%s: closed without finalize: an instance is in an abandoned call", self.name)
            elif finalize is not None:
                # a failing finalize must not stop the others from closing
                with contextlib.suppress(Exception):
                    await worker.call(finalize, instance)
            worker.shutdown()
        self._all.clear()
        self._free.clear()
        self._sem = None
        self._tickets = None


def _start_admitted(worker: Worker, ticket: Ticket, fn: Callable[..., R], *args: object) -> Call[R]:
    """Start a call whose resources ``ticket`` holds; they go back when the call is over on
    its thread (ran, failed, or was dropped before it started)."""
    try:
        job = worker.start(fn, *args)
    except BaseException:
        ticket.release()
        raise
    job.ended.append(ticket.release)
    return job


async def _outcome(job: Call[R]) -> R:
    """Await a call; a caller cancelled before the call started drops it."""
    try:
        return await job.future
    except asyncio.CancelledError:
        job.cancel()
        raise


def _timed(policy: InlinePolicy, fn: Callable[[T, A], R], instance: T, arg: A) -> R:
    start = time.perf_counter_ns()
    try:
        return fn(instance, arg)
    finally:
        policy.observe(time.perf_counter_ns() - start)
