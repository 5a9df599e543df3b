"""flowserve analyze's search against a fake measurement (no server): a three-node pipeline whose
'slow' node costs 1 ms per execution plus 10 us per row, so batching it is what pays."""

from __future__ import annotations

import pytest

from flowserve.analyze.report import Report, html_page, text
from flowserve.analyze.search import (
    Budget,
    Goal,
    MeasureError,
    NodeStat,
    Point,
    Trial,
    bottlenecks,
    brute,
    choose,
    guided,
    pareto,
)
from flowserve.analyze.space import Candidate, NodeConfig, NodeSpace, Space, grid, node_moves

SPACE = Space(
    (NodeSpace("pre", "python", 64, 4), NodeSpace("slow", "python", 64, 4), NodeSpace("post", "model", 8, 1)),
    max_workers=2,
)
SHIPPED = Candidate(1, (("pre", NodeConfig()), ("slow", NodeConfig()), ("post", NodeConfig())))
COST = {"pre": (50.0, 1.0), "slow": (1000.0, 10.0), "post": (80.0, 2.0)}  # us per execution, per row


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake(clock: FakeClock, seconds: float = 10.0, broken: Candidate | None = None):  # type: ignore[no-untyped-def]
    """A measurement: every node a queue with capacity instances x workers x rows per execution
    over its cost; throughput at concurrency c is bounded by the slowest node; p99 grows with
    the queue in front of it."""

    def measure(candidate: Candidate) -> list[Point]:
        clock.now += seconds
        if candidate == broken:
            raise MeasureError("failed to load 'pipe': bad config")
        points = []
        for c in (1, 2, 4, 8, 16, 32):
            stats, capacity = [], []
            for name, config in candidate.nodes:
                fixed, per_row = COST[name.rpartition("/")[2].removeprefix("model:")]
                rows = min(config.max_batch_size, c) if config.max_batch_size else 1
                execution = fixed + per_row * rows + config.delay_us * 0.5 * (rows < c)
                slow = name.endswith("slow")  # slow, inner/slow, model:slow
                parallel = min(config.instances, 2) * candidate.workers if slow else 1
                capacity.append(1e6 * rows * parallel / execution)
                stats.append((name, execution, rows))
            single = sum(e for _, e, _ in stats) / 1e6
            throughput = min(*capacity, c / single)
            bottleneck = min(range(len(capacity)), key=lambda i: capacity[i])
            p99 = c / throughput * 1000 * 1.5
            nodes = tuple(
                NodeStat(
                    n, (c / throughput * 1e6 - single * 1e6) if i == bottleneck else 5.0, e, 100, float(r)
                )
                for i, (n, e, r) in enumerate(stats)
            )
            points.append(Point(c, throughput, p99 / 1.5, p99, 0, nodes))
            if p99 > 20:
                break
        return points

    return measure


def test_guided_tries_the_bottleneck_first_and_batches_it() -> None:
    clock = FakeClock()
    goal = Goal(p99_ms=20.0)
    trials = guided(SHIPPED, SPACE, goal, fake(clock), Budget(300.0, clock))
    assert trials[0].why == "as shipped"
    assert trials[1].why.startswith("slow: batch up to 8")  # the bottleneck's first step
    chosen = choose(trials, goal)
    assert chosen is not None and chosen.candidate.node("slow").max_batch_size >= 8
    assert chosen.score >= 3 * trials[0].score
    assert chosen.candidate.workers == 1  # the nodes' steps come before --workers
    assert len({t.candidate for t in trials}) == len(trials)  # no configuration measured twice


def test_the_budget_is_kept() -> None:
    clock = FakeClock()
    trials = guided(SHIPPED, SPACE, Goal(20.0), fake(clock, seconds=10.0), Budget(35.0, clock))
    assert len(trials) == 4  # measured at 0, 10, 20, 30 s; none started after 35 s
    clock = FakeClock()
    assert len(brute(SHIPPED, SPACE, Goal(20.0), fake(clock), Budget(55.0, clock))) == 6


def test_a_candidate_that_fails_is_recorded_and_the_search_goes_on() -> None:
    clock = FakeClock()
    broken = SHIPPED.with_node("slow", NodeConfig(max_batch_size=8))
    trials = guided(SHIPPED, SPACE, Goal(20.0), fake(clock, broken=broken), Budget(300.0, clock))
    assert trials[1].candidate == broken and trials[1].error == "failed to load 'pipe': bad config"
    assert trials[1].score == 0 and len(trials) > 2
    assert "failed                 slow: batch up to 8 rows: failed to load 'pipe': bad config" in text(
        Report("pipe", Goal(20.0), trials, SHIPPED)
    )


def test_brute_measures_the_grid() -> None:
    candidates = grid(SPACE, SHIPPED)
    # pre and slow: 2 instance counts x (no batching + 8 and 64 with two delays) = 10; post: 1 x (1 + 1 x 2) = 3
    assert len(candidates) == 10 * 10 * 3 * 2
    clock = FakeClock()
    trials = brute(SHIPPED, SPACE, Goal(20.0), fake(clock, seconds=0.0), Budget(1e9, clock))
    assert len(trials) == len(candidates)  # the shipped one is in the grid: measured once
    best = choose(trials, Goal(20.0))
    assert best is not None and best.candidate.node("slow").max_batch_size > 0


