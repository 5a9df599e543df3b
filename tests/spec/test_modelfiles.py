"""A version directory without the file its backend opens is told before anything loads."""

from pathlib import Path

from flowserve.spec.modelfiles import missing_model_files
from flowserve.spec.repository import scan_repository

CONFIG = """
backend: "{backend}"
max_batch_size: 0
input [ {{ name: "x", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "y", data_type: TYPE_FP32, dims: [ 1 ] }} ]
{extra}
"""


def model(repo: Path, name: str, backend: str, files: list[str], extra: str = "") -> Path:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(backend=backend, extra=extra))
    for file in files:
        (repo / name / "1" / file).write_text("")
    return repo / name / "config.pbtxt"


def messages(repo: Path) -> list[str]:
    scan = scan_repository(repo)
    assert not scan.issues, scan.issues
    return [str(i) for i in missing_model_files(scan.models.values())]


def test_present_files_pass(tmp_path: Path) -> None:
    model(tmp_path, "a", "onnxruntime", ["model.onnx"])
    model(tmp_path, "b", "python", ["model.py"])
    model(tmp_path, "c", "pytorch", ["model.pt2"])  # torch.export's file counts too
    model(tmp_path, "d", "onnxruntime", ["net.onnx"], 'default_model_filename: "net.onnx"')
    model(tmp_path, "e", "fil", ["xgboost.json"])  # found by the backend's own rules: not checked
    assert messages(tmp_path) == []


def test_a_renamed_file_is_named_with_the_likely_one(tmp_path: Path) -> None:
    config = model(tmp_path, "a", "onnxruntime", ["classifier.onnx", "labels.txt"])
    assert messages(tmp_path) == [
        f"{config}: model 'a' version 1: no model file 1/model.onnx (did you mean 'classifier.onnx'? "
        "rename it to model.onnx or set default_model_filename)"
    ]


def test_a_wrong_default_model_filename(tmp_path: Path) -> None:
    config = model(tmp_path, "a", "onnxruntime", ["net.onnx"], 'default_model_filename: "nett.onnx"')
    assert messages(tmp_path) == [
        f"{config}: field 'default_model_filename': model 'a' version 1: no model file 1/nett.onnx "
        "(did you mean 'net.onnx'? fix default_model_filename)"
    ]


def test_an_empty_or_unrelated_version_directory(tmp_path: Path) -> None:
    model(tmp_path, "a", "python", [])
    model(tmp_path, "b", "python", ["weights.bin"])
    assert messages(tmp_path) == [
        f"{tmp_path / 'a' / 'config.pbtxt'}: model 'a' version 1: no model file 1/model.py "
        "(the version directory is empty)",
        f"{tmp_path / 'b' / 'config.pbtxt'}: model 'b' version 1: no model file 1/model.py "
        "(the version directory holds: weights.bin)",
    ]
