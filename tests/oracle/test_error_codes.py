"""oracle.ErrorCode: the one list of error codes, its wire values, the docs that list them, and
the rule that code is produced and matched through the enum, never as a bare string."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import get_args

import pytest

from turnout.oracle import ConfigError, ErrorCode, OracleError, PackError

ROOT = Path(__file__).resolve().parents[2]
API_DOC = (ROOT / "docs" / "oracle-api.md").read_text(encoding="utf-8")
SERVICE_DOC = (ROOT / "docs" / "service.md").read_text(encoding="utf-8")

# The wire values as they were when the enum was made: changing one breaks scripts and clients.
WIRE_VALUES = {
    "oracle": {"oracle_error", "bad_config"},
    "config": {
        "unknown_field",
        "bad_value",
        "bad_spec",
        "file_not_found",
        "local_file",
        "bad_command",
        "unknown_flag",
        "bad_flag_value",
        "placeholder_model",
        "placeholder_value",
        "missing_model",
        "unknown_model",
        "gated_model",
        "revision_not_found",
    },
    "pack": {"invalid_pack", "unknown_pack"},
    "decision": {
        "pin_conflict",
        "no_runner",
        "invalid_env",
        "unknown_architecture",
        "refused",
        "unknown_setting",
        "architecture_not_served",
    },
    "cli": {"bad_usage", "vllm_not_installed"},
    "service": {
        "invalid_request",
        "body_too_large",
        "unstorable_value",
        "unauthenticated",
        "bad_token",
        "forbidden",
        "if_match_required",
        "bad_if_match",
        "self_revoke",
        "unknown_family",
        "store_error",
        "not_found",
        "version_conflict",
        "invalid_change",
        "database_unavailable",
        "unknown_cohort",
        "unknown_token",
        "bad_percentage",
        "name_required",
        "reason_required",
        "reason_too_long",
        "token_expired",
        "method_not_allowed",
        "unsupported_media_type",
        "internal_error",
        "unknown_ramp",
        "ramp_exists",
        "wrong_state",
        "self_approval",
        "unknown_flip",
        "unknown_webhook",
        "too_many_requests",
    },
}


def _area(area: str) -> set[str]:
    return {c.value for c in ErrorCode if c.area == area}


def test_wire_values_and_areas_are_unchanged() -> None:
    assert {area: _area(area) for area in WIRE_VALUES} == WIRE_VALUES
    assert {c.area for c in ErrorCode} == set(WIRE_VALUES)
    for code in ErrorCode:
        assert code == code.value and str(code) == code.value and f"{code}" == code.value
        assert code.name == code.value.upper() and ErrorCode(code.value) is code


def test_errors_carry_members() -> None:
    assert OracleError("x").code is ErrorCode.ORACLE_ERROR
    assert ConfigError("x").code is ErrorCode.BAD_CONFIG
    assert PackError([]).code is ErrorCode.INVALID_PACK
    with pytest.raises(ValueError):
        ErrorCode("no_such_code")


def _table_codes(doc: str, heading: str) -> set[str]:
    """The backticked codes of the first column of the first table after ``heading``."""
    lines = doc[doc.index(heading) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| code |"))
    codes: set[str] = set()
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        codes |= set(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    return codes


def test_oracle_api_doc_lists_the_codes() -> None:
    assert _table_codes(API_DOC, "`ConfigError` codes:") == _area("config")
    row = next(line for line in API_DOC.splitlines() if line.startswith("| `error`, `error_code`"))
    assert set(re.findall(r"`([a-z_]+)`", row.split("|")[2])) == _area("decision")
    prose = API_DOC[API_DOC.index("### Error codes") : API_DOC.index("`ConfigError` codes:")]
    for area in ("oracle", "pack", "cli"):
        assert _area(area) <= set(re.findall(r"`([a-z_]+)`", prose)), area


def test_service_doc_lists_the_codes() -> None:
    assert _table_codes(SERVICE_DOC, "## Errors") == _area("service")


def test_the_codes_of_other_layers_agree() -> None:
    from turnout.dashboard.api.schemas import InvalidRequestBody
    from turnout.engine.errors import InvalidRequestError, NoRunnerError

    assert get_args(InvalidRequestBody.model_fields["code"].annotation) == (
        ErrorCode.INVALID_REQUEST,
    )
    # engine.core runs without the oracle (no pydantic on the GPU machine): its own codes,
    # equal to the oracle's where they mean the same.
    assert NoRunnerError.code == ErrorCode.NO_RUNNER
    assert InvalidRequestError.code == ErrorCode.INVALID_REQUEST


def _bare_codes(path: Path) -> list[tuple[int, str]]:
    """(line, value) of each place in ``path`` that produces or matches a code as a bare
    string literal."""
    values = {c.value for c in ErrorCode}
    found: list[tuple[int, str]] = []

    def bare(node: ast.AST | None) -> bool:
        return isinstance(node, ast.Constant) and node.value in values

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        hits: list[ast.AST] = []
        if isinstance(node, ast.keyword) and node.arg in ("code", "error_code"):
            hits = [node.value]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(
                isinstance(s, ast.Attribute) and s.attr in ("code", "error_code") for s in sides
            ):
                hits = [
                    e
                    for s in sides
                    for e in (s.elts if isinstance(s, ast.Tuple | ast.Set | ast.List) else [s])
                ]
        elif isinstance(node, ast.Dict):
            hits = [
                v
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant) and k.value in ("code", "error_code")
            ]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "http_error":
            hits = node.args[1:2]
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(getattr(t, "id", getattr(t, "attr", "")) == "code" for t in targets):
                hits = [node.value] if node.value is not None else []
        found += [(h.lineno, h.value) for h in hits if isinstance(h, ast.Constant) and bare(h)]
    return sorted(found)


def test_no_code_is_a_bare_string_in_the_oracle_or_the_service() -> None:
    files = [p for d in ("oracle", "dashboard") for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 50
    found = [
        f"{p.relative_to(ROOT)}:{line}: {value!r}"
        for p in files
        if p != ROOT / "oracle" / "errors.py"
        for line, value in _bare_codes(p)
    ]
    assert not found, found


def test_the_bare_string_check_finds_each_form(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        'raise ConfigError("x", code="bad_value")\n'
        'if err.code == "unknown_cohort": pass\n'
        'if d.error_code in ("invalid_env", "x"): pass\n'
        'http_error(404, "not_found", "m")\n'
        'body = {"code": "invalid_request"}\n'
        'code = "store_error"\n'
        'ok = {"name": "bad_value"}\n'
    )
    assert _bare_codes(src) == [
        (1, "bad_value"),
        (2, "unknown_cohort"),
        (3, "invalid_env"),
        (4, "not_found"),
        (5, "invalid_request"),
        (6, "store_error"),
    ]
