"""Bounds on a configuration's numbers (flowserve/spec/bounds.py), checked at load: config.pbtxt
from disk, config overrides (the same translation) and YAML graphs; each refusal names the
model or graph file, the field and the bound."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from flowserve.core.errors import SpecError, SpecIssue
from flowserve.nodes.backends import autocompletions
from flowserve.spec.bounds import BOUNDS, DAY_US, HOUR_US, config_problems, out_of_bounds
from flowserve.spec.graph_yaml import load_graph_file
from flowserve.spec.repository import scan_repository
from flowserve.spec.triton import model_spec, parse_config_json, parse_config_text

IO = (
    'backend: "python"\nmax_batch_size: 8\n'
    'input [{name: "X" data_type: TYPE_FP32 dims: [4]}]\n'
    'output [{name: "Y" data_type: TYPE_FP32 dims: [4]}]\n'
)
SEQUENCE = (
    'backend: "python"\nmax_batch_size: 4\n'
    'input [{name: "X" data_type: TYPE_INT32 dims: [1]}]\n'
    'output [{name: "Y" data_type: TYPE_INT32 dims: [1]}]\n'
)


def fields(text: str) -> dict[str, str]:
    return dict(config_problems(parse_config_text(text)))


def test_the_table_bounds_what_the_issue_found() -> None:
    assert BOUNDS["instances"].high == 1024
    assert BOUNDS["max_queue_delay_us"].high == HOUR_US
    assert BOUNDS["max_sequence_idle_us"].high == BOUNDS["queue_timeout_us"].high == DAY_US
    assert BOUNDS["max_batch_size"].high == 2**20
    assert out_of_bounds("instances", 1024) is None
    assert out_of_bounds("instances", 100_000) == (
        "must be between 1 and 1024 (instances of one model or node, all instance groups together), "
        "got 100000"
    )
    assert out_of_bounds("timeout_s", float("nan")) is not None


@pytest.mark.parametrize(
    ("extra", "field", "bound"),
    [
        ("instance_group [{count: 100000}]", "instance_group[0].count", "and 1024 (instances"),
        ("instance_group [{count: 2147483647}]", "instance_group[0].count", "and 1024 (instances"),
        ("instance_group [{count: 600}, {count: 600}]", "instance_group (all groups)", "got 1200"),
        (
            "dynamic_batching {max_queue_delay_microseconds: 9223372036854775807}",
            "dynamic_batching.max_queue_delay_microseconds",
            "and 3600000000 (microseconds, 1 hour)",
        ),
        (
            "dynamic_batching {preferred_batch_size: [4, 2000000]}",
            "dynamic_batching.preferred_batch_size[1]",
            "rows",
        ),
        ("dynamic_batching {priority_levels: 4294967295}", "dynamic_batching.priority_levels", "and 256"),
        (
            "dynamic_batching {default_priority_level: 100000}",
            "dynamic_batching.default_priority_level",
            "and 256",
        ),
        (
            "dynamic_batching {default_queue_policy {max_queue_size: 4294967295}}",
            "dynamic_batching.default_queue_policy.max_queue_size",
            "requests queued",
        ),
        (
            "dynamic_batching {default_queue_policy {default_timeout_microseconds: 18446744073709551615}}",
            "dynamic_batching.default_queue_policy.default_timeout_microseconds",
            "24 hours",
        ),
        (
            "dynamic_batching {priority_levels: 2 priority_queue_policy {key: 1 value: {max_queue_size: 4294967295}}}",
            "dynamic_batching.priority_queue_policy[1].max_queue_size",
            "requests queued",
        ),
        (
            "instance_group [{rate_limiter {resources [{name: 'r' count: 4294967295}]}}]",
            "instance_group[0].rate_limiter.resources[0].count",
            "rate limiter",
        ),
    ],
)
def test_config_fields_past_their_bounds(extra: str, field: str, bound: str) -> None:
    problems = fields(IO + extra)
    assert field in problems, problems
    assert bound in problems[field]


def test_dims_rank_and_size() -> None:
    text = IO.replace("dims: [4]}]\noutput", "dims: [4, 4294967296]}]\noutput")
    assert "input[0].dims[1]" in fields(text)
    text = IO.replace("dims: [4]}]\noutput", "dims: [" + ", ".join(["1"] * 40) + "]}]\noutput")
    assert "between 0 and 32 (dimensions of one tensor), got 40" in fields(text)["input[0].dims (rank)"]
    assert "max_batch_size" in fields(IO.replace("max_batch_size: 8", "max_batch_size: 2147483647"))


def test_sequence_fields() -> None:
    problems = fields(
        SEQUENCE + "sequence_batching {max_sequence_idle_microseconds: 9223372036854775807 "
        "oldest {max_candidate_sequences: 1000000 max_queue_delay_microseconds: 9223372036854775807 "
        "preferred_batch_size: [4194304]} "
        "state [{input_name: 'A' output_name: 'B' data_type: TYPE_INT32 dims: [65536, 65536]}]}"
    )
    assert set(problems) == {
        "sequence_batching.max_sequence_idle_microseconds",
        "sequence_batching.oldest.max_candidate_sequences",
        "sequence_batching.oldest.max_queue_delay_microseconds",
        "sequence_batching.oldest.preferred_batch_size[0]",
        "sequence_batching.state[0].dims (elements)",
    }
    direct = fields(SEQUENCE + "sequence_batching {direct {max_queue_delay_microseconds: 3600000001}}")
    assert list(direct) == ["sequence_batching.direct.max_queue_delay_microseconds"]


def test_sane_configs_have_no_problems() -> None:
    text = (
        IO
        + "instance_group [{count: 1024}]\n"
        + "dynamic_batching {max_queue_delay_microseconds: 3600000000 priority_levels: 3 "
        "default_priority_level: 2 default_queue_policy {default_timeout_microseconds: 86400000000}}"
    )
    assert fields(text) == {}


def _scan(tmp_path: Path, text: str) -> list[SpecIssue]:
    model = tmp_path / "big"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text("")
    (model / "config.pbtxt").write_text(text)
    return scan_repository(tmp_path, autocompletions()).issues


def test_a_config_from_disk_fails_naming_model_field_and_bound(tmp_path: Path) -> None:
    issues = _scan(tmp_path, IO + "instance_group [{count: 100000}]")
    assert [i.field for i in issues] == ["instance_group[0].count"]
    text = str(issues[0])
    assert "big/config.pbtxt" in text and "model 'big'" in text and "1024" in text and "100000" in text


def test_a_config_override_fails_before_anything_is_built(tmp_path: Path) -> None:
    model = tmp_path / "big"
    (model / "1").mkdir(parents=True)
    config = parse_config_json(
        '{"backend": "python", "max_batch_size": 8, "instance_group": [{"count": 2147483647}],'
        ' "dynamic_batching": {"max_queue_delay_microseconds": "9223372036854775808"}}'
    )
    issues: list[SpecIssue] = []
    assert model_spec(model, config, f"{model} (config override)", issues) is None
    assert {i.field for i in issues} == {
        "instance_group[0].count",
        "dynamic_batching.max_queue_delay_microseconds",
    }
    assert all("model 'big'" in str(i) for i in issues)


def test_warmup_count_and_size(tmp_path: Path) -> None:
    warm = (
        "model_warmup [{name: 'w' batch_size: 1 count: 100000 "
        "inputs {key: 'X' value: {data_type: TYPE_FP32 dims: [4] zero_data: true}}}]"
    )
    issues = _scan(tmp_path, IO + warm)
    assert len(issues) == 1 and "count must be between 0 and 1024 (runs of one warmup sample)" in str(
        issues[0]
    )


# ---------------------------------------------------------------------- YAML graphs

GRAPH: dict[str, Any] = {
    "inputs": {"x": {"datatype": "FP32", "dims": [4]}},
    "outputs": {"y": "n.y"},
    "nodes": {"n": {"python": "nodes.m:N", "inputs": {"x": "$x"}}},
}


def _graph_issues(
    tmp_path: Path, node: dict[str, Any] | None = None, whole: dict[str, Any] | None = None, **top: Any
) -> dict[str, str]:
    """The problems of GRAPH with ``node``'s keys added to its node (or ``whole`` as its node)."""
    doc = {**GRAPH, **top}
    doc["nodes"] = {"n": whole or {**GRAPH["nodes"]["n"], **(node or {})}}
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError) as info:
        load_graph_file(path)
    assert all(str(path) in str(i) for i in info.value.issues)
    return {i.field or "": i.message for i in info.value.issues}


