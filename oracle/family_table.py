"""families.yaml resolved into one ArchInfo per architecture (and one per family)."""

from __future__ import annotations

from typing import Any

from turnout.oracle.compile_types import ArchInfo
from turnout.oracle.errors import Issue
from turnout.oracle.fields import FAMILY_ATTRIBUTES, RUNNER_KINDS
from turnout.oracle.schema import Families
from turnout.oracle.yamlpos import Positions

ATTR_DEFAULTS: dict[str, Any] = {a: False for a in FAMILY_ATTRIBUTES} | {"runner_kind": "generate"}


def _check_attrs(
    attrs: dict[str, Any], pos: Positions, path: tuple[Any, ...], issues: list[Issue]
) -> dict[str, Any]:
    ok: dict[str, Any] = {}
    for key, value in attrs.items():
        p = (*path, key)
        if key not in FAMILY_ATTRIBUTES:
            issues.append(
                pos.issue(
                    p,
                    f"unknown attribute {key!r}; expected one of: " + ", ".join(FAMILY_ATTRIBUTES),
                    prefer_key=True,
                )
            )
        elif key == "runner_kind" and value not in RUNNER_KINDS:
            issues.append(
                pos.issue(
                    p, f"runner_kind: expected one of {', '.join(RUNNER_KINDS)}, got {value!r}"
                )
            )
        elif key != "runner_kind" and not isinstance(value, bool):
            issues.append(pos.issue(p, f"{key}: expected true or false, got {value!r}"))
        else:
            ok[key] = value
    return ok


def build_arch_table(
    families: Families, pos: Positions, issues: list[Issue]
) -> tuple[dict[str, ArchInfo], dict[str, ArchInfo], dict[str, str]]:
    """(architecture -> ArchInfo, family -> its own ArchInfo, family -> label)."""
    archs: dict[str, ArchInfo] = {}
    owner: dict[str, str] = {}
    family_defaults: dict[str, ArchInfo] = {}
    labels: dict[str, str] = {}
    for fid, fam in families.families.items():
        fpath: tuple[Any, ...] = ("families", fid)
        base = ATTR_DEFAULTS | _check_attrs(fam.attributes, pos, (*fpath, "attributes"), issues)
        labels[fid] = fam.label
        family_defaults[fid] = ArchInfo(architecture="", family=fid, family_label=fam.label, **base)
        if not fam.architectures:
            issues.append(pos.issue(fpath, f"family {fid!r} lists no architectures"))
        for arch, override in fam.architectures.items():
            apath = (*fpath, "architectures", arch)
            if arch in owner:
                issues.append(
                    pos.issue(
                        apath,
                        f"architecture {arch!r} is already in family {owner[arch]!r}",
                        prefer_key=True,
                    )
                )
                continue
            owner[arch] = fid
            attrs = base | _check_attrs(override or {}, pos, apath, issues)
            archs[arch] = ArchInfo(architecture=arch, family=fid, family_label=fam.label, **attrs)
    return archs, family_defaults, labels
