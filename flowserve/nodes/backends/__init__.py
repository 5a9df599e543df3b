"""Model backends. Each is imported lazily by name, so a missing framework fails only the
models that use it, with a message naming the model, the backend and what is missing.

Backend modules import their framework inside ``load_instance`` (through
:func:`flowserve.nodes.backends._support.require`), so the error is raised when the model
loads, and the server keeps serving everything else.

Third-party backends (:mod:`flowserve.nodes.backends.api`) are found through the
``flowserve.backends`` entry points and merged into :data:`BACKENDS` as ``plugin:`` targets
when this package is imported (metadata only; :func:`refresh_plugins` re-reads them); their
code is imported when a model first uses them.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path

from flowserve.core.errors import Unsupported
from flowserve.nodes.backends import plugins
from flowserve.nodes.backends.autocomplete import onnx_autocomplete, python_autocomplete
from flowserve.nodes.backends.base import BackendNode
from flowserve.spec.model_config import ModelConfig
from flowserve.spec.triton import AutoComplete, Completion

# backend name -> "module:class" of its BackendNode subclass
BACKENDS: dict[str, str] = {
    "python": "flowserve.nodes.backends.python_model:PythonModelBackend",
    "onnxruntime": "flowserve.nodes.backends.onnxruntime:OnnxRuntimeBackend",
    "pytorch": "flowserve.nodes.backends.torch:TorchBackend",
    "tensorrt": "flowserve.nodes.backends.tensorrt:TensorRTBackend",
    "dali": "flowserve.nodes.backends.dali:DaliBackend",
    "fil": "flowserve.nodes.backends.fil:FilBackend",
    "tensorflow": "flowserve.nodes.backends.tensorflow:TensorFlowBackend",
    "openvino": "flowserve.nodes.backends.openvino:OpenVinoBackend",
    # generation (LLM) nodes: Triton's vLLM model layout, on vLLM or transformers (nodes/llm/)
    "vllm": "flowserve.nodes.llm.backend:LlmBackend",
    "llm": "flowserve.nodes.llm.backend:LlmBackend",
}


def _lazy_hook(target: str) -> AutoComplete:
    """An auto-complete hook imported from ``module:function`` only when it is called."""

    def hook(config: ModelConfig, model_dir: Path, version_dirs: list[Path]) -> Completion | None:
        module_name, _, name = target.partition(":")
        found: Completion | None = getattr(importlib.import_module(module_name), name)(
            config, model_dir, version_dirs
        )
        return found

    return hook


_HOOKS = "flowserve.nodes.backends"
# config auto-complete at scan time, by backend (frameworks load lazily): the repository layer
# passes autocompletions() to the spec layer's scan explicitly
AUTOCOMPLETE: dict[str, AutoComplete] = {
    "onnxruntime": onnx_autocomplete,
    "python": python_autocomplete,
    "tensorflow": _lazy_hook(f"{_HOOKS}.tensorflow:savedmodel_autocomplete"),
    "openvino": _lazy_hook(f"{_HOOKS}.openvino:openvino_autocomplete"),
    "vllm": _lazy_hook("flowserve.nodes.llm.backend:llm_autocomplete"),
    "llm": _lazy_hook("flowserve.nodes.llm.backend:llm_autocomplete"),
}


def autocompletions() -> dict[str, AutoComplete]:
    """Every backend's auto-complete hook (built-in and plugin), for a scan."""
    return dict(AUTOCOMPLETE)


def refresh_plugins() -> list[str]:
    """(Re)read the ``flowserve.backends`` entry points into BACKENDS and their auto-complete
    hooks into AUTOCOMPLETE; returns the plugin backend names found."""
    found = plugins.discover(BACKENDS)
    for name in found:
        AUTOCOMPLETE[name] = plugins.plugin_autocomplete(name, BACKENDS)
    return sorted(found)


try:
    refresh_plugins()
except Exception:  # broken metadata must not stop the server: plugin models fail on their own
    logging.getLogger("flowserve.plugins").exception("reading the flowserve.backends entry points failed")


def backend_class(backend: str, model: str) -> type[BackendNode]:
    target = BACKENDS.get(backend)
    if target is None:
        refresh_plugins()  # installed since this process started?
        target = BACKENDS.get(backend)
    if target is None:
        known = ", ".join(sorted(BACKENDS))
        raise Unsupported(f"model '{model}': backend '{backend}' is not supported (available: {known})")
    if target.startswith(plugins.PLUGIN_PREFIX):
        return plugins.node_class(backend, target, model)
    module_name, _, cls_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or a native library failing as it loads
        raise Unsupported(
            f"model '{model}': backend '{backend}' cannot be used here: {type(exc).__name__}: {exc}"
        ) from None
    cls: type[BackendNode] = getattr(module, cls_name)
    return cls
