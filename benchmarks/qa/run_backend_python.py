"""Triton 2.51's own qa suites for the python backend (qa/L0_backend_python), run against flowserve.

Nothing of Triton's is kept in this repository: the qa files are taken from the mirrored server
repository at tag v2.51.0 (and python_backend's examples at r24.10) at run time. Each suite's
model repository is set up as its ``test.sh`` does; ``flowserve serve`` takes tritonserver's
place; the suite's unittest files run one test at a time (a hang is a failure after
``--timeout`` seconds, not a stuck run), and the server-log checks its test.sh makes are made
too. Each server and its tests run in a private network namespace (``unshare -rn``), so the
fixed ports 8000/8001 the suites use never meet another server on this machine. The venv's
torch (a CPU build) serves the models that import it; what needs CUDA is reported as "cannot run
here". A stage whose tests need Triton's own client release (python_test's BF16 test sends FP32
data as BF16, refused by tritonclient since r26.06) gets it pip-installed under
``benchmarks/.work`` onto its tests' ``PYTHONPATH`` (the server keeps the venv's).

    .venv/bin/python benchmarks/qa/run_backend_python.py                 # every suite
    .venv/bin/python benchmarks/qa/run_backend_python.py response_sender decoupled
    .venv/bin/python benchmarks/qa/run_backend_python.py --list

Prints one line per subtest (PASS / FAIL / HANG / SKIP with why) and a table per suite.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER_MIRROR = Path("/work/.mirror/triton-inference-server+server/repo")
BACKEND_MIRROR = Path("/work/.mirror/triton-inference-server+python_backend/repo")
TAG = "v2.51.0"
BACKEND_BRANCH = "r24.10"
PYTHON = str(ROOT / ".venv" / "bin" / "python")


# ------------------------------------------------------------------ what each suite does


@dataclass
class Stage:
    """One server start of a suite: its models, its tests, the log lines it must show."""

    name: str
    setup: Callable[[Path, Path], None]  # (suite dir, qa dir)
    tests: list[str] = field(default_factory=list)  # pytest files or file::Class::test ids
    scripts: list[str] = field(default_factory=list)  # python files run as programs
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    repo: str = "models"
    expect_start: bool = True  # False: the server must refuse to start (a model fails to load)
    log_has: list[str] = field(default_factory=list)
    log_count: dict[str, int] = field(default_factory=dict)
    # tests that cannot run here, and why (they are reported, not run)
    cannot: dict[str, str] = field(default_factory=dict)
    log: str = ""  # the server log's name in the suite's folder, where a test reads it by name
    # the tests' tritonclient, where the venv's newer one refuses what the suite sends (test.sh
    # pip-installs the client of its own release); the server keeps the venv's
    client: str = ""


def copy_model(
    qa: Path, models: Path, src: str, name: str | None = None, model_file: str = "model.py"
) -> Path:
    """``mkdir -p models/<name>/1 && cp python_models/<src>/model.py ... config.pbtxt``."""
    name = name or src
    version = models / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    source = qa / "python_models" / src
    shutil.copy(source / model_file, version / "model.py")
    if (source / "config.pbtxt").exists():
        shutil.copy(source / "config.pbtxt", models / name / "config.pbtxt")
    return models / name


def edit_config(model: Path, name: str | None = None, append: str = "", **subs: str) -> None:
    path = model / "config.pbtxt"
    text = path.read_text()
    if name is not None:
        text = re.sub(r"(?m)^name:.*", f'name: "{name}"', text)
    for old, new in subs.items():
        text = re.sub(old, new, text)
    path.write_text(text + ("\n" + append + "\n" if append else ""))


def fresh(suite: Path, folder: str = "models") -> Path:
    models = suite / folder
    shutil.rmtree(models, ignore_errors=True)
    models.mkdir(parents=True)
    return models


def backend_example(path: str, dest: Path) -> None:
    """A file of python_backend's examples at the release branch (test.sh clones the repo)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        ["git", "-C", str(BACKEND_MIRROR), "show", f"{BACKEND_BRANCH}:{path}"],
        capture_output=True,
        check=True,
    )
    dest.write_bytes(out.stdout)


