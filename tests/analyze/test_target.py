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
    graph_edits,
    graph_text,
    locate,
    model_config,
    resolve,
    served_configs,
    space_of,
    tuned_models,
    write_chosen,
)
from tests.conftest import BUNDLED_GRAPHS, BUNDLED_REPOSITORY


def test_a_graph_by_name_and_its_space() -> None:
    target = resolve("fanout", [BUNDLED_REPOSITORY], [BUNDLED_GRAPHS])
    assert target.kind == "graph" and target.graph_file == (BUNDLED_GRAPHS / "fanout.yaml").resolve()
    space, shipped = space_of(target, {"simple": {"max_batch_size": 8}}, max_instances=3, max_workers=2)
    assert [(n.name, n.kind, n.batch_limit, n.max_instances) for n in space.nodes] == [
        ("addsub", "model node", 8, 1),  # the node's own batcher; the model's instances are...
        ("double_sum", "python", 64, 3),
        ("triple_diff", "python", 64, 3),
        ("join", "python", 64, 3),
        ("model:simple", "model", 8, 3),  # ...tuned as the model's (a config override)
    ]
    assert shipped == Candidate(1, tuple((n.name, NodeConfig()) for n in space.nodes))
    assert target.models == ["simple"] and list(target.graphs) == ["fanout"]


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
    assert write_chosen(target, candidate, "chosen by a test") == [tmp_path / "fanout.yaml.analyzed"]
    assert (tmp_path / "fanout.yaml").read_text() == before
    written = (tmp_path / "fanout.yaml.analyzed").read_text()
    assert written.startswith("# chosen by a test\n") and yaml.safe_load(written) == document
    # the original's comments and layout are kept: only the tuned values are new
    assert written.removeprefix("# chosen by a test\n").startswith(before.split("nodes:")[0])
    assert "    outputs: {sum: {datatype: INT32, dims: [-1, 16]}}\n" in written
    assert "    inputs: {a: double_sum.y, b: triple_diff.y}\n" in written
    assert (
        "    batching: {max_batch_size: 16, max_queue_delay_us: 200, preferred_batch_size: [8, 16]}\n"
        in written
    )
    assert "    instances: {count: 2}\n" in written
    assert written.count("\n") == 1 + before.count("\n") + 3  # header, join's two, addsub's one


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
    assert space.nodes[0].shared  # a Python model's KIND_CPU instances: split over the workers
    target.config["instance_group"] = [{"kind": "KIND_GPU", "count": 1}]
    assert not space_of(target, {}, 4, 1)[0].nodes[0].shared
    target.config["instance_group"] = [{"kind": "KIND_CPU", "count": 1}]
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
    [out] = write_chosen(target, chosen, "why")
    assert (
        out.name == "config.pbtxt.analyzed" and (tmp_path / "simple" / "config.pbtxt").read_text() == before
    )
    written = out.read_text()
    assert parse_config_text(written).instance_group[0].count == 2
    # edited in place: the original's comments and layout, then what batching adds
    assert written == "# why\n" + before.replace("count: 1", "count: 2") + (
        "dynamic_batching { max_queue_delay_microseconds: 500 preferred_batch_size: [ 8 ] }\n"
    )


HERE = Path(__file__).parent


def _outer(tmp_path: Path) -> Path:
    """tests/analyze/graphs (outer: a sub-graph, a switch, a split; inner: a model node and a
    python node) and the simple model, copied."""
    shutil.copytree(HERE / "graphs", tmp_path / "graphs")
    shutil.copytree(BUNDLED_REPOSITORY / "simple", tmp_path / "repo" / "simple")
    return tmp_path / "graphs" / "outer.yaml"


SIMPLE = {
    "name": "simple", "backend": "python", "max_batch_size": 8,
    "instance_group": [{"kind": "KIND_CPU", "count": 1}],
}  # fmt: skip


def test_the_nodes_of_a_sub_graph_are_tuned_and_switch_and_split_are_not(tmp_path: Path) -> None:
    target = resolve(str(_outer(tmp_path)), [tmp_path / "repo"], [])
    assert list(target.graphs) == ["outer", "inner"] and target.models == ["simple"]
    assert target.graphs["inner"].path == tmp_path / "graphs" / "inner.yaml"
    space, shipped = space_of(target, {"simple": SIMPLE}, 2, 1)
    assert [(n.name, n.kind) for n in space.nodes] == [
        ("big", "python"), ("small", "python"),  # not gate (switch), roll (split), inner_step (graph)
        ("inner/addsub", "model node"), ("inner/double", "python"),
        ("model:simple", "model"),  # called by inner's addsub and by roll's arm
    ]  # fmt: skip
    assert locate(target, "inner/double") == ("inner", "double") and locate(target, "big") == ("outer", "big")
    assert locate(target, "model:simple") == ("", "simple")
    candidate = shipped.with_node("inner/double", NodeConfig(2, 8, (), 100))
    assert graph_edits(target, "outer", candidate) == []
    assert graph_edits(target, "inner", candidate) == [
        (("nodes", "double", "instances", "count"), 2),
        (("nodes", "double", "batching", "max_batch_size"), 8),
        (("nodes", "double", "batching", "max_queue_delay_us"), 100),
    ]
    text, problem = graph_text(target, candidate, "inner")
    assert problem == "" and '# inner: the "simple" model, then a python step\n' in text
    assert (
        "    model: simple           # a repository model: its instances and batching are tuned too\n" in text
    )


