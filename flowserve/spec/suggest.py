"""'Did you mean' for a misspelled name (a node, tensor, kind, model, field): the closest known
names by :func:`difflib.get_close_matches`, as a phrase to append to an error message."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(name: str, known: Iterable[object], count: int = 1) -> list[str]:
    """The known names most like ``name`` (best first; none when nothing is close). A name that
    differs only in case is always offered."""
    names = [str(k) for k in known if str(k) != name]
    folded = [k for k in names if k.lower() == name.lower()]
    close = difflib.get_close_matches(name, names, n=count, cutoff=0.6)
    return list(dict.fromkeys([*folded, *close]))[:count]


def did_you_mean(name: str, known: Iterable[object], prefix: str = "") -> str:
    """`` (did you mean 'x'?)`` for the closest known name, or "" when none is close.
    ``prefix`` goes before the suggested name (``$`` for a graph input)."""
    best = closest(name, known)
    return f" (did you mean '{prefix}{best[0]}'?)" if best else ""


__all__ = ["closest", "did_you_mean"]
