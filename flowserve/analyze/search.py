"""The search (pure: the measurement and the clock are passed in, so tests drive it with a fake
measurement and no server).

Guided mode: measure the starting configuration; rank the nodes by the time a request spends in
each (queue + compute, from the server's per-node statistics), bottleneck first; try the steps
:func:`space.node_moves` proposes for it, keeping the first that raises the score by more than
the noise margin, then rank again from the new best. When no step of the bottleneck helps, the
next node's are tried, then ``--workers``. Brute mode measures a grid, in order, while the
budget lasts.

A configuration's score is the highest throughput among its measured load levels whose p99 is
within the target (and with no errors); one that meets the target nowhere scores 0."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from flowserve.analyze.space import Candidate, Move, Space, grid, node_moves, worker_move

NOISE = 0.05  # a step must raise the score by more than this fraction to be kept


@dataclass(frozen=True, slots=True)
class NodeStat:
    """One node's share of a measured level (averages per call over that level's window)."""

    name: str
    queue_us: float
    compute_us: float
    calls: int
    rows_per_exec: float  # inference count / execution count

    @property
    def total_us(self) -> float:
        return self.queue_us + self.compute_us


@dataclass(frozen=True, slots=True)
class Point:
    """One load level of one configuration."""

    concurrency: int
    throughput: float
    p50_ms: float
    p99_ms: float
    errors: int = 0
    nodes: tuple[NodeStat, ...] = ()


@dataclass(frozen=True, slots=True)
class Goal:
    p99_ms: float
    min_throughput: float = 0.0


@dataclass(slots=True)
class Trial:
    index: int
    candidate: Candidate
    points: list[Point]
    why: str = "as shipped"
    score: float = 0.0
    error: str = ""  # the configuration could not be applied or measured

    def best(self, goal: Goal) -> Point | None:
        """The point that sets the score (highest throughput within the target), if any."""
        fine = [p for p in self.points if p.p99_ms <= goal.p99_ms and not p.errors and p.throughput > 0]
        return max(fine, key=lambda p: p.throughput, default=None)

    def loaded(self, goal: Goal) -> Point | None:
        """The point whose node statistics decide the next step: the best one, else the lightest load."""
        return self.best(goal) or (self.points[0] if self.points else None)


Measure = Callable[[Candidate], list[Point]]  # raises MeasureError when a candidate cannot be measured


class MeasureError(Exception):
    """A candidate could not be applied or measured (the message says why); the search goes on."""


@dataclass(slots=True)
class Budget:
    """Time left, by an injected clock (seconds)."""

    seconds: float
    clock: Callable[[], float]
    start: float = field(init=False)

    def __post_init__(self) -> None:
        self.start = self.clock()

    def left(self) -> float:
        return self.seconds - (self.clock() - self.start)


def score(points: list[Point], goal: Goal) -> float:
    fine = [p.throughput for p in points if p.p99_ms <= goal.p99_ms and not p.errors]
    return max(fine, default=0.0)


def bottlenecks(point: Point | None) -> list[NodeStat]:
    """Nodes by the time a request spends in them, the largest first."""
    if point is None:
        return []
    return sorted(point.nodes, key=lambda n: n.total_us, reverse=True)


@dataclass(slots=True)
class Search:
    space: Space
    goal: Goal
    measure: Measure
    budget: Budget
    trials: list[Trial] = field(default_factory=list)
    seen: set[tuple[object, ...]] = field(default_factory=set)  # the layouts measured (Space.layout)
    log: Callable[[str], None] = lambda _: None

    def affordable(self) -> bool:
        """Whether another configuration fits in the budget: the time left covers half the
        average configuration so far (a configuration started is measured to its end)."""
        left = self.budget.left()
        spent = self.budget.seconds - left
        return left > 0 and (not self.trials or left >= 0.5 * spent / len(self.trials))

    def tried(self, candidate: Candidate) -> bool:
        """Whether ``candidate``, or one the server runs the same way, was measured."""
        return self.space.layout(candidate) in self.seen

    def run(self, candidate: Candidate, why: str) -> Trial:
        self.seen.add(self.space.layout(candidate))
        trial = Trial(len(self.trials), candidate, [], why)
        try:
            trial.points = self.measure(candidate)
        except MeasureError as exc:
            trial.error = str(exc)
        trial.score = score(trial.points, self.goal)
        self.trials.append(trial)
        self.log(_line(trial, self.goal))
        return trial

    def moves(self, best: Trial) -> Iterator[Move]:
        """Steps from ``best``: the bottleneck node's first, then the other nodes' by rank, then
        the server's workers."""
        point = best.loaded(self.goal)
        ranked = [n.name for n in bottlenecks(point)]
        ranked += [n.name for n in self.space.nodes if n.name not in ranked]
        stats = {n.name: n for n in (point.nodes if point else ())}
        for name in ranked:
            if not any(n.name == name for n in self.space.nodes):
                continue
            node = self.space.of(name)
            stat = stats.get(name)
            size = best.candidate.node(name).max_batch_size
            fill = stat.rows_per_exec / size if stat and size else 0.0
            waits = bool(stat and stat.queue_us > stat.compute_us)
            yield from node_moves(best.candidate, node, fill, waits)
        step = worker_move(best.candidate, self.space)
        if step is not None:
            yield step


