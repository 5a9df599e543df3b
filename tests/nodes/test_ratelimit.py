"""Triton's rate limiter: the pure choice, the limiter's waiting and priorities, the
config.pbtxt settings, and two models sharing one resource of count 1 never running at once
(proved with a shared counter and a gate the test holds, not with timing)."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import threading
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import flowserve
from flowserve.core.errors import InvalidArgument
from flowserve.nodes.backends import autocompletions
from flowserve.nodes.instances import InstancePool
from flowserve.nodes.ratelimit import RateLimiter, ResourceLimit, instance_needs, parse_resource_limit, pick
from flowserve.spec.repository import scan_model
from flowserve.spec.schema import InstanceSpec, ModelSpec, ResourceSpec

# ------------------------------------------------------------------------ pure parts


def test_pick_takes_the_fitting_waiter_with_the_fewest_scaled_executions() -> None:
    r1 = ("R", 0)
    free = {r1: 1}
    assert pick([], free) is None
    assert pick([({r1: 2}, 0)], free) is None  # does not fit
    assert pick([({r1: 1}, 5), ({r1: 1}, 3), ({r1: 1}, 3)], free) == 1  # fewest; oldest on a tie
    assert pick([({r1: 2}, 0), ({r1: 1}, 9)], free) == 1  # the one that fits, even if it ran more
    assert pick([({}, 7), ({r1: 1}, 1)], free) == 1


def test_parse_resource_limit() -> None:
    assert parse_resource_limit("R1:4") == ResourceLimit("R1", 4, None)
    assert parse_resource_limit("R1:4:1") == ResourceLimit("R1", 4, 1)
    for bad in ("R1", ":4", "R1:x", "R1:-1", "R1:1:2:3"):
        with pytest.raises(InvalidArgument, match="NAME:COUNT"):
            parse_resource_limit(bad)


def _model(*groups: InstanceSpec, name: str = "m") -> ModelSpec:
    return ModelSpec(
        name=name,
        source="",
        backend="python",
        platform="",
        max_batch_size=0,
        inputs=(),
        outputs=(),
        versions={},
        instances=groups,
    )


def test_instance_needs_follow_the_groups_and_devices() -> None:
    model = _model(
        InstanceSpec(
            count=1, kind="KIND_CPU", resources=(ResourceSpec("R", 2), ResourceSpec("G", 1, True)), priority=2
        ),
        InstanceSpec(count=2, kind="KIND_GPU", gpus=(0, 1), resources=(ResourceSpec("R", 1),)),
        InstanceSpec(count=1, kind="KIND_CPU"),
    )
    assert instance_needs(model, 0) == ({("R", 0): 2, ("G", None): 1}, 2)
    assert instance_needs(model, 1) == ({("R", 0): 1}, 0)
    assert instance_needs(model, 2) == ({("R", 1): 1}, 0)  # round-robin over the group's GPUs
    assert instance_needs(model, 3) == ({}, 0)


def test_config_pbtxt_rate_limiter_reaches_the_spec(tmp_path: Path) -> None:
    _python_model(tmp_path, "m", "R", count=2, priority=3, extra='{ name: "G" global: true count: 5 }')
    scan = scan_model(tmp_path / "m", autocompletions())
    assert not scan.issues, scan.issues
    group = scan.models["m"].instances[0]
    assert group.count == 2 and group.priority == 3
    assert group.resources == (ResourceSpec("R", 1, False), ResourceSpec("G", 5, True))


# ------------------------------------------------------------------------ the limiter


async def _until(check: object, what: str, seconds: float = 10.0) -> None:
    """Wait (bounded) until ``check()`` holds."""
    for _ in range(int(seconds / 0.005)):
        if check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


async def test_tickets_wait_for_shared_resources_and_priorities_order_them() -> None:
    limiter = RateLimiter()
    spec = (ResourceSpec("R", 1),)
    [a] = limiter.tickets(_model(InstanceSpec(resources=spec), name="a"), 1)
    [b] = limiter.tickets(_model(InstanceSpec(resources=spec, priority=1), name="b"), 1)
    [c] = limiter.tickets(_model(InstanceSpec(resources=spec, priority=4), name="c"), 1)
    assert a is not None and b is not None and c is not None
    assert limiter.capacity == {("R", 0): 1}
    await a.acquire()
    assert limiter.free == {("R", 0): 0}
    order: list[str] = []

    async def run(ticket: object, name: str) -> None:
        await ticket.acquire()  # type: ignore[attr-defined]
        order.append(name)

    waiting = [asyncio.create_task(run(t, n)) for t, n in ((c, "c"), (b, "b"))]
    await _until(lambda: limiter.waiting == 2, "two waiters")
    c.executions = b.executions = 1  # scaled: c = 4, b = 1: b goes first though c waited longer
    a.release()
    await _until(lambda: order == ["b"], "b to run")
    assert limiter.waiting == 1
    b.release()
    await asyncio.gather(*waiting)
    assert order == ["b", "c"]
    c.release()
    assert limiter.free == {("R", 0): 1} and limiter.waiting == 0


async def test_a_cancelled_waiter_leaves_no_trace() -> None:
    limiter = RateLimiter()
    [a, b] = limiter.tickets(_model(InstanceSpec(count=2, resources=(ResourceSpec("R", 1),))), 2)
    assert a is not None and b is not None
    await a.acquire()
    task = asyncio.create_task(b.acquire())
    await _until(lambda: limiter.waiting == 1, "a waiter")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert limiter.waiting == 0
    a.release()
    assert limiter.free == {("R", 0): 1}


def test_an_instance_needing_more_than_exists_fails_to_load() -> None:
    limiter = RateLimiter([ResourceLimit("R", 1)])
    with pytest.raises(
        InvalidArgument, match=r"needs 2 of rate limiter resource 'R' \(device 0\), but only 1"
    ):
        limiter.tickets(_model(InstanceSpec(resources=(ResourceSpec("R", 2),))), 1)
    # a larger limit is used as given; without one, the most any instance asks for
    limiter = RateLimiter([ResourceLimit("R", 3, 0)])
    limiter.tickets(_model(InstanceSpec(resources=(ResourceSpec("R", 2), ResourceSpec("S", 2)))), 1)
    limiter.tickets(_model(InstanceSpec(resources=(ResourceSpec("S", 4),))), 1)
    assert limiter.capacity == {("R", 0): 3, ("S", 0): 4} and limiter.free == limiter.capacity
    # no resources: no ticket (such instances never wait)
    assert limiter.tickets(_model(InstanceSpec(count=2)), 2) == [None, None]


# ------------------------------------------------------------------------ two models, one resource


def _python_model(
    root: Path, name: str, resource: str, count: int = 1, priority: int = 0, extra: str = ""
) -> None:
    model = root / name
    (model / "1").mkdir(parents=True)
    resources = f'{{ name: "{resource}" count: 1 }}' + (f", {extra}" if extra else "")
    (model / "config.pbtxt").write_text(
        textwrap.dedent(f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        instance_group [ {{ kind: KIND_CPU count: {count}
                           rate_limiter {{ resources [ {resources} ] priority: {priority} }} }} ]
        """)
    )
    (model / "1" / "model.py").write_text(
        textwrap.dedent("""
        import triton_python_backend_utils as pb_utils
        import ratelimit_probe as probe

        class TritonPythonModel:
            def execute(self, requests):
                with probe.lock:
                    probe.active += 1
                    probe.max_active = max(probe.max_active, probe.active)
                try:
                    probe.gate.wait(20)  # held by the test
                finally:
                    with probe.lock:
                        probe.active -= 1
                out = []
                for request in requests:
                    x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                    out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
                return out
        """)
    )


