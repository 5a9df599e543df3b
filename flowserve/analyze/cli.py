"""``flowserve analyze``: the command line. Only argparse at import time; the analysis is
imported when the command runs."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

HELP = "tune a graph or model against a p99 target: per-node instances, batching and --workers"


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers above 0, got {text!r}")
    return values


def add_parser(command: Callable[..., argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = command("analyze", HELP)
    parser.usage = "%(prog)s GRAPH_OR_MODEL --p99-ms N [--min-throughput X] [--budget-minutes M] [OPTION ...]"
    parser.add_argument(
        "target", metavar="GRAPH_OR_MODEL", help="a graph file, a model directory, or a graph or model name"
    )
    goal = parser.add_argument_group("goal")
    goal.add_argument("--p99-ms", type=float, required=True, metavar="N", help="the p99 latency target")
    goal.add_argument(
        "--min-throughput", type=float, default=0.0, metavar="X", help="infer/s the choice must reach"
    )
    goal.add_argument("--budget-minutes", type=float, default=10.0, metavar="M", help="time for the search")
    where = parser.add_argument_group("what is served")
    where.add_argument(
        "--model-repository", action="append", default=[], metavar="DIR",
        help="repositories the target and its models are in (default ./model_repository if present)",
    )  # fmt: skip
    where.add_argument(
        "--graphs", action="append", default=[], metavar="DIR",
        help="graph folders to find a graph name in (default ./graphs if present)",
    )  # fmt: skip
    search = parser.add_argument_group("search")
    search.add_argument(
        "--mode", choices=["guided", "brute"], default="guided", help="guided (default) or brute"
    )
    search.add_argument("--max-instances", type=int, default=4, metavar="N", help="most instances per node")
    search.add_argument(
        "--max-workers", type=int, default=len(os.sched_getaffinity(0)), metavar="N",
        help="most server --workers tried (default: the cores here)",
    )  # fmt: skip
    load = parser.add_argument_group("load (flowserve bench)")
    load.add_argument(
        "-i", "--protocol", choices=["grpc", "http"], default="grpc", help="how bench calls the server"
    )
    load.add_argument(
        "-c", "--concurrency", type=_ints, default=[1, 2, 4, 8, 16, 32], metavar="N,N...",
        help="the ladder each configuration climbs until p99 passes the target or throughput stops rising",
    )  # fmt: skip
    load.add_argument("--seconds", type=float, default=2.0, metavar="S", help="measured seconds per level")
    load.add_argument(
        "--repeats", type=int, default=1, metavar="N",
        help="windows per level, their medians kept (steadier numbers on a busy machine, N times the time)",
    )  # fmt: skip
    load.add_argument("-p", "--processes", type=int, default=1, metavar="N", help="client processes")
    load.add_argument(
        "--shape", action="append", default=[], metavar="NAME:D1,D2", help="as flowserve bench's"
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--html", type=Path, default=None, metavar="FILE", help="the report page (default analyze-NAME.html)"
    )
    out.add_argument(
        "--write", action="store_true",
        help="write the chosen configuration beside the original as <file>.analyzed (nothing else is written "
        "near your files)",
    )  # fmt: skip
    out.add_argument(
        "--work", type=Path, default=None, metavar="DIR", help="keep the work folder (server log, YAML)"
    )
    out.add_argument("-q", "--quiet", action="store_true", help="only the report")
    parser.set_defaults(func=cmd_analyze)
    return parser


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _defaults(given: list[str], folder: str) -> list[Path]:
    if given:
        return [Path(p) for p in given]
    return [Path(folder)] if Path(folder).is_dir() else []


def cmd_analyze(args: argparse.Namespace) -> int:
    from flowserve.analyze.run import AnalyzeOptions, analyze
    from flowserve.analyze.target import TargetError
    from flowserve.bench.inputs import InputError, parse_shapes

    try:
        options = AnalyzeOptions(
            target=args.target,
            repositories=_defaults(args.model_repository, "model_repository"),
            graph_dirs=_defaults(args.graphs, "graphs"),
            p99_ms=args.p99_ms,
            min_throughput=args.min_throughput,
            budget_s=args.budget_minutes * 60,
            mode=args.mode,
            max_instances=args.max_instances,
            max_workers=max(1, args.max_workers),
            protocol=args.protocol,
            concurrency=tuple(args.concurrency),
            seconds=args.seconds,
            processes=max(1, args.processes),
            shapes=tuple(parse_shapes(args.shape).items()),
            repeats=max(1, args.repeats),
            html=args.html,
            write=args.write,
            work=args.work,
        )
        log = (lambda _: None) if args.quiet else (lambda line: print(line, file=sys.stderr))
        previous = signal.signal(signal.SIGTERM, _interrupt)  # the server it started is stopped too
        try:
            return analyze(options, log)
        finally:
            signal.signal(signal.SIGTERM, previous)
    except (TargetError, InputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


__all__ = ["HELP", "add_parser", "cmd_analyze"]
