"""The reference server: Triton 2.51 from the ``nvidia-pytriton`` wheel, in its own virtualenv.

The wheel carries a real ``tritonserver`` binary with the Python backend. Three things make it
run here (all done by :func:`ensure_triton`, idempotent):

1. a virtualenv in ``benchmarks/.work/triton-venv`` (git ignores ``.work``) with
   ``nvidia-pytriton``, numpy and onnxruntime (the Python-backend models import them);
2. the Python backend's stub for this Python (``python_backend_stubs/3.11/...``) copied into
   ``backends/python/``, where the backend looks for it;
3. the environment of the server process (:meth:`TritonInstall.env`): the wheel's bundled
   libraries (``nvidia_pytriton.libs``) and this Python's ``libpython`` on ``LD_LIBRARY_PATH``,
   and the virtualenv's ``bin`` first on ``PATH``. The stub embeds Python in isolated mode
   (``PYTHONPATH`` is ignored) and finds its prefix from the ``python3`` on ``PATH``, so the
   virtualenv's site-packages are what the models see.

    python benchmarks/triton_setup.py     # set up (about a minute, 440 MB); prints the binary
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

WORK = Path(__file__).resolve().parent / ".work"
VENV = WORK / "triton-venv"
PACKAGES = ("nvidia-pytriton==0.7.0", "numpy", "onnxruntime")


@dataclass(frozen=True, slots=True)
class TritonInstall:
    binary: Path
    backends: Path
    libs: Path
    venv: Path

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        libdirs = [str(self.libs)]
        libpython = sysconfig.get_config_var("LIBDIR")
        if libpython:
            libdirs.append(str(libpython))
        if env.get("LD_LIBRARY_PATH"):
            libdirs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = ":".join(libdirs)
        env["PATH"] = f"{self.venv / 'bin'}:{env.get('PATH', '')}"
        env.pop("PYTHONPATH", None)
        env.pop("PYTHONHOME", None)
        return env

    def command(self, repository: Path, http_port: int, grpc_port: int) -> list[str]:
        return [
            str(self.binary),
            f"--model-repository={repository}",
            f"--backend-directory={self.backends}",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            f"--http-port={http_port}",
            f"--grpc-port={grpc_port}",
            "--allow-metrics=false",
            "--log-verbose=0",
        ]


def _site_packages(venv: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return venv / "lib" / version / "site-packages"


def find_triton(venv: Path = VENV) -> TritonInstall | None:
    """The install in ``venv`` when it is complete (the stub in place), else None."""
    root = _site_packages(venv) / "pytriton" / "tritonserver"
    install = TritonInstall(
        root / "bin" / "tritonserver",
        root / "backends",
        _site_packages(venv) / "nvidia_pytriton.libs",
        venv,
    )
    stub = install.backends / "python" / "triton_python_backend_stub"
    if install.binary.is_file() and stub.is_file() and install.libs.is_dir():
        return install
    return None


def ensure_triton(venv: Path = VENV) -> TritonInstall:
    """Find the install, or make it: virtualenv, pip install, stub copy. Linux x86_64 only."""
    found = find_triton(venv)
    if found is not None:
        return found
    if sys.platform != "linux":
        raise RuntimeError("the tritonserver of the nvidia-pytriton wheel runs on Linux only")
    if not (venv / "bin" / "python").is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *PACKAGES], check=True)
    root = _site_packages(venv) / "pytriton" / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise RuntimeError(f"nvidia-pytriton has no Python backend stub for Python {version} ({stub})")
    target = root / "backends" / "python" / stub.name
    shutil.copy2(stub, target)
    target.chmod(0o755)
    found = find_triton(venv)
    if found is None:
        raise RuntimeError(f"Triton install in {venv} is incomplete after setup")
    return found


if __name__ == "__main__":
    print(ensure_triton().binary)