def _line(trial: Trial, goal: Goal) -> str:
    if trial.error:
        return f"#{trial.index} {trial.why}: failed: {trial.error}"
    best = trial.best(goal)
    where = (
        f"{trial.score:.0f} infer/s at p99 {best.p99_ms:.2f} ms (c={best.concurrency})"
        if best
        else "target missed"
    )
    return f"#{trial.index} {trial.why}: {where}"


def guided(
    start: Candidate,
    space: Space,
    goal: Goal,
    measure: Measure,
    budget: Budget,
    log: Callable[[str], None] = lambda _: None,
) -> list[Trial]:
    search = Search(space, goal, measure, budget, log=log)
    best = search.run(start, "as shipped")
    while search.affordable():
        improved = False
        for move in search.moves(best):
            if search.tried(move.candidate):
                continue
            if not search.affordable():
                break
            trial = search.run(move.candidate, move.why)
            if trial.score > best.score * (1 + NOISE) or (best.score == 0 and trial.score > 0):
                best = trial
                improved = True
                break
        if not improved:
            break
    return search.trials


def brute(
    start: Candidate,
    space: Space,
    goal: Goal,
    measure: Measure,
    budget: Budget,
    log: Callable[[str], None] = lambda _: None,
) -> list[Trial]:
    search = Search(space, goal, measure, budget, log=log)
    search.run(start, "as shipped")
    for candidate in grid(space, start):
        if not search.affordable():
            break
        if not search.tried(candidate):
            search.run(candidate, candidate.describe(start))
    return search.trials


def choose(trials: list[Trial], goal: Goal) -> Trial | None:
    """The configuration with the highest score that reaches ``min_throughput`` (the lower p99
    among equal scores); None when none meets the target."""
    fine = [t for t in trials if t.score > 0 and t.score >= goal.min_throughput]
    if not fine:
        return None

    def rank(trial: Trial) -> tuple[float, float]:
        point = trial.best(goal)
        return trial.score, -(point.p99_ms if point is not None else 0.0)

    return max(fine, key=rank)


def pareto(points: list[tuple[int, Point]]) -> list[tuple[int, Point]]:
    """The (trial index, point) pairs no other beats on both throughput (higher) and p99 (lower),
    by rising throughput."""
    front = []
    for i, (trial, point) in enumerate(points):
        beaten = any(
            o.throughput >= point.throughput
            and o.p99_ms <= point.p99_ms
            and (o.throughput, o.p99_ms) != (point.throughput, point.p99_ms)
            for j, (_, o) in enumerate(points)
            if j != i
        )
        if not beaten and not point.errors and point.throughput > 0:
            front.append((trial, point))
    return sorted(front, key=lambda tp: tp[1].throughput)


__all__ = [
    "Budget",
    "Goal",
    "MeasureError",
    "NodeStat",
    "Point",
    "Trial",
    "bottlenecks",
    "brute",
    "choose",
    "guided",
    "pareto",
    "score",
]
