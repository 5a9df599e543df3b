"""Triton's generate extension: ``POST /v2/models/{m}/generate`` and ``generate_stream``.

The request is one JSON object: every key other than ``id`` and ``parameters`` names a model
input, with a scalar or a (nested) list as its value; the input gets the model's datatype and a
leading batch dimension of 1 when the model batches. Each response is a JSON object with
``model_name``, ``model_version``, ``id`` (when given) and one key per output (a scalar when the
output holds one element). ``generate`` answers once; ``generate_stream`` answers with
server-sent events, one ``data: {...}`` per response (several for a decoupled model), and an
error as ``data: {"error": "..."}``, which ends the stream. A client that disconnects ends the
stream at once (``app._send_stream`` closes :func:`generate_events`, which closes the plane's
stream): the graph stops working for nobody.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from flowserve.core.errors import FlowserveError, InvalidArgument
from flowserve.core.types import InferRequest, InferResponse
from flowserve.core.wire import from_list
from flowserve.dataplane.plane import DataPlane
from flowserve.frontends.http import jsonfmt


def generate_request(plane: DataPlane, model: str, version: str, doc: Any) -> InferRequest:
    if not isinstance(doc, dict):
        raise InvalidArgument(f"generate request for model '{model}' must be a JSON object")
    meta = plane.model_metadata(model, version)
    expected = {t["name"]: t for t in meta["inputs"]}
    parameters = doc.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidArgument(f"generate request for model '{model}': 'parameters' must be an object")
    inputs = {}
    for key, value in doc.items():
        if key in ("id", "parameters"):
            continue
        spec = expected.get(key)
        if spec is None:
            allowed = ", ".join(expected) or "none"
            raise InvalidArgument(
                f"unexpected inference input '{key}' for model '{model}', allowed inputs are: {allowed}"
            )
        try:
            data = np.asarray(value, dtype=object) if spec["datatype"] == "BYTES" else np.asarray(value)
        except (ValueError, TypeError, RecursionError) as exc:  # ragged, or nested too deep
            raise InvalidArgument(f"input '{key}' of model '{model}': {exc}") from None
        shape = list(data.shape) or [1]
        dims = spec["shape"]
        if len(dims) == len(shape) + 1:  # the model batches: a batch of one
            shape = [1, *shape]
        inputs[key] = from_list(key, spec["datatype"], shape, value if data.ndim else [value])
    return InferRequest(
        model=model, version=version, inputs=inputs, id=str(doc.get("id", "")), parameters=parameters
    )


def generate_response(response: InferResponse) -> dict[str, Any]:
    doc: dict[str, Any] = {"model_name": response.model, "model_version": response.version}
    if response.id:
        doc["id"] = response.id
    for name, array in response.outputs.items():
        values = [_plain(x) for x in array.reshape(-1).tolist()]
        doc[name] = values[0] if len(values) == 1 else values
    return doc


def _plain(x: Any) -> Any:
    if isinstance(x, bytes):
        return x.decode("utf-8", errors="replace")
    return x


async def generate_events(plane: DataPlane, request: InferRequest) -> AsyncIterator[bytes]:
    """The server-sent events of ``generate_stream``."""
    stream = plane.stream(request)
    try:
        async for response in stream:
            yield b"data: " + jsonfmt.dumps(generate_response(response)) + b"\n\n"
    except FlowserveError as exc:
        yield b"data: " + jsonfmt.dumps({"error": exc.message}) + b"\n\n"
    finally:
        # closed at once (the client went away: the HTTP side closes this generator), so the
        # graph's work for this request is cancelled now, not when the collector finds it
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
