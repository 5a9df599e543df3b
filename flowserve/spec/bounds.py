"""Bounds on the numbers of a configuration, checked once at load: the one table of them.

A config.pbtxt (from disk, or a load request's config override over either protocol) and a
YAML graph may say any number their schema allows; some numbers become threads, lists, timers
or allocations at load (``instance_group { count: 100000 }`` was 100k threads and a load that
never finished; ``max_queue_delay_microseconds: 2**63`` a model that never answered). Every
numeric field flowserve acts on is checked against :data:`BOUNDS` before anything is built from
it, and a value past its bound fails the load with an error naming the model (or graph file and
node), the field and the bound. The bounds are far beyond what a real deployment sets and low
enough that the server stays alive and responsive at them; a timer at its bound never
overflows anything (asyncio, uvloop's millisecond timers, a ``timerfd``).

::

    problem = out_of_bounds("instances", 100_000)
    # "must be between 1 and 1024 (instances of one model or node, all instance groups
    #  together), got 100000"
    for field, problem in config_problems(config): ...   # every field of a ModelConfig

The YAML parsers (``graph_yaml.py``, ``kinds.py``, ``warmup.py``, ``rayspec.py``) and the
Triton translation (``triton.py``, ``sequence.py``) check their fields against the same entries;
README "Security" lists them. The trace and log settings of the network APIs have their own
entries here too (:data:`SETTINGS`), read by the data plane.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from flowserve.spec.model_config import ModelConfig, ModelInput, ModelOutput, ModelQueuePolicy

SECOND_US: Final = 1_000_000
HOUR_US: Final = 3_600 * SECOND_US
DAY_US: Final = 24 * HOUR_US
INT32_MAX: Final = 2**31 - 1


# A request's own ``timeout`` parameter (µs) past this counts as this: any wait it becomes
# (asyncio.timeout, loop timers) stays a float of seconds that nothing overflows (2**1100 µs
# did: OverflowError, an INTERNAL answer).
LONGEST_REQUEST_TIMEOUT_US: Final = 30 * DAY_US


@dataclass(frozen=True, slots=True)
class Bound:
    """The values a setting may take: ``low`` .. ``high`` inclusive; ``what`` says what is
    counted (errors and the README say it)."""

    low: int | float
    high: int | float
    what: str

    def holds(self, value: float) -> bool:
        return self.low <= value <= self.high  # False for NaN too

    def problem(self, value: float) -> str | None:
        """Why ``value`` is refused, naming the bound (None: it is within)."""
        if self.holds(value):
            return None
        return f"must be between {_num(self.low)} and {_num(self.high)} ({self.what}), got {_num(value)}"


def _num(value: float) -> str:
    return str(int(value)) if isinstance(value, int) or value.is_integer() else repr(value)


# key -> bound. The fields each key covers are listed next to it (config.pbtxt / YAML).
BOUNDS: Final[Mapping[str, Bound]] = MappingProxyType(
    {
        # instance_group[].count (0 counts as 1) and their sum; YAML instances.count;
        # parameters flowserve.ray.count. Each instance is a thread, a process or an actor.
        "instances": Bound(1, 1024, "instances of one model or node, all instance groups together"),
        # max_batch_size (model, YAML graph, YAML batching), preferred_batch_size entries,
        # sequence_batching.oldest.preferred_batch_size, warmup batch_size
        "max_batch_size": Bound(0, 2**20, "rows in one batch"),
        # every entry of input/output dims, reshape.shape, sequence state dims,
        # initial_state dims, warmup dims; YAML inputs/outputs dims (-1: variable)
        "dim": Bound(-1, INT32_MAX, "elements along one dimension, -1 for a variable one"),
        # how many entries those dims lists have
        "rank": Bound(0, 32, "dimensions of one tensor"),
        # tensors made at load: a warmup sample's input (times its batch_size), a sequence's
        # initial or zero state
        "elements": Bound(
            0, 2**26, "elements of a tensor made at load, a warmup sample's or a sequence state's"
        ),
        # dynamic_batching / sequence_batching.direct / .oldest max_queue_delay_microseconds;
        # YAML batching.max_queue_delay_us
        "max_queue_delay_us": Bound(0, HOUR_US, "microseconds, 1 hour"),
        # default_timeout_microseconds of every queue policy; YAML default_timeout_us
        "queue_timeout_us": Bound(0, DAY_US, "microseconds, 24 hours"),
        # sequence_batching.max_sequence_idle_microseconds (0: Triton's default, 1 s)
        "max_sequence_idle_us": Bound(0, DAY_US, "microseconds, 24 hours"),
        # max_queue_size of every queue policy
        "max_queue_size": Bound(0, 2**20, "requests queued at one priority level"),
        # priority_levels, default_priority_level, priority_queue_policy keys
        "priority_levels": Bound(0, 256, "priority levels"),
        # sequence_batching.oldest.max_candidate_sequences
        "max_candidate_sequences": Bound(0, 65536, "sequences a model holds at once"),
        # instance_group[].rate_limiter.resources[].count and .priority
        "rate_limiter": Bound(0, INT32_MAX, "a rate limiter resource count or priority"),
        # model_warmup[].count; YAML warmup count
        "warmup_count": Bound(0, 1024, "runs of one warmup sample"),
        # YAML remote.max_in_flight and split.shadow.max_in_flight
        "max_in_flight": Bound(1, 65536, "calls in flight"),
        # YAML remote.timeout_s
        "timeout_s": Bound(0.001, 86_400, "seconds, 24 hours"),
        # YAML split arm weights
        "weight": Bound(0, 1_000_000, "a split arm's weight"),
    }
)

# The network's trace and log settings (HTTP /v2/trace/setting, /v2/models/M/trace/setting,
# /v2/logging; gRPC UpdateTraceSettings, LogSettings) and --trace-config.
SETTINGS: Final[Mapping[str, Bound]] = MappingProxyType(
    {
        "trace_rate": Bound(0, INT32_MAX, "every N-th request is traced, 0 none"),
        "trace_count": Bound(-1, INT32_MAX, "traces left, -1 no limit"),
        "log_frequency": Bound(0, INT32_MAX, "traces per trace file, 0 all in one"),
        "log_verbose_level": Bound(0, 255, "verbosity, 0 off"),
        # entries of a trace_level list (repeats are dropped)
        "trace_level": Bound(0, 8, "entries of trace_level"),
    }
)
# the trace levels a trace_level setting may name (OFF alone)
TRACE_LEVELS: Final = ("OFF", "TIMESTAMPS", "TENSORS")


def out_of_bounds(key: str, value: float) -> str | None:
    """Why ``value`` is no sane ``key`` setting (:data:`BOUNDS`), or None when it is."""
    return BOUNDS[key].problem(value)


# (field, what is wrong with it)
Problem = tuple[str, str]


class _Check:
    """Collects the problems of one configuration."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def value(self, key: str, field: str, value: float) -> bool:
        problem = out_of_bounds(key, value)
        if problem is not None:
            self.problems.append((field, problem))
        return problem is None

    def dims(self, field: str, dims: Sequence[int], rows: int = 1, made: bool = False) -> None:
        """A dims list; ``made``: a tensor of these dims (times ``rows``) is made at load."""
        if not self.value("rank", f"{field} (rank)", len(dims)):
            return
        bad = [i for i, d in enumerate(dims) if not BOUNDS["dim"].holds(d)]
        for i in bad:
            self.value("dim", f"{field}[{i}]", dims[i])
        if made and not bad:
            elements = rows
            for d in dims:
                elements *= max(d, 1)
            self.value("elements", f"{field} (elements)", elements)


