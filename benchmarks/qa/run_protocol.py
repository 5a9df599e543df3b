"""Run Triton 2.51's own qa suites L0_http (generate endpoint), L0_parameters and
L0_input_validation against flowserve (and, for comparison, against Triton 2.51 itself).

Nothing of Triton's qa is kept in this repository: the suites are taken from the mirror of
Triton's server repository at tag v2.51.0 at run time (``git archive``), into a scratch folder.
Each suite is set up as its ``test.sh`` sets it up, with these adaptations:

- the servers listen on 127.0.0.1 on free ports; ``localhost:8000``/``8001`` in the test files
  are rewritten to those ports (the machine is shared);
- the test files run under unittest's runner (as test.sh runs them), each subtest's result
  recorded;
- L0_parameters: the ``identity`` backend exists in neither flowserve nor the Triton of the
  ``nvidia-pytriton`` wheel (Python backend only), so the ensemble's ``identity`` step is a
  Python-backend stand-in with the same config (``model.py`` copying INPUT0 to OUTPUT0);
- L0_http: only the generate endpoint part (``generate_endpoint_test.py`` with its
  ``generate_models``); ``sseclient-py`` (what test.sh pip-installs) goes into
  ``benchmarks/.work/qa-deps`` and onto ``PYTHONPATH`` of the test run only;
- L0_input_validation: ``InputValTest`` as test.sh runs it; of ``InputShapeTest``, only
  ``test_input_shape_validation`` (a TorchScript ``pt_identity`` made as test.sh makes it) can
  run here: the other two need Triton's generated qa models (TensorFlow graphdef, TensorRT
  plans from /data/inferenceserver) and their backends; the C++ ``input_byte_size_test`` is
  not built here. Triton 2.51 of the wheel has no PyTorch backend, so it cannot run
  ``pt_identity`` either.

    python benchmarks/qa/run_protocol.py                      # flowserve, every suite
    python benchmarks/qa/run_protocol.py --server both        # and Triton 2.51, same run
    python benchmarks/qa/run_protocol.py --suite L0_parameters --keep
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from servers import ServerGroup, free_port, sigterm_as_interrupt  # noqa: E402
from triton_setup import find_triton  # noqa: E402

MIRROR = Path("/work/.mirror/triton-inference-server+server/repo")
TAG = "v2.51.0"
DEPS = BENCH / ".work" / "qa-deps"
COMMON = ("qa/common/test_util.py", "qa/common/infer_util.py", "qa/common/shm_util.py")

IDENTITY_MODEL = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
        return out
"""

PT_IDENTITY_CONFIG = """\
name: "pt_identity"
backend: "pytorch"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [8] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [8] } ]
dynamic_batching { max_queue_delay_microseconds: 1000000 }
"""


@dataclass
class Run:
    """One server start and the test selection run against it."""

    label: str
    repository: str  # relative to the suite folder
    tests: list[str]  # unittest names (module, module.Class, module.Class.test), in the suite folder
    server_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    only: str = ""  # "flowserve": Triton of the wheel cannot serve it (the result says why)


@dataclass
class Result:
    suite: str
    run: str
    server: str
    tests: dict[str, str] = field(default_factory=dict)  # test -> passed / failed / error / skipped
    note: str = ""


# ------------------------------------------------------------------ the suites


def setup_parameters(folder: Path) -> list[Run]:
    repo = folder / "model_repository"
    identity = repo / "identity"
    (identity / "1").mkdir(parents=True, exist_ok=True)
    (repo / "ensemble" / "1").mkdir(parents=True, exist_ok=True)
    config = (identity / "config.pbtxt").read_text()
    (identity / "config.pbtxt").write_text(config.replace('backend: "identity"', 'backend: "python"'))
    (identity / "1" / "model.py").write_text(IDENTITY_MODEL)
    runs = []
    patterns = {
        "test_params": [],
        "test_headers": ["my_header.*", "my_header.*"],
        "test_header_forward_pattern_case_insensitive": ["MY_HEADER.*", "MY_HEADER.*"],
        "test_grpc_header_forward_pattern_case_sensitive": ["(?-i)MY_HEADER.*"],
    }
    for name, pattern in patterns.items():
        args = ["--exit-timeout-secs=120"]
        if pattern:
            args.append(f"--grpc-header-forward-pattern={pattern[0]}")
        if len(pattern) > 1:
            args.append(f"--http-header-forward-pattern={pattern[1]}")
        runs.append(Run(name, "model_repository", ["parameters_test"], args, {"TEST_HEADER": name}))
    return runs


