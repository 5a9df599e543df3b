"""`flowserve validate` and `flowserve graph list` as a user runs them; the process defaults `main` sets."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flowserve.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_validate_bundled_content_is_clean() -> None:
    result = run("validate", "graphs/", "model_repository/")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: ")
    for name in ("simple", "simple_ensemble", "fanout", "route"):
        assert name in result.stdout


def test_validate_lists_every_error_with_file_node_field(tmp_path: Path) -> None:
    bad = tmp_path / "graphs"
    bad.mkdir()
    (bad / "cycle.yaml").write_text(
        """
inputs: {x: {datatype: INT32, dims: [16]}}
outputs: {y: b.y}
nodes:
  a: {python: "nodes.arith:Scale", inputs: {x: b.y}}
  b: {python: "nodes.arith:Scale", inputs: {x: a.y}}
"""
    )
    (bad / "dangling.yaml").write_text(
        """
inputs: {x: {datatype: INT32, dims: [16]}}
outputs: {y: a.y}
nodes:
  a: {python: "nodes.arith:Scale", inputs: {x: ghost.out}}
"""
    )
    (bad / "dtype.yaml").write_text(
        """
max_batch_size: 8
inputs: {a: {datatype: FP32, dims: [16]}, b: {datatype: INT32, dims: [16]}}
outputs: {s: m.OUTPUT0, d: m.OUTPUT1}
nodes:
  m: {model: simple, inputs: {INPUT0: $a, INPUT1: $b}}
"""
    )
    result = run("validate", str(bad), "model_repository/")
    assert result.returncode == 1
    err = result.stderr
    assert f"{bad / 'cycle.yaml'}: node 'a': field 'inputs': cycle: a -> b -> a" in err
    assert f"{bad / 'dangling.yaml'}: node 'a': field 'inputs.x': references unknown node 'ghost'" in err
    assert (
        f"{bad / 'dtype.yaml'}: node 'm': field 'inputs.INPUT0': datatype mismatch: '$a' is FP32 "
        "but the input expects INT32" in err
    )
    # the cycle also leaves x unused and y untyped: every problem is listed, not just the first
    assert f"{bad / 'cycle.yaml'}: field 'inputs.x': graph input 'x' is used by no node" in err
    assert "7 error(s);" in err


def test_validate_reports_repository_errors(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text("max_batch_size: nope")
    result = run("validate", str(repo))
    assert result.returncode == 1
    assert f"{repo / 'm' / 'config.pbtxt'}: cannot parse config.pbtxt" in result.stderr


def test_graph_list() -> None:
    result = run("graph", "list")
    assert result.returncode == 0, result.stderr
    lines = dict(line.split("\t", 1) for line in result.stdout.splitlines())
    assert lines["route"].startswith("flowserve_graph\tgate(switch), shrink(python), keep(python)")
    assert lines["simple_ensemble"].startswith("ensemble\tsimple(model), simple_1(model)")


def test_openmp_threads_wait_passively_unless_the_user_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    from flowserve.cli import cpu_thread_defaults

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    cpu_thread_defaults()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    cpu_thread_defaults()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_main_fixes_glibc_malloc_thresholds_unless_the_user_set_one() -> None:
    """What ``main`` leaves in the environment is what ``--workers``' processes start with
    (flowserve/dataplane/memory.py)."""
    script = (
        "import contextlib, io, os\n"
        "from flowserve.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['graph', 'list'])\n"
        "print(os.environ.get('MALLOC_MMAP_THRESHOLD_'), os.environ.get('MALLOC_TRIM_THRESHOLD_'))\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}

    def thresholds(**env: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", script],
            cwd=ROOT,
            env={**clean, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert thresholds() == f"{32 << 20} {32 << 20}"
    assert thresholds(MALLOC_TRIM_THRESHOLD_="65536") == "None 65536"
