"""oracle/bounded_json.py: JSON from outside is refused past MAX_DEPTH levels before it is
parsed, wherever it comes in (the explain page's inputs field, ``--set`` values); brackets
inside strings do not count."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from turnout.oracle import bounded_json
from turnout.oracle.cli import app


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("1", 0),
        ('"[[[["', 0),
        ("[]", 1),
        ('{"a": [1, {"b": []}]}', 4),
        ('["]]]", ["\\"[[", []]]', 3),  # an escaped quote does not end the string
        ('[[["\\\\"]]]', 3),  # an escaped backslash does not escape the quote after it
        ("[" * 70 + "]" * 70, 70),
        ("]]]", 0),  # malformed: json.loads names it
    ],
)
def test_the_depth_counts_arrays_and_objects_outside_strings(text: str, depth: int) -> None:
    assert bounded_json.nesting_depth(text) == depth


def test_the_bound_is_checked_before_parsing() -> None:
    ok = "[" * bounded_json.MAX_DEPTH + "]" * bounded_json.MAX_DEPTH
    assert bounded_json.loads(ok) is not None
    with pytest.raises(bounded_json.TooDeepError, match="nested 65 levels deep; at most 64"):
        bounded_json.loads("[" * 65 + "]" * 65)
    # Before: 19,999 "[" raised RecursionError out of json.loads, which no ValueError
    # handler caught. It is a ValueError now, and nothing recursed.
    with pytest.raises(ValueError, match="nested 19999 levels deep"):
        bounded_json.loads("[" * 19_999)
    with pytest.raises(json.JSONDecodeError):
        bounded_json.loads('{"a": ')


def test_a_set_value_nested_too_deep_is_named_not_a_traceback() -> None:
    result = CliRunner().invoke(
        app,
        ["decide", "--architecture", "Qwen3ForCausalLM", "--set", "hf_overrides=" + "[" * 19_999],
    )
    assert result.exit_code == 2, result.output
    assert "invalid JSON value (nested 19999 levels deep" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
