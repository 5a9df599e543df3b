"""FIL backend (tree models): predictions equal xgboost, lightgbm and scikit-learn called
directly, with Triton FIL's output_class / predict_proba / threshold; clear load errors."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

from flowserve.nodes.backends.fil import FilSettings, postprocess
from flowserve.runtime.registry import State

xgboost = pytest.importorskip("xgboost")
lightgbm = pytest.importorskip("lightgbm")
pytest.importorskip("treelite")


def config(model_type: str, features: int, out_dims: int, **params: str) -> str:
    entries = [("model_type", model_type), *params.items()]
    text = "\n".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in entries)
    return f"""
backend: "fil"
max_batch_size: 64
input [ {{ name: "input__0" data_type: TYPE_FP32 dims: [ {features} ] }} ]
output [ {{ name: "output__0" data_type: TYPE_FP32 dims: [ {out_dims} ] }} ]
{text}
"""


def data(make_models, rows: int = 40) -> np.ndarray:
    return np.random.RandomState(7).rand(rows, make_models.FEATURES).astype(np.float32)


async def infer(bk, repo: Path, name: str, x: np.ndarray) -> np.ndarray:
    async with bk.engine_for(repo) as engine:
        state, reason = bk.status(engine, name)
        assert state is State.READY, reason
        out = await engine.infer(name, {"input__0": x})
    return out["output__0"]


async def test_bundled_xgboost_matches_xgboost(bk, make_models) -> None:
    booster = xgboost.Booster(model_file=str(bk.BUNDLED / "fil_xgboost/1/xgboost.json"))
    x = data(make_models)
    got = await infer(bk, bk.BUNDLED, "fil_xgboost", x)
    assert got.shape == (len(x), 1) and got.dtype == np.float32
    np.testing.assert_allclose(got[:, 0], booster.predict(xgboost.DMatrix(x)), rtol=1e-6, atol=1e-7)


async def test_xgboost_ubj_multiclass_proba_and_class(bk, make_models, tmp_path: Path) -> None:
    x = data(make_models)
    for name, extra, dims in (
        ("proba", {"output_class": "true", "predict_proba": "true"}, 3),
        ("klass", {"output_class": "true"}, 1),
    ):
        model_dir = bk.write_model(tmp_path, name, config("xgboost_ubj", x.shape[1], dims, **extra))
        booster = make_models.make_xgboost(model_dir / "1" / "xgboost.ubj", "multi:softprob")
    want = booster.predict(xgboost.DMatrix(x))
    np.testing.assert_allclose(await infer(bk, tmp_path, "proba", x), want, rtol=1e-5, atol=1e-6)
    klass = await infer(bk, tmp_path, "klass", x)
    np.testing.assert_array_equal(klass[:, 0], np.argmax(want, axis=1).astype(np.float32))


async def test_xgboost_regression(bk, make_models, tmp_path: Path) -> None:
    model_dir = bk.write_model(tmp_path, "reg", config("xgboost_json", 6, 1))
    booster = make_models.make_xgboost(model_dir / "1" / "xgboost.json", "reg:squarederror")
    x = data(make_models)
    got = await infer(bk, tmp_path, "reg", x)
    np.testing.assert_allclose(got[:, 0], booster.predict(xgboost.DMatrix(x)), rtol=1e-5, atol=1e-6)


async def test_lightgbm_binary_threshold_and_proba(bk, make_models, tmp_path: Path) -> None:
    x = data(make_models)
    for name, extra, dims in (
        ("lgb_class", {"output_class": "true", "threshold": "0.6"}, 1),
        ("lgb_proba", {"output_class": "true", "predict_proba": "true"}, 2),
    ):
        model_dir = bk.write_model(tmp_path, name, config("lightgbm", x.shape[1], dims, **extra))
        booster = make_models.make_lightgbm(model_dir / "1" / "model.txt")
    p = booster.predict(x)
    klass = await infer(bk, tmp_path, "lgb_class", x)
    np.testing.assert_array_equal(klass[:, 0], (p > 0.6).astype(np.float32))
    proba = await infer(bk, tmp_path, "lgb_proba", x)
    np.testing.assert_allclose(proba, np.stack([1 - p, p], axis=1), rtol=1e-5, atol=1e-6)


async def test_lightgbm_regression(bk, make_models, tmp_path: Path) -> None:
    model_dir = bk.write_model(tmp_path, "lgb_reg", config("lightgbm", 6, 1))
    booster = make_models.make_lightgbm(model_dir / "1" / "model.txt", "regression")
    x = data(make_models)
    got = await infer(bk, tmp_path, "lgb_reg", x)
    np.testing.assert_allclose(got[:, 0], booster.predict(x), rtol=1e-5, atol=1e-6)


async def test_sklearn_forest_pickle_and_treelite_checkpoint(bk, make_models, tmp_path: Path) -> None:
    sklearn_ensemble = pytest.importorskip("sklearn.ensemble")
    import treelite

    x_train, _, multi = make_models.tree_data()
    forest = sklearn_ensemble.RandomForestClassifier(n_estimators=4, max_depth=3, random_state=0)
    forest.fit(x_train, multi)
    proba = {"output_class": "true", "predict_proba": "true"}
    pkl_dir = bk.write_model(tmp_path, "rf_pickle", config("sklearn", 6, 3, **proba))
    (pkl_dir / "1" / "model.pkl").write_bytes(pickle.dumps(forest))
    tl_dir = bk.write_model(tmp_path, "rf_checkpoint", config("treelite_checkpoint", 6, 3, **proba))
    treelite.sklearn.import_model(forest).serialize(str(tl_dir / "1" / "checkpoint.tl"))
    x = data(make_models)
    want = forest.predict_proba(x)
    np.testing.assert_allclose(await infer(bk, tmp_path, "rf_pickle", x), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(await infer(bk, tmp_path, "rf_checkpoint", x), want, rtol=1e-5, atol=1e-6)


def test_postprocess_rules() -> None:
    scores = np.array([[0.2], [0.7]], np.float32)
    plain = FilSettings(output_class=False, predict_proba=False, threshold=0.5, threads=1)
    klass = FilSettings(output_class=True, predict_proba=False, threshold=0.5, threads=1)
    proba = FilSettings(output_class=True, predict_proba=True, threshold=0.5, threads=1)
    np.testing.assert_array_equal(postprocess(scores, plain), scores)
    np.testing.assert_array_equal(postprocess(scores, klass), [[0.0], [1.0]])
    np.testing.assert_allclose(postprocess(scores, proba), [[0.8, 0.2], [0.3, 0.7]])
    multi = np.array([[0.1, 0.6, 0.3]], np.float32)
    np.testing.assert_array_equal(postprocess(multi, klass), [[1.0]])


async def test_bad_model_type_and_missing_file(bk, tmp_path: Path) -> None:
    bk.copy_bundled(tmp_path, "fil_xgboost")
    bk.write_model(tmp_path, "odd_type", config("catboost", 6, 1))
    bk.write_model(tmp_path, "no_file", config("lightgbm", 6, 1))
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "odd_type")
        assert state is State.UNAVAILABLE and "model 'odd_type'" in reason and "catboost" in reason
        state, reason = bk.status(engine, "no_file")
        assert state is State.UNAVAILABLE and "model 'no_file'" in reason and "model.txt" in reason
        assert engine.registry.has("fil_xgboost")


async def test_missing_treelite_fails_only_that_model(bk, tmp_path: Path, monkeypatch) -> None:
    bk.copy_bundled(tmp_path, "fil_xgboost", "simple")
    monkeypatch.setitem(sys.modules, "treelite", None)
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "fil_xgboost")
        assert state is State.UNAVAILABLE
        assert "model 'fil_xgboost'" in reason and "'treelite'" in reason and "flowserve[trees]" in reason
        assert engine.registry.has("simple")
