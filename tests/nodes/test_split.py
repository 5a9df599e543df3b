"""Canary / A/B split and shadow traffic: the pure arm choice, load-time validation, and the
node in a served graph (weights, sticky keys, request parameters, shadow, metrics, live weights)."""

from __future__ import annotations

import asyncio
import random
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import flowserve
from flowserve.core.errors import InvalidArgument, NotFound, SpecError
from flowserve.dataplane.plane import DataPlane
from flowserve.nodes.split import (
    SplitNode,
    choose_arm,
    key_position,
    parse_split_weights,
    pick_by_weight,
    tensor_key,
)
from flowserve.observability.metrics import make_registry, scrape
from flowserve.observability.render import render
from flowserve.repository.settings import RepositorySettings
from flowserve.spec.graph_yaml import load_graph_file

# ------------------------------------------------------------------------ the pure choice


def test_pick_by_weight_follows_the_cumulative_shares() -> None:
    assert pick_by_weight([90, 10], 0.0) == 0
    assert pick_by_weight([90, 10], 0.8999) == 0
    assert pick_by_weight([90, 10], 0.9) == 1
    assert pick_by_weight([90, 10], 0.99999) == 1
    assert pick_by_weight([0, 1, 0], 0.0) == 1  # weight 0 is never taken
    assert pick_by_weight([1, 0], 0.999999) == 0
    with pytest.raises(InvalidArgument):
        pick_by_weight([0, 0], 0.5)


def test_choose_arm_uses_the_injected_draw_without_a_key() -> None:
    draws = iter([0.05, 0.95, 0.5])
    picks = [choose_arm(["a", "b"], [50, 50], draw=lambda: next(draws)) for _ in range(3)]
    assert picks == [0, 1, 1]


def test_a_named_arm_wins_and_an_unknown_name_is_an_error() -> None:
    assert choose_arm(["a", "b"], [100, 0], named="b", draw=lambda: 0.0) == 1
    with pytest.raises(InvalidArgument, match=r"no arm named 'c' \(arms: a, b\)"):
        choose_arm(["a", "b"], [1, 1], named="c")


def test_sticky_keys_hash_stably_and_ignore_the_draw() -> None:
    def never() -> float:
        raise AssertionError("a keyed request must not draw")

    for key in (b"user-1", b"user-2", b"", b"x" * 1000):
        first = choose_arm(["a", "b"], [50, 50], key=key, draw=never)
        assert all(choose_arm(["a", "b"], [50, 50], key=key, draw=never) == first for _ in range(5))
    # the hash is fixed (the same on every process): pin one value
    assert key_position(b"user-1") == key_position(b"user-1")
    assert 0.0 <= key_position(b"user-1") < 1.0
    # about half of many keys land on each side of a 50/50 split
    sides = Counter(choose_arm(["a", "b"], [50, 50], key=f"k{i}".encode()) for i in range(2000))
    assert 900 < sides[0] < 1100


def test_raising_one_weight_only_moves_keys_toward_that_arm() -> None:
    keys = [f"user{i}".encode() for i in range(500)]
    before = {k: choose_arm(["a", "b"], [90, 10], key=k) for k in keys}
    after = {k: choose_arm(["a", "b"], [50, 50], key=k) for k in keys}
    assert all(after[k] == 1 for k in keys if before[k] == 1)  # canary keys stay on the canary


def test_tensor_keys() -> None:
    assert tensor_key(np.array([1, 2], np.int32)) == np.array([1, 2], np.int32).tobytes()
    assert tensor_key(np.array([b"ab", b"c"], dtype=object)) == b"ab\x00c"


def test_parse_split_weights() -> None:
    assert parse_split_weights("g", '{"a": 1, "b": 2}') == {"": {"a": 1, "b": 2}}
    assert parse_split_weights("g", {"roll": {"a": 0}}) == {"roll": {"a": 0}}
    with pytest.raises(InvalidArgument, match="not valid JSON"):
        parse_split_weights("g", "{")
    with pytest.raises(InvalidArgument, match="non-empty JSON object"):
        parse_split_weights("g", "[]")


# ------------------------------------------------------------------------ a served split


