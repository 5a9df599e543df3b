"""Check a request's tensors against a plan's inputs before anything runs.

Messages follow Triton's wording where it has one, and always name the model and the tensor.
"""

from __future__ import annotations

import numpy as np

from flowserve.core.datatypes import from_numpy
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
        have = from_numpy(array.dtype) if isinstance(array, np.ndarray) else type(array).__name__
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
