"""``flowserve init``: the project it creates validates, serves and answers its own client."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flowserve import cli
from flowserve.scaffold import create_project, project_files
from tests.conftest import ROOT, free_port

EXPECTED = {
    "README.md",
    "client.py",
    "graphs/hello.yaml",
    "model_repository/scale/config.pbtxt",
    "model_repository/scale/1/model.py",
    "nodes/__init__.py",
    "nodes/hello.py",
}


def flowserve(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flowserve.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_init_writes_the_project(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert {str(p) for p in project_files()} == EXPECTED
    target = tmp_path / "demo"
    assert cli.main(["init", str(target)]) == 0
    assert {str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()} == EXPECTED
    out = capsys.readouterr().out
    assert f"created a flowserve project in {target}" in out
    assert f"cd {target}" in out and "flowserve serve" in out and "python client.py" in out


def test_init_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "client.py").write_text("mine")
    (tmp_path / "notes.txt").write_text("mine too")
    assert cli.main(["init", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"error: already there: {tmp_path / 'client.py'} (--force overwrites)\n"
    )
    assert (tmp_path / "client.py").read_text() == "mine"
    assert not (tmp_path / "graphs").exists()  # nothing written
    assert cli.main(["init", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "client.py").read_text() != "mine"
    assert (tmp_path / "notes.txt").read_text() == "mine too"


def test_init_in_the_current_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["init"]) == 0
    assert (tmp_path / "graphs" / "hello.yaml").is_file()


@pytest.mark.slow
def test_the_project_validates_serves_and_answers(tmp_path: Path) -> None:
    project = tmp_path / "hello"
    create_project(project)

    checked = flowserve("validate", cwd=project)  # no path: the current folder, loaded once
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout == "ok: 2 valid and loaded (scale, hello)\n"

    http, grpc = free_port(), free_port()
    cmd = [sys.executable, "-m", "flowserve.cli", "serve", ".", "--host", "127.0.0.1"]
    cmd += [f"--http-port={http}", f"--grpc-port={grpc}", "--metrics-port=-1"]
    proc = subprocess.Popen(cmd, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                lines.append(line)
                if "flowserve ready" in line or "flowserve not ready" in line:
                    ready.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 90
        while not ready.wait(0.1):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
        assert "flowserve ready" in "".join(lines), "".join(lines)
        answer = subprocess.run(
            [sys.executable, "client.py", "--url", f"127.0.0.1:{grpc}"],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert answer.returncode == 0, answer.stderr
        assert answer.stdout == "result: [[0.5, 1.0, 1.5, 2.0]]\n"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        reader.join(5)


def test_the_templates_ship_in_the_package_and_are_not_code() -> None:
    """Template files end in .tmpl, so linters and the type checker never read them as code, and
    pyproject's package-data puts every one of them in the wheel (built and checked by hand: 7)."""
    import tomllib

    package = ROOT / "flowserve" / "scaffold"
    files = [p for p in (package / "template").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert files and all(p.suffix == ".tmpl" for p in files)
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {p for pattern in patterns["flowserve.scaffold"] for p in package.glob(pattern)}
    assert set(files) <= shipped
