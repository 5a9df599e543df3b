"""The repository layer: what is served, and its life cycle.

A :class:`Repository` scans model repositories (local, or mirrored from object storage by
``repository/remote.py``) and graph folders, compiles them (``nodes/factory.py``), builds and
starts their node objects, and keeps the :class:`~flowserve.runtime.registry.Registry` of loaded
servables: load and unload (with config overrides), poll mode, and retiring replaced versions
once their in-flight requests are done. It runs no request itself; the data plane above it
(``dataplane/``) does, through the servables it finds here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path

from flowserve.core.clock import MONOTONIC, Clock
from flowserve.core.errors import (
    FlowserveError,
    InvalidArgument,
    NotFound,
    SpecIssue,
    code_location,
    code_traceback,
)
from flowserve.core.importpath import edit_path
from flowserve.core.node import Context, Node, TensorMap
from flowserve.graph.plan import Plan
from flowserve.nodes.backends import autocompletions
from flowserve.nodes.code import changed_files, code_files, forget
from flowserve.nodes.factory import Compiled, build_nodes, compile_all, dependencies, graph_specs
from flowserve.nodes.forward import ForwardNode
from flowserve.nodes.loading import LoadSettings, load_waves
from flowserve.nodes.ratelimit import RateLimiter
from flowserve.nodes.remote import has_remote_nodes, waiting_for_remote
from flowserve.nodes.warmup import warm_up_graph
from flowserve.repository.control import ControlLink
from flowserve.repository.placement import Placement
from flowserve.repository.remote import resolve_sources
from flowserve.repository.settings import RepositorySettings
from flowserve.runtime.cache import ResponseCache
from flowserve.runtime.executor import Executor
from flowserve.runtime.registry import NEVER_LOADED, Registry, State
from flowserve.runtime.servable import Servable
from flowserve.runtime.stats import ModelStats
from flowserve.runtime.validate import validate_inputs
from flowserve.spec.model_config import mark_decoupled
from flowserve.spec.repository import Scan, fingerprint, override_scan, scan_graphs, scan_repository
from flowserve.spec.schema import GraphSpec, ModelSpec, node_targets
from flowserve.spec.triton import config_from_graph, parse_config_json

log = logging.getLogger("flowserve")

PathLike = str | Path


def scan_all(repositories: Iterable[Path], graph_dirs: Iterable[Path]) -> Scan:
    scan = Scan()
    completions = autocompletions()  # the backends' config auto-complete hooks
    for repo in repositories:
        scan.merge(scan_repository(repo, completions))
    for gdir in graph_dirs:
        scan.merge(scan_graphs(gdir))
    return scan


def add_import_roots(graph_dirs: Iterable[Path]) -> None:
    """Make ``nodes.x:Class`` importable: the folder holding a graphs folder (or a graph file's
    folder) is where its ``nodes/`` lives (the repository layout), and the working directory is
    too."""
    folders = (p.resolve().parent if p.is_file() else p.resolve() for p in graph_dirs)
    roots = [Path.cwd(), *(folder.parent for folder in folders)]

    def change(path: list[str]) -> list[str]:
        for root in roots:
            if str(root) not in path:
                path.insert(0, str(root))
        return path

    edit_path(change)  # a new list, never sys.path in place (flowserve/core/importpath.py)


class Repository:
    """Loads repositories and graphs and keeps what is loaded (see the module's docs, and
    :mod:`flowserve.repository.settings` for the model control modes)."""

    def __init__(
        self,
        model_repository: PathLike | Sequence[PathLike] | None = None,
        graphs: PathLike | Sequence[PathLike] | None = None,
        settings: RepositorySettings | None = None,
        clock: Clock = MONOTONIC,
        *,
        rate_limiter: RateLimiter | None = None,
        placement: Placement | None = None,
    ) -> None:
        self.settings = settings = settings or RepositorySettings()
        # with several workers: which models load here, and how the others are reached
        self.placement = placement
        self.clock = clock
        # a repository or graph folder URL (s3://...) is served from its local mirror, a graph
        # folder's with the nodes/ beside it (repository/remote.py)
        sources = [model_repository] if isinstance(model_repository, str | Path) else model_repository or []
        folders = [graphs] if isinstance(graphs, str | Path) else graphs or []
        self.repositories, self.graph_dirs, self.remote = resolve_sources(
            sources, folders, settings.remote, lambda: self.clock.now_ns() / 1e9
        )
        # Triton's rate limiter (nodes/ratelimit.py); None: off
        self.rate_limiter = rate_limiter
        # pb_utils.load_model/unload_model from inside a model: the data plane binds it
        self.control = ControlLink()
        # what every node built here is given (nodes/loading.py)
        self.load_settings = LoadSettings(
            settings.model_load_threads,
            settings.inline_threshold_us,
            rate_limiter,
            self.control,
            ray_address=settings.ray_address,
        )
        self.cache = ResponseCache(settings.cache_bytes) if settings.cache_bytes > 0 else None
        self.registry = Registry()
        self.registry.listing = self.listing
        self.issues: list[SpecIssue] = []
        self.models: dict[str, ModelSpec] = {}
        self.graphs: dict[str, GraphSpec] = {}
        self.plans: dict[str, Plan] = {}
        self.fingerprints: dict[str, str] = {}
        self.live = True
        # True while open() loads what the server starts with: live, not ready (as Triton)
        self.loading = False
        # a progress line every PROGRESS_S during a long load; off in all but one worker of a
        # server of several (each loads the same models: one set of lines is enough)
        self.progress_lines = True
        self._overrides: Path | None = None
        self._poller: asyncio.Task[None] | None = None
        self._reload_failures: dict[str, str] = {}
        # with error_traceback: the user's traceback of the last failed load of a name, for the
        # load API's error answer (the log always has it)
        self._load_tracebacks: dict[str, str] = {}
        # graph -> {file: digest} of the python nodes' own code it loaded (nodes/code.py): poll
        # mode reloads a graph whose code changed
        self.code: dict[str, dict[str, str]] = {}
        self._lock = asyncio.Lock()

    @property
    def control_mode(self) -> str:
        return self.settings.control_mode

    async def open(self, poll: bool = True) -> None:
        """Load what the settings ask for at start (everything, unless ``explicit`` mode names
        some); failures are logged and reported by the index, never fatal for the others. In
        poll mode, start polling (unless ``poll`` is False: a worker of several is polled by the
        supervisor, all workers at once)."""
        add_import_roots(self.graph_dirs)
        self.loading = True
        try:
            async with self._lock:
                try:
                    await self.remote.sync(settle=True)
                except BaseException:
                    self.remote.close()
                    raise
                await self._load_from_scan(self.settings.loads_at_start())
        finally:
            self.loading = False
        if self.settings.control_mode == "poll" and poll:
            self._poller = asyncio.create_task(self._poll_forever(), name="flowserve-poll")

    # ---------------------------------------------------------------- loading

    async def load_all(self) -> None:
        async with self._lock:
            await self.remote.sync(settle=True)
            await self._load_from_scan(None)

    async def _load_from_scan(self, wanted: set[str] | None) -> Scan:
        """Scan everything and (re)load ``wanted`` (None: everything), plus whatever they use
        that is not loaded yet."""
        scan = scan_all(self.repositories, self.graph_dirs)
        if wanted is None:
            selected = set(graph_specs(scan)) | set(scan.failed)
        else:
            closure = self._closure(scan, wanted)
            selected = {n for n in closure if n in wanted or not self.registry.has(n)}
        subset = scan.subset(selected)
        known = {n: p for n, p in self.plans.items() if self.registry.has(n) and n not in selected}
        compiled = await _compile(subset, known)
        self.issues = compiled.issues
        self.models.update(subset.models)
        self.graphs.update(subset.graphs)
        for issue in compiled.issues:
            log.error("%s", issue)
        for name, reason in compiled.failed.items():
            if not self.registry.has(name):
                self.registry.mark(name, "", State.UNAVAILABLE, reason)
            elif name in selected:  # a reload that does not compile: the old version serves on
                self._reload_failures[name] = " ".join(reason.split())
                log.error("reload of '%s' failed, the loaded version keeps serving: %s", name, reason)
        for name in compiled.order:
            self.fingerprints[name] = fingerprint(scan.paths[name]) if name in scan.paths else ""
        await self._load_concurrently(compiled.order, compiled.plans, subset)
        for name, graph in subset.graphs.items():  # what their python nodes run, as loaded now
            self.code[name] = code_files(n.target for n in graph.nodes.values() if n.kind == "python")
        if wanted is None:
            return scan
        # what was not asked for (explicit mode): the index lists it by name only, as Triton
        # lists a model it never loaded; the UI and metrics show it UNAVAILABLE
        for name in sorted(set(scan.paths) - selected - set(self.fingerprints)):
            if not any(s.name == name for s in self.registry.index()):
                self.registry.mark(name, "", State.UNAVAILABLE, NEVER_LOADED)
        return scan

    async def _load_concurrently(self, order: list[str], plans: dict[str, Plan], scan: Scan) -> None:
        """Load ``order`` wave by wave (what uses nothing of its own wave), at most
        ``model_load_threads`` at once; each replaced servable retires after its wave."""
        specs = graph_specs(scan)
        deps = {name: dependencies(specs[name]) for name in order if name in specs}
        gate = asyncio.Semaphore(self.settings.model_load_threads)

        async def one(name: str) -> list[Servable]:
            async with gate:
                return await self._load(name, plans[name])

        for wave in load_waves(order, deps):
            for old in await asyncio.gather(*(one(name) for name in wave)):
                await self._retire(old)

    def _closure(self, scan: Scan, wanted: set[str]) -> set[str]:
        """``wanted`` plus every model or graph they use, transitively."""
        specs = graph_specs(scan)
        out: set[str] = set()
        frontier = list(wanted)
        while frontier:
            name = frontier.pop()
            if name in out:
                continue
            out.add(name)
            if name in specs:
                frontier.extend(dependencies(specs[name]))
        return out

    async def _load(self, name: str, plan: Plan) -> list[Servable]:
        """Start every version of ``name`` and put them in the registry in one swap; versions
        that fail are marked UNAVAILABLE with the reason. Returns what was replaced."""
        model = self.models.get(name)
        graph = self.graphs.get(name) if model is None else None
        if model is not None:
            versions = list(model.versions)
            config = model.config
            kind = "model" if model.graph is None else "ensemble"
            spec: ModelSpec | GraphSpec = model
        else:
            assert graph is not None
            spec = graph
            versions = [1]
            config = config_from_graph(
                graph, [o.tensor for o in plan.outputs], {n.name: n.outputs for n in plan.nodes}
            )
            kind = "graph"
        cache = self._cache_for(name, model, graph)
        forwarded = model is not None and self.placement is not None and not self.placement.here(model)
        if forwarded:
            cache = None  # the owner's servable looks the cache up
        loaded: list[Servable] = []
        failed: dict[str, str] = {}
        for version in versions:
            stats = ModelStats()
            started: list[Node] = []
            progress = _Progress(f"{kind} '{name}' version {version}", self.clock, self.progress_lines)
            try:
                if forwarded:
                    assert model is not None and self.placement is not None
                    nodes = self._forwarding_nodes(plan, model, version, self.placement)
                else:
                    nodes = build_nodes(
                        plan, self.registry, self._share(model), version, stats, self.clock, self.cache,
                        self.load_settings,
                    )  # fmt: skip
                for node in nodes:
                    progress.doing = f"node '{node.name}'"
                    try:
                        await node.start()
                    except Exception as exc:
                        raise FlowserveError(
                            f"node '{node.name}' failed to start: {_text(exc)}{_at(exc)}"
                        ) from exc
                    started.append(node)
                executor = Executor(plan, nodes, self.clock, self.settings.error_traceback)
                if graph is not None and graph.warmup:
                    await warm_up_graph(name, graph.warmup, plan.max_batch_size > 0, _runner(plan, executor))
            except Exception as exc:
                for node in started:
                    await node.stop()
                reason = failed[str(version)] = _text(exc)
                traceback = _traceback(exc)
                log.error("failed to load '%s' version %s: %s%s", name, version, reason, traceback)
                if self.settings.error_traceback and traceback:
                    self._load_tracebacks[name] = traceback
                continue
            finally:
                progress.stop()
            if executor.decoupled and graph is not None:
                mark_decoupled(config)  # clients must stream
            loaded.append(
                Servable(
                    name=name,
                    version=version,
                    kind=kind,
                    plan=plan,
                    executor=executor,
                    spec=spec,
                    config=config,
                    clock=self.clock,
                    stats=stats,
                    decoupled=executor.decoupled or (model is not None and model.decoupled),
                    cache=cache,
                    forwarded=forwarded,
                )
            )
            if forwarded:
                log.info("%s '%s' version %s runs on worker %s", kind, name, version, self._owner(model))
            else:
                log.info("loaded %s '%s' version %s", kind, name, version)
        if failed and self.registry.has(name):
            # a reload swaps in the new versions only when all of them loaded; until then the
            # old ones keep serving
            for servable in loaded:
                await servable.stop()
            reason = "; ".join(f"version {v}: {r}" for v, r in failed.items())
            self._reload_failures[name] = reason
            log.error("reload of '%s' failed, the loaded version keeps serving: %s", name, reason)
            return []
        self.plans[name] = plan
        old = self.registry.replace(name, loaded)
        for failed_version, reason in failed.items():
            self.registry.mark(name, failed_version, State.UNAVAILABLE, reason)
        return old

    def _share(self, model: ModelSpec | None) -> ModelSpec | None:
        """``model`` with the instances this process loads (see :meth:`Placement.instances`)."""
        return model if model is None or self.placement is None else self.placement.instances(model)

    def _forwarding_nodes(
        self, plan: Plan, model: ModelSpec, version: int, placement: Placement
    ) -> list[Node]:
        """A model another worker owns: its one node runs there (nodes/forward.py)."""
        if len(plan.nodes) != 1:
            raise FlowserveError(f"model '{model.name}': a pinned model must be a single model, not a graph")
        return [
            ForwardNode(
                plan.nodes[0].name, model.name, version, placement.forward, model.decoupled, self.clock
            )
        ]

    def _owner(self, model: ModelSpec | None) -> int | None:
        return None if model is None or self.placement is None else self.placement.owner(model)

    def _cache_for(self, name: str, model: ModelSpec | None, graph: GraphSpec | None) -> ResponseCache | None:
        if model is not None:
            config = model.config
            wanted = bool(config.response_cache.enable)
            if wanted and (model.decoupled or config.HasField("sequence_batching")):
                log.warning("'%s': the response cache is not used for decoupled or sequence models", name)
                return None
        else:
            wanted = graph is not None and graph.response_cache
        if wanted and self.cache is None:
            log.warning("'%s' enables the response cache, but the server has none (--cache-size)", name)
        return self.cache if wanted else None

    async def load_model(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        """(Re)load one model or graph, and whatever it uses that is not loaded yet; optionally
        with a config override and override files (``{"1/model.py": b"..."}``). Others keep
        serving; the old versions finish their in-flight requests before they stop."""
        async with self._lock:
            self._reload_failures.pop(name, None)
            self._load_tracebacks.pop(name, None)
            if config_json is None and not files:
                await self.remote.sync(settle=True)
                scan = await self._load_from_scan({name})
                if name not in scan.paths:
                    raise NotFound(f"failed to load '{name}': no model directory or graph file of that name")
            else:
                await self._load_override(name, config_json, files)
        reload_failure = self._reload_failures.pop(name, None)
        traceback = self._load_tracebacks.pop(name, "")  # only with error_traceback
        if reload_failure is not None:
            raise InvalidArgument(
                f"failed to load '{name}': {reload_failure} (the loaded version keeps serving){traceback}"
            )
        if not self.registry.has(name):
            reasons = [s.reason for s in self.registry.index() if s.name == name and s.reason]
            raise InvalidArgument(
                f"failed to load '{name}': {'; '.join(reasons) or 'no version loaded'}{traceback}"
            )

    async def _load_override(
        self, name: str, config_json: str | None, files: dict[str, bytes] | None
    ) -> None:
        if config_json is None:
            raise InvalidArgument(f"load of '{name}': file overrides require a 'config' parameter")
        try:
            parse_config_json(config_json)
        except InvalidArgument as exc:  # Triton's wording (and, as Triton, in the server log)
            message = f"failed to load '{name}': Invalid config override: {exc.message}"
            log.error("%s", message)
            raise InvalidArgument(message) from None
        model_dir = next((r / name for r in self.repositories if (r / name).is_dir()), None)
        scan = override_scan(
            name, model_dir, config_json, files or {}, self._override_root(), autocompletions()
        )
        missing = {d for spec in graph_specs(scan).values() for d in dependencies(spec)} - {
            n for n in self.plans if self.registry.has(n)
        }
        if missing:
            await self._load_from_scan(missing)
        known = {n: p for n, p in self.plans.items() if n != name and self.registry.has(n)}
        compiled = await _compile(scan, known)
        if name not in compiled.plans:
            reason = "; ".join(str(i) for i in compiled.issues) or compiled.failed.get(name, "invalid")
            raise InvalidArgument(f"failed to load '{name}': {reason}")
        self.models.pop(name, None)
        self.graphs.pop(name, None)
        self.models.update(scan.models)
        self.graphs.update(scan.graphs)
        self.fingerprints.pop(name, None)
        await self._load_concurrently([name], compiled.plans, scan)

    def listing(self) -> list[str]:
        """Every model directory and graph the repositories and graph folders hold now, loaded
        or not: Triton's repository index looks at the disk at each call, so a directory added
        after start is listed (and can be loaded) in explicit mode."""
        names: set[str] = set()
        for root in self.repositories:
            with contextlib.suppress(OSError):
                names.update(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        for folder in self.graph_dirs:
            names.update(scan_graphs(folder).paths)
        return sorted(names)

    def _override_root(self) -> Path:
        if self._overrides is None:
            self._overrides = Path(tempfile.mkdtemp(prefix="flowserve-overrides-"))
        return self._overrides

    async def unload_model(self, name: str, unload_dependents: bool = False) -> list[str]:
        """Unload ``name`` (and, if asked, every graph that uses it); returns what was unloaded."""
        if not self.registry.has(name):
            if self.registry.never_loaded(name) or (
                name in self.listing() and not any(s.name == name for s in self.registry.index())
            ):
                return []  # in the repository but never loaded: nothing to do (as Triton)
            if not any(s.name == name for s in self.registry.index()):
                raise NotFound(f"failed to unload '{name}': unknown model")
        names = [name]
        if unload_dependents:
            names += self.dependents(name)
        async with self._lock:
            for n in names:
                self.fingerprints.pop(n, None)
                self.code.pop(n, None)
                await self._retire(self.registry.remove(n))
        return names

    async def poll_once(self) -> tuple[list[str], list[str]]:
        """Re-scan the repositories: load what was added or changed, unload what was removed.
        Returns (loaded, unloaded) names."""
        async with self._lock:
            await self.remote.sync(settle=False)  # the previous poll was the first listing
            scan = scan_all(self.repositories, self.graph_dirs)
            current = {n: fingerprint(p) for n, p in scan.paths.items()}
            changed = {n for n, fp in current.items() if self.fingerprints.get(n) != fp}
            removed = [n for n in self.fingerprints if n not in current]
            for name in removed:
                self.fingerprints.pop(name, None)
                self.code.pop(name, None)
                await self._retire(self.registry.remove(name))
            changed |= self._code_changed(set(current))
            # an entry that failed keeps its fingerprint, so it is retried only when it changes;
            # except a graph that failed for want of a remote that did not answer: every poll
            # tries it again, so it becomes ready when the remote does (nodes/remote.py)
            waiting = {
                n
                for n in current
                if n not in changed
                and n in self.graphs
                and not self.registry.has(n)
                and waiting_for_remote(self.graphs[n])
            }
            for name in changed | waiting:
                self._reload_failures.pop(name, None)
            if changed or waiting:
                await self._load_from_scan(changed | waiting)
                for name in changed:  # tried: retried only when it changes again
                    self.fingerprints[name] = current[name]
            failed = self._poll_failures(changed)
            loaded = sorted((changed - set(failed)) | {n for n in waiting if self.registry.has(n)})
        if loaded or removed:
            log.info("repository poll: loaded %s, unloaded %s", loaded, removed)
        for name, reason in failed.items():
            log.error("repository poll: failed to load '%s': %s", name, reason)
        return loaded, removed

    def _code_changed(self, names: set[str]) -> set[str]:
        """The graphs among ``names`` whose python nodes' code changed since they loaded; the
        modules of that code are forgotten, so that loading them again imports the new code."""
        stale = {name: changed_files(self.code[name]) for name in names if name in self.code}
        stale = {name: files for name, files in stale.items() if files}
        if stale:
            files = set().union(*stale.values())
            modules = forget(files)
            log.info(
                "repository poll: node code changed (%s), reloading %s (modules %s)",
                ", ".join(sorted(files)),
                sorted(stale),
                ", ".join(modules) or "none loaded",
            )
        return set(stale)

    def _poll_failures(self, tried: set[str]) -> dict[str, str]:
        """Of the names a poll (re)loaded, the ones that failed, with why (and whether a
        loaded version keeps serving, as Triton keeps it)."""
        failed: dict[str, str] = {}
        for name in sorted(tried):
            if name in self._reload_failures:
                failed[name] = f"{self._reload_failures.pop(name)} (the loaded version keeps serving)"
            elif not self.registry.has(name):
                reasons = [s.reason for s in self.registry.index() if s.name == name and s.reason]
                failed[name] = "; ".join(reasons) or "no version loaded"
        return failed

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.poll_secs)
            try:
                await self.poll_once()
            except Exception:  # a bad scan must never stop the polling
                log.exception("repository poll failed")

    def dependents(self, name: str) -> list[str]:
        """Loaded graphs that use ``name``, directly or through other graphs."""
        found: list[str] = []
        frontier = [name]
        while frontier:
            target = frontier.pop()
            for other, plan in self.plans.items():
                if other in found or other == name or not self.registry.has(other):
                    continue
                if any(target in node_targets(n.spec, shadow=False) for n in plan.nodes):
                    found.append(other)
                    frontier.append(other)
        return found

    async def _retire(self, servables: list[Servable], grace_s: float = 30.0) -> None:
        """Stop replaced servables once their in-flight requests are done (or after grace_s)."""
        for servable in servables:
            if not await servable.drained(grace_s):
                log.warning(
                    "%s version %d: stopped after %.0f s with %d requests in flight",
                    servable.name,
                    servable.version,
                    grace_s,
                    servable.stats.pending,
                )
            await servable.stop()

    async def stop(self) -> None:
        self.live = False
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        for name in {s.name for s in self.registry.servables()}:
            for servable in self.registry.remove(name):
                await servable.stop()
        if self._overrides is not None:
            shutil.rmtree(self._overrides, ignore_errors=True)
        self.remote.close()

    # ---------------------------------------------------------------- inference

    def ready(self) -> bool:
        """Live and done loading what the server starts with."""
        return self.live and not self.loading

    def model_ready(self, name: str, version: str = "") -> bool:
        return self.registry.ready(name, version)


async def _compile(scan: Scan, known: dict[str, Plan]) -> Compiled:
    """``compile_all`` off the event loop when a graph has a remote node: its load-time
    metadata query waits on the network (up to the node's ``timeout_s`` per endpoint), and
    the server keeps serving meanwhile."""
    if any(has_remote_nodes(spec) for spec in scan.graphs.values()):
        return await asyncio.to_thread(compile_all, scan, known)
    return compile_all(scan, known)


def _runner(plan: Plan, executor: Executor) -> Callable[[TensorMap], Awaitable[object]]:
    """Run one warmup request through a graph's executor (validated like a request)."""

    async def run(inputs: TensorMap) -> object:
        validate_inputs(plan, inputs)
        ctx = Context(request_id="warmup")
        if executor.decoupled:
            return [out async for out in executor.stream(inputs, ctx)]
        return await executor.run(inputs, ctx)

    return run


# a load that takes longer than this says so, again every this many seconds
PROGRESS_S = 3.0


class _Progress:
    """While one version loads, a log line every PROGRESS_S seconds: what loads, the node it
    is starting (a slow initialize) and for how long, so a long start is not a silent one."""

    def __init__(self, what: str, clock: Clock, report: bool = True) -> None:
        self.what = what
        self.doing = ""
        self.clock = clock
        self.started_ns = clock.now_ns()
        self.task: asyncio.Task[None] | None = None
        if report:
            self.task = asyncio.get_running_loop().create_task(self._report(), name="flowserve-load-progress")

    async def _report(self) -> None:
        while True:
            await asyncio.sleep(PROGRESS_S)
            seconds = (self.clock.now_ns() - self.started_ns) / 1e9
            doing = f", {self.doing}" if self.doing else ""
            log.info("loading %s%s (%.0f s)...", self.what, doing, seconds)

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()


def _user_error(exc: BaseException) -> BaseException | None:
    """The error a user's code raised behind ``exc`` (through flowserve's wrapping), or None."""
    while isinstance(exc, FlowserveError) and exc.__cause__ is not None:
        exc = exc.__cause__
    return None if isinstance(exc, FlowserveError) or not code_location(exc) else exc


def _at(exc: BaseException) -> str:
    """`` (at file:line)`` of a user's code that raised ``exc``; "" for flowserve's own errors."""
    cause = _user_error(exc)
    return f" (at {code_location(cause)})" if cause is not None else ""


def _traceback(exc: BaseException) -> str:
    """The traceback of the user's code behind ``exc`` (a new line first), for the log."""
    cause = _user_error(exc)
    return "\n" + code_traceback(cause) if cause is not None else ""


def _text(exc: BaseException) -> str:
    if isinstance(exc, FlowserveError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"
