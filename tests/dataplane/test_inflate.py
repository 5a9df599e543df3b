"""The bounded inflater both front ends use (flowserve/dataplane/inflate.py): the size limit,
the ratio, the budget counted as the output grows and given back, bad data."""

from __future__ import annotations

import asyncio
import gzip
import zlib

import numpy as np
import pytest

from flowserve.dataplane.guard import SMALL, ByteBudget
from flowserve.dataplane.inflate import (
    FLOOR,
    IN_CHUNK,
    MAX_STEP,
    RATIO,
    WBITS,
    Corrupt,
    Inflater,
    OverBudget,
    TooLarge,
    ceiling,
    finish,
    inflate,
    inflate_inline,
)

GZIP = WBITS["gzip"]


def zeros(size: int, level: int = 9) -> bytes:
    """A bomb: ``size`` zero bytes, gzip at ``level``."""
    packer = zlib.compressobj(level, zlib.DEFLATED, GZIP)
    step = 1 << 20
    parts = [packer.compress(bytes(min(step, size - i))) for i in range(0, size, step)]
    return b"".join(parts) + packer.flush()


def test_the_ceiling_is_the_ratio_the_floor_or_the_limit() -> None:
    assert ceiling(10, 1 << 30) == FLOOR  # a tiny body: the floor
    assert ceiling(1 << 20, 1 << 30) == RATIO << 20
    assert ceiling(1 << 20, 1 << 20) == 1 << 20  # never past the limit


def test_real_tensors_pass_the_ratio() -> None:
    """A 16 MiB FP32 tensor 99.9 % zeros (a one-hot or bag-of-words input) inflates, at zlib
    levels 1, 6 and 9; the same tensor all zeros is past RATIO and refused, naming it."""
    rng = np.random.default_rng(0)
    tensor = rng.standard_normal(4 << 20).astype(np.float32)
    tensor[rng.random(tensor.size) < 0.999] = 0
    raw = tensor.tobytes()
    for level in (1, 6, 9):
        packed = gzip.compress(raw, level)
        assert len(raw) / len(packed) < RATIO
        assert asyncio.run(inflate(Inflater(packed, GZIP, 256 << 20))) == raw
    with pytest.raises(TooLarge, match=f"exceeds {RATIO} times its compressed size"):
        asyncio.run(inflate(Inflater(zeros(16 << 20), GZIP, 256 << 20)))


def test_a_bomb_stops_one_step_past_its_ceiling() -> None:
    bomb = zeros(64 << 20)
    inflater = Inflater(bomb, GZIP, 256 << 20)
    with pytest.raises(TooLarge) as info:
        asyncio.run(inflate(inflater))
    assert inflater.size == inflater.ceiling + 1  # not one byte more was kept
    assert "uncompressed" in info.value.message and str(len(bomb)) in info.value.message
    # under a small limit, the limit is what it names
    with pytest.raises(TooLarge, match=r"limit of 1048576 bytes \(--max-request-bytes\)"):
        asyncio.run(inflate(Inflater(zeros(2 << 20), GZIP, 1 << 20)))


def test_the_budget_is_taken_as_the_output_grows_and_given_back() -> None:
    budget = ByteBudget(1 << 30)
    raw = np.random.default_rng(1).integers(0, 4, 40 << 20, dtype=np.uint8).tobytes()  # ~4:1
    inflater = Inflater(gzip.compress(raw, 1), GZIP, 256 << 20, budget)
    seen: list[int] = []

    async def run() -> bytes:
        while not inflater.done:
            inflater.step(inflater.plan())
            seen.append(budget.in_use)
        return await finish(inflater)

    assert asyncio.run(run()) == raw
    # each step took what it could produce, never more than the output so far plus one step
    assert seen == sorted(seen) and len(seen) > 3
    assert max(seen) <= len(raw) + MAX_STEP
    assert budget.in_use == inflater.held >= len(raw)
    inflater.release()
    inflater.release()  # once
    assert budget.in_use == 0


def test_a_body_over_the_budget_is_refused_and_gives_back_what_it_took() -> None:
    budget = ByteBudget(8 << 20)
    budget.take(2 << 20)  # another request holds some
    raw = np.random.default_rng(2).integers(0, 4, 16 << 20, dtype=np.uint8).tobytes()
    with pytest.raises(OverBudget, match="--max-buffered-request-bytes 8388608"):
        asyncio.run(inflate(Inflater(gzip.compress(raw, 1), GZIP, 256 << 20, budget)))
    assert budget.in_use == 2 << 20


def test_small_bodies_take_nothing_and_stay_on_the_loop() -> None:
    budget = ByteBudget(1)  # nothing fits: a counted take would fail
    body = b'{"inputs": []}' * 100
    inflater = Inflater(gzip.compress(body), GZIP, 1 << 20, budget)
    assert inflate_inline(inflater, SMALL) == body
    assert inflater.held == 0 and budget.refused == 0


def test_bad_and_cut_data_are_corrupt() -> None:
    packed = gzip.compress(b"abc" * 10_000)
    with pytest.raises(Corrupt, match="truncated"):
        asyncio.run(inflate(Inflater(packed[:-8], GZIP, 1 << 20)))
    with pytest.raises(Corrupt, match="not valid compressed data"):
        asyncio.run(inflate(Inflater(b"not gzip at all", GZIP, 1 << 20)))


def test_deflate_and_a_body_larger_than_inline() -> None:
    raw = bytes(range(256)) * (8 << 12)  # 8 MiB, inflated mostly in a thread
    assert asyncio.run(inflate(Inflater(zlib.compress(raw), WBITS["deflate"], 64 << 20))) == raw


def test_a_body_of_many_input_chunks_in_small_steps() -> None:
    """zlib is handed IN_CHUNK compressed bytes at a time (what it leaves of one is all it
    copies): steps that end inside a chunk, chunks that end inside a step, any buffer type,
    and a cut anywhere past the first chunk still found."""
    raw = np.random.default_rng(9).bytes(3 * IN_CHUNK)  # incompressible: three chunks of input
    packed = gzip.compress(raw, 6)
    assert len(packed) > 2 * IN_CHUNK
    for body in (packed, bytearray(packed), np.frombuffer(packed, np.uint8).copy().data):
        inflater = Inflater(body, GZIP, 64 << 20)
        while not inflater.done:
            inflater.step(inflater.plan(cap=300_001))  # odd steps: never on a chunk's edge
        assert inflater.result() == raw
    assert asyncio.run(inflate(Inflater(packed, GZIP, 64 << 20))) == raw
    with pytest.raises(Corrupt, match="truncated"):
        asyncio.run(inflate(Inflater(packed[: IN_CHUNK + 12345], GZIP, 64 << 20)))


def test_zlib_never_gets_more_than_a_chunk_of_input() -> None:
    """What zlib copies per call (its unconsumed tail) is bounded by IN_CHUNK, not by the body."""
    packed = gzip.compress(np.random.default_rng(10).bytes(3 * IN_CHUNK), 1)
    inflater = Inflater(packed, GZIP, 64 << 20)
    real, given = inflater._zlib, []

    class Recording:
        eof = property(lambda self: real.eof)
        unconsumed_tail = property(lambda self: real.unconsumed_tail)

        def decompress(self, data: bytes, max_length: int) -> bytes:
            given.append(len(data))
            return bytes(real.decompress(data, max_length))

    inflater._zlib = Recording()
    assert asyncio.run(inflate(inflater)) == zlib.decompress(packed, GZIP)
    assert len(given) > 3 and max(given) <= IN_CHUNK
