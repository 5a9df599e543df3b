"""Instance pools: inline policy (pure), and where calls really run."""

from __future__ import annotations

import asyncio
import threading
import time

from flowserve.nodes.instances import InlinePolicy, InstancePool


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
