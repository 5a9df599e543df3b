"""Which worker loads a model, when one server runs several worker processes (``--workers N``).

Every worker loads every model and graph, and serves the requests it decoded itself, except a
model whose meaning needs *one place*; that one is loaded by a single worker, its owner, and the
others stand a forwarding node in for it (``nodes/forward.py``). A model needs one place when

- it has ``sequence_batching``: a sequence's state (and its order) lives in one batcher;
- it enables the response cache: one cache, of the size the server was given;
- the server runs the rate limiter and its instances ask for resources: one count of them;
- its config pins it: ``parameters { key: "flowserve.pin" value { string_value: "true" } }``
  (a model too big to load N times, or whose instances must not be multiplied).

A ``KIND_GPU`` model is *not* pinned: every worker loads its instance groups on the GPUs they
name, so every worker's cores decode, batch and feed the GPU with no hop between processes
(one worker decodes about 1.8k 600 KB images/s on an H200 host, far below what one GPU
computes). The price is memory on the GPU: per worker a CUDA context on each device it uses
(about 0.3-0.5 GiB), the weights, and ``count`` instances' workspaces, so ``--workers N``
takes N times what one process takes; a model that does not fit N times sets ``flowserve.pin``
and is then fed by the other workers through the link, whose large tensors cross in shared
memory (``cluster/arena.py``), one copy each way.

A Python model (``backend: "python"``) that every worker loads takes a *share* of each
``KIND_CPU`` group: worker ``w`` of ``N`` loads the group's instances ``w*count//N`` to
``(w+1)*count//N - 1`` (at least one), so ``count`` is the server's number of instances, as
each of Triton's stub processes is one, and the instances keep Triton's names over the workers.
The instances of one process share its interpreter lock, so a second one in a worker only takes
turns with the first and with the worker's event loop: measured on 2 cores
(``benchmarks/workers_cpu.py``, a 2 ms pure-Python model, ``count: 2``, one gRPC connection),
one instance per worker served 0.82-0.88x Triton 2.51 against 0.71-0.81x with two per worker.
A Python model whose work releases the lock (numpy, torch, waiting on I/O) runs ``count`` at
once in all, as in one process and in Triton. Other backends compute outside the lock, and each
worker loads all of their ``count``.

Ensembles and YAML graphs are never pinned: their steps reach a pinned model through its
forwarding node. The owner is a stable hash of the model's name over the workers, so pinned
models spread over the workers and a restarted worker owns the same ones again.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace

from flowserve.nodes.forward import Forwarder
from flowserve.spec.schema import InstanceSpec, ModelSpec

PIN_PARAMETER = "flowserve.pin"


def pin_reason(model: ModelSpec, rate_limited: bool = False) -> str | None:
    """Why ``model`` must be loaded by one worker only (None: it may be loaded by all)."""
    if model.graph is not None:
        return None
    config = model.config
    if config.HasField("sequence_batching"):
        return "sequence batching keeps each sequence's state in one place"
    if config.response_cache.enable:
        return "the response cache is one cache"
    if rate_limited and any(group.resources for group in model.instances):
        return "the rate limiter counts its resources in one place"
    if model.parameters.get(PIN_PARAMETER, "").strip().lower() in ("1", "true", "yes", "on"):
        return f"its config sets '{PIN_PARAMETER}'"
    return None


def owner_of(name: str, workers: int) -> int:
    """The worker that loads a pinned model: a stable hash of its name."""
    return zlib.crc32(name.encode()) % max(workers, 1)


def _run(count: int, worker: int, workers: int) -> tuple[int, int]:
    """Worker ``worker``'s run of ``count`` instances: (first index, how many), at least one
    (with fewer instances than workers, neighbours load the same one)."""
    start, end = worker * count // workers, (worker + 1) * count // workers
    return start, max(end - start, 1)


def share_counts(count: int, workers: int) -> tuple[int, ...]:
    """How many of a group's ``count`` instances each of ``workers`` loads (:func:`share`)."""
    return tuple(_run(count, w, workers)[1] for w in range(workers))


def share(group: InstanceSpec, worker: int, workers: int) -> InstanceSpec:
    """Worker ``worker``'s share of a group's instances: a contiguous run of its ``count``."""
    start, size = _run(group.count, worker, workers)
    return replace(group, count=size, first=group.first + start)


def shared_group(backend: str, kind: str) -> bool:
    """Whether the workers share an instance group of ``kind`` of a model of ``backend`` (each
    loads its run of the group's count: :func:`share`) rather than each loading it whole: a
    Python model's CPU instances, which take turns at one interpreter lock per process. The one
    rule for the server (:meth:`Placement.instances`) and ``flowserve analyze``."""
    return backend == "python" and kind == "KIND_CPU"


def shared(model: ModelSpec) -> bool:
    """Whether the workers share any of ``model``'s instance groups (:func:`shared_group`)."""
    return model.graph is None and any(shared_group(model.backend, g.kind) for g in model.instances)


@dataclass(frozen=True)
class Placement:
    """This worker's place among ``workers``, and how it reaches the owners of pinned models."""

    worker: int
    workers: int
    forward: Forwarder
    rate_limited: bool = False

    def owner(self, model: ModelSpec) -> int | None:
        """The worker that loads ``model``; None: every worker does."""
        if self.workers <= 1 or pin_reason(model, self.rate_limited) is None:
            return None
        return owner_of(model.name, self.workers)

    def here(self, model: ModelSpec) -> bool:
        owner = self.owner(model)
        return owner is None or owner == self.worker

    def instances(self, model: ModelSpec) -> ModelSpec:
        """``model`` with the instances this worker loads: its share of each ``KIND_CPU``
        group of a Python model that every worker loads, else all of them."""
        if self.workers <= 1 or not shared(model) or self.owner(model) is not None:
            return model
        groups = tuple(
            share(g, self.worker, self.workers) if shared_group(model.backend, g.kind) else g
            for g in model.instances
        )
        return replace(model, instances=groups)


__all__ = [
    "PIN_PARAMETER", "Placement", "owner_of", "pin_reason", "share", "share_counts", "shared", "shared_group",
]  # fmt: skip
