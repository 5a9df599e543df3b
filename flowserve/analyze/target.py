"""What is analyzed (a YAML graph, with the graphs it uses; a repository model or ensemble), its
tunable space, its shipped configuration, and a candidate as the files or config overrides that
apply it.

The names the search tunes: a node of the target graph by its name (``join``), a node of a graph
it uses (a ``graph:`` node's or a split arm's) as ``GRAPH/NODE``, a repository model that a
``model:`` node or an ensemble step calls as ``model:NAME`` (its instance count and dynamic
batching, applied as a config override), a model target by its own name.

The user's files are only read here; candidates are written into the analysis's own work
folder, and only :func:`write_chosen` (``--write``) writes beside the originals, to new files
``<original>.analyzed`` that keep the originals' comments and layout (textedit.py). (YAML and
protobuf text are written here, a tool outside the server's layers; the server's own reading of
them stays in ``flowserve/spec``.)"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from flowserve.analyze.space import Candidate, NodeConfig, NodeSpace, Space
from flowserve.analyze.textedit import (
    DELETE,
    TextEditError,
    YamlEdit,
    parse_pbtxt,
    pb_add,
    pb_remove,
    pb_set,
    yaml_edit,
)
from flowserve.repository.placement import shared_group
from flowserve.spec.graph_yaml import load_graph_file
from flowserve.spec.repository import graph_files
from flowserve.spec.schema import GraphSpec, NodeSpec

PYTHON_BATCH_LIMIT = 64  # the largest batch tried in front of a python node
MODEL = "model:"  # the search's name of a repository model: model:NAME


class TargetError(ValueError):
    """The target cannot be analyzed (names it and says why)."""


@dataclass(slots=True)
class GraphFile:
    """One YAML graph as the user wrote it."""

    name: str
    path: Path
    text: str
    document: dict[str, Any]
    spec: GraphSpec


@dataclass(slots=True)
class Target:
    name: str
    kind: str  # "graph" or "model"
    repositories: list[Path]
    graph_file: Path | None = None  # kind "graph": the user's YAML file
    document: dict[str, Any] | None = None  # its parsed content
    model_dir: Path | None = None  # kind "model"
    config: dict[str, Any] | None = None  # kind "model": the served config (JSON), read at start
    # kind "graph": the target graph first, then every graph it uses (graph: nodes, split arms
    # and shadows), transitively, by name
    graphs: dict[str, GraphFile] = field(default_factory=dict)
    models: list[str] = field(default_factory=list)  # the models those graphs call, as met
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)  # served configs, read at start

    @property
    def original(self) -> Path:
        if self.graph_file is not None:
            return self.graph_file
        assert self.model_dir is not None
        return self.model_dir / "config.pbtxt"

    def model_dir_of(self, model: str) -> Path | None:
        if model == self.name and self.model_dir is not None:
            return self.model_dir
        return next((r / model for r in self.repositories if (r / model).is_dir()), None)


def _graph_name(path: Path) -> str:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return ""
    return str(doc.get("name") or path.stem) if isinstance(doc, dict) else ""


def resolve(what: str, repositories: list[Path], graph_dirs: list[Path]) -> Target:
    """``what``: a graph file, a model directory, or the name of a graph (in ``graph_dirs``) or
    model (in ``repositories``)."""
    path = Path(what)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return _graph_target(path, repositories, graph_dirs)
    if path.is_dir() and (path / "config.pbtxt").is_file():
        return Target(
            path.resolve().name, "model", [*repositories, path.resolve().parent], model_dir=path.resolve()
        )
    for folder in graph_dirs:
        for file in graph_files(folder) if folder.exists() else []:
            if _graph_name(file) == what:
                return _graph_target(file, repositories, graph_dirs)
    for repository in repositories:
        if (repository / what).is_dir():
            return Target(what, "model", repositories, model_dir=(repository / what).resolve())
    where = (
        ", ".join(str(p) for p in [*graph_dirs, *repositories])
        or "nothing (give --model-repository or --graphs)"
    )
    raise TargetError(f"'{what}': no graph file, model directory or graph or model of that name in {where}")


def _read_graph(path: Path) -> GraphFile:
    try:
        text = path.read_text()
        document = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as exc:
        raise TargetError(f"{path}: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("nodes"), dict):
        raise TargetError(f"{path}: not a graph (no 'nodes' mapping)")
    try:
        spec = load_graph_file(path)
    except Exception as exc:
        raise TargetError(f"{path}: {exc}") from None
    return GraphFile(spec.name, path.resolve(), text, document, spec)


def _calls(node: NodeSpec) -> list[tuple[str, str]]:
    """What a node calls: ("model" | "graph", name) pairs."""
    if node.kind in ("model", "graph"):
        return [(node.kind, node.target)]
    if node.split is not None:
        targets = [a.target for a in node.split.arms]
        if node.split.shadow is not None:
            targets.append(node.split.shadow.target)
        return [(t.kind, t.target) for t in targets]
    return []


def _graph_target(path: Path, repositories: list[Path], graph_dirs: list[Path]) -> Target:
    first = _read_graph(path)
    folders = list(dict.fromkeys([first.path.parent, *(d.resolve() for d in graph_dirs)]))
    index: dict[str, Path] = {}
    for folder in folders:
        for file in graph_files(folder) if folder.exists() else []:
            index.setdefault(_graph_name(file), file)
    graphs = {first.name: first}
    models: list[str] = []
    queue = [first]
    while queue:
        graph = queue.pop(0)
        for node in graph.spec.nodes.values():
            for kind, name in _calls(node):
                is_model = any((r / name).is_dir() for r in repositories)
                if kind == "model" and (is_model or name not in index):
                    models += [] if name in models else [name]
                    continue
                if name in graphs:
                    continue
                if name not in index:
                    if is_model:
                        models += [] if name in models else [name]
                        continue
                    where = ", ".join(str(f) for f in folders)
                    raise TargetError(
                        f"{graph.path}: node '{node.name}' uses graph '{name}', found in none of {where}"
                    )
                graphs[name] = _read_graph(index[name])
                queue.append(graphs[name])
    return Target(
        first.name,
        "graph",
        repositories,
        graph_file=first.path,
        document=first.document,
        graphs=graphs,
        models=models,
    )


# ------------------------------------------------------------------------------ names and models


def locate(target: Target, unit: str) -> tuple[str, str]:
    """Where a tuned name lives: ("", MODEL) for a repository model, (GRAPH, NODE) for a node."""
    if target.kind == "model":
        return "", target.name if unit == target.name else unit.removeprefix(MODEL)
    if unit in target.graphs[target.name].document["nodes"]:
        return target.name, unit
    if unit.startswith(MODEL):
        return "", unit[len(MODEL) :]
    graph, _, node = unit.partition("/")
    return graph, node


def served_configs(
    names: list[str], fetch: Callable[[str], dict[str, Any] | None]
) -> dict[str, dict[str, Any]]:
    """The served configs of ``names`` and of the steps of every ensemble among them,
    transitively (``fetch`` returns None for a model it cannot read)."""
    out: dict[str, dict[str, Any]] = {}
    queue = list(names)
    while queue:
        name = queue.pop(0)
        if name in out:
            continue
        config = fetch(name)
        if config is None:
            continue
        out[name] = config
        queue += _steps(config)
    return out


def _steps(config: dict[str, Any]) -> list[str]:
    if config.get("platform") != "ensemble":
        return []
    steps = (config.get("ensemble_scheduling") or {}).get("step") or []
    return list(dict.fromkeys(str(s.get("model_name")) for s in steps if s.get("model_name")))


def tuned_models(names: list[str], configs: dict[str, dict[str, Any]]) -> list[str]:
    """The models whose own settings are tuned: ``names``, an ensemble standing for its steps
    (transitively); a model whose config was not read is left out."""
    out: list[str] = []
    seen: set[str] = set()
    queue = list(names)
    while queue:
        name = queue.pop(0)
        if name in seen or name not in configs:
            continue
        seen.add(name)
        steps = _steps(configs[name])
        if configs[name].get("platform") == "ensemble":
            queue = steps + queue
        else:
            out.append(name)
    return out


def _count(config: dict[str, Any]) -> int:
    return sum(int(g.get("count", 1)) for g in config.get("instance_group") or []) or 1


def model_start(config: dict[str, Any]) -> NodeConfig:
    """A served model config's settings, as the search names them."""
    limit = int(config.get("max_batch_size") or 0)
    dynamic = config.get("dynamic_batching")
    return NodeConfig(
        instances=_count(config),
        max_batch_size=limit if dynamic is not None and limit else 0,
        preferred=tuple(int(s) for s in (dynamic or {}).get("preferred_batch_size", [])),
        delay_us=int((dynamic or {}).get("max_queue_delay_microseconds", 0) or 0),
    )


