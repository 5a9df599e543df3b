"""GPU metrics (flowserve/observability/gpu_metrics.py) with a fake NVML module: Triton's names,
types, HELP text and ``gpu_uuid`` label, the values converted as Triton does, nothing at all
where NVML is not there, the devices CUDA_VISIBLE_DEVICES names, and with ``--workers 2`` the
same GPUs reported once (merged by max, never summed)."""

from __future__ import annotations

import sys
import types
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flowserve.cluster.merge import merge_metrics, metric_rule
from flowserve.dataplane.plane import DataPlane
from flowserve.observability.gpu_metrics import FAMILIES, GpuCollector, visible_devices
from flowserve.observability.metrics import exposition, make_registry, scrape

FAKE_PYNVML = '''
"""A fake NVML (the pynvml module) for flowserve's GPU metrics tests: two GPUs."""
import os
from types import SimpleNamespace


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


DEVICES = [
    {"uuid": "GPU-11111111-2222-3333-4444-555555555555", "util": 37, "total": 85899345920,
     "used": 1073741824, "power": 71250, "limit": 700000, "energy": 5000000},
    {"uuid": b"GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", "util": 0, "total": 42949672960,
     "used": 0, "power": None, "limit": 400000, "energy": 9000000},
]
CALLS = {"init": 0, "util": 0}
STEP_MJ = 1000  # each energy reading is one joule more than the one before


def nvmlInit():
    CALLS["init"] += 1
    if os.environ.get("FAKE_NVML_FAIL"):
        raise NVMLError("Driver Not Loaded")


def nvmlDeviceGetCount():
    return len(DEVICES)


def nvmlDeviceGetHandleByIndex(index):
    return DEVICES[index]


def nvmlDeviceGetUUID(handle):
    return handle["uuid"]


def nvmlDeviceGetUtilizationRates(handle):
    CALLS["util"] += 1
    return SimpleNamespace(gpu=handle["util"], memory=0)


def nvmlDeviceGetMemoryInfo(handle):
    return SimpleNamespace(total=handle["total"], used=handle["used"], free=handle["total"] - handle["used"])


def nvmlDeviceGetPowerUsage(handle):
    if handle["power"] is None:
        raise NVMLError_NotSupported("Not Supported")
    return handle["power"]


def nvmlDeviceGetPowerManagementLimit(handle):
    return handle["limit"]


def nvmlDeviceGetTotalEnergyConsumption(handle):
    handle["energy"] += STEP_MJ
    return handle["energy"]
'''

GPU0 = "GPU-11111111-2222-3333-4444-555555555555"
GPU1 = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


def fake_nvml() -> Any:
    module = types.ModuleType("pynvml")
    exec(compile(FAKE_PYNVML, "fake_pynvml.py", "exec"), module.__dict__)
    return module


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _text(collector: GpuCollector) -> str:
    return exposition(collector.collect()).decode()


def test_values_labels_and_help_are_tritons(metrics_of: Callable[[str], Any], value: Any) -> None:
    collector = GpuCollector(fake_nvml(), environ={})
    text = _text(collector)
    for name, typ, doc in FAMILIES:
        assert f"# HELP {name} {doc}\n# TYPE {name} {typ}\n" in text
    assert "# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)" in text
    assert "# TYPE nv_energy_consumption counter" in text
    assert f'nv_gpu_utilization{{gpu_uuid="{GPU0}"}} 0.37' in text
    m = metrics_of(text)
    assert value(m, "nv_gpu_utilization", gpu_uuid=GPU0) == 0.37
    assert value(m, "nv_gpu_utilization", gpu_uuid=GPU1) == 0
    assert value(m, "nv_gpu_memory_total_bytes", gpu_uuid=GPU0) == 85899345920
    assert value(m, "nv_gpu_memory_used_bytes", gpu_uuid=GPU0) == 1073741824
    assert value(m, "nv_gpu_power_usage", gpu_uuid=GPU0) == 71.25  # mW -> W
    assert value(m, "nv_gpu_power_limit", gpu_uuid=GPU0) == 700
    assert value(m, "nv_gpu_power_limit", gpu_uuid=GPU1) == 400
    # counted from the server's start (the collector's): one reading later, one joule more
    assert value(m, "nv_energy_consumption", gpu_uuid=GPU0) == 1.0
    assert value(m, "nv_energy_consumption", gpu_uuid=GPU1) == 1.0
    # GPU1 reports no power usage: left out for it alone
    assert ("nv_gpu_power_usage", frozenset({("gpu_uuid", GPU1)})) not in m
    assert {labels for (_, labels) in m} == {frozenset({("gpu_uuid", GPU0)}), frozenset({("gpu_uuid", GPU1)})}


def test_nothing_at_all_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake_nvml()
    monkeypatch.setenv("FAKE_NVML_FAIL", "1")
    failed = GpuCollector(nvml, environ={})
    assert not failed.available and list(failed.collect()) == [] and nvml.CALLS["init"] == 1
    monkeypatch.delenv("FAKE_NVML_FAIL")
    # no pynvml module at all (None in sys.modules makes the import fail, as a missing one does)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert list(GpuCollector(environ={}).collect()) == []
    # the server told to behave as if no GPU were there
    assert list(GpuCollector(fake_nvml(), environ={"FLOWSERVE_NO_GPU": "1"}).collect()) == []
    # NVML but no device
    empty = fake_nvml()
    empty.DEVICES.clear()
    assert list(GpuCollector(empty, environ={}).collect()) == []


def test_a_family_no_device_reports_is_left_out() -> None:
    nvml = fake_nvml()
    for device in nvml.DEVICES:
        device["power"] = None
    text = _text(GpuCollector(nvml, environ={}))
    assert "nv_gpu_power_usage" not in text and "nv_gpu_power_limit{" in text


