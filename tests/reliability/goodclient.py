"""What the attack-run tests share: a good client that keeps inferring ``simple`` while an
attack runs (:class:`Prober`: the slowest answer it saw must stay under
:func:`tests.pacing.prompt_bound` of its answers before the attack), and the server's resident
memory (:func:`rss`, over the server and its worker processes)."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import ServerProcess
from tests.pacing import prompt_bound

PROTOCOLS: dict[str, ModuleType] = {"http": httpclient, "grpc": grpcclient}
ROW = np.arange(16, dtype=np.int32).reshape(1, 16)
CALIBRATION = 5  # answers before the attack: the pace it is measured against


def connect(served: ServerProcess, protocol: str) -> Any:
    """A new tritonclient client (its own connection: with --workers 2, either worker)."""
    if protocol == "http":
        return httpclient.InferenceServerClient(served.http_url, network_timeout=120.0)
    return grpcclient.InferenceServerClient(served.grpc_url)


def good_inputs(module: ModuleType) -> list[Any]:
    """``simple``'s two INT32 [1, 16] inputs, both ``ROW``."""
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(ROW)
        inputs.append(tensor)
    return inputs


class Prober:
    """A good client inferring ``simple`` over and over on its own connection (from 127.0.0.1)
    while an attack runs: the slowest answer is what it saw. (Its client lives in its thread:
    tritonclient's HTTP client is gevent's, bound to the thread that made it.)"""

    def __init__(self, served: ServerProcess, protocol: str = "http") -> None:
        self.served = served
        self.protocol = protocol
        self.slowest = 0.0
        self.before = 0.0  # the slowest of the answers before the attack
        self.answers = 0
        self.errors: list[str] = []
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Prober:
        self._thread.start()
        assert self._ready.wait(60) and not self.errors, self.errors  # answered before the attack
        self.before, self.slowest, self.answers = self.slowest, 0.0, 0
        return self

    def bound(self) -> float:
        """The slowest answer a good client may see while the attack runs."""
        return prompt_bound(self.before)

    def _run(self) -> None:
        client = connect(self.served, self.protocol)
        inputs = good_inputs(PROTOCOLS[self.protocol])
        try:
            while True:
                started = time.monotonic()
                result = client.infer("simple", inputs)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ROW + ROW)
                self.slowest = max(self.slowest, time.monotonic() - started)
                self.answers += 1
                if self.answers >= CALIBRATION:
                    self._ready.set()
                if self._stop.wait(0.02):
                    return
        except Exception as exc:  # the server died, stalled or dropped it: the test says which
            self.errors.append(repr(exc))
            self._ready.set()
        finally:
            client.close()

    def __exit__(self, *exc: object) -> None:
        deadline = time.monotonic() + 10.0
        while self.answers < 2 and not self.errors and time.monotonic() < deadline:
            time.sleep(0.01)  # at least one answer while the attack ran, or its end
        self._stop.set()
        self._thread.join(30)
        assert not self.errors, self.errors
        assert self.answers > 1 and self.slowest < self.bound(), (self.answers, self.slowest, self.before)


def tree_pids(pid: int) -> list[int]:
    """The server and its worker processes."""
    pids = [pid]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                pids.append(int(entry.name))
    return pids


def rss(served: ServerProcess) -> int:
    """Resident bytes of the server and its workers."""
    total = 0
    for pid in tree_pids(served.process.pid):
        with contextlib.suppress(OSError):
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * 4096
    return total