def config_problems(config: ModelConfig) -> list[Problem]:
    """Every numeric field of a Triton ModelConfig that flowserve acts on, past its bound
    (an empty list: all within). ``model_warmup`` is checked where its samples are read
    (``warmup.py``), with the YAML graphs' warmup."""
    check = _Check()
    check.value("max_batch_size", "max_batch_size", config.max_batch_size)
    tensors: list[tuple[str, ModelInput | ModelOutput]] = [
        *((f"input[{i}]", t) for i, t in enumerate(config.input)),
        *((f"output[{i}]", t) for i, t in enumerate(config.output)),
    ]
    for field, tensor in tensors:
        check.dims(f"{field}.dims", tensor.dims)
        if tensor.HasField("reshape"):
            check.dims(f"{field}.reshape.shape", tensor.reshape.shape)
    _instance_groups(check, config)
    if config.HasField("dynamic_batching"):
        _dynamic_batching(check, config)
    if config.HasField("sequence_batching"):
        _sequence_batching(check, config)
    return check.problems


def _instance_groups(check: _Check, config: ModelConfig) -> None:
    total = 0
    for i, group in enumerate(config.instance_group):
        field = f"instance_group[{i}]"
        if group.count != 0:
            check.value("instances", f"{field}.count", group.count)
        total += max(group.count, 1)
        limiter = group.rate_limiter
        for j, resource in enumerate(limiter.resources):
            check.value("rate_limiter", f"{field}.rate_limiter.resources[{j}].count", resource.count)
        check.value("rate_limiter", f"{field}.rate_limiter.priority", limiter.priority)
    if len(config.instance_group) > 1:
        check.value("instances", "instance_group (all groups)", total)


