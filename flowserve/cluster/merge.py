"""One server's statistics and /metrics from the answers of its worker processes (issue 19).

With ``--workers N`` every worker answers for the whole server: it gathers the per-worker
answers (its own included) and merges them with the pure functions here. Nothing is sampled or
estimated: a count of the merged answer is the exact sum of the workers' counts, so the whole
server reports as many requests as were sent, whatever worker served them.

:func:`merge_statistics` merges Triton model-statistics documents (the dicts of
``flowserve/dataplane/metadata.py``); :func:`merge_metrics` merges Prometheus text expositions
(format 0.0.4, what ``flowserve/observability/metrics.py`` serves). The default for both is
**sum**: a worker's count, duration, in-flight or pending amount is its share of the server's.
The exceptions are listed below, each with its reason: :data:`METRIC_RULES` for /metrics, and
:data:`STAT_MAX_KEYS` / :data:`STAT_IDENTITY_KEYS` / :data:`STAT_LIST_KEYS` for statistics.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Sequence
from typing import Any, Literal

Rule = Literal["sum", "max", "min"]

# ----------------------------------------------------------------------------- /metrics rules

# How the samples of a family are merged, by family name ("# TYPE" name), first match wins;
# "prefix*" matches names that start with prefix, "*suffix" names that end with it. Everything
# not listed is summed. A family listed here states a fact about the server or the machine that
# every worker reports the same way, so adding the workers' values would multiply it by N.
METRIC_RULES: tuple[tuple[str, Rule], ...] = (
    # the supervisor's count of workers and restarts: the same in every worker.
    ("flowserve_worker*", "max"),
    # 1 for each (model, version, state) in every worker: the server has that one state (while
    # workers disagree, e.g. mid-load, each state some worker reports shows 1).
    ("flowserve_model_state", "max"),
    # the configured weight of a split arm: the same in every worker.
    ("flowserve_split_weight", "max"),
    # info gauges are a constant 1 carrying labels (python_info, build info...).
    ("*_info", "max"),
    # the machine's GPUs and CPUs, read by every worker: utilisation, memory, power, energy.
    ("nv_gpu_*", "max"),
    ("nv_cpu_*", "max"),
    ("nv_energy_*", "max"),
    # a per-process limit (ulimit -n), the same for each worker.
    ("process_max_fds", "max"),
    # the server started when its first worker did; a series was created when first created.
    ("process_start_time_seconds", "min"),
    ("*_created", "min"),
)

# Samples of a summary carrying a ``quantile`` label cannot be merged exactly (a quantile of the
# union is not a function of the parts' quantiles); the largest is reported, an upper bound of
# the whole server's quantile. Their ``_sum`` and ``_count`` are summed like any counter.
QUANTILE_RULE: Rule = "max"

# Sample names that belong to the family named ``name`` (histograms, summaries, counters with
# ``_total``, OpenMetrics-style info and created series).
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created", "_info", "_gcount", "_gsum")


def metric_rule(family: str) -> Rule:
    """The merge rule of a family (its ``# TYPE`` name): :data:`METRIC_RULES`, else "sum"."""
    for pattern, rule in METRIC_RULES:
        if pattern.endswith("*"):
            if family.startswith(pattern[:-1]):
                return rule
        elif pattern.startswith("*"):
            if family.endswith(pattern[1:]):
                return rule
        elif family == pattern:
            return rule
    return "sum"


class _Series:
    """One sample (name + label set) being merged: its first text's spelling and the value."""

    __slots__ = ("head", "rule", "token", "value")

    def __init__(self, head: str, rule: Rule) -> None:
        self.head = head  # 'name{labels}' as the first text wrote it
        self.rule = rule
        self.value: int | float | None = None
        self.token: str | None = None  # the value as written, while it is one text's value


class _Family:
    __slots__ = ("help", "name", "rule", "series", "type")

    def __init__(self, name: str) -> None:
        self.name = name
        self.help: str | None = None  # the rest of the '# HELP name ' line, escapes kept
        self.type: str | None = None
        self.rule = metric_rule(name)
        self.series: dict[tuple[str, tuple[tuple[str, str], ...]], _Series] = {}


def _number(token: str) -> int | float:
    """A sample value: an int when it is written as one (sums of counts stay exact), else a
    float ('1.5', '1e+06', '+Inf', 'NaN')."""
    if token.isdigit() or (token[:1] == "-" and token[1:].isdigit()):
        return int(token)
    return float(token)


def _format(value: int | float) -> str:
    """A merged value the way the inputs write theirs: ints without '.0' (flowserve's
    exposition), floats as Python's shortest repr ('4.02'), and Prometheus' +Inf/-Inf/NaN."""
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = re.compile(r"\\(.)")


def _unescape(match: re.Match[str]) -> str:
    c = match.group(1)
    return "\n" if c == "n" else c if c in '\\"' else "\\" + c


def _parse_head(head: str) -> tuple[str, list[tuple[str, str]]]:
    """'name{a="x",b="y\\"z"}' -> ("name", [("a", 'x'), ("b", 'y"z')]), escapes undone."""
    brace = head.find("{")
    if brace < 0:
        return head.strip(), []
    labels = [
        (key, _UNESCAPE.sub(_unescape, value) if "\\" in value else value)
        for key, value in _LABEL.findall(head, brace + 1)
    ]
    return head[:brace].strip(), labels


def _label_key(labels: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The label set, order-free; bucket bounds and quantiles compared as numbers ('1' == '1.0')."""
    out = []
    for key, value in labels:
        if key in ("le", "quantile"):
            with contextlib.suppress(ValueError):
                value = repr(float(value))
        out.append((key, value))
    return tuple(sorted(out))


def _owner(name: str, current: _Family | None, families: dict[str, _Family]) -> _Family:
    """The family a sample named ``name`` belongs to: the one being read when the name is its
    own or a suffixed one, else a known family by name, else a new family without HELP/TYPE."""
    if current is not None and (
        name == current.name or (name.startswith(current.name) and name[len(current.name) :] in _SUFFIXES)
    ):
        return current
    family = families.get(name)
    if family is None:
        for suffix in _SUFFIXES:
            if name.endswith(suffix) and name[: -len(suffix)] in families:
                return families[name[: -len(suffix)]]
        family = families[name] = _Family(name)
    return family


def merge_metrics(texts: Sequence[str]) -> str:
    """Merge Prometheus text expositions (format 0.0.4) into one, as one server would serve it.

    - A sample is identified by its name and label set (label order does not matter, nor does
      '1' vs '1.0' in ``le``/``quantile``); the same sample in several texts is merged by its
      family's rule (:func:`metric_rule`: sum by default, max or min for the families of
      :data:`METRIC_RULES`; summary quantiles by :data:`QUANTILE_RULE`). Histogram buckets,
      ``_sum`` and ``_count`` are summed, which is exact: the histogram of all observations.
    - Integer values are summed as integers (exact at any size); a value seen in one text only,
      or picked by max/min, is printed as that text wrote it; sums of floats print like
      ``repr`` ('4.02'), with Prometheus' ``+Inf``/``-Inf``/``NaN``.
    - HELP and TYPE appear once per family, the first text's; families come in the order they
      are first seen (a family of a later text only is appended), samples in each family in
      first-seen order, written as the first text that had them wrote them. A family with no
      samples keeps its HELP/TYPE lines, as prometheus_client writes it.
    - Other comments, blank lines and sample timestamps are dropped (a merged sample has no
      single time).
    """
    families: dict[str, _Family] = {}
    seen: dict[str, _Series] = {}  # sample spelling -> its series (texts spell them alike)
    for text in texts:
        current: _Family | None = None
        for line in text.splitlines():
            if not line:
                continue
            if line[0] == "#":
                parts = line.split(None, 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    name = parts[2]
                    current = families.get(name)
                    if current is None:
                        current = families[name] = _Family(name)
                    rest = parts[3] if len(parts) > 3 else ""
                    if parts[1] == "HELP":
                        if current.help is None:
                            current.help = rest
                    elif current.type is None:
                        current.type = rest.strip()
                continue
            head, _, token = line.rstrip().rpartition(" ")
            head = head.rstrip()
            if not head.endswith("}") and (" " in head or "\t" in head):
                # 'name{...} value timestamp' or 'name value timestamp': drop the timestamp
                head, _, token = head.rpartition(" ")
                head = head.rstrip()
            series = seen.get(head)
            if series is None:
                name, labels = _parse_head(head)
                family = _owner(name, current, families)
                key = (name, _label_key(labels))
                series = family.series.get(key)
                if series is None:
                    rule = family.rule
                    if family.type == "summary" and any(k == "quantile" for k, _ in labels):
                        rule = QUANTILE_RULE
                    series = family.series[key] = _Series(head, rule)
                seen[head] = series
            value = _number(token)
            old = series.value
            if old is None:
                series.value, series.token = value, token
            elif series.rule == "sum":
                series.value, series.token = old + value, None
            elif (value > old) if series.rule == "max" else (value < old):
                series.value, series.token = value, token
    out: list[str] = []
    for family in families.values():
        if family.help is not None:
            out.append(f"# HELP {family.name} {family.help}")
        if family.type is not None:
            out.append(f"# TYPE {family.name} {family.type}")
        for s in family.series.values():
            assert s.value is not None
            out.append(f"{s.head} {s.token if s.token is not None else _format(s.value)}")
    return "\n".join(out) + "\n" if out else ""


# ----------------------------------------------------------------------------- statistics rules

# Keys whose value is the largest of the parts': the time of the last inference (ms since the
# epoch) of the whole server is the latest of its workers'.
STAT_MAX_KEYS = frozenset({"last_inference"})

# Keys that identify an entry rather than measure it: kept, never summed. A model entry is
# (name, version); a batch_stats entry is its batch_size; a memory_usage entry is (type, id).
STAT_IDENTITY_KEYS = frozenset({"name", "version", "batch_size", "type", "id"})

# Lists of entries merged entry by entry: key -> (the identity keys of an entry, whether the
# merged list is sorted by them). batch_stats is sorted by batch size, as Triton and
# metadata.py write it; memory_usage keeps first-seen order and sums byte_size per (type, id),
# the memory the whole server uses for the model.
STAT_LIST_KEYS: dict[str, tuple[tuple[str, ...], bool]] = {
    "batch_stats": (("batch_size",), True),
    "memory_usage": (("type", "id"), False),
}


def _clone(value: Any) -> Any:
    """A copy of a JSON-like value that shares no dict or list, with its source or within itself
    (``copy.deepcopy`` would keep one dict reached twice as one, and merging into it would
    count twice)."""
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone(v) for v in value]
    return value


def _merge_value(key: str, have: Any, new: Any) -> Any:
    """``have`` (owned by the result) merged with ``new`` (read only), under ``key``."""
    if have is None:
        return _clone(new)
    if new is None:
        return have
    if isinstance(have, bool) or isinstance(new, bool):
        return have  # a flag: the first part's (none in Triton's statistics)
    if isinstance(have, int | float) and isinstance(new, int | float):
        return max(have, new) if key in STAT_MAX_KEYS else have + new
    if isinstance(have, dict) and isinstance(new, dict):
        return _merge_dict(have, new)
    if isinstance(have, list) and isinstance(new, list):
        return _merge_list(key, have, new)
    return have  # strings, mismatched types: the first part's


def _merge_dict(have: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Key by key (numbers at the same path summed, nested dicts merged); identity keys kept;
    keys only some parts have are taken from those."""
    for k, v in new.items():
        if k not in have:
            have[k] = _clone(v)
        elif k not in STAT_IDENTITY_KEYS:
            have[k] = _merge_value(k, have[k], v)
    return have


def _merge_list(key: str, have: list[Any], new: list[Any]) -> list[Any]:
    """batch_stats/memory_usage entry by entry (:data:`STAT_LIST_KEYS`); any other list, or
    one whose entries lack their identity keys, is the first non-empty one of the parts."""
    spec = STAT_LIST_KEYS.get(key)
    if spec is not None:
        ids, ordered = spec
        if all(isinstance(e, dict) and all(i in e for i in ids) for e in (*have, *new)):
            entries: dict[tuple[Any, ...], dict[str, Any]] = {}
            for e in have:
                ident = tuple(e[i] for i in ids)
                if ident in entries:
                    _merge_dict(entries[ident], e)
                else:
                    entries[ident] = e
            for e in new:
                ident = tuple(e[i] for i in ids)
                if ident in entries:
                    _merge_dict(entries[ident], e)
                else:
                    entries[ident] = _clone(e)
            if ordered:
                return [entries[k] for k in sorted(entries)]
            return list(entries.values())
    return have if have else _clone(new)


def merge_statistics(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Merge Triton model-statistics documents (``{"model_stats": [...]}``, one per worker)
    into the whole server's. The parts are not modified.

    - One entry per (name, version), in the order of the first part that has it, then the ones
      later parts add, in their order; a model only some workers have is there with what those
      workers report.
    - Every number is summed with the number at the same path of the other parts' entry
      (``inference_count``, ``execution_count``, each ``{count, ns}`` of ``inference_stats``,
      ``response_stats`` per response index, anything a later version adds), exactly: the
      values are ints, and ints add without rounding. Except ``last_inference``: the max
      (:data:`STAT_MAX_KEYS`), and identity keys (:data:`STAT_IDENTITY_KEYS`), kept.
    - ``batch_stats`` entries are merged by ``batch_size`` and sorted by it; ``memory_usage``
      entries by (type, id) (:data:`STAT_LIST_KEYS`).
    - Whatever cannot be added (strings, other lists, flags, a number against a non-number) is
      the first part's value (for a list: the first non-empty one); a key only some parts have
      comes from them. Other top-level keys are merged by the same rules.
    """
    out: dict[str, Any] = {"model_stats": []}
    models: dict[tuple[str, str], dict[str, Any]] = {}
    for part in parts:
        for key, value in part.items():
            if key == "model_stats":
                for entry in value:
                    ident = (str(entry.get("name", "")), str(entry.get("version", "")))
                    have = models.get(ident)
                    if have is None:
                        models[ident] = _clone(entry)
                    else:
                        _merge_dict(have, entry)
            elif key in out:
                out[key] = _merge_value(key, out[key], value)
            else:
                out[key] = _clone(value)
    out["model_stats"] = list(models.values())
    return out


__all__ = [
    "METRIC_RULES",
    "QUANTILE_RULE",
    "STAT_IDENTITY_KEYS",
    "STAT_LIST_KEYS",
    "STAT_MAX_KEYS",
    "merge_metrics",
    "merge_statistics",
    "metric_rule",
]
