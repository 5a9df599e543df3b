"""BYTES tensors on the wire: decoding (``from_raw``, ``from_list``) and encoding (``to_raw``),
this tree's flowserve/core/wire.py against another tree's, side by side in one process.

An outside attack run sent one request of 20 million empty BYTES elements (76 MiB, within every
other limit) and held the event loop for about 15 s: decoding was a Python loop of several
steps per element, encoding another. Now elements of one length are cut out by numpy, other
elements take one tight step each, typed lists (gRPC ``bytes_contents``) skip the walk for
nesting, and encoding builds the prefixes with numpy and joins once. Cases: 1M empty elements,
1M of 0-15 bytes, 1M of 8 bytes, each decoded from bytes (gRPC) and from a memoryview (an HTTP
binary body), decoded from a list (typed contents), and encoded; and 16 elements of 1 MiB
(large elements must not get slower).

    git worktree add /tmp/old <commit>      # e.g. the commit before this change
    python benchmarks/bytes_codec.py --old /tmp/old

Writes benchmarks/results/bytes_codec.json. Not a unit test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import struct
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from flowserve.core import wire as new_wire
from flowserve.core.limits import Limits

HERE = Path(__file__).resolve().parent
LIMITS = Limits(max_tensor_elements=1 << 26)


def load_wire(tree: Path) -> ModuleType:
    """flowserve/core/wire.py of another tree (it imports only flowserve.core modules that are
    the same in both)."""
    spec = importlib.util.spec_from_file_location("old_wire", tree / "flowserve" / "core" / "wire.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cases() -> dict[str, list[bytes]]:
    rng = np.random.default_rng(0)
    n = 1_000_000
    return {
        "1M empty": [b""] * n,
        "1M of 0-15 bytes": [b"x" * int(k) for k in rng.integers(0, 16, n)],
        "1M of 8 bytes": [rng.bytes(8) for _ in range(n)],
        "16 of 1 MiB": [rng.bytes(1 << 20) for _ in range(16)],
    }


def seconds(fn: Callable[[], Any], repeat: int) -> float:
    """The fastest of ``repeat`` calls (the machine is shared: the minimum is the steadiest)."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def measure(wire: ModuleType, items: list[bytes], raw: bytes, repeat: int) -> dict[str, float]:
    count = len(items)
    array = np.empty(count, dtype=np.object_)
    array[:] = items
    body = memoryview(b"HEAD" + raw)[4:]  # as an HTTP binary body hands it over
    return {
        "decode bytes": seconds(lambda: wire.from_raw("x", "BYTES", [count], raw, LIMITS), repeat),
        "decode view": seconds(lambda: wire.from_raw("x", "BYTES", [count], body, LIMITS), repeat),
        "decode list": seconds(lambda: wire.from_list("x", "BYTES", [count], items, LIMITS), repeat),
        "encode": seconds(lambda: wire.to_raw(array), repeat),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--old", type=Path, required=True, help="the other tree (a git worktree)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--repeat", type=int, default=3, help="calls per measurement (fastest kept)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "bytes_codec.json")
    args = parser.parse_args()
    old_wire = load_wire(args.old)
    results: dict[str, dict[str, dict[str, float]]] = {}
    for label, items in cases().items():
        raw = b"".join(struct.pack("<I", len(b)) + b for b in items)
        for wire in (old_wire, new_wire):  # both give the same answers
            assert wire.to_raw(np.array([*items, b"."], dtype=np.object_)[:-1]) == raw
            assert wire.from_raw("x", "BYTES", [len(items)], raw, LIMITS).tolist() == items
        runs: dict[str, dict[str, list[float]]] = {}
        for _ in range(args.rounds):
            for name, wire in (("old", old_wire), ("new", new_wire)):
                for op, s in measure(wire, items, raw, args.repeat).items():
                    runs.setdefault(op, {}).setdefault(name, []).append(s)
        results[label] = {}
        for op, by_tree in runs.items():
            old, new = statistics.median(by_tree["old"]), statistics.median(by_tree["new"])
            results[label][op] = {
                "old_ms": round(old * 1e3, 2),
                "new_ms": round(new * 1e3, 2),
                "old_over_new": round(old / new, 2),
            }
            print(f"{label:>17} {op:<13} old {old * 1e3:9.1f} ms  new {new * 1e3:9.1f} ms  x{old / new:.1f}")
    record = {
        "what": "BYTES decode/encode (flowserve/core/wire.py), another tree (old) vs this one (new)",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "rounds": args.rounds,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
