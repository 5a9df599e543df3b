"""Request size limits, and the checks every decoder runs before it allocates from a request.

A request names shapes and sizes; the server believes none of them until they are checked
against the data actually sent and against :class:`Limits`. Every check here is O(rank) per
tensor (no scan of the data), so the decoders call them on the hot path:

- :func:`check_shape`: a rank of at most :data:`MAX_RANK`, non-negative integer dims, and no dim
  and no element count above ``max_tensor_elements`` (so a product never overflows anything and
  a shape like ``[0, 2**62]`` is refused as well);
- :func:`check_bytes_element`: one BYTES element no longer than ``max_bytes_element``;
- :func:`check_bytes_elements`: BYTES elements of a whole request (all its tensors) no more than
  ``max_bytes_elements_per_request``: each becomes a Python object, decoded one by one, so a
  request of many tiny elements (20 million empty ones fit in 76 MiB) costs far more time and
  memory than its size says;
- :func:`max_bytes_size`: the most bytes a number of BYTES elements can take on the wire.

Over a limit is :class:`~flowserve.core.errors.ResourceExhausted` (HTTP 413, gRPC
RESOURCE_EXHAUSTED); malformed is :class:`~flowserve.core.errors.InvalidArgument` (400,
INVALID_ARGUMENT). Every message names the tensor.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from flowserve.core.errors import InvalidArgument, ResourceExhausted

# numpy 2 allows 64 dimensions and numpy 1 allows 32: no model needs more than a handful
MAX_RANK = 32


@dataclass(slots=True)
class Limits:
    """Request size limits, checked before anything is allocated from a request."""

    max_request_bytes: int = 256 * 1024 * 1024
    max_tensor_elements: int = 64 * 1024 * 1024
    max_bytes_element: int = 16 * 1024 * 1024
    max_bytes_elements_per_request: int = 4 * 1024 * 1024


DEFAULT_LIMITS = Limits()


def check_shape(name: str, shape: Sequence[object], limits: Limits = DEFAULT_LIMITS) -> int:
    """The element count of ``shape``, once it is known to be sane and within ``limits``."""
    if len(shape) > MAX_RANK:
        raise InvalidArgument(f"input '{name}': shape has {len(shape)} dimensions, more than {MAX_RANK}")
    limit = limits.max_tensor_elements
    count = 1
    for raw in shape:
        if type(raw) is int:
            dim = raw
        elif not isinstance(raw, bool) and isinstance(raw, numbers.Integral):
            dim = int(raw)
        else:
            raise InvalidArgument(f"input '{name}': shape {_show(shape)} must hold non-negative integers")
        if dim < 0:
            raise InvalidArgument(f"input '{name}': invalid shape {_show(shape)} (dims must be >= 0)")
        if dim > limit:
            raise ResourceExhausted(
                f"input '{name}': dimension {dim} of shape {_show(shape)} is over the server's limit of "
                f"{limit} elements per tensor"
            )
        count *= dim
    if count > limit:
        raise ResourceExhausted(
            f"input '{name}': shape {_show(shape)} has {count} elements, over the server's limit of "
            f"{limit} elements per tensor"
        )
    return count


def check_bytes_element(name: str, index: int, length: int, limits: Limits = DEFAULT_LIMITS) -> None:
    if length > limits.max_bytes_element:
        raise ResourceExhausted(
            f"input '{name}': BYTES element {index} has {length} bytes, over the server's limit of "
            f"{limits.max_bytes_element} bytes per element"
        )


def check_bytes_elements(model: str, name: str, total: int, limits: Limits = DEFAULT_LIMITS) -> None:
    """``total``: the BYTES elements of a request up to and including its input ``name``."""
    limit = limits.max_bytes_elements_per_request
    if total > limit:
        raise ResourceExhausted(
            f"model '{model}', input '{name}': the request holds {total} BYTES elements (counting "
            f"its inputs up to this one), over the server's limit of {limit} per request "
            "(--max-bytes-elements-per-request)"
        )


def max_bytes_size(count: int, limits: Limits = DEFAULT_LIMITS) -> int:
    """The most bytes ``count`` BYTES elements can take on the wire (length prefixes included)."""
    return count * (4 + limits.max_bytes_element)


def _show(shape: Sequence[object]) -> str:
    """A shape for a message, cut short when a request sends an absurdly long one."""
    items = list(shape[: MAX_RANK + 1])
    text = "[" + ", ".join(str(d)[:24] for d in items[:MAX_RANK]) + "]"
    return text if len(shape) <= MAX_RANK else text[:-1] + ", ...]"
