"""Triton's ``sequence_batching`` block -> :class:`SequenceSpec` (stateful models)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from flowserve.core.datatypes import from_config, to_numpy
from flowserve.core.errors import InvalidArgument
from flowserve.spec.model_config import ModelConfig

ControlKind = Literal["START", "END", "READY", "CORRID"]


@dataclass(frozen=True, slots=True)
class Control:
    """A control tensor the sequence batcher feeds the model: ``values`` are (false, true)."""

    kind: ControlKind
    name: str
    datatype: str
    values: tuple[Any, Any] = (0, 1)


@dataclass(frozen=True, slots=True)
class StateSpec:
    """Implicit state: ``output_name`` of request i becomes ``input_name`` of request i+1."""

    input_name: str
    output_name: str
    datatype: str
    dims: tuple[int, ...]
    initial: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class SequenceSpec:
    strategy: Literal["direct", "oldest"] = "direct"
    max_sequence_idle_us: int = 1_000_000
    max_candidate_sequences: int = 0
    max_queue_delay_us: int = 0
    controls: tuple[Control, ...] = ()
    states: tuple[StateSpec, ...] = field(default_factory=tuple)


_KINDS: dict[int, ControlKind] = {
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START: "START",
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_END: "END",
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY: "READY",
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID: "CORRID",
}


def sequence_from_config(config: ModelConfig, model_dir: Path | None = None) -> SequenceSpec | None:
    """The model's sequence settings, or None when it has no ``sequence_batching`` block."""
    if not config.HasField("sequence_batching"):
        return None
    sb = config.sequence_batching
    controls = []
    for ci in sb.control_input:
        for c in ci.control:
            kind = _KINDS[c.kind]
            if kind == "CORRID":
                controls.append(Control(kind, ci.name, from_config(mc.DataType.Name(c.data_type))))
            elif len(c.fp32_false_true) == 2:
                controls.append(Control(kind, ci.name, "FP32", _pair(c.fp32_false_true)))
            elif len(c.bool_false_true) == 2:
                controls.append(Control(kind, ci.name, "BOOL", _pair(c.bool_false_true)))
            elif len(c.int32_false_true) == 2:
                controls.append(Control(kind, ci.name, "INT32", _pair(c.int32_false_true)))
            else:
                raise InvalidArgument(
                    f"control input '{ci.name}' needs int32_false_true, fp32_false_true or bool_false_true"
                )
    states = []
    for st in sb.state:
        datatype = from_config(mc.DataType.Name(st.data_type))
        initial = None
        for init in st.initial_state:
            shape = tuple(int(d) for d in init.dims)
            if init.HasField("data_file") and model_dir is not None:
                raw = (model_dir / "initial_state" / init.data_file).read_bytes()
                initial = np.frombuffer(raw, dtype=to_numpy(datatype)).reshape(shape)
            else:
                initial = np.zeros(shape, dtype=to_numpy(datatype))
        states.append(StateSpec(st.input_name, st.output_name, datatype, tuple(st.dims), initial))
    oldest = sb.WhichOneof("strategy_choice") == "oldest"
    return SequenceSpec(
        strategy="oldest" if oldest else "direct",
        max_sequence_idle_us=int(sb.max_sequence_idle_microseconds or 1_000_000),
        max_candidate_sequences=int(sb.oldest.max_candidate_sequences) if oldest else 0,
        max_queue_delay_us=int(
            sb.oldest.max_queue_delay_microseconds if oldest else sb.direct.max_queue_delay_microseconds
        ),
        controls=tuple(controls),
        states=tuple(states),
    )


V = TypeVar("V")


def _pair(values: Sequence[V]) -> tuple[V, V]:
    """A control's (false, true) values (the caller has checked there are two)."""
    return values[0], values[1]
