"""Request headers forwarded as request parameters (Triton's ``--http-header-forward-pattern``
and ``--grpc-header-forward-pattern``): a header (HTTP) or metadata key (gRPC) whose name
matches the pattern becomes a request parameter of that (lower-case) name, so whatever reads
parameters (a split node's ``by_parameter`` or ``sticky_parameter``, a Python node through its
context, a python model's ``request.parameters()``) can read it. Parameters the request sets
itself win over forwarded headers. On a gRPC stream, the stream's metadata is forwarded to
every request of it.

The pattern is RE2 syntax, read as Triton reads it: ``(?i)`` before it (header names are
case-insensitive), matched anywhere in the name (RE2's PartialMatch), so a flag group later in
the pattern turns case back on: ``(?-i)MY_HEADER.*`` matches only upper-case names. Names are
matched in lower case (HTTP/2 sends them so, and the HTTP server lowers them), so that pattern
forwards nothing, as Triton's forwards no gRPC metadata. RE2 matches in linear time whatever
the header names clients send.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import re2  # type: ignore[import-untyped]  # google-re2 ships no type information

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a bad pattern is our ValueError, not a line on stderr too


class HeaderPattern:
    """A compiled header-forward pattern (see the module's docstring)."""

    __slots__ = ("_regex", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._regex = re2.compile("(?i)" + text, _OPTIONS)

    def matches(self, name: str) -> bool:
        return self._regex.search(name) is not None

    def __repr__(self) -> str:
        return f"HeaderPattern({self.text!r})"


def forward_headers(
    parameters: dict[str, Any], headers: Iterable[tuple[str | bytes, str | bytes]], pattern: HeaderPattern
) -> None:
    """Add the headers whose name matches ``pattern`` to ``parameters`` (lower-case names,
    string values), unless the request already has a parameter of that name."""
    for name, value in matching_headers(headers, pattern):
        if name not in parameters:
            parameters[name] = value


def matching_headers(
    headers: Iterable[tuple[str | bytes, str | bytes]], pattern: HeaderPattern
) -> list[tuple[str, str]]:
    """The (lower-case name, value) of every header whose name matches ``pattern``: worked
    out once for a gRPC stream, whose metadata every request of it carries."""
    out = []
    for raw_name, raw_value in headers:
        name = (raw_name.decode("latin-1") if isinstance(raw_name, bytes) else raw_name).lower()
        if pattern.matches(name):
            out.append((name, raw_value.decode("latin-1") if isinstance(raw_value, bytes) else raw_value))
    return out


def also_forward(pattern: HeaderPattern | None, name: str) -> HeaderPattern:
    """``pattern`` (None: nothing) widened to forward the header ``name`` too."""
    exact = f"^{re.escape(name)}$"
    return HeaderPattern(f"(?:{pattern.text})|{exact}" if pattern else exact)


def compile_pattern(text: str, option: str) -> HeaderPattern:
    """``text`` compiled as RE2; ValueError naming ``option`` and RE2's reason when invalid."""
    try:
        return HeaderPattern(text)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ValueError(f"{option}: invalid regular expression {text!r} (RE2 syntax): {reason}") from None


__all__ = ["HeaderPattern", "also_forward", "compile_pattern", "forward_headers", "matching_headers"]
