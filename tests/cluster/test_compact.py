"""The supervisor's log of control changes stays as short as what a restarted worker must
replay (cluster/supervisor.py ``compact``)."""

from __future__ import annotations

from typing import Any

from flowserve.cluster.supervisor import compact


def _log(*changes: tuple[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for op, args in changes:
        compact(out, op, args)
    return out


def test_a_models_last_load_or_unload_is_all_that_is_kept() -> None:
    log = _log(
        ("load", {"name": "a"}), ("load", {"name": "b"}), ("unload", {"name": "a"}), ("load", {"name": "a"})
    )
    assert log == [("load", {"name": "b"}), ("load", {"name": "a"})]


def test_regions_keep_only_their_live_registrations_per_kind() -> None:
    log = _log(
        ("register_shm", {"name": "s1"}),
        ("register_cuda_shm", {"name": "c1"}),
        ("register_cuda_shm", {"name": "c2"}),
        ("unregister_cuda_shm", {"name": "c1"}),
        ("register_shm", {"name": "s2"}),
    )
    assert log == [
        ("register_shm", {"name": "s1"}),
        ("register_cuda_shm", {"name": "c2"}),
        ("register_shm", {"name": "s2"}),
    ]
    # unregistering every CUDA region drops the CUDA ones only; the system ones stay
    compact(log, "unregister_cuda_shm", {"name": ""})
    assert log == [("register_shm", {"name": "s1"}), ("register_shm", {"name": "s2"})]
    compact(log, "unregister_shm", {"name": ""})
    assert log == []