@pytest.mark.parametrize(
    ("node", "field"),
    [
        ({"instances": {"count": 100000}}, "instances.count"),
        ({"batching": {"max_batch_size": 2**31}}, "batching.max_batch_size"),
        ({"batching": {"max_batch_size": 8, "max_queue_delay_us": 2**63}}, "batching.max_queue_delay_us"),
        (
            {"batching": {"max_batch_size": 8, "preferred_batch_size": [2**40]}},
            "batching.preferred_batch_size[0]",
        ),
        ({"batching": {"max_batch_size": 8, "priority_levels": 2**31}}, "batching.priority_levels"),
        (
            {"batching": {"max_batch_size": 8, "default_queue_policy": {"max_queue_size": 2**63}}},
            "batching.default_queue_policy.max_queue_size",
        ),
        (
            {"batching": {"max_batch_size": 8, "default_queue_policy": {"default_timeout_us": 2**63}}},
            "batching.default_queue_policy.default_timeout_us",
        ),
        (
            {
                "batching": {
                    "max_batch_size": 8,
                    "priority_levels": 2,
                    "priority_queue_policy": {1: {"max_queue_size": -1}},
                }
            },
            "batching.priority_queue_policy[1].max_queue_size",
        ),
    ],
)
def test_yaml_node_fields_past_their_bounds(tmp_path: Path, node: dict[str, Any], field: str) -> None:
    issues = _graph_issues(tmp_path, node)
    assert field in issues, issues
    assert "must be between" in issues[field]


