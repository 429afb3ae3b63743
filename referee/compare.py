"""A pack's answer next to vLLM's: decision, error text and every log line, in order.

Used by ``python -m referee check`` (vLLM live, a fresh seed) and by the CI test that holds each
pack to its golden file (tests/oracle/test_release_golden.py), so both compare the same way.
Needs only the oracle (pydantic, PyYAML), never vLLM.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


def pack_answer(pack: Any, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The pack's answer for a spec, in the golden files' ``want`` shape; a spec the oracle
    refuses to read gives ``decision: "invalid"`` with the reading error."""
    from turnout.oracle import from_spec
    from turnout.oracle.errors import ConfigError

    try:
        config = from_spec(spec)
    except ConfigError as exc:
        return {"decision": "invalid", "error": exc.message, "warnings": []}
    return _decided(pack, config)


def _decided(pack: Any, config: Any) -> dict[str, Any]:
    """The pack's decision on a read config, in the golden files' ``want`` shape."""
    from turnout.oracle import decide

    d = decide(config, pack=pack)
    out: dict[str, Any] = {
        "decision": d.runner or "error",
        "warnings": [m.to_json() for m in d.messages],
    }
    if d.runner is None:
        out["error"] = d.error
    return out


def agree(want: Mapping[str, Any], got: Mapping[str, Any]) -> tuple[bool, bool]:
    """(same decision, same everything: decision, error text, log lines in order)."""
    same_decision = want["decision"] == got["decision"]
    same_all = (
        same_decision
        and list(want.get("warnings", [])) == list(got.get("warnings", []))
        and (want["decision"] != "error" or want.get("error") == got.get("error"))
    )
    return same_decision, same_all


@dataclass
class Tally:
    """Agreement counted over ``(want, got)`` pairs: cases, same decision, same everything
    (:func:`agree`) and the count of each decision vLLM gave."""

    total: int = 0
    same_decision: int = 0
    same_all: int = 0
    by_decision: Counter[str] = field(default_factory=Counter)

    def add(self, want: Mapping[str, Any], got: Mapping[str, Any]) -> bool:
        """Count one pair; whether they agree on everything."""
        d_ok, all_ok = agree(want, got)
        self.total += 1
        self.same_decision += d_ok
        self.same_all += all_ok
        self.by_decision[want["decision"]] += 1
        return all_ok

    def share(self, count: int) -> float:
        return round(count / max(self.total, 1), 4)


def compare_pack(
    pack_name: str, cases: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]
) -> dict[str, Any]:
    """Agreement of ``pack_name`` with vLLM's answers over ``(case, want)`` pairs: the shares
    that agree on the decision and on everything, counts per decision, and the mismatches."""
    from turnout.oracle import load_pack

    pack = load_pack(pack_name)
    tally = Tally()
    mismatches: list[dict[str, Any]] = []
    for case, want in cases:
        got = pack_answer(pack, case["config"])
        if not tally.add(want, got):
            mismatches.append(
                {"id": case["id"], "config": case["config"], "want": want, "got": got}
            )
    return {
        "pack": pack_name,
        "cases": tally.total,
        "by_decision": dict(tally.by_decision),
        "agree_decision": tally.share(tally.same_decision),
        "agree_all": tally.share(tally.same_all),
        "mismatches": mismatches,
    }


def line_answer(
    pack: Any, case: Mapping[str, Any], argv: list[str], release: str
) -> dict[str, Any]:
    """The pack's answer for a ``vllm serve`` case of :mod:`referee.serve_gen` (``argv`` with
    the model folders in place), read the way ``turnout decide -- vllm serve ...`` reads it:
    the release's flag table, the model's facts from its config.json, the case's environment,
    platform and device capability."""
    from turnout.oracle import DeploymentConfig
    from turnout.oracle.errors import ConfigError
    from turnout.oracle.sources import command_to_fields

    try:
        parsed = command_to_fields(argv, dict(case.get("env") or {}), release=release, offline=True)
        config = DeploymentConfig(
            **parsed.fields,
            platform=case["platform"],
            device_capability=case["device_capability"],
        )
    except ConfigError as exc:
        return {"decision": "invalid", "error": exc.message, "warnings": []}
    return _decided(pack, config)
