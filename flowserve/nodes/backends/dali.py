"""NVIDIA DALI backend (``dali``, ``model.dali``: the bytes of a pipeline's ``serialize()``).

One deserialized pipeline per instance, run synchronously on the instance's thread. Inputs
are fed by name to the pipeline's ``external_source`` operators; outputs map to the config's
outputs in the pipeline's output order (as Triton's DALI backend does). A batched model feeds
the request's rows as the pipeline batch (up to ``max_batch_size``); an unbatched one feeds
one sample.

On a machine without a GPU the pipeline is built with ``device_id=None`` (CPU operators only);
a pipeline with GPU operators then fails to load with DALI's message and the model's name.
Parameter ``num_threads`` sets DALI's CPU worker threads (default 1).

Tensors stay where they are (flowserve/core/device.py): on a GPU with a CUDA torch, a GPU
output is handed on as a torch tensor on the instance's GPU. DALI's outputs are valid only until
the pipeline's next ``run()``, so each is cloned on the device (a device-to-device copy, counted
as bytes copied) on the instance's own stream, after that stream waited for DALI's work (the
stream is handed to DALI's ``__dlpack__``), with an event recorded there for the consumer to
wait on; the next ``run()`` starts once the clones are done. Nothing goes through the host. A
GPU output read on the host is copied through the instance's pinned staging
(flowserve/nodes/backends/staging.py: a reused pinned block, on the instance's copy stream, the
consumer waiting on that copy's event). A CUDA input (DLPack) is fed
to ``external_source`` as it is; a host input as numpy (a view for a CPU DLPack tensor), which
DALI copies to the GPU through pinned buffers of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from flowserve.core.device import Device, DeviceTensor, edges, take
from flowserve.core.errors import InternalError, InvalidArgument, Unsupported
from flowserve.core.node import TensorMap
from flowserve.nodes.backends._support import Parameters, Placement, model_file, placement, require
from flowserve.nodes.backends.base import BackendNode


@dataclass
class DaliInstance:
    pipeline: Any
    place: Placement
    ops: Any = None  # on a GPU with a CUDA torch: the device driver and the instance's stream
    stream: Any = None
    staging: Any = None  # and its pinned staging for outputs read on the host
    cloned: Any = None  # the event after the last run's clones: the next run waits for it


class DaliBackend(BackendNode):
    # takes DLPack tensors as they come; GPU outputs stay on the GPU (core/device.py)
    device_tensors = True

    def load_instance(self, index: int) -> DaliInstance:
        model = self.model
        dali = require("nvidia.dali", model.name, "dali", "dali")
        path = model_file(model, self.version_path, "model.dali")
        place = placement(model, index, "dali")
        params = Parameters(model)
        data = path.read_bytes()
        try:
            pipe = self._build(dali, data, place.device if place.gpu else None, params)
        except Exception as exc:
            if not place.gpu or place.required:
                hint = "" if place.gpu else " (no GPU here: the pipeline may only use CPU operators)"
                raise Unsupported(f"model '{model.name}': DALI cannot build {path}{hint}: {exc}") from None
            # KIND_AUTO on a GPU DALI cannot use: a CPU-only pipeline may still build
            try:
                pipe = self._build(dali, data, None, params)
            except Exception:
                raise Unsupported(f"model '{model.name}': DALI cannot build {path}: {exc}") from None
            place = Placement("CPU")
        instance = DaliInstance(pipe, place)
        if place.gpu:
            from flowserve.nodes.backends.cuda import cuda_ops

            instance.ops = cuda_ops()
            if instance.ops is not None:
                from flowserve.nodes.backends.cuda import staging_for

                where = Device("cuda", place.device)
                instance.stream = instance.ops.stream(where)
                instance.staging = staging_for(model, instance.ops, where, instance.stream)
        return instance

    def _build(self, dali: Any, data: bytes, device_id: int | None, params: Parameters) -> Any:
        pipe = dali.Pipeline.deserialize(
            serialized_pipeline=data,
            batch_size=max(self.model.max_batch_size, 1),
            num_threads=params.integer("num_threads", 1),
            device_id=device_id,
            prefetch_queue_depth=1,
            exec_async=False,
            exec_pipelined=False,
        )
        pipe.build()
        return pipe

    def execute(self, instance: DaliInstance, inputs: TensorMap) -> TensorMap:
        pipe = instance.pipeline
        batched = self.model.max_batch_size > 0
        if instance.cloned is not None:
            # DALI may reuse the last run's output buffers in this run (on its own stream, which
            # knows nothing of ours): the clones queued on the instance's stream must be done
            instance.ops.synchronize(instance.cloned)
            instance.cloned = None
        for name, value in edges(inputs).items():
            pipe.feed_input(name, self._feed(instance, value, batched))
        try:
            results = pipe.run()
        except Exception as exc:
            raise InternalError(f"model '{self.model.name}': DALI pipeline failed: {exc}") from None
        names = [t.name for t in self.model.outputs]
        if len(results) < len(names):
            raise InvalidArgument(
                f"model '{self.model.name}': the pipeline has {len(results)} outputs, config lists {names}"
            )
        out: TensorMap = {}
        for name, tensor_list in zip(names, results, strict=False):
            if instance.stream is not None and not hasattr(tensor_list, "as_array"):  # TensorListGPU
                out[name] = self._on_device(instance, name, tensor_list, batched)
                instance.cloned = instance.ops.record(instance.stream)
            else:
                out[name] = self._array(name, tensor_list, batched)
        return out

    def _feed(self, instance: DaliInstance, value: Any, batched: bool) -> Any:
        """An input as external_source takes it: a CUDA tensor as it is (DALI reads DLPack and
        CUDA array interface objects), anything else as contiguous numpy."""
        if isinstance(value, DeviceTensor) and not value.device.is_cpu and instance.stream is not None:
            import torch

            from flowserve.nodes.backends.cuda import torch_tensor

            tensor = torch_tensor(take(value, instance.stream), torch)
            instance.stream.synchronize()  # DALI copies on its own stream: the input must be ready
            return tensor if batched else tensor.unsqueeze(0)
        if isinstance(value, DeviceTensor):
            array, copied = value.host()
            if copied:
                self.stats.add_copied(copied)
        else:
            array = value
        data = np.ascontiguousarray(array)
        return data if batched else data[np.newaxis, ...]

    def _on_device(self, instance: DaliInstance, name: str, tensor_list: Any, batched: bool) -> Any:
        """A GPU output cloned on the instance's stream (DALI reuses its buffers on the next
        run) and handed on with an event recorded after the clone."""
        import torch

        from flowserve.nodes.backends.cuda import cuda_tensor, torch_tensor

        if not tensor_list.is_dense_tensor():
            shapes = sorted({tuple(s) for s in tensor_list.shape()})
            raise InternalError(
                f"model '{self.model.name}': output '{name}' has samples of different shapes {shapes}; "
                "a batched output needs one shape"
            )
        with torch.cuda.device(instance.place.device), torch.cuda.stream(instance.stream):
            # from_dlpack inside the instance's stream: torch passes that stream to DALI's
            # __dlpack__, which makes it wait for DALI's work. Outside, torch would pass the
            # legacy default stream, which torch's own (non-blocking) streams do not wait for.
            view = torch_tensor(tensor_list.as_tensor(), torch)
            owned = view.clone()
        self.stats.add_copied(int(owned.numel() * owned.element_size()))
        where = Device("cuda", instance.place.device)
        to_numpy = instance.staging.to_numpy if instance.staging is not None else None
        return cuda_tensor(owned if batched else owned[0], instance.stream, instance.ops, where, to_numpy)

    def _array(self, name: str, tensor_list: Any, batched: bool) -> np.ndarray:
        if hasattr(tensor_list, "as_cpu"):
            tensor_list = tensor_list.as_cpu()
        if not tensor_list.is_dense_tensor():
            shapes = sorted({tuple(s) for s in tensor_list.shape()})
            raise InternalError(
                f"model '{self.model.name}': output '{name}' has samples of different shapes {shapes}; "
                "a batched output needs one shape"
            )
        array = np.asarray(tensor_list.as_array())
        return array if batched else array[0]
