"""The system shared-memory registry: open to every client by default, so bounded; its
client may shrink a region's object at any time."""

from __future__ import annotations

import os
from collections.abc import Iterator
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest

from flowserve.core.errors import InvalidArgument, ResourceExhausted
from flowserve.core.limits import Limits
from flowserve.core.wire import to_raw
from flowserve.dataplane.shm import MAX_REGIONS, READ_INTO_FROM, SharedMemoryRegistry

SHM = Path("/dev/shm")


@pytest.fixture
def key() -> Iterator[str]:
    region = shared_memory.SharedMemory(name=f"fs-shm-bound-{os.getpid()}", create=True, size=64)
    try:
        yield "/" + region.name
    finally:
        region.close()
        region.unlink()


def test_the_number_of_regions_is_bounded_and_unregistering_frees_a_place(key: str) -> None:
    registry = SharedMemoryRegistry(max_regions=3)
    try:
        for i in range(3):
            registry.register(f"r{i}", key, 0, 64)
        with pytest.raises(ResourceExhausted, match="'r3': 3 regions are registered"):
            registry.register("r3", key, 0, 64)
        with pytest.raises(ResourceExhausted):
            registry.check_register("r3", key, 0, 64)  # refused before it is sent to every worker
        registry.unregister("r0")
        registry.register("r3", key, 0, 64)
        assert sorted(r["name"] for r in registry.status()) == ["r1", "r2", "r3"]
    finally:
        registry.close()


def test_the_default_bound() -> None:
    assert SharedMemoryRegistry().max_regions == MAX_REGIONS == 4096


# A client may shrink its object under a registered region. These stay inside the object's first
# page (100 bytes of a 128-byte region), where a mapping would have read zeros rather than
# faulted: past the first page it was SIGBUS, which tests/reliability/test_attack_run.py shows
# against a server process (a crash there fails a test instead of killing pytest).


@pytest.fixture
def region() -> Iterator[tuple[SharedMemoryRegistry, str]]:
    """A registry with region 'r' over a fresh 128-byte object (the key's file name given)."""
    obj = shared_memory.SharedMemory(name=f"fs-shm-trunc-{os.getpid()}", create=True, size=128)
    registry = SharedMemoryRegistry()
    try:
        registry.register("r", "/" + obj.name, 0, 128)
        yield registry, obj.name
    finally:
        registry.close()
        obj.close()
        obj.unlink()


def _resize(fname: str, size: int) -> None:
    fd = os.open(SHM / fname, os.O_RDWR)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def _ints(registry: SharedMemoryRegistry, offset: int) -> list[int]:
    """16 INT32 at ``offset`` of region 'r', read as an input."""
    value = registry.read_tensor("r", offset, 64, "IN", "INT32", [16], Limits())
    assert isinstance(value, np.ndarray)
    return [int(x) for x in value]


def test_a_truncated_region_is_refused_for_inputs_and_outputs(
    region: tuple[SharedMemoryRegistry, str],
) -> None:
    registry, fname = region
    registry.write_tensor("r", 64, 64, np.arange(16, dtype=np.int32), "OUT")
    _resize(fname, 100)
    with pytest.raises(InvalidArgument) as err:
        registry.read_tensor("r", 64, 64, "IN", "INT32", [16], Limits())
    assert err.value.message == (
        "tensor 'IN': shared memory region 'r' (key '/" + fname + "') is 100 bytes now, offset 64 + "
        "byte_size 64 (bytes 64 to 128 of the object) is past its end: was it truncated after it "
        "was registered?"
    )
    with pytest.raises(InvalidArgument, match=r"tensor 'OUT': .* is 100 bytes now"):
        registry.write_tensor("r", 64, 64, np.arange(16, dtype=np.int32), "OUT")
    assert (SHM / fname).stat().st_size == 100  # refused before anything was written
    # what still fits is served
    assert _ints(registry, 0) == [0] * 16
    assert registry.write_tensor("r", 0, 64, np.arange(16, dtype=np.int32), "OUT") == 64


