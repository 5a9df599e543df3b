"""Where a request runs, with ``--workers N``: the decision as a pure function.

State (what :func:`route` is given)
    ``loads``: per worker, the requests of the request's model in flight there now, read live
    from the :class:`~flowserve.cluster.board.Board` every worker writes its counts into (for
    another worker, at least what this one has sent there and not yet seen answered: a request
    on its way is not counted there yet). ``ready``: which workers take requests.
    :class:`Model`: how many requests of the model one worker runs at once without one waiting
    for another (``slots``), and what a request has cost so far (``compute_ns``).

Policy
    1. A model whose requests cost less than :data:`MIN_COMPUTE_NS` runs where it was decoded:
       the hop (two processes' CPU, about 100-200 us here: ``benchmarks/README.md``) would cost
       more than it saves. So does a request while its worker has a free slot for it. Before
       its first request has finished here a model counts as costly (a burst that arrives
       at once is spread; once a request was measured cheap, the model stays put).
    2. Otherwise it runs on the worker with the fewest requests of the model in flight, if
       that is fewer than here (join the shortest queue); ties keep it here, and among the
       others the scan starts after this worker, so equal workers share the spill-over.
    3. For a Python model (its instances share the interpreter lock) this worker's count also
       holds the requests it is relaying for the others (decoded here, running there, answered
       from here: ``relaying``). Its event loop takes the lock for every one of them, between the
       model's own turns, so each request of the model run here as well slows the relays, and
       the other workers, waiting on them, idle: the worker that decodes a whole connection
       runs one request at a time and the others keep a queue. Measured on 2 cores (a 2 ms pure
       Python model, one gRPC connection at concurrency 4, ``benchmarks/workers_cpu.py``): the
       accepting worker ran 2 and the other 2 at 468-498 infer/s, against 611-634 with this.

    Slots count cores, not instances: the instances of a Python model in one process share its
    interpreter lock, so they run one request at a time whatever their count (:func:`slots_of`);
    a backend that computes outside the lock (ONNX Runtime, torch, TensorRT) runs one per
    instance. Since a worker that decodes for a whole connection is slower at its own share of
    the model, its queue is the longer one at each arrival and the next request goes elsewhere:
    counting requests in flight follows where the cores are free with no clock to read.

Example::

    >>> route(0, [2, 1], [True, True], Model(slots=1, compute_ns=2_000_000))
    1
    >>> route(0, [1, 1], [True, True], Model(slots=1, compute_ns=2_000_000)) is None
    True
    >>> route(0, [5, 0], [True, True], Model(slots=1, compute_ns=20_000)) is None  # cheap
    True
    >>> route(0, [1, 2], [True, True], Model(slots=1, compute_ns=2_000_000, locked=True), relaying=2)
    1
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# a request that costs less than this (mean compute per request) never moves to another worker
MIN_COMPUTE_NS = 300_000
# platforms whose instances run Python code under this process's interpreter lock
GIL_BOUND = frozenset({"python", ""})


@dataclass(frozen=True, slots=True)
class Model:
    """What the routing decision needs of a model."""

    slots: int  # requests one worker runs at once without one waiting for another
    compute_ns: int | None  # mean compute time per request so far (None: none measured yet)
    locked: bool = False  # it computes under the interpreter lock (a Python model: policy 3)


def route(
    here: int, loads: Sequence[int], ready: Sequence[bool], model: Model, relaying: int = 0
) -> int | None:
    """The worker a request decoded by worker ``here`` should run on; None: here.
    ``relaying``: requests decoded here running on other workers now (policy 3)."""
    if model.compute_ns is not None and model.compute_ns < MIN_COMPUTE_NS:
        return None
    mine = loads[here]
    if mine < model.slots:
        return None
    best, least = None, (mine + relaying) if model.locked else mine
    count = len(loads)
    for step in range(1, count):
        other = (here + step) % count
        if ready[other] and loads[other] < least:
            best, least = other, loads[other]
    return best


def locked(kind: str, platform: str) -> bool:
    """Whether a servable computes under the interpreter lock for certain: a Python model (a
    graph or ensemble may have Python steps, or not: policy 3 leaves it out, unmeasured)."""
    return kind == "model" and platform in GIL_BOUND


def slots_of(kind: str, platform: str, instances: int) -> int:
    """A model's slots per worker: 1 for a graph or ensemble (its steps may be Python) and a
    Python model (one interpreter lock), else its instance count."""
    if kind != "model" or locked(kind, platform):
        return 1
    return max(1, instances)


def mean_compute_ns(total_ns: int, count: int) -> int | None:
    """Mean compute time per request from a model's statistics (None before the first)."""
    return total_ns // count if count else None


__all__ = ["GIL_BOUND", "MIN_COMPUTE_NS", "Model", "locked", "mean_compute_ns", "route", "slots_of"]
