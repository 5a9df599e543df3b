"""Stateful models through the sequence batcher (Triton's sequence_batching)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np
import pytest

import flowserve
from flowserve.core.clock import MONOTONIC, Clock, FakeClock
from flowserve.core.errors import ErrorCode, FlowserveError
from flowserve.core.types import InferRequest
from flowserve.nodes.sequence import MAX_WAITING_STARTS_PER_CLIENT, SequenceBatcher

ROOT = Path(__file__).resolve().parents[2]


@contextlib.asynccontextmanager
async def _serving(tmp_path: Path, model: str, clock: Clock = MONOTONIC) -> AsyncIterator[flowserve.Engine]:
    """An engine serving one test model, from a copy of its directory."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "tests" / "models" / model, repo / model)
    eng = await flowserve.Engine.start(repo, clock=clock)
    try:
        yield eng
    finally:
        await eng.stop()


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[flowserve.Engine]:
    async with _serving(tmp_path, "sequence_accumulate") as eng:
        yield eng


async def step(
    engine: flowserve.Engine, corr: int | str, x: int, start: bool = False, end: bool = False
) -> list[int]:
    out = await engine.infer(
        "sequence_accumulate",
        {"INPUT": np.array([[x]], np.int32)},
        parameters={"sequence_id": corr, "sequence_start": start, "sequence_end": end},
    )
    return [int(out["OUTPUT"][0, 0]), int(out["CORRID_OUT"][0, 0])]


async def test_state_is_carried_and_reset_at_start(engine: flowserve.Engine) -> None:
    assert await step(engine, 7, 1, start=True) == [1, 7]
    assert await step(engine, 7, 2) == [3, 7]
    assert await step(engine, 7, 3, end=True) == [6, 7]
    assert await step(engine, 7, 10, start=True) == [10, 7]
    assert "ACC_OUT" not in await engine.infer(
        "sequence_accumulate", {"INPUT": np.array([[1]], np.int32)}, parameters={"sequence_id": 7}
    )


async def test_interleaved_sequences_stay_separate_and_ordered(engine: flowserve.Engine) -> None:
    async def run(corr: int, values: list[int]) -> list[int]:
        totals = []
        for i, v in enumerate(values):
            out = await step(engine, corr, v, start=i == 0, end=i == len(values) - 1)
            totals.append(out[0])
        return totals

    results = await asyncio.gather(*(run(c, [c] * 5) for c in range(1, 9)))
    assert results == [[c * k for k in range(1, 6)] for c in range(1, 9)]
    batcher = engine.registry.get("sequence_accumulate").executor.nodes[0]
    assert isinstance(batcher, SequenceBatcher)
    assert batcher._active == {}  # every sequence ended and released its slot


async def test_string_correlation_ids(engine: flowserve.Engine) -> None:
    # this model takes CORRID as UINT64, so a string id is refused for that request only
    with pytest.raises(FlowserveError, match="sequence id 'user-42' is a string, but model") as info:
        await engine.infer(
            "sequence_accumulate",
            {"INPUT": np.array([[4]], np.int32)},
            parameters={"sequence_id": "user-42", "sequence_start": True},
        )
    assert info.value.code is ErrorCode.INVALID_ARG
    assert await step(engine, 3, 4, start=True) == [4, 3]


async def test_missing_id_and_missing_start_are_clear_errors(engine: flowserve.Engine) -> None:
    x = {"INPUT": np.array([[1]], np.int32)}
    with pytest.raises(FlowserveError, match="must specify a non-zero or non-empty correlation ID") as info:
        await engine.infer("sequence_accumulate", x)
    assert info.value.code is ErrorCode.INVALID_ARG
    with pytest.raises(FlowserveError, match="must specify the START flag on the first request") as info:
        await engine.infer("sequence_accumulate", x, parameters={"sequence_id": 99})
    assert info.value.code is ErrorCode.INVALID_ARG


async def test_idle_sequence_is_released_with_a_clear_error(tmp_path: Path) -> None:
    clock = FakeClock(1_000_000)
    async with _serving(tmp_path, "sequence_accumulate", clock) as engine:
        assert await step(engine, 5, 1, start=True) == [1, 5]
        batcher = engine.registry.get("sequence_accumulate").executor.nodes[0]
        assert isinstance(batcher, SequenceBatcher)
        clock.advance(200_000 * 1000 + 1)  # past the model's idle limit (200 ms)
        # the reaper's own period is loop time (every 100 ms here): one pass at most, not the limit
        for _ in range(1000):
            if 5 not in batcher._active:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(FlowserveError, match="was released after being idle"):
            await step(engine, 5, 2)