def test_readings_are_cached_for_a_second() -> None:
    nvml, clock = fake_nvml(), Clock()
    collector = GpuCollector(nvml, environ={}, clock=clock)
    _text(collector)
    _text(collector)
    assert nvml.CALLS["util"] == 2  # one reading per GPU, once
    clock.now += 1.0
    assert 'nv_energy_consumption{gpu_uuid="' + GPU0 + '"} 2' in _text(collector)
    assert nvml.CALLS["util"] == 4


def test_cuda_visible_devices_picks_the_devices() -> None:
    uuids = [GPU0, GPU1, "GPU-ffff0000-0000-0000-0000-000000000000"]
    assert visible_devices(None, uuids) == [0, 1, 2]
    assert visible_devices("2,0", uuids) == [2, 0]
    assert visible_devices("GPU-aaaa", uuids) == [1]
    assert visible_devices("1, GPU-ffff", uuids) == [1, 2]
    assert visible_devices("0,7,1", uuids) == [0]  # CUDA stops at the first invalid entry
    assert visible_devices("0,0", uuids) == [0]
    assert visible_devices("GPU-", uuids) == []  # ambiguous
    assert visible_devices("", uuids) == [] and visible_devices("-1", uuids) == []
    assert visible_devices("MIG-GPU-1/0/0,1", uuids) == [1]
    text = _text(GpuCollector(fake_nvml(), environ={"CUDA_VISIBLE_DEVICES": "1"}))
    assert GPU1 in text and GPU0 not in text


def test_the_metrics_registry_serves_them(plane: DataPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("FLOWSERVE_NO_GPU", raising=False)
    text = scrape(make_registry(plane, process=False)).decode()
    assert f'nv_gpu_memory_total_bytes{{gpu_uuid="{GPU1}"}} 42949672960' in text
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert "nv_gpu" not in scrape(make_registry(plane, process=False)).decode()


def test_workers_texts_merge_without_summing_the_gpus() -> None:
    """Every worker reads the same GPUs: merged, each series is one worker's value."""
    texts = [_text(GpuCollector(fake_nvml(), environ={})) for _ in range(2)]
    merged = merge_metrics(texts)
    for name, _, _ in FAMILIES:
        assert metric_rule(name) == "max"
    assert f'nv_gpu_memory_used_bytes{{gpu_uuid="{GPU0}"}} 1073741824\n' in merged
    assert f'nv_gpu_power_limit{{gpu_uuid="{GPU0}"}} 700\n' in merged
    assert f'nv_energy_consumption{{gpu_uuid="{GPU0}"}} 1\n' in merged
    assert merged.count("# HELP nv_gpu_utilization ") == 1


@pytest.mark.slow
def test_two_workers_report_each_gpu_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metrics_of: Callable[[str], Any], value: Any
) -> None:
    from tests.conftest import start_server

    fake = tmp_path / "fake_nvml"
    fake.mkdir()
    (fake / "pynvml.py").write_text(FAKE_PYNVML)
    monkeypatch.setenv("PYTHONPATH", f"{fake}:{__import__('os').environ.get('PYTHONPATH', '')}".rstrip(":"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("FLOWSERVE_NO_GPU", raising=False)
    server = start_server("--workers", "2", "--model-control-mode=explicit", timeout=180.0)
    try:
        text = urllib.request.urlopen(server.metrics_url, timeout=30).read().decode()
    finally:
        assert server.stop(60.0) == 0, server.log()[-4000:]
    m = metrics_of(text)
    assert value(m, "flowserve_workers", state="up") == 2  # the answer is both workers' merged
    assert value(m, "nv_gpu_memory_total_bytes", gpu_uuid=GPU0) == 85899345920  # not 2x
    assert value(m, "nv_gpu_utilization", gpu_uuid=GPU0) == 0.37
    assert value(m, "nv_gpu_power_usage", gpu_uuid=GPU0) == 71.25
    assert value(m, "nv_energy_consumption", gpu_uuid=GPU0) == 1.0  # each worker's first reading
    assert text.count("# TYPE nv_gpu_utilization gauge") == 1


def test_the_real_nvml_module_without_a_gpu_gives_nothing() -> None:
    from flowserve.nodes.backends._support import has_gpu

    pytest.importorskip("pynvml")
    if has_gpu():
        pytest.skip("a GPU is here: test_real_gpus_are_measured covers it")
    collector = GpuCollector(environ={})
    assert not collector.available and list(collector.collect()) == []


@pytest.mark.gpu
def test_real_gpus_are_measured(metrics_of: Callable[[str], Any]) -> None:
    from flowserve.nodes.backends._support import gpu_count, has_gpu

    if not has_gpu():
        pytest.skip("needs an NVIDIA GPU")
    pytest.importorskip("pynvml")
    collector = GpuCollector()
    assert collector.available
    m = metrics_of(_text(collector))
    uuids = {dict(labels)["gpu_uuid"] for (name, labels) in m if name == "nv_gpu_memory_total_bytes"}
    assert len(uuids) == gpu_count() and all(u.startswith(("GPU-", "MIG-")) for u in uuids)
    for uuid in uuids:
        key = frozenset({("gpu_uuid", uuid)})
        assert m[("nv_gpu_memory_total_bytes", key)] > 0
        assert 0 <= m[("nv_gpu_memory_used_bytes", key)] <= m[("nv_gpu_memory_total_bytes", key)]
        assert 0 <= m[("nv_gpu_utilization", key)] <= 1
        assert m.get(("nv_energy_consumption", key), 0.0) >= 0
