"""``flowserve validate`` tells what serve would find: missing model files, an ``initialize``
that raises, one error per typo, with the same PATH defaults as serve."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flowserve.scaffold import create_project
from tests.conftest import ROOT


def validate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flowserve.cli", "validate", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    create_project(root)
    return root


def replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_a_project_by_position_or_as_the_current_folder(project: Path, tmp_path: Path) -> None:
    assert validate(str(project), cwd=tmp_path).stdout == "ok: 2 valid and loaded (scale, hello)\n"
    assert validate(cwd=project).stdout == "ok: 2 valid and loaded (scale, hello)\n"
    assert validate("--no-load", cwd=project).stdout == "ok: 2 valid (scale, hello)\n"


def test_a_missing_path_is_one_line(tmp_path: Path) -> None:
    done = validate(str(tmp_path / "nowhere"), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == f"error: {tmp_path / 'nowhere'}: no such file or directory\n"


def test_a_renamed_model_file(project: Path) -> None:
    shutil.copytree(ROOT / "model_repository" / "onnx_classifier", project / "model_repository" / "clf")
    version = project / "model_repository" / "clf" / "1"
    (version / "model.onnx").rename(version / "classifier.onnx")
    replace(project / "model_repository" / "clf" / "config.pbtxt", 'name: "onnx_classifier"', "")
    expected = (
        "error: model_repository/clf/config.pbtxt: model 'clf' version 1: no model file 1/model.onnx "
        "(did you mean 'classifier.onnx'? rename it to model.onnx or set default_model_filename)\n"
    )
    for args in ([], ["--no-load"]):
        done = validate(*args, cwd=project)
        assert done.returncode == 1
        assert done.stderr.startswith(expected), done.stderr
        assert done.stderr.count("error:") == 1, done.stderr  # not reported again by the load


def test_a_node_whose_initialize_raises(project: Path) -> None:
    node = project / "nodes" / "hello.py"
    replace(
        node,
        "        self.floor = float(",
        '        raise RuntimeError("no weights")\n        self.floor = float(',
    )
    assert validate("--no-load", cwd=project).returncode == 0  # reading alone cannot tell
    done = validate(cwd=project)
    assert done.returncode == 1
    error, summary = done.stderr.splitlines()
    assert error.startswith(
        "error: graphs/hello.yaml: graph 'hello' failed to load: node 'normalize' failed to start: "
        "RuntimeError: no weights"
    )
    assert str(node.resolve()) in error  # and where it was raised
    assert summary == "1 error(s); 1 valid and loaded: scale"


def test_a_model_whose_initialize_raises_blocks_its_graph(project: Path) -> None:
    model = project / "model_repository" / "scale" / "1" / "model.py"
    replace(model, "        self.factor = ", '        raise ValueError("bad factor")\n        self.factor = ')
    done = validate(cwd=project)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert lines[0].startswith(
        "error: model_repository/scale/config.pbtxt: model 'scale' version 1 failed to load: "
    )
    assert "ValueError: bad factor" in lines[0]
    # the graph that uses it is not an error of its own
    assert lines[1:] == ["not loaded, as they use what failed: hello", "1 error(s); 0 valid and loaded: none"]


def test_a_missing_model_file_blocks_the_graph_using_it_when_only_reading(project: Path) -> None:
    (project / "model_repository" / "scale" / "1" / "model.py").unlink()
    for args, verb in (([], "loaded"), (["--no-load"], "valid")):
        done = validate(*args, cwd=project)
        assert done.returncode == 1
        lines = done.stderr.splitlines()
        assert lines[0].startswith("error: model_repository/scale/config.pbtxt: model 'scale' version 1: "), (
            lines
        )
        what = "valid and loaded" if verb == "loaded" else "valid"
        assert lines[1:] == [f"not {verb}, as they use what failed: hello", f"1 error(s); 0 {what}: none"]


def test_one_typo_is_one_error_end_to_end(project: Path) -> None:
    """The new user's case: a misspelled output left 'pre' looking unused and 'result' untyped."""
    replace(project / "graphs" / "hello.yaml", "inputs: {x: normalize.x}", "inputs: {x: normalize.xx}")
    done = validate(cwd=project)
    assert done.returncode == 1
    assert done.stderr == (
        "error: graphs/hello.yaml: node 'scale': field 'inputs.x': node 'normalize' has no output 'xx' "
        "(did you mean 'x'?) (outputs: x)\n"
        "1 error(s); 1 valid and loaded: scale\n"
    )
