"""Check a request's tensors against a plan's inputs before anything runs.

Messages follow Triton's wording where it has one, and always name the model and the tensor.
"""

from __future__ import annotations

import numpy as np

from flowserve.core.datatypes import from_numpy, to_numpy
from flowserve.core.device import DeviceTensor
from flowserve.core.errors import InvalidArgument
from flowserve.core.node import TensorMap
from flowserve.graph.plan import Plan


def validate_inputs(plan: Plan, inputs: TensorMap) -> int:
    """Raise InvalidArgument for a bad request; return its batch size (1 when not batching)."""
    name = plan.name
    expected = plan.inputs
    for key in inputs:
        if key not in expected:
            allowed = ", ".join(expected) or "none"
            raise InvalidArgument(
                f"unexpected inference input '{key}' for model '{name}', allowed inputs are: {allowed}"
            )
    missing = [k for k, t in expected.items() if not t.optional and k not in inputs]
    if missing:
        raise InvalidArgument(
            f"expected {len(expected)} inputs but got {len(inputs)} inputs for model '{name}'; "
            f"missing: {', '.join(missing)}"
        )
    max_batch = plan.max_batch_size
    batch = -1
    for key, array in inputs.items():
        spec = expected[key]
        have = (
            from_numpy(array.dtype) if isinstance(array, np.ndarray | DeviceTensor) else type(array).__name__
        )
        if have != spec.datatype:
            raise InvalidArgument(
                f"inference input '{key}' data-type is '{have}', but model '{name}' expects '{spec.datatype}'"
            )
        shape = array.shape
        dims = spec.dims
        ok = len(shape) == len(dims) and all(w == -1 or w == h for h, w in zip(shape, dims, strict=True))
        if not ok:
            want = list(dims[1:]) if max_batch > 0 else list(dims)
            got = list(shape[1:]) if max_batch > 0 and shape else list(shape)
            raise InvalidArgument(
                f"unexpected shape for input '{key}' for model '{name}'. Expected {want}, got {got}"
                + (" (with a leading batch dimension)" if max_batch > 0 else "")
            )
        if max_batch > 0:
            rows = shape[0]
            if rows > max_batch:
                raise InvalidArgument(
                    f"inference request batch-size must be <= {max_batch} for '{name}', "
                    f"input '{key}' has {rows}"
                )
            if batch not in (-1, rows):
                raise InvalidArgument(
                    f"inputs of model '{name}' disagree on the batch size: input '{key}' has "
                    f"{rows} rows, another input has {batch}"
                )
            batch = rows
    return max(batch, 1)


class InputValidator:
    """:func:`validate_inputs` for one plan, with the checks compiled once: a request that
    is certainly valid (known inputs, exact dtypes, shapes matching the declared dims) is
    passed in a few dictionary and tuple lookups; anything else (an error, BYTES, an unusual
    but acceptable dtype, optional inputs left out) goes through :func:`validate_inputs`,
    which accepts or rejects it with its message. Same answers, less work per request."""

    __slots__ = ("_max_batch", "_plan", "_specs")

    def __init__(self, plan: Plan) -> None:
        self._plan = plan
        self._max_batch = plan.max_batch_size
        specs: dict[str, tuple[np.dtype[np.generic], int, tuple[tuple[int, int], ...]]] = {}
        complete = True
        for name, spec in plan.inputs.items():
            if spec.datatype == "BYTES" or spec.optional:
                complete = False
                continue
            fixed = tuple((i, d) for i, d in enumerate(spec.dims) if d != -1)
            specs[name] = (to_numpy(spec.datatype), len(spec.dims), fixed)
        # the fast path only when every input is plain and required
        self._specs = specs if complete else None

    def __call__(self, inputs: TensorMap) -> int:
        """The request's batch size (1 when not batching); InvalidArgument when invalid."""
        specs = self._specs
        if specs is None or len(inputs) != len(specs):
            return validate_inputs(self._plan, inputs)
        max_batch = self._max_batch
        batch = -1
        for key, array in inputs.items():
            spec = specs.get(key)
            if spec is None or type(array) is not np.ndarray or array.dtype != spec[0]:
                return validate_inputs(self._plan, inputs)
            shape = array.shape
            if len(shape) != spec[1]:
                return validate_inputs(self._plan, inputs)
            for axis, size in spec[2]:
                if shape[axis] != size:
                    return validate_inputs(self._plan, inputs)
            if max_batch > 0:
                rows = shape[0]
                if rows > max_batch or batch not in (-1, rows):
                    return validate_inputs(self._plan, inputs)
                batch = rows
        return max(batch, 1)
