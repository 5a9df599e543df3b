"""Running warmup samples (Triton's ``model_warmup``) before a model or graph reports READY.

A repository model's samples run through *each* instance, directly on the instance's thread
(not through the batcher), ``count`` times each, after every instance loaded and before the
model enters the registry; a YAML graph's samples run ``count`` times through the graph. Any
failure fails the load with a message naming the sample (and the instance). Warmup runs are not
inference statistics; they are counted on the node (``BackendNode.warmup_runs``).

Data: ``zero_data`` zeros (BYTES: empty elements); ``random_data`` uniform [0, 1) for floats,
integers in [0, 10) clipped to the type, random booleans, 8 random letters for BYTES (seeded by
the sample's name, so a load is reproducible); ``input_data_file`` the file's raw row-major bytes
for one row, repeated for ``batch_size`` rows.
"""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np

from flowserve.core.datatypes import to_numpy
from flowserve.core.errors import FlowserveError, InvalidArgument
from flowserve.core.node import TensorMap
from flowserve.core.wire import from_raw
from flowserve.spec.schema import WarmupInput, WarmupSpec


def sample_tensors(sample: WarmupSpec, batched: bool) -> TensorMap:
    """The input tensors of one sample: ``(batch_size, *dims)`` when batched, else ``dims``."""
    rng = np.random.default_rng(zlib.crc32(sample.name.encode()))
    out: TensorMap = {}
    for name, spec in sample.inputs.items():
        row = _row(name, spec, rng)
        if batched:
            row = np.repeat(row[np.newaxis, ...], sample.batch_size, axis=0)
        out[name] = row
    return out


def _row(name: str, spec: WarmupInput, rng: np.random.Generator) -> np.ndarray:
    shape = tuple(spec.dims)
    if spec.source == "file":
        return from_raw(name, spec.datatype, shape, Path(spec.path).read_bytes()).copy()
    dtype = to_numpy(spec.datatype)
    if spec.datatype == "BYTES":
        if spec.source == "zero":
            return np.full(shape, b"", dtype=object)
        letters = rng.integers(97, 123, size=(*shape, 8), dtype=np.uint8)
        flat = [bytes(v) for v in letters.reshape(-1, 8)]
        return np.array(flat, dtype=object).reshape(shape)
    if spec.source == "zero":
        return np.zeros(shape, dtype=dtype)
    if spec.datatype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype.kind in "iu":
        return rng.integers(0, 10, size=shape).astype(dtype)  # 0..9 fit every integer type
    return rng.random(size=shape).astype(dtype)


# run(instance index, inputs) -> outputs, on that instance
RunOn = Callable[[int, TensorMap], Awaitable[object]]


async def warm_up_instances(
    model: str, samples: tuple[WarmupSpec, ...], instances: int, batched: bool, run: RunOn
) -> int:
    """Run every sample ``count`` times on each of ``instances``; returns the number of runs.
    Raises InvalidArgument naming the model, the sample and the instance on the first failure."""
    runs = 0
    for sample in samples:
        inputs = sample_tensors(sample, batched)
        for index in range(instances):
            for _ in range(sample.count):
                try:
                    await run(index, inputs)
                except Exception as exc:
                    raise InvalidArgument(
                        f"model '{model}': warmup sample '{sample.name}' failed on instance {index}: "
                        f"{_text(exc)}"
                    ) from exc
                runs += 1
    return runs


async def warm_up_graph(
    graph: str, samples: tuple[WarmupSpec, ...], batched: bool, run: Callable[[TensorMap], Awaitable[object]]
) -> int:
    """Run every sample ``count`` times through a graph; returns the number of runs."""
    runs = 0
    for sample in samples:
        inputs = sample_tensors(sample, batched)
        for _ in range(sample.count):
            try:
                await run(inputs)
            except Exception as exc:
                raise InvalidArgument(
                    f"graph '{graph}': warmup sample '{sample.name}' failed: {_text(exc)}"
                ) from exc
            runs += 1
    return runs


def _text(exc: BaseException) -> str:
    if isinstance(exc, FlowserveError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"
