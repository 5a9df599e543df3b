"""Model backends. Each is imported lazily by name, so a missing framework fails only the
models that use it, with a message naming the model, the backend and what is missing.

Backend modules import their framework inside ``load_instance`` (through
:func:`flowserve.nodes.backends._support.require`), so the error is raised when the model
loads, and the server keeps serving everything else.
"""

from __future__ import annotations

import importlib

from flowserve.core.errors import Unsupported
from flowserve.nodes.backends.autocomplete import onnx_autocomplete, python_autocomplete
from flowserve.nodes.backends.base import BackendNode
from flowserve.spec.triton import AUTOCOMPLETE

# backend name -> "module:class" of its BackendNode subclass
BACKENDS: dict[str, str] = {
    "python": "flowserve.nodes.backends.python_model:PythonModelBackend",
    "onnxruntime": "flowserve.nodes.backends.onnxruntime:OnnxRuntimeBackend",
    "pytorch": "flowserve.nodes.backends.torch:TorchBackend",
    "tensorrt": "flowserve.nodes.backends.tensorrt:TensorRTBackend",
    "dali": "flowserve.nodes.backends.dali:DaliBackend",
    "fil": "flowserve.nodes.backends.fil:FilBackend",
}

# config auto-complete at scan time (the spec layer calls these; frameworks load lazily)
AUTOCOMPLETE.setdefault("onnxruntime", onnx_autocomplete)
AUTOCOMPLETE.setdefault("python", python_autocomplete)


def backend_class(backend: str, model: str) -> type[BackendNode]:
    target = BACKENDS.get(backend)
    if target is None:
        known = ", ".join(sorted(BACKENDS))
        raise Unsupported(f"model '{model}': backend '{backend}' is not supported (available: {known})")
    module_name, _, cls_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or a native library failing as it loads
        raise Unsupported(
            f"model '{model}': backend '{backend}' cannot be used here: {type(exc).__name__}: {exc}"
        ) from None
    cls: type[BackendNode] = getattr(module, cls_name)
    return cls
