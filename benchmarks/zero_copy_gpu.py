"""Device-resident edges on an NVIDIA GPU: a DALI (GPU) -> ONNX Runtime (CUDA EP) -> torch (CUDA)
image pipeline, with the tensors left on the GPU between steps (after) against each step
getting a host copy of its input (before: ``Executor.copy_edges``, a device -> host -> device
round trip per edge), side by side in one process; and, where a Triton with the DALI, ONNX
Runtime and PyTorch backends is reachable (``--triton-url``), the same three models as a Triton
ensemble over gRPC.

Pipeline (``gpu_image``): ``decode`` (DALI: uint8 HWC image -> GPU resize to 224x224 ->
normalize -> float CHW) -> ``net`` (ONNX, a 3x3 convolution stack) -> ``head`` (torch.export,
global average pool + softmax). Batch 1 .. --batch images of 512x512x3.

    python benchmarks/zero_copy_gpu.py                       # needs a GPU, onnxruntime-gpu,
    python benchmarks/zero_copy_gpu.py --triton-url 127.0.0.1:8001   # nvidia-dali-cuda*, CUDA torch

Refuses to run without a GPU (it measures nothing on a CPU). Writes
benchmarks/results/zero_copy_gpu.json. Not yet run on a GPU: see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

GRAPH = """\
name: gpu_image
inputs:
  image: {datatype: UINT8, dims: [-1, 512, 512, 3]}
outputs:
  probs: head.probs
nodes:
  decode: {model: gi_decode, inputs: {image: $image}}
  net: {model: gi_net, inputs: {x: decode.x}}
  head: {model: gi_head, inputs: {features: net.features}}
