"""What of a request's parameters reaches the model (dataplane/parameters.py), and the cost of
the common cases: nothing to take out gives back the same dict."""

import pytest

from flowserve.core.errors import InvalidArgument
from flowserve.dataplane.parameters import model_parameters


def test_keys_of_the_protocol_do_not_reach_the_model() -> None:
    given = {"binary_data_output": True, "triton_enable_empty_final_response": True, "k": "v"}
    assert model_parameters(given) == {"k": "v"}
    assert given["binary_data_output"] is True  # the front end's copy is left as it was


def test_what_the_server_reads_and_the_rest_stay() -> None:
    given = {
        "sequence_id": 7, "sequence_start": True, "priority": 1, "timeout": 5,
        "binary_data_size": 4, "shared_memory_region": "r", "classification": 2, "x": 1.5,
    }  # fmt: skip
    assert model_parameters(given) is given


def test_reserved_keys_are_refused_in_tritons_words() -> None:
    with pytest.raises(InvalidArgument) as err:
        model_parameters({"triton_": True, "key2": "value2"})
    assert err.value.message == (
        "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
        "keys starting with 'triton_' are allowed: triton_enable_empty_final_response (got 'triton_')"
    )
