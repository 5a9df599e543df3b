"""A failing node's own code is shown where it failed: the log has the traceback of the user's
code (file:line, flowserve's frames left out), rate-limited; the error message carries it only
with ``error_traceback`` (``--error-traceback``); load-time failures (import, __init__,
initialize) say file:line and log the traceback."""

from __future__ import annotations

import logging
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest

from flowserve.core.errors import FlowserveError, InvalidArgument, NodeError, code_location, code_traceback
from flowserve.dataplane.engine import Engine
from flowserve.repository.settings import RepositorySettings

GRAPH = """
name: {name}
inputs:
  x: {{datatype: FP32, dims: [4]}}
outputs:
  y: pre.y
nodes:
  pre:
    python: {module}:Pre
    inputs: {{x: $x}}
    outputs: {{y: {{datatype: FP32, dims: [4]}}}}
"""


def project(tmp_path: Path, code: str) -> tuple[Path, str]:
    """A graphs folder with one graph 'g' whose node runs ``code``'s class Pre (a module of a
    name of its own, beside the graphs folder, as a project's nodes/ are)."""
    module = f"user_node_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(code))
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    (graphs / "g.yaml").write_text(GRAPH.format(name="g", module=module))
    return graphs, module


FAILS_IN_EXECUTE = """
    import numpy as np

    def scale(x):
        return x * {}["factor"]

    class Pre:
        def execute(self, inputs):
            return {"y": scale(inputs["x"])}
"""


def _log_text(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records)


async def test_a_request_time_failure_logs_the_users_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    graphs, module = project(tmp_path, FAILS_IN_EXECUTE)
    engine = await Engine.start(graphs=graphs)
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(NodeError) as err:
            await engine.infer("g", {"x": np.ones(4, np.float32)})
        assert err.value.message == "in graph 'g', node 'pre': KeyError: 'factor'"  # no traceback
        logged = _log_text(caplog)
        assert "node failed: KeyError: 'factor'\nTraceback (most recent call last):" in logged
        assert f'{module}.py", line 9, in execute' in logged  # the user's frames, innermost last
        assert f'{module}.py", line 5, in scale' in logged
        assert "flowserve" not in logged.split("Traceback", 1)[1]  # no frame of flowserve's
    finally:
        await engine.stop()


async def test_error_traceback_puts_it_in_the_error_message(tmp_path: Path) -> None:
    graphs, module = project(tmp_path, FAILS_IN_EXECUTE)
    engine = await Engine.start(graphs=graphs, settings=RepositorySettings(error_traceback=True))
    try:
        with pytest.raises(NodeError) as err:
            await engine.infer("g", {"x": np.ones(4, np.float32)})
        first, rest = err.value.message.split("\n", 1)
        assert first == "in graph 'g', node 'pre': KeyError: 'factor'"
        assert rest.startswith("Traceback (most recent call last):") and rest.endswith("KeyError: 'factor'")
        assert f'{module}.py", line 5, in scale' in rest
        assert err.value.detail == "KeyError: 'factor'"  # statistics and traces keep one line
    finally:
        await engine.stop()


async def test_request_time_failures_are_logged_at_most_once_a_second(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    graphs, _ = project(tmp_path, FAILS_IN_EXECUTE)
    engine = await Engine.start(graphs=graphs)
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(20):
                with pytest.raises(NodeError):
                    await engine.infer("g", {"x": np.ones(4, np.float32)})
        lines = [r for r in caplog.records if r.getMessage().startswith("node failed")]
        assert 1 <= len(lines) < 20  # a client cannot fill the log (core/ratelog.py)
    finally:
        await engine.stop()


async def test_a_failing_initialize_says_file_and_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    code = """
        class Pre:
            def initialize(self, config):
                self.std = config["parameters"]["std"]

            def execute(self, inputs):
                return {"y": inputs["x"]}
    """
    graphs, module = project(tmp_path, code)
    with caplog.at_level(logging.ERROR):
        engine = await Engine.start(graphs=graphs)
    try:
        status = next(s for s in engine.registry.index() if s.name == "g")
        where = f"{tmp_path / module}.py:4"
        assert status.reason == f"node 'pre' failed to start: KeyError: 'std' (at {where})"
        logged = _log_text(caplog)
        assert f"(at {where})\nTraceback (most recent call last):" in logged
        assert f'{module}.py", line 4, in initialize' in logged
    finally:
        await engine.stop()


async def test_a_module_that_fails_at_import_is_a_load_error_not_a_crash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    graphs, module = project(tmp_path, "import numpy\nundefined_name\n")
    with caplog.at_level(logging.ERROR):
        engine = await Engine.start(graphs=graphs)
    try:
        status = next(s for s in engine.registry.index() if s.name == "g")
        assert (
            f"cannot import module '{module}': NameError: name 'undefined_name' is not defined"
            in status.reason
        )
        assert f"(at {tmp_path / module}.py:2)" in status.reason
        assert f'{module}.py", line 2, in <module>' in _log_text(caplog)
    finally:
        await engine.stop()


async def test_a_syntax_error_says_where(tmp_path: Path) -> None:
    graphs, module = project(tmp_path, "class Pre:\n    def execute(self, inputs)\n        pass\n")
    engine = await Engine.start(graphs=graphs)
    try:
        status = next(s for s in engine.registry.index() if s.name == "g")
        assert "SyntaxError" in status.reason and f"(at {tmp_path / module}.py:2)" in status.reason
    finally:
        await engine.stop()


def test_code_traceback_leaves_flowserve_out_but_keeps_everything_when_nothing_else() -> None:
    try:
        raise FlowserveError("ours")
    except FlowserveError as exc:
        own = exc
    # raised in a test file (not flowserve's): its frame is the user's code
    assert code_location(own).endswith("test_executor_errors.py:" + str(own.__traceback__.tb_lineno))
    assert code_traceback(own).endswith("flowserve.core.errors.FlowserveError: ours")


async def test_a_misspelled_class_gets_a_did_you_mean(tmp_path: Path) -> None:
    graphs, module = project(tmp_path, "class Prep:\n    def execute(self, inputs):\n        return inputs\n")
    engine = await Engine.start(graphs=graphs)
    try:
        status = next(s for s in engine.registry.index() if s.name == "g")
        assert f"module '{module}' has no attribute 'Pre' (did you mean 'Prep'?)" in status.reason
    finally:
        await engine.stop()


@pytest.mark.parametrize("error_traceback", [False, True])
async def test_the_load_api_answer_has_the_traceback_only_with_error_traceback(
    tmp_path: Path, error_traceback: bool
) -> None:
    code = """
        class Pre:
            def initialize(self, config):
                raise RuntimeError("no weights")

            def execute(self, inputs):
                return inputs
    """
    graphs, module = project(tmp_path, code)
    engine = await Engine.start(graphs=graphs, settings=RepositorySettings(error_traceback=error_traceback))
    try:
        with pytest.raises(InvalidArgument) as err:
            await engine.repository.load_model("g")
        first = err.value.message.split("\n", 1)[0]
        assert first == (
            f"failed to load 'g': node 'pre' failed to start: RuntimeError: no weights (at {tmp_path / module}.py:4)"
        )
        assert ("Traceback (most recent call last):" in err.value.message) is error_traceback
        if error_traceback:
            assert f'{module}.py", line 4, in initialize' in err.value.message
    finally:
        await engine.stop()
