"""What a path given to serve or validate is: a project, a graph folder or file, a repository."""

from pathlib import Path

import pytest

from flowserve.spec.layout import Sources, kind_of, resolve_sources


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "model_repository" / "m" / "1").mkdir(parents=True)
    (tmp_path / "graphs").mkdir()
    (tmp_path / "graphs" / "g.yaml").write_text("name: g\n")
    (tmp_path / "nodes").mkdir()
    return tmp_path


def test_kinds(project: Path) -> None:
    assert kind_of(project) == "project"
    assert kind_of(project / "model_repository") == "repository"
    assert kind_of(project / "graphs") == "graphs"
    assert kind_of(project / "graphs" / "g.yaml") == "graphs"
    assert kind_of(project / "nowhere") == "missing"
    (project / "graphs").rename(project / "pipelines")
    assert kind_of(project) == "project"  # model_repository/ alone makes a project too


def test_a_project_gives_its_repository_and_graphs(project: Path) -> None:
    assert resolve_sources([str(project)]) == Sources([project / "model_repository"], [project / "graphs"])


def test_nothing_given_is_the_current_folder(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project)
    assert resolve_sources([]) == Sources([Path("model_repository")], [Path("graphs")])
    monkeypatch.chdir(project / "nodes")  # no project here: nothing to serve
    assert resolve_sources([]) == Sources()


def test_positions_and_flags_together(project: Path) -> None:
    got = resolve_sources(
        [str(project / "model_repository"), str(project / "graphs" / "g.yaml"), "s3://bucket/repo", "gone"],
        repositories=["gs://b/r", str(project / "other")],
        graphs=["s3://bucket/graphs"],
    )
    assert got == Sources(
        [project / "model_repository", "s3://bucket/repo", "gs://b/r", project / "other"],
        [project / "graphs" / "g.yaml", "s3://bucket/graphs"],
        ["gone"],
    )


def test_flags_alone_replace_the_default(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project)
    assert resolve_sources([], graphs=["graphs"]) == Sources([], [Path("graphs")])
