"""Instance pools: inline policy (pure), and where calls really run."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import pytest

from flowserve.nodes.instances import InlinePolicy, InstancePool, Worker


def test_policy_probes_then_inlines_cheap_calls() -> None:
    policy = InlinePolicy(threshold_ns=100_000, probe=3)
    for _ in range(3):
        assert not policy.inline()
        policy.observe(10_000)
    assert policy.inline()


def test_policy_keeps_slow_calls_on_threads() -> None:
    policy = InlinePolicy(threshold_ns=100_000, probe=2)
    for _ in range(5):
        policy.observe(500_000)
    assert not policy.inline()


def test_a_slow_call_backs_off_in_proportion() -> None:
    policy = InlinePolicy(threshold_ns=100_000, probe=1)
    for _ in range(10):
        policy.observe(20_000)
    assert policy.inline()
    policy.observe(50_000_000)  # one call of 50 ms
    off = 0
    while not policy.inline():
        policy.observe(20_000)  # the calls on the thread stay cheap
        off += 1
    assert 30 <= off <= 60
    policy.observe(2_000_000)  # a 2 ms preemption costs only a few calls
    off = 0
    while not policy.inline():
        policy.observe(20_000)
        off += 1
    assert 1 <= off <= 15


def test_calls_slowed_on_the_thread_are_reprobed_on_the_loop() -> None:
    # timed on its thread, a cheap call looks slow (it waited for the GIL): every 4th call is
    # tried on the loop, and a cheap time there brings the node back for good
    policy = InlinePolicy(threshold_ns=100_000, probe=1, reprobe_every=4, reprobe_below_ns=10_000_000)
    policy.observe(3_000_000)
    decisions = []
    for _ in range(8):
        decisions.append(policy.inline())
        if not decisions[-1]:
            policy.observe(3_000_000)
    assert decisions == [False, False, False, True, False, False, False, True]
    policy.observe_inline(50_000)
    assert all(policy.inline() for _ in range(10))


def test_a_slow_reprobe_keeps_the_node_on_its_thread() -> None:
    policy = InlinePolicy(threshold_ns=100_000, probe=1, reprobe_every=2, reprobe_below_ns=10_000_000)
    policy.observe(3_000_000)
    assert not policy.inline()
    assert policy.inline()  # the re-probe
    policy.observe_inline(2_000_000)
    assert not policy.inline()


def test_slow_reprobes_back_off_and_a_cheap_one_resets_them() -> None:
    policy = InlinePolicy(threshold_ns=100_000, probe=1, reprobe_every=2, reprobe_most=8)
    policy.observe(3_000_000)

    def gaps(n: int) -> list[int]:
        found, since = [], 0
        while len(found) < n:
            since += 1
            if policy.inline():
                found.append(since)
                since = 0
                policy.observe_inline(2_000_000)  # still slow on the loop
            else:
                policy.observe(3_000_000)
        return found

    assert gaps(5) == [2, 4, 8, 8, 8]  # doubled after each slow re-probe, up to reprobe_most
    while not policy.inline():
        policy.observe(3_000_000)
    policy.observe_inline(50_000)  # cheap: inline from now on
    assert all(policy.inline() for _ in range(10))
    policy.observe(3_000_000)
    policy.observe(3_000_000)  # slow again on its thread
    assert gaps(2) == [2, 4]  # the interval started over


def test_nodes_slower_than_the_reprobe_bound_never_run_inline() -> None:
    policy = InlinePolicy(threshold_ns=100_000, probe=1, reprobe_every=2, reprobe_below_ns=10_000_000)
    policy.observe(50_000_000)
    assert not any(policy.inline() for _ in range(20))


def test_zero_threshold_never_inlines() -> None:
    policy = InlinePolicy(threshold_ns=0, probe=0)
    policy.observe(1)
    assert not policy.inline()


async def test_cheap_calls_move_onto_the_loop_and_slow_ones_stay_off() -> None:
    loop_thread = threading.get_ident()
    pool: InstancePool[str] = InstancePool("t", inline=True)
    await pool.add(lambda i: f"instance{i}")
    seen: list[bool] = []

    def cheap(instance: str, arg: int) -> int:
        seen.append(threading.get_ident() == loop_thread)
        return arg + 1

    results = [await pool.run(cheap, n) for n in range(20)]
    assert results == list(range(1, 21))
    assert seen[:8] == [False] * 8  # probing on the worker thread
    assert all(seen[8:])  # then inline

    def slow(instance: str, arg: int) -> int:
        seen.append(threading.get_ident() == loop_thread)
        time.sleep(0.02)  # 20 ms: 20x the threshold
        return arg

    seen.clear()
    for n in range(5):
        await pool.run(slow, n)
    assert seen[0] is True  # the first slow call was inline (the average was low) ...
    assert not any(seen[1:])  # ... and sent every later one back to the thread
    await pool.close()


async def test_pool_without_inline_always_uses_its_thread() -> None:
    pool: InstancePool[int] = InstancePool("t")
    await pool.add(lambda i: i)
    loop_thread = threading.get_ident()
    threads = {await pool.run(lambda inst, _: threading.get_ident(), None) for _ in range(20)}
    assert loop_thread not in threads and len(threads) == 1
    await pool.close()


async def test_n_instances_run_concurrently() -> None:
    pool: InstancePool[int] = InstancePool("t")
    for _ in range(3):
        await pool.add(lambda i: i)
    barrier = threading.Barrier(3, timeout=10)

    def meet(instance: int, _: object) -> int:
        barrier.wait()  # all three must be inside at once
        return instance

    results = await asyncio.gather(*(pool.run(meet, None) for _ in range(3)))
    assert sorted(results) == [0, 1, 2]  # type: ignore[type-var]
    await pool.close()


def test_likely_inline_answers_as_inline_without_counting() -> None:
    policy = InlinePolicy(threshold_ns=100_000, probe=2, reprobe_every=2)
    assert not policy.likely_inline()  # still probing
    policy.observe(10_000)
    policy.observe(10_000)
    assert policy.likely_inline() and policy.inline()
    policy.observe(50_000_000)  # slow: over the threshold, a re-probe may or may not come
    assert not policy.likely_inline()
    assert not policy.likely_inline()  # asking did not count towards the re-probe
    assert not policy.inline()
    assert policy.inline()  # the re-probe, on the second call as configured
    assert not InlinePolicy(threshold_ns=0, probe=0).likely_inline()


async def test_a_worker_runs_calls_on_its_thread_in_order_and_hands_back_errors() -> None:
    worker = Worker("w")
    try:
        seen: list[int] = []
        results = await asyncio.gather(
            *(worker.call(lambda i: seen.append(i) or i * 2, i) for i in range(50))
        )
        assert results == [i * 2 for i in range(50)] and seen == list(range(50))
        assert await worker.call(threading.current_thread) is not threading.current_thread()
        assert (await worker.call(lambda: threading.current_thread().name)) == "w_0"
        with pytest.raises(ZeroDivisionError):
            await worker.call(lambda: 1 / 0)
    finally:
        worker.shutdown()


async def _blocked(worker: Worker) -> tuple[threading.Event, threading.Event, asyncio.Task[None]]:
    """A first call holding the worker's thread until ``release`` is set."""
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        release.wait(10)

    first = asyncio.ensure_future(worker.call(hold))
    assert await asyncio.to_thread(entered.wait, 10)
    return entered, release, first


