"""The pure parts of the reliability work, in process: shape and size checks, admission bounds,
restricted-API parsing and categories, override files and symbolic links, and an instance
pool that keeps an abandoned (hung) instance out of service until its call returns."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from flowserve.core.errors import InvalidArgument, ResourceExhausted, Unavailable
from flowserve.core.limits import MAX_RANK, Limits, check_shape
from flowserve.core.wire import check_shm_size, from_list, from_raw
from flowserve.dataplane.access import CATEGORIES, GRPC_HEADER_PREFIX, Restrictions
from flowserve.dataplane.admission import Admission
from flowserve.frontends.grpc.access import grpc_category
from flowserve.frontends.http.app import MODEL_ACTIONS, SECTIONS, path_category
from flowserve.nodes.instances import InstancePool
from flowserve.spec.repository import check_model_name, write_override_files

SMALL = Limits(max_request_bytes=1 << 20, max_tensor_elements=100, max_bytes_element=8)

# ------------------------------------------------------------------ limits


@pytest.mark.parametrize(
    "shape,error",
    [
        ([101], ResourceExhausted),
        ([10, 11], ResourceExhausted),
        ([0, 10**20], ResourceExhausted),
        ([2**63 - 1, 2**63 - 1], ResourceExhausted),
        ([-1], InvalidArgument),
        ([1.0], InvalidArgument),
        ([True], InvalidArgument),
        (["3"], InvalidArgument),
        ([None], InvalidArgument),
        ([1] * (MAX_RANK + 1), InvalidArgument),
    ],
)
def test_check_shape_refuses(shape: list[object], error: type[Exception]) -> None:
    with pytest.raises(error, match="input 'x'"):
        check_shape("x", shape, SMALL)


def test_check_shape_counts() -> None:
    assert check_shape("x", [], SMALL) == 1
    assert check_shape("x", [10, 10], SMALL) == 100
    assert check_shape("x", [0, 100], SMALL) == 0
    assert check_shape("x", (np.int64(4), np.int32(5)), SMALL) == 20


def test_bytes_element_limit_raw_and_list() -> None:
    ok = b"\x08\x00\x00\x00" + b"a" * 8
    assert from_raw("s", "BYTES", [1], ok, SMALL).tolist() == [b"a" * 8]
    with pytest.raises(ResourceExhausted, match="BYTES element 0 has 9 bytes"):
        from_raw("s", "BYTES", [1], b"\x09\x00\x00\x00" + b"a" * 9, SMALL)
    with pytest.raises(ResourceExhausted, match="BYTES element 0 has 4294967295 bytes"):
        from_raw("s", "BYTES", [1], b"\xff\xff\xff\xff", SMALL)
    with pytest.raises(ResourceExhausted, match="BYTES element 1"):
        from_list("s", "BYTES", [2], ["ok", "x" * 9], SMALL)


def test_shm_size_checked_before_copy() -> None:
    check_shm_size("x", "INT32", [2, 3], 24, SMALL)
    with pytest.raises(InvalidArgument, match="got 4096 bytes of shared memory"):
        check_shm_size("x", "INT32", [2, 3], 4096, SMALL)
    with pytest.raises(ResourceExhausted):
        check_shm_size("x", "FP32", [2**40], 4, SMALL)
    check_shm_size("s", "BYTES", [2], 2 * (4 + 8), SMALL)
    with pytest.raises(InvalidArgument, match="more than 2 BYTES elements can take"):
        check_shm_size("s", "BYTES", [2], 2 * (4 + 8) + 1, SMALL)


# ------------------------------------------------------------------ admission


def test_admission_bounds_server_and_model() -> None:
    gate = Admission(max_in_flight=3, max_per_model=2)
    gate.enter("a")
    gate.enter("a")
    with pytest.raises(Unavailable, match="model 'a' overloaded"):
        gate.enter("a")
    gate.enter("b")
    with pytest.raises(Unavailable, match="server overloaded"):
        gate.enter("c")
    assert gate.rejected == 2 and gate.in_flight == 3
    gate.leave("a")
    gate.enter("c")
    for model in ("a", "b", "c"):
        gate.leave(model)
    assert gate.in_flight == 0 and gate.model_in_flight("a") == 0


def test_admission_unbounded() -> None:
    gate = Admission(0, 0)
    for _ in range(10_000):
        gate.enter("m")
    assert gate.in_flight == 10_000


# ------------------------------------------------------------------ restricted APIs


def test_restrictions_parse() -> None:
    r = Restrictions.parse(["model-repository,trace:Admin-Key=v=1", "inference:k=x"])
    assert set(r.by_category) == {"model-repository", "trace", "inference"}
    assert r.by_category["trace"].header == "admin-key" and r.by_category["trace"].value == "v=1"
    assert r.denial("trace", {"admin-key": "v=1"}.get) is None
    assert r.denial("trace", {}.get) == "This API is restricted, expecting header 'admin-key'"
    assert r.denial("health", {}.get) is None and r.denial(None, {}.get) is None
    g = Restrictions.parse(["logging:key=v"], GRPC_HEADER_PREFIX)
    assert (
        g.denial("logging", {}.get)
        == "This protocol is restricted, expecting header 'triton-grpc-protocol-key'"
    )
    assert not Restrictions.parse([])
    for bad in ("trace", "trace:k", ":k=v", "bogus:k=v", "trace:=v", "trace:k=v,trace:k=w"):
        with pytest.raises(ValueError):
            Restrictions.parse(bad.split(","))
    with pytest.raises(ValueError, match="more than one"):
        Restrictions.parse(["trace:k=v", "trace,logging:j=w"])


@pytest.mark.parametrize(
    "path,category",
    [
        ("/v2", "metadata"),
        ("/v2/health/live", "health"),
        ("/v2/models/m", "metadata"),
        ("/v2/models/m/versions/2", "metadata"),
        ("/v2/models/m/ready", "health"),
        ("/v2/models/m/versions/2/ready", "health"),
        ("/v2/models/m/infer", "inference"),
        ("/v2/models/m/versions/1/infer", "inference"),
        ("/v2/models/m/generate_stream", "inference"),
        ("/v2/models/m/config", "model-config"),
        ("/v2/models/stats", "statistics"),
        ("/v2/models/m/versions/1/stats", "statistics"),
        ("/v2/models/m/trace/setting", "trace"),
        ("/v2/trace/setting", "trace"),
        ("/v2/logging", "logging"),
        ("/v2/repository/index", "model-repository"),
        ("/v2/repository/models/m/load", "model-repository"),
        ("/v2/systemsharedmemory/region/r/register", "shared-memory"),
        ("/v2/cudasharedmemory/status", "shared-memory"),
        ("/v2/models/m/versions/1/generate", "inference"),
        ("/v2/models/m/versions/1/config", "model-config"),
        ("/v2/models/m/versions/1/trace/setting", "trace"),
        ("/v2/nosuchsection/x", None),
        ("/v3/x", None),
    ],
)
def test_http_categories(path: str, category: str | None) -> None:
    assert path_category(path.split("/")) == category


def test_http_route_table_names_known_categories_and_handlers() -> None:
    from flowserve.frontends.http.app import HttpApp

    for handler, section_category in SECTIONS.values():
        assert callable(getattr(HttpApp, handler)) and section_category in ("", *CATEGORIES)
    for method, action_category, handler in MODEL_ACTIONS.values():
        assert method in ("GET", "POST") and action_category in CATEGORIES
        assert callable(getattr(HttpApp, handler))


def test_grpc_categories() -> None:
    assert grpc_category("/inference.GRPCInferenceService/ModelInfer") == "inference"
    assert grpc_category("/inference.GRPCInferenceService/RepositoryModelLoad") == "model-repository"
    assert grpc_category("/grpc.health.v1.Health/Check") == "health"
    assert grpc_category("/inference.GRPCInferenceService/Unknown") is None
    from tritonclient.grpc import service_pb2

    rpcs = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name
    for name in rpcs:
        assert grpc_category(f"/inference.GRPCInferenceService/{name}") in CATEGORIES, name


# ------------------------------------------------------------------ override files


def test_override_files_stay_inside(tmp_path: Path) -> None:
    target = tmp_path / "m"
    target.mkdir()
    write_override_files("m", target, {"1/model.py": b"ok", "config.pbtxt": b"x"})
    assert (target / "1" / "model.py").read_bytes() == b"ok"
    for bad in ("../x", "1/../../x", ""):
        with pytest.raises(InvalidArgument, match="inside the model directory"):
            write_override_files("m", target, {bad: b"no"})
    # a leading '/' is relative to the model directory, as in Triton (file:/1/model.py)
    write_override_files("m", target, {"/etc/x": b"in"})
    assert (target / "etc" / "x").read_bytes() == b"in" and not Path("/etc/x").exists()


def test_override_files_refuse_symbolic_links_out(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.py").write_bytes(b"original")
    target = tmp_path / "m"
    target.mkdir()
    (target / "1").symlink_to(outside)  # a directory link leading out
    (target / "model.py").symlink_to(outside / "victim.py")  # a file link leading out
    for rel in ("1/victim.py", "1/new.py", "model.py"):
        with pytest.raises(InvalidArgument, match=r"symbolic link|cannot be written"):
            write_override_files("m", target, {rel: b"pwned"})
    assert (outside / "victim.py").read_bytes() == b"original"
    assert not (outside / "new.py").exists()


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", "a\\b", "a\0b"])
def test_model_names_that_are_paths(name: str) -> None:
    with pytest.raises(InvalidArgument, match="invalid model name"):
        check_model_name(name)


# ------------------------------------------------------------------ abandoned instances


async def test_abandoned_call_keeps_its_instance_out_of_service() -> None:
    pool: InstancePool[str] = InstancePool("hang")
    await pool.add(lambda i: f"instance-{i}")
    release = threading.Event()
    seen: list[tuple[str, float]] = []

    def work(instance: str, arg: str) -> str:
        seen.append((arg, time.monotonic()))
        if arg == "hang":
            release.wait(10)
        return arg

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(pool.run(work, "hang"), 0.1)
    assert pool.abandoned == 1
    # the next call waits for the instance instead of queueing behind the hung call unseen
    second = asyncio.ensure_future(pool.run(work, "next"))
    await asyncio.sleep(0.2)
    assert not second.done() and [a for a, _ in seen] == ["hang"]
    released = time.monotonic()
    release.set()
    assert await asyncio.wait_for(second, 5) == "next"
    assert pool.abandoned == 0 and seen[1][1] >= released
    await pool.close()


async def test_cancelled_before_start_gives_the_instance_back() -> None:
    pool: InstancePool[int] = InstancePool("busy")
    await pool.add(lambda i: i)
    gate = threading.Event()
    first = asyncio.ensure_future(pool.run(lambda _, a: gate.wait(5), None))
    await asyncio.sleep(0.05)
    second = asyncio.ensure_future(pool.run(lambda _, a: a, 7))
    await asyncio.sleep(0.05)
    second.cancel()  # still waiting for the instance: nothing to abandon
    gate.set()
    assert await first is True
    assert pool.abandoned == 0
    assert await pool.run(lambda _, a: a, 8) == 8
    await pool.close()


def test_open_files_limit_is_raised_for_the_connection_caps() -> None:
    """3 listeners x --max-connections (plus spare) must fit the open files limit, or the cap is
    never reached: accept() fails with EMFILE first, on every listener."""
    import resource
    import subprocess
    import sys

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2000:
        pytest.skip(f"hard open files limit {hard} is too low for this test")
    code = (
        "import resource; from flowserve.server import open_files_for\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))\n"
        "print(open_files_for(500), resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["1756", "1756"], out
