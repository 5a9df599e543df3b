"""Triton's ``triton_python_backend_utils``, whole: what model.py files import as ``pb_utils``.

Installed as ``sys.modules["triton_python_backend_utils"]`` by the python backend, so an
unchanged Triton ``model.py`` (``import triton_python_backend_utils as pb_utils``) runs
in-process: no stub process, no shared-memory hop. The names are those of python_backend's
``triton_python_backend_utils.py`` and of the classes its stub binds from C++ (``Tensor``,
``InferenceRequest``, ``InferenceResponse``, ``InferenceResponseSender``, ``ResponseIterator``,
``TritonError``, ``Logger``, ``MetricFamily``/``Metric``, ``PreferredMemory``,
``InferenceTrace``, ``load_model``/``unload_model``/``is_model_ready``, ``get_model_dir``).

GPU tensors as in Triton: ``Tensor.from_dlpack`` keeps a DLPack tensor where it is (a CUDA
tensor stays on its GPU, ``is_cpu()`` False, and an output made of it flows on as a device
tensor, no copy), ``to_dlpack()`` hands it back as it is; with the model parameter
``FORCE_CPU_ONLY_INPUT_TENSORS`` "no" the inputs come as their producers made them (a torch
GPU model's output stays on the GPU). BLS responses (``PreferredMemory`` GPU) stay in host
memory: that call fails with an error naming it.

BLS (business logic scripting): ``pb_utils.InferenceRequest(model_name=..., inputs=[...],
requested_output_names=[...]).exec()`` (or ``await ....async_exec()`` in an ``async def
execute``) runs another loaded model or graph of the same engine; ``exec(decoupled=True)``
returns the stream of its responses. The python backend gives each instance's thread a
:class:`BlsLink` to its engine; requests are handed to the engine's event loop, never run on it.

Custom metrics (``MetricFamily``) are kept process-wide as in Triton's core, and exported on
``/metrics`` by :func:`custom_metrics` (read by the metrics collector).

This module is the surface only; the code lives in :mod:`flowserve.nodes.backends.pb`, one
concern a module: ``tensor`` (Tensor, memory), ``requests`` and ``responses`` (InferenceRequest,
InferenceResponse, the response sender), ``bls`` (exec, ResponseIterator), ``link`` (how a model
reaches its engine), ``control`` (load/unload/readiness), ``config`` (model configuration),
``dtypes``, ``errors``, ``flags``, ``logger``, ``metrics``.
"""

from __future__ import annotations

from flowserve.nodes.backends.pb.bls import ResponseIterator
from flowserve.nodes.backends.pb.config import (
    ModelConfig,
    get_input_config_by_name,
    get_output_config_by_name,
    using_decoupled_model_transaction_policy,
)
from flowserve.nodes.backends.pb.control import is_model_ready, load_model, unload_model
from flowserve.nodes.backends.pb.dtypes import (
    TRITON_STRING_TO_NUMPY,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)
from flowserve.nodes.backends.pb.errors import ERROR_CODES, TritonError, TritonModelException
from flowserve.nodes.backends.pb.flags import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
)
from flowserve.nodes.backends.pb.link import (
    BlsCall,
    BlsLink,
    current_link,
    get_model_dir,
    outside_execute,
    set_link,
    set_model_dir,
)
from flowserve.nodes.backends.pb.logger import Logger, LogLevel
from flowserve.nodes.backends.pb.metrics import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    Metric,
    MetricFamily,
    MetricKind,
    custom_metrics,
)
from flowserve.nodes.backends.pb.requests import InferenceRequest, InferenceTrace, get_input_tensor_by_name
from flowserve.nodes.backends.pb.responses import (
    InferenceResponse,
    InferenceResponseSender,
    get_output_tensor_by_name,
)
from flowserve.nodes.backends.pb.tensor import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_CPU_PINNED,
    TRITONSERVER_MEMORY_GPU,
    MemoryType,
    PreferredMemory,
    Tensor,
)

__all__ = [
    "COUNTER",
    "ERROR_CODES",
    "GAUGE",
    "HISTOGRAM",
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_CPU_PINNED",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "BlsCall",
    "BlsLink",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "LogLevel",
    "Logger",
    "MemoryType",
    "Metric",
    "MetricFamily",
    "MetricKind",
    "ModelConfig",
    "PreferredMemory",
    "ResponseIterator",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "current_link",
    "custom_metrics",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_model_dir",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "outside_execute",
    "serialize_byte_tensor",
    "set_link",
    "set_model_dir",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]
