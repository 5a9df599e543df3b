"""Run a documentation page as written: its files, its shell commands, its shown outputs.

A page is read as a sequence of fenced blocks:

- a block with a ``title="PATH"`` (other than ``Output``) is a file: it is written to PATH,
  relative to the current folder, when the run reaches it;
- a ``bash`` block is commands, one a line, run in order by :class:`Runbook` (only the commands
  it knows: anything else fails the run, so a page cannot gain a command nobody runs);
- a ``text`` block titled ``Output`` right after a ``bash`` block is what that block prints:
  the run compares it (as JSON when it parses as JSON).

Other blocks (plain ``text``, ``python`` without a title...) are prose. ``localhost:8000``,
``:8001`` and ``:8002`` in files and commands become the run's free ports on 127.0.0.1.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import tomllib
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import ROOT, free_port

FENCE = re.compile(r'^```(\w*)(?:[ \t]+title="([^"]*)")?[ \t]*\n(.*?)^```[ \t]*$', re.M | re.S)
BIN = Path(sys.executable).parent


@dataclass
class Block:
    lang: str
    title: str
    body: str
    output: str | None = None  # for a bash block: the Output block that follows it


def blocks(markdown: str) -> list[Block]:
    """The page's fenced blocks in order, each Output block attached to the bash block before it."""
    found: list[Block] = []
    for match in FENCE.finditer(markdown):
        block = Block(match.group(1), match.group(2) or "", match.group(3))
        if block.title == "Output":
            previous = found[-1] if found else None
            assert previous is not None and previous.lang == "bash", (
                f"an Output block follows no bash block:\n{block.body}"
            )
            previous.output = block.body
            continue
        found.append(block)
    return found


@dataclass
class Runbook:
    """The state of one run: the folder, the ports, the server it started."""

    cwd: Path
    ports: dict[str, int] = field(default_factory=lambda: {p: free_port() for p in ("8000", "8001", "8002")})
    server: subprocess.Popen[str] | None = None
    server_log: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)

    def local(self, text: str) -> str:
        for port, free in self.ports.items():
            text = text.replace(f"localhost:{port}", f"127.0.0.1:{free}")
        return text

    def run_page(self, markdown: str) -> None:
        for block in blocks(markdown):
            if block.title:
                path = self.cwd / block.title
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(self.local(block.body))
                self.files.append(path)
            elif block.lang == "bash":
                printed = "".join(self.command(line) for line in block.body.splitlines() if line.strip())
                if block.output is not None:
                    same(printed, block.output, block.body)

    def command(self, line: str) -> str:
        """Run one command line of the page; returns what it printed."""
        words = shlex.split(self.local(line), comments=True)
        if not words:
            return ""
        if words == ["make", "install"]:
            check_install_extras()
            return ""
        if words == ["source", ".venv/bin/activate"]:
            return ""  # this interpreter's environment is the one the page means
        if (
            len(words) == 5
            and words[0] == "mkdir"
            and words[2] == "&&"
            and words[3] == "cd"
            and words[1] == words[4]
        ):
            self.cwd = self.cwd / words[1]
            self.cwd.mkdir()
            return ""
        if words[0] == "python" and len(words) >= 2:
            return self.process([sys.executable, *words[1:]])
        if words[:2] == ["flowserve", "serve"]:
            self.serve(words[2:])
            return ""
        if words[0] == "flowserve":
            return self.process([str(BIN / "flowserve"), *words[1:]])
        if words[0] == "curl" and words[1:2] == ["-s"] and len(words) == 3:
            with urllib.request.urlopen(f"http://{words[2]}", timeout=30) as response:
                assert response.status == 200, (line, response.status)
                return str(response.read().decode())
        raise AssertionError(
            f"the page runs a command this runbook does not know: {line!r} (teach tests/docs/runbook.py)"
        )

    def process(self, cmd: list[str]) -> str:
        done = subprocess.run(cmd, cwd=self.cwd, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, (
            f"{cmd} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}\nserver:\n{self.log()}"
        )
        return done.stdout

    def serve(self, args: list[str], timeout: float = 90.0) -> None:
        assert self.server is None, "the page starts a second server"
        listen = ["--host", "127.0.0.1", "--http-port", str(self.ports["8000"])]
        listen += ["--grpc-port", str(self.ports["8001"]), "--metrics-port", str(self.ports["8002"])]
        self.server = subprocess.Popen(
            [str(BIN / "flowserve"), "serve", *args, *listen],
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        ready = threading.Event()
        threading.Thread(target=self._pump, args=(self.server, ready), daemon=True).start()
        deadline = time.monotonic() + timeout
        while not ready.wait(0.1):
            if self.server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"flowserve serve {args} did not start:\n{self.log()}")

    def _pump(self, process: subprocess.Popen[str], ready: threading.Event) -> None:
        assert process.stdout is not None
        with process.stdout:
            for line in process.stdout:
                self.server_log.append(line)
                if "flowserve ready" in line:
                    ready.set()

    def log(self) -> str:
        return "".join(self.server_log)

    def stop(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(signal.SIGTERM)
            try:
                self.server.wait(30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait(5)


def same(printed: str, shown: str, commands: str) -> None:
    """What the commands printed is what the page shows."""
    try:
        assert json.loads(printed) == json.loads(shown), (
            f"{commands}: printed\n{printed}\nthe page shows\n{shown}"
        )
        return
    except json.JSONDecodeError:
        pass
    assert printed.strip() == shown.strip(), f"{commands}: printed\n{printed}\nthe page shows\n{shown}"


def check_install_extras() -> None:
    """`make install` gives what the tutorial uses: ONNX Runtime, torch with onnxscript, tritonclient."""
    makefile = (ROOT / "Makefile").read_text()
    extras = re.search(r"^install:.*\n\t.*pip install -q -e '\.\[(\w+)\]'", makefile, re.M)
    assert extras is not None, "the Makefile's install target no longer installs one extra"
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    wanted = " ".join(optional[extras.group(1)])
    for extra in re.findall(r"flowserve\[([\w,-]+)\]", wanted):
        wanted += " " + " ".join(" ".join(optional[e]) for e in extra.split(","))
    for package in ("onnxruntime", "torch", "onnxscript", "tritonclient"):
        assert package in wanted, f"make install's extra {extras.group(1)!r} lacks {package}"
