"""Graph rendering (flowserve/observability/render, over the view of flowserve/graph/view.py):
the view, DOT, Mermaid, the built-in SVG layout, graphviz output, HTML, CLI."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from flowserve.core.errors import Unsupported
from flowserve.graph.plan import Plan
from flowserve.nodes.factory import compile_all
from flowserve.observability import render
from flowserve.repository.repository import add_import_roots, scan_all
from flowserve.spec.repository import Scan

ROOT = Path(__file__).resolve().parents[2]
needs_dot = pytest.mark.skipif(
    render.dot_binary() is None, reason="graphviz's dot is not installed (Debian: apt-get install graphviz)"
)

SETTINGS_GRAPH = """
name: tuned
max_batch_size: 8
inputs:
  a: {datatype: INT32, dims: [16]}
  b: {datatype: INT32, dims: [16]}
outputs:
  s: {from: [fast.y, slow.OUTPUT0], datatype: INT32, dims: [16]}
nodes:
  slow:
    model: simple
    inputs: {INPUT0: $a, INPUT1: $b}
    batching: {max_batch_size: 32, max_queue_delay_us: 500, preferred_batch_size: [4, 8]}
    instances: {count: 2, kind: KIND_CPU}
  fast:
    python: nodes.arith:Scale
    inputs: {x: [slow.OUTPUT1, $a]}
    outputs: {y: {datatype: INT32, dims: [-1, 16]}}
