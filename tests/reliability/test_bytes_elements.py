"""The per-request bound on BYTES elements (``--max-bytes-elements-per-request``), in process:
every decoder counts a request's BYTES elements over all its inputs before decoding one, the
gRPC transport counts a message's protobuf fields before parsing it (typed contents take one
per element), and what decides whether decoding and encoding go to a worker thread.
Against real servers, with a good client answered meanwhile: test_attack_run.py."""

from __future__ import annotations

import itertools
import struct
from typing import Any

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from flowserve.core.errors import ResourceExhausted
from flowserve.core.limits import Limits
from flowserve.core.types import InferResponse
from flowserve.dataplane.shm import SharedMemoryRegistry
from flowserve.frontends.grpc import codec
from flowserve.frontends.grpc.fields import OTHER_FIELDS, TooManyFields, count_fields, guarded_parser
from flowserve.frontends.http import infer as http_infer

LIMITS = Limits(max_bytes_elements_per_request=10)
FLAG = "(--max-bytes-elements-per-request)"


class FakePlane:
    """What the HTTP decoders use of a DataPlane."""

    limits = LIMITS
    shm = SharedMemoryRegistry(enabled=False)

    def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}]}

    def model_config(self, model: str, version: str) -> dict[str, Any]:
        return {"max_batch_size": 0}


def raw(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def bytes_input(name: str, count: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "datatype": "BYTES", "shape": [count], **extra}


def test_http_counts_bytes_elements_over_all_inputs_of_a_request() -> None:
    plane: Any = FakePlane()
    header = {"inputs": [bytes_input("a", 6, data=["x"] * 6), bytes_input("b", 4, data=["y"] * 4)]}
    request, _ = http_infer.decode_request(plane, "m", "", header)
    assert request.inputs["b"].tolist() == [b"y"] * 4  # 10: at the bound
    header["inputs"].append({"name": "n", "datatype": "INT32", "shape": [100], "data": [0] * 100})
    http_infer.decode_request(plane, "m", "", header)  # other types do not count
    header["inputs"].append(bytes_input("c", 1, parameters={"binary_data_size": 5}))
    with pytest.raises(ResourceExhausted) as err:
        http_infer.decode_request(plane, "m", "", header, memoryview(raw([b"z"])))
    assert err.value.message == (
        "model 'm', input 'c': the request holds 11 BYTES elements (counting its inputs up to this "
        f"one), over the server's limit of 10 per request {FLAG}"
    )


def test_http_raw_binary_request_counts_no_further_than_the_bound() -> None:
    plane: Any = FakePlane()
    request, _ = http_infer.raw_request(plane, "m", "", memoryview(raw([b"a"] * 10)))
    assert request.inputs["text"].shape == (10,)
    with pytest.raises(ResourceExhausted, match=r"input 'text': the request holds 11 BYTES elements"):
        http_infer.raw_request(plane, "m", "", memoryview(raw([b""] * 1_000_000)))


def test_grpc_counts_bytes_elements_over_all_inputs_of_a_request() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="a", datatype="BYTES", shape=[2, 3]).contents.bytes_contents.extend([b"x"] * 6)
    msg.inputs.add(name="b", datatype="BYTES", shape=[4]).contents.bytes_contents.extend([b"y"] * 4)
    assert codec.decode_request(msg, SharedMemoryRegistry(enabled=False), LIMITS).inputs["b"].shape == (4,)
    msg.inputs.add(name="c", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"z")
    with pytest.raises(ResourceExhausted, match=r"model 'm', input 'c': the request holds 11 BYTES") as err:
        codec.decode_request(msg, SharedMemoryRegistry(enabled=False), LIMITS)
    assert FLAG in err.value.message
    raw_msg = pb.ModelInferRequest(model_name="m", raw_input_contents=[raw([b""] * 11)])
    raw_msg.inputs.add(name="r", datatype="BYTES", shape=[11])
    with pytest.raises(ResourceExhausted, match=r"input 'r': the request holds 11 BYTES"):
        codec.decode_request(raw_msg, SharedMemoryRegistry(enabled=False), LIMITS)


