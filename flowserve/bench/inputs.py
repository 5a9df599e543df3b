"""The tensors a benchmark sends: random or zero data shaped by the model's metadata, or samples
read from a JSON file (perf_analyzer's ``--input-data`` layout) or a NumPy ``.npy``/``.npz``.

Built once before the load starts; the transports encode every sample once too, so nothing of
this runs per request."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flowserve.bench.model import ModelInfo, TensorInfo
from flowserve.core.datatypes import to_numpy

Sample = dict[str, np.ndarray]


class InputError(ValueError):
    """Inputs that cannot be built: names the model, the tensor and what is wrong."""


def parse_shapes(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``["INPUT0:16", "IMAGE:3,224,224"]`` -> shapes by input name (perf_analyzer's ``--shape``,
    without the batch dimension)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.split(",") if d.strip())
        except ValueError:
            raise InputError(f"--shape {item!r}: expected NAME:D1,D2,... (integers)") from None
    return shapes


def _shape(
    model: ModelInfo, tensor: TensorInfo, shapes: Mapping[str, tuple[int, ...]], batch: int
) -> list[int]:
    dims = list(tensor.shape)
    batched = model.max_batch_size > 0
    if batched and dims and dims[0] == -1:
        dims = dims[1:]
    if tensor.name in shapes:
        given = list(shapes[tensor.name])
        if len(given) != len(dims) or any(d not in (-1, g) for d, g in zip(dims, given, strict=True)):
            raise InputError(
                f"model '{model.name}': input '{tensor.name}': --shape {given} does not fit its shape {dims}"
            )
        dims = given
    if any(d < 0 for d in dims):
        raise InputError(
            f"model '{model.name}': input '{tensor.name}' has a variable shape {list(tensor.shape)}: "
            f"give one with --shape {tensor.name}:D1,D2"
        )
    return [batch, *dims] if batched else dims


def _random(datatype: str, shape: list[int], rng: np.random.Generator) -> np.ndarray:
    if datatype == "BYTES":
        count = int(np.prod(shape)) if shape else 1
        items = [str(int(v)).encode() for v in rng.integers(0, 1000, count)]
        return np.array(items, dtype=np.object_).reshape(shape)
    dtype = to_numpy(datatype)
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(np.bool_)
    if dtype.kind in "iu":
        return rng.integers(0, 100, shape).astype(dtype)
    return rng.random(shape, dtype=np.float32).astype(dtype)


def generated(
    model: ModelInfo,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    batch_size: int = 1,
    zero: bool = False,
    seed: int = 0,
) -> list[Sample]:
    """One sample of random (or zero) data for every input of ``model``."""
    if model.max_batch_size == 0 and batch_size != 1:
        raise InputError(f"model '{model.name}' does not batch (max_batch_size 0): --batch-size must be 1")
    if model.max_batch_size and batch_size > model.max_batch_size:
        raise InputError(
            f"model '{model.name}': --batch-size {batch_size} exceeds its max_batch_size "
            f"{model.max_batch_size}"
        )
    rng = np.random.default_rng(seed)
    sample: Sample = {}
    for tensor in model.inputs:
        shape = _shape(model, tensor, shapes or {}, batch_size)
        data = _random(tensor.datatype, shape, rng)
        sample[tensor.name] = np.zeros_like(data) if zero and tensor.datatype != "BYTES" else data
    return [sample]


def _array(model: ModelInfo, tensor: TensorInfo, value: Any, batch: int) -> np.ndarray:
    shape: list[int] | None = None
    if isinstance(value, dict):
        shape = [int(d) for d in value.get("shape", [])] or None
        value = value.get("content", value.get("b64"))
    if tensor.datatype == "BYTES":
        flat = np.array(
            [v.encode() if isinstance(v, str) else bytes(v) for v in np.ravel(np.array(value, dtype=object))],
            dtype=np.object_,
        )
    else:
        flat = np.asarray(value, dtype=to_numpy(tensor.datatype)).ravel()
    dims = shape or [d for d in tensor.shape[1 if model.max_batch_size else 0 :]]
    if any(d < 0 for d in dims) and shape is None:
        raise InputError(
            f"model '{model.name}': input '{tensor.name}' has a variable shape: give "
            '{"content": [...], "shape": [...]} in the data file'
        )
    try:
        array = flat.reshape(dims)
    except ValueError:
        raise InputError(
            f"model '{model.name}': input '{tensor.name}': {flat.size} values do not fit the shape {dims}"
        ) from None
    if model.max_batch_size:
        array = np.repeat(array[np.newaxis, ...], batch, axis=0)
    return array


def from_file(model: ModelInfo, path: Path, batch_size: int = 1) -> list[Sample]:
    """Samples from ``path``: ``.json`` as perf_analyzer's ``--input-data`` (``{"data": [{NAME:
    [values] or {"content": [...], "shape": [...]}}, ...]}``), ``.npz`` (one array per input
    name, the batch dimension included) or ``.npy`` (a model of one input)."""
    try:
        if path.suffix == ".json":
            document = json.loads(path.read_text())
            entries = document.get("data") if isinstance(document, dict) else None
            if not isinstance(entries, list) or not entries:
                raise InputError(f'{path}: expected {{"data": [{{INPUT: values, ...}}, ...]}}')
            samples = []
            for i, entry in enumerate(entries):
                entry = entry[0] if isinstance(entry, list) and entry else entry  # a one-step sequence
                missing = [t.name for t in model.inputs if t.name not in entry]
                if missing:
                    raise InputError(f"{path}: data[{i}] lacks input(s) {missing} of model '{model.name}'")
                samples.append({t.name: _array(model, t, entry[t.name], batch_size) for t in model.inputs})
            return samples
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as archive:
                arrays = {k: archive[k] for k in archive.files}
        elif path.suffix == ".npy":
            if len(model.inputs) != 1:
                raise InputError(
                    f"{path}: a .npy file feeds a model of one input; use .npz for '{model.name}'"
                )
            arrays = {model.inputs[0].name: np.load(path, allow_pickle=False)}
        else:
            raise InputError(f"{path}: input data must be .json, .npz or .npy")
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, ValueError) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"{path}: {exc}") from None
    missing = [t.name for t in model.inputs if t.name not in arrays]
    if missing:
        raise InputError(f"{path}: no array for input(s) {missing} of model '{model.name}'")
    return [{t.name: np.asarray(arrays[t.name]) for t in model.inputs}]


__all__ = ["InputError", "Sample", "from_file", "generated", "parse_shapes"]
