"""The vLLM a ``vllm`` command runs: its executable, the Python it belongs to, its version, and
the policy pack of that release.

``vllm`` on ``PATH`` is a console script of some Python (a virtual environment's, usually).
:func:`find_vllm` reads the script's first lines for its interpreter (``#!/venv/bin/python``,
``#!/usr/bin/env python3``, or pip's ``#!/bin/sh`` trampoline for long paths, whose second line
``'''exec' "/long path/bin/python" "$0" "$@"`` names it) and asks that interpreter, with the
environment vLLM will run with, for ``importlib.metadata.version("vllm")``: the distribution
``import vllm`` would load there. When no interpreter can be asked, the ``vllm-*.dist-info``
beside the script (``<bin>/../lib/python*/site-packages``) says. :func:`installed_vllm` asks the
running interpreter itself (code that builds ``vllm.LLM`` in this process).

A version maps to the pack of its release (``0.31.2`` → ``vllm-0.31``); a version with no pack
(an older or newer release) is decided with :data:`FALLBACK_PACK`, and ``has_pack`` says so.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from turnout.oracle.errors import ErrorCode, OracleError
from turnout.oracle.paths import RELEASE_PACKS

#: The pack a vLLM version without a pack of its own is decided with.
FALLBACK_PACK = "vllm-0.31"
#: How long the vLLM interpreter may take to say its version (a cold start on a slow disk).
ASK_TIMEOUT_S = 60.0
_VERSION = re.compile(r"^(\d+)\.(\d+)")
_TRAMPOLINE = re.compile(r"""^'''exec' (?:"([^"]+)"|(\S+))""")  # pip's launcher for long paths
# sys.path[0] of `python -c` is the working directory, which vLLM's own start does not have.
_ASK = (
    "import sys; sys.path.pop(0)\n"
    "import importlib.metadata as m, json\n"
    "try:\n    v = m.version('vllm')\nexcept m.PackageNotFoundError:\n    v = None\n"
    "print(json.dumps({'version': v, 'python': sys.executable}))\n"
)


class VllmNotInstalled(OracleError):
    """No vLLM to launch: no ``vllm`` executable on PATH, or one whose Python has no vLLM
    distribution. ``code`` is ``vllm_not_installed``."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=ErrorCode.VLLM_NOT_INSTALLED)


@dataclass(frozen=True)
class VllmInstall:
    """One installed vLLM. ``version`` is its distribution's version ("0.31.0");
    ``version_source`` says who told ("importlib.metadata" of ``python``, or "dist-info");
    ``pack`` is the policy pack its selection is decided with, ``has_pack`` False when the
    release has none and :data:`FALLBACK_PACK` stands in."""

    executable: Path | None
    python: Path | None
    version: str
    version_source: str
    pack: str
    has_pack: bool

    @property
    def release(self) -> str:
        """The release whose ``vllm serve`` parser reads the command line ("0.31")."""
        return self.pack.removeprefix("vllm-")

    def describe(self) -> str:
        """One line for people: version, where, and the pack."""
        where = f" at {self.executable}" if self.executable else ""
        python = f" (Python {self.python})" if self.python else ""
        if self.has_pack:
            return f"vLLM {self.version}{where}{python}: deciding with pack {self.pack}"
        return (
            f"vLLM {self.version}{where}{python} has no policy pack (packs: "
            f"{', '.join(RELEASE_PACKS)}); deciding with {self.pack} instead"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "version": self.version,
            "version_source": self.version_source,
            "executable": str(self.executable) if self.executable else None,
            "python": str(self.python) if self.python else None,
            "pack": self.pack,
            "has_pack": self.has_pack,
        }


def pack_for_version(version: str) -> tuple[str, bool]:
    """(pack, has_pack) for a vLLM version: ``"0.31.2"`` → ``("vllm-0.31", True)``,
    ``"0.40.0"`` → ``(FALLBACK_PACK, False)``. Pre-releases and local versions count as their
    release (``0.32.0rc1``, ``0.31.0+cu129``)."""
    found = _VERSION.match(version.strip())
    name = f"vllm-{int(found.group(1))}.{int(found.group(2))}" if found else ""
    return (name, True) if name in RELEASE_PACKS else (FALLBACK_PACK, False)


def installed_vllm() -> VllmInstall:
    """The vLLM of the running interpreter (``import vllm`` here). Raises VllmNotInstalled."""
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        raise VllmNotInstalled(
            "vLLM is not installed in this Python (no 'vllm' distribution "
            "for importlib.metadata); install it, or run where it is"
        ) from None
    pack, has_pack = pack_for_version(version)
    return VllmInstall(None, None, version, "importlib.metadata", pack, has_pack)


def find_vllm(command: str = "vllm", env: Mapping[str, str] | None = None) -> VllmInstall:
    """The vLLM that ``command`` ("vllm", or a path to it) runs with ``env`` (default: this
    process's environment; its ``PATH`` finds the command). Raises VllmNotInstalled when
    there is none, when the interpreter its first lines name is not there (the script
    cannot run), or when its version cannot be told."""
    env = dict(os.environ if env is None else env)
    executable = _which(command, env)
    python = interpreter_of(executable)
    if python is not None and not (python.is_file() and os.access(python, os.X_OK)):
        raise VllmNotInstalled(
            f"{executable} cannot run: it names the interpreter {python}, "
            "which is not an executable file here"
        )
    version, source = None, ""
    why = f"its first line names no Python interpreter ({_first_line(executable)!r})"
    if python is not None:
        version, why = _ask(python, env)
        source = "importlib.metadata"
    if version is None:
        version = dist_info_version(executable)
        source = "dist-info"
    if version is None:
        raise VllmNotInstalled(
            f"{executable} is no vLLM this can launch: {why}, and no "
            f"vllm-*.dist-info lies beside it"
        )
    pack, has_pack = pack_for_version(version)
    return VllmInstall(executable, python, version, source, pack, has_pack)


def _which(command: str, env: Mapping[str, str]) -> Path:
    if os.sep in command:
        path = Path(command)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise VllmNotInstalled(f"{command}: no such executable; is vLLM installed there?")
        return path.absolute()
    found = shutil.which(command, path=env.get("PATH", os.defpath))
    if found is None:
        raise VllmNotInstalled(
            f"vLLM is not installed: no {command!r} executable on PATH "
            "(install vLLM, activate its virtual environment, or give the "
            "path: turnout launch -- /path/to/venv/bin/vllm serve MODEL)"
        )
    return Path(found)


def _first_line(path: Path) -> str:
    lines = _head(path)
    return lines[0] if lines else ""


def _head(path: Path) -> list[str]:
    """The first two lines of a file (4 KiB at most), as text."""
    try:
        with open(path, "rb") as f:
            data = f.read(4096)
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()[:2]


def interpreter_of(script: Path) -> Path | None:
    """The Python interpreter a console script runs with, from its first lines; None for a
    file that names none (a binary, a shell wrapper)."""
    lines = _head(script)
    if not lines or not lines[0].startswith("#!"):
        return None
    try:
        words = shlex.split(lines[0][2:].strip())
    except ValueError:
        return None
    if words and Path(words[0]).name == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        found = shutil.which(words[0]) if words else None
        return Path(found) if found and "python" in Path(words[0]).name else None
    if words and Path(words[0]).name == "sh" and len(lines) > 1:
        hit = _TRAMPOLINE.match(lines[1])
        return Path(hit.group(1) or hit.group(2)) if hit else None
    return Path(words[0]) if words and "python" in Path(words[0]).name else None


def _ask(python: Path, env: Mapping[str, str]) -> tuple[str | None, str]:
    """(version, why not) from ``python``'s importlib.metadata, run with ``env``."""
    try:
        out = subprocess.run(
            [str(python), "-c", _ASK],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=ASK_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"its Python {python} cannot be run ({exc})"
    if out.returncode != 0:
        tail = out.stderr.strip().splitlines()[-1:] or [f"exit {out.returncode}"]
        return None, f"its Python {python} failed ({tail[0]})"
    try:
        version = json.loads(out.stdout.strip().splitlines()[-1])["version"]
    except (ValueError, IndexError, KeyError, TypeError):
        return None, f"its Python {python} gave no version ({out.stdout[-200:]!r})"
    if version is None:
        return None, f"its Python {python} has no 'vllm' distribution installed"
    return str(version), ""


def dist_info_version(script: Path) -> str | None:
    """The version in the ``vllm-*.dist-info/METADATA`` of the environment ``script`` lies in
    (``<bin>/../lib/python*/site-packages``), or None."""
    prefix = script.resolve().parent.parent if script.exists() else script.parent.parent
    for meta in sorted(prefix.glob("lib/python*/site-packages/vllm-*.dist-info/METADATA")):
        try:
            text = meta.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        found = re.search(r"^Version:\s*(\S+)", text, re.MULTILINE)
        if found:
            return found.group(1)
    return None
