"""System shared memory: the copy through a mapping (before) vs ``pread``/``pwrite`` (now).

A client may shrink a region's object (``ftruncate``) at any time, and touching a mapped page
past its end is SIGBUS: the process dies. flowserve/dataplane/shm.py now checks the object's size
(``fstat``) and copies with ``pread`` (inputs) and ``pwrite`` (outputs), which stop short or
grow the file instead of faulting. This measures what that costs a normal request, side by
side in one process, rounds alternating: an INT32 input read out of a region as a numpy array
(``read_tensor``) and an INT32 output written into one (``write_tensor``), 64 KiB and 16 MiB.
"old" is the mapping path as it was (``bytes(mapping[a:b])`` then ``np.frombuffer``;
``to_raw`` then ``mapping[a:b] = data``), "new" is the registry as it is.

    python benchmarks/shm_path.py            # about half a minute
    python benchmarks/shm_path.py --rounds 9

Writes benchmarks/results/shm_path.json. Not a unit test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import statistics
import time
from collections.abc import Callable
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np

from flowserve.core.limits import Limits
from flowserve.core.wire import check_shm_size, from_raw, to_raw
from flowserve.dataplane.shm import SharedMemoryRegistry

HERE = Path(__file__).resolve().parent
SIZES = {"64KiB": 64 << 10, "16MiB": 16 << 20}
LIMITS = Limits()


class MappedRegion:
    """The former path: the object mapped once, every access a copy through the mapping."""

    def __init__(self, key: str, size: int) -> None:
        fd = os.open(f"/dev/shm/{key}", os.O_RDWR)
        try:
            self.mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)

    def read_tensor(self, byte_size: int, shape: list[int]) -> np.ndarray:
        check_shm_size("IN", "INT32", shape, byte_size, LIMITS)
        return from_raw("IN", "INT32", shape, bytes(self.mapping[0:byte_size]), LIMITS)

    def write_tensor(self, value: np.ndarray) -> int:
        data = to_raw(value)
        self.mapping[0 : len(data)] = data
        return len(data)

    def close(self) -> None:
        self.mapping.close()


def per_call_us(fn: Callable[[], object], seconds: float) -> float:
    """Median microseconds per call over batches filling about ``seconds``."""
    fn()
    calls = 0
    started = time.perf_counter()
    while time.perf_counter() - started < 0.05:
        fn()
        calls += 1
    batch = max(1, calls)
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 5:
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        times.append((time.perf_counter() - t0) / batch * 1e6)
    return statistics.median(times)


def measure(label: str, size: int, rounds: int, seconds: float) -> dict[str, object]:
    obj = shared_memory.SharedMemory(name=f"fs-bench-{os.getpid()}-{label}", create=True, size=size)
    registry = SharedMemoryRegistry()
    registry.register("r", "/" + obj.name, 0, size)
    mapped = MappedRegion(obj.name, size)
    shape = [size // 4]
    value = np.arange(size // 4, dtype=np.int32)
    runs: dict[str, dict[str, list[float]]] = {
        "read": {"old": [], "new": []},
        "write": {"old": [], "new": []},
    }
    try:
        assert registry.write_tensor("r", 0, size, value, "OUT") == size
        assert np.array_equal(mapped.read_tensor(size, shape), value)
        new_read = registry.read_tensor("r", 0, size, "IN", "INT32", shape, LIMITS)
        assert isinstance(new_read, np.ndarray) and np.array_equal(new_read, value)
        for _ in range(rounds):
            runs["read"]["old"].append(per_call_us(lambda: mapped.read_tensor(size, shape), seconds))
            runs["read"]["new"].append(
                per_call_us(lambda: registry.read_tensor("r", 0, size, "IN", "INT32", shape, LIMITS), seconds)
            )
            runs["write"]["old"].append(per_call_us(lambda: mapped.write_tensor(value), seconds))
            runs["write"]["new"].append(
                per_call_us(lambda: registry.write_tensor("r", 0, size, value, "OUT"), seconds)
            )
    finally:
        mapped.close()
        registry.close()
        obj.close()
        obj.unlink()
    out: dict[str, object] = {}
    for op, by_path in runs.items():
        old, new = statistics.median(by_path["old"]), statistics.median(by_path["new"])
        out[op] = {"old_us": round(old, 2), "new_us": round(new, 2), "new_over_old": round(new / old, 3)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per size")
    parser.add_argument("--seconds", type=float, default=0.5, help="time per measurement")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "shm_path.json")
    args = parser.parse_args()
    results = {label: measure(label, size, args.rounds, args.seconds) for label, size in SIZES.items()}
    record = {
        "what": "system shared memory, one INT32 tensor: mapping copy (old) vs fstat + pread/pwrite (new)",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "rounds": args.rounds,
        "results": results,
    }
    for label, ops in results.items():
        for op, r in ops.items():
            assert isinstance(r, dict)
            old, new, ratio = r["old_us"], r["new_us"], r["new_over_old"]
            print(f"{label:>6} {op:<5} old {old:>9} us  new {new:>9} us  new/old {ratio}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
