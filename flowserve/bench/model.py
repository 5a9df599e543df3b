"""What a model or graph takes: its inputs and outputs as its metadata and config say (pure
parsing of the V2 JSON; fetching lives with each transport)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    datatype: str
    shape: tuple[int, ...]  # as the metadata shows it: -1 for a variable dimension


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[str, ...]
    max_batch_size: int
    decoupled: bool = False


def _tensors(entries: Any) -> tuple[TensorInfo, ...]:
    return tuple(
        TensorInfo(str(e["name"]), str(e["datatype"]), tuple(int(d) for d in e.get("shape", [])))
        for e in entries or []
    )


def model_info(name: str, metadata: dict[str, Any], config: dict[str, Any]) -> ModelInfo:
    """``metadata``: the V2 model metadata JSON; ``config``: the model config JSON (Triton's
    ModelConfig as JSON; only ``max_batch_size`` and the transaction policy are read)."""
    policy = config.get("model_transaction_policy") or {}
    return ModelInfo(
        name=name,
        inputs=_tensors(metadata.get("inputs")),
        outputs=tuple(str(o["name"]) for o in metadata.get("outputs") or []),
        max_batch_size=int(config.get("max_batch_size") or 0),
        decoupled=bool(policy.get("decoupled", False)),
    )


__all__ = ["ModelInfo", "TensorInfo", "model_info"]