def _dynamic_batching(check: _Check, config: ModelConfig) -> None:
    db = config.dynamic_batching
    _sizes(check, "dynamic_batching.preferred_batch_size", db.preferred_batch_size)
    check.value(
        "max_queue_delay_us", "dynamic_batching.max_queue_delay_microseconds", db.max_queue_delay_microseconds
    )
    check.value("priority_levels", "dynamic_batching.priority_levels", db.priority_levels)
    check.value("priority_levels", "dynamic_batching.default_priority_level", db.default_priority_level)
    _queue_policy(check, "dynamic_batching.default_queue_policy", db.default_queue_policy)
    for level, policy in db.priority_queue_policy.items():
        field = f"dynamic_batching.priority_queue_policy[{level}]"
        if check.value("priority_levels", f"{field} (level)", level):
            _queue_policy(check, field, policy)


def _sequence_batching(check: _Check, config: ModelConfig) -> None:
    sb = config.sequence_batching
    check.value(
        "max_sequence_idle_us",
        "sequence_batching.max_sequence_idle_microseconds",
        sb.max_sequence_idle_microseconds,
    )
    strategy = sb.WhichOneof("strategy_choice")
    if strategy == "direct":
        delay = sb.direct.max_queue_delay_microseconds
        check.value("max_queue_delay_us", "sequence_batching.direct.max_queue_delay_microseconds", delay)
    elif strategy == "oldest":
        oldest = sb.oldest
        check.value(
            "max_candidate_sequences",
            "sequence_batching.oldest.max_candidate_sequences",
            oldest.max_candidate_sequences,
        )
        check.value(
            "max_queue_delay_us",
            "sequence_batching.oldest.max_queue_delay_microseconds",
            oldest.max_queue_delay_microseconds,
        )
        _sizes(check, "sequence_batching.oldest.preferred_batch_size", oldest.preferred_batch_size)
    for i, state in enumerate(sb.state):
        check.dims(f"sequence_batching.state[{i}].dims", state.dims, made=True)
        for j, initial in enumerate(state.initial_state):
            check.dims(f"sequence_batching.state[{i}].initial_state[{j}].dims", initial.dims, made=True)


def _sizes(check: _Check, field: str, sizes: Iterable[int]) -> None:
    for i, size in enumerate(sizes):
        check.value("max_batch_size", f"{field}[{i}]", size)


def _queue_policy(check: _Check, field: str, policy: ModelQueuePolicy) -> None:
    check.value(
        "queue_timeout_us", f"{field}.default_timeout_microseconds", policy.default_timeout_microseconds
    )
    check.value("max_queue_size", f"{field}.max_queue_size", policy.max_queue_size)


__all__ = [
    "BOUNDS",
    "DAY_US",
    "HOUR_US",
    "LONGEST_REQUEST_TIMEOUT_US",
    "SETTINGS",
    "TRACE_LEVELS",
    "Bound",
    "Problem",
    "config_problems",
    "out_of_bounds",
]
