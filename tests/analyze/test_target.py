"""What analyze reads and writes: the target found by file or name, its space and shipped
configuration, a candidate as YAML or a config override, and --write beside the original."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from flowserve.analyze.space import Candidate, NodeConfig
from flowserve.analyze.target import (
    TargetError,
    graph_document,
    model_config,
    resolve,
    space_of,
    write_chosen,
)
from tests.conftest import BUNDLED_GRAPHS, BUNDLED_REPOSITORY


def test_a_graph_by_name_and_its_space() -> None:
    target = resolve("fanout", [BUNDLED_REPOSITORY], [BUNDLED_GRAPHS])
    assert target.kind == "graph" and target.graph_file == (BUNDLED_GRAPHS / "fanout.yaml").resolve()
    space, shipped = space_of(target, {"simple": {"max_batch_size": 8}}, max_instances=3, max_workers=2)
    assert [(n.name, n.kind, n.batch_limit, n.max_instances) for n in space.nodes] == [
        ("addsub", "model", 8, 1),  # a model node: its instances are the model's own
        ("double_sum", "python", 64, 3),
        ("triple_diff", "python", 64, 3),
        ("join", "python", 64, 3),
    ]
    assert shipped == Candidate(1, tuple((n.name, NodeConfig()) for n in space.nodes))


def test_unknown_targets_say_where_they_were_looked_for(tmp_path: Path) -> None:
    with pytest.raises(
        TargetError, match=r"'nosuch': no graph file, model directory or graph or model of that name in"
    ):
        resolve("nosuch", [BUNDLED_REPOSITORY], [BUNDLED_GRAPHS])
    (tmp_path / "x.yaml").write_text("name: x\n")
    with pytest.raises(TargetError, match="not a graph"):
        resolve(str(tmp_path / "x.yaml"), [], [])


def test_a_candidate_changes_only_its_keys_and_write_leaves_the_original(tmp_path: Path) -> None:
    shutil.copy(BUNDLED_GRAPHS / "fanout.yaml", tmp_path / "fanout.yaml")
    before = (tmp_path / "fanout.yaml").read_text()
    target = resolve(str(tmp_path / "fanout.yaml"), [BUNDLED_REPOSITORY], [])
    _, shipped = space_of(target, {"simple": {"max_batch_size": 8}}, 4, 2)
    candidate = shipped.with_node("join", NodeConfig(2, 16, (8, 16), 200)).with_node(
        "addsub", NodeConfig(1, 8)
    )
    document = graph_document(target, candidate)
    assert document["nodes"]["join"]["instances"] == {"count": 2}
    assert document["nodes"]["join"]["batching"] == {
        "max_batch_size": 16, "max_queue_delay_us": 200, "preferred_batch_size": [8, 16],
    }  # fmt: skip
    assert document["nodes"]["addsub"]["batching"] == {"max_batch_size": 8, "max_queue_delay_us": 0}
    assert (
        "batching" not in document["nodes"]["double_sum"]
        and "instances" not in document["nodes"]["double_sum"]
    )
    assert {k: v for k, v in document.items() if k != "nodes"} == {
        k: v for k, v in yaml.safe_load(before).items() if k != "nodes"
    }
    out = write_chosen(target, candidate, "chosen by a test")
    assert out == tmp_path / "fanout.yaml.analyzed"
    assert (tmp_path / "fanout.yaml").read_text() == before
    written = out.read_text()
    assert written.startswith("# chosen by a test\n") and yaml.safe_load(written) == document


def test_a_model_candidate_is_a_config_override(tmp_path: Path) -> None:
    target = resolve(str(BUNDLED_REPOSITORY / "simple"), [], [])
    assert target.kind == "model" and target.name == "simple"
    target.config = {
        "name": "simple", "backend": "python", "max_batch_size": 8,
        "instance_group": [{"kind": "KIND_CPU", "count": 1}],
        "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": ["16"]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": ["16"]}],
    }  # fmt: skip
    space, shipped = space_of(target, {}, 4, 1)
    assert shipped == Candidate(1, (("simple", NodeConfig()),)) and space.nodes[0].batch_limit == 8
    config = model_config(target, shipped.with_node("simple", NodeConfig(2, 4, (4,), 100)))
    assert config["instance_group"] == [{"kind": "KIND_CPU", "count": 2}] and config["max_batch_size"] == 4
    assert config["dynamic_batching"] == {"max_queue_delay_microseconds": "100", "preferred_batch_size": [4]}
    assert "dynamic_batching" not in model_config(target, shipped)


def test_a_written_model_config_reads_back(tmp_path: Path) -> None:
    from flowserve.analyze.target import config_text
    from flowserve.spec.triton import parse_config_text

    shutil.copytree(BUNDLED_REPOSITORY / "simple", tmp_path / "simple")
    target = resolve(str(tmp_path / "simple"), [], [])
    target.config = {
        "name": "simple", "backend": "python", "max_batch_size": 8,
        "instance_group": [{"kind": "KIND_CPU", "count": 1}],
        "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": ["16"]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": ["16"]}],
    }  # fmt: skip
    chosen = Candidate(1, (("simple", NodeConfig(2, 8, (8,), 500)),))
    config = parse_config_text(config_text(model_config(target, chosen)))
    assert config.instance_group[0].count == 2 and list(config.dynamic_batching.preferred_batch_size) == [8]
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    before = (tmp_path / "simple" / "config.pbtxt").read_text()
    out = write_chosen(target, chosen, "why")
    assert (
        out.name == "config.pbtxt.analyzed" and (tmp_path / "simple" / "config.pbtxt").read_text() == before
    )
    assert parse_config_text(out.read_text()).instance_group[0].count == 2
