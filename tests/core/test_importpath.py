"""An import on one thread finds what is installed while another thread takes a model's folders
out of ``sys.path`` again (flowserve/core/importpath.py). Changed in place, the path finder that
was walking the list skipped entries: "No module named 'torch'" in CI, the moment a python
model's import ended on another loading thread. The interleaving is made exact here: a path
entry's finder does the other thread's edit in the middle of the walk."""

from __future__ import annotations

import importlib
import sys
import uuid
from collections.abc import Callable, Iterator
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

import pytest

from flowserve.core.importpath import drop_prepended, prepend_path

TRIGGER = "/flowserve-test/edit-here"
MODEL = ("/flowserve-test/model/1", "/flowserve-test/model")


class _EditOnWalk:
    """The finder of the TRIGGER entry: finds nothing, but runs ``edit`` when asked."""

    edit: Callable[[], None] = staticmethod(lambda: None)

    def find_spec(self, name: str, target: Any = None) -> ModuleSpec | None:
        _EditOnWalk.edit()
        return None


def _hook(entry: str) -> _EditOnWalk:
    if entry != TRIGGER:
        raise ImportError  # not ours: the next hook
    return _EditOnWalk()


@pytest.fixture
def walk(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A module found only in ``tmp_path``, the entry right after TRIGGER at the end of
    ``sys.path`` (as site-packages comes after what a model puts in front)."""
    name = f"late_module_{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{name}.py").write_text("VALUE = 1\n")
    before = list(sys.path)
    sys.path_hooks.insert(0, _hook)
    sys.path_importer_cache.pop(TRIGGER, None)
    sys.path = [*before, TRIGGER, str(tmp_path), "/flowserve-test/after"]
    importlib.invalidate_caches()
    try:
        yield name, tmp_path
    finally:
        sys.path_hooks.remove(_hook)
        sys.path_importer_cache.pop(TRIGGER, None)
        sys.path = before
        sys.modules.pop(name, None)
        _EditOnWalk.edit = staticmethod(lambda: None)


def test_in_place_edits_made_the_walk_skip_entries(walk: tuple[str, Path]) -> None:
    """The failure itself (what the old code did), so that the next test means something."""
    name, _ = walk
    sys.path[:0] = list(MODEL)  # the model's import begins

    def end_of_model_import() -> None:
        del sys.path[:2]

    _EditOnWalk.edit = staticmethod(end_of_model_import)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(name)


def test_imports_find_what_is_there_while_model_folders_go(walk: tuple[str, Path]) -> None:
    name, folder = walk
    prepend_path(*MODEL)
    _EditOnWalk.edit = staticmethod(lambda: drop_prepended(*MODEL))
    assert importlib.import_module(name).VALUE == 1
    assert sys.path[-2:] == list(MODEL)  # left at the end, for what the model imports later
    assert str(folder) in sys.path


def test_drop_prepended_takes_out_the_front_copies_only() -> None:
    before = list(sys.path)
    try:
        prepend_path("/x/a", "/x/b")
        assert sys.path[:2] == ["/x/a", "/x/b"]
        drop_prepended("/x/a", "/x/b")
        assert sys.path == [*before, "/x/a", "/x/b"]
        prepend_path(before[0])
        drop_prepended(before[0])
        assert sys.path[: len(before)] == before  # an entry that was there stays where it was
    finally:
        sys.path = before