def _model_space(name: str, config: dict[str, Any], max_instances: int) -> NodeSpace:
    limit = int(config.get("max_batch_size") or 0)
    first = (config.get("instance_group") or [{}])[0]
    # the override gives the model one group of the first group's kind
    shared = shared_group(str(config.get("backend", "")), str(first.get("kind", "KIND_CPU")))
    return NodeSpace(name, "model", limit, max(max_instances, _count(config)), shared)


def space_of(
    target: Target, model_configs: dict[str, dict[str, Any]], max_instances: int, max_workers: int
) -> tuple[Space, Candidate]:
    """The tunable space and the shipped configuration. ``model_configs``: the served config of
    every model the graphs call (and of the steps of the ensembles among them), or of the model
    target (and its steps); kept on the target for the overrides that apply a candidate."""
    target.configs = {**target.configs, **model_configs}
    configs = target.configs
    nodes: list[NodeSpace] = []
    starts: list[tuple[str, NodeConfig]] = []
    if target.kind == "model":
        config = target.config or configs.get(target.name) or {}
        configs.setdefault(target.name, config)
        if config.get("platform") != "ensemble":
            only = _model_space(target.name, config, max_instances)
            return Space((only,), max_workers), Candidate(1, ((target.name, model_start(config)),))
        models = tuned_models(_steps(config), configs)
    else:
        for graph in target.graphs.values():
            for node in graph.spec.nodes.values():
                name = node.name if graph.name == target.name else f"{graph.name}/{node.name}"
                if node.kind == "python":
                    limit = PYTHON_BATCH_LIMIT if graph.spec.max_batch_size > 0 else 0
                    space = NodeSpace(name, "python", limit, max(max_instances, node.instances.count))
                elif node.kind == "model":
                    limit = int((configs.get(node.target) or {}).get("max_batch_size") or 0)
                    space = NodeSpace(name, "model node", limit, 1)  # instances: the model's own
                else:
                    continue  # sub-graph, switch, split, remote: no knobs of their own
                batching = node.batching
                nodes.append(space)
                starts.append(
                    (
                        name,
                        NodeConfig(
                            instances=node.instances.count,
                            max_batch_size=batching.max_batch_size if batching else 0,
                            preferred=tuple(batching.preferred_batch_size) if batching else (),
                            delay_us=batching.max_queue_delay_us if batching else 0,
                        ),
                    )
                )
        models = tuned_models(target.models, configs)
    for model in models:
        nodes.append(_model_space(MODEL + model, configs[model], max_instances))
        starts.append((MODEL + model, model_start(configs[model])))
    return Space(tuple(nodes), max_workers), Candidate(1, tuple(starts))