@pytest.fixture
def probe() -> Iterator[types.SimpleNamespace]:
    """The state both models' executions share (a module their model.py files import)."""
    state = types.SimpleNamespace(lock=threading.Lock(), active=0, max_active=0, gate=threading.Event())
    module = types.ModuleType("ratelimit_probe")
    module.__dict__.update(vars(state))
    sys.modules["ratelimit_probe"] = module
    try:
        yield module  # type: ignore[misc]
    finally:
        module.gate.set()
        sys.modules.pop("ratelimit_probe", None)


@pytest.fixture
def two_models(tmp_path: Path) -> Path:
    _python_model(tmp_path, "first", "GPU_SLOT", count=2)
    _python_model(tmp_path, "second", "GPU_SLOT", count=2)
    return tmp_path


def _x(i: int) -> dict[str, np.ndarray]:
    return {"X": np.array([i], np.int32)}


async def test_two_models_sharing_a_resource_of_one_never_run_at_once(
    two_models: Path, probe: types.SimpleNamespace
) -> None:
    limiter = RateLimiter()
    engine = await flowserve.Engine.start(two_models, rate_limiter=limiter)
    try:
        assert limiter.capacity == {("GPU_SLOT", 0): 1}
        # one request each: the first to start holds the only GPU_SLOT; the other waits in the
        # limiter (observed there, not inferred from time) until the first has finished
        first = asyncio.create_task(engine.infer("first", _x(1)))
        second = asyncio.create_task(engine.infer("second", _x(2)))
        await _until(lambda: probe.active == 1, "one execution to start")
        await _until(lambda: limiter.waiting == 1, "the other to wait for GPU_SLOT")
        assert probe.active == 1 and probe.max_active == 1
        probe.gate.set()
        outputs = await asyncio.gather(first, second)
        assert [int(o["Y"][0]) for o in outputs] == [1, 2]
        # many requests over both models and all four instances: still one at a time
        results = await asyncio.gather(*(engine.infer(("first", "second")[i % 2], _x(i)) for i in range(40)))
        assert [int(r["Y"][0]) for r in results] == list(range(40))
        assert probe.max_active == 1 and limiter.waiting == 0
        assert limiter.free == {("GPU_SLOT", 0): 1}
    finally:
        await engine.stop()


