"""Custom metrics (``MetricFamily``/``Metric``), process-wide as in Triton's core, exported
on ``/metrics`` by :func:`custom_metrics` (read by the metrics collector)."""

from __future__ import annotations

import enum
import math
import re
import threading
import weakref

from flowserve.nodes.backends.pb.errors import TritonModelException


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


COUNTER = MetricKind.COUNTER
GAUGE = MetricKind.GAUGE
HISTOGRAM = MetricKind.HISTOGRAM

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_metrics_lock = threading.Lock()


class _Series:
    """One labelled series of a family (shared by every Metric object with its labels)."""

    def __init__(self, kind: MetricKind, buckets: list[float] | None) -> None:
        self.kind = kind
        self.value = 0.0
        self.buckets = buckets or []
        self.counts = [0] * len(self.buckets)
        self.sum = 0.0
        self.count = 0
        self.refs = 0


class _FamilyState:
    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        self.name = name
        self.description = description
        self.kind = kind
        self.series: dict[tuple[tuple[str, str], ...], _Series] = {}
        self.refs = 0


_FAMILIES: dict[str, _FamilyState] = {}


def _release_family(name: str) -> None:
    with _metrics_lock:
        state = _FAMILIES.get(name)
        if state is not None:
            state.refs -= 1
            if state.refs <= 0:
                del _FAMILIES[name]


def _release_series(state: _FamilyState, key: tuple[tuple[str, str], ...]) -> None:
    with _metrics_lock:
        series = state.series.get(key)
        if series is not None:
            series.refs -= 1
            if series.refs <= 0:
                del state.series[key]


class MetricFamily:
    """A custom metric family, exported on ``/metrics`` with the server's own, as in Triton.
    Families of one name are shared (while any object of that name lives); a family and its
    series go away when the last object holding them is deleted (the model unloaded)."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: int) -> None:
        if name is None or description is None or kind is None:
            raise TypeError("MetricFamily(): name, description and kind must not be None")
        try:
            metric_kind = MetricKind(int(kind))
        except ValueError:
            raise TritonModelException("Error when creating MetricFamily: Unknown metric kind") from None
        if not _METRIC_NAME.match(name):
            raise TritonModelException(f"Error when creating MetricFamily: invalid metric name '{name}'")
        with _metrics_lock:
            state = _FAMILIES.get(name)
            if state is None:
                state = _FAMILIES[name] = _FamilyState(name, description, metric_kind)
            elif state.kind != metric_kind or state.description != description:
                raise TritonModelException(
                    f"Error when creating MetricFamily: a metric family named '{name}' already "
                    "exists with a different kind or description"
                )
            state.refs += 1
        self._state = state
        self.name = name
        self.description = description
        self.kind = metric_kind
        weakref.finalize(self, _release_family, name)

    def Metric(  # noqa: N802 - Triton's name
        self, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> Metric:
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if self.kind is not MetricKind.HISTOGRAM:
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
        elif self.kind is MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        return Metric(self, {str(k): str(v) for k, v in (labels or {}).items()}, buckets)


class Metric:
    """One series of a :class:`MetricFamily` (made by ``family.Metric(labels=..., buckets=...)``)."""

    def __init__(self, family: MetricFamily, labels: dict[str, str], buckets: list[float] | None) -> None:
        for label in labels:
            if not _LABEL_NAME.match(label):
                raise TritonModelException(f"Error when creating Metric: invalid label name '{label}'")
        bounds = sorted(float(b) for b in buckets) if buckets is not None else None
        key = tuple(labels.items())
        state = family._state
        with _metrics_lock:
            series = state.series.get(key)
            if series is None:
                series = state.series[key] = _Series(family.kind, bounds)
            series.refs += 1
        self._family = family  # a metric keeps its family alive
        self._series = series
        self._kind = family.kind
        weakref.finalize(self, _release_series, state, key)

    def increment(self, value: float) -> None:
        if self._kind is MetricKind.HISTOGRAM:
            raise TritonModelException(
                "Failed to increment metric value: Incorrect operation for histogram metric, use observe()"
            )
        if self._kind is MetricKind.COUNTER and value < 0:
            raise TritonModelException(
                "Failed to increment metric value: value must be non-negative for a counter"
            )
        with _metrics_lock:
            self._series.value += float(value)

    def set(self, value: float) -> None:
        if self._kind is not MetricKind.GAUGE:
            raise TritonModelException(
                "Failed to set metric value: set() is only for gauges "
                f"(this metric is a {self._kind.name.lower()})"
            )
        with _metrics_lock:
            self._series.value = float(value)

    def observe(self, value: float) -> None:
        if self._kind is not MetricKind.HISTOGRAM:
            raise TritonModelException(
                "Failed to observe metric value: observe() is only for histograms "
                f"(this metric is a {self._kind.name.lower()})"
            )
        v = float(value)
        with _metrics_lock:
            s = self._series
            for i, bound in enumerate(s.buckets):
                if v <= bound:
                    s.counts[i] += 1
            s.sum += v
            s.count += 1

    def value(self) -> float:
        if self._kind is MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to get metric value: value() is not supported for histograms")
        return self._series.value


def _le(bound: float) -> str:
    if math.isinf(bound):
        return "+Inf"
    return str(int(bound)) if bound == int(bound) else repr(bound)


def custom_metrics() -> list[tuple[str, str, str, list[tuple[str, dict[str, str], float]]]]:
    """Every live custom metric family as (name, description, type, samples), for /metrics:
    a histogram has Prometheus' ``_bucket`` (cumulative, ``le``), ``_sum`` and ``_count``."""
    out: list[tuple[str, str, str, list[tuple[str, dict[str, str], float]]]] = []
    with _metrics_lock:
        for state in _FAMILIES.values():
            samples: list[tuple[str, dict[str, str], float]] = []
            for key, s in state.series.items():
                labels = dict(key)
                if state.kind is MetricKind.HISTOGRAM:
                    for bound, n in zip(s.buckets, s.counts, strict=True):
                        if math.isinf(bound):
                            continue
                        samples.append((state.name + "_bucket", {**labels, "le": _le(bound)}, n))
                    samples.append((state.name + "_bucket", {**labels, "le": "+Inf"}, s.count))
                    samples.append((state.name + "_sum", labels, s.sum))
                    samples.append((state.name + "_count", labels, s.count))
                else:
                    samples.append((state.name, labels, s.value))
            typ = {MetricKind.COUNTER: "counter", MetricKind.GAUGE: "gauge"}.get(state.kind, "histogram")
            out.append((state.name, state.description, typ, samples))
    return out