def test_yaml_graph_fields_past_their_bounds(tmp_path: Path) -> None:
    issues = _graph_issues(
        tmp_path,
        max_batch_size=2**63,
        inputs={"x": {"datatype": "FP32", "dims": [2**40]}},
        warmup=[
            {
                "name": "w",
                "count": 2**31,
                "inputs": {"x": {"datatype": "FP32", "dims": [4], "zero_data": True}},
            }
        ],
    )
    assert "max_batch_size" in issues and "inputs.x.dims[0]" in issues
    assert "count must be between 0 and 1024" in issues["warmup[0]"]


def test_yaml_remote_and_split_numbers(tmp_path: Path) -> None:
    remote = {"url": "grpc://h:1", "model": "m", "max_in_flight": 2**40, "timeout_s": 1e300}
    issues = _graph_issues(tmp_path, whole={"remote": remote, "inputs": {"x": "$x"}})
    assert "between 1 and 65536" in issues["remote.max_in_flight"]
    assert "between 0.001 and 86400" in issues["remote.timeout_s"]
    arms = {"a": {"model": "m", "weight": float("inf")}, "b": {"model": "m", "weight": 1}}
    shadow = {"model": "m", "max_in_flight": 0}
    issues = _graph_issues(tmp_path, whole={"split": {"arms": arms, "shadow": shadow}, "inputs": {"x": "$x"}})
    assert "a split arm's weight" in issues["split.arms.a.weight"]
    assert "between 1 and 65536" in issues["split.shadow.max_in_flight"]
