"""The engine: runs requests against what a repository has loaded.

``Engine`` is flowserve's in-process API (the data plane below the front ends uses one too)::

    engine = await Engine.start("model_repository", "graphs")
    outputs = await engine.infer("simple", {"INPUT0": a, "INPUT1": b})
    await engine.stop()

Model management (scan, load, unload, poll, retire) is the repository layer's
(:class:`flowserve.repository.Repository`, ``engine.repository``); the engine adds what a request
needs on top: requested outputs, classification, priorities and timeouts from the request's
parameters. The front ends never hold an engine: they call the data plane
(``dataplane/plane.py``), the one surface of typed queries and operations they and the
observability layer use.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any

from flowserve.core.clock import MONOTONIC, Clock
from flowserve.core.errors import InvalidArgument, SpecIssue, Unsupported
from flowserve.core.node import Context, Span, TensorMap
from flowserve.core.types import InferRequest, InferResponse, RequestedOutput
from flowserve.dataplane.classification import classify, read_labels
from flowserve.graph.plan import Plan
from flowserve.nodes.forward import Forwarded
from flowserve.nodes.ratelimit import RateLimiter
from flowserve.repository.placement import Placement
from flowserve.repository.remote import RemoteRepositories
from flowserve.repository.repository import PathLike, Repository
from flowserve.repository.settings import RepositorySettings
from flowserve.runtime.registry import Registry
from flowserve.runtime.servable import Servable
from flowserve.spec.bounds import LONGEST_REQUEST_TIMEOUT_US
from flowserve.spec.schema import GraphSpec, ModelSpec


class Engine:
    """Requests run against a :class:`Repository`'s servables; model management is delegated to
    it (``load_model``, ``unload_model``, ``poll_once``...), so in-process users need one object.
    """

    def __init__(self, repository: Repository | None = None) -> None:
        """``repository`` None: an empty one (nothing loaded; tests of the front ends use it)."""
        self.repository = repository = repository or Repository()
        self.clock = repository.clock
        self.registry: Registry = repository.registry

    @classmethod
    async def start(
        cls,
        model_repository: PathLike | Sequence[PathLike] | None = None,
        graphs: PathLike | Sequence[PathLike] | None = None,
        settings: RepositorySettings | None = None,
        clock: Clock = MONOTONIC,
        *,
        rate_limiter: RateLimiter | None = None,
        placement: Placement | None = None,
        poll: bool = True,
    ) -> Engine:
        """Open a repository (see :class:`RepositorySettings` for what loads at start) and
        serve it; ``placement`` and ``poll``: see :class:`Repository`."""
        repository = Repository(
            model_repository, graphs, settings, clock, rate_limiter=rate_limiter, placement=placement
        )
        await repository.open(poll)
        return cls(repository)

    # ------------------------------------------------------------ model management

    @property
    def settings(self) -> RepositorySettings:
        return self.repository.settings

    @property
    def live(self) -> bool:
        return self.repository.live

    @property
    def issues(self) -> list[SpecIssue]:
        return self.repository.issues

    @property
    def models(self) -> dict[str, ModelSpec]:
        return self.repository.models

    @property
    def graphs(self) -> dict[str, GraphSpec]:
        return self.repository.graphs

    @property
    def plans(self) -> dict[str, Plan]:
        return self.repository.plans

    @property
    def remote(self) -> RemoteRepositories:
        return self.repository.remote

    @property
    def rate_limiter(self) -> RateLimiter | None:
        return self.repository.rate_limiter

    async def load_model(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        await self.repository.load_model(name, config_json, files)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> list[str]:
        return await self.repository.unload_model(name, unload_dependents)

    async def load_all(self) -> None:
        await self.repository.load_all()

    async def poll_once(self) -> tuple[list[str], list[str]]:
        return await self.repository.poll_once()

    def dependents(self, name: str) -> list[str]:
        return self.repository.dependents(name)

    async def stop(self) -> None:
        await self.repository.stop()

    def ready(self) -> bool:
        return self.repository.ready()

    def model_ready(self, name: str, version: str = "") -> bool:
        return self.repository.model_ready(name, version)

    # ---------------------------------------------------------------- inference

    async def run_forwarded(self, request: Forwarded) -> Any:
        """Run a request another worker forwarded (this process owns its model): one output
        map, or every response of a decoupled model's stream."""
        servable = self.registry.get(request.model, request.version)
        ctx = Context(
            request_id=request.request_id,
            parameters=request.parameters,
            priority=request.priority,
            peer=request.peer,
        )
        if request.timeout_ns is not None:
            ctx.deadline_ns = self.clock.now_ns() + request.timeout_ns
        if request.stream:
            return [outputs async for outputs in servable.stream(request.inputs, ctx)]
        return await servable.infer(request.inputs, ctx)

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

    async def infer_request(self, request: InferRequest, trace: list[Span] | None = None) -> InferResponse:
        """Run a transport-neutral request: requested outputs and classification applied.
        ``trace``, when given, receives a span for every node the request passes."""
        servable = self.registry.get(request.model, request.version)
        if servable.decoupled:
            raise Unsupported(
                f"model '{servable.name}' is decoupled: use the streaming API (ModelStreamInfer "
                "or generate_stream)"
            )
        wanted = self._check_requested(servable, request)
        ctx = self._context(request.id, request.parameters)
        ctx.trace = trace
        ctx.peer = request.peer
        outputs = await servable.infer(request.inputs, ctx, keep=request.keep_device)
        return self._response(servable, request, outputs, wanted)

    async def stream_request(
        self, request: InferRequest, trace: list[Span] | None = None
    ) -> AsyncGenerator[InferResponse, None]:
        """Every response to one request, in order: several for a decoupled model or graph,
        exactly one otherwise. Requested outputs and classification apply to each."""
        servable = self.registry.get(request.model, request.version)
        wanted = self._check_requested(servable, request)
        ctx = self._context(request.id, request.parameters)
        ctx.trace = trace
        ctx.peer = request.peer
        async for outputs in servable.stream(request.inputs, ctx):
            yield self._response(servable, request, outputs, wanted)

    def _check_requested(self, servable: Servable, request: InferRequest) -> list[RequestedOutput] | None:
        wanted = request.outputs
        if wanted:
            known = servable.output_names
            for out in wanted:
                if out.name not in known:
                    raise InvalidArgument(
                        f"unexpected inference output '{out.name}' for model '{servable.name}'"
                    )
        return wanted

    def _response(
        self,
        servable: Servable,
        request: InferRequest,
        outputs: TensorMap,
        wanted: list[RequestedOutput] | None,
    ) -> InferResponse:
        if wanted:
            outputs = {
                o.name: self._shape_output(servable, o.name, outputs[o.name], o.class_count)
                for o in wanted
                if o.name in outputs
            }
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
                ctx.deadline_ns = self.clock.now_ns() + min(timeout, LONGEST_REQUEST_TIMEOUT_US) * 1000
        return ctx
