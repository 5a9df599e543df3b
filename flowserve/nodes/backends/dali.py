"""NVIDIA DALI backend (``dali``, ``model.dali``: the bytes of a pipeline's ``serialize()``).

One deserialized pipeline per instance, run synchronously on the instance's thread. Inputs
are fed by name to the pipeline's ``external_source`` operators; outputs map to the config's
outputs in the pipeline's output order (as Triton's DALI backend does). A batched model feeds
the request's rows as the pipeline batch (up to ``max_batch_size``); an unbatched one feeds
one sample.

On a machine without a GPU the pipeline is built with ``device_id=None`` (CPU operators only);
a pipeline with GPU operators then fails to load with DALI's message and the model's name.
Parameter ``num_threads`` sets DALI's CPU worker threads (default 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from flowserve.core.errors import InternalError, InvalidArgument, Unsupported
from flowserve.core.node import TensorMap
from flowserve.nodes.backends._support import Parameters, Placement, model_file, placement, require
from flowserve.nodes.backends.base import BackendNode


@dataclass
class DaliInstance:
    pipeline: Any
    place: Placement


class DaliBackend(BackendNode):
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
        return DaliInstance(pipe, place)

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
        for name, array in inputs.items():
            data = np.ascontiguousarray(array)
            pipe.feed_input(name, data if batched else data[np.newaxis, ...])
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
            out[name] = self._array(name, tensor_list, batched)
        return out

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
