"""The model configuration as model.py sees it: lookups in its JSON dict, and
:class:`ModelConfig`, what ``auto_complete_config`` may change."""

from __future__ import annotations

import copy
import json
from typing import Any


def _find(config: dict[str, Any], key: str, name: str) -> dict[str, Any] | None:
    for item in config.get(key, []):
        if item.get("name") == name:
            return dict(item)
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return _find(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return _find(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    """Whether the model's configuration says ``model_transaction_policy { decoupled: true }``."""
    policy = model_config.get("model_transaction_policy")
    if policy:
        return bool(policy.get("decoupled", False))
    return False


class ModelConfig:
    """What ``TritonPythonModel.auto_complete_config`` receives: the config as a dict, and the
    few changes Triton allows (max_batch_size, inputs, outputs, dynamic batching, decoupled)."""

    _TENSOR_KEYS = frozenset({"name", "data_type", "dims", "optional"})

    def __init__(self, model_config: dict[str, Any] | str) -> None:
        parsed: dict[str, Any] = json.loads(model_config) if isinstance(model_config, str) else model_config
        self._config = copy.deepcopy(parsed)
        self._config.setdefault("max_batch_size", 0)
        self._config.setdefault("input", [])
        self._config.setdefault("output", [])

    @property
    def _model_config(self) -> dict[str, Any]:  # the attribute Triton's stub reads
        return self._config

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def _name(self) -> str:
        return str(self._config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        configured = int(self._config.get("max_batch_size", 0))
        if configured > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {configured}, but in auto-complete-config "
                f"function for model '{self._name()}' specified max_batch_size {max_batch_size}"
            )
        self._config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if self._config.get(other):
                raise ValueError(
                    f"configuration specified scheduling_choice as '{other}', but auto-complete-config "
                    f"function for model '{self._name()}' tries to set it as 'dynamic_batching'"
                )
        self._config.setdefault("dynamic_batching", {})

    def _add(self, key: str, tensor: dict[str, Any]) -> None:
        extra = set(tensor) - self._TENSOR_KEYS
        if extra:
            raise ValueError(f"{key} '{tensor.get('name')}' has unsupported properties {sorted(extra)}")
        for required in ("name", "data_type", "dims"):
            if required not in tensor:
                raise ValueError(f"{key} {tensor} of model '{self._name()}' is missing '{required}'")
        for existing in self._config[key]:
            if existing.get("name") == tensor["name"]:
                if existing.get("data_type") not in ("TYPE_INVALID", None, tensor["data_type"]):
                    raise ValueError(
                        f"{key} '{tensor['name']}' of model '{self._name()}' has data_type "
                        f"{existing['data_type']} in the configuration, {tensor['data_type']} in "
                        "auto_complete_config"
                    )
                if existing.get("dims") and list(existing["dims"]) != list(tensor["dims"]):
                    raise ValueError(
                        f"{key} '{tensor['name']}' of model '{self._name()}' has dims {existing['dims']} "
                        f"in the configuration, {tensor['dims']} in auto_complete_config"
                    )
                return
        self._config[key].append(dict(tensor))

    def add_input(self, input: dict[str, Any]) -> None:
        self._add("input", input)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        self._config.setdefault("model_transaction_policy", {}).update(transaction_policy_dict)
