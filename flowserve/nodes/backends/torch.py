"""PyTorch backend (``pytorch_libtorch`` platform): TorchScript ``model.pt`` or a
``torch.export`` program ``model.pt2`` (chosen by the file's suffix; ``model.pt2`` is used when
``model.pt`` is absent and no ``default_model_filename`` is set).

Inputs and outputs are mapped as Triton's PyTorch backend maps them:

- inputs named as ``forward``'s arguments go to those arguments; otherwise names of the form
  ``<name>__<index>`` (``INPUT__0``) give the position; otherwise the config's order does;
- a tensor result is the single output; a tuple/list result is indexed by ``<name>__<index>``
  (``OUTPUT__0``) or, without that form, by the config's order; a dict result by name.

Tensors stay where they are (flowserve/core/device.py): the node takes numpy or any DLPack
tensor (a torch tensor, an OrtValue, a DALI or cupy array) without a copy where torch can view
it (``torch.from_numpy``/``torch.from_dlpack``), and its outputs stay torch tensors, on the CPU
or on the instance's GPU. On a GPU an instance owns a device and a CUDA stream: an input made on
another stream is waited for with the producer's event (never a device-wide synchronize), the
module runs on the instance's stream, and each output carries an event recorded there. Copies
left: a read-only numpy input (a front end's buffer) and a host tensor going to a GPU instance,
counted in the model's ``bytes_copied``. A GPU instance copies host inputs in and outputs out
through its pinned staging (flowserve/nodes/backends/staging.py): one host copy into a reused
pinned block, then an asynchronous copy on the instance's stream (out: on its copy stream, the
consumer waiting on that copy's event). ``torch.jit.load``'s deprecation warning is filtered
where it is raised.
"""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from flowserve.core.device import CPU, Device, DeviceTensor, numpy_dtype, produced, take
from flowserve.core.errors import InternalError, InvalidArgument, Unsupported
from flowserve.core.node import TensorMap
from flowserve.nodes.backends._support import Parameters, Placement, placement, require
from flowserve.nodes.backends.base import BackendNode

# torch.export.load is not thread-safe (two models loading at once fail with
# "_CURRENT_DESERIALIZER is already set"): one load at a time in this process
_EXPORT_LOAD = threading.Lock()
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
    place: Device = CPU  # where its tensors live
    ops: Any = None  # the CUDA device driver (flowserve.nodes.backends.cuda) on a GPU
    staging: Any = None  # its pinned staging on a GPU (flowserve.nodes.backends.staging)


@contextmanager
def _quiet_jit() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_JIT_DEPRECATED, category=DeprecationWarning)
        yield


class TorchBackend(BackendNode):
    _torch: Any = None
    # takes DLPack tensors as they come and hands torch tensors on (flowserve/core/device.py)
    device_tensors = True

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
                module = load_exported(torch, path, device)
                forward_args = _signature_args(module)
            else:
                with _quiet_jit():
                    module = torch.jit.load(str(path), map_location=device)
                module.eval()
                forward_args = [a.name for a in module.forward.schema.arguments][1:]
        except Exception as exc:
            raise InvalidArgument(f"model '{model.name}': torch cannot load {path}: {exc}") from None
        positions = input_positions([t.name for t in model.inputs], forward_args)
        inference = params.flag("ENABLE_INFERENCE_MODE", True)
        if not place.gpu:
            return TorchInstance(module, device, None, positions, inference)
        from flowserve.nodes.backends.cuda import TorchCudaOps, staging_for

        where = Device("cuda", place.device)
        ops = TorchCudaOps(torch)
        stream = ops.stream(where)
        staging = staging_for(model, ops, where, stream)
        return TorchInstance(module, device, stream, positions, inference, where, ops, staging)

    def execute(self, instance: TorchInstance, inputs: TensorMap) -> TensorMap:
        torch = self._torch
        names = [t.name for t in self.model.inputs]
        args: list[Any] = [None] * (max(instance.positions, default=-1) + 1)
        copied = 0
        grad = torch.inference_mode() if instance.inference_mode else torch.no_grad()
        with grad:
            if instance.stream is None:
                for name, pos in zip(names, instance.positions, strict=True):
                    if name in inputs:
                        args[pos], n = _to_torch(torch, name, inputs[name], self.model.name)
                        copied += n
                while args and args[-1] is None:
                    args.pop()
                outputs = self._outputs(instance.module(*args), instance)
            else:
                with torch.cuda.device(instance.device), torch.cuda.stream(instance.stream):
                    for name, pos in zip(names, instance.positions, strict=True):
                        if name in inputs:
                            args[pos], n = self._on_gpu(instance, name, inputs[name])
                            copied += n
                    while args and args[-1] is None:
                        args.pop()
                    outputs = self._outputs(instance.module(*args), instance)
        if copied:
            self.stats.add_copied(copied)
        return outputs

    def _on_gpu(self, instance: TorchInstance, name: str, value: Any) -> tuple[Any, int]:
        """An input as a torch tensor on the instance's GPU, ordered before its stream's work:
        a tensor already there is waited for by event (no copy); host memory is copied in."""
        torch = self._torch
        if isinstance(value, DeviceTensor) and value.device == instance.place:
            return torch_view(torch, take(value, instance.stream)), 0
        if isinstance(value, DeviceTensor) and not value.device.is_cpu:
            # another GPU: torch copies on the source GPU's current stream (then orders the
            # instance's stream after the copy), so that stream waits on the producer's event
            from flowserve.nodes.backends.cuda import for_peer_copy

            with torch.cuda.device(value.device.index):  # torch's __dlpack__ wants its device current
                source = torch_view(torch, for_peer_copy(value, instance.ops))
            return source.to(instance.device, non_blocking=True), value.nbytes
        if instance.staging is not None:
            array = value.host()[0] if isinstance(value, DeviceTensor) else value  # a view
            if array.dtype.kind in "OSU":
                raise Unsupported(
                    f"model '{self.model.name}': input '{name}' is BYTES, which the pytorch backend "
                    "cannot pass"
                )
            return instance.staging.upload(array), int(array.nbytes)
        host, _ = _to_torch(torch, name, value, self.model.name)
        return host.to(instance.device, non_blocking=True), int(host.numel() * host.element_size())

    def _outputs(self, result: Any, instance: TorchInstance) -> TensorMap:
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
        return {n: self._tensor(v, instance) for n, v in picked.items()}

    def _tensor(self, value: Any, instance: TorchInstance) -> Any:
        """An output as it is: a torch tensor wrapped with its dtype, shape and device (and on
        a GPU the event recorded on the instance's stream after it)."""
        torch = self._torch
        if not isinstance(value, torch.Tensor):
            return np.asarray(value)
        value = value.detach()
        dtype = numpy_dtype(value.dtype)
        shape = tuple(int(d) for d in value.shape)
        if instance.stream is None:
            return DeviceTensor(value, dtype, shape, CPU, to_numpy=torch_to_numpy)
        from flowserve.nodes.backends.cuda import cuda_to_numpy

        to_numpy = instance.staging.to_numpy if instance.staging is not None else cuda_to_numpy
        return produced(value, instance.stream, instance.ops, dtype, shape, instance.place, to_numpy)


