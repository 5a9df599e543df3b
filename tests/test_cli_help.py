"""The help: a short description and one line per command at the top; serve's options in
groups by topic, the common ones first, under a one-line usage."""

from __future__ import annotations

import argparse
import re

from flowserve import cli
from flowserve.settings import Settings

GROUPS = [
    "common options",
    "models and repositories",
    "startup, readiness and shutdown (Triton's options)",
    "listeners and protocols",
    "limits and overload",
    "connection timeouts (seconds; 0: none)",
    "security: gRPC TLS (Triton's options; HTTP has none), access, shared memory",
    "execution: rate limiter, response cache, threads, Ray",
    "logging, tracing and debugging",
]


def subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = action.choices[name]
    return found


def test_top_level_help_is_a_description_and_the_commands() -> None:
    text = cli.build_parser(Settings()).format_help()
    assert text.startswith("usage: flowserve [--version] [--log-level LEVEL] [--log-json] COMMAND ...\n\n")
    assert "``" not in text  # no raw docstring
    assert "A dataflow inference server" in text
    block = text.split("commands:\n")[1].split("\n\n")[0].splitlines()[1:]
    names = [line.split()[0] for line in block if not line.startswith(" " * 6)]
    assert names[:4] == ["serve", "validate", "init", "graph"]
    for i, line in enumerate(block[:-1]):  # each of these is one line: the next names a command
        if line.split()[0] in ("serve", "validate", "init", "graph"):
            assert not block[i + 1].startswith(" " * 6), line


def test_serve_help_is_grouped_with_the_common_options_first() -> None:
    serve = subparser(cli.build_parser(Settings()), "serve")
    text = serve.format_help()
    assert text.splitlines()[0] == (
        "usage: flowserve serve [PATH ...] [--http-port PORT] [--grpc-port PORT] [--workers N|auto] "
        "[OPTION ...]"
    )
    titles = re.findall(r"^(\S.*):$", text, re.MULTILINE)
    assert titles == ["positional arguments", *GROUPS]
    common = text.split("common options:\n")[1].split("\n\n")[0]
    for flag in ("--model-repository", "--graphs", "--host", "--http-port", "--grpc-port", "--workers"):
        assert flag in common, flag
    assert "--max-connections" not in common and "--log-level" not in common


def test_every_serve_option_is_in_a_named_group() -> None:
    serve = subparser(cli.build_parser(Settings()), "serve")
    for group in serve._action_groups:
        if group.title in ("positional arguments",):
            assert [a.dest for a in group._group_actions] == ["paths"]
            continue
        assert group.title in GROUPS, group.title
    assert sum(len(g._group_actions) for g in serve._action_groups) == len(serve._actions)


def test_validate_and_graph_list_take_paths_like_serve() -> None:
    parser = cli.build_parser(Settings())
    args = parser.parse_args(["validate"])
    assert args.paths == [] and args.load is True
    args = parser.parse_args(["validate", "a", "b", "--no-load", "--model-repository", "r"])
    assert args.paths == ["a", "b"] and args.load is False and args.model_repository == ["r"]
    assert parser.parse_args(["graph", "list", "proj"]).paths == ["proj"]
    assert parser.parse_args(["init"]).directory == "."
