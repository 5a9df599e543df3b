"""Scan model repositories and graph folders into specs, collecting every problem at once."""

from __future__ import annotations

import errno
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowserve.core.errors import FlowserveError, InternalError, InvalidArgument, SpecError, SpecIssue
from flowserve.spec.graph_yaml import load_graph_file
from flowserve.spec.model_config import ModelConfig
from flowserve.spec.schema import GraphSpec, ModelSpec
from flowserve.spec.triton import CONFIG_FILES, NO_COMPLETIONS, AutoCompletions, model_spec, read_config


@dataclass
class Scan:
    """What a scan found: valid specs by name, and every problem with where it is."""

    models: dict[str, ModelSpec] = field(default_factory=dict)
    graphs: dict[str, GraphSpec] = field(default_factory=dict)
    issues: list[SpecIssue] = field(default_factory=list)
    # name -> reason, for entries that exist but could not be read (reported by the index).
    failed: dict[str, str] = field(default_factory=dict)
    # name -> the directory (model) or file (graph) it came from
    paths: dict[str, Path] = field(default_factory=dict)

    def merge(self, other: Scan) -> None:
        for name, spec in other.models.items():
            self._add(name, spec.source, self.models, spec)
        for name, gspec in other.graphs.items():
            self._add(name, gspec.source, self.graphs, gspec)
        self.issues.extend(other.issues)
        self.failed.update(other.failed)
        for name, path in other.paths.items():
            self.paths.setdefault(name, path)

    def add_model(self, name: str, spec: ModelSpec | None, issues: list[SpecIssue]) -> None:
        """Record one model read from the repository: valid, or failed with its issues."""
        self.issues.extend(issues)
        if spec is None or issues:
            self.failed[name] = "; ".join(str(i) for i in issues) or "invalid"
        else:
            self.models[name] = spec

    def subset(self, names: set[str]) -> Scan:
        """Only the entries named (with their issues)."""
        keep = {n for n in names}
        out = Scan(
            models={n: m for n, m in self.models.items() if n in keep},
            graphs={n: g for n, g in self.graphs.items() if n in keep},
            failed={n: r for n, r in self.failed.items() if n in keep},
            paths={n: p for n, p in self.paths.items() if n in keep},
        )
        failed_sources = {str(self.paths[n]) for n in out.failed if n in self.paths}
        out.issues = [i for i in self.issues if any(i.file.startswith(src) for src in failed_sources)]
        return out

    def _add(self, name: str, source: str, table: dict[str, Any], spec: object) -> None:
        if name in self.models or name in self.graphs:
            self.issues.append(SpecIssue(source, f"name '{name}' is already used by another model or graph"))
            self.failed[name] = "duplicate name"
            return
        table[name] = spec


def scan_model(model_dir: Path, completions: AutoCompletions = NO_COMPLETIONS) -> Scan:
    """Read one model directory of a repository (``completions``: the backends' auto-complete
    hooks, flowserve.nodes.backends.autocompletions())."""
    scan = Scan()
    name = model_dir.name
    scan.paths[name] = model_dir
    source = next((str(model_dir / f) for f in CONFIG_FILES if (model_dir / f).is_file()), str(model_dir))
    try:
        config, config_file = read_config(model_dir)
        source = config_file or source
        issues: list[SpecIssue] = []
        spec = model_spec(model_dir, config, source, issues, completions)
    except FlowserveError as exc:
        issues, spec = [SpecIssue(source, exc.message)], None
    except OSError as exc:
        issues, spec = [SpecIssue(source, f"cannot read: {exc}")], None
    scan.add_model(name, spec, issues)
    return scan


def scan_repository(root: str | Path, completions: AutoCompletions = NO_COMPLETIONS) -> Scan:
    """Every model directory of a Triton-layout repository (``completions``: see scan_model)."""
    root = Path(root)
    scan = Scan()
    if not root.is_dir():
        scan.issues.append(SpecIssue(str(root), "model repository is not a directory"))
        return scan
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        scan.merge(scan_model(model_dir, completions))
    return scan


def graph_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted([*root.glob("*.yaml"), *root.glob("*.yml")])


def scan_graphs(root: str | Path) -> Scan:
    """Every ``*.yaml`` graph in a folder (or one file)."""
    root = Path(root)
    scan = Scan()
    if not root.exists():
        scan.issues.append(SpecIssue(str(root), "graph folder does not exist"))
        return scan
    for path in graph_files(root):
        part = Scan()
        try:
            spec = load_graph_file(path)
            part.graphs[spec.name] = spec
            part.paths[spec.name] = path
        except SpecError as exc:
            part.issues.extend(exc.issues)
            part.failed[path.stem] = str(exc)
            part.paths[path.stem] = path
        scan.merge(part)
    return scan


