"""The sequence batcher: stateful models, Triton's ``sequence_batching`` semantics.

Every request carries a correlation id (``sequence_id``: a non-zero uint64 or a non-empty
string) and START/END flags. All requests of a sequence go to the same instance, one at a time
and in arrival order; the batcher feeds the model its control tensors (START, END, READY,
CORRID, as configured) and carries implicit state (a state output of request i is the state
input of request i+1, reset at START). A sequence holds a slot from START to END; a sequence
idle longer than ``max_sequence_idle_microseconds`` (Triton's default when unset: 1 s) is
released, its slot freed, and its next request gets a clear error.

When every slot is taken, a new sequence's START waits for one (Triton's backlog), fairly
between clients: a freed slot goes to the waiting START of the client (``Context.peer``, its
address) that holds the fewest slots, the oldest first among equals, so one client's
never-ended sequences hold the model for at most the idle time, not for as long as its
backlog lasts. A client may have at most ``MAX_WAITING_STARTS_PER_CLIENT`` starts waiting;
more fail at once with UNAVAILABLE (house rule: every queue has a bound). Requests whose client
is unknown (the in-process API) count as one client.

**Iterative sequences** (``iterative_sequence: true``, Triton's): a model that answers a request
over several ``execute`` calls, releasing it with ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``
between them. A request without a correlation id is a sequence of its own (Triton accepts it);
one with an id runs after the earlier requests of its sequence. A decoupled model's responses
stream back as it sends them (its control tensors and implicit state are not fed).

Requests of different sequences that are waiting for the same instance run as one batch
(one row each), as Triton does. With the ``direct`` strategy each sequence also owns a batch
slot of its instance from START to END, and its requests always run in that row: a model may
keep state per slot, as Triton's direct strategy promises. Slots with no request ready below
the highest one that has one get a null request (READY false, START/END false, CORRID 0 or
"", inputs zero-filled in the shape of the batch's real requests, the initial state), whose
outputs are dropped, as Triton fills them.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections import OrderedDict
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flowserve.core.clock import MONOTONIC, Clock
from flowserve.core.datatypes import to_numpy
from flowserve.core.errors import InvalidArgument, Unavailable
from flowserve.core.node import Context, Node, TensorMap
from flowserve.nodes.backends.base import BackendNode
from flowserve.spec.sequence import SequenceSpec


def correlation_id(name: str, parameters: Any) -> tuple[int | str, bool, bool]:
    """(id, start, end) from a request's parameters; InvalidArgument when the id is missing."""
    corr = parameters.get("sequence_id", 0) if parameters else 0
    if isinstance(corr, bool) or not isinstance(corr, int | str) or corr in (0, ""):
        raise InvalidArgument(
            f"inference request to model '{name}' must specify a non-zero or non-empty correlation ID"
        )
    return corr, bool(parameters.get("sequence_start", False)), bool(parameters.get("sequence_end", False))


# starts of one client that may wait for a slot at once (more: UNAVAILABLE at once)
MAX_WAITING_STARTS_PER_CLIENT = 64
# idle sequences are looked for this often (a quarter of the idle time, within these bounds)
REAP_PERIOD_S = (0.01, 1.0)
# released sequence ids remembered, to say why their next request fails
EXPIRED_REMEMBERED = 4096


@dataclass(eq=False)
class Sequence:
    corr: int | str
    instance: int
    last_ns: int
    peer: str = ""  # the client that started it
    state: TensorMap = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    busy: int = 0
    slot: int = 0  # its row in every batch of its instance (direct strategy)


@dataclass(eq=False)
class Waiting:
    """A START waiting for a slot; ``order`` breaks ties between clients (oldest first)."""

    corr: int | str
    peer: str
    order: int
    future: asyncio.Future[Sequence]


@dataclass(eq=False)
class Pending:
    seq: Sequence
    inputs: TensorMap
    start: bool
    end: bool
    future: asyncio.Future[TensorMap]
    queued_ns: int = 0