async def test_a_sequence_stays_on_one_instance(engine: flowserve.Engine) -> None:
    batcher = engine.registry.get("sequence_accumulate").executor.nodes[0]
    assert isinstance(batcher, SequenceBatcher)
    await step(engine, 1, 1, start=True)
    await step(engine, 2, 1, start=True)
    assert {batcher._active[1].instance, batcher._active[2].instance} == {0, 1}
    instance = batcher._active[1].instance
    for _ in range(3):
        await step(engine, 1, 1)
        assert batcher._active[1].instance == instance


@pytest.fixture
async def slots_engine(tmp_path: Path) -> AsyncIterator[flowserve.Engine]:
    async with _serving(tmp_path, "sequence_slots") as eng:
        yield eng


async def test_direct_strategy_keeps_each_sequence_in_its_batch_slot(slots_engine: flowserve.Engine) -> None:
    """The model keeps its sums per slot: right only if a sequence's requests always run in the
    same row, with null requests (READY 0) holding the empty rows below it, as Triton does."""

    async def send(
        corr: int, x: int, start: bool = False, end: bool = False, width: int = 1
    ) -> tuple[int, int, list[int]]:
        values = np.zeros((1, width), np.int32)
        values[0, 0] = x
        out = await slots_engine.infer(
            "sequence_slots",
            {"INPUT": values},
            parameters={"sequence_id": corr, "sequence_start": start, "sequence_end": end},
        )
        return int(out["OUTPUT"][0, 0]), int(out["SLOT"][0, 0]), [int(v) for v in out["READIES"][0]]

    assert await send(10, 1, start=True) == (1, 0, [1, -1, -1, -1])
    assert await send(20, 5, start=True) == (5, 1, [0, 1, -1, -1])  # slot 0 is held by a null request
    assert await send(30, 7, start=True) == (7, 2, [0, 0, 1, -1])
    assert await send(20, 5, end=True) == (10, 1, [0, 1, -1, -1])  # 20 ends: slot 1 is free again
    assert await send(30, 1) == (8, 2, [0, 0, 1, -1])
    assert await send(40, 100, start=True) == (100, 1, [0, 1, -1, -1])  # the lowest free slot
    assert await send(10, 2) == (3, 0, [1, -1, -1, -1])
    # concurrent requests of three sequences run as one batch, each in its own row, even with
    # inputs of different shapes (a python model takes a list of requests)
    results = await asyncio.gather(send(30, 1), send(10, 1, width=3), send(40, 1, width=2))
    assert [r[:2] for r in results] == [(9, 2), (4, 0), (101, 1)]
    assert all(r[2] == [1, 1, 1, -1] for r in results)
    stats = slots_engine.registry.get("sequence_slots").stats
    assert stats.inference_count == 10  # null requests are not counted as inferences


# ---------------------------------------------------------------- slots: idle release, fairness

A, B = "10.0.0.1", "10.0.0.2"  # two clients (Context.peer)


async def start_from(engine: flowserve.Engine, peer: str, corr: int, x: int = 1) -> int:
    """A sequence START from client ``peer``; the running sum it answers."""
    request = InferRequest(
        "sequence_accumulate",
        {"INPUT": np.array([[x]], np.int32)},
        parameters={"sequence_id": corr, "sequence_start": True},
        peer=peer,
    )
    response = await engine.infer_request(request)
    return int(response.outputs["OUTPUT"][0, 0])


def sequence_batcher(engine: flowserve.Engine) -> SequenceBatcher:
    batcher = engine.registry.get("sequence_accumulate").executor.nodes[0]
    assert isinstance(batcher, SequenceBatcher)
    return batcher


