"""The CUDA IPC plumbing that runs without a GPU: the handle torch gives, and how the CUDA
runtime's ``cudaIpcOpenMemHandle`` is called (the handle by value, a 64-byte struct)."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from flowserve.nodes.backends.cuda import IPC_HANDLE_SIZE, declare_ipc, raw_ipc_handle

HANDLE = bytes(range(IPC_HANDLE_SIZE))


def test_a_bare_handle_is_kept() -> None:
    assert raw_ipc_handle(HANDLE) == HANDLE


def test_torchs_versioned_cuda_malloc_handle_is_unwrapped() -> None:
    assert raw_ipc_handle(b"\x01c" + HANDLE) == HANDLE


def test_an_expandable_segment_handle_is_refused() -> None:
    with pytest.raises(ValueError, match="not a cudaMalloc IPC handle"):
        raw_ipc_handle(b"\x01e" + HANDLE)


class FakeCudart:
    """A CUDA runtime whose ``cudaIpcOpenMemHandle`` is a real C function pointer, called
    through the argument types :func:`declare_ipc` declares (as libcudart's would be)."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []
        handle_type = declare_ipc(_Probe()).cudaIpcOpenMemHandle.argtypes[1]
        proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), handle_type, ctypes.c_uint)

        def open_handle(pointer: Any, handle: Any, flags: int) -> int:
            self.seen.append(ctypes.string_at(ctypes.addressof(handle), IPC_HANDLE_SIZE))
            pointer[0] = 0x1000
            return 0

        self._keep = proto(open_handle)  # the C trampoline; its address stands for the symbol
        self.cudaIpcOpenMemHandle = proto(ctypes.cast(self._keep, ctypes.c_void_p).value)
        self.cudaIpcCloseMemHandle = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(lambda p: 0)


class _Probe:
    """Attributes that take ``argtypes``/``restype`` like a ctypes library's functions."""

    class _Fn:
        argtypes: list[Any] = []
        restype: Any = None

    def __init__(self) -> None:
        self.cudaIpcOpenMemHandle = self._Fn()
        self.cudaIpcCloseMemHandle = self._Fn()


def test_the_handle_goes_by_value_as_64_bytes() -> None:
    cudart = FakeCudart()
    declared = declare_ipc(_Probe())
    handle_type = declared.cudaIpcOpenMemHandle.argtypes[1]
    assert ctypes.sizeof(handle_type) == IPC_HANDLE_SIZE
    assert issubclass(handle_type, ctypes.Structure)  # by value, not a pointer to an array
    pointer = ctypes.c_void_p()
    status = cudart.cudaIpcOpenMemHandle(ctypes.byref(pointer), handle_type.from_buffer_copy(HANDLE), 1)
    assert status == 0 and pointer.value == 0x1000
    assert cudart.seen == [HANDLE]