# torch (CPU build) is in the venv; what cannot run here is what needs a GPU
GPU = "needs a GPU (CUDA tensors / KIND_GPU)"


def response_sender_models(suite: Path, qa: Path) -> None:
    models = fresh(suite)
    src = qa / "python_models" / "response_sender"
    variants = {
        "response_sender": ("model.py", ""),
        "response_sender_decoupled": ("model.py", "model_transaction_policy { decoupled: True }"),
        "response_sender_async": ("model_async.py", ""),
        "response_sender_decoupled_async": ("model_async.py", "model_transaction_policy { decoupled: True }"),
        "response_sender_batching": ("model.py", "dynamic_batching { max_queue_delay_microseconds: 500000 }"),
        "response_sender_decoupled_batching": (
            "model.py",
            "model_transaction_policy { decoupled: True }\n"
            "dynamic_batching { max_queue_delay_microseconds: 500000 }",
        ),
        "response_sender_async_batching": (
            "model_async.py",
            "dynamic_batching { max_queue_delay_microseconds: 500000 }",
        ),
        "response_sender_decoupled_async_batching": (
            "model_async.py",
            "model_transaction_policy { decoupled: True }\n"
            "dynamic_batching { max_queue_delay_microseconds: 500000 }",
        ),
    }
    for name, (model_file, extra) in variants.items():
        version = models / name / "1"
        version.mkdir(parents=True)
        shutil.copy(src / "model_common.py", version)
        shutil.copy(src / model_file, version / "model.py")
        shutil.copy(src / "config.pbtxt", models / name)
        if extra:
            edit_config(models / name, append=extra)


def complete_final_models(suite: Path, qa: Path) -> None:
    models = fresh(suite)
    copy_model(qa, models, "response_sender_complete_final")


def decoupled_models(suite: Path, qa: Path) -> None:
    models = suite / "models"  # the suite's own models stay; test.sh adds these
    copy_model(qa, models, "identity_fp32")
    cancel = copy_model(qa, models, "execute_cancel")
    edit_config(cancel, append="model_transaction_policy { decoupled: True }")
    backend_example("examples/decoupled/square_model.py", models / "square_int32" / "1" / "model.py")
    backend_example("examples/decoupled/square_config.pbtxt", models / "square_int32" / "config.pbtxt")
    copy_model(qa, models, "dlpack_add_sub")


def io_models(trial: str) -> Callable[[Path, Path], None]:
    def setup(suite: Path, qa: Path) -> None:
        models = fresh(suite)
        src = "dlpack_io_identity" if trial == "default" else "dlpack_io_identity_decoupled"
        for i in (1, 2, 3):
            edit_config(
                copy_model(qa, models, src, f"dlpack_io_identity_{i}"), name=f"dlpack_io_identity_{i}"
            )
        (models / "ensemble_io" / "1").mkdir(parents=True)
        shutil.copy(qa / "python_models" / "ensemble_io" / "config.pbtxt", models / "ensemble_io")

    return setup


def io_requested_output_models(suite: Path, qa: Path) -> None:
    models = fresh(suite)
    copy_model(qa, models, "add_sub")
    copy_model(qa, models, "dlpack_io_identity_decoupled")


def lifecycle_models(suite: Path, qa: Path) -> None:
    models = fresh(suite)
    copy_model(qa, models, "error_code")
    copy_model(qa, models, "execute_cancel")
    edit_config(
        copy_model(qa, models, "execute_error"),
        name="execute_error",
        append="dynamic_batching { preferred_batch_size: [8], max_queue_delay_microseconds: 12000000 }",
        **{r"(?m)^max_batch_size:.*": "max_batch_size: 8"},
    )
    edit_config(
        copy_model(qa, models, "execute_grpc_error"),
        name="execute_grpc_error",
        append="dynamic_batching { preferred_batch_size: [8], max_queue_delay_microseconds: 1200000 }",
        **{r"(?m)^max_batch_size:.*": "max_batch_size: 8"},
    )
    copy_model(qa, models, "execute_return_error")
    edit_config(copy_model(qa, models, "wrong_model"), name="wrong_model", TYPE_FP32="TYPE_UINT32")


