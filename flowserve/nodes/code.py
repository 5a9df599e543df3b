"""The user's own Python code behind python nodes, for reloading it (poll mode).

A graph's python nodes name ``module:Class``; the repository records which files that code
came from (the node modules and the user modules they use, transitively) with a digest of each.
When a poll finds a digest changed, the repository forgets those modules (and every user module
that uses one of them) so that reloading the graph imports the new code, while the version that
is serving keeps its classes until it is replaced. A module counts as the user's when it is a
``.py`` file outside flowserve, the standard library and installed packages.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from flowserve.core.errors import internal_file

_INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


def _file_of(module: ModuleType) -> str | None:
    """The source file of a user's module, or None for any other module."""
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py") or any(p in path for p in _INSTALLED):
        return None
    return None if internal_file(path) else path


def digest(path: str) -> str:
    """A digest of the file's bytes ("" when it cannot be read: removed counts as changed)."""
    try:
        return hashlib.sha1(Path(path).read_bytes(), usedforsecurity=False).hexdigest()
    except OSError:
        return ""


def _used_by(module: ModuleType) -> set[str]:
    """The names of the modules ``module`` refers to: modules it imported, and the modules
    of the classes and functions it imported from others (``from helpers import f``)."""
    own = module.__name__
    names: set[str] = set()
    for value in list(vars(module).values()):
        if isinstance(value, ModuleType):
            names.add(value.__name__)
        else:
            owner = getattr(value, "__module__", None)
            if isinstance(owner, str):
                names.add(owner)
    parent = own.rpartition(".")[0]
    if parent:
        names.add(parent)
    # a package's own submodules are attributes of it, not code it uses
    return {name for name in names if name != own and not name.startswith(own + ".")}


def code_files(targets: Iterable[str]) -> dict[str, str]:
    """``{file: digest}`` of the user's code that python node ``targets`` (``module:Class``)
    run: their modules and the user modules those use, transitively. A module that failed to
    import is found by its spec (its own file only), so fixing it is seen too."""
    files: dict[str, str] = {}
    seen: set[str] = set()
    stack = [target.partition(":")[0] for target in targets]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        module = sys.modules.get(name)
        if module is None:
            path = _spec_file(name)
            if path is not None:
                files[path] = digest(path)
            continue
        path = _file_of(module)
        if path is None:
            continue
        files[path] = digest(path)
        stack.extend(_used_by(module))
    return files


def _spec_file(name: str) -> str | None:
    with contextlib.suppress(Exception):  # a parent package that fails, a name that is not there
        spec = importlib.util.find_spec(name)
        if spec is not None and isinstance(spec.origin, str) and spec.origin.endswith(".py"):
            return spec.origin
    return None


def changed_files(files: dict[str, str]) -> set[str]:
    """The files of ``files`` whose content is not what it was."""
    return {path for path, known in files.items() if digest(path) != known}


def forget(files: set[str]) -> list[str]:
    """Remove from ``sys.modules`` the user modules loaded from ``files`` and every user module
    that uses one of them (transitively), with their cached bytecode, so the next import of any
    of them runs the code as it is now. Returns the names forgotten."""
    users: dict[str, set[str]] = {}  # module -> the user modules that refer to it
    mine: dict[str, str] = {}
    for name, module in list(sys.modules.items()):
        path = _file_of(module) if module is not None else None
        if path is None:
            continue
        mine[name] = path
        for used in _used_by(module):
            users.setdefault(used, set()).add(name)
    stack = [name for name, path in mine.items() if path in files]
    gone: set[str] = set()
    while stack:
        name = stack.pop()
        if name in gone:
            continue
        gone.add(name)
        stack.extend(users.get(name, ()))
    for name in gone:
        sys.modules.pop(name, None)
        parent, _, child = name.rpartition(".")
        if parent and parent in sys.modules and parent not in gone:
            with contextlib.suppress(AttributeError):  # else `import parent.child` finds the old one
                delattr(sys.modules[parent], child)
        with contextlib.suppress(OSError, ValueError, NotImplementedError):
            Path(importlib.util.cache_from_source(mine[name])).unlink(missing_ok=True)
    importlib.invalidate_caches()
    return sorted(gone)


__all__ = ["changed_files", "code_files", "digest", "forget"]
