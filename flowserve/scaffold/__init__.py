"""``flowserve init``: a project that serves and answers as it is created.

The files come from ``template/`` beside this module (each ``NAME.tmpl`` is written as ``NAME``,
in the same folders): a batched Python-backend model that needs no framework or download
(``model_repository/scale``), a Python node (``nodes/hello.py``), a graph that chains them
(``graphs/hello.yaml``) and a client that calls the graph (``client.py``), with a README.
``tests/test_cli_init.py`` creates one, serves it on free ports and runs its client.
"""

from __future__ import annotations

from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent / "template"
SUFFIX = ".tmpl"


def project_files() -> dict[Path, str]:
    """The project's files: path relative to the project folder -> text."""
    return {
        path.relative_to(TEMPLATE).with_suffix(""): path.read_text()
        for path in sorted(TEMPLATE.rglob(f"*{SUFFIX}"))
    }


def create_project(root: Path, overwrite: bool = False) -> list[Path]:
    """Write the project's files under ``root`` (made if missing) and return their paths.
    Raises FileExistsError naming the files that are there already, before writing anything,
    unless ``overwrite``."""
    files = {root / rel: text for rel, text in project_files().items()}
    there = [path for path in files if path.exists()]
    if there and not overwrite:
        names = ", ".join(str(p) for p in there[:5]) + (
            f" and {len(there) - 5} more" if len(there) > 5 else ""
        )
        raise FileExistsError(f"already there: {names}")
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(files)


__all__ = ["create_project", "project_files"]
