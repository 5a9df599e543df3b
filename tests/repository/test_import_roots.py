"""Where a graph's ``nodes/`` is imported from (repository.add_import_roots): the folder holding
the graph folder, whether the graph folder or one graph file is given, so ``flowserve serve
project/graphs/g.yaml`` imports ``project/nodes`` as ``flowserve validate`` does."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flowserve.repository.repository import add_import_roots


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "graphs").mkdir()
    (tmp_path / "graphs" / "g.yaml").write_text("name: g\n")
    return tmp_path


def test_a_graph_folder_imports_nodes_from_the_folder_holding_it(project: Path) -> None:
    add_import_roots([project / "graphs"])
    assert str(project.resolve()) in sys.path


def test_a_graph_file_imports_nodes_from_the_folder_holding_its_folder(project: Path) -> None:
    add_import_roots([project / "graphs" / "g.yaml"])
    assert str(project.resolve()) in sys.path
    assert str((project / "graphs").resolve()) not in sys.path
