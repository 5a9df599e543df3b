"""The pure parts of the batcher: the batching decision, the priority queue, merge/split.

No event loop, no clock but plain integers, no sleeps."""

from __future__ import annotations

import doctest
import re
from collections.abc import Hashable

import numpy as np
import pytest

from flowserve.core.errors import ErrorCode, InternalError, InvalidArgument, Unavailable
from flowserve.nodes.batching import policy as policy_module
from flowserve.nodes.batching import queues as queues_module
from flowserve.nodes.batching import tensors as tensors_module
from flowserve.nodes.batching.policy import (
    BatchPolicy,
    Candidate,
    Take,
    Wait,
    decide,
    policy_from_spec,
)
from flowserve.nodes.batching.queues import LevelPolicy, PriorityQueue, levels_from_spec
from flowserve.nodes.batching.tensors import (
    check_split,
    merge_rows,
    request_key,
    request_rows,
    split_rows,
)
from flowserve.spec.schema import BatchingSpec, QueuePolicy

US = 1000  # ns per microsecond


def reqs(*rows: int, key: Hashable = "a", at: int = 0) -> list[Candidate]:
    return [Candidate(r, key, at) for r in rows]


def cfg(max_batch: int = 8, preferred: tuple[int, ...] = (), delay_us: int = 0) -> BatchPolicy:
    return policy_from_spec(BatchingSpec(max_batch, preferred, delay_us))


@pytest.mark.parametrize("module", [policy_module, queues_module, tensors_module])
def test_module_examples(module: object) -> None:
    assert doctest.testmod(module).failed == 0  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------- decide


def test_empty_queue_decides_nothing() -> None:
    assert decide([], 0, cfg()) is None


def test_counts_rows_not_requests_up_to_max_batch_size() -> None:
    # 2+2+2+2 = 8 rows fill the batch; the fifth request waits for the next one
    assert decide(reqs(2, 2, 2, 2, 2), 0, cfg(8)) == Take(4, 8)
    # 3+3 = 6; a third would make 9 > 8
    assert decide(reqs(3, 3, 3), 0, cfg(8)) == Take(2, 6)


def test_a_request_larger_than_max_batch_size_goes_alone() -> None:
    assert decide(reqs(12, 1), 0, cfg(8)) == Take(1, 12)


def test_zero_delay_sends_what_is_there() -> None:
    assert decide(reqs(1, 1), 5, cfg(8, (4,), 0)) == Take(2, 2)


def test_waits_for_a_preferred_size_until_the_delay_passes() -> None:
    config = cfg(8, (4,), delay_us=100)
    queue = reqs(1, 1, at=1_000)
    assert decide(queue, 1_000, config) == Wait(1_000 + 100 * US)
    assert decide(queue, 1_000 + 100 * US - 1, config) == Wait(1_000 + 100 * US)
    assert decide(queue, 1_000 + 100 * US, config) == Take(2, 2)


def test_waits_for_max_batch_size_when_no_preferred_size_is_set() -> None:
    config = cfg(8, delay_us=50)
    assert decide(reqs(3, 3), 0, config) == Wait(50 * US)
    assert decide(reqs(3, 3, 2), 0, config) == Take(3, 8)


def test_sends_the_largest_preferred_size_at_once() -> None:
    config = cfg(8, (2, 4), delay_us=1_000)
    assert decide(reqs(1, 1, 1), 0, config) == Take(2, 2)
    assert decide(reqs(1, 1, 1, 1, 1), 0, config) == Take(4, 4)
    assert decide(reqs(1, 1, 1, 1, 1, 1, 1, 1, 1), 0, config) == Take(4, 4)


def test_past_the_largest_preferred_size_sends_what_fits_below_it() -> None:
    # 3 rows, then 3 more would pass the preferred 4: the 3 rows go now
    assert decide(reqs(3, 3), 0, cfg(8, (4,), delay_us=1_000)) == Take(1, 3)


