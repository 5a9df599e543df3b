# flowserve images: each serves what it ships (the bundled model_repository/ and graphs/, every
# model READY) until given other content (deploy/README.md: a derived image, a volume, object
# storage).
#   docker build -t flowserve .                                        # CPU
#   docker build -t flowserve:cuda12 --build-arg VARIANT=cuda .        # NVIDIA GPUs (CUDA 12)
# VARIANT picks the base image and the install (docker/install.sh, also run by
# tests/deploy/test_image_install.py into a fresh venv that must serve 12/12 models READY):
#   cpu:  python:3.11-slim; extras bundled (ONNX Runtime, torch, tree models, DALI) and remote
#         (s3://), torch's CPU wheel from download.pytorch.org/whl/cpu (no CUDA libraries)
#   cuda: a CUDA 12 + cuDNN 9 runtime base (Ubuntu 24.04, Python 3.12); onnxruntime-gpu, torch's
#         CUDA wheel from PyPI, DALI for CUDA 12, NVML metrics (gpu), remote
# EXTRAS replaces the variant's extras (pyproject's optional dependencies), e.g.
#   --build-arg EXTRAS=bundled,remote,tensorflow; TORCH_INDEX another index for torch ("none":
#   PyPI's). Without a framework a model needs, that model fails to load and the server is not
#   ready (strict readiness, as Triton).
# Serves on HTTP 8000, gRPC 8001 and metrics 8002 (deploy/ runs it on Kubernetes).
ARG VARIANT=cpu
ARG CPU_BASE=python:3.11-slim-bookworm
ARG CUDA_BASE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04

FROM ${CPU_BASE} AS base-cpu
FROM ${CUDA_BASE} AS base-cuda

# BuildKit builds only the base stage VARIANT names
FROM base-${VARIANT}
ARG VARIANT
ARG EXTRAS=
ARG TORCH_INDEX=auto
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/flowserve/.venv \
    PATH=/opt/flowserve/.venv/bin:$PATH

# A CUDA base image has no Python (python images have it: nothing is installed then).
RUN if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then \
      apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv ca-certificates && rm -rf /var/lib/apt/lists/*; \
    fi

WORKDIR /opt/flowserve
COPY pyproject.toml README.md ./
COPY flowserve ./flowserve
COPY docker/install.sh ./docker/install.sh
# the Makefile's install (a venv, pip upgraded, an editable install with extras) per variant
RUN TORCH_INDEX="$TORCH_INDEX" sh docker/install.sh "$VIRTUAL_ENV" "$VARIANT" "$EXTRAS"

# the bundled content and the Python nodes next to graphs/ (importable as `nodes`); a derived
# image replaces these three folders (deploy/examples/own-image/Dockerfile)
COPY model_repository ./model_repository
COPY graphs ./graphs
COPY nodes ./nodes

RUN groupadd --system --gid 10001 flowserve \
 && useradd --system --uid 10001 --gid 10001 --home-dir /opt/flowserve --shell /usr/sbin/nologin flowserve
USER 10001:10001

EXPOSE 8000 8001 8002
# SIGTERM drains (in-flight requests finish for up to --exit-timeout-secs, then models unload)
STOPSIGNAL SIGTERM
ENTRYPOINT ["flowserve"]
CMD ["serve", "--model-repository=/opt/flowserve/model_repository", "--graphs=/opt/flowserve/graphs", \
     "--host=0.0.0.0", "--http-port=8000", "--grpc-port=8001", "--metrics-port=8002", "--exit-timeout-secs=30"]