# ------------------------------------------------------------------------------ graph files


def _get(document: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(document, dict) or key not in document:
            return DELETE
        document = document[key]
    return document


def _set(document: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        inner = document.get(key)
        if not isinstance(inner, dict):
            if value is DELETE:
                return
            inner = document[key] = {}
        document = inner
    if value is DELETE:
        document.pop(path[-1], None)
    else:
        document[path[-1]] = value


def node_edits(raw: dict[str, Any], config: NodeConfig) -> list[YamlEdit]:
    """The changes (paths within the node) that give a node ``config``; only what differs."""
    edits: list[YamlEdit] = []
    if config.instances != 1 or "instances" in raw:
        edits.append((("instances", "count"), config.instances))
    if config.max_batch_size:
        edits.append((("batching", "max_batch_size"), config.max_batch_size))
        edits.append((("batching", "max_queue_delay_us"), config.delay_us))
        edits.append((("batching", "preferred_batch_size"), list(config.preferred) or DELETE))
    else:
        edits.append((("batching",), DELETE))
    return [(path, value) for path, value in edits if _get(raw, path) != value]


def graph_edits(target: Target, graph: str, candidate: Candidate) -> list[YamlEdit]:
    """The changes to graph file ``graph`` that give the candidate's nodes of it."""
    document = target.graphs[graph].document
    edits: list[YamlEdit] = []
    for unit, config in candidate.nodes:
        where, node = locate(target, unit)
        if where == graph:
            edits += [(("nodes", node, *path), v) for path, v in node_edits(document["nodes"][node], config)]
    return edits


def graph_document(target: Target, candidate: Candidate, graph: str = "") -> dict[str, Any]:
    """A graph (default: the target) with the candidate's node settings (every other key as it was)."""
    graph = graph or target.name
    document = copy.deepcopy(target.graphs[graph].document)
    for path, value in graph_edits(target, graph, candidate):
        _set(document, path, value)
    return document


def dump_graph(document: dict[str, Any]) -> str:
    return str(yaml.safe_dump(document, sort_keys=False, default_flow_style=None))


def graph_text(target: Target, candidate: Candidate, graph: str = "") -> tuple[str, str]:
    """The graph file's text with the candidate's settings, and "" (edited in place, comments
    and layout kept) or why it was written in full instead."""
    graph = graph or target.name
    original = target.graphs[graph]
    edits = graph_edits(target, graph, candidate)
    if not edits:
        return original.text, ""
    wanted = graph_document(target, candidate, graph)
    try:
        text = yaml_edit(original.text, edits)
        if yaml.safe_load(text) == wanted:
            return text, ""
        problem = "an in-place edit read back differently"
    except TextEditError as exc:
        problem = str(exc)
    return dump_graph(wanted), f"written in full, the original's comments are lost: {problem}"


# ------------------------------------------------------------------------------ model configs


def model_override(config: dict[str, Any], node: NodeConfig) -> dict[str, Any]:
    """A served model config (JSON) with ``node``'s settings (the load API's override)."""
    config = copy.deepcopy(config)
    groups = config.get("instance_group") or [{"kind": "KIND_CPU"}]
    config["instance_group"] = [dict(groups[0], count=node.instances)]
    if node.max_batch_size:
        config["max_batch_size"] = node.max_batch_size
        dynamic = dict(config.get("dynamic_batching") or {})
        dynamic["max_queue_delay_microseconds"] = str(node.delay_us)
        dynamic["preferred_batch_size"] = list(node.preferred)
        config["dynamic_batching"] = dynamic
    else:
        config.pop("dynamic_batching", None)
    return config


def model_config(target: Target, candidate: Candidate) -> dict[str, Any]:
    """The model target's served config (JSON) with the candidate's settings."""
    return model_override(target.config or {}, candidate.node(target.name))


def config_text(config: dict[str, Any]) -> str:
    from google.protobuf import text_format

    from flowserve.spec.triton import parse_config_json

    return str(text_format.MessageToString(parse_config_json(json.dumps(config))))


def _groups(text: str) -> list[Any]:
    top = parse_pbtxt(text)
    out = []
    for f in top.named("instance_group"):
        out += [f.message] if f.message is not None else f.items
    return out


def _dynamic(text: str) -> Any:
    present = parse_pbtxt(text).named("dynamic_batching")
    if present and present[0].message is None:
        raise TextEditError("dynamic_batching is not a message")
    return present[0].message if present else None


def pbtxt_edit(text: str, node: NodeConfig, served_count: int) -> str:
    """config.pbtxt text with ``node``'s settings, edited in place (comments kept)."""
    if node.max_batch_size:
        text = pb_set(text, parse_pbtxt(text), "max_batch_size", str(node.max_batch_size))
    groups = _groups(text)
    if len(groups) == 1:
        text = pb_set(text, groups[0], "count", str(node.instances))
    elif not groups and node.instances != served_count:
        text = pb_add(text, parse_pbtxt(text), f"instance_group [ {{ count: {node.instances} }} ]")
    elif groups and node.instances != served_count:
        raise TextEditError("several instance groups")
    dynamic = _dynamic(text)
    if not node.max_batch_size:
        for f in reversed(parse_pbtxt(text).named("dynamic_batching")):
            text = pb_remove(text, f)
        return text
    preferred = f"preferred_batch_size: [ {', '.join(map(str, node.preferred))} ]"
    if dynamic is None:
        parts = [f"max_queue_delay_microseconds: {node.delay_us}", *([preferred] if node.preferred else [])]
        return pb_add(text, parse_pbtxt(text), "dynamic_batching { " + " ".join(parts) + " }")
    text = pb_set(text, dynamic, "max_queue_delay_microseconds", str(node.delay_us))
    for f in reversed(_dynamic(text).named("preferred_batch_size")):
        text = pb_remove(text, f)
    if node.preferred:
        text = pb_add(text, _dynamic(text), preferred)
    return text


def _expected(original: str, node: NodeConfig, served_count: int) -> Any:
    """What :func:`pbtxt_edit` must mean, built on the parsed original."""
    from flowserve.spec.triton import parse_config_text

    config: Any = parse_config_text(original)
    if node.max_batch_size:
        config.max_batch_size = node.max_batch_size
        config.dynamic_batching.max_queue_delay_microseconds = node.delay_us
        del config.dynamic_batching.preferred_batch_size[:]
        config.dynamic_batching.preferred_batch_size.extend(node.preferred)
    else:
        config.ClearField("dynamic_batching")
    if len(config.instance_group) == 1:
        config.instance_group[0].count = node.instances
    elif not config.instance_group and node.instances != served_count:
        config.instance_group.add(count=node.instances)
    return config


def model_file_text(model_dir: Path, config: dict[str, Any], node: NodeConfig) -> tuple[str, str]:
    """A model's config.pbtxt with ``node``'s settings, and "" (edited in place) or why it was
    written in full from the served config instead."""
    from flowserve.core.errors import InvalidArgument
    from flowserve.spec.triton import parse_config_text

    full = config_text(model_override(config, node))
    file = model_dir / "config.pbtxt"
    if not file.is_file():
        return full, "written in full from the served config (no config.pbtxt to edit)"
    original = file.read_text()
    try:
        text = pbtxt_edit(original, node, _count(config))
        if parse_config_text(text) == _expected(original, node, _count(config)):
            return text, ""
        problem = "an in-place edit read back differently"
    except (TextEditError, InvalidArgument) as exc:
        problem = str(exc)
    return full, f"written in full from the served config, the original's comments are lost: {problem}"


# ------------------------------------------------------------------------------ --write


def _comment(lines: str) -> str:
    return "".join(f"# {line}\n" for line in lines.splitlines())


def write_chosen(target: Target, candidate: Candidate, header: str) -> list[Path]:
    """``--write``: the chosen configuration beside the originals, as ``<original>.analyzed``:
    the target's file, and every other graph file or model config the choice changes."""
    written: list[Path] = []
    for graph in target.graphs.values():
        text, problem = graph_text(target, candidate, graph.name)
        if graph.name == target.name or text != graph.text:
            out = graph.path.with_name(graph.path.name + ".analyzed")
            out.write_text(_comment("\n".join(filter(None, [header, problem]))) + text)
            written.append(out)
    for unit, node in candidate.nodes:
        where, model = locate(target, unit)
        config = target.config if model == target.name and target.config else target.configs.get(model)
        if where or config is None:
            continue
        if model != target.name and node == model_start(config):
            continue
        model_dir = target.model_dir_of(model)
        if model_dir is None:
            continue
        text, problem = model_file_text(model_dir, config, node)
        out = model_dir / "config.pbtxt.analyzed"
        out.write_text(_comment("\n".join(filter(None, [header, problem]))) + text)
        written.append(out)
    return written


__all__ = [
    "MODEL",
    "GraphFile",
    "Target",
    "TargetError",
    "config_text",
    "dump_graph",
    "graph_document",
    "graph_edits",
    "graph_text",
    "locate",
    "model_config",
    "model_file_text",
    "model_override",
    "model_start",
    "node_edits",
    "pbtxt_edit",
    "resolve",
    "served_configs",
    "space_of",
    "tuned_models",
    "write_chosen",
]
