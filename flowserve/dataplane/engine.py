"""The engine: loads repositories and graphs, runs requests, reports state and statistics.

It is the one entry point of both front ends and of in-process use::

    engine = await Engine.start("model_repository", "graphs")
    outputs = await engine.infer("simple", {"INPUT0": a, "INPUT1": b})
    await engine.stop()
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from flowserve.core.clock import MONOTONIC, Clock
from flowserve.core.errors import (
    FlowserveError,
    InvalidArgument,
    SpecIssue,
    Unsupported,
)
from flowserve.core.node import Context, Node, TensorMap
from flowserve.core.types import InferRequest, InferResponse
from flowserve.dataplane.classification import classify, read_labels
from flowserve.graph.plan import Plan
from flowserve.nodes.factory import build_nodes, compile_all
from flowserve.runtime.executor import Executor
from flowserve.runtime.registry import Registry, State
from flowserve.runtime.servable import Servable
from flowserve.runtime.stats import ModelStats
from flowserve.spec.repository import Scan, scan_graphs, scan_repository
from flowserve.spec.schema import GraphSpec, ModelSpec
from flowserve.spec.triton import config_from_graph

log = logging.getLogger("flowserve")

PathLike = str | Path


def _paths(value: PathLike | Sequence[PathLike] | None) -> list[Path]:
    if value is None:
        return []
    if isinstance(value, str | Path):
        return [Path(value)]
    return [Path(v) for v in value]


def scan_all(repositories: Iterable[Path], graph_dirs: Iterable[Path]) -> Scan:
    scan = Scan()
    for repo in repositories:
        scan.merge(scan_repository(repo))
    for gdir in graph_dirs:
        scan.merge(scan_graphs(gdir))
    return scan


def add_import_roots(graph_dirs: Iterable[Path]) -> None:
    """Make ``nodes.x:Class`` importable: the folder holding a graphs folder is where its
    ``nodes/`` lives (the repository layout), and the working directory is too."""
    roots = [Path.cwd(), *(p.resolve().parent for p in graph_dirs)]
    for root in roots:
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))


class Engine:
    def __init__(
        self,
        model_repository: PathLike | Sequence[PathLike] | None = None,
        graphs: PathLike | Sequence[PathLike] | None = None,
        clock: Clock = MONOTONIC,
    ) -> None:
        self.repositories = _paths(model_repository)
        self.graph_dirs = _paths(graphs)
        self.clock = clock
        self.registry = Registry()
        self.issues: list[SpecIssue] = []
        self.models: dict[str, ModelSpec] = {}
        self.graphs: dict[str, GraphSpec] = {}
        self.plans: dict[str, Plan] = {}
        self.live = True

    @classmethod
    async def start(
        cls,
        model_repository: PathLike | Sequence[PathLike] | None = None,
        graphs: PathLike | Sequence[PathLike] | None = None,
        clock: Clock = MONOTONIC,
    ) -> Engine:
        """Load everything in the repositories and graph folders; failures are logged and
        reported by ``index()``, never fatal for the others."""
        engine = cls(model_repository, graphs, clock)
        await engine.load_all()
        return engine

    # ---------------------------------------------------------------- loading

    async def load_all(self) -> None:
        add_import_roots(self.graph_dirs)
        scan = scan_all(self.repositories, self.graph_dirs)
        compiled = compile_all(scan)
        self.issues = compiled.issues
        self.models.update(scan.models)
        self.graphs.update(scan.graphs)
        for issue in compiled.issues:
            log.error("%s", issue)
        for name, reason in compiled.failed.items():
            self.registry.mark(name, "", State.UNAVAILABLE, reason)
        for name in compiled.order:
            await self._load(name, compiled.plans[name])

    async def _load(self, name: str, plan: Plan) -> None:
        model = self.models.get(name)
        graph = self.graphs.get(name) if model is None else None
        self.plans[name] = plan
        if model is not None:
            versions = list(model.versions)
            config = model.config
            kind = "model" if model.graph is None else "ensemble"
        else:
            assert graph is not None
            versions = [1]
            config = config_from_graph(graph, [o.tensor for o in plan.outputs])
            kind = "graph"
        for version in versions:
            self.registry.mark(name, str(version), State.LOADING)
            stats = ModelStats()
            started: list[Node] = []
            try:
                nodes = build_nodes(plan, self.registry, model, version, stats, self.clock)
                for node in nodes:
                    try:
                        await node.start()
                    except Exception as exc:
                        raise FlowserveError(f"node '{node.name}' failed to start: {_text(exc)}") from exc
                    started.append(node)
            except Exception as exc:
                for node in started:
                    await node.stop()
                reason = _text(exc)
                log.error("failed to load '%s' version %s: %s", name, version, reason)
                self.registry.mark(name, str(version), State.UNAVAILABLE, reason)
                continue
            self.registry.add(Servable(
                name=name, version=version, kind=kind, plan=plan,
                executor=Executor(plan, nodes, self.clock),
                spec=model if model is not None else graph,  # type: ignore[arg-type]
                config=config, clock=self.clock, stats=stats,
                decoupled=bool(model.decoupled) if model is not None else False,
            ))
            log.info("loaded %s '%s' version %s", kind, name, version)

    async def stop(self) -> None:
        self.live = False
        for servable in self.registry.servables():
            await servable.stop()
            self.registry.remove(servable.name)

    # ---------------------------------------------------------------- inference

    async def infer(
        self,
        name: str,
        inputs: TensorMap,
        *,
        version: str = "",
        parameters: dict[str, Any] | None = None,
        request_id: str = "",
    ) -> TensorMap:
        """Run one request; returns every output the graph produced."""
        servable = self.registry.get(name, version)
        return await servable.infer(inputs, self._context(request_id, parameters or {}))

    async def infer_request(self, request: InferRequest) -> InferResponse:
        """Run a transport-neutral request: requested outputs and classification applied."""
        servable = self.registry.get(request.model, request.version)
        if servable.decoupled:
            raise Unsupported(
                f"model '{servable.name}' is decoupled: use the streaming API (ModelStreamInfer "
                "or generate_stream)"
            )
        wanted = request.outputs
        if wanted:
            known = {o.name: o for o in servable.plan.outputs}
            for out in wanted:
                if out.name not in known:
                    raise InvalidArgument(
                        f"unexpected inference output '{out.name}' for model '{servable.name}'"
                    )
        outputs = await servable.infer(request.inputs, self._context(request.id, request.parameters))
        if wanted:
            outputs = {o.name: self._shape_output(servable, o.name, outputs[o.name], o.class_count)
                       for o in wanted if o.name in outputs}
        return InferResponse(
            model=servable.name, version=str(servable.version), outputs=outputs, id=request.id
        )

    def _shape_output(self, servable: Servable, name: str, array: Any, class_count: int) -> Any:
        if class_count <= 0:
            return array
        labels: tuple[str, ...] = ()
        model = servable.spec if isinstance(servable.spec, ModelSpec) else None
        if model is not None:
            spec = next((t for t in model.outputs if t.name == name), None)
            if spec is not None and spec.label_filename:
                model_dir = Path(model.versions[servable.version]).parent
                labels = read_labels(str(model_dir / spec.label_filename))
        return classify(array, class_count, servable.plan.max_batch_size > 0, labels, name)

    def _context(self, request_id: str, parameters: dict[str, Any]) -> Context:
        ctx = Context(request_id=request_id, parameters=parameters)
        if parameters:
            priority = parameters.get("priority")
            if isinstance(priority, int):
                ctx.priority = priority
            timeout = parameters.get("timeout")
            if isinstance(timeout, int) and timeout > 0:
                ctx.deadline_ns = self.clock.now_ns() + timeout * 1000
        return ctx

    # ---------------------------------------------------------------- state

    def ready(self) -> bool:
        return self.live

    def model_ready(self, name: str, version: str = "") -> bool:
        return self.registry.ready(name, version)


def _text(exc: BaseException) -> str:
    if isinstance(exc, FlowserveError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"
