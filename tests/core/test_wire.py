import numpy as np
import pytest

from flowserve.core.errors import InvalidArgument, ResourceExhausted
from flowserve.core.limits import Limits
from flowserve.core.wire import from_list, from_raw, raw_view, to_raw


@pytest.mark.parametrize(
    "datatype,array",
    [
        ("INT32", np.arange(6, dtype=np.int32).reshape(2, 3)),
        ("FP16", np.array([1.5, -2], np.float16)),
        ("BOOL", np.array([True, False])),
        ("UINT64", np.array([2**63], np.uint64)),
    ],
)
def test_fixed_round_trip(datatype: str, array: np.ndarray) -> None:
    back = from_raw("x", datatype, list(array.shape), to_raw(array))
    np.testing.assert_array_equal(back, array)
    assert back.dtype == array.dtype


def test_bytes_round_trip() -> None:
    array = np.array([[b"a", b""], [b"\x00\xff", "caf\u00e9"]], dtype=np.object_)
    raw = to_raw(array)
    assert raw[:5] == b"\x01\x00\x00\x00a"
    back = from_raw("s", "BYTES", [2, 2], raw)
    assert back.tolist() == [[b"a", b""], [b"\x00\xff", "caf\u00e9".encode()]]


@pytest.mark.parametrize(
    "shape,data,message",
    [
        ([3], b"\x00" * 8, "got 8 bytes of data, but shape [3] of INT32 needs 12"),
        ([-2], b"", "invalid shape"),
    ],
)
def test_fixed_size_checked_before_allocation(shape: list[int], data: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message.replace("[", r"\[").replace("]", r"\]")):
        from_raw("x", "INT32", shape, data)


def test_absurd_shape_is_over_the_limit_before_allocation() -> None:
    with pytest.raises(ResourceExhausted, match="over the server's limit"):
        from_raw("x", "INT32", [2**40, 2**40], b"")


@pytest.mark.parametrize(
    "data,message",
    [
        (b"\x05\x00\x00\x00ab", "claims 5 bytes but only 2 remain"),
        (b"\x01\x00", "ends inside a 4-byte length prefix"),
        (b"\x01\x00\x00\x00a", "needs 2 BYTES elements, data holds 1"),
        (b"\x00\x00\x00\x00" * 3, "data holds 3 or more"),
    ],
)
def test_bad_bytes(data: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        from_raw("s", "BYTES", [2], data)


def test_from_list_nested_and_flat() -> None:
    assert from_list("x", "FP32", [2, 2], [[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
    assert from_list("x", "FP32", [2, 2], [1, 2, 3, 4]).shape == (2, 2)
    assert from_list("s", "BYTES", [2], [["a"], ["b"]]).tolist() == [b"a", b"b"]
    with pytest.raises(InvalidArgument, match="needs 4 elements, got 3"):
        from_list("x", "INT8", [2, 2], [1, 2, 3])
    with pytest.raises(InvalidArgument, match="does not fit INT8"):
        from_list("x", "INT8", [1], ["abc"])


# BYTES in bulk: elements of one length are cut out by numpy, others one tight step each;
# encoding places numpy-made prefixes around the joined elements. Each against the format.


def _reference_raw(items: list[bytes]) -> bytes:
    return b"".join(len(b).to_bytes(4, "little") + b for b in items)


BULK = {
    "empty": [b""] * 1000,
    "one length, NUL bytes kept": [b"\x00a\x00", b"bc\x00", b"\x00\x00\x00"] * 300,
    "mixed lengths": [bytes([i % 256]) * (i % 7) for i in range(70_000)],  # over one encode chunk
    "large": [b"x" * 5000, b"y" * 70, b"z" * 9000],
    "one element": [b"abc"],
}


@pytest.mark.parametrize("case", list(BULK))
def test_bytes_in_bulk_decode_and_encode_as_the_format_says(case: str) -> None:
    items = BULK[case]
    raw = _reference_raw(items)
    for data in (raw, bytearray(raw), memoryview(b"head" + raw)[4:]):  # gRPC, HTTP binary bodies
        back = from_raw("s", "BYTES", [len(items)], data)
        assert back.dtype == object and back.tolist() == items
        assert all(type(b) is bytes for b in back.tolist())
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    assert to_raw(array) == raw
    assert from_list("s", "BYTES", [len(items)], list(items)).tolist() == items


def test_bytes_encode_takes_str_and_fixed_width_arrays() -> None:
    assert to_raw(np.array(["ab", "caf\u00e9", ""], dtype=np.object_)) == _reference_raw(
        [b"ab", "caf\u00e9".encode(), b""]
    )
    assert to_raw(np.array([b"ab", b"c"], dtype="S2")) == _reference_raw([b"ab", b"c"])
    assert to_raw(np.array(["xy", "z"], dtype="U2")) == _reference_raw([b"xy", b"z"])
    assert to_raw(np.array([], dtype=np.object_)) == b""


@pytest.mark.parametrize(
    "count,data,error,message",
    [
        (3, _reference_raw([b"ab"] * 2), InvalidArgument, "needs 3 BYTES elements, data holds 2"),
        (2, _reference_raw([b"ab"] * 3), InvalidArgument, "needs 2 BYTES elements, data holds 3 or more"),
        (2, _reference_raw([b"ab"] * 2) + b"\x01", InvalidArgument, "ends inside a 4-byte length prefix"),
        (
            2,
            _reference_raw([b"ab"]) + b"\x09\x00\x00\x00abc",
            InvalidArgument,
            "element 1 claims 9 bytes but only 3",
        ),
        (2, _reference_raw([b"a" * 20] * 2), ResourceExhausted, "BYTES element 0 has 20 bytes"),
        (3, _reference_raw([b"a", b"b", b"c" * 20]), ResourceExhausted, "BYTES element 2 has 20 bytes"),
        (1, _reference_raw([b"a", b"c" * 20]), ResourceExhausted, "BYTES element 1 has 20 bytes"),
    ],
)
def test_bad_bytes_in_bulk(count: int, data: bytes, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        from_raw("s", "BYTES", [count], data, Limits(max_bytes_element=16))


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4),  # the array's own bytes
        np.arange(12, dtype=np.float32).reshape(3, 4).T,  # transposed: one C-ordered copy
        np.arange(12, dtype=">i4").reshape(3, 4)[:, ::2],  # big-endian and strided: one copy
        np.arange(6, dtype=">f8"),
        np.array(7, dtype=np.int16),  # 0-d
        np.zeros((0, 3), np.float32),
        np.array([[True, False], [False, True]]).T,
        np.array([b"ab", b"", b"xyz"], dtype=np.object_),
    ],
)
def test_raw_view_is_to_raw_without_a_second_copy(array: np.ndarray) -> None:
    view = raw_view(array)
    assert bytes(view) == to_raw(array)
    if array.dtype.kind != "O" and array.size:
        assert isinstance(view, memoryview)  # never a bytes copy of a copy
        base = np.frombuffer(view, np.uint8)
        assert np.shares_memory(base, array) == (array.flags.c_contiguous and array.dtype.byteorder != ">")