def one_model(src: str, folder: str = "models", config: bool = True) -> Callable[[Path, Path], None]:
    def setup(suite: Path, qa: Path) -> None:
        models = fresh(suite, folder)
        model = copy_model(qa, models, src)
        if not config:
            (model / "config.pbtxt").unlink(missing_ok=True)

    return setup


def bls_models(suite: Path, qa: Path) -> None:
    models = fresh(suite)
    for src in (
        "bls", "dlpack_add_sub", "bls_async", "bls_memory", "bls_memory_async", "add_sub", "execute_error",
        "identity_fp32", "dlpack_identity", "dlpack_square", "identity_fp32_timeout",
    ):  # fmt: skip
        copy_model(qa, models, src)
    backend_example("examples/decoupled/square_model.py", models / "square_int32" / "1" / "model.py")
    backend_example("examples/decoupled/square_config.pbtxt", models / "square_int32" / "config.pbtxt")


def rescheduling_models(suite: Path, qa: Path) -> None:
    models = fresh(suite)
    for src in (
        "bls_request_rescheduling",
        "request_rescheduling_addsub",
        "iterative_sequence",
        "wrong_return_type",
    ):
        copy_model(qa, models, src)


def python_test_models(suite: Path, qa: Path) -> None:
    models = fresh(suite)
    copy_model(qa, models, "identity_fp32")
    copy_model(qa, models, "identity_bf16")


SHM_LEAK = "../test_infer_shm_leak.py"


def bls_stages() -> list[Stage]:
    """test.sh runs test_infer_shm_leak.py once per BLS model (MODEL_NAME) and kind."""
    stages: list[Stage] = []
    for kind in ("non_decoupled", "decoupled"):
        stages.append(
            Stage(
                f"bls_{kind}",
                bls_models,
                [f"{SHM_LEAK}@{m}" for m in ("bls", "bls_memory", "bls_memory_async", "bls_async")],
                env={"BLS_KIND": kind},
                cannot={m: GPU + f" ({m}'s own tests put tensors on CUDA)" for m in ("bls", "bls_async")},
            )
        )
    stages.append(
        Stage(
            "bls_init_error",
            one_model("bls_init_error"),
            expect_start=False,
            log_has=["BLS is only supported during the 'execute' function."],
        )
    )
    stages.append(
        Stage(
            "bls_finalize_error",
            one_model("bls_finalize_error"),
            log_has=["BLS is only supported during the 'execute' function."],
        )
    )
    stages.append(
        Stage(
            "bls_parameters",
            one_model("bls_parameters", folder="params_models"),
            scripts=["bls_parameters_test.py"],
            repo="params_models",
        )
    )
    return stages


