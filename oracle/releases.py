"""docs/oracle-releases.md, generated from the release packs: per vLLM release, what changed
from the release before it (the rules, steps, derived predicates and dimensions the
``extends`` merge added, removed or changed; the fields the release gained or lost) and what
that does to the capability matrix (the cells that change runner, per change, scenario and
family: ``turnout matrix --diff``) and to the real command lines of
policies/reference/vllm_recipes.jsonl (``turnout decide --compare``).

    python -m turnout.oracle.releases --write   # rewrite docs/oracle-releases.md
    python -m turnout.oracle.releases --check   # exit 1 when the file differs from the packs

tests/oracle/test_oracle_releases.py fails while the file is stale.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnout.oracle.compare import Side, change_of, change_rank, count_changes, sides
from turnout.oracle.config import DeploymentConfig
from turnout.oracle.errors import ConfigError, Issue, PackError
from turnout.oracle.matrix_diff import (
    GROUP_HEADER,
    MatrixDiff,
    diff_packs,
    family_counts,
    group_changes,
    group_row,
    unknown_lines,
)
from turnout.oracle.pack import Pack, load_pack
from turnout.oracle.pack_merge import Located, MergedMatrix, load_matrix_chain
from turnout.oracle.paths import POLICIES_DIR, RELEASE_PACKS
from turnout.oracle.sources import from_command, release_for_pack

DOC = POLICIES_DIR.parent / "docs" / "oracle-releases.md"
RECIPES = POLICIES_DIR / "reference" / "vllm_recipes.jsonl"
# Keys that document an item rather than decide: a change to them alone is not a change.
_PROSE = {"after", "before", "reference", "reason", "note", "description"}


@dataclass(frozen=True)
class ItemChanges:
    """Rules, steps, derived predicates or dimensions of a release against the one before:
    ids added and removed, and ids whose definition changed with the keys that changed."""

    added: list[str]
    removed: list[str]
    changed: list[tuple[str, list[str]]]


def merged(name: str) -> MergedMatrix:
    """The capability matrix of a pack after its ``extends`` chain; PackError when broken."""
    issues: list[Issue] = []
    out = load_matrix_chain(POLICIES_DIR / name, issues)
    if out is None:
        raise PackError(issues)
    return out


def _dump(item: Any) -> dict[str, Any]:
    return {k: v for k, v in item.model_dump(exclude_unset=True).items() if k not in _PROSE}


def item_changes(old: dict[str, Any], new: dict[str, Any]) -> ItemChanges:
    """Compare two id → pydantic item maps (an item whose only changes are to prose keys,
    references and placement is unchanged)."""
    changed = []
    for key in new:
        if key in old:
            a, b = _dump(old[key]), _dump(new[key])
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            if keys:
                changed.append((key, keys))
    return ItemChanges([k for k in new if k not in old], [k for k in old if k not in new], changed)


def _by_id(items: Sequence[Located[Any]]) -> dict[str, Any]:
    return {x.item.id: x.item for x in items}


def _items(m: MergedMatrix) -> dict[str, dict[str, Any]]:
    return {
        "rules": _by_id(m.rules),
        "steps": _by_id(m.steps),
        "derived predicates": {k: v.item for k, v in m.derived.items()},
        "dimensions": {k: v.item for k, v in m.dimensions.items()},
    }


def _rule_text(rule: Any) -> str:
    effect = rule.effect.replace("_", " ")
    return f"`{rule.id}` ({effect}: {_cell(rule.label)})"


def _step_text(step: Any) -> str:
    when = f" when `{json.dumps(step.when, sort_keys=True)}`" if step.when else ""
    if step.kind == "set":
        what = f"sets `{json.dumps(step.set, sort_keys=True)}`"
    else:
        what = {
            "refuse": "refuses",
            "evaluate": "evaluates the selection early",
            "final": "the final selection",
        }[step.kind]
    return f"`{step.id}` ({what}{when})"


def _describe(kind: str, key: str, item: Any) -> str:
    if kind == "rules":
        return _rule_text(item)
    if kind == "steps":
        return _step_text(item)
    return f"`{key}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _changes_section(prev: MergedMatrix, cur: MergedMatrix) -> list[str]:
    lines: list[str] = []
    old, new = _items(prev), _items(cur)
    for kind in ("rules", "steps", "derived predicates", "dimensions"):
        ch = item_changes(old[kind], new[kind])
        if not (ch.added or ch.removed or ch.changed):
            continue
        lines.append(f"**{kind.capitalize()}**")
        lines.append("")
        lines += [f"- added {_describe(kind, k, new[kind][k])}" for k in ch.added]
        lines += [f"- removed {_describe(kind, k, old[kind][k])}" for k in ch.removed]
        lines += [
            f"- changed {_describe(kind, k, new[kind][k])}: {', '.join(keys)}"
            for k, keys in ch.changed
        ]
        lines.append("")
    return lines


def _fields_section(prev: Pack, cur: Pack) -> list[str]:
    a, b = set(prev.data.unknown_fields), set(cur.data.unknown_fields)
    gained, lost = sorted(a - b), sorted(b - a)
    lines = [
        f"**Fields**: new in this release: {_names(gained)}; gone from it: {_names(lost)}; "
        f"it does not have: {_names(sorted(b))}.",
        "",
    ]
    return lines


def _names(names: Sequence[str]) -> str:
    return ", ".join(f"`{n}`" for n in names) or "none"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(_cell(c) for c in row) + " |" for row in rows),
    ]


def _counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {n}" for k, n in counts.items()) or "none"


def _matrix_section(diff: MatrixDiff) -> list[str]:
    a, b = diff.before.name, diff.after.name
    counts = _changes_count(diff)
    lines = [
        f"**Matrix** (`turnout matrix --diff {a} {b}`): {len(diff.changes)} of "
        f"{diff.num_cells} cells change runner ({_counts_text(counts)}).",
        "",
    ]
    lines += [f"- {line}." for line in unknown_lines(diff)]
    lines.append("")
    groups = group_changes(diff.changes)
    if groups:
        header = [h.format(a=a, b=b) for h in GROUP_HEADER]
        lines += _table(header, [group_row(g) for g in groups])
        lines.append("")
        lines += _family_table(diff)
    return lines


def _changes_count(diff: MatrixDiff) -> dict[str, int]:
    return count_changes(c.change for c in diff.changes)


def _family_table(diff: MatrixDiff) -> list[str]:
    per_family = family_counts(diff.changes)
    kinds = sorted({k for c in per_family.values() for k in c}, key=lambda k: (change_rank(k), k))
    labels = {**diff.before.families, **diff.after.families}
    rows = [
        [labels.get(f, f), str(sum(c.values())), *(str(c.get(k, 0)) for k in kinds)]
        for f, c in sorted(per_family.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
    ]
    return [
        f"<details><summary>Cells that change runner, per family ({len(rows)} families)</summary>",
        "",
        *_table(["family", "cells", *kinds], rows),
        "",
        "</details>",
        "",
    ]


def recipe_configs(
    release: str | None = None,
) -> list[tuple[str, str, DeploymentConfig | None, ConfigError | None]]:
    """(id, model, config, error) of every line of policies/reference/vllm_recipes.jsonl, read
    by vLLM ``release``'s ``vllm serve`` parser (None: the newest), as ``turnout decide --pack
    vllm-<release>`` reads them: ``config`` None and ``error`` set for a line it refuses."""
    out: list[tuple[str, str, DeploymentConfig | None, ConfigError | None]] = []
    for line in RECIPES.read_text().splitlines():
        row = json.loads(line)
        try:
            config = from_command(row["argv"], row.get("env") or {}, release=release)
        except ConfigError as exc:
            out.append((row["id"], "-", None, exc))
            continue
        out.append((row["id"], config.model or "-", config, None))
    return out


def _recipe_sides(
    prev: Pack, cur: Pack, a: tuple[Any, ...], b: tuple[Any, ...]
) -> tuple[Side, Side] | None:
    """Both packs' decisions of one recipe line, each read by its own release's parser; a
    line only one release reads is a refusal on the other side; None when neither reads it."""
    if a[2] is None and b[2] is None:
        return None
    if b[2] is None:
        return Side(prev.name, prev.decide(a[2])), Side(
            cur.name, cur.refusal(a[2], b[3].message, b[3].code)
        )
    if a[2] is None:
        return Side(prev.name, prev.refusal(b[2], a[3].message, a[3].code)), Side(
            cur.name, cur.decide(b[2])
        )
    return sides(prev, cur, a[2], after_config=b[2])


def _recipes_section(
    prev: Pack, cur: Pack, before: list[tuple[Any, ...]], after: list[tuple[Any, ...]]
) -> list[str]:
    rows, num_read = [], 0
    for a, b in zip(before, after, strict=True):
        both = _recipe_sides(prev, cur, a, b)
        if both is None:
            continue
        num_read += 1
        change = change_of(both[0].decision, both[1].decision)
        if change is not None:
            model = a[1] if a[2] is not None else b[1]
            rows.append([a[0], model, change, " + ".join(both[0].why()), " + ".join(both[1].why())])
    lines = [
        f"**Recipes** (`turnout decide --commands policies/reference/vllm_recipes.jsonl "
        f"--pack {prev.name} --compare {cur.name}`, each line read by each release's own "
        f"parser): {len(rows)} of the {num_read} lines that either release reads change "
        "runner.",
        "",
    ]
    if rows:
        lines += [
            *_table(["id", "model", "change", f"why ({prev.name})", f"why ({cur.name})"], rows),
            "",
        ]
    return lines


def _summary(pairs: list[tuple[Pack, Pack, MatrixDiff]], first: Pack) -> list[str]:
    rows = [[first.name, "-", str(len(first.rules)), str(len(first.data.steps)), "-", "-"]]
    for _prev, cur, diff in pairs:
        rows.append(
            [
                cur.name,
                diff.before.name,
                str(len(cur.rules)),
                str(len(cur.data.steps)),
                f"{len(diff.changes)} of {diff.num_cells}",
                _counts_text(_changes_count(diff)),
            ]
        )
    header = ["pack", "extends", "rules", "steps", "cells that change runner", "changes"]
    return [*_table(header, rows), ""]


HEAD = """# vLLM releases, pack by pack

