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


def test_an_unterminated_string_is_matched_once_to_the_end() -> None:
    # Before: the string pattern was tried again from every quote of an unterminated string,
    # each try running to the end of the text: quadratic (40,000 escaped quotes took 20 s,
    # a 200 KB --canaries file never finished). Now one match takes the rest of the text.
    text = '["' + '\\"' * 300_000
    assert bounded_json._STRING.search(text).span() == (1, len(text))
    assert bounded_json.nesting_depth(text) == 1
    with pytest.raises(json.JSONDecodeError):
        bounded_json.loads(text)


def test_bytes_are_read_as_utf8_as_json_loads_reads_them() -> None:
    assert bounded_json.loads(b'{"a": [1]}') == {"a": [1]}
    with pytest.raises(bounded_json.TooDeepError):
        bounded_json.loads(b"[" * 100)
    with pytest.raises(ValueError):
        bounded_json.loads(b"\xff")
