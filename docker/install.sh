#!/bin/sh
# The image's install step: the Dockerfile runs it, and tests/deploy/test_image_install.py runs
# it into a fresh venv and serves the bundled content with that venv (12/12 READY). It is the
# Makefile's `install` (a venv, pip upgraded, an editable install of the project with extras),
# per image variant. Run from the project folder:
#   sh docker/install.sh VENV [VARIANT] [EXTRAS]
# VARIANT cpu (default): extras bundled (what the bundled models need on the CPU: ONNX Runtime,
#   torch, tree models, DALI) and remote (object storage); torch's CPU wheel (no CUDA libraries).
# VARIANT cuda: the same frameworks in their GPU builds (onnx-gpu: onnxruntime-gpu; torch's
#   default wheel from PyPI, built for CUDA 12; DALI for CUDA 12), gpu (NVML metrics), remote.
# EXTRAS: pyproject extras replacing the variant's (e.g. bundled,remote,tensorflow).
# TORCH_INDEX (environment): "auto" or unset: the variant's (cpu: download.pytorch.org/whl/cpu,
#   cuda: none); "none": no extra index; else an index URL tried beside PyPI.
set -eu
venv=$1
variant=${2:-cpu}
extras=${3:-}
torch_index=${TORCH_INDEX:-auto}
case "$variant" in
  cpu)
    default_extras=bundled,remote
    default_index=https://download.pytorch.org/whl/cpu ;;
  cuda)
    default_extras=onnx-gpu,torch,trees,dali,gpu,remote
    default_index=none ;;
  *)
    echo "docker/install.sh: VARIANT must be cpu or cuda, not '$variant'" >&2
    exit 2 ;;
esac
extras=${extras:-$default_extras}
[ "$torch_index" = auto ] && torch_index=$default_index

python3 -c 'import sys; assert sys.version_info >= (3, 11), "flowserve needs Python 3.11+"'
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
if [ "$torch_index" = none ]; then
  "$venv/bin/pip" install -q -e ".[$extras]"
else
  "$venv/bin/pip" install -q --extra-index-url "$torch_index" -e ".[$extras]"
fi
"$venv/bin/flowserve" --help >/dev/null
