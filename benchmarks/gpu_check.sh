#!/usr/bin/env bash
# One command for a GPU machine: the project's gpu tests (`pytest -m gpu`), then the served conv
# net against raw torch (benchmarks/gpu_serving.py), then 16 MiB in and out over gRPC against
# HTTP where client and server have cores of their own (benchmarks/large_tensors.py), in under
# 8 minutes, then a summary.
#
# Works on a machine with no network that has torch with CUDA: onnxruntime-gpu, DALI and
# TensorRT may be missing (their tests skip and say so in the summary). flowserve's own
# dependencies that such a machine lacks come as wheels from .whl/ (benchmarks/gpu_wheels.sh
# fetches them where PyPI is reachable) and perf_analyzer from benchmarks/.work/perf_analyzer
# (benchmarks/perf_analyzer_setup.py). With the device tool:
#   bash benchmarks/gpu_wheels.sh && python benchmarks/perf_analyzer_setup.py   # here, once
#   run(command="bash benchmarks/gpu_check.sh", carry=[".whl", "benchmarks/.work/perf_analyzer"])
# Logs and results go to $OUT (the device tool's folder) or /tmp/gpu_check.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  wheels=(.whl/*.whl)
  # the machine's own cuda-bindings (built for its CUDA) unless it has none (gpu_wheels.sh)
  if ! "$PY" -c "import cuda.bindings.runtime" 2>/dev/null && compgen -G ".whl/fallback/*.whl" >/dev/null; then
    echo "== no cuda.bindings on this machine: installing the carried CUDA 12 one"
    wheels+=(.whl/fallback/*.whl)
  fi
  # cp312 wheels: on another Python pip refuses them all, and the tests would fail on imports
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/flowserve-site "${wheels[@]}" 2>"$OUT/wheels.log"; then
    export PYTHONPATH=/tmp/flowserve-site
  else
    echo "== the wheels in .whl/ did not install ($("$PY" -V 2>&1); they are for CPython 3.12):"
    tail -3 "$OUT/wheels.log"
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -4
"$PY" - <<'PY' 2>&1 | tee "$OUT/frameworks.txt"
import importlib
for name in ("torch", "onnxruntime", "tensorrt", "nvidia.dali", "pynvml", "tritonclient", "grpc",
             "google.protobuf", "cuda.bindings", "flowserve"):
    try:
        module = importlib.import_module(name)
        extra = ""
        if name == "torch":
            extra = f" cuda={module.cuda.is_available()}"
        if name == "onnxruntime":
            extra = f" providers={module.get_available_providers()}"
        print(f"{name}: {getattr(module, '__version__', '?')}{extra}")
    except Exception as exc:  # a missing framework: its tests skip
        print(f"{name}: missing ({type(exc).__name__}: {exc})")
PY

echo "== pytest -m gpu"
# only the modules that hold gpu tests are collected: pytest imports every module it collects
# before -m selects, and a CPU-only module importing a package this machine lacks (hypothesis,
# aiohttp, cryptography...) would stop the whole run with a collection error. The others are
# --ignore'd rather than the gpu modules named: a conftest that skips (tests/llm's, without
# transformers) is a skip while collecting a folder, but a crash when named on the command line
mapfile -t gpu_tests < <(grep -rlE --include='test_*.py' 'pytest\.mark\.gpu' tests | sort)
mapfile -t cpu_tests < <(grep -rLE --include='test_*.py' 'pytest\.mark\.gpu' tests | sort)
ignored=()
for module in "${cpu_tests[@]}"; do ignored+=("--ignore=$module"); done
echo "${#gpu_tests[@]} modules with gpu tests: ${gpu_tests[*]}"
# pytest and pytest-asyncio come from .whl/ at the tests' own versions, and no plugin of the
# image is loaded (benchmark, cov, anyio's...: their versions are the image's, not the tests').
# Warnings are shown, not raised: the suite turns them into errors here, but a deprecation in
# the image's own newer packages (numpy, torch) must not cost a GPU run; they are in the log.
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout 225 "$PY" -m pytest -p pytest_asyncio.plugin -W default \
  -m gpu -q -rs -p no:cacheprovider "${ignored[@]}" tests 2>&1 \
  | tee "$OUT/pytest_gpu.log" | tail -40
tests_rc=${PIPESTATUS[0]}

echo "== gpu_serving.py"
# stopped by the time limit, it still writes (and prints) what it measured
timeout 180 "$PY" benchmarks/gpu_serving.py --window-ms 2000 --output "$OUT/gpu_serving.json" 2>&1 \
  | tee "$OUT/gpu_serving.log" | grep -v "^ *\*\*\*"
bench_rc=${PIPESTATUS[0]}

echo "== 16 MiB over gRPC and HTTP (flowserve alone, perf_analyzer c=1)"
# issue 28's goal: gRPC within 1.2x of HTTP. On 2 shared cores perf_analyzer's own gRPC client
# (1.6x the CPU of its HTTP client per request) decides it; here the client has cores of its own
timeout 40 "$PY" benchmarks/large_tensors.py --no-triton --sizes 16M --transports grpc http \
  --repeats 1 --output "$OUT/large_tensors.json" > "$OUT/large_tensors.log" 2>&1
large_rc=$?
grep -E "^ +16M (grpc|http) flowserve|16M flowserve" "$OUT/large_tensors.log"
# the same with clients that copy the payload on neither protocol (perf_analyzer's gRPC client
# copies it three times a request, in the latency whatever the cores): the server's own ratio
timeout 25 "$PY" benchmarks/large_tensors.py --no-triton --sizes 16M --transports grpc http \
  --repeats 1 --client lean --output "$OUT/large_tensors_lean.json" > "$OUT/large_tensors_lean.log" 2>&1
lean_rc=$?
grep -E "16M flowserve" "$OUT/large_tensors_lean.log"

echo "== summary"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -1
grep -A12 "warnings summary" "$OUT/pytest_gpu.log" | head -14
echo "skipped (why):"
grep -E "^SKIPPED" "$OUT/pytest_gpu.log" | sed 's/^SKIPPED \[[0-9]*\] /  /' | sort | uniq -c | head -20
grep -E "ceiling|images/s" "$OUT/gpu_serving.log"
grep -E "16M flowserve" "$OUT/large_tensors.log" | sed 's/^/16 MiB p50 gRPC\/HTTP, server CPU, client CPU (perf_analyzer): /'
grep -E "16M flowserve" "$OUT/large_tensors_lean.log" | sed 's/^/16 MiB p50 gRPC\/HTTP, server CPU, client CPU (lean clients): /'
echo "pytest exit $tests_rc, gpu_serving exit $bench_rc, large_tensors exit $large_rc (lean $lean_rc)"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
