"""What is analyzed (a YAML graph or a repository model), its tunable space, its shipped
configuration, and a candidate as the files or config override that apply it.

The user's files are only read here; candidates are written into the analysis's own work
folder, and only :func:`write_chosen` (``--write``) writes beside the original, to a new file
``<original>.analyzed``. (YAML and protobuf text are written here, a tool outside the server's
layers; the server's own reading of them stays in ``flowserve/spec``.)"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from flowserve.analyze.space import Candidate, NodeConfig, NodeSpace, Space
from flowserve.spec.graph_yaml import load_graph_file

PYTHON_BATCH_LIMIT = 64  # the largest batch tried in front of a python node


class TargetError(ValueError):
    """The target cannot be analyzed (names it and says why)."""


@dataclass(slots=True)
class Target:
    name: str
    kind: str  # "graph" or "model"
    repositories: list[Path]
    graph_file: Path | None = None  # kind "graph": the user's YAML file
    document: dict[str, Any] | None = None  # its parsed content
    model_dir: Path | None = None  # kind "model"
    config: dict[str, Any] | None = None  # kind "model": the served config (JSON), read at start

    @property
    def original(self) -> Path:
        if self.graph_file is not None:
            return self.graph_file
        assert self.model_dir is not None
        return self.model_dir / "config.pbtxt"


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
        return _graph_target(path, repositories)
    if path.is_dir() and (path / "config.pbtxt").is_file():
        return Target(
            path.resolve().name, "model", [*repositories, path.resolve().parent], model_dir=path.resolve()
        )
    for folder in graph_dirs:
        files = [folder] if folder.is_file() else sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")])
        for file in files:
            if _graph_name(file) == what:
                return _graph_target(file, repositories)
    for repository in repositories:
        if (repository / what).is_dir():
            return Target(what, "model", repositories, model_dir=(repository / what).resolve())
    where = (
        ", ".join(str(p) for p in [*graph_dirs, *repositories])
        or "nothing (give --model-repository or --graphs)"
    )
    raise TargetError(f"'{what}': no graph file, model directory or graph or model of that name in {where}")


def _graph_target(path: Path, repositories: list[Path]) -> Target:
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise TargetError(f"{path}: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("nodes"), dict):
        raise TargetError(f"{path}: not a graph (no 'nodes' mapping)")
    name = str(document.get("name") or path.stem)
    return Target(name, "graph", repositories, graph_file=path.resolve(), document=document)


def space_of(
    target: Target, model_configs: dict[str, dict[str, Any]], max_instances: int, max_workers: int
) -> tuple[Space, Candidate]:
    """The tunable space and the shipped configuration. ``model_configs``: the served config of
    every model the graph's model nodes call (their batch limit), or of the model itself."""
    if target.kind == "model":
        config = target.config or {}
        limit = int(config.get("max_batch_size") or 0)
        count = sum(int(g.get("count", 1)) for g in config.get("instance_group") or []) or 1
        dynamic = config.get("dynamic_batching")
        start = NodeConfig(
            instances=count,
            max_batch_size=limit if dynamic is not None and limit else 0,
            preferred=tuple(int(s) for s in (dynamic or {}).get("preferred_batch_size", [])),
            delay_us=int((dynamic or {}).get("max_queue_delay_microseconds", 0) or 0),
        )
        only = NodeSpace(target.name, "model", limit, max(max_instances, count))
        return Space((only,), max_workers), Candidate(1, ((target.name, start),))
    assert target.graph_file is not None
    try:
        graph = load_graph_file(target.graph_file)
    except Exception as exc:
        raise TargetError(f"{target.graph_file}: {exc}") from None
    nodes: list[NodeSpace] = []
    configs: list[tuple[str, NodeConfig]] = []
    for node in graph.nodes.values():
        if node.kind == "python":
            limit = PYTHON_BATCH_LIMIT if graph.max_batch_size > 0 else 0
            space = NodeSpace(node.name, "python", limit, max(max_instances, node.instances.count))
        elif node.kind == "model":
            limit = int((model_configs.get(node.target) or {}).get("max_batch_size") or 0)
            space = NodeSpace(node.name, "model", limit, 1)  # instances are the model's own
        else:
            continue
        batching = node.batching
        nodes.append(space)
        configs.append(
            (
                node.name,
                NodeConfig(
                    instances=node.instances.count,
                    max_batch_size=batching.max_batch_size if batching else 0,
                    preferred=tuple(batching.preferred_batch_size) if batching else (),
                    delay_us=batching.max_queue_delay_us if batching else 0,
                ),
            )
        )
    return Space(tuple(nodes), max_workers), Candidate(1, tuple(configs))


def graph_document(target: Target, candidate: Candidate) -> dict[str, Any]:
    """The user's graph with the candidate's node settings (every other key as it was)."""
    assert target.document is not None
    document = copy.deepcopy(target.document)
    for name, config in candidate.nodes:
        raw = document["nodes"][name]
        if config.instances != 1 or "instances" in raw:
            raw["instances"] = {**(raw.get("instances") or {}), "count": config.instances}
        if config.max_batch_size:
            batching = dict(raw.get("batching") or {})
            batching["max_batch_size"] = config.max_batch_size
            batching["max_queue_delay_us"] = config.delay_us
            if config.preferred:
                batching["preferred_batch_size"] = list(config.preferred)
            else:
                batching.pop("preferred_batch_size", None)
            raw["batching"] = batching
        else:
            raw.pop("batching", None)
    return document


def model_config(target: Target, candidate: Candidate) -> dict[str, Any]:
    """The served model config (JSON) with the candidate's settings."""
    config = copy.deepcopy(target.config or {})
    node = candidate.node(target.name)
    groups = config.get("instance_group") or [{"kind": "KIND_CPU"}]
    groups = [dict(groups[0], count=node.instances)]
    config["instance_group"] = groups
    if node.max_batch_size:
        config["max_batch_size"] = node.max_batch_size
        dynamic = dict(config.get("dynamic_batching") or {})
        dynamic["max_queue_delay_microseconds"] = str(node.delay_us)
        dynamic["preferred_batch_size"] = list(node.preferred)
        config["dynamic_batching"] = dynamic
    else:
        config.pop("dynamic_batching", None)
    return config


def graph_text(document: dict[str, Any]) -> str:
    return str(yaml.safe_dump(document, sort_keys=False, default_flow_style=None))


def config_text(config: dict[str, Any]) -> str:
    from google.protobuf import text_format

    from flowserve.spec.triton import parse_config_json

    return str(text_format.MessageToString(parse_config_json(json.dumps(config))))


def write_chosen(target: Target, candidate: Candidate, header: str) -> Path:
    """``--write``: the chosen configuration beside the original, as ``<original>.analyzed``."""
    out = target.original.with_name(target.original.name + ".analyzed")
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    if target.kind == "graph":
        out.write_text(comment + graph_text(graph_document(target, candidate)))
    else:
        out.write_text(comment + config_text(model_config(target, candidate)))
    return out


__all__ = [
    "Target",
    "TargetError",
    "config_text",
    "graph_document",
    "graph_text",
    "model_config",
    "resolve",
    "space_of",
    "write_chosen",
]
