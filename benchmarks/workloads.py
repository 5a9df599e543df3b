"""The workloads of the side-by-side benchmark and the model repositories that serve them.

The repositories are kept under ``benchmarks/models`` (``common/``: served unchanged by both
servers; ``triton/`` and ``flowserve/``: what differs) and the YAML graph under
``benchmarks/graphs``. :func:`build_repositories` assembles one repository per side in a work
folder and writes the MLP's ``model.onnx`` (generated, deterministic: it is 5 MB of weights, so
it is not kept in git).

Workloads (``Workload.flowserve_model`` is what the flowserve side serves for it):

- ``add_sub``: FP32 [16] add/sub Python model, dynamic batching, 500 us queue delay;
- ``pipeline``: a 4-step ensemble of Python models (Triton's ensemble on both sides);
- ``pipeline_graph``: the same pipeline as a flowserve YAML graph, compared with Triton's ensemble;
- ``mlp_onnx``: a 256 -> 1024 -> 1024 -> 10 FP32 MLP with dynamic batching (ONNX Runtime in
  flowserve; a Python-backend model.py calling ONNX Runtime in Triton, which has no ORT backend here);
- ``bare``: the protocol ceiling, add_sub answered by a minimal handler with no engine
  (benchmarks/bare_http.py, benchmarks/bare_grpc.py), compared with flowserve's add_sub.
"""

from __future__ import annotations

import itertools
import shutil
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = HERE / "models"
GRAPHS = HERE / "graphs"

MLP_DIMS = (256, 1024, 1024, 10)


@dataclass(frozen=True, slots=True)
class Workload:
    """One row group of the table: a model served by two sides under the same name or not."""

    name: str
    triton_model: str  # what the reference side serves ("" when the reference is not Triton)
    flowserve_model: str
    reference: str = "triton"  # or "bare": the flowserve side is compared with a bare handler
    description: str = ""


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("add_sub", "add_sub", "add_sub", description="FP32[16] python add/sub, dyn. batching 500us"),
        Workload("pipeline", "pipeline", "pipeline", description="4-step python ensemble (config.pbtxt)"),
        Workload(
            "pipeline_graph", "pipeline", "pipeline_graph", description="the same pipeline as a YAML graph"
        ),
        Workload("mlp_onnx", "mlp_onnx", "mlp_onnx", description="ONNX MLP 256-1024-1024-10, dyn. batching"),
        Workload("bare", "", "add_sub", reference="bare", description="add_sub vs a bare handler (ceiling)"),
    )
}


@dataclass(frozen=True, slots=True)
class Repositories:
    triton: Path
    flowserve: Path
    graphs: Path


def write_mlp_onnx(path: Path, dims: tuple[int, ...] = MLP_DIMS, seed: int = 0) -> None:
    """A Gemm/ReLU MLP with a dynamic batch dimension (input INPUT, output OUTPUT), He-scaled
    random weights from ``seed``."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes = []
    weights = []
    current = "INPUT"
    layers = list(itertools.pairwise(dims))
    for i, (fan_in, fan_out) in enumerate(layers):
        w = (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        b = np.zeros(fan_out, np.float32)
        weights += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == len(layers) - 1
        out = "OUTPUT" if last else f"h{i}"
        nodes.append(helper.make_node("Gemm", [current, f"w{i}", f"b{i}"], [out if last else f"g{i}"]))
        if not last:
            nodes.append(helper.make_node("Relu", [f"g{i}"], [out]))
        current = out
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, [None, dims[0]])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, [None, dims[-1]])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9  # readable by the older onnxruntime a Triton user may have
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def build_repositories(work: Path) -> Repositories:
    """Assemble ``work/triton`` and ``work/flowserve`` from benchmarks/models (replacing what a
    previous run left), generate the MLP's model.onnx into both, and give the pipeline's
    ``add_sub_step`` the ``add_sub`` model.py (the same code; only its config differs)."""
    out = Repositories(work / "triton", work / "flowserve", GRAPHS)
    onnx_file = work / "mlp_onnx.onnx"
    if not onnx_file.is_file():
        write_mlp_onnx(onnx_file)
    for side, target in (("triton", out.triton), ("flowserve", out.flowserve)):
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(MODELS / "common", target)
        shutil.copytree(MODELS / side, target, dirs_exist_ok=True)
        step = target / "add_sub_step" / "1"
        step.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(target / "add_sub" / "1" / "model.py", step / "model.py")
        version = target / "mlp_onnx" / "1"
        version.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(onnx_file, version / "model.onnx")
    return out