def setup_input_validation(folder: Path) -> list[Run]:
    runs = [Run("InputValTest", "models", ["input_validation_test.InputValTest"])]
    shape_repo = folder / "shape_models"
    target = shape_repo / "pt_identity"
    (target / "1").mkdir(parents=True, exist_ok=True)
    (target / "config.pbtxt").write_text(PT_IDENTITY_CONFIG)
    made = subprocess.run(
        [sys.executable, "-c",
         "import sys, torch; torch.jit.save(torch.jit.script(torch.nn.Identity()), sys.argv[1])",
         str(target / "1" / "model.pt")],
        capture_output=True, text=True,
    )  # fmt: skip
    if made.returncode == 0:
        runs.append(
            Run(
                "InputShapeTest",
                "shape_models",
                ["input_validation_test.InputShapeTest.test_input_shape_validation"],
                only="flowserve",
            )
        )
    return runs


def setup_http_generate(folder: Path) -> list[Run]:
    return [Run("generate_endpoint", "generate_models", ["generate_endpoint_test"])]


SUITES: dict[str, tuple[str, Callable[[Path], list[Run]]]] = {
    "L0_http": ("qa/L0_http", setup_http_generate),
    "L0_parameters": ("qa/L0_parameters", setup_parameters),
    "L0_input_validation": ("qa/L0_input_validation", setup_input_validation),
}
NOT_RUN = {
    "L0_input_validation": [
        "InputShapeTest::test_input_string_shape_validation (needs the TensorFlow graphdef qa model)",
        "InputShapeTest::test_wrong_input_shape_tensor_size (needs TensorRT plan qa models and a GPU)",
        "input_byte_size_test (a C++ test executable, not built here)",
    ],
    "L0_http": ["http_test.py, python_http_aio_test.py, restricted/basic-auth/plugin tests (not in scope)"],
}


# ------------------------------------------------------------------ running


def extract(workdir: Path, suite_path: str) -> None:
    archive = subprocess.run(
        ["git", "-C", str(MIRROR), "archive", TAG, suite_path, *COMMON], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(workdir)], input=archive, check=True)


def ensure_deps() -> None:
    if (DEPS / "sseclient.py").is_file():
        return
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--target", str(DEPS), "sseclient-py"],
        check=True,
    )  # fmt: skip


def point_at(originals: dict[Path, str], http_port: int, grpc_port: int) -> None:
    """The test files' fixed ports (8000 HTTP, 8001 gRPC) become this run's."""
    for path, text in originals.items():
        fixed = text.replace("localhost:8000", f"localhost:{http_port}")
        path.write_text(fixed.replace("localhost:8001", f"localhost:{grpc_port}"))


# runs unittest names (argv[2:]) and writes {test id: state} to argv[1]; the qa tests are
# unittest cases (some of whose base classes count results in ways only unittest's runner feeds)
UNITTEST = """
import json, sys, unittest
suite = unittest.defaultTestLoader.loadTestsFromNames(sys.argv[2:])
def ids(s):
    for t in s:
        yield from ids(t) if isinstance(t, unittest.TestSuite) else [t.id()]
states = {i: "passed" for i in ids(suite)}
result = unittest.TextTestRunner(verbosity=2).run(suite)
for kind, cases in (("failed", result.failures), ("error", result.errors), ("skipped", result.skipped)):
    for case, _ in cases:
        states[case.id()] = kind
json.dump(states, open(sys.argv[1], "w"), indent=1)
"""


