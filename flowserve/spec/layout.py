"""What a path given to ``flowserve serve PATH`` or ``flowserve validate PATH`` is.

- a **project folder**: it holds ``model_repository/`` or ``graphs/`` (and the ``nodes/`` those
  graphs import): both are used, where present. ``flowserve serve`` with no path at all is
  ``flowserve serve .``;
- a **graph folder** (it holds ``*.yaml`` files) or one graph file;
- otherwise a **model repository** in Triton's layout (a folder of model folders), as
  ``tritonserver --model-repository`` takes it; a URL (``s3://...``) is one too.

``--model-repository`` and ``--graphs`` still name a repository or a graph folder (or URL) as
they say.

Only the file system is read (nothing is parsed), so a typo in a file never changes what its
folder is taken for.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

REPOSITORY_DIR = "model_repository"
GRAPHS_DIR = "graphs"
NODES_DIR = "nodes"

Kind = Literal["project", "graphs", "repository", "missing"]


@dataclass
class Sources:
    """What to serve or validate: model repositories and graph folders or files (a URL stays a
    string), and each path given by position that does not exist."""

    repositories: list[Path | str] = field(default_factory=list)
    graphs: list[Path | str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def is_url(text: str) -> bool:
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", text) is not None


def kind_of(path: Path) -> Kind:
    """Which of the kinds above ``path`` is (see the module's docs)."""
    if not path.exists():
        return "missing"
    if path.is_file():
        return "graphs" if path.suffix in (".yaml", ".yml") else "repository"
    if (path / REPOSITORY_DIR).is_dir() or (path / GRAPHS_DIR).is_dir():
        return "project"
    if any(path.glob("*.yaml")) or any(path.glob("*.yml")):
        return "graphs"
    return "repository"


def project_sources(root: Path) -> Sources:
    """The model repository and graph folder of a project folder, where present."""
    out = Sources()
    if (root / REPOSITORY_DIR).is_dir():
        out.repositories.append(root / REPOSITORY_DIR)
    if (root / GRAPHS_DIR).is_dir():
        out.graphs.append(root / GRAPHS_DIR)
    return out


def resolve_sources(
    paths: Sequence[str], repositories: Sequence[str] = (), graphs: Sequence[str] = ()
) -> Sources:
    """``paths`` given by position, each taken for what it is, plus the ``--model-repository``
    and ``--graphs`` given by flag (taken as they say). Nothing at all: the current folder as a
    project."""
    out = Sources()
    if not paths and not repositories and not graphs:
        return project_sources(Path())
    for text in paths:
        if is_url(text):
            out.repositories.append(text)
            continue
        path = Path(text)
        kind = kind_of(path)
        if kind == "missing":
            out.missing.append(text)
        elif kind == "project":
            found = project_sources(path)
            out.repositories += found.repositories
            out.graphs += found.graphs
        elif kind == "graphs":
            out.graphs.append(path)
        else:
            out.repositories.append(path)
    out.repositories += [r if is_url(r) else Path(r) for r in repositories]
    out.graphs += [g if is_url(g) else Path(g) for g in graphs]
    return out


__all__ = [
    "GRAPHS_DIR",
    "NODES_DIR",
    "REPOSITORY_DIR",
    "Sources",
    "is_url",
    "kind_of",
    "project_sources",
    "resolve_sources",
]
