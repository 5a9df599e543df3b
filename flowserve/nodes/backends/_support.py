"""What the framework backends share: lazy framework imports with clear errors, GPU probing,
instance placement (CPU or which GPU) and typed access to config ``parameters``.

Nothing here imports a framework at module level; a GPU is probed through the CUDA driver
(``libcuda.so.1``, ``cuInit``) with ctypes, so asking costs no framework and never crashes.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Literal

from flowserve.core.errors import InvalidArgument, Unsupported
from flowserve.spec.schema import ModelSpec

# Set to a non-empty value other than "0" to make flowserve behave as if no GPU were present.
NO_GPU_ENV = "FLOWSERVE_NO_GPU"


def require(module: str, model: str, backend: str, extra: str) -> ModuleType:
    """Import ``module`` or raise Unsupported naming the model, the backend and the package."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # ImportError, or an OSError/RuntimeError from a native library
        raise Unsupported(
            f"model '{model}': backend '{backend}' needs the Python package '{module}', which "
            f"cannot be imported here ({type(exc).__name__}: {exc}); install it with "
            f"pip install 'flowserve[{extra}]'"
        ) from None


@functools.cache
def _cuda_probe() -> tuple[int, str]:
    """(number of CUDA devices, why there are none)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0, "no NVIDIA driver (libcuda.so.1 not found)"
    status = int(lib.cuInit(0))
    if status != 0:
        return 0, f"the CUDA driver failed to initialise (cuInit returned {status})"
    count = ctypes.c_int(0)
    status = int(lib.cuDeviceGetCount(ctypes.byref(count)))
    if status != 0 or count.value <= 0:
        return 0, "no CUDA-capable device"
    return int(count.value), ""


def gpu_count() -> int:
    """How many CUDA devices this process can use (0 without a driver or device)."""
    if os.environ.get(NO_GPU_ENV, "0") not in ("", "0"):
        return 0
    return _cuda_probe()[0]


def no_gpu_reason() -> str:
    """Why ``gpu_count()`` is 0 ("" when there is a GPU)."""
    if os.environ.get(NO_GPU_ENV, "0") not in ("", "0"):
        return f"GPUs are disabled by {NO_GPU_ENV}"
    return _cuda_probe()[1]


def has_gpu() -> bool:
    return gpu_count() > 0


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one instance runs: the CPU, or GPU number ``device``."""

    kind: Literal["CPU", "GPU"]
    device: int = 0
    # True when the config asked for KIND_GPU explicitly (a fallback to CPU is then an error)
    required: bool = False

    @property
    def gpu(self) -> bool:
        return self.kind == "GPU"


def placement(model: ModelSpec, index: int, backend: str, gpu_capable: bool = True) -> Placement:
    """The placement of instance ``index`` from the model's ``instance_group``s.

    KIND_CPU runs on the CPU; KIND_GPU needs a GPU (Unsupported otherwise, naming the model);
    KIND_AUTO (or no instance_group) takes a GPU when one is present and the backend can use
    it. Instances of a group go round-robin over its ``gpus`` (all GPUs when none are listed).
    """
    groups = list(model.instances)
    group = None
    start = 0
    for g in groups:
        if index < start + g.count:
            group = g
            break
        start += g.count
    kind = group.kind if group is not None else "KIND_AUTO"
    local = group.first + index - start if group is not None else index
    if kind in ("KIND_CPU", "KIND_MODEL"):
        return Placement("CPU")
    count = gpu_count()
    if kind == "KIND_GPU":
        if not gpu_capable:
            raise Unsupported(f"model '{model.name}': backend '{backend}' cannot run on a GPU (KIND_GPU)")
        if count == 0:
            raise Unsupported(
                f"model '{model.name}': instance_group asks for KIND_GPU but backend '{backend}' "
                f"finds no GPU here: {no_gpu_reason()}"
            )
    elif count == 0 or not gpu_capable:
        return Placement("CPU")
    gpus = list(group.gpus) if group is not None and group.gpus else list(range(count))
    device = gpus[local % len(gpus)]
    if device >= count:
        raise Unsupported(
            f"model '{model.name}': instance_group names GPU {device} but only {count} GPU(s) exist"
        )
    return Placement("GPU", device, required=kind == "KIND_GPU")


def model_file(model: ModelSpec, version_path: str, default: str) -> Path:
    """The model file of a version directory (``default_model_filename`` or the default)."""
    path = Path(version_path) / (model.default_model_filename or default)
    if not path.exists():
        raise InvalidArgument(f"model '{model.name}': model file {path} does not exist")
    return path


class Parameters:
    """Typed, named access to a model's config ``parameters`` (all strings in config.pbtxt)."""

    def __init__(self, model: ModelSpec) -> None:
        self._model = model.name
        self._raw = dict(model.parameters)
        self._values = {k.lower(): v.strip() for k, v in model.parameters.items()}

    def text(self, key: str, default: str = "") -> str:
        return self._values.get(key.lower(), default)

    def has(self, key: str) -> bool:
        return key.lower() in self._values

    def integer(self, key: str, default: int) -> int:
        raw = self._values.get(key.lower())
        if raw is None or raw == "":
            return default
        try:
            return int(raw)
        except ValueError:
            raise InvalidArgument(
                f"model '{self._model}': parameter '{key}' must be an integer, got '{raw}'"
            ) from None

    def number(self, key: str, default: float) -> float:
        raw = self._values.get(key.lower())
        if raw is None or raw == "":
            return default
        try:
            return float(raw)
        except ValueError:
            raise InvalidArgument(
                f"model '{self._model}': parameter '{key}' must be a number, got '{raw}'"
            ) from None

    def flag(self, key: str, default: bool) -> bool:
        raw = self._values.get(key.lower())
        if raw is None or raw == "":
            return default
        value = raw.lower()
        if value in ("1", "true", "yes", "on"):
            return True
        if value in ("0", "false", "no", "off"):
            return False
        raise InvalidArgument(f"model '{self._model}': parameter '{key}' must be true or false, got '{raw}'")

    def prefixed(self, prefix: str) -> dict[str, str]:
        """Parameters whose key starts with ``prefix`` (keys as written, prefix kept)."""
        return {k: v for k, v in self._raw.items() if k.lower().startswith(prefix.lower())}