def test_candidates_the_server_runs_alike_are_measured_once() -> None:
    # a Python model's count is the server's: under --workers 2, count 1 and count 2 both load
    # one instance per worker, while 3 loads one and two
    space = Space((NodeSpace("model", "model", 0, 4, shared=True),), max_workers=2)
    one, two, three = (Candidate(2, (("model", NodeConfig(n)),)) for n in (1, 2, 3))
    assert space.layout(one) == space.layout(two) != space.layout(three)
    assert space.layout(Candidate(1, one.nodes)) != space.layout(Candidate(1, two.nodes))
    unshared = Space((NodeSpace("model", "model", 0, 4),), max_workers=2)
    assert unshared.layout(one) != unshared.layout(two)
    measured: list[Candidate] = []

    def measure(candidate: Candidate) -> list[Point]:
        measured.append(candidate)
        return []

    trials = brute(one, space, Goal(20.0), measure, Budget(1e9, FakeClock()))
    # the grid: counts 1 and 2 under 1 and 2 workers; count 2 under 2 workers is count 1's layout
    assert (
        [t.candidate for t in trials] == measured == [one, Candidate(1, one.nodes), Candidate(1, two.nodes)]
    )


def test_moves_follow_the_statistics() -> None:
    batching = SHIPPED.with_node("slow", NodeConfig(max_batch_size=8))
    full = [m.why for m in node_moves(batching, SPACE.of("slow"), fill=1.0, waits=True)]
    assert full[0] == "slow: batches are full: up to 16" and "slow: 2 instances" in full
    sparse = [m.why for m in node_moves(batching, SPACE.of("slow"), fill=0.2, waits=False)]
    assert sparse[0] == "slow: wait 200us to fill batches"
    assert not list(node_moves(SHIPPED, NodeSpace("post", "model", 0, 1), fill=0.0, waits=True))


def test_choice_front_and_report() -> None:
    goal = Goal(p99_ms=10.0, min_throughput=150.0)
    a = Trial(0, SHIPPED, [Point(1, 100, 1, 2), Point(2, 180, 2, 12)], score=100)
    slow_batched = SHIPPED.with_node("slow", NodeConfig(max_batch_size=8))
    b = Trial(
        1,
        slow_batched,
        [Point(1, 90, 1, 1.5), Point(4, 300, 3, 8, 0, (NodeStat("slow", 900, 1100, 10, 6.0),))],
        "slow: batch up to 8",
        300,
    )
    c = Trial(
        2, SHIPPED.with_node("pre", NodeConfig(instances=2)), [Point(4, 310, 3, 30)], "pre: 2 instances", 0
    )
    assert choose([a, b, c], goal) is b
    assert choose([a], goal) is None  # 100 infer/s is under the minimum
    assert [(i, p.throughput) for i, p in pareto([(t.index, p) for t in (a, b, c) for p in t.points])] == [
        (1, 90), (0, 100), (1, 300), (2, 310),
    ]  # fmt: skip
    assert bottlenecks(b.points[1])[0].name == "slow"
    report = Report("pipe", goal, [a, b, c], SHIPPED)
    out = text(report)
    assert (
        "chosen: trial #1 (slow: 1 inst, batch 8): 300 infer/s at p99 8.00 ms (c=4), 3.00x the shipped" in out
    )
    assert (
        "its bottleneck now is node 'slow' (900 us queued + 1100 us computing per call, 6.0 rows per execution)"
        in out
    )
    page = html_page(report)
    assert (
        page.count("<svg") == 2
        and "<script" not in page
        and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    )


@pytest.mark.parametrize("count", [1, 3])
def test_describe_names_only_what_changed(count: int) -> None:
    changed = SHIPPED.with_node("pre", NodeConfig(instances=count))
    assert changed.describe(SHIPPED) == ("as shipped" if count == 1 else "pre: 3 inst, no batching")
    assert "workers=1" in changed.describe()


def test_a_sub_graph_s_node_and_a_model_s_own_settings_are_searched_bottleneck_first() -> None:
    """A graph whose 'pre' node runs in a sub-graph and whose slow step is a repository model
    (tuned by its instances and dynamic batching, 'model:slow', beside the node calling it)."""
    space = Space(
        (
            NodeSpace("inner/pre", "python", 64, 4),
            NodeSpace("model:slow", "model", 8, 4),
            NodeSpace("post", "python", 64, 4),
        ),
        max_workers=1,
    )
    shipped = Candidate(1, tuple((n.name, NodeConfig()) for n in space.nodes))
    clock = FakeClock()
    goal = Goal(p99_ms=20.0)
    trials = guided(shipped, space, goal, fake(clock), Budget(300.0, clock))
    assert trials[1].why == "model:slow: batch up to 8 rows"  # the bottleneck first
    chosen = choose(trials, goal)
    assert chosen is not None and chosen.candidate.node("model:slow").max_batch_size == 8
    assert chosen.candidate.node("model:slow").instances == 2  # the model's own instance count
    assert chosen.score >= 3 * trials[0].score
    assert any(t.why.startswith("inner/pre: ") for t in trials)  # the sub-graph's node is searched too
