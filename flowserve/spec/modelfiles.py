"""Does every served version directory hold the model file its backend will open?

Checked without loading anything, for the backends whose file name is certain (the name in
``default_model_filename``, else the backend's default); the others (tree models, TensorFlow,
OpenVINO, plugins) find their files by rules of their own, and only loading them tells.
A missing file gets a suggestion when the version directory holds one that looks meant
(``classifier.onnx`` where ``model.onnx`` is expected).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from flowserve.core.errors import SpecIssue
from flowserve.spec.schema import ModelSpec
from flowserve.spec.suggest import closest

# backend -> the file names it opens by default, any one of them
DEFAULT_FILES: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("model.onnx",),
    "python": ("model.py",),
    "pytorch": ("model.pt", "model.pt2"),
    "tensorrt": ("model.plan",),
    "dali": ("model.dali",),
}


def missing_model_files(models: Iterable[ModelSpec]) -> list[SpecIssue]:
    """One issue per served version directory without its model file (see the module's docs)."""
    issues = []
    for model in models:
        if model.graph is not None or model.backend not in DEFAULT_FILES:
            continue
        named = model.config.default_model_filename
        wanted = (named,) if named else DEFAULT_FILES[model.backend]
        for version, where in sorted(model.versions.items()):
            vdir = Path(where)
            if any((vdir / name).exists() for name in wanted):
                continue
            issues.append(
                SpecIssue(
                    model.source,
                    f"model '{model.name}' version {version}: no model file {version}/{wanted[0]}"
                    + _hint(vdir, wanted[0], bool(named)),
                    field="default_model_filename" if named else None,
                )
            )
    return issues


def _hint(vdir: Path, wanted: str, named: bool) -> str:
    try:
        present = sorted(p.name for p in vdir.iterdir() if not p.name.startswith("."))
    except OSError:
        return ""
    if not present:
        return " (the version directory is empty)"
    suffix = Path(wanted).suffix
    alike = [p for p in present if suffix and Path(p).suffix == suffix]
    meant = alike if len(alike) == 1 else closest(wanted, present)
    fix = "fix default_model_filename" if named else f"rename it to {wanted} or set default_model_filename"
    if meant:
        return f" (did you mean '{meant[0]}'? {fix})"
    return f" (the version directory holds: {', '.join(present[:8])})"


__all__ = ["DEFAULT_FILES", "missing_model_files"]
