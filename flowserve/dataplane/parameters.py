"""A request's parameters as models see them, decided once for every transport.

Triton's front ends consume some request parameters themselves and refuse others; what is left
is what a model reads (a python model's ``request.parameters()``, a node's ``ctx.parameters``):

- ``binary_data_output`` is how the client wants its outputs encoded (HTTP's binary tensor
  extension): the front end reads it, the model never sees it (Triton consumes it over HTTP and
  so does flowserve over any transport);
- ``triton_`` keys are Triton's own: ``triton_enable_empty_final_response`` (a gRPC stream's
  final-response flag, read by the gRPC front end) is taken out, any other is refused in
  Triton's words.

``sequence_id``, ``sequence_start``, ``sequence_end``, ``priority`` and ``timeout`` stay: the
sequence batcher, the scheduler and the python backend read them from the context (the python
backend turns the sequence controls into the request's correlation id and flags). Triton passes
every other key through, the tensor-level keys (``binary_data_size``, ``shared_memory_*``,
``classification``) too when a client sends them at request level, and so does flowserve.

A request without parameters costs one truthiness check (:meth:`DataPlane.infer`).
"""

from __future__ import annotations

from typing import Any

from flowserve.core.errors import InvalidArgument

RESERVED_PREFIX = "triton_"
# the triton_ keys a request may carry (Triton's TRITON_RESERVED_REQUEST_PARAMS)
RESERVED_ALLOWED = frozenset({"triton_enable_empty_final_response"})
# keys the front ends consume: never a model's
CONSUMED = frozenset({"binary_data_output", *RESERVED_ALLOWED})

RESERVED_MESSAGE = (
    "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
    "keys starting with 'triton_' are allowed: " + " ".join(sorted(RESERVED_ALLOWED))
)


# a key starting with one of these may have to be taken out (one test per key on the way in)
_MARKS = (RESERVED_PREFIX, "binary_data_output")


def model_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """``parameters`` as the model sees them: the same dict when nothing is to be taken out,
    else a copy without the consumed keys; InvalidArgument for a reserved key."""
    for key in parameters:
        if key.startswith(_MARKS):
            return _stripped(parameters)
    return parameters


def _stripped(parameters: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in parameters.items():
        if key in CONSUMED:
            continue
        if key.startswith(RESERVED_PREFIX):
            raise InvalidArgument(f"{RESERVED_MESSAGE} (got '{key}')")
        out[key] = value
    return out


__all__ = ["CONSUMED", "RESERVED_ALLOWED", "RESERVED_MESSAGE", "model_parameters"]