async def settle(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    """Let the loop run (the reaper's period is loop time) until ``condition`` holds."""
    for _ in range(int(seconds / 0.01)):
        if condition():
            return True
        await asyncio.sleep(0.01)
    return condition()


async def test_never_ended_sequences_lose_their_slots_after_the_idle_time(tmp_path: Path) -> None:
    """The attack: one client fills every slot with STARTs it never ends, and queues many more;
    another client's START gets the first slot freed, once the idle time has passed."""
    clock = FakeClock(1_000_000)
    async with _serving(tmp_path, "sequence_accumulate", clock) as engine:
        batcher = sequence_batcher(engine)
        assert batcher.capacity == 8  # 2 instances x max_batch_size 4
        for corr in range(1, 9):
            assert await start_from(engine, A, corr) == 1
        backlog = [asyncio.create_task(start_from(engine, A, corr)) for corr in range(100, 120)]
        other = asyncio.create_task(start_from(engine, B, 7777, 5))
        await asyncio.sleep(0.3)  # loop time only: the fake clock has not moved, nothing is idle
        assert not other.done() and not any(t.done() for t in backlog)
        clock.advance(200_000 * 1000 + 1)  # past the model's idle limit (200 ms)
        assert await settle(other.done)
        assert other.result() == 5
        assert set(batcher._active) == {7777, *range(100, 107)}  # the rest of A's wait on
        # the seven that got a slot answer (each runs the model; a busy machine takes a while)
        assert await settle(lambda: sum(t.done() for t in backlog) >= 7)
        assert sum(not t.done() for t in backlog) == 13
        for task in backlog:
            task.cancel()
        await asyncio.gather(*backlog, return_exceptions=True)
        assert batcher._waiting == [] and batcher._waiting_of == {}


async def test_one_client_may_have_only_so_many_starts_waiting(tmp_path: Path) -> None:
    async with _serving(tmp_path, "sequence_accumulate", FakeClock()) as engine:
        batcher = sequence_batcher(engine)
        for corr in range(1, 9):
            await start_from(engine, A, corr)
        waiting = [
            asyncio.create_task(start_from(engine, A, corr))
            for corr in range(100, 100 + MAX_WAITING_STARTS_PER_CLIENT)
        ]
        await settle(lambda: len(batcher._waiting) == MAX_WAITING_STARTS_PER_CLIENT)
        with pytest.raises(
            FlowserveError, match=r"all 8 sequence slots are taken and client 10\.0\.0\.1"
        ) as info:
            await start_from(engine, A, 999)
        assert info.value.code is ErrorCode.UNAVAILABLE
        other = asyncio.create_task(start_from(engine, B, 555))  # another client still waits its turn
        await settle(lambda: len(batcher._waiting) == MAX_WAITING_STARTS_PER_CLIENT + 1)
        assert not other.done()
        for task in [*waiting, other]:
            task.cancel()
        await asyncio.gather(*waiting, other, return_exceptions=True)


async def test_a_freed_slot_goes_to_the_client_holding_the_fewest(tmp_path: Path) -> None:
    async with _serving(tmp_path, "sequence_accumulate", FakeClock()) as engine:
        batcher = sequence_batcher(engine)
        for corr in range(1, 9):
            await start_from(engine, A, corr)
        first = asyncio.create_task(start_from(engine, A, 100))  # waits first...
        await settle(lambda: len(batcher._waiting) == 1)
        second = asyncio.create_task(start_from(engine, B, 200))  # ...but B holds no slot
        await settle(lambda: len(batcher._waiting) == 2)
        await step(engine, 3, 1, end=True)  # A ends one of its sequences: one slot is free
        assert await second == 1
        assert not first.done()
        await step(engine, 4, 1, end=True)
        assert await first == 1


def test_reap_releases_the_idle_least_recently_used_first() -> None:
    from flowserve.spec.sequence import SequenceSpec

    class Inner:
        name = "m"

    clock = FakeClock()
    batcher = SequenceBatcher(Inner(), SequenceSpec(max_sequence_idle_us=1000), 4, clock)  # type: ignore[arg-type]
    batcher._load, batcher._free_rows, batcher._next_row = [0], [[]], [0]
    for corr in (1, 2, 3):
        batcher._open(corr, A)
        clock.advance(400_000)
    batcher._active[1].busy = 1  # a request of it runs: never idle
    batcher._active.move_to_end(2)  # 2 was used last
    clock.advance(700_000)  # 1: 1.9 ms, 3: 1.1 ms, 2: 1.5 ms since they were last used
    assert batcher.reap(clock.now_ns()) == [3, 2]
    assert list(batcher._active) == [1] and batcher._free_rows == [[1, 2]] and batcher._held == {A: 1}


def test_an_unset_idle_time_is_tritons_default_of_one_second() -> None:
    from flowserve.spec.sequence import sequence_from_config
    from flowserve.spec.triton import parse_config_text

    config = parse_config_text("max_batch_size: 4\nsequence_batching { direct { } }")
    spec = sequence_from_config(config)
    assert spec is not None and spec.max_sequence_idle_us == 1_000_000