async def test_without_the_rate_limiter_the_same_models_do_run_at_once(
    two_models: Path, probe: types.SimpleNamespace
) -> None:
    """The control for the test above: the setup can run both at once, and does."""
    engine = await flowserve.Engine.start(two_models)
    try:
        calls = [asyncio.create_task(engine.infer(name, _x(i))) for i, name in enumerate(("first", "second"))]
        await _until(lambda: probe.active == 2, "both executions to run at once")
        probe.gate.set()
        await asyncio.gather(*calls)
        assert probe.max_active == 2
    finally:
        await engine.stop()


async def test_a_resource_limit_too_small_fails_the_model_load(
    two_models: Path, probe: types.SimpleNamespace
) -> None:
    probe.gate.set()
    engine = await flowserve.Engine.start(
        two_models, rate_limiter=RateLimiter([ResourceLimit("GPU_SLOT", 0)])
    )
    try:
        assert not engine.model_ready("first")
        reasons = [s.reason for s in engine.registry.index() if s.name == "first"]
        assert any("needs 1 of rate limiter resource 'GPU_SLOT'" in r for r in reasons), reasons
    finally:
        await engine.stop()


async def test_the_server_option_turns_the_limiter_on(two_models: Path, probe: types.SimpleNamespace) -> None:
    from flowserve.server import Server, ServerOptions

    probe.gate.set()
    options = ServerOptions(
        model_repositories=[two_models],
        http_port=-1,
        grpc_port=-1,
        metrics_port=-1,
        rate_limit="execution_count",
        rate_limit_resources=[parse_resource_limit("GPU_SLOT:2")],
    )
    server = Server(options)
    plane = await server.start()
    try:
        limiter = plane.engine.rate_limiter
        assert limiter is not None and limiter.capacity == {("GPU_SLOT", 0): 2}
        out = await plane.engine.infer("first", _x(3))
        assert int(out["Y"][0]) == 3
    finally:
        await server.stop()
    server = Server(
        ServerOptions(model_repositories=[two_models], http_port=-1, grpc_port=-1, metrics_port=-1)
    )
    plane = await server.start()
    try:
        assert plane.engine.rate_limiter is None  # off by default
    finally:
        await server.stop()


async def test_a_limited_calls_resources_come_back_when_its_caller_gives_up() -> None:
    """Given back when the call is over on its thread: at once for a call its caller gave up
    before it started, when it returns for one that was running (never while it runs)."""
    limiter = RateLimiter()
    [a] = limiter.tickets(_model(InstanceSpec(resources=(ResourceSpec("R", 1),))), 1)
    assert a is not None
    pool: InstancePool[int] = InstancePool("limited")
    await pool.add(lambda i: i)
    pool.limit([a])
    entered, release = threading.Event(), threading.Event()

    def hold(instance: int, _: object) -> int:
        entered.set()
        release.wait(10)
        return instance

    running = asyncio.ensure_future(pool.run_on(0, hold, None))
    assert await asyncio.to_thread(entered.wait, 10)
    queued = asyncio.ensure_future(pool.run_on(0, lambda instance, _: instance, None))
    await _until(lambda: limiter.waiting == 1, "a waiter for the resource")
    queued.cancel()
    running.cancel()
    for task in (queued, running):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert limiter.free == {("R", 0): 0}  # the running call still holds it
    release.set()
    await _until(lambda: limiter.free == {("R", 0): 1}, "the resource back")
    assert await pool.run(lambda instance, _: instance + 1, None) == 1
    await pool.close()