"""

ENSEMBLE = """name: "gi_ensemble"
platform: "ensemble"
max_batch_size: 8
input [ { name: "image" data_type: TYPE_UINT8 dims: [ 512, 512, 3 ] } ]
output [ { name: "probs" data_type: TYPE_FP32 dims: [ 10 ] } ]
ensemble_scheduling { step [
  { model_name: "gi_decode" model_version: -1
    input_map { key: "image" value: "image" } output_map { key: "x" value: "x" } },
  { model_name: "gi_net" model_version: -1
    input_map { key: "x" value: "x" } output_map { key: "features" value: "features" } },
  { model_name: "gi_head" model_version: -1
    input_map { key: "features" value: "features" } output_map { key: "probs" value: "probs" } }
] }
"""


def _config(name: str, backend: str, filename: str, inputs: str, outputs: str) -> str:
    return (
        f'name: "{name}"\n{backend}\nmax_batch_size: 8\ndefault_model_filename: "{filename}"\n'
        f"input [ {inputs} ]\noutput [ {outputs} ]\ninstance_group [ {{ kind: KIND_GPU count: 1 }} ]\n"
    )


def write_models(root: Path) -> tuple[Path, Path]:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    import torch
    from nvidia.dali import pipeline_def
    from onnx import TensorProto, helper, numpy_helper

    repo, graphs = root / "models", root / "graphs"

    @pipeline_def(batch_size=8, num_threads=2, device_id=0)
    def decode() -> Any:
        image = fn.external_source(name="image", device="gpu", layout="HWC", dtype=types.UINT8)
        image = fn.resize(image, resize_x=224, resize_y=224)
        return fn.crop_mirror_normalize(
            image, dtype=types.FLOAT, output_layout="CHW", mean=[123.7, 116.3, 103.5], std=[58.4, 57.1, 57.4]
        )

    (repo / "gi_decode" / "1").mkdir(parents=True)
    decode().serialize(filename=str(repo / "gi_decode" / "1" / "model.dali"))
    (repo / "gi_decode" / "config.pbtxt").write_text(
        _config(
            "gi_decode",
            'backend: "dali"',
            "model.dali",
            '{ name: "image" data_type: TYPE_UINT8 dims: [ 512, 512, 3 ] }',
            '{ name: "x" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] }',
        )
    )
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((32, 3, 3, 3)).astype(np.float32) * 0.1, "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((64, 32, 3, 3)).astype(np.float32) * 0.1, "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["features"], pads=[1, 1, 1, 1], strides=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 224, 224])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [None, 64, 112, 112])],
        [w1, w2],
    )
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx_model.ir_version = 9
    (repo / "gi_net" / "1").mkdir(parents=True)
    (repo / "gi_net" / "1" / "model.onnx").write_bytes(onnx_model.SerializeToString())
    (repo / "gi_net" / "config.pbtxt").write_text(
        _config(
            "gi_net",
            'platform: "onnxruntime_onnx"',
            "model.onnx",
            '{ name: "x" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] }',
            '{ name: "features" data_type: TYPE_FP32 dims: [ 64, 112, 112 ] }',
        )
    )

    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(64, 10)

        def forward(self, features: torch.Tensor) -> torch.Tensor:
            return torch.softmax(self.fc(features.mean(dim=(2, 3))), dim=1)

    batch = torch.export.Dim("batch", min=1, max=8)
    program = torch.export.export(
        Head().eval(), (torch.zeros(2, 64, 112, 112),), dynamic_shapes={"features": {0: batch}}
    )
    (repo / "gi_head" / "1").mkdir(parents=True)
    torch.export.save(program, str(repo / "gi_head" / "1" / "model.pt2"))
    (repo / "gi_head" / "config.pbtxt").write_text(
        _config(
            "gi_head",
            'platform: "pytorch_libtorch"',
            "model.pt2",
            '{ name: "features" data_type: TYPE_FP32 dims: [ 64, 112, 112 ] }',
            '{ name: "probs" data_type: TYPE_FP32 dims: [ 10 ] }',
        )
    )
    (repo / "gi_ensemble" / "1").mkdir(parents=True)
    (repo / "gi_ensemble" / "config.pbtxt").write_text(ENSEMBLE)
    graphs.mkdir(parents=True)
    (graphs / "gpu_image.yaml").write_text(GRAPH)
    return repo, graphs


MODELS = ("gi_decode", "gi_net", "gi_head")


def _copied(engine: Any) -> int:
    total = 0
    for name in ("gpu_image", *MODELS):
        servable = engine.registry.get(name)
        total += servable.stats.bytes_copied + sum(s.bytes_copied for s in servable.executor.stats)
    return total


async def _flowserve(engine: Any, images: np.ndarray, requests: int, copying: bool) -> dict[str, float]:
    for name in MODELS:
        engine.registry.get(name).executor.copy_edges(copying)
    before = _copied(engine)
    start = time.perf_counter()
    for _ in range(requests):
        await engine.infer("gpu_image", {"image": images})
    wall = time.perf_counter() - start
    return {
        "ms_per_request": wall / requests * 1e3,
        "bytes_copied_per_request": (_copied(engine) - before) / requests,
    }


def _triton(url: str, images: np.ndarray, requests: int) -> dict[str, float] | None:
    try:
        import tritonclient.grpc as grpcclient
    except ImportError:
        return None
    client = grpcclient.InferenceServerClient(url)
    if not client.is_model_ready("gi_ensemble"):
        return None
    given = grpcclient.InferInput("image", list(images.shape), "UINT8")
    given.set_data_from_numpy(images)
    client.infer("gi_ensemble", [given])
    start = time.perf_counter()
    for _ in range(requests):
        client.infer("gi_ensemble", [given])
    return {"ms_per_request": (time.perf_counter() - start) / requests * 1e3}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from flowserve.dataplane.engine import Engine
    from flowserve.nodes.backends._support import gpu_count, no_gpu_reason

    if gpu_count() == 0:
        raise SystemExit(f"zero_copy_gpu.py measures a GPU pipeline; there is no GPU here: {no_gpu_reason()}")
    with tempfile.TemporaryDirectory(prefix="zcg-") as tmp:
        repo, graphs = write_models(Path(tmp))
        engine = await Engine.start([repo], [graphs])
        try:
            results: dict[str, Any] = {}
            for batch in (1, args.batch):
                images = np.random.default_rng(0).integers(0, 255, (batch, 512, 512, 3), dtype=np.uint8)
                for copying in (False, True):
                    await _flowserve(engine, images, 5, copying)
                runs: dict[str, list[dict[str, float]]] = {"host_round_trips": [], "on_device": []}
                for _ in range(args.rounds):
                    for copying in (True, False):
                        outcome = await _flowserve(engine, images, args.requests, copying)
                        runs["host_round_trips" if copying else "on_device"].append(outcome)
                summary = {
                    m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()
                }
                if args.triton_url:
                    summary["triton_ensemble"] = _triton(args.triton_url, images, args.requests)
                results[f"batch_{batch}"] = summary
        finally:
            await engine.stop()
    import torch

    return {
        "what": "DALI (GPU) -> ONNX Runtime (CUDA) -> torch (CUDA), 512x512x3 uint8 images, Engine.infer",
        "gpu": torch.cuda.get_device_name(0),
        "python": platform.python_version(),
        "results": results,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--triton-url", default="", help="a Triton serving gi_ensemble over gRPC")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "zero_copy_gpu.json")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["results"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