def test_once_the_delay_passed_sends_everything_up_to_max_batch_size() -> None:
    config = cfg(8, (2,), delay_us=10)
    assert decide(reqs(1, 1, 1, at=0), 0, config) == Take(2, 2)
    assert decide(reqs(1, 1, 1, at=0), 10 * US, config) == Take(3, 3)


def test_the_delay_counts_from_the_oldest_pending_request() -> None:
    queue = [Candidate(1, "a", 900), Candidate(1, "a", 100)]  # a DELAYed request can be older
    assert decide(queue, 1_100, cfg(8, delay_us=1)) == Take(2, 2)
    assert decide(queue, 1_100, cfg(8, delay_us=10)) == Wait(100 + 10 * US)


def test_unequal_keys_never_share_a_batch() -> None:
    queue = [Candidate(1, "a", 0), Candidate(1, "a", 0), Candidate(1, "b", 0), Candidate(1, "a", 0)]
    # the batch cannot grow past "b", so it goes now even though the delay has not passed
    assert decide(queue, 0, cfg(8, delay_us=1_000)) == Take(2, 2)
    assert decide(queue[2:], 0, cfg(8, delay_us=1_000)) == Take(1, 1)


def test_zero_row_requests_count_as_one() -> None:
    assert decide(reqs(0, 0), 0, cfg(2)) == Take(2, 2)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (BatchingSpec(0), "max_batch_size >= 1"),
        (BatchingSpec(4, (8,)), "preferred_batch_size [8]"),
        (BatchingSpec(4, (), -1), "max_queue_delay_us"),
    ],
)
def test_bad_batching_settings_fail_at_load(spec: BatchingSpec, message: str) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        policy_from_spec(spec)


def test_no_preferred_size_means_max_batch_size() -> None:
    assert policy_from_spec(BatchingSpec(16)).preferred == frozenset({16})


# ---------------------------------------------------------------------------------- queues


def queue(*levels: LevelPolicy, default: int = 1, capacity: int = 100) -> PriorityQueue[str]:
    return PriorityQueue(list(levels) or [LevelPolicy()], default, capacity)


def order(q: PriorityQueue[str]) -> list[str]:
    return [e.payload for e in q]


def test_priority_levels_are_drained_in_order() -> None:
    q = queue(LevelPolicy(), LevelPolicy(), LevelPolicy(), default=3)
    q.push("low-1", 1, "k", 0, priority=3)
    q.push("default", 1, "k", 0)  # priority 0 -> default level 3
    q.push("high", 1, "k", 0, priority=1)
    q.push("mid", 1, "k", 0, priority=2)
    q.push("too-big", 1, "k", 0, priority=9)  # out of range -> default level
    assert order(q) == ["high", "mid", "low-1", "default", "too-big"]
    assert [e.payload for e in q.pop(2)] == ["high", "mid"]
    assert order(q) == ["low-1", "default", "too-big"]
    assert len(q) == 3


def test_a_full_level_fails_at_once_with_unavailable() -> None:
    q = queue(LevelPolicy(max_queue_size=1), LevelPolicy(), default=2)
    q.push("a", 1, "k", 0, priority=1)
    with pytest.raises(Unavailable, match="exceeds maximum queue size") as info:
        q.push("b", 1, "k", 0, priority=1)
    assert info.value.code is ErrorCode.UNAVAILABLE
    q.push("c", 1, "k", 0, priority=2)  # another level has its own bound
    assert order(q) == ["a", "c"]


def test_the_whole_queue_is_bounded() -> None:
    q = queue(capacity=2)
    q.push("a", 1, "k", 0)
    q.push("b", 1, "k", 0)
    with pytest.raises(Unavailable, match="exceeds maximum queue size"):
        q.push("c", 1, "k", 0)


