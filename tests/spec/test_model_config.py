"""The typed view of Triton's ModelConfig (flowserve/spec/model_config.py) names only fields
that the protobuf message has, each as the kind of field it is: a typo or a field Triton
renamed fails here, not at run time."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor
from tritonclient.grpc import model_config_pb2 as mc

from flowserve.spec import model_config as typed

MESSAGES: dict[type, Any] = {
    typed.ModelConfig: mc.ModelConfig,
    typed.ModelTensorReshape: mc.ModelTensorReshape,
    typed.ModelInput: mc.ModelInput,
    typed.ModelOutput: mc.ModelOutput,
    typed.ModelParameter: mc.ModelParameter,
    typed.ModelVersionPolicy: mc.ModelVersionPolicy,
    typed.ModelVersionPolicyLatest: mc.ModelVersionPolicy.Latest,
    typed.ModelVersionPolicySpecific: mc.ModelVersionPolicy.Specific,
    typed.ModelRateLimiter: mc.ModelRateLimiter,
    typed.ModelRateLimiterResource: mc.ModelRateLimiter.Resource,
    typed.ModelInstanceGroup: mc.ModelInstanceGroup,
    typed.ModelQueuePolicy: mc.ModelQueuePolicy,
    typed.ModelDynamicBatching: mc.ModelDynamicBatching,
    typed.ModelSequenceBatching: mc.ModelSequenceBatching,
    typed.ModelSequenceBatchingControl: mc.ModelSequenceBatching.Control,
    typed.ModelSequenceBatchingControlInput: mc.ModelSequenceBatching.ControlInput,
    typed.ModelSequenceBatchingInitialState: mc.ModelSequenceBatching.InitialState,
    typed.ModelSequenceBatchingState: mc.ModelSequenceBatching.State,
    typed.ModelSequenceBatchingDirect: mc.ModelSequenceBatching.StrategyDirect,
    typed.ModelSequenceBatchingOldest: mc.ModelSequenceBatching.StrategyOldest,
    typed.ModelEnsembling: mc.ModelEnsembling,
    typed.ModelEnsemblingStep: mc.ModelEnsembling.Step,
    typed.ModelWarmup: mc.ModelWarmup,
    typed.ModelWarmupInput: mc.ModelWarmup.Input,
    typed.ModelTransactionPolicy: mc.ModelTransactionPolicy,
    typed.ModelResponseCache: mc.ModelResponseCache,
    typed.ModelOptimizationPolicy: mc.ModelOptimizationPolicy,
    typed.GraphOptimization: mc.ModelOptimizationPolicy.Graph,
    typed.ExecutionAccelerators: mc.ModelOptimizationPolicy.ExecutionAccelerators,
    typed.ExecutionAccelerator: mc.ModelOptimizationPolicy.ExecutionAccelerators.Accelerator,
}


def _protocols() -> list[type]:
    return [
        cls
        for _, cls in inspect.getmembers(typed, inspect.isclass)
        if cls.__module__ == typed.__name__ and typed.Message in cls.__mro__[1:]
    ]


def test_every_protocol_is_checked_here() -> None:
    assert set(_protocols()) == set(MESSAGES)


@pytest.mark.parametrize("protocol", list(MESSAGES), ids=lambda p: p.__name__)
def test_protocol_names_the_messages_fields_as_what_they_are(protocol: type) -> None:
    fields = MESSAGES[protocol].DESCRIPTOR.fields_by_name
    scalars = set(inspect.get_annotations(protocol))
    containers = {name for name, value in vars(protocol).items() if isinstance(value, property)}
    assert scalars or containers
    for name in scalars:
        assert name in fields, f"{protocol.__name__}.{name}"
        field = fields[name]
        assert field.label != FieldDescriptor.LABEL_REPEATED, f"{protocol.__name__}.{name} is repeated"
        assert field.type != FieldDescriptor.TYPE_MESSAGE, f"{protocol.__name__}.{name} is a message"
    for name in containers:
        assert name in fields, f"{protocol.__name__}.{name}"
        field = fields[name]
        assert field.label == FieldDescriptor.LABEL_REPEATED or field.type == FieldDescriptor.TYPE_MESSAGE, (
            f"{protocol.__name__}.{name} is a scalar: declare it as an attribute"
        )


def test_new_config_is_the_message() -> None:
    config = typed.new_config(name="m", max_batch_size=4)
    assert isinstance(config, mc.ModelConfig)
    assert (config.name, config.max_batch_size) == ("m", 4)
    typed.mark_decoupled(config)
    assert config.model_transaction_policy.decoupled
