"""Each worker on cores of its own: ``--cpu-affinity spread``.

With ``--workers N`` the kernel schedules every worker's threads on any core the server may use.
For a model whose instances compute under the interpreter lock (a pure-Python model), each
worker's event loop and instance thread hand the lock to each other hundreds of times a second;
when the scheduler moves them across cores, each hand-off wakes a thread on another core (an
inter-processor interrupt, dearer still in a virtual machine) and its caches start cold. On 2
cores, a 2 ms pure-Python model at concurrency 4 over one gRPC connection fell into one of two
modes run by run, 700-720 or 770-790 infer/s; with each worker held to a core of its own,
``benchmarks/workers_cpu.py --repeats 5`` read 750-813 (median 800, 0.99x Triton 2.51) against
695-803 (733) unpinned, and 0.93x against 0.85x in a second run; over HTTP 734-800 (760)
against 627-840 (687), with about 5 % less server CPU per request. ``benchmarks/README.md`` has
the runs.

Policy (:func:`partition`)
    The CPUs this process may use (``os.sched_getaffinity``: a container's cpuset, taskset) are
    grouped by physical core (hyperthread siblings stay together: a worker never shares a core
    with another worker's threads while it has cores of its own) and split into ``N`` runs of
    consecutive cores whose sizes differ by at most one, worker ``i`` taking run ``i``. With
    fewer cores than workers, worker ``i`` takes core ``i mod cores`` (workers share cores, as
    unpinned). A worker restarted after a crash takes the same CPUs again.

Why not the default: a worker held to its share cannot borrow an idle core of another. A
framework that computes one request on many threads (ONNX Runtime's and torch's intra-op pools)
then uses only the worker's share for it, so one connection to an ONNX model that never moves
to another worker (its requests are cheap, or its worker has a free instance) computes on
``cores / N`` of the cores instead of all of them. Pinning suits workers that are each kept
busy by their own share of the load (many connections, or requests that move between workers:
``cluster/routing.py``), and Python models most.

:func:`pin` applies it in a worker, before the worker loads anything: every thread it has
(``/proc/self/task``) and every thread it starts later (threads inherit their creator's
affinity) runs on the worker's CPUs. Where the kernel refuses (a sandbox without
``sched_setaffinity``), the worker runs unpinned and says so in its log.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

log = logging.getLogger("flowserve.cluster")

MODES = ("none", "spread")
SYSFS_CPUS = Path("/sys/devices/system/cpu")


def parse_cpu_list(text: str) -> frozenset[int]:
    """A kernel CPU list (``0-3,8,10-11``) as a set; ``ValueError`` for anything else."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, dash, last = part.partition("-")
        low = int(first)
        high = int(last) if dash else low
        if high < low:
            raise ValueError(f"a CPU range that ends before it starts: {part!r}")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def siblings(cpus: Iterable[int], root: Path = SYSFS_CPUS) -> dict[int, frozenset[int]]:
    """Each CPU's hyperthread siblings (itself included) as sysfs lists them; a CPU whose
    topology cannot be read is its own core."""
    found: dict[int, frozenset[int]] = {}
    for cpu in cpus:
        try:
            listed = (root / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text()
            found[cpu] = parse_cpu_list(listed)
        except (OSError, ValueError):
            found[cpu] = frozenset({cpu})
    return found


def cores(cpus: Iterable[int], sibling_sets: Mapping[int, frozenset[int]]) -> list[list[int]]:
    """The allowed ``cpus`` grouped by physical core, each group sorted, groups in the order of
    their first CPU. Siblings outside ``cpus`` are left out."""
    allowed = set(cpus)
    seen: set[int] = set()
    groups: list[list[int]] = []
    for cpu in sorted(allowed):
        if cpu in seen:
            continue
        group = sorted((sibling_sets.get(cpu, frozenset()) | {cpu}) & allowed)
        seen.update(group)
        groups.append(group)
    return groups


def partition(core_groups: Sequence[Sequence[int]], workers: int) -> list[frozenset[int]]:
    """Per worker, the CPUs it runs on (see the module's policy)."""
    if workers < 1:
        raise ValueError("the number of workers must be >= 1")
    if not core_groups:
        return [frozenset() for _ in range(workers)]
    count = len(core_groups)
    if count < workers:
        return [frozenset(core_groups[index % count]) for index in range(workers)]
    shares: list[frozenset[int]] = []
    start = 0
    for index in range(workers):
        size = count // workers + (1 if index < count % workers else 0)
        shares.append(frozenset(cpu for group in core_groups[start : start + size] for cpu in group))
        start += size
    return shares


def share(index: int, workers: int, allowed: Iterable[int], root: Path = SYSFS_CPUS) -> frozenset[int]:
    """Worker ``index``'s CPUs out of ``allowed``, by the machine's topology under ``root``."""
    cpus = set(allowed)
    return partition(cores(cpus, siblings(cpus, root)), workers)[index]


def pin(
    index: int,
    workers: int,
    *,
    allowed: Iterable[int] | None = None,
    set_affinity: Callable[[int, frozenset[int]], None] | None = None,
    threads: Callable[[], list[int]] | None = None,
) -> frozenset[int] | None:
    """Hold this process (every thread it has, and so every thread it starts) to worker
    ``index``'s CPUs. Returns them, or None when the kernel refused (the worker runs unpinned)."""
    if allowed is None:
        allowed = os.sched_getaffinity(0)
    mine = share(index, workers, allowed)
    if not mine:
        return None
    apply = set_affinity if set_affinity is not None else os.sched_setaffinity
    try:
        apply(0, mine)  # this thread first: the threads it starts from now on inherit it
        for tid in (threads or _threads)():
            try:
                apply(tid, mine)
            except ProcessLookupError:  # a thread that has ended since it was listed
                continue
    except OSError as exc:
        log.warning("worker %d: cannot be held to CPUs %s (%s); it runs unpinned", index, describe(mine), exc)
        return None
    return mine


def _threads() -> list[int]:
    try:
        return [int(task.name) for task in Path("/proc/self/task").iterdir()]
    except OSError:
        return []


def describe(cpus: Iterable[int]) -> str:
    """A set of CPUs as the kernel writes a CPU list (``{0, 1, 2, 5}``: ``0-2,5``), for logs."""
    runs: list[list[int]] = []  # [first, last] of each run of consecutive CPUs
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{first}-{last}" if last > first else f"{first}" for first, last in runs)


__all__ = ["MODES", "cores", "describe", "parse_cpu_list", "partition", "pin", "share", "siblings"]