class SequenceBatcher(Node):
    """Wraps a backend node of a stateful model."""

    def __init__(
        self, inner: BackendNode, spec: SequenceSpec, max_batch_size: int, clock: Clock = MONOTONIC
    ) -> None:
        self.name = inner.name
        self.inner = inner
        self.spec = spec
        self.clock = clock
        self.max_batch_size = max_batch_size
        self.rows = max(max_batch_size, 1)
        # active sequences, least recently used first (the reaper stops at the first not idle)
        self._active: OrderedDict[int | str, Sequence] = OrderedDict()
        self._expired: OrderedDict[int | str, None] = OrderedDict()
        self._queues: list[list[Pending]] = []
        self._wake: list[asyncio.Event] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._direct = spec.strategy == "direct"
        self._load: list[int] = []  # per instance: its active sequences
        self._free_rows: list[list[int]] = []  # per instance: a heap of released rows below _next_row
        self._next_row: list[int] = []  # per instance: rows from here up were never taken
        self._held: dict[str, int] = {}  # client -> its active sequences
        self._waiting: list[Waiting] = []  # STARTs waiting for a slot, in arrival order
        self._waiting_of: dict[str, int] = {}  # client -> its STARTs waiting
        self._order = itertools.count()
        self.decoupled = bool(getattr(inner, "decoupled", False))
        model = getattr(inner, "model", None)
        # (a field the bundled protobuf stubs do not declare)
        batching = model.config.sequence_batching if model is not None else None
        self.iterative = bool(getattr(batching, "iterative_sequence", False))

    @property
    def capacity(self) -> int:
        """How many sequences may be active at once."""
        instances = max(len(self._queues), 1)
        if self.spec.strategy == "oldest" and self.spec.max_candidate_sequences > 0:
            return self.spec.max_candidate_sequences
        return instances * self.rows

    async def start(self) -> None:
        await self.inner.start()
        count = len(self.inner.pool.instances)
        self._queues = [[] for _ in range(count)]
        self._load = [0] * count
        self._free_rows = [[] for _ in range(count)]
        self._next_row = [0] * count
        self._wake = [asyncio.Event() for _ in range(count)]
        self._tasks = [
            asyncio.create_task(self._dispatch(i), name=f"{self.name}-sequence-{i}") for i in range(count)
        ]
        self._tasks.append(asyncio.create_task(self._reap(), name=f"{self.name}-sequence-reaper"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self.inner.stop()

    def _on_its_own(self, ctx: Context) -> bool:
        """An iterative sequence's request without a correlation id: a sequence of its own."""
        return self.iterative and (ctx.parameters.get("sequence_id", 0) if ctx.parameters else 0) in (0, "")

    async def stream(self, inputs: TensorMap, ctx: Context) -> AsyncGenerator[TensorMap, None]:
        """A decoupled model's responses (iterative sequences), each sequence's requests one at
        a time."""
        if not self.decoupled:
            yield await self(inputs, ctx)
            return
        if self._on_its_own(ctx):
            async for outputs in self.inner.stream(inputs, ctx):
                yield outputs
            return
        corr, start, end = correlation_id(self.name, ctx.parameters)
        seq = await self._sequence(corr, start, ctx.peer)
        seq.busy += 1
        try:
            async with seq.lock:
                async for outputs in self.inner.stream(inputs, ctx):
                    yield outputs
        finally:
            self._used(corr, seq)
        if end:
            self._release(corr)

    def _used(self, corr: int | str, seq: Sequence) -> None:
        seq.busy -= 1
        seq.last_ns = self.clock.now_ns()
        if self._active.get(corr) is seq:
            self._active.move_to_end(corr)  # the most recently used now

    async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
        if self._on_its_own(ctx):
            return await self.inner(inputs, ctx)
        corr, start, end = correlation_id(self.name, ctx.parameters)
        seq = await self._sequence(corr, start, ctx.peer)
        seq.busy += 1
        try:
            async with seq.lock:  # one request of a sequence at a time, in arrival order
                future: asyncio.Future[TensorMap] = asyncio.get_running_loop().create_future()
                pending = Pending(seq, inputs, start, end, future, self.clock.now_ns())
                self._queues[seq.instance].append(pending)
                self._wake[seq.instance].set()
                outputs = await future
        finally:
            self._used(corr, seq)
        if end:
            self._release(corr)
        return outputs

    async def _sequence(self, corr: int | str, start: bool, peer: str) -> Sequence:
        seq = self._active.get(corr)
        if seq is not None:
            if start:
                seq.state = {}  # a new START restarts the sequence
            return seq
        if not start:
            why = (
                f"sequence {corr!r} was released after being idle for more than "
                f"{self.spec.max_sequence_idle_us} us; "
                if corr in self._expired
                else ""
            )
            raise InvalidArgument(
                f"inference request for sequence {corr!r} to model '{self.name}' must specify the "
                f"START flag on the first request of the sequence ({why}no active sequence has this id)"
            )
        if len(self._active) < self.capacity:
            return self._open(corr, peer)
        return await self._wait_for_slot(corr, peer)

    async def _wait_for_slot(self, corr: int | str, peer: str) -> Sequence:
        """Every slot is taken: wait in the backlog until :meth:`_grant` gives this START one."""
        waiting = self._waiting_of.get(peer, 0)
        if waiting >= MAX_WAITING_STARTS_PER_CLIENT:
            client = f"client {peer}" if peer else "this client"
            raise Unavailable(
                f"model '{self.name}': all {self.capacity} sequence slots are taken and {client} "
                f"already has {waiting} sequence starts waiting for one (the most one client may "
                "have waiting); retry later, and end sequences (sequence_end) when done"
            )
        entry = Waiting(corr, peer, next(self._order), asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        self._waiting_of[peer] = waiting + 1
        try:
            return await entry.future
        finally:
            if not entry.future.done() or entry.future.cancelled():  # its caller went away, or timed out
                self._unwait(entry)

    def _unwait(self, entry: Waiting) -> None:
        self._waiting.remove(entry)
        left = self._waiting_of[entry.peer] - 1
        if left:
            self._waiting_of[entry.peer] = left
        else:
            del self._waiting_of[entry.peer]

    def _open(self, corr: int | str, peer: str) -> Sequence:
        """A new sequence in a free slot: on the instance with the fewest sequences (which has a
        free row), in its lowest free row."""
        load = self._load
        instance = min(range(len(load)), key=load.__getitem__)
        load[instance] += 1
        seq = self._active[corr] = Sequence(corr, instance, self.clock.now_ns(), peer)
        if self._direct:
            free = self._free_rows[instance]
            if free:
                seq.slot = heapq.heappop(free)
            else:
                seq.slot = self._next_row[instance]
                self._next_row[instance] += 1
        self._held[peer] = self._held.get(peer, 0) + 1
        self._expired.pop(corr, None)
        return seq

    def _release(self, corr: int | str) -> None:
        seq = self._active.pop(corr, None)
        if seq is None:
            return
        self._load[seq.instance] -= 1
        if self._direct:
            heapq.heappush(self._free_rows[seq.instance], seq.slot)
        held = self._held[seq.peer] - 1
        if held:
            self._held[seq.peer] = held
        else:
            del self._held[seq.peer]
        self._grant()

    def _grant(self) -> None:
        """Give free slots to waiting STARTs: each to the START of the client holding the
        fewest slots, the oldest first among equals (and every START of the same sequence id
        with it)."""
        while self._waiting and len(self._active) < self.capacity:
            held = self._held
            entry = min(self._waiting, key=lambda w: (held.get(w.peer, 0), w.order))
            seq = self._active.get(entry.corr) or self._open(entry.corr, entry.peer)
            for same in [w for w in self._waiting if w.corr == entry.corr]:
                self._unwait(same)
                if not same.future.done():
                    same.future.set_result(seq)

    def reap(self, now_ns: int) -> list[int | str]:
        """Release every sequence idle longer than ``max_sequence_idle_microseconds`` at
        ``now_ns`` (the reaper task calls this); returns their ids."""
        idle_ns = self.spec.max_sequence_idle_us * 1000
        idle = []
        for corr, seq in self._active.items():  # least recently used first
            if seq.busy:
                continue  # a request of it is running: not idle
            if now_ns - seq.last_ns <= idle_ns:
                break  # neither is any used later
            idle.append(corr)
        for corr in idle:
            self._expired[corr] = None
            if len(self._expired) > EXPIRED_REMEMBERED:
                self._expired.popitem(last=False)
            self._release(corr)
        return idle

    async def _reap(self) -> None:
        low, high = REAP_PERIOD_S
        period = min(max(self.spec.max_sequence_idle_us / 4e6, low), high)
        while True:
            await asyncio.sleep(period)
            self.reap(self.clock.now_ns())

    async def _dispatch(self, instance: int) -> None:
        queue = self._queues[instance]
        wake = self._wake[instance]
        while True:
            await wake.wait()
            wake.clear()
            while queue:
                batch = queue[: self.rows]
                del queue[: len(batch)]
                await self._run(instance, batch)

    async def _run(self, instance: int, batch: list[Pending]) -> None:
        ready = []
        rows = []
        for p in batch:
            try:
                rows.append(self._model_inputs(p))
                ready.append(p)
            except Exception as exc:
                p.future.set_exception(exc)
        batch = ready
        if not batch:
            return
        slotted: list[Pending | None] = list(batch)
        if self._direct and self.max_batch_size > 0:
            slotted, rows = self._by_slot(batch, rows)
        start = self.clock.now_ns()
        try:
            results = await self._execute(instance, rows, [p is not None for p in slotted])
        except Exception as exc:
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
            return
        stats = self.inner.stats
        for p in batch:
            stats.queue.add(start - p.queued_ns)
        stats.record_execution(len(batch), 0, self.clock.now_ns() - start, 0, requests=len(batch))
        state_outputs = {s.output_name for s in self.spec.states}
        for maybe, out in zip(slotted, results, strict=True):
            if maybe is None:
                continue  # a null request's outputs go nowhere
            for st in self.spec.states:
                if st.output_name in out:
                    maybe.seq.state[st.input_name] = out[st.output_name]
            if not maybe.future.done():
                maybe.future.set_result({k: v for k, v in out.items() if k not in state_outputs})

    def _by_slot(
        self, batch: list[Pending], rows: list[TensorMap]
    ) -> tuple[list[Pending | None], list[TensorMap]]:
        """The batch in slot order (direct strategy): row i is slot i's request, or a null
        request up to the highest slot that has one."""
        by_slot = {p.seq.slot: (p, r) for p, r in zip(batch, rows, strict=True)}
        null = self._null_request(rows[0])
        slotted: list[Pending | None] = []
        ordered: list[TensorMap] = []
        for slot in range(max(by_slot) + 1):
            found = by_slot.get(slot)
            slotted.append(found[0] if found else None)
            ordered.append(found[1] if found else null)
        return slotted, ordered

    def _null_request(self, like: TensorMap) -> TensorMap:
        """Triton's null request: READY (and START, END) false, CORRID 0, zero inputs shaped as
        ``like``'s, the initial state."""
        inputs = {name: np.zeros_like(value) for name, value in like.items()}
        for value in inputs.values():
            if value.dtype.kind == "O":
                value[...] = b""
        for c in self.spec.controls:
            array = inputs[c.name]
            if c.kind == "CORRID":
                array[...] = b"" if array.dtype.kind == "O" else 0
            else:
                array[...] = c.values[0]
        for st in self.spec.states:
            inputs[st.input_name] = self._initial_state(st.datatype, st.dims, st.initial)
        return inputs

    async def _execute(self, instance: int, rows: list[TensorMap], real: list[bool]) -> list[TensorMap]:
        # rows run as one batch when the model takes a list of requests or their shapes are
        # equal; else one by one (and null requests, which only hold slots in a shared batch,
        # are then left out)
        shapes = {tuple((k, v.shape, v.dtype.str) for k, v in sorted(r.items())) for r in rows}
        if self.max_batch_size > 0 and (len(shapes) == 1 or not self.inner.merges_rows):
            return await self.inner.pool.run_on(instance, self.inner.execute_batch, rows)
        return [
            (await self.inner.pool.run_on(instance, self.inner.execute_batch, [r]))[0] if is_real else {}
            for r, is_real in zip(rows, real, strict=True)
        ]

    def _model_inputs(self, p: Pending) -> TensorMap:
        inputs = dict(p.inputs)
        lead = (1,) if self.max_batch_size > 0 else ()
        for c in self.spec.controls:
            if c.kind == "START":
                value = c.values[1] if p.start else c.values[0]
            elif c.kind == "END":
                value = c.values[1] if p.end else c.values[0]
            elif c.kind == "READY":
                value = c.values[1]
            else:
                value = p.seq.corr
                if isinstance(value, str) and c.datatype != "BYTES":
                    raise InvalidArgument(
                        f"sequence id {value!r} is a string, but model '{self.name}' takes its CORRID "
                        f"control '{c.name}' as {c.datatype}: use an integer id, or TYPE_STRING"
                    )
            dtype = to_numpy(c.datatype)
            array = (
                np.empty((*lead, 1), dtype=dtype) if dtype.kind == "O" else np.zeros((*lead, 1), dtype=dtype)
            )
            array[...] = str(value).encode() if dtype.kind == "O" else value
            inputs[c.name] = array
        for st in self.spec.states:
            state = None if p.start else p.seq.state.get(st.input_name)
            if state is None:
                state = self._initial_state(st.datatype, st.dims, st.initial)
            inputs[st.input_name] = state
        return inputs

    def _initial_state(self, datatype: str, dims: tuple[int, ...], initial: np.ndarray | None) -> np.ndarray:
        lead = (1,) if self.max_batch_size > 0 else ()
        if initial is not None:
            return initial.reshape((*lead, *initial.shape))
        return np.zeros((*lead, *(max(d, 1) for d in dims)), dtype=to_numpy(datatype))