<!-- Generated from the packs by `python -m turnout.oracle.releases --write`; do not edit by hand.
tests/oracle/test_oracle_releases.py fails when this file drifts from the packs. -->

The packs `vllm-0.29` … `vllm-0.33` reproduce each vLLM release's own runner selection, and each
extends the one before it (`policies/vllm-<release>/capability_matrix.yaml` states only what
changed). Per release, this page lists what the `extends` merge changed from the previous
release: rules, steps, derived predicates and dimensions added, removed or changed (a change
names the keys that differ; changes to `reason`, `reference` and placement alone are left
out), the fields the release gained or lost (a config that sets a field the release lacks is
refused by name, `unknown_setting`), and the matrix cells that change runner: every
architecture x pin (`auto`, `v1`, `v2`) x scenario (docs/oracle-api.md, `enumerate_matrix`),
as `turnout matrix --diff` lists them, and the real `vllm serve` lines of
`policies/reference/vllm_recipes.jsonl` that change runner. A change reads `before→after`; `refuse` is no runner
(the engine does not start). *Why* is the reason ids on each side (`DEFAULT`: no rule decided;
`step.<id>`: a step refused the config; `step:<id>`: a step that changed the config under
that release only).

To see what an upgrade does to your own fleet, decide its command lines with both packs:
`turnout decide --commands FLEET --pack vllm-0.31 --compare vllm-0.32` (docs/oracle-api.md).