SUITES: dict[str, list[Stage]] = {
    "response_sender": [
        Stage("response_sender", response_sender_models, ["response_sender_test.py"]),
        Stage("complete_final", complete_final_models, ["response_sender_complete_final_test.py"]),
    ],
    "decoupled": [
        Stage(
            "decoupled",
            decoupled_models,
            ["decoupled_test.py"],
            log_has=["Specific Msg!", "Info Msg!", "Warning Msg!", "Error Msg!"],
            log_count={"Finalize invoked": 3, "Finalize complete...": 3},
            log="decoupled_server.log",
            cannot={"test_decoupled_bls": GPU + " (decoupled_bls runs its GPU BLS test: .to('cuda'))"},
        ),
    ],
    "io": [
        Stage(
            "ensemble_io_default",
            io_models("default"),
            ["io_test.py::IOTest::test_ensemble_io"],
            env={"TRIAL": "default"},
            cannot={
                "test_ensemble_io": GPU + " (every GPU_OUTPUT combination: dlpack_io_identity uses CUDA)"
            },
        ),
        Stage(
            "ensemble_io_decoupled",
            io_models("decoupled"),
            ["io_test.py::IOTest::test_ensemble_io"],
            env={"TRIAL": "decoupled"},
            cannot={
                "test_ensemble_io": GPU
                + " (every GPU_OUTPUT combination: dlpack_io_identity_decoupled uses CUDA)"
            },
        ),
        Stage(
            "empty_gpu_output",
            one_model("dlpack_empty_output"),
            ["io_test.py::IOTest::test_empty_gpu_output"],
            cannot={"test_empty_gpu_output": GPU},
        ),
        Stage(
            "variable_gpu_output",
            one_model("variable_gpu_output"),
            ["io_test.py::IOTest::test_variable_gpu_output"],
            cannot={"test_variable_gpu_output": GPU},
        ),
        Stage(
            "requested_output",
            io_requested_output_models,
            [
                "io_test.py::IOTest::test_requested_output_default",
                "io_test.py::IOTest::test_requested_output_decoupled",
            ],
            cannot={
                "test_requested_output_decoupled": GPU
                + " (its GPU_OUTPUT input is random: about every other run moves OUTPUT0 to CUDA)"
            },
        ),
    ],
    "lifecycle": [
        Stage("lifecycle", lifecycle_models, ["lifecycle_test.py"], log="lifecycle_server.log"),
        Stage(
            "init_error",
            one_model("init_error"),
            expect_start=False,
            log_has=["name 'lorem_ipsum' is not defined"],
        ),
        Stage("fini_error", one_model("fini_error"), log_has=["name 'undefined_variable' is not defined"]),
        Stage(
            "auto_complete_error",
            one_model("auto_complete_error", config=False),
            args=["--strict-model-config", "false"],
            expect_start=False,
            log_has=["name 'undefined_variable' is not defined"],
        ),
    ],
    "bls": bls_stages(),
    "request_rescheduling": [
        Stage(
            "request_rescheduling",
            rescheduling_models,
            [f"{SHM_LEAK}@bls_request_rescheduling", "grpc_endpoint_test.py"],
            args=["--model-control-mode", "explicit", "--load-model", "*"],
        ),
    ],
    "python_test": [
        Stage(
            "bf16",
            python_test_models,
            ["python_test.py::PythonTest::test_bf16"],  # run where test.sh runs it (../common)
            # it sends FP32 data as BF16, which tritonclient refuses since r26.06
            client="2.51.0",
        ),
    ],
}


# ------------------------------------------------------------------ running a stage


@dataclass
class Result:
    suite: str
    test: str
    outcome: str  # PASS FAIL HANG SKIP
    detail: str = ""


