from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import flowserve
from flowserve.repository.settings import RepositorySettings
from flowserve.runtime.cache import ResponseCache, cache_key

ROOT = Path(__file__).resolve().parents[2]


def test_key_depends_on_everything_that_matters() -> None:
    x = {"a": np.arange(4, dtype=np.int32)}
    base = cache_key("m", 1, x)
    assert cache_key("m", 1, {"a": np.arange(4, dtype=np.int32)}) == base
    assert cache_key("m", 2, x) != base
    assert cache_key("n", 1, x) != base
    assert cache_key("m", 1, {"b": x["a"]}) != base
    assert cache_key("m", 1, {"a": x["a"].astype(np.int64)}) != base
    assert cache_key("m", 1, {"a": x["a"].reshape(2, 2)}) != base
    assert cache_key("m", 1, {"a": x["a"] + 1}) != base
    s = np.array([b"ab", b"c"], dtype=np.object_)
    assert cache_key("m", 1, {"s": s}) != cache_key("m", 1, {"s": np.array([b"a", b"bc"], dtype=np.object_)})


def test_lru_bounded_by_bytes() -> None:
    cache = ResponseCache(max_bytes=100)
    out = {"y": np.zeros(10, np.float32)}  # 40 bytes
    cache.put(b"1", out)
    cache.put(b"2", out)
    assert cache.get(b"1") is not None  # 1 is now most recent
    cache.put(b"3", out)  # evicts 2, the least recently used
    assert cache.get(b"2") is None
    assert cache.get(b"1") is not None and cache.get(b"3") is not None
    assert cache.bytes == 80 and cache.evictions == 1
    cache.put(b"big", {"y": np.zeros(100, np.float32)})  # larger than the whole cache
    assert cache.get(b"big") is None


def test_cached_tensors_cannot_be_changed() -> None:
    cache = ResponseCache(1000)
    original = np.arange(3)
    cache.put(b"k", {"y": original})
    original[0] = 99
    hit = cache.get(b"k")
    assert hit is not None and hit["y"].tolist() == [0, 1, 2]
    with pytest.raises(ValueError):
        hit["y"][0] = 5


async def test_hit_answers_without_running_any_node(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "model_repository" / "simple", repo / "simple")
    config = repo / "simple" / "config.pbtxt"
    config.write_text(config.read_text() + "\nresponse_cache { enable: true }\n")
    engine = await flowserve.Engine.start(repo, settings=RepositorySettings(cache_bytes=1 << 20))
    try:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        first = await engine.infer("simple", {"INPUT0": a, "INPUT1": a})
        second = await engine.infer("simple", {"INPUT0": a.copy(), "INPUT1": a.copy()})
        np.testing.assert_array_equal(first["OUTPUT0"], second["OUTPUT0"])
        await engine.infer("simple", {"INPUT0": a + 1, "INPUT1": a})
        stats = engine.registry.get("simple").stats
        assert stats.execution_count == 2  # the hit ran nothing
        assert stats.cache_hit.count == 1 and stats.cache_miss.count == 2
        assert stats.success.count == 3
    finally:
        await engine.stop()


async def test_a_cached_node_runs_once_per_distinct_input(tmp_path: Path) -> None:
    module = tmp_path / "cached_nodes_mod.py"
    module.write_text(
        "import numpy as np\n"
        "CALLS = []\n"
        "class Double:\n"
        "    outputs = {'y': ('FP32', [-1])}\n"
        "    def execute(self, inputs):\n"
        "        CALLS.append(1)\n"
        "        return {'y': inputs['x'] * 2}\n"
    )
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    (graphs / "g.yaml").write_text(
        "inputs: {x: {datatype: FP32, dims: [-1]}}\noutputs: {y: d.y}\n"
        "nodes:\n  d: {python: cached_nodes_mod:Double, cache: true, inputs: {x: $x}}\n"
    )
    import sys

    sys.path.insert(0, str(tmp_path))
    engine = await flowserve.Engine.start(graphs=graphs, settings=RepositorySettings(cache_bytes=1 << 20))
    try:
        import cached_nodes_mod

        for values in ([1.0], [1.0], [2.0], [1.0]):
            out = await engine.infer("g", {"x": np.array(values, np.float32)})
            np.testing.assert_array_equal(out["y"], np.array(values) * 2)
        assert len(cached_nodes_mod.CALLS) == 2
        stats = engine.registry.get("g").executor.stats[0]
        assert (stats.cache_hits, stats.cache_misses) == (2, 2)
    finally:
        await engine.stop()
        sys.path.remove(str(tmp_path))
