"""Where a request runs with ``--workers N`` (flowserve/cluster/routing.py, board.py): the pure
decision, a closed-loop simulation on a fake clock, and the board two workers share."""

from __future__ import annotations

import heapq
from pathlib import Path

import pytest

from flowserve.cluster.board import Board, BoardAdmission, create
from flowserve.cluster.routing import MIN_COMPUTE_NS, Model, locked, route, slots_of
from flowserve.core.errors import Unavailable

BURN = Model(slots=1, compute_ns=2_000_000)  # a 2 ms Python model: one request at a time per worker
UP = [True, True, True]


def test_a_cheap_model_runs_where_it_was_decoded() -> None:
    cheap = Model(slots=1, compute_ns=MIN_COMPUTE_NS - 1)
    assert route(0, [9, 0, 0], UP, cheap) is None
    assert route(0, [9, 0, 0], UP, Model(slots=1, compute_ns=0)) is None


def test_a_model_not_measured_yet_counts_as_costly() -> None:
    """A burst that arrives before any request finished is spread over the workers."""
    assert route(0, [3, 0, 0], UP, Model(slots=1, compute_ns=None)) == 1


def test_a_free_slot_keeps_the_request_here() -> None:
    assert route(0, [0, 0, 0], UP, BURN) is None
    assert route(0, [1, 0, 0], UP, Model(slots=2, compute_ns=2_000_000)) is None
    assert route(0, [2, 0, 0], UP, Model(slots=2, compute_ns=2_000_000)) == 1


def test_the_shortest_queue_wins_and_ties_stay_here() -> None:
    assert route(0, [1, 0, 0], UP, BURN) == 1
    assert route(0, [2, 1, 0], UP, BURN) == 2
    assert route(0, [1, 1, 1], UP, BURN) is None  # nowhere better: no hop for nothing
    assert route(0, [2, 1, 1], UP, BURN) == 1


def test_the_scan_starts_after_this_worker_so_equals_share_the_spill_over() -> None:
    assert route(1, [0, 3, 0], UP, BURN) == 2
    assert route(2, [0, 0, 3], UP, BURN) == 0


def test_a_worker_that_is_not_ready_takes_nothing() -> None:
    assert route(0, [3, 0, 1], [True, False, True], BURN) == 2
    assert route(0, [3, 0, 0], [True, False, False], BURN) is None


def test_slots_count_cores_not_instances() -> None:
    assert slots_of("model", "python", 8) == 1  # one interpreter lock, whatever the count
    assert slots_of("model", "onnxruntime_onnx", 2) == 2
    assert slots_of("model", "pytorch_libtorch", 0) == 1
    assert slots_of("graph", "", 4) == 1
    assert slots_of("ensemble", "ensemble", 4) == 1


def test_a_worker_relaying_for_others_counts_its_relays_for_a_locked_model() -> None:
    """The worker that decodes a connection relays the requests it spilled; for a model whose
    instances share the interpreter lock each relay counts as a request in flight here, so it
    runs one request at a time and the others keep the queue (policy 3)."""
    python = Model(slots=1, compute_ns=2_000_000, locked=True)
    assert route(0, [1, 2], UP[:2], python, relaying=2) == 1  # 1 + 2 relays > 2
    assert route(0, [1, 3], UP[:2], python, relaying=2) is None  # a tie stays here
    assert route(0, [0, 3], UP[:2], python, relaying=3) is None  # a free slot here comes first
    assert route(0, [1, 2], UP[:2], BURN, relaying=2) is None  # outside the lock: queues only
    assert route(0, [1, 0, 2], UP, python, relaying=2) == 1


def test_locked_models_are_python_models() -> None:
    assert locked("model", "python")
    assert not locked("graph", "")  # its steps may or may not be Python
    assert not locked("ensemble", "ensemble")
    assert not locked("model", "onnxruntime_onnx")
    assert not locked("model", "pytorch_libtorch")


def _simulate(clients: int, service_ns: list[int], hop_ns: int, requests: int) -> list[int]:
    """A closed loop of ``clients`` over one connection to worker 0, on a fake clock: each
    worker runs one request at a time (a Python model); a request moved to another worker
    arrives ``hop_ns`` later. Returns how many requests each worker ran."""
    workers = len(service_ns)
    queued = [0] * workers  # requests of the model in flight per worker (the board)
    busy_until = [0] * workers
    ran = [0] * workers
    events: list[tuple[int, int, str, int]] = []  # (time, seq, what, worker)
    seq = 0
    for _ in range(clients):
        heapq.heappush(events, (0, seq, "arrive", 0))
        seq += 1
    issued = clients
    while events:
        now, _, what, worker = heapq.heappop(events)
        if what == "arrive":
            target = route(0, queued, [True] * workers, BURN)
            where = 0 if target is None else target
            queued[where] += 1
            start = max(now + (hop_ns if where else 0), busy_until[where])
            busy_until[where] = start + service_ns[where]
            heapq.heappush(events, (busy_until[where], seq, "done", where))
        else:
            queued[worker] -= 1
            ran[worker] += 1
            if issued < requests:
                heapq.heappush(events, (now, seq, "arrive", 0))
                issued += 1
        seq += 1
    return ran


def test_one_connection_keeps_every_worker_busy_and_the_slower_one_gets_less() -> None:
    # worker 0 also decodes the connection: its model requests take longer there
    ran = _simulate(clients=4, service_ns=[2_600_000, 2_000_000], hop_ns=150_000, requests=2000)
    assert sum(ran) == 2000
    assert ran[1] > ran[0] > 700  # both busy, the free core more
    ran = _simulate(
        clients=8, service_ns=[2_600_000, 2_000_000, 2_000_000, 2_000_000], hop_ns=150_000, requests=4000
    )
    assert min(ran) > 700


def test_workers_see_each_others_counts_on_the_board(tmp_path: Path) -> None:
    path = tmp_path / "board"
    create(path, 2)
    zero, one = Board(path, 2, 0), Board(path, 2, 1)
    admit = BoardAdmission(zero, max_in_flight=0, max_per_model=2)
    admit.enter("m")
    admit.enter("m")
    assert one.loads("m") == [2, 0] and one.loads("other") == [0, 0]
    with pytest.raises(Unavailable):
        admit.enter("m")  # the bound holds as before
    admit.leave("m")
    assert one.loads("m") == [1, 0]
    one.put("m", 3)
    assert zero.loads("m") == [1, 3]
    again = Board(path, 2, 1)  # a restarted worker starts with nothing in flight
    assert zero.loads("m") == [1, 0] and again.loads("m") == [1, 0]
