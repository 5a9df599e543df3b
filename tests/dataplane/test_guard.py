"""The listener's connection cap (eviction of idle connections, the per-peer cap) and the
byte budgets, as pure objects driven by a fake clock."""

from __future__ import annotations

from flowserve.dataplane.guard import EVICT_AFTER_S, ByteBudget, ConnectionGuard, Guards


class FakeClock:
    """Seconds that move only when told to."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class Conn:
    """A connection as the guard sees it: idle since ``since`` (None: a request in flight)."""

    def __init__(self, since: float | None) -> None:
        self.since = since
        self.evicted = False

    def idle_since(self) -> float | None:
        return self.since

    def evict(self) -> None:
        self.evicted = True


def test_full_listener_evicts_the_connection_idle_longest() -> None:
    clock = FakeClock()
    guard = ConnectionGuard("grpc", limit=3, clock=clock.now)
    busy, old, newer = Conn(None), Conn(0.0), Conn(1.0)
    for conn in (busy, old, newer):
        assert guard.admit(conn, "10.0.0.1")
    clock.advance(EVICT_AFTER_S + 1.0)
    fresh = Conn(clock.now())
    assert guard.admit(fresh, "10.0.0.2")
    assert old.evicted and not newer.evicted and not busy.evicted
    assert (guard.open, guard.evicted, guard.refused) == (3, 1, 0)
    guard.release(old)  # the evicted connection closing later gives back nothing twice
    assert guard.open == 3


def test_no_idle_connection_means_a_refusal() -> None:
    clock = FakeClock()
    guard = ConnectionGuard("http", limit=2, clock=clock.now)
    a, b = Conn(None), Conn(clock.now())
    assert guard.admit(a) and guard.admit(b)
    clock.advance(EVICT_AFTER_S / 2)  # b idle, but not long enough
    assert not guard.admit(Conn(clock.now()))
    assert (guard.open, guard.refused, guard.evicted) == (2, 1, 0)
    assert not b.evicted


def test_per_peer_cap_evicts_only_that_peers_connections() -> None:
    clock = FakeClock()
    guard = ConnectionGuard("grpc", limit=100, clock=clock.now, per_peer=2)
    other = Conn(0.0)
    assert guard.admit(other, "127.0.0.2")
    mine = [Conn(None), Conn(None)]
    assert all(guard.admit(conn, "127.0.0.3") for conn in mine)
    clock.advance(EVICT_AFTER_S * 10)
    assert not guard.admit(
        Conn(clock.now()), "127.0.0.3"
    )  # its own are busy; the other peer's idle one is not its to take
    assert not other.evicted
    mine[1].since = clock.now() - EVICT_AFTER_S
    assert guard.admit(Conn(clock.now()), "127.0.0.3")
    assert mine[1].evicted and guard.open == 3


def test_untracked_connections_keep_the_old_counting() -> None:
    guard = ConnectionGuard("metrics", limit=1)
    assert guard.admit() and not guard.admit()
    guard.release()
    assert guard.admit()


def test_unsent_budget_counts_small_sizes() -> None:
    guards = Guards()
    assert guards.unsent.take(10) and guards.unsent.in_use == 10
    guards.unsent.give(10)
    budget = ByteBudget(100)
    assert budget.take(10) and budget.in_use == 0  # the request budget leaves small requests alone
    assert guards.listener("grpc").per_peer == guards.max_connections_per_peer
