"""Check a request's tensors against a plan's inputs before anything runs.

Messages follow Triton's wording where it has one, and always name the model and the tensor.
An unknown input is refused by its name before the count is checked (Triton checks the count
first, so a request with all required inputs and one unknown gets "expected 2 inputs but got 3"
there; here it gets "unexpected inference input 'X'"), and a request without a required input
is refused even when its count is within the range (Triton lets that one reach the backend).
"""

from __future__ import annotations

from collections.abc import Iterable

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
        raise InvalidArgument(input_count_error(plan, inputs, missing))
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


def input_count_error(plan: Plan, inputs: TensorMap, missing: list[str]) -> str:
    """Triton's message for a request without all its required inputs (core's
    ValidateRequestInputs): the count expected, a range when the model has optional inputs."""
    total = len(plan.inputs)
    required = sum(1 for t in plan.inputs.values() if not t.optional)
    expected = f"{total} inputs" if required == total else f"number of inputs between {required} and {total}"
    return (
        f"expected {expected} but got {len(inputs)} inputs for model '{plan.name}'. "
        f"Got input(s) {_names(inputs)}, but missing required input(s) {_names(missing)}. "
        "Please provide all required input(s)."
    )


def _names(names: Iterable[str]) -> str:
    """``['A','B']``: a list of names as Triton writes it."""
    return "[" + ",".join(f"'{n}'" for n in names) + "]"


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