def _tag_model(root: Path, name: str, versions: dict[int, str], policy: str = "all {}") -> None:
    """A python-backend model: Y = X + the version's constant (or what ``body`` computes)."""
    model = root / name
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        textwrap.dedent(f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        version_policy: {{ {policy} }}
        input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        """)
    )
    for version, body in versions.items():
        (model / str(version)).mkdir()
        (model / str(version) / "model.py").write_text(
            textwrap.dedent(f"""
            import numpy as np
            import triton_python_backend_utils as pb_utils

            CALLS = []

            class TritonPythonModel:
                def execute(self, requests):
                    out = []
                    for request in requests:
                        x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                        CALLS.append(int(x[0]))
                        y = {body}
                        out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y.astype(np.int32))]))
                    return out
            """)
        )


def _graph(root: Path, name: str, split: str, extra_inputs: str = "") -> Path:
    graphs = root / "graphs"
    graphs.mkdir(exist_ok=True)
    path = graphs / f"{name}.yaml"
    path.write_text(
        textwrap.dedent(f"""
        inputs:
          x: {{datatype: INT32, dims: [1]}}
          {extra_inputs or ""}
        outputs:
          y: roll.Y
        nodes:
          roll:
            inputs: {{X: $x}}
            split:
        """)
        + textwrap.indent(textwrap.dedent(split), "      ")
    )
    return graphs


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    models = tmp_path / "models"
    _tag_model(models, "tag", {1: "x + 1000", 2: "x + 2000"})
    _tag_model(models, "shadowed", {1: "x + 9000"})
    _tag_model(models, "broken", {1: "x + 1 // 0"})  # raises ZeroDivisionError
    return tmp_path


def _split_node(engine: flowserve.Engine, graph: str) -> SplitNode:
    servable = engine.registry.get(graph)
    return next(n for n in servable.executor.nodes if isinstance(n, SplitNode))


async def _arm_of(engine: flowserve.Engine, graph: str, x: int = 0, **params: object) -> int:
    out = await engine.infer(graph, {"x": np.array([x], np.int32)}, parameters=dict(params))
    return int(out["y"][0] - x) // 1000


async def test_a_90_10_split_lands_near_90_10_over_1000_requests(repo: Path) -> None:
    graphs = _graph(
        repo,
        "canary",
        """
        arms:
          stable: {model: tag, version: 1, weight: 90}
          canary: {model: tag, version: 2, weight: 10}
        """,
    )
    engine = await flowserve.Engine.start(repo / "models", graphs)
    try:
        node = _split_node(engine, "canary")
        node.rng = random.Random(1234)  # injected: the count below is the same on every run
        arms = Counter([await _arm_of(engine, "canary", i) for i in range(1000)])
        assert set(arms) == {1, 2}
        assert 870 <= arms[1] <= 930, arms  # within 3 points of 90/10
        stats = {name: s.calls for name, s in zip(node.names, node.arm_stats, strict=True)}
        assert stats == {"stable": arms[1], "canary": arms[2]}
        # the versions' own statistics count the same requests
        assert engine.registry.get("tag", "1").stats.success.count == arms[1]
        assert engine.registry.get("tag", "2").stats.success.count == arms[2]
    finally:
        await engine.stop()


async def test_sticky_keys_always_take_the_same_arm(repo: Path) -> None:
    graphs = _graph(
        repo,
        "sticky",
        """
        arms:
          stable: {model: tag, version: 1, weight: 50}
          canary: {model: tag, version: 2, weight: 50}
        sticky: $user
        """,
        extra_inputs="user: {datatype: BYTES, dims: [1]}",
    )
    graphs2 = _graph(
        repo,
        "sticky_param",
        """
        arms:
          stable: {model: tag, version: 1, weight: 50}
          canary: {model: tag, version: 2, weight: 50}
        sticky_parameter: session
        """,
    )
    assert graphs == graphs2
    engine = await flowserve.Engine.start(repo / "models", graphs)
    try:
        seen: dict[str, set[int]] = {}
        for i in range(300):
            user = f"user{i % 30}"
            inputs = {"x": np.array([i], np.int32), "user": np.array([user.encode()], dtype=object)}
            out = await engine.infer("sticky", inputs)
            seen.setdefault(user, set()).add(int(out["y"][0] - i) // 1000)
        assert all(len(arms) == 1 for arms in seen.values()), seen
        assert {a for arms in seen.values() for a in arms} == {1, 2}  # both arms get users
        by_param: dict[str, set[int]] = {}
        for i in range(200):
            session = f"s{i % 20}"
            by_param.setdefault(session, set()).add(await _arm_of(engine, "sticky_param", i, session=session))
        assert all(len(arms) == 1 for arms in by_param.values()), by_param
    finally:
        await engine.stop()


async def test_a_request_parameter_picks_the_arm(repo: Path) -> None:
    graphs = _graph(
        repo,
        "ab",
        """
        arms:
          a: {model: tag, version: 1, weight: 100}
          b: {model: tag, version: 2, weight: 0}
        by_parameter: arm
        """,
    )
    engine = await flowserve.Engine.start(repo / "models", graphs)
    try:
        assert {await _arm_of(engine, "ab", i) for i in range(20)} == {1}  # weight 0: never drawn
        assert await _arm_of(engine, "ab", arm="b") == 2
        assert await _arm_of(engine, "ab", arm="a") == 1
        with pytest.raises(flowserve.NodeError, match="request parameter 'arm': no arm named 'c'"):
            await _arm_of(engine, "ab", arm="c")
    finally:
        await engine.stop()


async def test_shadow_answers_never_reach_the_client_and_its_errors_never_fail(repo: Path) -> None:
    graphs = _graph(
        repo,
        "mirror",
        """
        arms:
          live: {model: tag, version: 1}
        shadow: {model: shadowed}
        """,
    )
    _graph(
        repo,
        "mirror_broken",
        """
        arms:
          live: {model: tag, version: 2}
        shadow: {model: broken, max_in_flight: 1000}
        """,
    )
    engine = await flowserve.Engine.start(repo / "models", graphs)
    try:
        outputs = [await engine.infer("mirror", {"x": np.array([i], np.int32)}) for i in range(50)]
        assert [int(o["y"][0]) for o in outputs] == [1000 + i for i in range(50)]  # the live arm only
        node = _split_node(engine, "mirror")
        assert node.shadow is not None
        await node.shadow.drain()
        assert node.shadow.stats.calls == 50 and node.shadow.stats.errors == 0
        assert engine.registry.get("shadowed").stats.success.count == 50  # it did run
        # a shadow that always fails: every request still succeeds
        outputs = [await engine.infer("mirror_broken", {"x": np.array([i], np.int32)}) for i in range(20)]
        assert [int(o["y"][0]) for o in outputs] == [2000 + i for i in range(20)]
        broken = _split_node(engine, "mirror_broken")
        assert broken.shadow is not None
        await broken.shadow.drain()
        assert broken.shadow.stats.calls == 20 and broken.shadow.stats.errors == 20
        assert "ZeroDivisionError" in broken.shadow.stats.last_error
        assert broken.arm_stats[0].errors == 0
        # unloading the shadow target does not make the graph unready, and requests still pass
        await engine.unload_model("shadowed")
        assert engine.model_ready("mirror")
        out = await engine.infer("mirror", {"x": np.array([7], np.int32)})
        assert int(out["y"][0]) == 1007
        await node.shadow.drain()
        assert node.shadow.stats.errors == 1
    finally:
        await engine.stop()


async def test_shadow_copies_are_bounded(repo: Path) -> None:
    graphs = _graph(
        repo,
        "bounded",
        """
        arms:
          live: {model: tag, version: 1}
        shadow: {model: shadowed, max_in_flight: 2}
        """,
    )
    engine = await flowserve.Engine.start(repo / "models", graphs)
    try:
        node = _split_node(engine, "bounded")
        assert node.shadow is not None
        # ten requests at once: the shadow takes at most two of them
        await asyncio.gather(*(engine.infer("bounded", {"x": np.array([i], np.int32)}) for i in range(10)))
        await node.shadow.drain()
        assert node.shadow.stats.calls + node.shadow.stats.dropped == 10
        assert node.shadow.stats.dropped >= 1
    finally:
        await engine.stop()


async def test_weights_change_through_the_repository_api_without_a_reload(repo: Path) -> None:
    graphs = _graph(
        repo,
        "live",
        """
        arms:
          stable: {model: tag, version: 1, weight: 100}
          canary: {model: tag, version: 2, weight: 0}
        """,
    )
    engine = await flowserve.Engine.start(
        repo / "models", graphs, settings=RepositorySettings(control_mode="none")
    )
    plane = DataPlane(engine)
    try:
        servable = engine.registry.get("live")
        assert {await _arm_of(engine, "live", i) for i in range(10)} == {1}
        await plane.load("live", {"split_weights": '{"stable": 0, "canary": 1}'})
        assert engine.registry.get("live") is servable  # not reloaded
        assert {await _arm_of(engine, "live", i) for i in range(10)} == {2}
        await plane.load("live", {"split_weights": {"roll": {"stable": 1}}})
        assert _split_node(engine, "live").weights == (1.0, 1.0)
        with pytest.raises(InvalidArgument, match=r"no arm \['nope'\]"):
            await plane.load("live", {"split_weights": '{"nope": 1}'})
        with pytest.raises(InvalidArgument, match="must not all be 0"):
            await plane.load("live", {"split_weights": '{"stable": 0, "canary": 0}'})
        with pytest.raises(InvalidArgument, match="has no split node"):
            await plane.load("tag", {"split_weights": '{"a": 1}'})
        with pytest.raises(NotFound):
            await plane.load("missing", {"split_weights": '{"a": 1}'})
        assert _split_node(engine, "live").weights == (1.0, 1.0)  # failed changes changed nothing
    finally:
        await engine.stop()


async def test_per_arm_metrics(repo: Path) -> None:
    graphs = _graph(
        repo,
        "metered",
        """
        arms:
          stable: {model: tag, version: 1, weight: 1}
          canary: {model: tag, version: 2, weight: 0}
        by_parameter: arm
        shadow: {model: broken}
        """,
    )
    engine = await flowserve.Engine.start(repo / "models", graphs)
    try:
        for _ in range(3):
            await _arm_of(engine, "metered")
        await _arm_of(engine, "metered", arm="canary")
        node = _split_node(engine, "metered")
        assert node.shadow is not None
        await node.shadow.drain()
        text = scrape(make_registry(DataPlane(engine), process=False)).decode()
        labels = 'model="metered",version="1",node="roll"'
        assert f'flowserve_split_requests{{{labels},arm="stable",target="tag:1"}} 3' in text
        assert f'flowserve_split_requests{{{labels},arm="canary",target="tag:2"}} 1' in text
        assert f'flowserve_split_weight{{{labels},arm="stable",target="tag:1"}} 1' in text
        assert f'flowserve_split_errors{{{labels},arm="canary",target="tag:2"}} 0' in text
        assert f'flowserve_shadow_requests{{{labels},target="broken"}} 4' in text
        assert f'flowserve_shadow_errors{{{labels},target="broken"}} 4' in text
        assert f'flowserve_shadow_dropped{{{labels},target="broken"}} 0' in text
        assert "flowserve_split_duration_us{" in text
    finally:
        await engine.stop()


# ------------------------------------------------------------------------ validation at load


async def test_arms_must_match_and_exist(repo: Path) -> None:
    other = repo / "models"
    (other / "wide").mkdir()
    (other / "wide" / "config.pbtxt").write_text(
        (other / "tag" / "config.pbtxt")
        .read_text()
        .replace('"tag"', '"wide"')
        .replace("TYPE_INT32", "TYPE_FP32")
    )
    (other / "wide" / "1").mkdir()
    (other / "wide" / "1" / "model.py").write_text((other / "tag" / "1" / "model.py").read_text())
    graphs = _graph(
        repo,
        "mismatch",
        """
        arms:
          a: {model: tag}
          b: {model: wide}
          c: {graph: nowhere}
        """,
    )
    engine = await flowserve.Engine.start(repo / "models", graphs)
    try:
        assert not engine.model_ready("mismatch")
        messages = [str(i) for i in engine.issues]
        assert any("node 'roll'" in m and "graph 'nowhere' is unknown" in m for m in messages), messages
        _graph(
            repo,
            "mismatch",
            """
            arms:
              a: {model: tag}
              b: {model: wide}
            """,
        )
        with pytest.raises(InvalidArgument):
            await engine.load_model("mismatch")
        messages = [str(i) for i in engine.issues]
        assert any("split.arms.b" in m and "is FP32, not INT32" in m for m in messages), messages
        _graph(
            repo,
            "mismatch",
            """
            arms:
              a: {model: tag, version: 7}
            """,
        )
        with pytest.raises(
            InvalidArgument, match="arm 'a': Request for unknown model: 'tag' version 7 is not found"
        ):
            await engine.load_model("mismatch")
    finally:
        await engine.stop()


def test_yaml_schema_errors_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        textwrap.dedent("""
        inputs: {x: {datatype: INT32, dims: [1]}}
        outputs: {y: roll.Y}
        nodes:
          roll:
            inputs: {X: $x}
            split:
              arms:
                a: {model: m, weight: -1}
                b: {graph: g, version: 2}
                c: {model: m, graph: g}
              sticky: not-a-ref
              color: red
              shadow: {model: s, fraction: 2}
        """)
    )
    with pytest.raises(SpecError) as info:
        load_graph_file(path)
    text = str(info.value)
    for expected in (
        "field 'split.arms.a.weight': must be a number between 0 and 1000000",
        "field 'split.arms.b.version': a graph has no versions",
        "field 'split.arms.c': needs exactly one of",
        "field 'split.sticky'",
        "field 'split': unknown keys ['color']",
        "field 'split.shadow.fraction': must be a number between 0 and 1",
    ):
        assert expected in text, text


async def test_a_split_cannot_batch_and_renders_its_arms(repo: Path) -> None:
    graphs = _graph(
        repo,
        "batched",
        """
        arms:
          stable: {model: tag, version: 1, weight: 90}
          canary: {model: tag, version: 2, weight: 10}
        shadow: {model: shadowed}
        """,
    )
    text = (graphs / "batched.yaml").read_text()
    (graphs / "batched.yaml").write_text(
        text.replace("    split:", "    batching: {max_batch_size: 4}\n    split:")
    )
    _graph(
        repo,
        "drawn",
        """
        arms:
          stable: {model: tag, version: 1, weight: 90}
          canary: {model: tag, version: 2, weight: 10}
        shadow: {model: shadowed}
        """,
    )
    engine = await flowserve.Engine.start(repo / "models", graphs)
    try:
        assert not engine.model_ready("batched")
        reasons = [s.reason for s in engine.registry.index() if s.name == "batched"]
        assert any("a split node cannot batch" in r for r in reasons), reasons
        drawing = render(engine.registry.get("drawn").plan, "mmd", {}).decode()
        assert "stable (90): model 'tag' version 1" in drawing and "shadow: model 'shadowed'" in drawing
    finally:
        await engine.stop()


# ------------------------------------------------------------------------ over the wire


@pytest.mark.slow
def test_headers_route_and_weights_change_over_http_and_grpc(repo: Path, server_factory: Any) -> None:
    import json
    import urllib.request

    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    graphs = _graph(
        repo,
        "wire",
        """
        arms:
          stable: {model: tag, version: 1, weight: 100}
          canary: {model: tag, version: 2, weight: 0}
        by_parameter: x-arm
        """,
    )
    server = server_factory.start(
        "--http-header-forward-pattern=^x-arm$",
        "--grpc-header-forward-pattern=^x-arm$",
        repositories=(repo / "models",),
        graphs=(graphs,),
        listeners="http,grpc",
    )
    x = np.array([5], np.int32)
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:

        def via_http(headers: dict[str, str] | None = None) -> int:
            item = httpclient.InferInput("x", [1], "INT32")
            item.set_data_from_numpy(x)
            return int(http.infer("wire", [item], headers=headers).as_numpy("y")[0])

        def via_grpc(headers: dict[str, str] | None = None) -> int:
            item = grpcclient.InferInput("x", [1], "INT32")
            item.set_data_from_numpy(x)
            return int(grpc.infer("wire", [item], headers=headers).as_numpy("y")[0])

        assert via_http() == 1005 and via_grpc() == 1005
        assert via_http({"x-arm": "canary"}) == 2005  # the header names the arm
        assert via_grpc({"x-arm": "canary"}) == 2005
        # weights change through the repository API (HTTP), in control mode none, no reload
        body = json.dumps({"parameters": {"split_weights": {"stable": 0, "canary": 1}}}).encode()
        url = f"http://{server.http_url}/v2/repository/models/wire/load"
        with urllib.request.urlopen(urllib.request.Request(url, body, method="POST")) as reply:
            assert reply.status == 200
        assert via_http() == 2005 and via_grpc() == 2005
    finally:
        http.close()
        grpc.close()
