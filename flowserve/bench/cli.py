"""``flowserve bench``: the load generator's command line. Only argparse at import time (the CLI
starts fast); the load machinery is imported when the command runs."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowserve.bench.stats import LevelResult

HELP = "measure a model or graph under load: throughput and p50/p90/p99 latency (like perf_analyzer)"

Command = Callable[..., argparse.ArgumentParser]


def _numbers(kind: type[int] | type[float]) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        try:
            values = [kind(v) for v in text.replace(":", ",").split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
        if not values or any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"expected numbers above 0, got {text!r}")
        return values

    return parse


def add_parser(command: Command) -> argparse.ArgumentParser:
    """Add ``bench`` through the CLI's ``command(name, help, usage=...)`` helper."""
    parser = command("bench", HELP)
    parser.usage = (
        "%(prog)s MODEL [-i http|grpc|inprocess] [-u HOST:PORT] [-c N,N...|--rate R,R...] [OPTION ...]"
    )
    parser.add_argument("model", metavar="MODEL", help="the model or graph to call (by name)")
    target = parser.add_argument_group("where")
    target.add_argument(
        "-i", "--protocol", choices=["http", "grpc", "inprocess"], default="http",
        help="http (default), grpc, or inprocess: an engine in this process, no transport",
    )  # fmt: skip
    target.add_argument("-u", "--url", default="", help="HOST:PORT (default 127.0.0.1:8000, gRPC :8001)")
    target.add_argument("--model-version", default="", metavar="V", help="a version (default: the server's)")
    target.add_argument(
        "--model-repository", action="append", default=[], metavar="DIR",
        help="inprocess: a model repository to serve (repeatable)",
    )  # fmt: skip
    target.add_argument(
        "--graphs",
        action="append",
        default=[],
        metavar="DIR",
        help="inprocess: a graph folder or file (repeatable)",
    )
    load = parser.add_argument_group("load")
    load.add_argument(
        "-c", "--concurrency", type=_numbers(int), default=None, metavar="N[,N...]",
        help="closed loop: N requests always outstanding, one level per number (default 1)",
    )  # fmt: skip
    load.add_argument(
        "--rate", type=_numbers(float), default=None, metavar="R[,R...]",
        help="open loop: R requests per second whatever the server does (latency counted from when each "
        "was due)",
    )  # fmt: skip
    load.add_argument("--poisson", action="store_true", help="open loop: exponential gaps between requests")
    load.add_argument(
        "-d", "--duration", type=float, default=5.0, metavar="S", help="seconds measured per level"
    )
    load.add_argument(
        "--warmup", type=float, default=1.0, metavar="S", help="unmeasured seconds before each level"
    )
    data = parser.add_argument_group("inputs (default: random data shaped by the model's metadata)")
    data.add_argument("-b", "--batch-size", type=int, default=1, metavar="N", help="rows per request")
    data.add_argument(
        "--shape", action="append", default=[], metavar="NAME:D1,D2",
        help="shape of an input with variable dimensions, without the batch dimension (repeatable)",
    )  # fmt: skip
    data.add_argument(
        "--input-data", type=Path, default=None, metavar="FILE",
        help="samples from a JSON file (perf_analyzer's layout), a .npz (an array per input) or a .npy",
    )  # fmt: skip
    data.add_argument("--zero", action="store_true", help="zeros instead of random values")
    load.add_argument(
        "-p", "--processes", type=int, default=1, metavar="N",
        help="spread the load over N client processes (a loaded machine wakes one process late)",
    )  # fmt: skip
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the results as JSON (one object per level)")
    out.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=cmd_bench)
    return parser


def cmd_bench(args: argparse.Namespace) -> int:
    from flowserve.bench.http import RequestFailed
    from flowserve.bench.inputs import InputError, parse_shapes
    from flowserve.bench.progress import progress_bar
    from flowserve.bench.run import BenchOptions, bench, levels
    from flowserve.bench.stats import table

    if args.protocol != "inprocess" and (args.model_repository or args.graphs):
        print("error: --model-repository and --graphs are for -i inprocess", file=sys.stderr)
        return 2
    try:
        options = BenchOptions(
            model=args.model,
            protocol=args.protocol,
            url=args.url,
            version=args.model_version,
            levels=levels(args.concurrency or (), args.rate or (), args.poisson),
            duration_s=args.duration,
            warmup_s=args.warmup,
            batch_size=args.batch_size,
            shapes=parse_shapes(args.shape),
            data=args.input_data,
            zero=args.zero,
            repositories=tuple(Path(p) for p in args.model_repository),
            graphs=tuple(Path(p) for p in args.graphs),
            processes=max(1, args.processes),
        )
        show = not args.quiet and sys.stderr.isatty()
        results: list[LevelResult] = bench(options, progress_bar(sys.stderr) if show else None)
    except (InputError, RequestFailed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    if show:
        sys.stderr.write("\r" + " " * 70 + "\r")
    where = "in-process" if args.protocol == "inprocess" else options.address
    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=2))
    else:
        print(
            f"{args.model} over {args.protocol} ({where}), "
            f"batch {args.batch_size}, {args.duration:g} s per level"
        )
        print(table(results))
    for r in results:
        for message, count in list(r.error_messages.items())[:3]:
            print(f"error ({r.level}, {count}x): {message}", file=sys.stderr)
    return 1 if any(r.requests == 0 for r in results) else 0


__all__ = ["HELP", "add_parser", "cmd_bench"]
