"""Which worker loads a model with ``--workers N`` (flowserve/repository/placement.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from flowserve.dataplane.engine import Engine
from flowserve.repository.placement import PIN_PARAMETER, Placement, pin_reason, share, shared_group
from flowserve.spec.schema import InstanceSpec, ModelSpec


def _model(
    instances: tuple[InstanceSpec, ...], parameters: dict[str, str] | None = None, backend: str = "pytorch"
) -> ModelSpec:
    return ModelSpec(
        name="net",
        source="/repo/net",
        backend=backend,
        platform="pytorch_libtorch" if backend == "pytorch" else "",
        max_batch_size=32,
        inputs=(),
        outputs=(),
        versions={1: "/repo/net/1"},
        instances=instances,
        parameters=parameters or {},
    )


def test_a_gpu_model_is_loaded_by_every_worker() -> None:
    """Every worker's cores feed the GPU: each loads the instance groups (a CUDA context each)."""
    assert pin_reason(_model((InstanceSpec(count=2, kind="KIND_GPU", gpus=(0,)),))) is None


def test_a_gpu_model_too_big_to_load_n_times_is_pinned_by_its_config() -> None:
    gpu = (InstanceSpec(count=2, kind="KIND_GPU"),)
    reason = pin_reason(_model(gpu, {PIN_PARAMETER: "true"}))
    assert reason is not None and PIN_PARAMETER in reason


async def _nowhere(_: Any) -> Any:
    raise AssertionError("nothing is forwarded here")


def _shares(count: int, workers: int) -> list[tuple[int, int]]:
    group = InstanceSpec(count=count, kind="KIND_CPU")
    return [(s.count, s.first) for s in (share(group, w, workers) for w in range(workers))]


def test_the_workers_share_a_groups_instances_each_once() -> None:
    """(count, first) per worker: contiguous runs that cover the group once, in Triton's order."""
    assert _shares(2, 2) == [(1, 0), (1, 1)]
    assert _shares(3, 2) == [(1, 0), (2, 1)]
    assert _shares(8, 3) == [(2, 0), (3, 2), (3, 5)]
    for count in range(1, 12):
        for workers in range(1, count + 1):
            runs = _shares(count, workers)
            assert [i for n, first in runs for i in range(first, first + n)] == list(range(count))


def test_a_worker_beyond_the_count_loads_one_instance_all_the_same() -> None:
    """Every worker serves the model without a hop, neighbours loading the same instance."""
    assert _shares(1, 3) == [(1, 0), (1, 0), (1, 0)]
    assert _shares(2, 4) == [(1, 0), (1, 0), (1, 1), (1, 1)]


def test_a_python_models_cpu_groups_are_shared_and_everything_else_loaded_whole() -> None:
    cpu, gpu = InstanceSpec(count=4, kind="KIND_CPU"), InstanceSpec(count=2, kind="KIND_GPU")
    second = Placement(1, 2, _nowhere)
    python = second.instances(_model((cpu, gpu), backend="python"))
    assert python.instances == (InstanceSpec(count=2, kind="KIND_CPU", first=2), gpu)
    assert second.instances(_model((cpu,))).instances == (cpu,)  # torch computes outside the lock
    pinned = _model((cpu,), {PIN_PARAMETER: "true"}, backend="python")
    assert Placement(0, 2, _nowhere).instances(pinned).instances == (cpu,)  # its one worker has all
    assert Placement(0, 1, _nowhere).instances(_model((cpu,), backend="python")).instances == (cpu,)
    # the same rule as flowserve analyze reads it from a served config (analyze/target.py)
    assert shared_group("python", "KIND_CPU")
    assert not shared_group("python", "KIND_GPU") and not shared_group("onnxruntime", "KIND_CPU")


async def test_a_worker_initializes_its_share_under_tritons_instance_names(tmp_path: Path) -> None:
    """Worker 1 of 2 loads instances 1 and 2 of a Python model's 3, and model.py sees them
    under the names Triton gives them (``<model>_<group>_<index in the group>``)."""
    model = tmp_path / "named"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        'name: "named"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "NAME" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
        "instance_group [ { kind: KIND_CPU count: 3 } ]\n"
    )
    (model / "1" / "model.py").write_text(
        "import numpy as np\nimport triton_python_backend_utils as pb_utils\n\n"
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        self.name = args['model_instance_name']\n"
        "    def execute(self, requests):\n"
        "        out = np.array([self.name.encode()], dtype=np.object_)\n"
        "        return [pb_utils.InferenceResponse([pb_utils.Tensor('NAME', out)]) for _ in requests]\n"
    )
    engine = await Engine.start([tmp_path], placement=Placement(1, 2, _nowhere))
    try:
        node = engine.registry.get("named").executor.nodes[0]
        assert len(node.pool.instances) == 2
        names = set()
        for _ in range(40):  # both instances answer, in turn or at once
            out = await engine.infer("named", {"X": np.ones(1, np.float32)})
            names.add(out["NAME"][0])
        assert names <= {b"named_0_1", b"named_0_2"} and names
    finally:
        await engine.stop()
