"""Triton's ``ModelConfig`` protobuf, typed: the fields flowserve reads and writes.

The message comes from ``tritonclient.grpc.model_config_pb2``, a generated module without type
stubs, so mypy would see it (and everything read from it) as ``Any``. The protocols here
describe the part of it flowserve uses, under the message's own field names, so the config
can travel from ``spec/`` to backends and the data plane with a type that mypy checks.
Scalar fields are attributes (a message's scalars can be assigned); message, repeated and map
fields are read-only properties (protobuf refuses to assign them: mutate them in place).
``tests/spec/test_model_config.py`` checks every name here against the message's descriptor.

Only :func:`new_config` (which the parsers in ``spec/triton.py`` use) creates configs: it is
the one place where the untyped protobuf object becomes a :class:`ModelConfig`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import Any, Protocol, TypeVar, cast

M = TypeVar("M", covariant=True)


class Repeated(Protocol[M]):
    """A repeated message field (protobuf's RepeatedCompositeFieldContainer)."""

    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[M]: ...
    def __getitem__(self, index: int) -> M: ...
    def add(self, **fields: Any) -> M: ...


class Message(Protocol):
    def HasField(self, field_name: str) -> bool: ...  # noqa: N802 (protobuf's names)
    def WhichOneof(self, oneof_group: str) -> str | None: ...  # noqa: N802
    def SetInParent(self) -> None: ...  # noqa: N802


class ModelTensorReshape(Message, Protocol):
    @property
    def shape(self) -> Sequence[int]: ...


class ModelInput(Message, Protocol):
    name: str
    data_type: int  # a DataType enum value
    optional: bool
    allow_ragged_batch: bool
    is_shape_tensor: bool

    @property
    def dims(self) -> Sequence[int]: ...
    @property
    def reshape(self) -> ModelTensorReshape: ...


class ModelOutput(Message, Protocol):
    name: str
    data_type: int
    is_shape_tensor: bool
    label_filename: str

    @property
    def dims(self) -> Sequence[int]: ...
    @property
    def reshape(self) -> ModelTensorReshape: ...


class ModelParameter(Message, Protocol):
    string_value: str


class ModelVersionPolicyLatest(Message, Protocol):
    num_versions: int


class ModelVersionPolicySpecific(Message, Protocol):
    @property
    def versions(self) -> Sequence[int]: ...


class ModelVersionPolicy(Message, Protocol):
    """Oneof ``policy_choice``: ``latest``, ``all`` or ``specific``."""

    @property
    def latest(self) -> ModelVersionPolicyLatest: ...
    @property
    def specific(self) -> ModelVersionPolicySpecific: ...


class ModelRateLimiterResource(Message, Protocol):
    """Also has the field ``global`` (a Python keyword: read it with ``getattr``)."""

    name: str
    count: int


class ModelRateLimiter(Message, Protocol):
    priority: int

    @property
    def resources(self) -> Repeated[ModelRateLimiterResource]: ...


class ModelInstanceGroup(Message, Protocol):
    name: str
    count: int
    kind: int  # a ModelInstanceGroup.Kind enum value

    @property
    def gpus(self) -> Sequence[int]: ...
    @property
    def rate_limiter(self) -> ModelRateLimiter: ...


class ModelQueuePolicy(Message, Protocol):
    timeout_action: int  # a ModelQueuePolicy.TimeoutAction enum value
    default_timeout_microseconds: int
    allow_timeout_override: bool
    max_queue_size: int


class ModelDynamicBatching(Message, Protocol):
    max_queue_delay_microseconds: int
    preserve_ordering: bool
    priority_levels: int
    default_priority_level: int

    @property
    def preferred_batch_size(self) -> Sequence[int]: ...
    @property
    def default_queue_policy(self) -> ModelQueuePolicy: ...
    @property
    def priority_queue_policy(self) -> Mapping[int, ModelQueuePolicy]: ...


class ModelSequenceBatchingControl(Message, Protocol):
    kind: int  # a ModelSequenceBatching.Control.Kind enum value
    data_type: int

    @property
    def int32_false_true(self) -> Sequence[int]: ...
    @property
    def fp32_false_true(self) -> Sequence[float]: ...
    @property
    def bool_false_true(self) -> Sequence[bool]: ...


class ModelSequenceBatchingControlInput(Message, Protocol):
    name: str

    @property
    def control(self) -> Repeated[ModelSequenceBatchingControl]: ...


class ModelSequenceBatchingInitialState(Message, Protocol):
    """Oneof ``state_data``: ``zero_data`` or ``data_file``."""

    name: str
    data_type: int
    data_file: str

    @property
    def dims(self) -> Sequence[int]: ...


class ModelSequenceBatchingState(Message, Protocol):
    input_name: str
    output_name: str
    data_type: int

    @property
    def dims(self) -> Sequence[int]: ...
    @property
    def initial_state(self) -> Repeated[ModelSequenceBatchingInitialState]: ...


class ModelSequenceBatchingDirect(Message, Protocol):
    max_queue_delay_microseconds: int


class ModelSequenceBatchingOldest(Message, Protocol):
    max_candidate_sequences: int
    max_queue_delay_microseconds: int

    @property
    def preferred_batch_size(self) -> Sequence[int]: ...


class ModelSequenceBatching(Message, Protocol):
    """Oneof ``strategy_choice``: ``direct`` or ``oldest``."""

    max_sequence_idle_microseconds: int

    @property
    def direct(self) -> ModelSequenceBatchingDirect: ...
    @property
    def oldest(self) -> ModelSequenceBatchingOldest: ...
    @property
    def control_input(self) -> Repeated[ModelSequenceBatchingControlInput]: ...
    @property
    def state(self) -> Repeated[ModelSequenceBatchingState]: ...


class ModelEnsemblingStep(Message, Protocol):
    model_name: str
    model_version: int

    @property
    def input_map(self) -> MutableMapping[str, str]: ...
    @property
    def output_map(self) -> MutableMapping[str, str]: ...


class ModelEnsembling(Message, Protocol):
    @property
    def step(self) -> Repeated[ModelEnsemblingStep]: ...


class ModelWarmupInput(Message, Protocol):
    """Oneof ``input_data_type``: ``zero_data``, ``random_data`` or ``input_data_file``."""

    data_type: int
    input_data_file: str

    @property
    def dims(self) -> Sequence[int]: ...


class ModelWarmup(Message, Protocol):
    name: str
    batch_size: int
    count: int

    @property
    def inputs(self) -> Mapping[str, ModelWarmupInput]: ...


class ModelTransactionPolicy(Message, Protocol):
    decoupled: bool


class ModelResponseCache(Message, Protocol):
    enable: bool


class GraphOptimization(Message, Protocol):
    level: int


class ExecutionAccelerator(Message, Protocol):
    name: str

    @property
    def parameters(self) -> Mapping[str, str]: ...


class ExecutionAccelerators(Message, Protocol):
    @property
    def gpu_execution_accelerator(self) -> Repeated[ExecutionAccelerator]: ...
    @property
    def cpu_execution_accelerator(self) -> Repeated[ExecutionAccelerator]: ...


class ModelOptimizationPolicy(Message, Protocol):
    @property
    def graph(self) -> GraphOptimization: ...
    @property
    def execution_accelerators(self) -> ExecutionAccelerators: ...


class ModelConfig(Message, Protocol):
    """Triton's ``inference.ModelConfig``. Oneof ``scheduling_choice``: ``dynamic_batching``,
    ``sequence_batching`` or ``ensemble_scheduling``."""

    name: str
    platform: str
    backend: str
    max_batch_size: int
    default_model_filename: str

    @property
    def version_policy(self) -> ModelVersionPolicy: ...
    @property
    def input(self) -> Repeated[ModelInput]: ...
    @property
    def output(self) -> Repeated[ModelOutput]: ...
    @property
    def instance_group(self) -> Repeated[ModelInstanceGroup]: ...
    @property
    def dynamic_batching(self) -> ModelDynamicBatching: ...
    @property
    def sequence_batching(self) -> ModelSequenceBatching: ...
    @property
    def ensemble_scheduling(self) -> ModelEnsembling: ...
    @property
    def optimization(self) -> ModelOptimizationPolicy: ...
    @property
    def parameters(self) -> Mapping[str, ModelParameter]: ...
    @property
    def model_warmup(self) -> Repeated[ModelWarmup]: ...
    @property
    def model_transaction_policy(self) -> ModelTransactionPolicy: ...
    @property
    def response_cache(self) -> ModelResponseCache: ...


def new_config(**fields: Any) -> ModelConfig:
    """A ModelConfig message (empty, or with the given fields, as protobuf's constructor)."""
    from tritonclient.grpc import model_config_pb2 as mc

    return cast(ModelConfig, mc.ModelConfig(**fields))


def mark_decoupled(config: ModelConfig) -> None:
    """Say in ``config`` that the model's clients must stream (Triton's decoupled transaction
    policy), as a YAML graph's config does once its executor turns out decoupled."""
    config.model_transaction_policy.decoupled = True
