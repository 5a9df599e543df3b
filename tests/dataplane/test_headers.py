"""Header-forward patterns in RE2 syntax, read as Triton reads them: (?i) before the pattern,
matched anywhere in the name, flag groups anywhere (dataplane/headers.py)."""

import pytest

from flowserve.dataplane.headers import also_forward, compile_pattern, forward_headers, matching_headers


def test_case_insensitive_unless_the_pattern_says_otherwise() -> None:
    assert compile_pattern("MY_HEADER.*", "--x").matches("my_header_1")
    sensitive = compile_pattern("(?-i)MY_HEADER.*", "--x")  # refused by Python's re
    assert not sensitive.matches("my_header_1")
    assert sensitive.matches("MY_HEADER_1")
    # a flag group holds to the end of its group, across alternatives (RE2, as Perl)
    both = compile_pattern("(?-i)UP_.*|(?i)low_.*", "--x")
    assert both.matches("LOW_1") and not both.matches("up_1")


def test_matched_anywhere_in_the_name() -> None:
    assert compile_pattern("header", "--x").matches("my_header_1")
    assert not compile_pattern("^header", "--x").matches("my_header_1")


def test_invalid_patterns_name_the_option() -> None:
    with pytest.raises(
        ValueError, match=r"--grpc-header-forward-pattern: invalid regular expression 'a\(\?=b\)'"
    ):
        compile_pattern("a(?=b)", "--grpc-header-forward-pattern")  # lookahead: not RE2


def test_forwarding() -> None:
    # names are matched in lower case (HTTP/2 sends them so; the HTTP server lowers them), so a
    # case-sensitive upper-case pattern forwards nothing
    pattern = also_forward(compile_pattern("(?-i)X_.*|y_.*", "--x"), "traceparent")
    headers = [(b"X_A", b"1"), (b"Y_B", b"2"), (b"Traceparent", b"00-1"), ("other", "3")]
    assert matching_headers(headers, pattern) == [("y_b", "2"), ("traceparent", "00-1")]
    params = {"y_b": "mine"}
    forward_headers(params, headers, pattern)
    assert params == {"y_b": "mine", "traceparent": "00-1"}  # the request's own parameter wins
