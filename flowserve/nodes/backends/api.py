"""The backend extension API: how a separately installed package adds a model backend.

**Version 1.0** (:data:`API_VERSION`). A backend states the version it was written against
(``Backend.api_version``); flowserve loads it when the major numbers are equal and the
backend's minor is not newer than flowserve's. Additions bump the minor, changes the major.

Discovery
---------
A distribution declares its backends as Python entry points in the group ``flowserve.backends``;
the entry point's name is the backend name a model's config uses::

    # pyproject.toml of the plugin
    [project.entry-points."flowserve.backends"]
    affine = "my_package.backend:AffineBackend"

    # config.pbtxt of a model
    backend: "affine"

Entry-point *names* are read when :mod:`flowserve.nodes.backends` is imported (metadata only,
a few milliseconds); a plugin's code is imported the first time a model uses it. A plugin that
fails to import, has the wrong API version or raises while it initialises fails only the
models that use it, with a message naming the plugin's distribution and entry point. Built-in
backends keep their names: a plugin with a built-in's name is ignored (with a warning).

The three levels (Triton's backend API)
---------------------------------------
- :class:`Backend`: one object per backend per process, shared by its models. ``initialize()``
  runs once before its first model loads, ``finalize()`` after the last of its models is
  unloaded (at the latest when the server shuts down).
- :class:`Model`: one per loaded model version (``Backend.create_model(ModelInfo)``);
  ``finalize()`` when that version unloads, after its instances.
- :class:`ModelInstance`: one per instance (``Model.create_instance(InstanceInfo)``); each
  instance has its own thread, on which it is created, executes and is finalized, and runs one
  batch at a time. ``execute(requests)`` takes a list of requests (each a dict of input name
  -> numpy array, already checked against the config: names, datatypes, shapes) and returns
  one dict of outputs per request, in order. Raising fails the whole batch.

Flowserve does the rest unchanged, as for its built-in backends: dynamic batching
(``dynamic_batching`` in the config), instance groups and placement, statistics and metrics,
reshape, warmup (``model_warmup``), sequence batching, ensembles and YAML graphs.

Attributes (:class:`BackendAttributes`, a class attribute ``attributes`` of the backend)
------------------------------------------------------------------------------------------
- ``batching``: the backend's models may batch (``max_batch_size > 0``); if False such a
  model fails to load with a clear message.
- ``merge_requests``: True (default): a batch reaches ``execute`` as *one* request whose rows
  are the rows of all batched requests (outputs are split back by rows). False: ``execute``
  gets the batched requests as they came (Triton's model of a batch).
- ``parallel_instance_loading``: instances may be created at the same time (up to the
  server's ``--model-load-thread-count``), so ``create_instance`` must be thread-safe.
- ``preferred_instance_kind`` / ``preferred_instance_count``: the instance group used when a
  model's config has none (``KIND_GPU`` falls back to the CPU where there is no GPU).
- ``inline_ok``: a cheap ``execute`` may run on the server's event loop (no thread hop); only
  for code that is thread-agnostic and never blocks.

Errors: raise the exceptions re-exported here (:class:`InvalidArgument`, :class:`Unsupported`,
:class:`Unavailable`, :class:`InternalError`) to choose the status clients see; any other
exception is reported as an internal error naming the model, the backend and the plugin.

Auto-complete (optional): a classmethod ``auto_complete(config, version_dirs)`` receives the
model's config as Triton prints it (JSON-like dict) and returns what to fill in or None:
``{"max_batch_size": 8, "dynamic_batching": True, "input": [{"name": ..., "data_type":
"TYPE_FP32", "dims": [-1]}], "output": [...]}``. It runs when the repository is scanned,
before the backend is initialised.

A complete example lives in ``examples/flowserve-example-backend/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from flowserve.core.errors import InternalError, InvalidArgument, Unavailable, Unsupported

API_VERSION: tuple[int, int] = (1, 0)
ENTRY_POINT_GROUP = "flowserve.backends"

TensorMap = dict[str, np.ndarray]
InstanceKind = Literal["KIND_CPU", "KIND_GPU", "KIND_AUTO"]

__all__ = [
    "API_VERSION",
    "ENTRY_POINT_GROUP",
    "Backend",
    "BackendAttributes",
    "InstanceInfo",
    "InternalError",
    "InvalidArgument",
    "Model",
    "ModelInfo",
    "ModelInstance",
    "TensorInfo",
    "TensorMap",
    "Unavailable",
    "Unsupported",
    "compatible",
]


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """A configured input or output: Triton datatype name (``FP32``, ``BYTES``...) and dims
    without the batch dimension when the model batches (-1: any size)."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What a model version is: its files, its (auto-completed) config and its parameters."""

    name: str
    version: int
    version_path: Path  # <repository>/<model>/<version>
    model_path: Path  # <repository>/<model>
    max_batch_size: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    parameters: Mapping[str, str]
    default_model_filename: str
    config: Mapping[str, Any] = field(default_factory=dict)  # the config as Triton prints it


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """Where one instance runs (``kind`` CPU, or GPU ``device_id``)."""

    model: ModelInfo
    index: int
    name: str
    kind: Literal["CPU", "GPU"]
    device_id: int = 0


@dataclass(frozen=True, slots=True)
class BackendAttributes:
    batching: bool = True
    merge_requests: bool = True
    parallel_instance_loading: bool = False
    preferred_instance_kind: InstanceKind = "KIND_CPU"
    preferred_instance_count: int = 1
    inline_ok: bool = False


class ModelInstance:
    """One instance of a model; all its calls come from its own thread."""

    def execute(self, requests: list[TensorMap]) -> list[TensorMap]:
        raise NotImplementedError

    def finalize(self) -> None:
        """Release what the instance holds (called once, on its thread)."""


class Model:
    """One loaded model version."""

    def create_instance(self, info: InstanceInfo) -> ModelInstance:
        raise NotImplementedError

    def finalize(self) -> None:
        """Release what the model holds (after all its instances are finalized)."""


class Backend:
    """A backend; subclass it and name the subclass in an entry point. Constructed with no
    arguments, once per process, when a model first uses it."""

    api_version: ClassVar[tuple[int, int]] = API_VERSION
    attributes: ClassVar[BackendAttributes] = BackendAttributes()

    def initialize(self) -> None:
        """Called once before the backend's first model is created."""

    def finalize(self) -> None:
        """Called once after the backend's last model is finalized."""

    def create_model(self, info: ModelInfo) -> Model:
        raise NotImplementedError

    @classmethod
    def auto_complete(cls, config: dict[str, Any], version_dirs: list[Path]) -> dict[str, Any] | None:
        """Fill what the config leaves out (see the module docstring); None: nothing."""
        return None


def compatible(version: Any) -> str:
    """ "" when a backend written for ``version`` can run here, else why not."""
    if not (isinstance(version, tuple) and len(version) == 2 and all(isinstance(v, int) for v in version)):
        return f"api_version must be a (major, minor) tuple of ints, got {version!r}"
    major, minor = version
    if major != API_VERSION[0] or minor > API_VERSION[1]:
        have = ".".join(map(str, API_VERSION))
        return f"it was written for backend API {major}.{minor}; this flowserve implements {have}"
    return ""
