"""The numeric operators whose operand names another dimension, and ``multiple_of``
(docs/policy-language.md, "Conditions"): parsed with clear errors, compiled and evaluated the
same way (generated code and :meth:`Condition.test`)."""

from __future__ import annotations

from typing import Any

import pytest

from turnout.oracle.conditions import Condition, ConditionParser
from turnout.oracle.yamlpos import Positions

DOMAINS: dict[str, tuple[Any, ...] | None] = {
    "tensor_parallel_size": (1, 2, 8),
    "decode_context_parallel_size": (1, 2),
    "num_key_value_heads": (2, 8),
    "platform": ("cuda", "rocm"),
    "enforce_eager": (False, True),
}


def _parse(when: dict[str, Any]) -> tuple[tuple[Condition, ...], list[str]]:
    parser = ConditionParser(DOMAINS, Positions("pack.yaml"))
    conds = parser.parse_when(when, ("rules", 0, "when"))
    return conds, [str(i) for i in parser.issues]


def _evaluate(cond: Condition, config: dict[str, Any]) -> bool:
    """The generated expression, run on a config object."""
    consts: dict[str, Any] = {}
    source = cond.source(consts)
    c = type("C", (), config)()
    return bool(eval(source, {**consts, "c": c}))  # the pack compiler's own generated code


@pytest.mark.parametrize(
    ("when", "config", "want"),
    [
        ({"tensor_parallel_size": {"not_multiple_of": "decode_context_parallel_size"}},
         {"tensor_parallel_size": 3, "decode_context_parallel_size": 2}, True),
        ({"tensor_parallel_size": {"not_multiple_of": "decode_context_parallel_size"}},
         {"tensor_parallel_size": 4, "decode_context_parallel_size": 2}, False),
        ({"tensor_parallel_size": {"multiple_of": 4}}, {"tensor_parallel_size": 8}, True),
        ({"tensor_parallel_size": {"multiple_of": 4}}, {"tensor_parallel_size": 2}, False),
        ({"tensor_parallel_size": {"le": "num_key_value_heads"}},
         {"tensor_parallel_size": 8, "num_key_value_heads": 8}, True),
        ({"tensor_parallel_size": {"le": "num_key_value_heads"}},
         {"tensor_parallel_size": 16, "num_key_value_heads": 8}, False),
        # an unknown fact satisfies no numeric operator; nothing is a multiple of 0
        ({"tensor_parallel_size": {"le": "num_key_value_heads"}},
         {"tensor_parallel_size": 1, "num_key_value_heads": None}, False),
        ({"num_key_value_heads": {"not_multiple_of": "tensor_parallel_size"}},
         {"tensor_parallel_size": 0, "num_key_value_heads": 8}, False),
        # a product of dimensions: vLLM's tp < dcp * kv (ModelConfig.verify_with_parallel_config)
        ({"tensor_parallel_size": {"lt": "decode_context_parallel_size*num_key_value_heads"}},
         {"tensor_parallel_size": 8, "decode_context_parallel_size": 2, "num_key_value_heads": 8},
         True),
        ({"tensor_parallel_size": {"lt": "decode_context_parallel_size*num_key_value_heads"}},
         {"tensor_parallel_size": 16, "decode_context_parallel_size": 2, "num_key_value_heads": 8},
         False),
        ({"tensor_parallel_size": {"lt": "decode_context_parallel_size*num_key_value_heads"}},
         {"tensor_parallel_size": 1, "decode_context_parallel_size": 2, "num_key_value_heads": None},
         False),
        ({"decode_context_parallel_size": {"not_multiple_of": "tensor_parallel_size*num_key_value_heads"}},
         {"tensor_parallel_size": 2, "decode_context_parallel_size": 6, "num_key_value_heads": 2},
         True),
    ],
)  # fmt: skip
def test_generated_code_and_test_agree(
    when: dict[str, Any], config: dict[str, Any], want: bool
) -> None:
    [cond], issues = _parse(when)
    assert issues == []
    assert _evaluate(cond, config) is want
    assert cond.test(config[cond.dim], config.__getitem__) is want
    operands = [v for v in next(iter(when.values())).values() if isinstance(v, str)]
    assert cond.refs == tuple(f for v in operands for f in v.split("*"))


def test_without_the_other_value_a_reference_may_hold() -> None:
    """Lint and the matrix test one dimension at a time: a comparison with another dimension
    counts as satisfiable there, so no rule is reported unreachable for it."""
    [cond], _ = _parse({"tensor_parallel_size": {"gt": 1, "le": "num_key_value_heads"}})
    assert cond.test(2) is True
    assert cond.test(1) is False  # the plain operand still counts


@pytest.mark.parametrize(
    ("when", "message"),
    [
        ({"tensor_parallel_size": {"le": "no_such_dim"}},
         "le expects a number or a dimension's name, got 'no_such_dim'"),
        ({"tensor_parallel_size": {"le": "hidden_size"}},  # a dimension, not declared here
         "le: 'hidden_size' is not a numeric dimension of this pack"),
        ({"tensor_parallel_size": {"le": "platform"}},
         "le: 'platform' is not a numeric dimension of this pack"),
        ({"tensor_parallel_size": {"multiple_of": 0}}, "multiple_of expects a positive integer"),
        ({"tensor_parallel_size": {"multiple_of": 1.5}}, "multiple_of expects a positive integer"),
        ({"enforce_eager": {"multiple_of": 2}}, "multiple_of needs an integer dimension"),
        ({"tensor_parallel_size": {"divides": 2}}, "unknown operator 'divides'; expected one of"),
        ({"tensor_parallel_size": {"gt": [1]}}, "gt expects a number or a dimension's name"),
        ({"tensor_parallel_size": {"lt": "num_key_value_heads*platform"}},
         "lt: 'platform' is not a numeric dimension of this pack"),
        ({"tensor_parallel_size": {"lt": "num_key_value_heads*no_such_dim"}},
         "lt expects a number or a dimension's name, got 'num_key_value_heads*no_such_dim'"),
    ],
)  # fmt: skip
def test_bad_operands_are_named(when: dict[str, Any], message: str) -> None:
    conds, issues = _parse(when)
    assert conds == ()
    assert len(issues) == 1 and message in issues[0], issues
