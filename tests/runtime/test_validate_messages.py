"""The input-count message in Triton 2.51's words (core's ValidateRequestInputs, as its qa
suite L0_input_validation checks it): a count, or a range when the model has optional inputs."""

from pathlib import Path

import numpy as np
import pytest

from flowserve.core.errors import InvalidArgument
from flowserve.graph.compile import compile_graph
from flowserve.graph.plan import Plan, Signature
from flowserve.runtime.validate import InputValidator
from flowserve.spec.graph_yaml import load_graph_file


def plan(tmp_path: Path, name: str, optional: set[str]) -> Plan:
    lines = "".join(
        f"  {n}: {{datatype: FP32, dims: [-1]{', optional: true' if n in optional else ''}}}\n"
        for n in ("INPUT0", "INPUT1", "INPUT2", "INPUT3")
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\ninputs:\n{lines}"
        "outputs: {y: {from: n.y, datatype: FP32, dims: [1]}}\n"
        "nodes:\n  n: {python: 'm:A', inputs: {a: $INPUT0, b: $INPUT1, c: $INPUT2, d: $INPUT3}}\n"
    )
    return compile_graph(load_graph_file(path), lambda node: Signature(None, {"y": None}))


def message(check: InputValidator, inputs: dict[str, np.ndarray]) -> str:
    with pytest.raises(InvalidArgument) as err:
        check(inputs)
    return err.value.message


ONE = {"INPUT0": np.zeros(1, np.float32)}


def test_all_required_says_the_count(tmp_path: Path) -> None:
    check = InputValidator(plan(tmp_path, "input_all_required", set()))
    # four required inputs here (the qa model has three; the words are the same)
    assert message(check, ONE) == (
        "expected 4 inputs but got 1 inputs for model 'input_all_required'. Got input(s) "
        "['INPUT0'], but missing required input(s) ['INPUT1','INPUT2','INPUT3']. "
        "Please provide all required input(s)."
    )
    assert message(check, {}).startswith(
        "expected 4 inputs but got 0 inputs for model 'input_all_required'. Got input(s) [], "
        "but missing required input(s) ['INPUT0','INPUT1','INPUT2','INPUT3']."
    )


def test_optional_inputs_say_the_range(tmp_path: Path) -> None:
    check = InputValidator(plan(tmp_path, "input_optional", {"INPUT3"}))
    assert message(check, ONE) == (
        "expected number of inputs between 3 and 4 but got 1 inputs for model 'input_optional'. "
        "Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1','INPUT2']. "
        "Please provide all required input(s)."
    )
    assert "between 3 and 4 but got 0 inputs" in message(check, {})


def test_all_optional_accepts_none(tmp_path: Path) -> None:
    check = InputValidator(plan(tmp_path, "input_all_optional", {"INPUT0", "INPUT1", "INPUT2", "INPUT3"}))
    assert check({}) == 1


def test_a_required_input_left_out_within_the_range_is_refused(tmp_path: Path) -> None:
    # Triton lets this reach the backend (its check is the count only); here it is refused
    check = InputValidator(plan(tmp_path, "m", {"INPUT2", "INPUT3"}))
    three = {"INPUT0": ONE["INPUT0"], "INPUT2": ONE["INPUT0"], "INPUT3": ONE["INPUT0"]}
    assert "missing required input(s) ['INPUT1']" in message(check, three)


def test_an_unknown_input_is_named(tmp_path: Path) -> None:
    check = InputValidator(plan(tmp_path, "m", set()))
    assert message(check, {"X": ONE["INPUT0"]}).startswith("unexpected inference input 'X' for model 'm'")