def test_a_graph_that_uses_a_missing_graph_is_refused(tmp_path: Path) -> None:
    outer = _outer(tmp_path)
    (tmp_path / "graphs" / "inner.yaml").unlink()
    with pytest.raises(
        TargetError, match=r"outer.yaml: node 'inner_step' uses graph 'inner', found in none of"
    ):
        resolve(str(outer), [tmp_path / "repo"], [])
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(HERE / "graphs" / "inner.yaml", tmp_path / "elsewhere" / "sub.yaml")  # found by its name
    target = resolve(str(outer), [tmp_path / "repo"], [tmp_path / "elsewhere"])
    assert target.graphs["inner"].path == tmp_path / "elsewhere" / "sub.yaml"


def test_write_keeps_every_file_s_comments_and_writes_only_what_changed(tmp_path: Path) -> None:
    outer = _outer(tmp_path)
    target = resolve(str(outer), [tmp_path / "repo"], [])
    _, shipped = space_of(target, {"simple": SIMPLE}, 2, 1)
    chosen = shipped.with_node("model:simple", NodeConfig(2, 8, (4, 8), 0)).with_node(
        "inner/addsub", NodeConfig(1, 8, (), 200)
    )
    before = {p.name: p.read_text() for p in (tmp_path / "graphs").iterdir()}
    config_before = (tmp_path / "repo" / "simple" / "config.pbtxt").read_text()
    written = write_chosen(target, chosen, "why")
    assert written == [
        tmp_path / "graphs" / "outer.yaml.analyzed",  # the target's, always
        tmp_path / "graphs" / "inner.yaml.analyzed",
        tmp_path / "repo" / "simple" / "config.pbtxt.analyzed",
    ]
    assert {p.name: p.read_text() for p in (tmp_path / "graphs").glob("*.yaml")} == before
    assert (tmp_path / "repo" / "simple" / "config.pbtxt").read_text() == config_before
    assert written[0].read_text() == "# why\n" + before["outer.yaml"]
    inner = written[1].read_text()
    assert inner == "# why\n" + before["inner.yaml"].replace(
        "    inputs: {INPUT0: $a, INPUT1: $b}\n",
        "    inputs: {INPUT0: $a, INPUT1: $b}\n    batching: {max_batch_size: 8, max_queue_delay_us: 200}\n",
    )
    assert written[2].read_text() == "# why\n" + config_before.replace("count: 1", "count: 2") + (
        "dynamic_batching { max_queue_delay_microseconds: 0 preferred_batch_size: [ 4, 8 ] }\n"
    )
    # the shipped configuration changes nothing but the target's own file
    for path in written:
        path.unlink()
    assert write_chosen(target, shipped, "why") == [tmp_path / "graphs" / "outer.yaml.analyzed"]


def test_an_ensemble_tunes_each_step_s_model(tmp_path: Path) -> None:
    shutil.copytree(BUNDLED_REPOSITORY / "simple_ensemble", tmp_path / "simple_ensemble")
    shutil.copytree(BUNDLED_REPOSITORY / "simple", tmp_path / "simple")
    target = resolve(str(tmp_path / "simple_ensemble"), [tmp_path], [])
    ensemble = {
        "name": "simple_ensemble", "platform": "ensemble", "max_batch_size": 8, "instance_group": [],
        "ensemble_scheduling": {"step": [{"model_name": "simple"}, {"model_name": "simple"}]},
    }  # fmt: skip
    target.config = ensemble
    configs = served_configs(["simple_ensemble"], {"simple_ensemble": ensemble, "simple": SIMPLE}.get)
    assert list(configs) == ["simple_ensemble", "simple"]
    space, shipped = space_of(target, configs, 3, 1)
    assert [(n.name, n.kind, n.batch_limit, n.max_instances) for n in space.nodes] == [
        ("model:simple", "model", 8, 3)  # one node per model, however many steps call it
    ]
    chosen = shipped.with_node("model:simple", NodeConfig(3, 0, (), 0))
    assert write_chosen(target, chosen, "why") == [tmp_path / "simple" / "config.pbtxt.analyzed"]
    assert "count: 3" in (tmp_path / "simple" / "config.pbtxt.analyzed").read_text()


def test_nested_ensembles_stand_for_their_steps() -> None:
    configs = {
        "outer": {"platform": "ensemble", "ensemble_scheduling": {"step": [{"model_name": "e"}, {"model_name": "a"}]}},
        "e": {"platform": "ensemble", "ensemble_scheduling": {"step": [{"model_name": "b"}, {"model_name": "a"}]}},
        "a": {}, "b": {},
    }  # fmt: skip
    asked: list[str] = []

    def fetch(name: str) -> dict[str, object] | None:
        asked.append(name)
        return configs.get(name)  # type: ignore[return-value]

    assert list(served_configs(["outer", "gone"], fetch)) == ["outer", "e", "a", "b"]
    assert asked == ["outer", "gone", "e", "a", "b"]
    assert tuned_models(["outer", "b", "gone"], configs) == ["b", "a"]