"""


def render_releases(packs: Sequence[str] = RELEASE_PACKS) -> str:
    """The text of docs/oracle-releases.md for ``packs`` (in release order)."""
    loaded = [load_pack(name) for name in packs]
    chains = [merged(name) for name in packs]
    pairs = [
        (loaded[i - 1], loaded[i], diff_packs(loaded[i - 1], loaded[i], exact=False))
        for i in range(1, len(loaded))
    ]
    lines = HEAD.splitlines() + _summary(pairs, loaded[0])
    first = loaded[0]
    lines += [
        f"## vLLM {first.data.release} (`{first.name}`)",
        "",
        f"The first release pack: {len(first.rules)} rules, {len(first.data.steps)} steps "
        f"and {len(first.domains)} dimensions; the release does not have "
        f"{_names(sorted(first.data.unknown_fields))}.",
        "",
    ]
    for i, (prev, cur, diff) in enumerate(pairs, start=1):
        # as --pack PREV --compare CUR: each line read by each release's own parser
        before, after = (
            recipe_configs(release_for_pack(prev)),
            recipe_configs(release_for_pack(cur)),
        )
        lines += [f"## vLLM {cur.data.release} (`{cur.name}`, extends `{prev.name}`)", ""]
        lines += _fields_section(prev, cur)
        lines += _changes_section(chains[i - 1], chains[i])
        lines += _matrix_section(diff)
        lines += _recipes_section(prev, cur, before, after)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m turnout.oracle.releases",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", action="store_true", help=f"rewrite {DOC}")
    group.add_argument("--check", action="store_true", help="exit 1 when the file is stale")
    args = parser.parse_args(argv)
    text = render_releases()
    if args.write:
        Path(DOC).write_text(text)
        print(f"wrote {DOC}")
        return 0
    if Path(DOC).read_text() != text:
        print(f"{DOC} is stale: run python -m turnout.oracle.releases --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