def fetch_qa(work: Path) -> Path:
    for part in ("qa/L0_backend_python", "qa/python_models", "qa/common"):
        archive = subprocess.Popen(
            ["git", "-C", str(SERVER_MIRROR), "archive", TAG, part],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        subprocess.run(["tar", "-x", "-C", str(work)], stdin=archive.stdout, check=True)
        archive.wait()  # (qa/common holds a symlink git cannot archive: what came before it is enough)
    # the qa leak probe watches the python backend's shared-memory regions through a C module
    # built with Triton; flowserve's in-process python backend makes no such regions
    (work / "qa" / "common" / "triton_shm_monitor.py").write_text(
        '"""Stand-in: flowserve makes no triton_python_backend_shm_region_* regions."""\n\n'
        "class SharedMemoryManager:\n"
        "    def __init__(self, name):\n"
        "        self.name = name\n\n"
        "    def free_memory(self):\n"
        "        return 0\n"
    )
    return work / "qa"


def client_path(version: str) -> str:
    """A folder holding tritonclient ``version`` (its dependencies are the venv's), installed
    with pip on first use, for the tests' ``PYTHONPATH``."""
    folder = ROOT / "benchmarks" / ".work" / f"qa-tritonclient-{version}"
    if not (folder / "tritonclient").is_dir():
        subprocess.run(
            [PYTHON, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--target", str(folder), f"tritonclient=={version}"],
            check=True,
        )  # fmt: skip
    return str(folder)


def wait_ready(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen("http://localhost:8000/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # as kill_server: a graceful stop (finalize runs)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def collect(suite_dir: Path, target: str) -> list[str]:
    out = subprocess.run(
        [PYTHON, "-m", "pytest", "--collect-only", "-q", target],
        cwd=suite_dir,
        capture_output=True,
        text=True,
    )
    path = target.split("::")[0]  # ids come relative to pytest's rootdir: name the file as given
    return [
        path + "::" + line.strip().split("::", 1)[1]
        for line in out.stdout.splitlines()
        if "::" in line and not line.startswith("=")
    ]


def run_test(suite_dir: Path, test_id: str, env: dict[str, str], timeout: float) -> tuple[str, str]:
    try:
        out = subprocess.run(
            [PYTHON, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", test_id],
            cwd=suite_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return "HANG", f"no answer within {timeout:.0f} s"
    text = out.stdout + out.stderr
    if out.returncode == 0:
        skipped = re.search(r"\d+ skipped", text) and not re.search(r"\d+ passed", text)
        return ("SKIP", "skipped by the test itself") if skipped else ("PASS", "")
    errors = [ln[1:].strip() for ln in text.splitlines() if re.match(r"^E\s", ln)]
    if not errors:
        errors = [ln.strip() for ln in text.strip().splitlines()[-4:]]
    return "FAIL", " | ".join(errors[:4])[:500]


def run_stage(suite: str, stage: Stage, qa: Path, timeout: float, logs: Path) -> list[Result]:
    suite_dir = qa / "L0_backend_python" / suite if suite != "python_test" else qa / "L0_backend_python"
    suite_dir.mkdir(parents=True, exist_ok=True)
    stage.setup(suite_dir, qa)
    log_path = suite_dir / stage.log if stage.log else logs / f"{suite}.{stage.name}.server.log"
    env = dict(os.environ, **stage.env, SERVER_LOG=str(log_path))
    if not stage.expect_start:  # test.sh waits for tritonserver to exit (its --exit-on-error default)
        stage.args = [*stage.args, "--exit-on-error", "true"]
    cmd = [
        str(ROOT / ".venv" / "bin" / "flowserve"),
        "serve",
        "--model-repository",
        str(suite_dir / stage.repo),
        "--http-port",
        "8000",
        "--grpc-port",
        "8001",
        "--metrics-port",
        "8002",
        "--log-verbose",
        "1",
        *stage.args,
    ]
    results: list[Result] = []
    named = [t.split("::")[-1] for t in stage.tests]
    if named and all(n in stage.cannot for n in named) and not (stage.scripts or stage.log_has):
        # nothing here can run: no server start (its models need what is missing too)
        return [Result(suite, f"{stage.name}:{n}", "SKIP", stage.cannot[n]) for n in named]
    with open(log_path, "wb") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=suite_dir, env=env)
        try:
            if not stage.expect_start:  # as test.sh's run_server_nowait + wait: the server exits
                try:
                    code = server.wait(120)
                    outcome = ("PASS", f"exit status {code}") if code != 0 else ("FAIL", "exit status 0")
                except subprocess.TimeoutExpired:
                    outcome = ("FAIL", "still serving after 120 s")
                results.append(Result(suite, f"{stage.name}:refuses_to_start", *outcome))
            elif not wait_ready(server, 120):
                results.append(
                    Result(suite, f"{stage.name}:start", "FAIL", f"server not ready, see {log_path}")
                )
                return results
            tests_env = env
            if stage.client:
                tests_env = dict(env, PYTHONPATH=os.pathsep.join(
                    p for p in (client_path(stage.client), env.get("PYTHONPATH", "")) if p
                ))  # fmt: skip
            for target in stage.tests:
                results += run_targets(suite, stage, suite_dir, target, tests_env, timeout)
            for script in stage.scripts:
                try:
                    out = subprocess.run(
                        [PYTHON, script],
                        cwd=suite_dir,
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=timeout,
                    )
                    ok = out.returncode == 0
                    tail = (out.stdout + out.stderr).strip().splitlines()[-3:]
                    results.append(
                        Result(suite, script, "PASS" if ok else "FAIL", "" if ok else " | ".join(tail))
                    )
                except subprocess.TimeoutExpired:
                    results.append(Result(suite, script, "HANG", f"no answer within {timeout:.0f} s"))
        finally:
            stop(server)
    text = log_path.read_text(errors="replace")
    for needle in stage.log_has:
        found = needle in text
        results.append(Result(suite, f"{stage.name}:log has {needle!r}", "PASS" if found else "FAIL"))
    for needle, count in stage.log_count.items():
        got = text.count(needle)
        results.append(
            Result(
                suite,
                f"{stage.name}:log has {needle!r} x{count}",
                "PASS" if got == count else "FAIL",
                f"{got}",
            )
        )
    return results


def run_targets(
    suite: str, stage: Stage, suite_dir: Path, target: str, env: dict[str, str], timeout: float
) -> list[Result]:
    results: list[Result] = []
    model = None
    if "@" in target:  # test_infer_shm_leak.py once per model: MODEL_NAME
        target, model = target.split("@")
        env = dict(env, MODEL_NAME=model)
    ids = collect(suite_dir, target) or [target]
    for test_id in ids:
        short = model or test_id.rsplit("::", 1)[-1]
        label = f"{stage.name}:{short}" if stage.name != suite else short
        why = stage.cannot.get(short)
        if why is not None:
            results.append(Result(suite, label, "SKIP", why))
            continue
        outcome, detail = run_test(suite_dir, test_id, env, timeout)
        results.append(Result(suite, label, outcome, detail))
    return results


def inner(args: argparse.Namespace) -> None:
    """In the private network namespace: one suite, its results as JSON lines on stdout."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    qa = Path(args.qa)
    logs = Path(args.logs)
    for stage in SUITES[args.inner]:
        for result in run_stage(args.inner, stage, qa, args.timeout, logs):
            print("RESULT " + json.dumps(result.__dict__), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("suites", nargs="*", help=f"some of {', '.join(SUITES)} (default: all)")
    parser.add_argument("--timeout", type=float, default=90, help="seconds a test may take (default 90)")
    parser.add_argument("--work", help="folder for the qa files and logs (default: a new temporary one)")
    parser.add_argument("--list", action="store_true", help="list the suites and stages")
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    parser.add_argument("--qa", help=argparse.SUPPRESS)
    parser.add_argument("--logs", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(args)
        return
    if args.list:
        for suite, stages in SUITES.items():
            print(suite + ": " + ", ".join(s.name for s in stages))
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="qa_backend_python."))
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    shutil.rmtree(work / "qa", ignore_errors=True)
    qa = fetch_qa(work)
    print(f"qa files and server logs under {work}", flush=True)
    for suite in args.suites or list(SUITES):  # (pip needs the network the suites run without)
        for stage in SUITES[suite]:
            if stage.client:
                client_path(stage.client)
    all_results: list[Result] = []
    for suite in args.suites or list(SUITES):
        print(f"== {suite}", flush=True)
        cmd = [
            "unshare",
            "-rn",
            sys.executable,
            __file__,
            "--inner",
            suite,
            "--qa",
            str(qa),
            "--logs",
            str(logs),
        ]
        cmd += ["--timeout", str(args.timeout)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("RESULT "):
                result = Result(**json.loads(line[7:]))
                all_results.append(result)
                print(f"  {result.outcome:4} {suite}/{result.test} {result.detail}", flush=True)
            else:
                print(line, end="", flush=True)
        proc.wait()
    print("\nsuite                 pass  fail  hang  cannot run here")
    for suite in args.suites or list(SUITES):
        mine = [r for r in all_results if r.suite == suite]
        counts = {k: sum(r.outcome == k for r in mine) for k in ("PASS", "FAIL", "HANG", "SKIP")}
        print(f"{suite:20} {counts['PASS']:5} {counts['FAIL']:5} {counts['HANG']:5} {counts['SKIP']:5}")


if __name__ == "__main__":
    main()
