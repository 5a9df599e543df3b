# flowserve image. CPU by default:
#   docker build -t flowserve .
# NVIDIA GPUs: a CUDA base image and the GPU extras (Ubuntu 24.04's python3 is 3.12):
#   docker build -t flowserve:cuda12 \
#     --build-arg BASE_IMAGE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04 \
#     --build-arg EXTRAS=remote,onnx-gpu .
# EXTRAS are pyproject's optional dependencies: remote (s3://, the default), onnx, torch,
# trees, dali, tensorflow, openvino, all... (the bundled ONNX/torch/tree/DALI models need their
# frameworks, e.g. EXTRAS=onnx,torch,trees,dali,remote; without one, its models fail to load
# with a message naming it and everything else serves). The install steps are the Makefile's
# `install` target: a venv, pip upgraded, an editable pip install of the project with extras.
# Serves the bundled model_repository/ and graphs/ unless given other arguments, on HTTP 8000,
# gRPC 8001 and metrics 8002 (deploy/ runs it on Kubernetes).
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG EXTRAS=remote
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
    fi \
 && python3 -c 'import sys; assert sys.version_info >= (3, 11), "flowserve needs Python 3.11+"'

WORKDIR /opt/flowserve
COPY pyproject.toml README.md ./
COPY flowserve ./flowserve
# make install: python3 -m venv .venv; .venv/bin/pip install -q --upgrade pip; pip install -q -e .
RUN python3 -m venv "$VIRTUAL_ENV" \
 && pip install -q --upgrade pip \
 && pip install -q -e ".[${EXTRAS}]" \
 && flowserve --help >/dev/null

# the bundled content and the Python nodes next to graphs/ (importable as `nodes`)
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
