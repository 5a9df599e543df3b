"""Model backends. Each is imported lazily by name, so a missing framework fails only the
models that use it, with a message naming the model, the backend and what is missing."""

from __future__ import annotations

import importlib

from flowserve.core.errors import Unsupported
from flowserve.nodes.backends.base import BackendNode

# backend name -> "module:class" of its BackendNode subclass
BACKENDS: dict[str, str] = {
    "python": "flowserve.nodes.backends.python_model:PythonModelBackend",
}


def backend_class(backend: str, model: str) -> type[BackendNode]:
    target = BACKENDS.get(backend)
    if target is None:
        known = ", ".join(sorted(BACKENDS))
        raise Unsupported(f"model '{model}': backend '{backend}' is not supported (available: {known})")
    module_name, _, cls_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise Unsupported(f"model '{model}': backend '{backend}' cannot be used here: {exc}") from None
    cls: type[BackendNode] = getattr(module, cls_name)
    return cls
