"""A deployment's page: its latest decision, the inputs its engine reported with it (the
config's fields that differ from their defaults: ``DeploymentConfig.to_spec()``), the command
line that decides those inputs again, and the link to Explain them.

The engine reports its configuration, not its ``vllm serve`` line, so the command shown is the
``turnout decide`` line that rebuilds exactly that configuration (``--architecture``, ``--set
FIELD=VALUE`` per field, ``--env`` per runner variable, ``--deployment-id`` for percentage
canaries): pasted in a shell it gives the decision the page shows (with ``--canaries`` for the
service's live canaries rather than the pack's defaults).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

_SCALAR_WORDS = frozenset({"true", "false", "none", "null"})


def deployment_url(deployment_id: str) -> str:
    """The page of a deployment; every character of the id is escaped, ``/`` included, so an
    id such as ``a/../b`` reaches the page whole instead of being resolved by the browser."""
    return "/deployments/" + quote(deployment_id, safe="")


def _reads_back(text: str) -> bool:
    """True when ``turnout decide --set f=TEXT`` reads TEXT as the string itself (not as
    JSON, a number or a keyword: oracle.cli.inputs.parse_json_value)."""
    stripped = text.strip()
    if stripped != text or not text or stripped[:1] in "{[" or stripped.lower() in _SCALAR_WORDS:
        return False
    for convert in (int, float):
        try:
            convert(stripped)
        except ValueError:
            continue
        return False
    return True


def set_value(value: Any) -> str | None:
    """The text of ``--set FIELD=...`` that reads back as ``value``; None when there is none
    (a string such as ``"8"`` that the option would read as a number)."""
    if isinstance(value, str):
        return value if _reads_back(value) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return json.dumps(value, separators=(",", ":"))


@dataclass(frozen=True)
class DecideLine:
    """The ``turnout decide`` words for a stored spec, and the fields it could not express."""

    words: list[str]
    missing: list[str]

    def text(self) -> str:
        return shlex.join(self.words)


def decide_line(
    spec: dict[str, Any], *, deployment_id: str, pack: str, turnout: str = "turnout"
) -> DecideLine:
    """The command line that rebuilds ``spec`` (a ``to_spec()`` mapping) and decides it."""
    words = [*shlex.split(turnout), "decide", "--pack", pack, "--deployment-id", deployment_id]
    missing = []
    for name, value in sorted(spec.items(), key=lambda kv: (kv[0] != "architecture", kv[0])):
        if name == "deployment_id":
            continue
        if name == "env" and isinstance(value, dict):
            words += [w for k, v in sorted(value.items()) for w in ("--env", f"{k}={v}")]
            continue
        text = set_value(value)
        if text is None:
            missing.append(name)
        elif name == "architecture":
            words += ["--architecture", text]
        else:
            words += ["--set", f"{name}={text}"]
    return DecideLine(words, missing)


def explain_url(spec: dict[str, Any]) -> str:
    """The Explain page for exactly these inputs (its ``config`` field, JSON)."""
    inputs = {k: v for k, v in spec.items() if k != "deployment_id"}
    return "/explain?" + urlencode({"config": json.dumps(inputs, sort_keys=True)})


def spec_rows(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, value as text) for the inputs table, model facts first."""
    first = ("model", "architecture", "quantization")
    order = sorted(spec, key=lambda k: (first.index(k) if k in first else len(first), k))
    return [
        (k, spec[k] if isinstance(spec[k], str) else json.dumps(spec[k]))
        for k in order
        if k != "deployment_id"
    ]
