"""Triton's perf_analyzer (the C++ binary) against flowserve over gRPC and HTTP: a short
measurement must finish with no error and show the server-side statistics it reads from the
statistics extension (queue and compute split, composing models of an ensemble).

Skipped when the binary is not available: ``python benchmarks/perf_analyzer_setup.py`` fetches
it into benchmarks/.work (two pip downloads, a few seconds).
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


def _find() -> Path | None:
    spec = importlib.util.spec_from_file_location(
        "perf_analyzer_setup", ROOT / "benchmarks" / "perf_analyzer_setup.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found: Path | None = module.find_perf_analyzer()
    return found


PERF_ANALYZER = _find()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        PERF_ANALYZER is None,
        reason="perf_analyzer is not available: run `python benchmarks/perf_analyzer_setup.py` "
        "(fetches it from PyPI into benchmarks/.work) or set PERF_ANALYZER",
    ),
]


def run_perf_analyzer(url: str, protocol: str, model: str) -> subprocess.CompletedProcess[str]:
    assert PERF_ANALYZER is not None
    cmd = [str(PERF_ANALYZER), "-m", model, "-u", url, "-i", protocol]
    # short windows; a loose stability bound so that two shared cores settle within the trials
    cmd += ["-p", "500", "--concurrency-range", "1:2", "-s", "100", "-r", "10"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)


@pytest.mark.parametrize("model", ["simple", "simple_ensemble"])
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_analyzer(server: Any, protocol: str, model: str) -> None:
    port = server.grpc_port if protocol == "grpc" else server.http_port
    if port < 0:
        pytest.skip(
            f"the {protocol} front end is not running in this test session (FLOWSERVE_TEST_LISTENERS)"
        )
    done = run_perf_analyzer(f"127.0.0.1:{port}", protocol, model)
    report = f"exit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert done.returncode == 0, report
    assert not any(
        "error" in line.lower() or "failed" in line.lower() for line in done.stderr.splitlines()
    ), report
    out = done.stdout
    for concurrency in (1, 2):
        assert f"Request concurrency: {concurrency}" in out, report
    assert out.count("Server:") == 2, report
    assert "Successful request count:" in out and "Inference count:" in out, report
    assert "queue" in out and "compute" in out, report
    assert "throughput:" in out, report
    if model == "simple_ensemble":
        assert "Composing models:" in out and "simple, version: 1" in out, report
    else:
        assert "compute infer" in out, report


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_analyzer_system_shared_memory(server: Any, protocol: str) -> None:
    """perf_analyzer's ``--shared-memory system`` mode: inputs and outputs in regions it
    registers; every output's raw entry must be in the gRPC response even when all outputs are
    in shared memory (its C++ client indexes them unchecked: a missing entry crashed it)."""
    port = server.grpc_port if protocol == "grpc" else server.http_port
    if port < 0:
        pytest.skip(f"the {protocol} front end is not running in this test session")
    assert PERF_ANALYZER is not None
    cmd = [str(PERF_ANALYZER), "-m", "simple", "-u", f"127.0.0.1:{port}", "-i", protocol]
    cmd += ["--shared-memory", "system", "--output-shared-memory-size", "1024"]
    cmd += ["-p", "500", "--concurrency-range", "1:2", "-s", "100", "-r", "10"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    report = f"exit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert done.returncode == 0, report
    assert "Thread [" not in done.stdout + done.stderr, report  # a worker's request error
    assert "Successful request count:" in done.stdout and "throughput:" in done.stdout, report