def test_what_goes_to_a_worker_thread() -> None:
    """Elements decoded one by one (BYTES, JSON data, typed contents) or encoded one by one
    (BYTES, JSON outputs) decide; raw numeric tensors never do (zero-copy)."""
    header = {
        "inputs": [
            bytes_input("a", 3, parameters={"binary_data_size": 3}),
            {"name": "j", "datatype": "FP32", "shape": [2, 5], "data": []},
            {"name": "b", "datatype": "FP32", "shape": [1000], "parameters": {"binary_data_size": 4000}},
            {"name": "x", "datatype": "BYTES", "shape": [2**40] * 40},  # not a shape: decoding says so
        ]
    }
    assert http_infer.one_by_one(header) == 13
    assert http_infer.one_by_one({"inputs": "no"}) == http_infer.one_by_one([]) == 0
    msg = pb.ModelInferRequest()
    msg.inputs.add(name="a", datatype="BYTES", shape=[3, 4])
    msg.inputs.add(name="b", datatype="FP32", shape=[100])  # raw
    msg.inputs.add(name="c", datatype="INT32", shape=[5]).contents.int_contents.extend(range(5))
    assert codec.one_by_one(msg) == 17
    strings = np.array([b"a"] * 6, dtype=np.object_)
    response = InferResponse("m", "1", {"s": strings, "f": np.zeros(1000, np.float32)})
    assert codec.encoded_one_by_one(response) == 6
    plan = http_infer.ResponsePlan(default_binary=True)
    assert http_infer._encoded_one_by_one(response, plan) == 6
    assert http_infer._encoded_one_by_one(response, http_infer.ResponsePlan()) == 1006  # as JSON


# ------------------------------------------------------------------ typed contents: fields


def typed_request(count: int, model: str = "m") -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name=model)
    msg.inputs.add(name="first", datatype="INT32", shape=[2]).contents.int_contents.extend([1, 2])
    tensor = msg.inputs.add(name="text", datatype="BYTES", shape=[1, count])
    tensor.contents.bytes_contents.extend(itertools.repeat(b"", count))
    return msg


def test_fields_are_counted_along_the_descriptor() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    tensor = msg.inputs.add(name="a", shape=[1, 2])
    tensor.contents.bytes_contents.extend([b"a", b"bb"])
    msg.parameters["k"].int64_param = 3
    msg.raw_input_contents.append(b"xyz" * 1000)
    msg.outputs.add(name="o")
    # model_name 1, inputs{name, shape, contents{2}} 6, parameters{key, value{int64}} 4, raw 1,
    # outputs{name} 2
    assert count_fields(pb.ModelInferRequest.DESCRIPTOR, msg.SerializeToString(), 100) == 14
    assert count_fields(pb.ModelInferRequest.DESCRIPTOR, msg.SerializeToString(), 13) is None


def test_a_message_of_too_many_fields_is_refused_before_it_is_parsed() -> None:
    parse = guarded_parser(pb.ModelInferRequest, 1000)
    most = 1000 + OTHER_FIELDS
    ok = typed_request(1000).SerializeToString()
    assert len(parse(ok).inputs[1].contents.bytes_contents) == 1000
    over = typed_request(most).SerializeToString()  # more than twice `most` bytes: walked
    with pytest.raises(TooManyFields) as err:
        parse(over)
    assert err.value.message == (
        f"model 'm', tensor 'text': the request message has more than {most} protobuf fields (its "
        "typed contents take one per BYTES element), over the server's limit of 1000 BYTES elements "
        f"per request {FLAG}"
    )
    many_outputs = pb.ModelInferRequest(
        model_name="m", outputs=[pb.ModelInferRequest.InferRequestedOutputTensor()] * most
    )
    with pytest.raises(TooManyFields, match=r"^model 'm': the request message has more than"):
        parse(many_outputs.SerializeToString())


def test_a_malformed_message_is_left_to_the_parser() -> None:
    """Long enough to be walked, but not protobuf: the walk stops, and the parser refuses it."""
    parse = guarded_parser(pb.ModelInferRequest, 0)
    big = pb.ModelInferRequest(
        model_name="m", raw_input_contents=[bytes(4 * OTHER_FIELDS)]
    ).SerializeToString()
    for bad in (
        big[:-1],  # a field runs past the end
        b"\x0b" * (4 * OTHER_FIELDS),  # groups (wire type 3)
        b"\x08" + b"\xff" * (4 * OTHER_FIELDS),  # a varint that does not end
    ):
        with pytest.raises(DecodeError):
            parse(bad)
