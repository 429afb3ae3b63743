"""The oracle's ``vllm serve`` parser checked against the release's own.

``python -m referee flags-recipes`` runs every line of ``policies/reference/vllm_recipes.jsonl``
through the installed release's parser (:func:`referee.flags_probe.verdict`) and writes the
verdicts (``{"id", "accepted", "stage", "error"}`` a line) to
``policies/reference/vllm-<release>/recipes_parse.jsonl``, which tests/oracle/test_recipes_parse.py
holds the oracle to without vLLM. ``python -m referee flags-check`` draws seeded lines from the
release's table (:mod:`referee.flags_gen`) and compares, line by line, the release's verdict
with :func:`oracle.sources.command.check_line`'s (accepted or refused; for a line both accept,
the values of every flag that feeds the decision).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from referee.flags_probe import plain, verdict

RECIPES = Path(__file__).resolve().parents[1] / "policies" / "reference" / "vllm_recipes.jsonl"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """vLLM's own warnings (``--model`` is deprecated, ...) are not the subject here."""
    logger = logging.getLogger("vllm")
    saved = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(saved)


def recipes(out: Path) -> dict[str, int]:
    """Write the release's verdict on every recipe line; returns the counts."""
    from referee.flags import serve_parser

    top, _ = serve_parser()
    rows = []
    with _quiet():
        for line in RECIPES.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                got, _ = verdict(top, list(rec["argv"]))
                rows.append({"id": rec["id"], **got})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    accepted = sum(r["accepted"] for r in rows)
    return {"lines": len(rows), "accepted": accepted, "refused": len(rows) - accepted}


def _values_differ(ns: Any, given: dict[str, Any]) -> list[str]:
    from turnout.oracle.sources.command_fields import DIRECT

    out = []
    for dest in sorted(set(given) & set(DIRECT)):
        mine, theirs = plain(given[dest]), plain(getattr(ns, dest, None))
        if mine != theirs:
            out.append(f"{dest}: oracle {mine!r}, vLLM {theirs!r}")
    return out


def _one(top: Any, case: dict[str, Any], release: str) -> dict[str, Any]:
    from referee.flags_gen import CONFIG_FILE
    from turnout.oracle.sources.command import check_line

    if case["config_file"] is not None:
        Path(CONFIG_FILE).write_text(case["config_file"], encoding="utf-8")
    want, ns = verdict(top, case["argv"])
    given, error = check_line(case["argv"], release=release)
    row = {
        "id": case["id"],
        "argv": case["argv"],
        "vllm": want,
        "oracle": {"accepted": error is None, "error": error and error.message},
    }
    row["agree"] = want["accepted"] == (error is None)
    if row["agree"] and given is not None and ns is not None:
        row["values"] = _values_differ(ns, given)
    if os.path.exists(CONFIG_FILE):
        os.remove(CONFIG_FILE)
    return row


def check(release: str, seed: int, count: int, show: int) -> dict[str, Any]:
    """The agreement report of ``count`` seeded lines (mismatches listed up to ``show``)."""
    from referee.flags import serve_parser
    from referee.flags_gen import generate
    from turnout.oracle.sources.command_table import load_table

    top, _ = serve_parser()
    table = load_table(release).data
    rows = []
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as scratch, _quiet():
        os.chdir(scratch)
        try:
            rows = [_one(top, case, release) for case in generate(table, seed, count)]
        finally:
            os.chdir(here)
    agree = sum(r["agree"] for r in rows)
    values_ok = sum(1 for r in rows if r["agree"] and not r.get("values"))
    accepted = sum(r["vllm"]["accepted"] for r in rows)
    misses = [r for r in rows if not r["agree"] or r.get("values")]
    return {
        "release": release,
        "seed": seed,
        "lines": len(rows),
        "vllm_accepted": accepted,
        "vllm_refused": len(rows) - accepted,
        "agree": agree,
        "agreement": round(agree / max(len(rows), 1), 4),
        "agree_with_values": values_ok,
        "agreement_with_values": round(values_ok / max(len(rows), 1), 4),
        "mismatches": misses[:show],
    }
