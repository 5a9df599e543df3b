"""Model repositories in object storage: ``s3://``, ``gs://``, ``az://``/``as://``, any fsspec URL.

A remote repository is mirrored into a local cache directory, and the cache is what the engine
scans, with the same code as a local repository (``spec/repository.py`` stays the one config
reader), so version policies, ensembles, poll mode and fingerprints work unchanged. Each sync
(at start, on an explicit load, on every poll) lists the remote tree once and downloads only
files whose size or ETag changed; files are written under a temporary name and renamed.

**What "complete" means.** Object stores write each object atomically (an S3 PUT or multipart
upload, a GCS upload, an Azure block list commit appear whole or not at all), so what can be
half-uploaded is a *version directory* (``model.onnx`` there, ``labels.txt`` not yet), or a
model's own files (``config.pbtxt``, ``labels.txt``, ...). Those are the units synced, each
as a whole, and only when complete:

- ``stable`` (the default; works with any Triton repository and upload tool): a unit is
  complete when its listing (every object's path, size and ETag) is the same in two listings at
  least ``settle_s`` apart. In poll mode the previous poll is the first listing; at start and
  on an explicit load a unit seen for the first time is listed again after ``settle_s``. An
  upload that pauses for longer than ``settle_s`` looks complete: use ``marker`` for those.
- ``marker`` (exact): a version directory is complete when it holds the file ``.complete``,
  which the uploader writes last; the model's own files are taken as listed.

A unit that changes keeps its previous complete copy in the cache (the loaded version keeps
serving) until the new content is complete. A model appears once its own files and at least
one version directory are complete (so a model being uploaded is not seen without a version,
and incomplete versions are simply not there yet); a unit that
disappears remotely is removed at once, and a model that disappears is unloaded by the next
poll. The cache remembers what it holds (``.flowserve-remote.json``), so a persistent cache
directory (``--repository-cache-dir``) is not downloaded again after a restart.

**Credentials** come from each filesystem's usual environment: ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL``
(``_S3``) or ``~/.aws`` for S3; ``GOOGLE_APPLICATION_CREDENTIALS`` for GCS;
``AZURE_STORAGE_CONNECTION_STRING`` or ``AZURE_STORAGE_ACCOUNT_NAME``/``_KEY`` (Triton's
``AZURE_STORAGE_ACCOUNT``/``AZURE_STORAGE_KEY`` too) for Azure. Triton's URL forms work:
``s3://host:port/bucket/path`` (an S3-compatible endpoint over http; ``s3://https://host:port/...``
over https) and ``as://account/container/path``.

**Graphs and node code** come from object storage too (``--graphs s3://bucket/app/graphs``):
the graph folder is mirrored with the ``nodes/`` folder beside it (``s3://bucket/app/nodes/``),
as ``<mirror>/graphs/`` and ``<mirror>/nodes/``, the layout of a local checkout, so graphs'
``python: nodes.x:Class`` import the mirrored code (the repository puts the folder holding a
graph folder on ``sys.path``). Each graph file is a unit; the whole ``nodes/`` tree is one
(stable mode: two equal listings of all of it; marker mode: taken as listed, as a model's own
files are). In poll mode changed node code is served at the next poll, like a changed graph (the
repository reloads the graphs whose nodes run it: nodes/code.py); otherwise after a restart.

fsspec and the filesystem packages are imported only when a remote repository is used
(``pip install 'flowserve[remote]'``: fsspec and s3fs; gcsfs or adlfs for GCS and Azure).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowserve.core.errors import InvalidArgument, Unavailable

log = logging.getLogger("flowserve")

COMPLETENESS = ("stable", "marker")
COMPLETE_MARKER = ".complete"
MANIFEST = ".flowserve-remote.json"
DEFAULT_SETTLE_S = 2.0

# a repository path "<model>/<version>/<file>": a version directory name, as Triton reads them
_VERSION = re.compile(r"[1-9][0-9]*")


def is_remote(source: object) -> bool:
    """A repository given as a URL (``scheme://...``) rather than a local path."""
    return isinstance(source, str) and re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", source) is not None


@dataclass(frozen=True)
class RemoteOptions:
    """``cache_dir`` None: a temporary directory, removed when the engine stops."""

    cache_dir: Path | None = None
    complete: str = "stable"
    settle_s: float = DEFAULT_SETTLE_S

    def __post_init__(self) -> None:
        if self.complete not in COMPLETENESS:
            raise InvalidArgument(f"repository completeness must be one of {', '.join(COMPLETENESS)}")
        if self.settle_s < 0:
            raise InvalidArgument("the repository settle time must be >= 0")


# ------------------------------------------------------------------------ the pure part


@dataclass(frozen=True, order=True)
class RemoteFile:
    """One object: its path relative to the repository root (``model/1/model.onnx``), its
    size and a token that changes when its content does (ETag, else a modification time)."""

    path: str
    size: int
    token: str = ""


# (model, version directory; "" for the model's own files)
Unit = tuple[str, str]
Manifest = frozenset[RemoteFile]


def unit_of(path: str) -> Unit | None:
    """The unit a repository-relative path belongs to (None: not inside a model directory)."""
    parts = path.split("/")
    if len(parts) < 2 or not parts[0] or parts[0].startswith("."):
        return None
    if len(parts) >= 3 and _VERSION.fullmatch(parts[1]):
        return parts[0], parts[1]
    return parts[0], ""


def group_units(files: Iterable[RemoteFile], dirs: Iterable[str] = ()) -> dict[Unit, Manifest]:
    """Files by unit. ``dirs`` (relative directory paths) add empty version directories (an
    ensemble's ``1/`` holds nothing, and object stores show it as a directory or a 0-byte key)."""
    out: dict[Unit, set[RemoteFile]] = {}
    for path in dirs:
        parts = path.strip("/").split("/")
        if len(parts) == 2 and _VERSION.fullmatch(parts[1]) and not parts[0].startswith("."):
            out.setdefault((parts[0], parts[1]), set())
    for file in files:
        unit = unit_of(file.path)
        if unit is not None:
            out.setdefault(unit, set()).add(file)
    return {u: frozenset(f) for u, f in out.items()}


@dataclass
class Decision:
    """What one listing allows: units to bring into the cache, units still incomplete, and the
    first-seen times to keep for the next listing."""

    complete: set[Unit] = field(default_factory=set)
    pending: set[Unit] = field(default_factory=set)
    seen: dict[Unit, tuple[Manifest, float]] = field(default_factory=dict)


def decide(
    listed: Mapping[Unit, Manifest],
    cached: Mapping[Unit, Manifest],
    seen: Mapping[Unit, tuple[Manifest, float]],
    now: float,
    mode: str,
    settle_s: float,
) -> Decision:
    """Which listed units are complete (see the module docstring). ``cached``: what the cache
    holds; ``seen``: each unit's manifest and when it was first listed so (from the previous
    decision). A unit equal to its cached copy is complete; a model not cached yet is taken
    only once its own files and at least one version directory are complete."""
    out = Decision()
    for unit, manifest in listed.items():
        if cached.get(unit) == manifest:
            out.complete.add(unit)
            continue
        previous = seen.get(unit)
        first = previous[1] if previous is not None and previous[0] == manifest else now
        out.seen[unit] = (manifest, first)
        if mode == "marker":
            done = unit[1] == "" or any(f.path == f"{unit[0]}/{unit[1]}/{COMPLETE_MARKER}" for f in manifest)
        else:
            done = previous is not None and previous[0] == manifest and now - first >= settle_s
        (out.complete if done else out.pending).add(unit)
    cached_models = {u[0] for u in cached}
    for model in {u[0] for u in out.pending} - cached_models:
        units = {u for u in listed if u[0] == model}
        own = (model, "") not in units or (model, "") in out.complete
        versions = {u for u in units if u[1]}
        if not (own and (not versions or versions & out.complete)):
            held = units & out.complete
            out.complete -= held
            out.pending |= held
    return out


def settle_wait(decision: Decision, now: float, mode: str, settle_s: float) -> float | None:
    """Seconds until a second listing could find the pending units complete (stable mode);
    None when nothing is pending or waiting cannot help (marker mode)."""
    if mode != "stable" or not decision.pending:
        return None
    firsts = [decision.seen[u][1] for u in decision.pending if u in decision.seen]
    return max(0.0, max(firsts, default=now) + settle_s - now)


# ------------------------------------------------------------------------ URLs and filesystems


def open_filesystem(url: str, what: str = "model repository") -> tuple[Any, str]:
    """(fsspec filesystem, root path inside it) for a repository URL, with Triton's forms;
    ``what`` names the URL in errors."""
    try:
        fsspec = importlib.import_module("fsspec")
    except ImportError:
        raise InvalidArgument(
            f"{what} {url}: remote repositories need fsspec and a filesystem package "
            "(pip install 'flowserve[remote]')"
        ) from None
    scheme, _, rest = url.partition("://")
    try:
        if scheme == "s3":
            return _s3(fsspec, rest)
        if scheme == "as":  # Triton's Azure form: as://account/container/path
            account, _, path = rest.partition("/")
            return fsspec.filesystem("az", **_azure_options(account)), path.strip("/")
        if scheme in ("az", "abfs"):
            return fsspec.filesystem(scheme, **_azure_options(None)), rest.strip("/")
        fs, root = fsspec.core.url_to_fs(url)
        return fs, str(root).rstrip("/")
    except ImportError as exc:
        raise InvalidArgument(
            f"{what} {url}: the filesystem package for '{scheme}://' is missing ({exc}); "
            "pip install 'flowserve[remote]' (s3fs), gcsfs or adlfs"
        ) from None
    except ValueError as exc:
        raise InvalidArgument(f"{what} {url}: {exc}") from None


def _azure_options(account: str | None) -> dict[str, Any]:
    """adlfs reads AZURE_STORAGE_CONNECTION_STRING / _ACCOUNT_NAME / _ACCOUNT_KEY itself; this
    adds Triton's AZURE_STORAGE_ACCOUNT / AZURE_STORAGE_KEY and the account of an as:// URL."""
    env = os.environ
    options: dict[str, Any] = {}
    if account is None and "AZURE_STORAGE_CONNECTION_STRING" in env:
        return options
    name = account or env.get("AZURE_STORAGE_ACCOUNT_NAME") or env.get("AZURE_STORAGE_ACCOUNT")
    if name:
        options["account_name"] = name
    key = env.get("AZURE_STORAGE_ACCOUNT_KEY") or env.get("AZURE_STORAGE_KEY")
    if key:
        options["account_key"] = key
    return options


def _s3(fsspec: Any, rest: str) -> tuple[Any, str]:
    options: dict[str, Any] = {}
    scheme = "http"
    if rest.startswith(("http://", "https://")):
        scheme, _, rest = rest.partition("://")
    first, _, path = rest.partition("/")
    if ":" in first:  # host:port (a bucket name never holds ':')
        options["endpoint_url"] = f"{scheme}://{first}"
    else:
        path = rest
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            options["endpoint_url"] = endpoint
    return fsspec.filesystem("s3", **options), path.strip("/")


_TOKENS = ("ETag", "etag", "md5Hash", "content_md5", "mtime", "LastModified", "last_modified", "created")


def _token(info: Mapping[str, Any]) -> str:
    for key in _TOKENS:
        value = info.get(key)
        if value not in (None, ""):
            return str(value)
    return ""


# ------------------------------------------------------------------------ one repository


@dataclass
class SyncResult:
    applied: list[Unit] = field(default_factory=list)
    removed: list[Unit] = field(default_factory=list)
    pending: list[Unit] = field(default_factory=list)
    wait_s: float | None = None


class RemoteRepository:
    """One remote repository and its local mirror ``local`` (what the engine scans)."""

    what = "model repository"  # how errors name it

    def __init__(
        self,
        url: str,
        local: Path,
        options: RemoteOptions,
        now: Callable[[], float] = time.monotonic,
        fs: Any = None,
        root: str | None = None,
    ) -> None:
        self.url = url
        self.local = local
        self.options = options
        self.now = now
        if fs is None:
            fs, root = open_filesystem(url)
        self.fs = fs
        self.root = (root or "").rstrip("/")
        self._seen: dict[Unit, tuple[Manifest, float]] = {}
        self._cached: dict[Unit, Manifest] = self._read_manifest()

    # -------------------------------------------------------------- listing

    # what a mirror lists and how it groups what it lists (RemoteGraphs lists two folders)
    subtrees: tuple[str, ...] = ("",)

    def group(self, files: Iterable[RemoteFile], dirs: Iterable[str]) -> dict[Unit, Manifest]:
        return group_units(files, dirs)

    def list(self) -> tuple[list[RemoteFile], list[str]]:
        """Every object (and directory) under the root's ``subtrees``, relative to the root."""
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache()  # fsspec caches listings; a poll must see changes
        found: dict[str, Any] = {}
        for sub in self.subtrees:
            top = "/".join(p for p in (self.root, sub) if p)
            try:
                found.update(self.fs.find(top, withdirs=True, detail=True))
            except FileNotFoundError:
                pass
            except Exception as exc:
                what = f"{type(exc).__name__}: {exc}"
                raise Unavailable(f"{self.what} {self.url}: cannot list: {what}") from exc
        prefix = f"{self.root}/" if self.root else ""
        files: list[RemoteFile] = []
        dirs: list[str] = []
        for path, info in found.items():
            path = str(path).rstrip("/")
            if not path.startswith(prefix) or path == self.root:
                continue
            rel = path[len(prefix) :]
            if info.get("type") == "directory":
                dirs.append(rel)
            elif str(info.get("name", path)).endswith("/"):
                dirs.append(rel)  # an S3 "folder" placeholder key
            else:
                files.append(RemoteFile(rel, int(info.get("size") or 0), _token(info)))
        return files, dirs

    # -------------------------------------------------------------- syncing

    def sync(self) -> SyncResult:
        """List once and bring every complete unit that changed into the cache (blocking I/O:
        the engine runs it on a thread)."""
        files, dirs = self.list()
        listed = self.group(files, dirs)
        now = self.now()
        opts = self.options
        decision = decide(listed, self._cached, self._seen, now, opts.complete, opts.settle_s)
        self._seen = decision.seen
        result = SyncResult(pending=sorted(decision.pending))
        self.local.mkdir(parents=True, exist_ok=True)
        for unit in sorted(decision.complete):
            if self._cached.get(unit) != listed[unit]:
                self._apply(unit, listed[unit])
                result.applied.append(unit)
        for unit in sorted(set(self._cached) - set(listed)):
            self._remove(unit)
            result.removed.append(unit)
        # the mirror holds exactly what the manifest says: a model directory it does not know
        # (removed remotely, or left by an earlier run) goes
        known = {u[0].split("/")[0] for u in self._cached}
        for path in self.local.iterdir():
            if path.is_dir() and not path.name.startswith(".") and path.name not in known:
                shutil.rmtree(path, ignore_errors=True)
        if result.applied or result.removed:
            self._write_manifest()
        result.wait_s = settle_wait(decision, now, opts.complete, opts.settle_s)
        if result.applied or result.removed or result.pending:
            log.info(
                "repository %s: synced %s, removed %s, incomplete %s",
                self.url,
                _units(result.applied),
                _units(result.removed),
                _units(result.pending),
            )
        return result

    def _apply(self, unit: Unit, manifest: Manifest) -> None:
        old = {f.path: f for f in self._cached.get(unit, frozenset())}
        new = {f.path: f for f in manifest}
        model, version = unit
        if version:
            (self.local / model / version).mkdir(parents=True, exist_ok=True)
        for path, file in sorted(new.items()):
            target = self.local / path
            if old.get(path) == file and target.is_file():
                continue
            self._download(path, target)
        for path in sorted(set(old) - set(new)):
            with contextlib.suppress(FileNotFoundError):
                (self.local / path).unlink()
        self._cached[unit] = manifest

    def _download(self, path: str, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        source = f"{self.root}/{path}" if self.root else path
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
        os.close(fd)
        part = Path(name)
        try:
            self.fs.get_file(source, str(part))
            part.replace(target)
        except BaseException as exc:
            part.unlink(missing_ok=True)
            if isinstance(exc, Exception):
                raise Unavailable(
                    f"{self.what} {self.url}: cannot fetch {path}: {type(exc).__name__}: {exc}"
                ) from exc
            raise

    def _remove(self, unit: Unit) -> None:
        model, version = unit
        if version:
            shutil.rmtree(self.local / model / version, ignore_errors=True)
        else:
            for file in self._cached.get(unit, frozenset()):
                with contextlib.suppress(FileNotFoundError):
                    (self.local / file.path).unlink()
        self._cached.pop(unit, None)

    # -------------------------------------------------------------- what the cache holds

    def _read_manifest(self) -> dict[Unit, Manifest]:
        try:
            doc = json.loads((self.local / MANIFEST).read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(doc, dict) or doc.get("url") != self.url:
            return {}
        out: dict[Unit, Manifest] = {}
        for entry in doc.get("units", []):
            try:
                unit = (str(entry["model"]), str(entry["version"]))
                files = frozenset(RemoteFile(str(f[0]), int(f[1]), str(f[2])) for f in entry["files"])
            except (KeyError, TypeError, ValueError, IndexError):
                return {}
            if all((self.local / f.path).is_file() for f in files):
                out[unit] = files  # a unit whose files went missing is fetched again
        return out

    def _write_manifest(self) -> None:
        units = [
            {"model": m, "version": v, "files": [[f.path, f.size, f.token] for f in sorted(files)]}
            for (m, v), files in sorted(self._cached.items())
        ]
        tmp = self.local / f"{MANIFEST}.part"
        tmp.write_text(json.dumps({"url": self.url, "units": units}))
        tmp.replace(self.local / MANIFEST)


NODES = "nodes"


class RemoteGraphs(RemoteRepository):
    """A graph folder in object storage and the node code beside it: ``<parent>/<folder>/``
    and ``<parent>/nodes/``, mirrored as ``local/<folder>/`` and ``local/nodes/`` (the engine
    scans :attr:`graph_dir` and imports ``nodes`` from ``local``). Units: each graph file, and
    the whole ``nodes/`` tree (hidden files are left out)."""

    what = "graph folder"

    def __init__(
        self,
        url: str,
        local: Path,
        options: RemoteOptions,
        now: Callable[[], float] = time.monotonic,
        fs: Any = None,
        root: str | None = None,
    ) -> None:
        if fs is None:
            fs, root = open_filesystem(url, self.what)
        parent, _, folder = (root or "").rstrip("/").rpartition("/")
        if not parent.strip("/") or not folder:
            raise InvalidArgument(
                f"graph folder {url}: give a folder inside the bucket (s3://bucket/graphs), not its "
                f"root: the node code is read from the folder '{NODES}/' beside it"
            )
        if folder == NODES:
            raise InvalidArgument(f"graph folder {url}: '{NODES}/' holds the node code, not graphs")
        self.folder = folder
        self.subtrees = (folder, NODES)
        super().__init__(url, local, options, now, fs, parent)
        # exists before the engine puts it on sys.path (an import system caches a missing folder)
        self.local.mkdir(parents=True, exist_ok=True)

    @property
    def graph_dir(self) -> Path:
        return self.local / self.folder

    def group(self, files: Iterable[RemoteFile], dirs: Iterable[str]) -> dict[Unit, Manifest]:
        out: dict[Unit, set[RemoteFile]] = {}
        for file in files:
            parts = file.path.split("/")
            if len(parts) < 2 or any(p.startswith(".") for p in parts):
                continue
            unit = (file.path, "") if parts[0] == self.folder else (NODES, "")
            out.setdefault(unit, set()).add(file)
        return {u: frozenset(f) for u, f in out.items()}

    def sync(self) -> SyncResult:
        result = super().sync()
        if any(u[0] == NODES for u in result.applied):
            importlib.invalidate_caches()  # new modules under nodes/ are found
            if not (self.local / NODES / "__init__.py").is_file():
                log.warning(
                    "graph folder %s: the node code beside it has no %s/__init__.py, so another "
                    "'%s' package on the path may be imported instead",
                    self.url,
                    NODES,
                    NODES,
                )
        return result


def _units(units: Sequence[Unit]) -> str:
    return ", ".join(f"{m}/{v}" if v else f"{m}/*" for m, v in units) or "nothing"


# ------------------------------------------------------------------------ the engine's set


def _slug(url: str) -> str:
    readable = re.sub(r"[^A-Za-z0-9]+", "-", url).strip("-")[-48:]
    return f"{readable}-{hashlib.sha256(url.encode()).hexdigest()[:10]}"


class RemoteRepositories:
    """The engine's remote repositories (and remote graph folders) under one cache root."""

    def __init__(
        self,
        urls: Sequence[str],
        options: RemoteOptions,
        now: Callable[[], float],
        graph_urls: Sequence[str] = (),
    ) -> None:
        self.options = options
        self._temporary = options.cache_dir is None and bool(urls or graph_urls)
        if options.cache_dir is not None:
            self.root = Path(options.cache_dir)
        elif urls or graph_urls:
            self.root = Path(tempfile.mkdtemp(prefix="flowserve-repository-cache-"))
        else:
            self.root = Path()
        self.repos: list[RemoteRepository] = []
        self.graphs: list[RemoteGraphs] = []
        try:
            for url in urls:
                self.repos.append(RemoteRepository(url, self.root / _slug(url), options, now))
            for url in graph_urls:
                mirror = RemoteGraphs(url, self.root / f"graphs-{_slug(url)}", options, now)
                self.graphs.append(mirror)
                self.repos.append(mirror)
        except BaseException:
            self.close()
            raise

    def __bool__(self) -> bool:
        return bool(self.repos)

    async def sync(self, settle: bool) -> None:
        """Sync every remote repository. With ``settle`` (start, explicit loads), units that
        are pending only for want of a second listing are listed again once they can be
        complete, so what is complete now is served now."""
        for repo in self.repos:
            result = await asyncio.to_thread(repo.sync)
            if settle and result.wait_s is not None:
                await asyncio.sleep(result.wait_s)
                await asyncio.to_thread(repo.sync)

    def close(self) -> None:
        if self._temporary:
            shutil.rmtree(self.root, ignore_errors=True)


def resolve_repositories(
    sources: Iterable[str | Path], options: RemoteOptions, now: Callable[[], float]
) -> tuple[list[Path], RemoteRepositories]:
    """Local paths for every repository source, in order (a URL: its cache directory), and
    the remote ones."""
    paths, _, remote = resolve_sources(sources, (), options, now)
    return paths, remote


def resolve_sources(
    repositories: Iterable[str | Path],
    graphs: Iterable[str | Path],
    options: RemoteOptions,
    now: Callable[[], float],
) -> tuple[list[Path], list[Path], RemoteRepositories]:
    """Local paths for every repository and graph folder, in order (a URL: its mirror; a
    graph folder URL: the mirrored graph folder, its ``nodes/`` beside it), and the remote
    ones."""
    repos, folders = list(repositories), list(graphs)
    remote = RemoteRepositories(
        [str(s) for s in repos if is_remote(s)], options, now, [str(s) for s in folders if is_remote(s)]
    )
    mirrors = iter(remote.repos)
    repo_paths = [next(mirrors).local if is_remote(s) else Path(s) for s in repos]
    graph_mirrors = iter(remote.graphs)
    graph_paths = [next(graph_mirrors).graph_dir if is_remote(s) else Path(s) for s in folders]
    return repo_paths, graph_paths, remote


__all__ = [
    "COMPLETENESS",
    "COMPLETE_MARKER",
    "DEFAULT_SETTLE_S",
    "Decision",
    "RemoteFile",
    "RemoteGraphs",
    "RemoteOptions",
    "RemoteRepositories",
    "RemoteRepository",
    "SyncResult",
    "decide",
    "group_units",
    "is_remote",
    "open_filesystem",
    "resolve_repositories",
    "resolve_sources",
    "settle_wait",
    "unit_of",
]
