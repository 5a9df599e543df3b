"""PyTorch backend (``pytorch_libtorch`` platform): TorchScript ``model.pt`` or a
``torch.export`` program ``model.pt2`` (chosen by the file's suffix; ``model.pt2`` is used when
``model.pt`` is absent and no ``default_model_filename`` is set).

Inputs and outputs are mapped as Triton's PyTorch backend maps them:

- inputs named as ``forward``'s arguments go to those arguments; otherwise names of the form
  ``<name>__<index>`` (``INPUT__0``) give the position; otherwise the config's order does;
- a tensor result is the single output; a tuple/list result is indexed by ``<name>__<index>``
  (``OUTPUT__0``) or, without that form, by the config's order; a dict result by name.

CPU here; on a GPU an instance owns a device and a CUDA stream (inputs copied in and the
module run on that stream, results copied back, then the stream is synchronised).
``torch.jit.load``'s deprecation warning is filtered where it is raised.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from flowserve.core.errors import InternalError, InvalidArgument, Unsupported
from flowserve.core.node import TensorMap
from flowserve.nodes.backends._support import Parameters, Placement, placement, require
from flowserve.nodes.backends.base import BackendNode

_INDEXED = re.compile(r"^.+__(\d+)$")
_JIT_DEPRECATED = r"`torch\.jit\.\w+` is deprecated"


def indexed_order(names: list[str]) -> list[int] | None:
    """Positions from ``<name>__<index>`` names (None unless every name has that form)."""
    found = [_INDEXED.match(n) for n in names]
    if not names or any(m is None for m in found):
        return None
    return [int(m.group(1)) for m in found if m is not None]


def input_positions(config_names: list[str], forward_args: list[str] | None) -> list[int]:
    """Where each configured input goes among ``forward``'s positional arguments."""
    if forward_args and all(n in forward_args for n in config_names):
        return [forward_args.index(n) for n in config_names]
    by_index = indexed_order(config_names)
    if by_index is not None:
        return by_index
    return list(range(len(config_names)))


@dataclass
class TorchInstance:
    module: Any
    device: Any
    stream: Any
    positions: list[int]
    inference_mode: bool


@contextmanager
def _quiet_jit() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_JIT_DEPRECATED, category=DeprecationWarning)
        yield


class TorchBackend(BackendNode):
    _torch: Any = None

    def _file(self) -> Path:
        vdir = Path(self.version_path)
        if self.model.default_model_filename and self.model.default_model_filename != "model.pt":
            path = vdir / self.model.default_model_filename
        else:
            path = vdir / "model.pt"
            if not path.exists() and (vdir / "model.pt2").exists():
                path = vdir / "model.pt2"
        if not path.exists():
            raise InvalidArgument(f"model '{self.model.name}': model file {path} does not exist")
        return path

    def load_instance(self, index: int) -> TorchInstance:
        model = self.model
        torch = require("torch", model.name, "pytorch", "torch")
        self._torch = torch
        place = placement(model, index, "pytorch")
        if place.gpu and not torch.cuda.is_available():
            if place.required:
                raise Unsupported(
                    f"model '{model.name}': KIND_GPU asked for, but this torch build has no CUDA "
                    f"(torch {torch.__version__})"
                )
            place = Placement("CPU")
        params = Parameters(model)
        threads = params.integer("INTRA_OP_THREAD_COUNT", 0)
        if threads > 0:
            torch.set_num_threads(threads)
        device = torch.device(f"cuda:{place.device}" if place.gpu else "cpu")
        path = self._file()
        try:
            if path.suffix == ".pt2":
                module = torch.export.load(str(path)).module()
                module = module.to(device)
                forward_args = _signature_args(module)
            else:
                with _quiet_jit():
                    module = torch.jit.load(str(path), map_location=device)
                module.eval()
                forward_args = [a.name for a in module.forward.schema.arguments][1:]
        except Exception as exc:
            raise InvalidArgument(f"model '{model.name}': torch cannot load {path}: {exc}") from None
        positions = input_positions([t.name for t in model.inputs], forward_args)
        stream = torch.cuda.Stream(device=device) if place.gpu else None
        return TorchInstance(module, device, stream, positions, params.flag("ENABLE_INFERENCE_MODE", True))

    def execute(self, instance: TorchInstance, inputs: TensorMap) -> TensorMap:
        torch = self._torch
        names = [t.name for t in self.model.inputs]
        args: list[Any] = [None] * (max(instance.positions, default=-1) + 1)
        for name, pos in zip(names, instance.positions, strict=True):
            if name in inputs:
                args[pos] = _to_torch(torch, name, inputs[name], self.model.name)
        while args and args[-1] is None:
            args.pop()
        grad = torch.inference_mode() if instance.inference_mode else torch.no_grad()
        with grad:
            if instance.stream is not None:
                with torch.cuda.device(instance.device), torch.cuda.stream(instance.stream):
                    moved = [
                        a.to(instance.device, non_blocking=True) if a is not None else None for a in args
                    ]
                    result = instance.module(*moved)
                    outputs = self._outputs(result)
                instance.stream.synchronize()
            else:
                result = instance.module(*args)
                outputs = self._outputs(result)
        return outputs

    def _outputs(self, result: Any) -> TensorMap:
        torch = self._torch
        names = [t.name for t in self.model.outputs]
        if isinstance(result, dict):
            picked = {n: result[n] for n in names if n in result}
        elif isinstance(result, tuple | list):
            order = indexed_order(names) or list(range(len(names)))
            if max(order, default=-1) >= len(result):
                raise InternalError(
                    f"model '{self.model.name}': forward() returned {len(result)} outputs, "
                    f"config expects {names}"
                )
            picked = {n: result[i] for n, i in zip(names, order, strict=True)}
        elif isinstance(result, torch.Tensor):
            picked = {names[0]: result} if names else {}
        else:
            raise InternalError(
                f"model '{self.model.name}': forward() returned {type(result).__name__}, not tensors"
            )
        return {n: _to_numpy(torch, v) for n, v in picked.items()}


def _signature_args(module: Any) -> list[str] | None:
    import inspect

    try:
        return [p for p in inspect.signature(module.forward).parameters if p != "self"]
    except (TypeError, ValueError):
        return None


def _to_torch(torch: Any, name: str, array: np.ndarray, model: str) -> Any:
    if array.dtype.kind in "OSU":
        raise Unsupported(f"model '{model}': input '{name}' is BYTES, which the pytorch backend cannot pass")
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(np.ascontiguousarray(array).view(np.int16).copy()).view(torch.bfloat16)
    if not array.flags.writeable or not array.flags.c_contiguous:
        array = np.array(array, copy=True, order="C")
    return torch.from_numpy(array)


def _to_numpy(torch: Any, value: Any) -> np.ndarray:
    if not isinstance(value, torch.Tensor):
        return np.asarray(value)
    value = value.detach().cpu()
    if value.dtype == torch.bfloat16:
        return np.asarray(value.view(torch.int16).numpy().view(ml_dtypes.bfloat16))
    return np.asarray(value.numpy())
