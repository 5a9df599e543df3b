"""One analysis from start to end: resolve the target, start its server from the shipped
configuration, search within the budget, stop the server, report (and ``--write``)."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flowserve.analyze.measure import LoadPlan, measurer
from flowserve.analyze.report import Report, html_page, text
from flowserve.analyze.search import Budget, Goal, MeasureError, Trial, brute, guided
from flowserve.analyze.server import AnalysisServer
from flowserve.analyze.space import Candidate
from flowserve.analyze.target import Target, resolve, served_configs, space_of, write_chosen


@dataclass(frozen=True, slots=True)
class AnalyzeOptions:
    target: str
    p99_ms: float
    repositories: list[Path]
    graph_dirs: list[Path]
    min_throughput: float = 0.0
    budget_s: float = 600.0
    mode: str = "guided"
    max_instances: int = 4
    max_workers: int = 2
    protocol: str = "grpc"
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    seconds: float = 2.0
    processes: int = 1
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    repeats: int = 1
    html: Path | None = None
    write: bool = False
    work: Path | None = None


def search(options: AnalyzeOptions, log: Callable[[str], None]) -> tuple[Report, Target]:
    """Measure configurations until the budget is spent; the server is always stopped. The
    target comes back with what was read from the server (a model's served config)."""
    target = resolve(options.target, options.repositories, options.graph_dirs)
    work = options.work or Path(tempfile.mkdtemp(prefix=f"flowserve-analyze-{target.name}-"))
    server = AnalysisServer(target, work)
    goal = Goal(options.p99_ms, options.min_throughput)
    plan = LoadPlan(
        options.protocol,
        options.concurrency,
        options.seconds,
        0.5,
        options.processes,
        options.shapes,
        options.repeats,
    )
    budget = Budget(options.budget_s, time.monotonic)
    try:
        log(f"analyzing {target.kind} '{target.name}' ({target.original}); work folder {work}")
        server.start(Candidate(1, ()))  # everything as shipped
        names = target.models if target.kind == "graph" else [target.name]
        configs = served_configs(names, lambda name: _config(server, name, log))
        space, shipped = space_of(target, configs, options.max_instances, options.max_workers)
        server.know_shipped(shipped)
        tunable = ", ".join(f"{n.name} ({n.kind})" for n in space.nodes) or "none"
        minutes = options.budget_s / 60
        log(f"tunable nodes: {tunable}; workers up to {space.max_workers}; budget {minutes:g} min")
        run = guided if options.mode == "guided" else brute
        trials: list[Trial] = run(shipped, space, goal, measurer(server, goal, plan, log), budget, log)
    except MeasureError as exc:
        raise SystemExit(f"error: the shipped configuration could not be served: {exc}") from None
    finally:
        server.stop()
        if options.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return Report(target.name, goal, trials, shipped), target


def _config(server: AnalysisServer, name: str, log: Callable[[str], None]) -> dict[str, Any] | None:
    try:
        return server.config(name)
    except MeasureError as exc:
        log(f"model '{name}' is not tuned: its config could not be read: {exc}")
        return None


def analyze(options: AnalyzeOptions, log: Callable[[str], None]) -> int:
    report, target = search(options, log)
    print(text(report))
    page = options.html or Path(f"analyze-{target.name}.html")
    page.write_text(html_page(report))
    (page.with_suffix(".json")).write_text(json.dumps(_as_json(report), indent=2))
    print(f"\nreport: {page} (and {page.with_suffix('.json')})")
    chosen = report.chosen
    if options.write and chosen is not None:
        written = write_chosen(target, chosen.candidate, f"flowserve analyze: {report.reason()}")
        for out in written:
            print(f"wrote {out}")
        if not written:
            print("nothing written: the chosen configuration is the shipped one")
    return 0 if chosen is not None else 1


def _as_json(report: Report) -> dict[str, object]:
    chosen = report.chosen
    return {
        "target": report.target,
        "p99_ms": report.goal.p99_ms,
        "min_throughput": report.goal.min_throughput,
        "chosen": chosen.index if chosen is not None else None,
        "reason": report.reason(),
        "trials": [
            {
                "index": t.index,
                "why": t.why,
                "configuration": t.candidate.describe(),
                "workers": t.candidate.workers,
                "nodes": {name: asdict(config) for name, config in t.candidate.nodes},
                "score": t.score,
                "error": t.error,
                "points": [asdict(p) for p in t.points],
            }
            for t in report.trials
        ],
    }


__all__ = ["AnalyzeOptions", "analyze", "search"]
