"""Triton's generate extension: ``POST /v2/models/{m}/generate`` and ``generate_stream``.

The request is one JSON object, read as Triton 2.51 reads it, member by member in order:

- a key naming a model input is that input: a scalar or a list (nested lists, no deeper than
  the input's rank, are flattened),
  each element of the input's type (else Triton's words: "attempt to access JSON non-string as
  string", ...); its shape is the model's dims with the element count spread over them (fixed
  dims divide it, the innermost variable dim takes the rest, other variable dims are 1, so a
  batching model gets a batch of one); an input given twice is refused ("input 'X' already
  exists in request");
- ``parameters``, an object, is read the same way (its keys name inputs or parameters);
- any other key is a request parameter (a string, number or boolean; else "parameter 'X' has
  invalid type"); ``id`` is the request's id and, as in Triton, a parameter too.

Each response is a JSON object with ``model_name``, ``model_version``, ``id`` (when not empty),
the response's parameters and one key per output (a scalar when the output holds one element).
``generate`` answers once (a model that answers zero or several times is refused: use
``generate_stream``); ``generate_stream`` answers with server-sent events
(``text/event-stream; charset=utf-8``), one ``data: {...}`` per response (none, one or many for
a decoupled model), an error as ``data: {"error": "..."}``, which ends the stream. A request
the model refuses (inputs missing, wrong types, ...) is answered with a JSON error as any other
request; an error that is the model's first answer sets the stream's HTTP status, as in Triton.
A client that disconnects ends the stream at once (``app._send_stream`` closes
:func:`generate_events`, which closes the plane's stream): the graph stops working for nobody.

The body is parsed with the standard library's ``json`` (an object's members in order, repeats
kept), not the faster parser of ``infer``: this endpoint is not the hot path, and a repeated
key must be seen.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from flowserve.core.errors import FlowserveError, InvalidArgument, NodeError, Unsupported
from flowserve.core.types import InferRequest, InferResponse
from flowserve.core.wire import from_list
from flowserve.dataplane.plane import DataPlane
from flowserve.frontends.http import jsonfmt
from flowserve.frontends.http.errors import http_status
from flowserve.frontends.http.infer import TOO_DEEP

SSE_CONTENT_TYPE = b"text/event-stream; charset=utf-8"

# what each element of an input of a datatype must be (Triton's TritonJson words when not)
_NON_BOOL = "attempt to access JSON non-boolean as boolean"
_NON_UINT = "attempt to access JSON non-unsigned-integer as unsigned-integer"
_NON_INT = "attempt to access JSON non-signed-integer as signed-integer"
_NON_NUMBER = "attempt to access JSON non-number as double"
_NON_STRING = "attempt to access JSON non-string as string"


class Members(list[tuple[str, Any]]):
    """A JSON object: its members in order, a repeated key kept."""


def parse_body(data: bytes | bytearray | memoryview) -> Any:
    """The generate request's JSON document, objects as :class:`Members`."""
    if jsonfmt.blank(data):
        return Members()
    try:
        return json.loads(bytes(data) if isinstance(data, memoryview) else data, object_pairs_hook=Members)
    except RecursionError:
        raise InvalidArgument(f"malformed generate request: {TOO_DEEP}") from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise InvalidArgument(f"malformed generate request: {exc}") from None


def generate_request(plane: DataPlane, model: str, version: str, doc: Any) -> InferRequest:
    if not isinstance(doc, Members):
        raise InvalidArgument(f"generate request for model '{model}' must be a JSON object")
    specs = {t["name"]: t for t in plane.model_metadata(model, version)["inputs"]}
    request = InferRequest(model=model, version=version, inputs={})
    for key, value in doc:
        if key == "parameters" and key not in specs:
            if not isinstance(value, Members):
                raise InvalidArgument(
                    "Expected JSON object for keyword: 'parameters': attempt to access JSON "
                    f"non-object as object (model '{model}')"
                )
            try:
                for nested, nested_value in value:
                    _member(request, specs, nested, nested_value)
            except InvalidArgument as exc:
                raise InvalidArgument(f"Converting keyword: 'parameters': {exc.message}") from None
            continue
        if key == "id" and key not in specs:
            if not isinstance(value, str):
                raise InvalidArgument(f"Unable to parse 'id': {_NON_STRING} (model '{model}')")
            request.id = value
        _member(request, specs, key, value)
    return request


def _member(request: InferRequest, specs: dict[str, dict[str, Any]], key: str, value: Any) -> None:
    """One member of the request: an input when ``key`` names one, else a parameter."""
    spec = specs.get(key)
    if spec is None:
        if isinstance(value, Members | list) or value is None:
            raise InvalidArgument(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or "
                f"'string'. (model '{request.model}')"
            )
        request.parameters[key] = value
        return
    if key in request.inputs:
        raise InvalidArgument(f"input '{key}' already exists in request (model '{request.model}')")
    request.inputs[key] = _tensor(request.model, key, spec, value)


