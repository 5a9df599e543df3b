#!/usr/bin/env bash
# Wheels of flowserve's own dependencies that a GPU machine without network lacks (its image has
# torch, numpy, grpcio, protobuf, networkx, pyyaml, prometheus-client, ml-dtypes, uvloop and
# pytest, but not these; google-re2 too: flowserve/dataplane/headers.py imports re2, so no server
# starts without it), for CPython 3.12 on manylinux x86_64, into .whl/ (ignored by git).
# benchmarks/gpu_check.sh installs them from there. About 25 MB. Run here, where pip reaches PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
rm -rf .whl
mkdir -p .whl/fallback
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
# tritonclient, grpcio and protobuf at the versions this checkout's environment runs (the tests'
# own): tritonclient's generated stubs refuse an older grpcio or protobuf than they were made
# with, and the image's may be older; pytest and pytest-asyncio at the tests' own versions too
# (gpu_check.sh runs them with no other plugin). cuda-bindings is what tritonclient's
# cuda_shared_memory imports (without it the CUDA shm tests skip): the device image has its
# own, built for its CUDA (13, with torch 2.11+cu130: ../.library/device/KINDS.md), which a
# carried one must not shadow, so CUDA 12's goes to .whl/fallback/ and gpu_check.sh installs
# it only where the machine's Python cannot import cuda.bindings.runtime.
ENV_PY=python3
[ -x .venv/bin/python ] && ENV_PY=.venv/bin/python
pinned=$("$ENV_PY" - tritonclient grpcio protobuf pytest pluggy iniconfig pytest-asyncio <<'PY'
import importlib.metadata as metadata
import sys

for name in sys.argv[1:]:
    try:
        print(f"{name}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(name)
PY
)
for package in hpack $pinned uvicorn httptools h11 click \
  python-rapidjson geventhttpclient gevent zope.event zope.interface greenlet brotli \
  opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions opentelemetry-proto \
  opentelemetry-exporter-otlp-proto-common opentelemetry-exporter-otlp-proto-http \
  opentelemetry-exporter-otlp-proto-grpc importlib-metadata googleapis-common-protos google-re2; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform any -d .whl "$package"
done
for package in "cuda-bindings>=12.9,<13" cuda-pathfinder; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform any -d .whl/fallback "$package"
done
du -sh .whl