def read_states(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    states: dict[str, str] = json.loads(path.read_text())
    return {name.split(".", 1)[1]: state for name, state in states.items()}


@contextmanager
def server_for(
    group: ServerGroup, server: str, repository: Path, args: list[str], http: int, grpc: int
) -> Iterator[None]:
    if server == "flowserve":
        command = [
            sys.executable, "-m", "flowserve.cli", "serve", "--host", "127.0.0.1",
            f"--http-port={http}", f"--grpc-port={grpc}", "--metrics-port=-1",
            "--model-repository", str(repository), *args,
        ]  # fmt: skip
        env = None
    else:
        install = find_triton()
        if install is None:
            raise RuntimeError("Triton 2.51 is not set up: python benchmarks/triton_setup.py")
        command = [*install.command(repository, http, grpc), *args]
        env = install.env()
    started = group.start(server, command, http, grpc, env=env)
    try:
        yield
    finally:
        started.stop()


def run_suite(suite: str, server: str, scratch: Path, logs: Path) -> list[Result]:
    suite_path, setup = SUITES[suite]
    workdir = scratch / f"{suite}-{server}"
    workdir.mkdir(parents=True)
    extract(workdir, suite_path)
    folder = workdir / suite_path
    originals = {path: path.read_text() for path in folder.glob("*.py")}
    results = []
    for run in setup(folder):
        if run.only and run.only != server:
            results.append(Result(suite, run.label, server, note=f"not run: only {run.only} can serve it"))
            continue
        http, grpc = free_port(), free_port()
        point_at(originals, http, grpc)
        report = folder / f"report-{run.label}.json"
        env = dict(os.environ, **run.env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(DEPS), env.get("PYTHONPATH", "")) if p)
        result = Result(suite, run.label, server)
        with ServerGroup(logs / f"{suite}-{run.label}") as group:
            try:
                client_log = logs / f"{suite}-{run.label}" / "client.log"
                with (
                    server_for(group, server, folder / run.repository, run.server_args, http, grpc),
                    client_log.open("wb") as out,
                ):
                    subprocess.run(
                        [sys.executable, "-c", UNITTEST, str(report), *run.tests],
                        cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=900,
                    )  # fmt: skip
            except RuntimeError as exc:  # the server did not start
                result.note = str(exc)
        result.tests = read_states(report)
        results.append(result)
    for path, text in originals.items():  # as fetched, for a person who reruns them (--keep)
        path.write_text(text)
    return results


def show(results: list[Result]) -> None:
    for result in results:
        passed = sum(1 for s in result.tests.values() if s == "passed")
        head = f"{result.suite} / {result.run} / {result.server}: {passed}/{len(result.tests)} passed"
        print(head + (f"  ({result.note})" if result.note else ""))
        for test, state in sorted(result.tests.items()):
            print(f"    {state:8} {test}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--suite", action="append", choices=sorted(SUITES), help="default: all")
    parser.add_argument("--server", choices=("flowserve", "triton", "both"), default="flowserve")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (printed)")
    parser.add_argument("--output", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    suites = args.suite or list(SUITES)
    servers = ["flowserve", "triton"] if args.server == "both" else [args.server]
    ensure_deps()
    scratch = Path(tempfile.mkdtemp(prefix="flowserve-qa-"))
    results: list[Result] = []
    try:
        with sigterm_as_interrupt():
            for suite in suites:
                for server in servers:
                    results += run_suite(suite, server, scratch, scratch / "logs")
    finally:
        show(results)
        for suite in suites:
            for what in NOT_RUN.get(suite, []):
                print(f"{suite}: not run here: {what}")
        if args.output:
            args.output.write_text(json.dumps([vars(r) for r in results], indent=2) + "\n")
        if args.keep:
            print(f"scratch folder (servers' logs under logs/): {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