def override_scan(
    name: str,
    model_dir: Path | None,
    config_json: str,
    files: dict[str, bytes],
    root: Path,
    completions: AutoCompletions = NO_COMPLETIONS,
) -> Scan:
    """A model loaded with a config override (and maybe files), as Triton's load API does.

    With files, the model lives in a fresh directory under ``root`` holding only them; without,
    the repository directory is used with the overriding config. File paths must stay inside
    the model directory: no absolute paths, no '..', no writing through a symbolic link.
    """
    from flowserve.spec.triton import model_spec, parse_config_json

    check_model_name(name)
    config = parse_config_json(config_json)
    if files:
        target = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root)) / name
        target.mkdir()
        write_override_files(name, target, files)
        model_dir = target
    if model_dir is None:
        raise InvalidArgument(f"load of '{name}': no model directory; send files with the config")
    check_override_paths(name, model_dir, config)
    scan = Scan()
    issues: list[SpecIssue] = []
    spec = model_spec(model_dir, config, f"{model_dir} (config override)", issues, completions)
    scan.add_model(name, spec, issues)
    return scan


def check_override_paths(name: str, model_dir: Path, config: ModelConfig) -> None:
    """A config from the network names no file outside the model directory: not its model file
    (``default_model_filename``) and not a parameter that names a file or library a backend
    opens (``*_PATH``, for example OpenVINO's ``CPU_EXTENSION_PATH``, which it loads as code)."""
    root = model_dir.resolve()
    named = [("default_model_filename", config.default_model_filename)]
    named += [
        (f"parameters.{k}", v.string_value)
        for k, v in config.parameters.items()
        if k.upper().endswith("_PATH")
    ]
    for key, value in named:
        if not value:
            continue
        outside = "\0" in value or ".." in Path(value).parts
        # an absolute value replaces model_dir; a symbolic link is followed
        if outside or not (model_dir / value).resolve().is_relative_to(root):
            raise InvalidArgument(
                f"load of '{name}': config field '{key}' ({value!r}) must name a file inside the "
                "model directory"
            )


def check_model_name(name: str) -> None:
    """A model name from a request names one directory: no separators, not '.' or '..'."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise InvalidArgument(f"invalid model name {name!r}: it must name one directory")


def write_override_files(name: str, target: Path, files: dict[str, bytes]) -> None:
    """Write a load request's ``file:`` entries under ``target`` and nowhere else.

    A path is relative to the model directory; a leading '/' is too, as in Triton (which joins
    it to the model directory: ``file:/1/model.py`` is ``1/model.py``). No '..', and no path
    whose directories or file are symbolic links (a link could lead out of the model
    directory), checked on the resolved path and again when opening. A path the file system
    refuses (a name over NAME_MAX...) fails as Triton's does: INTERNAL, "failed to poll from
    model repository"."""
    root = target.resolve()
    for rel, data in files.items():
        where = f"load of '{name}': file path '{rel}'"
        relative = rel.lstrip("/")
        parts = Path(relative).parts
        if not relative or Path(relative).is_absolute() or not parts or ".." in parts or "\0" in rel:
            raise InvalidArgument(f"{where} must stay inside the model directory")
        path = target.joinpath(*parts)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.parent.resolve().is_relative_to(root) or path.is_symlink():
                raise InvalidArgument(f"{where} leads out of the model directory (symbolic link)")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            # a link met by O_NOFOLLOW, a file where a directory must be (or the reverse)
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EEXIST, errno.EISDIR):
                raise InvalidArgument(f"{where} cannot be written: {exc.strerror}") from None
            raise InternalError(
                f"failed to load '{name}', failed to poll from model repository: {where} cannot be "
                f"written: {exc.strerror}"
            ) from None
        with os.fdopen(fd, "wb") as out:
            out.write(data)


def fingerprint(path: Path) -> str:
    """What changes when anything under ``path`` (a model directory or a graph file) changes."""
    import hashlib

    digest = hashlib.blake2b(digest_size=16)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if "__pycache__" in file.parts:
            continue
        try:
            st = file.stat()
        except OSError:
            continue
        digest.update(f"{file.relative_to(path.parent)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()
