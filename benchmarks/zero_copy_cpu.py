"""Zero-copy edges on the CPU: a torch -> ONNX Runtime -> torch graph with 4 MB tensors, the
tensors handed on as they are (after) against each model getting an owned host copy of its
input (before: the copying path, one host copy per edge; on a GPU each such edge is a
device -> host -> device round trip), side by side in one process, alternating rounds.

Graph (``zc_pipeline``): ``pre`` (torch.export, y = 2x) -> ``mid`` (ONNX, y = x + 1) -> ``post``
(torch.export, y = x - 3), FP32 [N] with N = 1 Mi elements (4 MiB). Requests through
``Engine.infer`` (in-process, no wire): what is measured is the engine's edges, not HTTP.
"copies/request" and "bytes copied/request" are the per-node ``bytes_copied`` statistics
(the counter /metrics exports as ``flowserve_node_bytes_copied``) summed over the graph's nodes
and its models, divided by the requests.

    python benchmarks/zero_copy_cpu.py                 # about 30 s
    python benchmarks/zero_copy_cpu.py --requests 300 --rounds 5

Writes benchmarks/results/zero_copy_cpu.json. Not a unit test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

ELEMENTS = 1 << 20  # 4 MiB of FP32

GRAPH = """\
name: zc_pipeline
description: torch -> onnxruntime -> torch, 4 MB FP32 tensors
inputs:
  x: {datatype: FP32, dims: [-1]}
outputs:
  y: post.y
nodes:
  pre: {model: zc_pre, inputs: {x: $x}}
  mid: {model: zc_mid, inputs: {x: pre.y}}
  post: {model: zc_post, inputs: {x: mid.y}}
"""


def _config(name: str, platform_name: str, filename: str) -> str:
    return f"""name: "{name}"
platform: "{platform_name}"
default_model_filename: "{filename}"
max_batch_size: 0
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""


def _torch_model(path: Path, scale: float, shift: float) -> None:
    import torch

    class Affine(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * scale + shift

    n = torch.export.Dim("n", min=1, max=1 << 26)
    program = torch.export.export(Affine().eval(), (torch.zeros(8),), dynamic_shapes={"x": {0: n}})
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))


def _onnx_add_one(path: Path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])
    one = numpy_helper.from_array(np.array([1.0], np.float32), "one")
    graph = helper.make_graph([helper.make_node("Add", ["x", "one"], ["y"])], "add1", [x], [y], [one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())


def write_pipeline(root: Path) -> tuple[Path, Path]:
    """(model repository, graphs directory) of the torch -> ONNX Runtime -> torch graph."""
    repo, graphs = root / "models", root / "graphs"
    for name, platform_name, filename in (
        ("zc_pre", "pytorch_libtorch", "model.pt2"),
        ("zc_mid", "onnxruntime_onnx", "model.onnx"),
        ("zc_post", "pytorch_libtorch", "model.pt2"),
    ):
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(_config(name, platform_name, filename))
    _torch_model(repo / "zc_pre" / "1" / "model.pt2", 2.0, 0.0)
    _onnx_add_one(repo / "zc_mid" / "1" / "model.onnx")
    _torch_model(repo / "zc_post" / "1" / "model.pt2", 1.0, -3.0)
    graphs.mkdir(parents=True, exist_ok=True)
    (graphs / "zc_pipeline.yaml").write_text(GRAPH)
    return repo, graphs


def expected(x: np.ndarray) -> np.ndarray:
    return (x * 2.0 + 1.0) - 3.0


def bytes_copied(engine: Any, names: tuple[str, ...] = ("zc_pipeline", "zc_pre", "zc_mid", "zc_post")) -> int:
    """Every node's bytes copied in the graph and its three models (executors and backends)."""
    total = 0
    for name in names:
        servable = engine.registry.get(name)
        total += servable.stats.bytes_copied + sum(s.bytes_copied for s in servable.executor.stats)
    return total


def set_copying(engine: Any, on: bool) -> None:
    """The copying path: each model gets an owned host copy of its input (one copy per edge)."""
    for name in ("zc_pre", "zc_mid", "zc_post"):
        engine.registry.get(name).executor.copy_edges(on)


async def _round(engine: Any, x: np.ndarray, requests: int, copying: bool) -> dict[str, float]:
    set_copying(engine, copying)
    before = bytes_copied(engine)
    cpu0, t0 = time.process_time(), time.perf_counter()
    for _ in range(requests):
        out = await engine.infer("zc_pipeline", {"x": x})
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    np.testing.assert_allclose(out["y"], expected(x), rtol=1e-6)
    copied = (bytes_copied(engine) - before) / requests
    return {
        "us_per_request": wall / requests * 1e6,
        "cpu_us_per_request": cpu / requests * 1e6,
        "bytes_copied_per_request": copied,
        "copies_per_request": copied / x.nbytes,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    from flowserve.dataplane.engine import Engine

    with tempfile.TemporaryDirectory(prefix="zc-") as tmp:
        repo, graphs = write_pipeline(Path(tmp))
        engine = await Engine.start([repo], [graphs])
        try:
            x = np.random.default_rng(0).random(ELEMENTS, dtype=np.float32)
            for copying in (False, True):  # warm-up
                await _round(engine, x, 20, copying)
            runs: dict[str, list[dict[str, float]]] = {"copying": [], "zero_copy": []}
            for _ in range(args.rounds):
                for copying in (True, False):
                    result = await _round(engine, x, args.requests, copying)
                    runs["copying" if copying else "zero_copy"].append(result)
        finally:
            await engine.stop()
    summary = {
        mode: {key: statistics.median(r[key] for r in results) for key in results[0]}
        for mode, results in runs.items()
    }
    return {
        "what": "torch -> onnxruntime -> torch, FP32 [1Mi] (4 MiB), Engine.infer in-process, one at a time",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "requests_per_round": args.requests,
        "rounds": args.rounds,
        "median": summary,
        "runs": runs,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "zero_copy_cpu.json")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'path':<12} {'us/request':>11} {'CPU us/req':>11} {'copies/req':>11} {'MB copied/req':>14}")
    for mode in ("copying", "zero_copy"):
        m = result["median"][mode]
        print(
            f"{mode:<12} {m['us_per_request']:>11.0f} {m['cpu_us_per_request']:>11.0f} "
            f"{m['copies_per_request']:>11.2f} {m['bytes_copied_per_request'] / 2**20:>14.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