def test_a_shrink_during_a_read_is_the_same_error(
    region: tuple[SharedMemoryRegistry, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read checks nothing before its copy: shrunk just before (or while) pread copies, the
    read comes back short, and the answer is the same error."""
    registry, fname = region
    real = os.pread

    def shrinking(fd: int, size: int, start: int) -> bytes:
        _resize(fname, 0)
        return real(fd, size, start)

    monkeypatch.setattr(os, "pread", shrinking)  # the module's os is this one
    with pytest.raises(InvalidArgument, match=r"tensor 'IN': .* is 0 bytes now, offset 0"):
        registry.read_tensor("r", 0, 64, "IN", "INT32", [16], Limits())


def test_a_shrink_between_a_writes_check_and_its_copy_grows_the_object_back(
    region: tuple[SharedMemoryRegistry, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write checks the size first (past the end pwrite would grow the object); stale by the
    copy, pwrite grows the object back within the span the client registered (never a fault)."""
    registry, fname = region
    real = os.fstat

    def stale(fd: int) -> os.stat_result:
        result = real(fd)  # the check sees 128 bytes; the object is 0 bytes by the copy
        _resize(fname, 0)
        return result

    monkeypatch.setattr(os, "fstat", stale)
    assert registry.write_tensor("r", 64, 64, np.arange(16, dtype=np.int32), "OUT") == 64
    monkeypatch.undo()
    assert (SHM / fname).stat().st_size == 128  # grown back by the write, up to its span
    assert _ints(registry, 64) == list(range(16))


def test_outputs_are_written_as_their_raw_bytes(region: tuple[SharedMemoryRegistry, str]) -> None:
    registry, _ = region
    for value in (
        np.arange(6, dtype=">f4").reshape(2, 3),  # big-endian: written little-endian
        np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2],  # not contiguous
        np.array(7, dtype=np.int16),
        np.array([b"ab", b"", b"xyz"], dtype=np.object_),
    ):
        written = registry.write_tensor("r", 0, 128, value, "OUT")
        assert registry.read("r", 0, written, "IN") == to_raw(value)


def test_an_unregister_during_a_read_leaves_its_descriptor_open(
    region: tuple[SharedMemoryRegistry, str],
) -> None:
    """A read in a worker thread holds the region's file; the descriptor closes when it lets go
    (not under it, where its number could be reused for another file)."""
    registry, _ = region
    held = registry._regions["r"].file
    fd = held.fd
    registry.unregister("r")
    os.fstat(fd)  # still open
    del held
    with pytest.raises(OSError):
        os.fstat(fd)


def test_the_open_files_limit_makes_room_for_every_region() -> None:
    """Each region keeps its object open: 4096 regions must not leave the listeners without
    descriptors (accept() failing with EMFILE), so the server's open files limit counts them."""
    import resource
    import subprocess
    import sys

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 6000:
        pytest.skip(f"hard open files limit {hard} is too low for this test")
    code = (
        "import resource; from flowserve.server import open_files_for\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))\n"
        f"print(open_files_for(500, regions={MAX_REGIONS}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == [str(3 * 500 + MAX_REGIONS + 256)], out


def test_a_large_input_is_read_into_its_own_buffer_and_a_short_one_refused() -> None:
    """From READ_INTO_FROM bytes an input is read with preadv into a buffer of its size (huge
    pages, dataplane.memory.buffer) rather than a fresh bytes; the same bytes, the same error
    when the object was truncated under the span."""
    size = READ_INTO_FROM + 4096
    obj = shared_memory.SharedMemory(name=f"fs-shm-large-{os.getpid()}", create=True, size=size + 64)
    registry = SharedMemoryRegistry()
    try:
        expected = np.random.default_rng(3).random(size // 4, dtype=np.float32)
        np.frombuffer(obj.buf, np.float32, count=size // 4, offset=64)[:] = expected
        registry.register("big", "/" + obj.name, 64, size)
        value = registry.read_tensor("big", 0, size, "IN", "FP32", [size // 4], Limits())
        assert isinstance(value, np.ndarray) and not value.flags.writeable  # as a small input
        np.testing.assert_array_equal(value, expected)
        _resize(obj.name, size // 2)
        with pytest.raises(InvalidArgument, match=rf"tensor 'IN': .* is {size // 2} bytes now"):
            registry.read_tensor("big", 0, size, "IN", "FP32", [size // 4], Limits())
    finally:
        registry.close()
        obj.close()
        obj.unlink()
