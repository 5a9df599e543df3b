"""Which worker loads a model with ``--workers N`` (flowserve/repository/placement.py)."""

from __future__ import annotations

from flowserve.repository.placement import PIN_PARAMETER, pin_reason
from flowserve.spec.schema import InstanceSpec, ModelSpec


def _model(instances: tuple[InstanceSpec, ...], parameters: dict[str, str] | None = None) -> ModelSpec:
    return ModelSpec(
        name="net",
        source="/repo/net",
        backend="pytorch",
        platform="pytorch_libtorch",
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