def load_exported(torch: Any, path: Path, device: Any) -> Any:
    """A ``torch.export`` program's module on ``device``. Off the CPU through
    ``torch.export.passes.move_to_device_pass``, which moves the parameters, buffers and
    constants *and* the devices the graph names: a ``torch.ones(n)`` in ``forward`` is exported
    as ``aten.ones(..., device=cpu)``, which ``module().to(device)`` leaves on the CPU (the
    first request then fails: "Tensor on device cpu is not on the expected device")."""
    with _EXPORT_LOAD:
        program = torch.export.load(str(path))
    if torch.device(device).type != "cpu":
        try:
            from torch.export.passes import move_to_device_pass
        except ImportError:  # an older torch: parameters and buffers only
            return program.module().to(device)
        program = move_to_device_pass(program, device)
    return program.module()


def _signature_args(module: Any) -> list[str] | None:
    import inspect

    try:
        return [p for p in inspect.signature(module.forward).parameters if p != "self"]
    except (TypeError, ValueError):
        return None


def torch_view(torch: Any, value: Any) -> Any:
    """A torch tensor over the memory of any DLPack value (no copy)."""
    if isinstance(value, torch.Tensor):
        return value
    return torch.from_dlpack(value)


def _to_torch(torch: Any, name: str, value: Any, model: str) -> tuple[Any, int]:
    """A host input as a torch tensor and the bytes copied to make it: none for a writeable
    numpy array or a DLPack tensor (views), the array's size for a read-only or strided one."""
    if isinstance(value, DeviceTensor):
        if value.device.is_cpu:
            return torch_view(torch, value.value), 0
        host, copied = value.host()  # a CPU instance fed from a GPU
        tensor, _ = _to_torch(torch, name, host, model)
        return tensor, copied
    array: np.ndarray = value
    if array.dtype.kind in "OSU":
        raise Unsupported(f"model '{model}': input '{name}' is BYTES, which the pytorch backend cannot pass")
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(np.ascontiguousarray(array).view(np.int16).copy()).view(
            torch.bfloat16
        ), array.nbytes
    if not array.flags.writeable or not array.flags.c_contiguous:
        return torch.from_numpy(np.array(array, copy=True, order="C")), array.nbytes
    return torch.from_numpy(array), 0


def torch_to_numpy(value: Any) -> np.ndarray:
    """A CPU torch tensor as numpy, sharing its memory (BF16 as ml_dtypes.bfloat16)."""
    if str(value.dtype) == "torch.bfloat16":
        return np.asarray(value.view(dtype=_int16(value)).numpy().view(ml_dtypes.bfloat16))
    return np.asarray(value.numpy())


def _int16(value: Any) -> Any:
    import torch

    return torch.int16
