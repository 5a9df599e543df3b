"""The system shared-memory registry: open to every client by default, so bounded."""

from __future__ import annotations

import os
from collections.abc import Iterator
from multiprocessing import shared_memory

import pytest

from flowserve.core.errors import ResourceExhausted
from flowserve.dataplane.shm import MAX_REGIONS, SharedMemoryRegistry


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
