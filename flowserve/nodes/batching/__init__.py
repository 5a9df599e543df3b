"""Dynamic batching in front of any node: Triton's ``dynamic_batching``, priorities, queue
policies, instance groups and ragged batching.

Modules (decisions are pure, ``await`` lives only in batcher.py and runners.py):

- ``policy``: :func:`decide` (queue view, now, config) -> take N requests now / wait until T;
- ``queues``: priority levels, per-level queue policies, timeouts (REJECT / DELAY);
- ``tensors``: merge rows along the batch axis, split them back exactly, request keys;
- ``runners``: how a batch runs (a backend's instances, or any node's ``__call__``);
- ``batcher``: :class:`Batcher`, the node that wraps another node.

Instance groups: a batch goes to a free instance of the wrapped node, so ``count`` instances run
``count`` batches at once. Which device an instance is pinned to (KIND_GPU) is decided when the
backend loads it (``nodes/backends/_support.placement``), on the instance's own thread.
"""

from flowserve.nodes.batching.batcher import DEFAULT_MAX_QUEUED, Batcher
from flowserve.nodes.batching.policy import BatchPolicy, Candidate, Take, Wait, decide, policy_from_spec
from flowserve.nodes.batching.queues import Entry, LevelPolicy, PriorityQueue, levels_from_spec
from flowserve.nodes.batching.runners import BatchExecutor, BatchRunner, InstanceRunner, NodeRunner, Phases
from flowserve.nodes.batching.tensors import check_split, merge_rows, request_key, request_rows, split_rows

__all__ = [
    "DEFAULT_MAX_QUEUED",
    "BatchExecutor",
    "BatchPolicy",
    "BatchRunner",
    "Batcher",
    "Candidate",
    "Entry",
    "InstanceRunner",
    "LevelPolicy",
    "NodeRunner",
    "Phases",
    "PriorityQueue",
    "Take",
    "Wait",
    "check_split",
    "decide",
    "levels_from_spec",
    "merge_rows",
    "policy_from_spec",
    "request_key",
    "request_rows",
    "split_rows",
]
