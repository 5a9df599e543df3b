"""Replaying a Dockerfile without a container runtime: its instructions as parsed, and its
filesystem steps (ARG, ENV, WORKDIR, COPY, chosen RUNs) applied to a folder that stands for the
image's root, so a test can install and serve exactly what the image would hold.

Paths inside the image (``/opt/flowserve/...``) map to ``root/opt/flowserve/...``; a RUN runs
through ``sh`` on this machine with the image's environment, its absolute paths mapped the same
way, in the mapped WORKDIR. Which RUNs run is the caller's choice (system packages and users
need root and a base image: those are skipped and reported)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

Instruction = tuple[str, str]  # (KEYWORD, the rest of the logical line)


def instructions(text: str) -> list[Instruction]:
    """The logical lines of a Dockerfile: continuations joined, comments and blanks dropped."""
    out: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical = pending + line
        pending = ""
        keyword, _, rest = logical.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def expand(text: str, values: dict[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` from ``values`` (unknown names: empty, as Docker does)."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m.group(1) or m.group(2), ""), text)


@dataclass
class Image:
    """What a replay has built so far: the root folder and the image's configuration."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str = ""
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    exposed: set[int] = field(default_factory=set)
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def path(self, inside: str) -> Path:
        """The host path of a path inside the image (relative: to WORKDIR)."""
        full = inside if inside.startswith("/") else f"{self.workdir.rstrip('/')}/{inside}"
        return self.root / full.lstrip("/")

    def map_text(self, text: str) -> str:
        """Absolute image paths in a command or value, under the root (top-level folders the
        replay created, e.g. /opt)."""
        tops = [p.name for p in self.root.iterdir() if p.is_dir()] if self.root.is_dir() else []
        for top in tops:
            text = re.sub(rf"(?<![\w./-])/{re.escape(top)}(?=/|\b)", f"{self.root}/{top}", text)
        return text

    def host_env(self) -> dict[str, str]:
        """The image's environment for a process on this machine: paths mapped, PATH ending
        with this machine's PATH (its python3 stands for the base image's)."""
        env = dict(os.environ)
        for key, value in self.env.items():
            env[key] = self.map_text(value)
        env["PATH"] = f"{env.get('PATH', '')}:{os.environ.get('PATH', '')}"
        return env


RunPolicy = Callable[[str], bool]


def replay(
    dockerfile: Path,
    context: Path,
    image: Image,
    build_args: dict[str, str] | None = None,
    run: RunPolicy = lambda command: False,
    timeout: float = 1800,
) -> Image:
    """Apply ``dockerfile``'s final stage to ``image`` (a FROM of a stage built in the same
    file that is only a base image starts nothing; any other FROM continues ``image``, which
    is the base the caller replayed before). ``run`` says which RUN commands to run."""
    given = dict(build_args or {})
    args: dict[str, str] = {}
    for keyword, rest in instructions(dockerfile.read_text()):
        values = {**args, **image.env}
        if keyword == "ARG":
            name, eq, default = rest.partition("=")
            if name in given:
                args[name] = given[name]
            elif eq:
                args[name] = expand(default, values)
            elif name in args:
                pass  # a global ARG redeclared in the stage keeps its value
            else:
                args[name] = ""
        elif keyword == "FROM":
            pass  # stages: the caller starts from the right base (see the docstring)
        elif keyword == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                image.env[key] = expand(value, values)
        elif keyword == "WORKDIR":
            image.workdir = expand(rest, values)
            image.path(".").mkdir(parents=True, exist_ok=True)
        elif keyword == "COPY":
            parts = [p for p in shlex.split(rest) if not p.startswith("--")]
            *sources, dest = (expand(p, values) for p in parts)
            _copy(context, sources, dest, image)
        elif keyword == "RUN":
            command = rest  # the shell expands it (ARGs are its environment), as in Docker
            if not run(command):
                image.skipped.append(command)
                continue
            env = image.host_env()
            env.update({k: image.map_text(v) for k, v in args.items()})
            subprocess.run(
                ["sh", "-c", image.map_text(command)],
                cwd=image.path("."),
                env=env,
                check=True,
                timeout=timeout,
            )
            image.ran.append(command)
        elif keyword == "USER":
            image.user = rest
        elif keyword == "EXPOSE":
            image.exposed |= {int(p.split("/")[0]) for p in rest.split()}
        elif keyword == "ENTRYPOINT":
            image.entrypoint = _exec_form(rest)
        elif keyword == "CMD":
            image.cmd = _exec_form(rest)
        elif keyword in ("STOPSIGNAL", "LABEL", "HEALTHCHECK", "SHELL", "VOLUME"):
            pass
        else:
            raise AssertionError(f"{dockerfile}: instruction {keyword} is not replayed")
    return image


def _exec_form(text: str) -> list[str]:
    import json

    value = json.loads(text)
    assert isinstance(value, list), text
    return [str(v) for v in value]


def _copy(context: Path, sources: list[str], dest: str, image: Image) -> None:
    target = image.path(dest)
    for source in sources:
        src = context / source
        assert src.exists(), f"COPY {source}: not in the build context {context}"
        if src.is_dir():  # a folder's contents go into dest
            shutil.copytree(src, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            into = target / src.name if dest.endswith("/") or len(sources) > 1 else target
            into.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, into)
