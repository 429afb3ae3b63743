"""The ``vllm serve`` flag tables generated from each vLLM release's own parser.

``policies/reference/vllm-<release>/flags.json`` is written by ``python -m referee flags``
(``make referee``) from the release's ``make_arg_parser``: every argparse action (option
strings, dest, type by name, nargs, const, choices, action kind, default), the config classes
that validate the JSON-valued flags (their fields, nested), and what the release's parser
made of a set of probe lines. :func:`load_table` reads one; :func:`release_for_pack` says
which one a pack parses command lines with (a ``vllm-<release>`` pack: its release; any
other pack, ``turnout`` included: the newest table).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any

from turnout.oracle.errors import ConfigError, ErrorCode
from turnout.oracle.paths import POLICIES_DIR

REFERENCE_DIR = POLICIES_DIR / "reference"


@dataclass(frozen=True)
class FlagTable:
    """One release's table (the parsed flags.json); ``data`` is the whole file."""

    release: str
    vllm_version: str
    data: dict[str, Any]

    @property
    def actions(self) -> list[dict[str, Any]]:
        return self.data["actions"]  # type: ignore[no-any-return]

    @property
    def configs(self) -> dict[str, Any]:
        """Config class name -> ``{"fields": {name: {"type", "required", ...}}, "extra"}``."""
        return self.data["configs"]  # type: ignore[no-any-return]

    @property
    def enums(self) -> dict[str, Any]:
        return self.data["enums"]  # type: ignore[no-any-return]

    @property
    def json_flags(self) -> dict[str, Any]:
        """dest -> ``{"config": class name, "validated_by": "parser" | "engine"}``."""
        return self.data["json_flags"]  # type: ignore[no-any-return]

    @property
    def behaviours(self) -> dict[str, Any]:
        return self.data["behaviours"]  # type: ignore[no-any-return]

    def action(self, dest: str) -> dict[str, Any] | None:
        """The action row of ``dest`` (None: the release has no such flag)."""
        return next((a for a in self.actions if a["dest"] == dest), None)

    def config_fields(self, name: str) -> frozenset[str]:
        return frozenset(self.configs[name]["fields"])


def _version_key(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split("."))


@cache
def available_releases() -> tuple[str, ...]:
    """The releases that have a flags.json, oldest first."""
    found = [p.parent.name.removeprefix("vllm-") for p in REFERENCE_DIR.glob("vllm-*/flags.json")]
    return tuple(sorted(found, key=_version_key))


def newest_release() -> str:
    return available_releases()[-1]


@cache
def load_table(release: str | None = None) -> FlagTable:
    """The flag table of ``release`` ("0.31"; None: the newest). Raises ConfigError
    (``unknown_flag`` area: ``bad_value``) for a release without a table."""
    name = release or newest_release()
    path = REFERENCE_DIR / f"vllm-{name}" / "flags.json"
    if not path.is_file():
        raise ConfigError(
            f"no vllm serve flag table for vLLM {name!r} (known: "
            f"{', '.join(available_releases())}; `make referee` writes them)",
            code=ErrorCode.BAD_VALUE,
            field="release",
        )
    data = json.loads(path.read_text(encoding="utf-8"))
    return FlagTable(data["release"], data["vllm_version"], data)


def release_for_pack(pack: Any) -> str | None:
    """The release whose table parses command lines for ``pack`` (a :class:`~oracle.pack.
    Pack` or None): a pack's declared vLLM release when it has a table, else None (the
    newest)."""
    release = getattr(getattr(pack, "data", None), "release", "") or ""
    return release if release in available_releases() else None
