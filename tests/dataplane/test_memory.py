"""Freed request memory given back to the system (flowserve/dataplane/memory.py): a trim once
enough was freed, in a worker thread, at most once per interval; glibc's thresholds fixed at start."""

from __future__ import annotations

import asyncio
import os
import platform
import resource
import subprocess
import sys
import threading

import pytest

from flowserve.dataplane.memory import (
    ENVIRONMENT,
    M_MMAP_THRESHOLD,
    M_TRIM_THRESHOLD,
    USER_SETTINGS,
    Trimmer,
    _malloc_trim,
    tune_malloc,
)


async def test_trims_once_enough_was_freed_and_at_most_once_per_interval() -> None:
    ran: list[str] = []
    now = [100.0]
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def trim() -> None:
        ran.append(threading.current_thread().name)
        loop.call_soon_threadsafe(done.set)

    trimmer = Trimmer(trim, after=100, every_s=0.2, clock=lambda: now[0])
    trimmer.freed(60)
    await asyncio.sleep(0.05)
    assert ran == []  # not enough yet
    trimmer.freed(60)
    await asyncio.wait_for(done.wait(), 5)
    assert len(ran) == 1 and ran[0] != threading.current_thread().name  # in a worker thread
    done.clear()
    trimmer.freed(500)  # again at once: waits for the interval (the fake clock has not moved)
    trimmer.freed(500)  # one trim scheduled, not two
    started = loop.time()
    await asyncio.wait_for(done.wait(), 5)
    assert loop.time() - started >= 0.15 and len(ran) == 2 and trimmer.trims == 2


def test_no_trim_without_glibc_or_a_loop() -> None:
    Trimmer(None).freed(1 << 40)  # nothing happens
    Trimmer(lambda: None, after=1).freed(10)  # no running loop: nothing happens


def test_glibc_malloc_trim_is_found_here() -> None:
    trim = _malloc_trim()
    assert trim is not None  # the test machines run glibc
    trim()


# a working set like a conv net's on the CPU: after one 3 MiB block was mapped and freed, glibc's
# dynamic thresholds sit at about 3 MiB (mmap) and 6 MiB (trim), so four 2 MiB blocks come from
# the heap and, freed together, leave 8 MiB at its top: given back, and faulted in again next time
CHURN = """
import resource, sys
import numpy as np
if sys.argv[1] == "tune":
    from flowserve.dataplane.memory import tune_malloc
    assert tune_malloc()
np.ones(3 << 20, np.uint8)
def step():
    blocks = [np.ones(2 << 20, np.uint8) for _ in range(4)]
    del blocks
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 10)
"""


def _faults_per_step(how: str, environ: dict[str, str]) -> int:
    done = subprocess.run(
        [sys.executable, "-c", CHURN, how],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(done.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_tuned_thresholds_keep_a_working_set_of_blocks_resident() -> None:
    environ = {k: v for k, v in os.environ.items() if k not in USER_SETTINGS and k != "GLIBC_TUNABLES"}
    pages = (8 << 20) // resource.getpagesize()
    assert _faults_per_step("default", environ) >= pages // 2  # glibc's own: the 8 MiB fault in every time
    assert _faults_per_step("tune", environ) < pages // 20  # this process, through mallopt
    children = {**environ, **ENVIRONMENT}
    assert _faults_per_step("default", children) < pages // 20  # a process started with its environment


def test_tune_malloc_sets_both_thresholds_unless_the_user_chose() -> None:
    calls: list[tuple[int, int]] = []

    def mallopt(parameter: int, value: int) -> int:
        calls.append((parameter, value))
        return 1

    environ: dict[str, str] = {"PATH": "/bin"}
    assert tune_malloc(environ, mallopt)
    assert calls == [(M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 32 << 20)]
    assert environ == {
        "PATH": "/bin",
        "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
        "MALLOC_TRIM_THRESHOLD_": str(32 << 20),
    }
    for chosen in (
        {"MALLOC_TOP_PAD_": "0"},
        {"MALLOC_MMAP_THRESHOLD_": "131072"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"},
    ):
        calls.clear()
        assert not tune_malloc(dict(chosen), mallopt)
        assert calls == []
    refused: dict[str, str] = {}
    assert not tune_malloc(refused, lambda parameter, value: 0)  # mallopt refused: nothing claimed
    assert refused == {}
    assert tune_malloc({"GLIBC_TUNABLES": "glibc.pthread.rseq=0"}, mallopt)  # other tunables: not malloc's