def test_reject_removes_a_request_once_its_timeout_passed() -> None:
    q = queue(LevelPolicy(default_timeout_ns=100 * US))
    q.push("a", 1, "k", 0)
    q.push("b", 1, "k", 50 * US)
    assert q.next_timeout() == 100 * US + 1
    assert q.expire(100 * US) == []  # expired only once now > timeout
    assert [e.payload for e in q.expire(100 * US + 1)] == ["a"]
    assert order(q) == ["b"]
    assert q.next_timeout() == 150 * US + 1
    assert [e.payload for e in q.expire(10**9)] == ["b"]
    assert len(q) == 0
    assert q.next_timeout() is None


def test_delay_moves_an_expired_request_behind_the_unexpired_of_its_level() -> None:
    delay = LevelPolicy(timeout_action="DELAY", default_timeout_ns=10 * US)
    q = queue(delay, LevelPolicy(), default=1)
    q.push("old", 1, "k", 0, priority=1)
    q.push("lower", 1, "k", 0, priority=2)
    q.push("new", 1, "k", 5 * US, priority=1)
    assert q.expire(11 * US) == []
    assert order(q) == ["new", "old", "lower"]
    assert len(q) == 3
    assert q.next_timeout() == 15 * US + 1  # "old" has no timeout any more
    q.expire(16 * US)
    assert order(q) == ["old", "new", "lower"]


def test_timeout_override_can_only_lower_the_default() -> None:
    policy = LevelPolicy(default_timeout_ns=1_000 * US, allow_timeout_override=True)
    assert policy.timeout_ns(None) == 1_000 * US
    assert policy.timeout_ns(100) == 100 * US
    assert policy.timeout_ns(5_000) == 1_000 * US
    no_override = LevelPolicy(default_timeout_ns=1_000 * US)
    assert no_override.timeout_ns(100) == 1_000 * US
    no_default = LevelPolicy(allow_timeout_override=True)
    assert no_default.timeout_ns(100) == 0  # Triton: an override cannot create a timeout


def test_an_overridden_timeout_expires_early() -> None:
    q = queue(LevelPolicy(default_timeout_ns=1_000 * US, allow_timeout_override=True))
    q.push("short", 1, "k", 0, timeout_us=10)
    q.push("long", 1, "k", 0, timeout_us=10_000)
    assert [e.payload for e in q.expire(11 * US)] == ["short"]
    assert [e.payload for e in q.expire(1_001 * US)] == ["long"]


def test_removed_and_taken_requests_leave_no_timeout_behind() -> None:
    q = queue(LevelPolicy(default_timeout_ns=10 * US))
    a = q.push("a", 1, "k", 0)
    q.push("b", 1, "k", 0)
    assert q.remove(a)
    assert not q.remove(a)
    assert [e.payload for e in q.pop(1)] == ["b"]
    assert q.next_timeout() is None
    assert q.expire(10**9) == []


def test_levels_from_spec_validates_priorities() -> None:
    levels, default = levels_from_spec(
        BatchingSpec(
            8,
            priority_levels=2,
            default_priority_level=2,
            default_queue_policy=QueuePolicy(max_queue_size=5),
            priority_queue_policy={1: QueuePolicy("DELAY", 100, True, 1)},
        )
    )
    assert default == 2
    assert levels == [LevelPolicy("DELAY", 100 * US, True, 1), LevelPolicy(max_queue_size=5)]
    assert levels_from_spec(BatchingSpec(8)) == ([LevelPolicy()], 1)
    with pytest.raises(InvalidArgument, match="default_priority_level"):
        levels_from_spec(BatchingSpec(8, priority_levels=2))
    with pytest.raises(InvalidArgument, match=r"outside 1\.\.2"):
        levels_from_spec(
            BatchingSpec(
                8, priority_levels=2, default_priority_level=1, priority_queue_policy={3: QueuePolicy()}
            )
        )


# ---------------------------------------------------------------------------------- tensors


