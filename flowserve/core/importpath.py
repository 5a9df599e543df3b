"""Changes to ``sys.path`` that an import running on another thread survives.

Models load on several threads at once (``model_load_threads``): a Python model's ``model.py``
is imported with its folders in front of ``sys.path`` while, on another thread, a backend may be
importing torch. Python's path finder walks the ``sys.path`` list it read when the import began;
a list changed in place under it (``del sys.path[:2]`` shifts every entry two places left) makes
it skip entries, so that a package that is installed is "not found" (torch, once, in CI: "No
module named 'torch'" while a python model's import ended). So ``sys.path`` is never changed in
place here: a new list is made and bound to ``sys.path`` in one step, under one lock, and an
import already walking the old list walks it to its end unchanged.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

_LOCK = threading.Lock()


def edit_path(change: Callable[[list[str]], list[str]]) -> None:
    """``sys.path = change(copy of sys.path)``, atomically with respect to other edits."""
    with _LOCK:
        sys.path = change(list(sys.path))


def prepend_path(*entries: str) -> None:
    """Put ``entries`` in front of ``sys.path`` (in this order), even where they are already in it."""
    edit_path(lambda path: [*entries, *path])


def drop_prepended(*entries: str) -> None:
    """Undo :func:`prepend_path`: take out the first occurrence of each of ``entries``; those that
    were nowhere else stay at the end of ``sys.path`` (what a model imported may import later)."""

    def change(path: list[str]) -> list[str]:
        for entry in entries:
            if entry in path:
                path.remove(entry)
        return path + [e for e in entries if e not in path]

    edit_path(change)


__all__ = ["drop_prepended", "edit_path", "prepend_path"]
