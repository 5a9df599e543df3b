"""GPU metrics on /metrics under Triton's names, read through NVML (``pynvml``, the
``nvidia-ml-py`` package: ``pip install 'flowserve[gpu]'``)::

    nv_gpu_utilization{gpu_uuid="GPU-..."} 0.42            GPU utilization rate [0.0 - 1.0)
    nv_gpu_memory_total_bytes{gpu_uuid="GPU-..."} 8.5e10   GPU total memory, in bytes
    nv_gpu_memory_used_bytes{gpu_uuid="GPU-..."} 1.2e9     GPU used memory, in bytes
    nv_gpu_power_usage{gpu_uuid="GPU-..."} 71.2            GPU power usage in watts
    nv_gpu_power_limit{gpu_uuid="GPU-..."} 700             GPU power management limit in watts
    nv_energy_consumption{gpu_uuid="GPU-..."} 1234.5       GPU energy consumption in joules
                                                           since the server started (a counter)

Names, types, HELP text and the ``gpu_uuid`` label are Triton's (core ``metrics.cc``), so Triton
dashboards read them unchanged. Triton reads the same fields through DCGM: utilization is
the device's GPU utilization (percent / 100), power the management limit, energy the
difference of the device's total energy counter since start (mJ / 1000).

Where NVML is missing (no ``pynvml``, no driver, no GPU, ``FLOWSERVE_NO_GPU`` set) the
collector yields nothing at all: no error, no family without samples. A reading a device does
not support (power on some boards) is left out for that device only. Devices are those CUDA
shows this process: all of NVML's, or those ``CUDA_VISIBLE_DEVICES`` names (by index or UUID).

Read at scrape time, at most once per ``max_age_s`` (1 s) per process: NVML answers in
microseconds to milliseconds per call, and the scrape runs on the metrics listener's loop.
With ``--workers N`` every worker reads the same GPUs; flowserve/cluster/merge.py merges these
families with ``max`` (never summed).
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.metrics_core import Metric

from flowserve.nodes.backends._support import NO_GPU_ENV

log = logging.getLogger("flowserve.metrics")

# (name, type, HELP) as Triton's core registers them
FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)"),
    ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes"),
    ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes"),
    ("nv_gpu_power_usage", "gauge", "GPU power usage in watts"),
    ("nv_gpu_power_limit", "gauge", "GPU power management limit in watts"),
    ("nv_energy_consumption", "counter", "GPU energy consumption in joules since the Triton Server started"),
)
LABEL = "gpu_uuid"


def visible_devices(setting: str | None, uuids: list[str]) -> list[int]:
    """The NVML indices of the devices CUDA shows a process whose ``CUDA_VISIBLE_DEVICES`` is
    ``setting`` (None: unset, every device), given every device's UUID in NVML's order.

    As CUDA reads it: a comma-separated list of indices or UUIDs (``GPU-...``, a unique prefix
    is enough); the list ends at the first entry that names no device; a MIG instance
    (``MIG-...``) is not a whole GPU and is skipped. Indices are NVML's (PCI bus order: CUDA's
    as well with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``)."""
    if setting is None:
        return list(range(len(uuids)))
    chosen: list[int] = []
    for raw in setting.split(","):
        entry = raw.strip()
        if entry.startswith("MIG-"):
            continue
        if entry.lstrip("-").isdigit():
            index = int(entry)
            if not 0 <= index < len(uuids):
                break
        else:
            matches = [i for i, uuid in enumerate(uuids) if entry and uuid.startswith(entry)]
            if len(matches) != 1:
                break
            index = matches[0]
        if index in chosen:
            break  # CUDA refuses a repeated device: nothing after it is visible
        chosen.append(index)
    return chosen


@dataclass
class _Device:
    handle: Any
    uuid: str
    energy_start_mj: float | None = None  # the energy counter when the server started


@dataclass
class _Reading:
    at: float = -1.0
    samples: dict[str, list[tuple[str, float]]] = field(default_factory=dict)


class GpuCollector:
    """A prometheus-client collector of the GPU families above (see the module docstring).
    ``nvml`` is the NVML module (``pynvml`` imported when None: what tests replace); NVML is
    initialised here, at start, so the energy counter starts with the server."""

    def __init__(
        self,
        nvml: Any = None,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_age_s: float = 1.0,
    ) -> None:
        self._clock = clock
        self._max_age = max_age_s
        self._lock = threading.Lock()
        self._reading = _Reading()
        self._nvml = None
        self._devices: list[_Device] = []
        env: Mapping[str, str] = os.environ if environ is None else environ
        if env.get(NO_GPU_ENV, "0") not in ("", "0"):
            return
        try:
            self._nvml = nvml if nvml is not None else importlib.import_module("pynvml")
            self._devices = self._open(self._nvml, env.get("CUDA_VISIBLE_DEVICES"))
        except Exception as exc:  # no module, no driver, no device: no GPU metrics, no error
            log.debug("GPU metrics unavailable: %s: %s", type(exc).__name__, exc)
            self._nvml = None
            self._devices = []
            return
        for device in self._devices:
            device.energy_start_mj = self._read(device, "energy")

    @property
    def available(self) -> bool:
        """Whether any GPU is measured."""
        return bool(self._devices)

    @staticmethod
    def _open(nvml: Any, visible: str | None) -> list[_Device]:
        nvml.nvmlInit()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(int(nvml.nvmlDeviceGetCount()))]
        uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
        return [_Device(handles[i], uuids[i]) for i in visible_devices(visible, uuids)]

    def _read(self, device: _Device, what: str) -> float | None:
        """One reading of a device (None when NVML cannot give it)."""
        nvml, handle = self._nvml, device.handle
        assert nvml is not None
        try:
            if what == "energy":
                return float(nvml.nvmlDeviceGetTotalEnergyConsumption(handle))  # mJ
            if what == "utilization":
                return float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0
            if what == "power":
                return float(nvml.nvmlDeviceGetPowerUsage(handle)) / 1000.0  # mW -> W
            if what == "limit":
                return float(nvml.nvmlDeviceGetPowerManagementLimit(handle)) / 1000.0
            raise ValueError(what)
        except Exception:  # not supported on this device (NVMLError_NotSupported...)
            return None

    def _sample(self) -> dict[str, list[tuple[str, float]]]:
        samples: dict[str, list[tuple[str, float]]] = {name: [] for name, _, _ in FAMILIES}
        nvml = self._nvml
        assert nvml is not None
        for device in self._devices:
            uuid = device.uuid
            for name, what in (
                ("nv_gpu_utilization", "utilization"),
                ("nv_gpu_power_usage", "power"),
                ("nv_gpu_power_limit", "limit"),
            ):
                value = self._read(device, what)
                if value is not None:
                    samples[name].append((uuid, value))
            try:
                memory = nvml.nvmlDeviceGetMemoryInfo(device.handle)
                samples["nv_gpu_memory_total_bytes"].append((uuid, float(memory.total)))
                samples["nv_gpu_memory_used_bytes"].append((uuid, float(memory.used)))
            except Exception:
                pass
            energy = self._read(device, "energy")
            if energy is not None:
                if device.energy_start_mj is None:  # unreadable at start: counted from now
                    device.energy_start_mj = energy
                samples["nv_energy_consumption"].append(
                    (uuid, max(energy - device.energy_start_mj, 0.0) / 1000.0)
                )
        return samples

    def collect(self) -> Iterator[Metric]:
        if not self._devices:
            return
        with self._lock:
            now = self._clock()
            reading = self._reading
            if reading.at < 0 or now - reading.at >= self._max_age:
                reading = self._reading = _Reading(now, self._sample())
        for name, typ, doc in FAMILIES:
            samples = reading.samples.get(name)
            if not samples:
                continue
            metric = Metric(name, doc, typ)
            for uuid, value in samples:
                metric.add_sample(name, {LABEL: uuid}, value)
            yield metric


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)


__all__ = ["FAMILIES", "LABEL", "GpuCollector", "visible_devices"]
