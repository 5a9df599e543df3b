"""``flowserve serve [PATH ...]``: a project folder, a graph folder or a model repository by
position, mapped onto the server's repositories and graph folders; the quick start's flags
unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowserve import cli
from flowserve.settings import Settings
from tests.conftest import ROOT


def settings_of(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> Settings:
    """The Settings ``flowserve serve ARGV`` would start a server with."""
    import flowserve.server

    seen: list[Settings] = []

    async def fake_serve(options: Settings) -> int:
        seen.append(options)
        return 0

    monkeypatch.setattr(flowserve.server, "serve", fake_serve)
    monkeypatch.setattr(flowserve.server, "exit_watchdog", lambda: None)
    monkeypatch.setattr(cli.faulthandler, "enable", lambda: None)
    assert cli.main(["serve", "--loop", "asyncio", *argv]) == 0
    return seen[0]


def sources(settings: Settings) -> tuple[list[Path | str], list[Path | str]]:
    return list(settings.model_repositories), list(settings.graph_dirs)


def test_the_quick_start_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    got = settings_of(monkeypatch, ["--model-repository", "model_repository", "--graphs", "graphs"])
    assert sources(got) == ([Path("model_repository")], [Path("graphs")])


def test_a_project_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    got = settings_of(monkeypatch, [str(ROOT)])
    assert sources(got) == ([ROOT / "model_repository"], [ROOT / "graphs"])


def test_no_path_and_dot_are_the_current_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert sources(settings_of(monkeypatch, [])) == ([Path("model_repository")], [Path("graphs")])
    assert sources(settings_of(monkeypatch, ["."])) == ([Path("model_repository")], [Path("graphs")])


def test_a_repository_and_a_graph_folder_by_position(monkeypatch: pytest.MonkeyPatch) -> None:
    got = settings_of(monkeypatch, [str(ROOT / "model_repository"), str(ROOT / "graphs")])
    assert sources(got) == ([ROOT / "model_repository"], [ROOT / "graphs"])
    got = settings_of(monkeypatch, [str(ROOT / "tests" / "models"), "--graphs", str(ROOT / "graphs")])
    assert sources(got) == ([ROOT / "tests" / "models"], [ROOT / "graphs"])


def test_a_url_is_a_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    assert sources(settings_of(monkeypatch, ["s3://bucket/models"])) == (["s3://bucket/models"], [])


def test_the_path_goes_anywhere_among_the_options(monkeypatch: pytest.MonkeyPatch) -> None:
    got = settings_of(monkeypatch, ["--http-port", "9100", str(ROOT), "--grpc-port=9101"])
    assert (got.http_port, got.grpc_port) == (9100, 9101)
    assert sources(got) == ([ROOT / "model_repository"], [ROOT / "graphs"])


def test_a_missing_path_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere"
    assert cli.main(["serve", str(missing)]) == 2
    assert capsys.readouterr().err == f"error: {missing}: no such file or directory\n"


def test_a_path_taken_for_a_bool_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """``--exit-on-error PATH``: the optional BOOL takes the path; the one line says what to do."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", "--exit-on-error", "."])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "expected true or false, got '.' (a PATH after a BOOL option goes first" in err