async def test_a_call_cancelled_before_its_thread_took_it_never_runs() -> None:
    worker = Worker("w")
    try:
        _, release, first = await _blocked(worker)
        ran: list[str] = []
        second = asyncio.ensure_future(worker.call(ran.append, "second"))
        await asyncio.sleep(0.01)
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        release.set()
        await first
        assert await worker.call(ran.append, "third") is None
        assert ran == ["third"]
    finally:
        worker.shutdown()


async def test_shutdown_drops_the_queued_calls_and_lets_the_running_one_finish() -> None:
    worker = Worker("w")
    _, release, first = await _blocked(worker)
    ran: list[str] = []
    queued = [asyncio.ensure_future(worker.call(ran.append, str(i))) for i in range(3)]
    await asyncio.sleep(0.01)
    worker.shutdown()
    release.set()
    await first
    for call in queued:
        with pytest.raises(asyncio.CancelledError):
            await call
    assert ran == []
    with pytest.raises(RuntimeError, match="shut down"):
        await worker.call(ran.append, "late")


async def test_an_abandoned_instance_serves_again_once_its_call_returns() -> None:
    """A caller that gives up on a running call leaves the instance out of the pool until the
    call returns on its thread; a call not started yet is dropped and the instance kept."""
    pool: InstancePool[int] = InstancePool("t")
    await pool.add(lambda i: i)
    entered, release = threading.Event(), threading.Event()

    def hold(instance: int, _: object) -> int:
        entered.set()
        release.wait(10)
        return instance

    running = asyncio.ensure_future(pool.run(hold, None))
    assert await asyncio.to_thread(entered.wait, 10)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert pool.abandoned == 1
    waiting = asyncio.ensure_future(pool.run(lambda instance, _: instance + 100, None))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # no free instance while the abandoned call runs
    release.set()
    assert await asyncio.wait_for(waiting, 10) == 100
    assert pool.abandoned == 0
    await pool.close()


def test_a_worker_never_shut_down_does_not_hold_the_interpreter_at_exit() -> None:
    code = (
        "import asyncio\n"
        "from flowserve.nodes.instances import Worker\n"
        "worker = Worker('left')\n"
        "print(asyncio.run(worker.call(sum, [1, 2])))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "3", done.stderr