def _tensor(model: str, name: str, spec: dict[str, Any], value: Any) -> Any:
    datatype: str = spec["datatype"]
    dims = list(spec["shape"])
    elements = _flatten(value, len(dims))
    if elements is None:
        raise InvalidArgument(
            f"input '{name}' of model '{model}': its value is lists nested deeper than its {len(dims)} dims"
        )
    wrong = _check_elements(datatype, elements)
    if wrong:
        raise InvalidArgument(f"input '{name}' of model '{model}': Unable to parse 'data': {wrong}")
    shape = _shape(model, name, dims, len(elements))
    return from_list(name, datatype, shape, elements)


def _flatten(value: Any, most: int) -> list[Any] | None:
    """The elements of a scalar or (nested) list, None when lists nest deeper than ``most``
    (the input's rank: a nested list stands for dims)."""
    if not isinstance(value, list):
        return [value]
    out: list[Any] = []
    stack = [iter(value)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if len(stack) >= most:
                    return None
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _check_elements(datatype: str, elements: list[Any]) -> str:
    """Triton's words for the first element that is not of ``datatype``'s JSON type, or ""."""
    if datatype == "BYTES":
        ok = all(isinstance(e, str) for e in elements)
        return "" if ok else _NON_STRING
    if datatype == "BOOL":
        return "" if all(isinstance(e, bool) for e in elements) else _NON_BOOL
    if any(isinstance(e, bool) for e in elements):  # JSON true is no number
        return _NON_NUMBER if datatype.startswith(("FP", "BF")) else _NON_INT
    if datatype.startswith(("FP", "BF")):
        return "" if all(isinstance(e, int | float) for e in elements) else _NON_NUMBER
    if datatype.startswith("UINT"):
        return "" if all(isinstance(e, int) and e >= 0 for e in elements) else _NON_UINT
    return "" if all(isinstance(e, int) for e in elements) else _NON_INT


def _shape(model: str, name: str, dims: list[int], count: int) -> list[int]:
    """The model's ``dims`` with ``count`` elements spread over them as Triton does: each fixed
    dim divides the count, the innermost variable dim takes what is left, other variable dims
    are 1."""
    left = count
    for d in reversed(dims):
        if d != -1:
            if d == 0 or left % d:
                raise _no_shape(model, name)
            left //= d
    shape = list(dims)
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == -1:
            shape[i], left = left, 1
    if left != 1:
        raise _no_shape(model, name)
    return shape


def _no_shape(model: str, name: str) -> InvalidArgument:
    return InvalidArgument(
        f"The schema can not convert input '{name}' to tensor with proper shape (model '{model}')"
    )


def generate_response(response: InferResponse) -> dict[str, Any]:
    doc: dict[str, Any] = {"model_name": response.model, "model_version": response.version}
    if response.id:
        doc["id"] = response.id
    if response.parameters:
        doc.update(response.parameters)
    for name, array in response.outputs.items():
        values = [_plain(x) for x in np.asarray(array).reshape(-1).tolist()]
        doc[name] = values[0] if len(values) == 1 else values
    return doc


def _plain(x: Any) -> Any:
    if isinstance(x, bytes):
        return x.decode("utf-8", errors="replace")
    return x


async def generate_one(plane: DataPlane, request: InferRequest) -> InferResponse:
    """The one response of ``generate``: a model that answers zero or several times is refused
    (its stream is closed at the second answer: no work for a reply nobody gets)."""
    responses: list[InferResponse] = []
    stream = plane.stream(request)
    try:
        async for response in stream:
            responses.append(response)
            if len(responses) > 1:
                break
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
    if len(responses) != 1:
        raise Unsupported(
            "generate expects model to produce exactly 1 response, use generate stream for model "
            f"that generates various number of responses (model '{request.model}')"
        )
    return responses[0]


def _error_text(exc: FlowserveError) -> str:
    """An error event's text: a model's own words when the model (the one the URL names) failed,
    as Triton sends them; the graph and node when a step of a graph failed."""
    if isinstance(exc, NodeError) and exc.graph == exc.node:
        return exc.detail
    return exc.message


def _event(doc: dict[str, Any]) -> bytes:
    return b"data: " + jsonfmt.dumps(doc) + b"\n\n"


async def generate_events(plane: DataPlane, request: InferRequest) -> AsyncIterator[tuple[int, bytes]]:
    """The server-sent events of ``generate_stream``, each with the HTTP status it would set
    as the first (200, or an error's status)."""
    stream = plane.stream(request)
    try:
        async for response in stream:
            yield 200, _event(generate_response(response))
    except FlowserveError as exc:
        yield http_status(exc), _event({"error": _error_text(exc)})
    finally:
        # closed at once (the client went away: the HTTP side closes this generator), so the
        # graph's work for this request is cancelled now, not when the collector finds it
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