"""


def compiled(*graph_dirs: Path) -> tuple[dict[str, Plan], Scan]:
    dirs = [ROOT / "graphs", *graph_dirs]
    add_import_roots(dirs)
    scan = scan_all([ROOT / "model_repository"], dirs)
    result = compile_all(scan)
    assert not result.issues, result.issues
    return result.plans, scan


@pytest.fixture(scope="module")
def bundled() -> tuple[dict[str, Plan], Scan]:
    return compiled()


@pytest.fixture
def tuned(tmp_path: Path) -> tuple[Plan, Scan]:
    (tmp_path / "tuned.yaml").write_text(SETTINGS_GRAPH)
    plans, scan = compiled(tmp_path)
    return plans["tuned"], scan


def test_view_of_fanout_has_every_tensor_with_type(bundled: tuple[dict[str, Plan], Scan]) -> None:
    plans, scan = bundled
    view = render.graph_view(plans["fanout"], scan.models)
    assert [(v.role, v.name) for v in view.vertices] == [
        ("input", "a"),
        ("input", "b"),
        ("node", "addsub"),
        ("node", "double_sum"),
        ("node", "triple_diff"),
        ("node", "join"),
        ("output", "total"),
        ("output", "sum"),
    ]
    names = {v.id: v.name for v in view.vertices}
    edges = {(names[e.source], names[e.target], e.tensor): e for e in view.edges}
    assert set(edges) == {
        ("a", "addsub", "a"),
        ("b", "addsub", "b"),
        ("addsub", "double_sum", "OUTPUT0"),
        ("addsub", "triple_diff", "OUTPUT1"),
        ("double_sum", "join", "y"),
        ("triple_diff", "join", "y"),
        ("join", "total", "sum"),
        ("addsub", "sum", "OUTPUT0"),
    }
    e = edges[("addsub", "double_sum", "OUTPUT0")]
    assert (e.ports, e.datatype, e.shape, e.style) == (("x",), "INT32", "[-1,16]", "data")
    assert e.label == "OUTPUT0 → x\nINT32 [-1,16]"
    assert edges[("a", "addsub", "a")].label == "a → INPUT0\nINT32 [-1,16]"
    addsub = view.vertex(view.node_ids["addsub"])
    assert addsub.kind == "model"
    assert addsub.lines == ("model: simple (python)", "instances: 1 x CPU")
    assert view.vertex(view.node_ids["join"]).lines == ("python: nodes.arith:Add",)


def test_switch_branches_and_first_present_are_distinct(bundled: tuple[dict[str, Plan], Scan]) -> None:
    plans, _ = bundled
    view = render.graph_view(plans["route"])
    names = {v.id: v.name for v in view.vertices}
    edges = {(names[e.source], names[e.target]): e for e in view.edges}
    gate_in = edges[("x", "gate")]
    assert gate_in.ports == ("on", "payload") and gate_in.style == "data"
    big, small = edges[("gate", "shrink")], edges[("gate", "keep")]
    assert (big.style, big.tensor, big.note) == ("branch", "big", "branch big: x gt 100 (any)")
    assert (small.style, small.note) == ("branch", "branch small: default")
    first, second = edges[("shrink", "y")], edges[("keep", "y")]
    assert (first.style, first.note) == ("first_present", "1st of 2 (first present)")
    assert (second.style, second.note) == ("first_present", "2nd of 2 (first present)")
    gate = view.vertex(view.node_ids["gate"])
    assert gate.kind == "switch"
    assert gate.lines == ("switch", "big: x gt 100 (any)", "small: default")


def test_node_settings_batching_and_instances(tuned: tuple[Plan, Scan]) -> None:
    plan, scan = tuned
    view = render.graph_view(plan, scan.models)
    slow = view.vertex(view.node_ids["slow"])
    assert slow.lines == (
        "model: simple (python)",
        "batching: max 32, preferred 4/8, delay 500µs",
        "instances: 2 x CPU",
    )
    names = {v.id: v.name for v in view.vertices}
    notes = {(names[e.source], names[e.target]): (e.style, e.note) for e in view.edges}
    assert notes[("slow", "fast")] == ("first_present", "1st of 2 (first present)")
    assert notes[("a", "fast")] == ("first_present", "2nd of 2 (first present)")
    assert notes[("fast", "s")] == ("first_present", "1st of 2 (first present)")
    assert notes[("slow", "s")] == ("first_present", "2nd of 2 (first present)")


def test_dot_text(bundled: tuple[dict[str, Plan], Scan], tuned: tuple[Plan, Scan]) -> None:
    plans, scan = bundled
    dot = render.to_dot(render.graph_view(plans["route"], scan.models))
    assert dot.startswith('digraph "route" {\n  rankdir=LR;')
    assert dot.rstrip().endswith("}")
    for name in ("x", "gate", "shrink", "keep", "y"):
        assert f"<B>{name}</B>" in dot
    assert '"fs_node_0" [id="fs_node_0"' in dot and "shape=hexagon" in dot
    assert (
        '"fs_node_0" -> "fs_node_1" [id="fs_edge_1", label="branch big: x gt 100 (any)\\nbig → x\\nFP32 [-1]"'
        in dot
    )
    edge_lines = {line.split(" [", 1)[0].strip(): line for line in dot.splitlines() if " -> " in line}
    assert "style=bold" in edge_lines['"fs_node_0" -> "fs_node_1"']
    assert "style=bold" in edge_lines['"fs_node_0" -> "fs_node_2"']
    assert 'label="1st of 2 (first present)' in edge_lines['"fs_node_1" -> "fs_out_0"']
    assert "style=dashed" in edge_lines['"fs_node_1" -> "fs_out_0"']
    assert "style=" not in edge_lines['"fs_in_0" -> "fs_node_0"']
    tuned_dot = render.to_dot(render.graph_view(tuned[0], tuned[1].models))
    assert "batching: max 32, preferred 4/8, delay 500µs" in tuned_dot
    assert "instances: 2 x CPU" in tuned_dot


def test_mermaid_text(bundled: tuple[dict[str, Plan], Scan]) -> None:
    plans, scan = bundled
    mmd = render.to_mermaid(render.graph_view(plans["route"], scan.models))
    lines = mmd.splitlines()
    assert lines[1] == "flowchart LR"
    assert '  fs_in_0(["x<br/>FP32 [-1]"])' in lines
    assert '  fs_node_0{{"gate<br/>switch<br/>big: x gt 100 (any)<br/>small: default"}}' in lines
    assert '  fs_node_0 ==>|"branch big: x gt 100 (any)<br/>big → x<br/>FP32 [-1]"| fs_node_1' in lines
    assert '  fs_node_2 -.->|"2nd of 2 (first present)<br/>y<br/>FP32 [-1]"| fs_out_0' in lines
    assert '  fs_in_0 -->|"x → on, payload<br/>FP32 [-1]"| fs_node_0' in lines
    fanout = render.to_mermaid(render.graph_view(plans["fanout"], scan.models))
    assert '  fs_node_0 -->|"OUTPUT0 → x<br/>INT32 [-1,16]"| fs_node_1' in fanout


@pytest.mark.parametrize("name", ["fanout", "route", "simple", "simple_ensemble"])
def test_builtin_svg_is_valid_and_boxes_do_not_overlap(
    bundled: tuple[dict[str, Plan], Scan], name: str
) -> None:
    plans, scan = bundled
    view = render.graph_view(plans[name], scan.models)
    svg = render.builtin_svg(view)
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    groups = {g.get("id"): g for g in root.iter(f"{ns}g")}
    for v in view.vertices:
        assert v.id in groups and groups[v.id].get("data-name") == v.name
    assert sum(1 for gid in groups if gid and gid.startswith("fs_edge_")) == len(view.edges)
    lay = render.layout(view)
    boxes = list(lay.boxes.values())
    for i, a in enumerate(boxes):
        assert a.x >= 0 and a.x + a.w <= lay.width and a.y >= 0 and a.y + a.h <= lay.height
        for b in boxes[i + 1 :]:
            apart = a.x + a.w <= b.x or b.x + b.w <= a.x or a.y + a.h <= b.y or b.y + b.h <= a.y
            assert apart, (a, b)
    # edges run left to right, from the source's right side into the target's left side
    for e, route in zip(view.edges, lay.routes, strict=True):
        src, dst = lay.boxes[e.source], lay.boxes[e.target]
        assert route[0][0] == pytest.approx(src.x + src.w) and route[-1][0] == pytest.approx(dst.x)
        assert route[0][0] < route[-1][0]


def test_html_is_self_contained(bundled: tuple[dict[str, Plan], Scan]) -> None:
    plans, scan = bundled
    page = render.to_html(render.graph_view(plans["route"], scan.models))
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    assert "<script src" not in page and "<link" not in page
    assert not re.search(r"https?://(?!www\.w3\.org/)", page)
    assert "branch big: x gt 100 (any)" in page


@needs_dot
def test_graphviz_accepts_every_bundled_graph(bundled: tuple[dict[str, Plan], Scan]) -> None:
    plans, scan = bundled
    assert {"fanout", "route", "simple", "simple_ensemble"} <= set(plans)
    for name, plan in plans.items():
        svg = render.render(plan, "svg", scan.models).decode()
        root = ET.fromstring(render.svg_element(svg))
        assert root.tag.endswith("svg"), name
        for node in plan.nodes:
            assert f">{node.name}<" in svg, (name, node.name)
        png = render.render(plan, "png", scan.models)
        assert png.startswith(b"\x89PNG\r\n\x1a\n"), name
        html = render.render(plan, "html", scan.models).decode()
        assert "<svg" in html and "<?xml" not in html, name


def test_without_graphviz(bundled: tuple[dict[str, Plan], Scan], monkeypatch: pytest.MonkeyPatch) -> None:
    plans, _ = bundled
    monkeypatch.setattr(render, "dot_binary", lambda: None)  # what render() and the page ask
    monkeypatch.setattr(render.page, "dot_binary", lambda: None)  # what dot_to() runs
    with pytest.raises(render.GraphvizMissing, match="apt-get install graphviz"):
        render.render(plans["fanout"], "png")
    with pytest.raises(render.GraphvizMissing):
        render.render(plans["fanout"], "svg", layout_engine="dot")
    svg = render.render(plans["fanout"], "svg").decode()  # auto: the built-in layout
    assert svg.startswith("<svg") and 'class="fs-graph"' in svg
    assert b'class="fs-graph"' in render.render(plans["fanout"], "html")
    assert render.render(plans["fanout"], "dot").startswith(b"digraph")
    with pytest.raises(Unsupported, match="unknown format"):
        render.render(plans["fanout"], "gif")


Cli = Callable[..., subprocess.CompletedProcess[bytes]]


@pytest.fixture(scope="module")
def run_cli(tmp_path_factory: pytest.TempPathFactory) -> Cli:
    """``flowserve graph render ARGS`` over the bundled graphs and the one model they use (a small
    repository is quick to scan)."""
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(ROOT / "model_repository" / "simple", repo / "simple")

    def run(*args: str) -> subprocess.CompletedProcess[bytes]:
        sources = ["--model-repository", str(repo), "--graphs", str(ROOT / "graphs")]
        return subprocess.run(
            [sys.executable, "-m", "flowserve.cli", "graph", "render", *args, *sources],
            cwd=ROOT,
            capture_output=True,
            timeout=120,
        )

    return run


def test_cli_render_by_name_and_file(run_cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "fanout.dot"
    result = run_cli("fanout", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_text().startswith('digraph "fanout"')
    result = run_cli(str(ROOT / "graphs" / "route.yaml"), "-o", str(tmp_path / "route.mmd"))
    assert result.returncode == 0, result.stderr
    assert "==>" in (tmp_path / "route.mmd").read_text()
    result = run_cli("route", "--format", "mermaid")
    assert result.returncode == 0 and result.stdout.startswith(b"%% route")
    html = tmp_path / "route.html"
    assert run_cli("route", "-o", str(html), "--layout", "builtin").returncode == 0
    assert 'class="fs-graph"' in html.read_text()
    (tmp_path / "tuned.yaml").write_text(SETTINGS_GRAPH)
    result = run_cli(str(tmp_path / "tuned.yaml"))
    assert result.returncode == 0, result.stderr
    assert b"instances: 2 x CPU" in result.stdout


def test_cli_render_errors(run_cli: Cli, tmp_path: Path) -> None:
    result = run_cli("nope", "-o", str(tmp_path / "x.dot"))
    assert result.returncode == 1
    assert b"cannot render 'nope'" in result.stderr and b"fanout" in result.stderr
    result = run_cli("fanout", "-o", str(tmp_path / "x.gif"))
    assert result.returncode == 2 and b"unknown format 'gif'" in result.stderr
    (tmp_path / "bad.yaml").write_text(
        "inputs: {x: {datatype: INT32, dims: [1]}}\noutputs: {y: a.y}\n"
        "nodes: {a: {python: nodes.arith:Scale, inputs: {x: ghost.out}}}\n"
    )
    result = run_cli(str(tmp_path / "bad.yaml"))
    assert result.returncode == 1
    assert b"node 'a': field 'inputs.x': references unknown node 'ghost'" in result.stderr


@needs_dot
def test_cli_render_svg_and_png(run_cli: Cli, tmp_path: Path) -> None:
    for ext, magic in (("svg", b"<?xml"), ("png", b"\x89PNG")):
        out = tmp_path / f"fanout.{ext}"
        result = run_cli("fanout", "-o", str(out))
        assert result.returncode == 0, result.stderr
        assert out.read_bytes().startswith(magic)