def test_rows_are_the_first_dimension_all_inputs_share() -> None:
    assert request_rows({"a": np.zeros((3, 2)), "b": np.zeros(3)}, "n") == 3
    with pytest.raises(InvalidArgument, match="disagree on the batch size"):
        request_rows({"a": np.zeros((3, 2)), "b": np.zeros(2)}, "n")
    with pytest.raises(InvalidArgument, match="input 'a' has none"):
        request_rows({"a": np.float32(1.0) * np.ones(())}, "n")


def test_keys_differ_by_shape_and_dtype_but_not_by_rows() -> None:
    base = request_key({"x": np.zeros((2, 4), np.float32)})
    assert request_key({"x": np.zeros((5, 4), np.float32)}) == base
    assert request_key({"x": np.zeros((2, 5), np.float32)}) != base
    assert request_key({"x": np.zeros((2, 4), np.float64)}) != base
    assert request_key({"x": np.zeros((2, 4), np.float32), "y": np.zeros(2)}) != base
    # input order does not matter; BYTES of any width are one datatype
    two = {"a": np.zeros((1, 2)), "b": np.array([[b"xy"]], dtype=object)}
    assert request_key(two) == request_key({"b": np.array([[b"xyz"]]), "a": np.zeros((1, 2))})


def test_ragged_inputs_key_on_dtype_only() -> None:
    ragged = frozenset({"x"})
    assert request_key({"x": np.zeros((1, 3))}, ragged) == request_key({"x": np.zeros((1, 7))}, ragged)
    assert request_key({"x": np.zeros((1, 3))}, ragged) != request_key(
        {"x": np.zeros((1, 3), np.int8)}, ragged
    )


def test_merge_then_split_gives_every_request_exactly_its_rows() -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        rows = [int(r) for r in rng.integers(0, 5, size=int(rng.integers(1, 6)))]
        batch = [{"a": rng.random((r, 3)), "b": rng.integers(0, 9, (r, 2, 2))} for r in rows]
        merged = merge_rows(batch)
        assert merged["a"].shape == (sum(rows), 3)
        for part, original in zip(split_rows(merged, rows, "n"), batch, strict=True):
            assert part.keys() == original.keys()
            for name in original:
                np.testing.assert_array_equal(part[name], original[name])


def test_one_request_is_passed_through_untouched() -> None:
    one = {"x": np.zeros((2, 2))}
    assert merge_rows([one]) is one
    assert split_rows(one, [2], "n")[0] is one


def test_ragged_inputs_merge_as_the_flat_concatenation() -> None:
    batch = [{"x": np.arange(3).reshape(1, 3)}, {"x": np.arange(4).reshape(1, 4)}]
    merged = merge_rows(batch, frozenset({"x"}))
    np.testing.assert_array_equal(merged["x"], [0, 1, 2, 0, 1, 2, 3])


def test_a_split_that_does_not_add_up_is_an_internal_error_naming_the_node() -> None:
    with pytest.raises(
        InternalError, match="node 'net': output 'y' has 3 rows but the batch merged 4"
    ) as info:
        split_rows({"y": np.zeros((3, 1))}, [2, 2], "net")
    assert info.value.code is ErrorCode.INTERNAL
    with pytest.raises(InternalError, match="node 'net': output 'y' has no batch dimension"):
        split_rows({"y": np.zeros(())}, [1], "net")
    with pytest.raises(InternalError, match="node 'net' returned list"):
        split_rows([], [1], "net")  # type: ignore[arg-type]


def test_check_split_verifies_per_request_results() -> None:
    good = [{"y": np.zeros((2, 1))}, {"y": np.zeros((1, 1))}]
    assert check_split(good, [2, 1], "net") == good
    with pytest.raises(InternalError, match="node 'net' returned 1 results for a batch of 2 requests"):
        check_split(good[:1], [2, 1], "net")
    with pytest.raises(
        InternalError, match="output 'y' of request 1 in a batch has 1 rows, the request has 3"
    ):
        check_split(good, [2, 3], "net")
