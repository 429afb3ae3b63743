"""The wheel is complete and imports beside Hugging Face's ``kernels`` (README, "Layout").

``python -m build`` makes an sdist and, from it, a wheel. The wheel must hold every module of
the seven packages and their data (packs, golden files, templates, static files, migrations),
all under the one import root ``turnout``, and nothing at the top level that another
distribution could shadow or be shadowed by. Installed (not editable) into a fresh virtual
environment beside transformers and the hub ``kernels`` it pulls in, both ``kernels`` import
as themselves and the ``turnout`` command runs from a folder that is not the repository.

Versions come from the committed lock (requirements/test.txt) as constraints, so the fresh
environment gets what ``make test`` tested; pip takes them from its cache.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("oracle", "engine", "kernels", "runner_v1", "runner_v2", "dashboard", "policies")
LOCK = ROOT / "requirements" / "test.txt"

pytestmark = pytest.mark.slow


def _source_files() -> set[str]:
    """Every file of the seven packages, as the wheel names it (``turnout/<package>/...``)."""
    out = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                out.add(f"turnout/{path.relative_to(ROOT).as_posix()}")
    return out


def _pins(lock: Path) -> str:
    """The lock's ``name==version`` lines without hashes: pip refuses hashes in constraints."""
    pins = re.findall(r"^([A-Za-z0-9_.\-]+==[^\s;\\]+)", lock.read_text(), flags=re.M)
    assert len(pins) > 50, f"{lock} holds {len(pins)} pins"
    return "\n".join(pins) + "\n"


def _copy_of_the_tree(dest: Path) -> Path:
    """The repository's files as git sees them (tracked, and untracked but not ignored), links
    kept as links: the build writes build/ and src/turnout.egg-info into its source tree, and
    must neither race another build of the checkout nor see ignored files."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        src, dst = ROOT / name, dest / name
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the work tree, not yet in git
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, dst)
    return dest


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    tree = _copy_of_the_tree(tmp_path_factory.mktemp("tree"))
    # --no-isolation: setuptools and build come from the lock, not from a fresh download.
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(tree)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_build_makes_a_complete_wheel_and_sdist(dist: Path) -> None:
    [wheel] = dist.glob("turnout-*.whl")
    [sdist] = dist.glob("turnout-*.tar.gz")
    assert sdist.stat().st_size > 0
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = _source_files() - names
    assert not missing, f"{len(missing)} files missing from the wheel, e.g. {sorted(missing)[:10]}"
    top = {n.split("/")[0] for n in names}
    assert top == {"turnout", wheel.name.split("-py3")[0] + ".dist-info"}, top
    assert "turnout/__init__.py" in names  # a regular package: no stray folder can join it


#: Distributions the fresh environment takes from this one instead of unpacking them again:
#: torch and triton are 1.7 GB unpacked, most of the environment's set-up time, and nothing
#: here is about them. turnout and everything else the wheel needs are installed for real.
LINKED = ("torch", "torchgen", "triton")


def _link_the_largest_distributions(python: Path, folder: Path) -> None:
    """Put :data:`LINKED` (packages and their ``.dist-info``, as symbolic links into this
    environment's site-packages) on the fresh environment's path through a ``.pth`` file. pip
    sees them installed at the locked versions and installs only the rest."""
    folder.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.is_dir() and entry.name.split("-")[0] in LINKED:  # package or .dist-info
            (folder / entry.name).symlink_to(entry)
    assert {p.name.split("-")[0] for p in folder.iterdir()} >= {"torch", "triton"}
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    Path(site, "_turnout_test_linked.pth").write_text(f"{folder}\n")


@pytest.fixture(scope="module")
def fresh_venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("venv")
    # No pip of its own (ensurepip is seconds): this environment's pip installs into it
    # (pip --python), resolving the wheel's own dependencies as any installer would.
    venv.create(home / "venv", with_pip=False)
    python = home / "venv" / "bin" / "python"
    _link_the_largest_distributions(python, home / "linked")
    constraints = home / "constraints.txt"
    constraints.write_text(_pins(LOCK))
    [wheel] = dist.glob("turnout-*.whl")
    proc = subprocess.run(
        [
            sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
            "--no-compile", "-c", str(constraints),
            f"{wheel}[service,runners]", "transformers", "kernels",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return home / "venv"


_BOTH_KERNELS = r"""
import json, sys, sysconfig
import kernels
from kernels import get_kernel  # the hub package's own API
import turnout.kernels
from turnout.kernels.paged_attention import paged_attention_ref
got = {
    "hub": kernels.__file__,
    "ours": turnout.kernels.__file__,
    "site": sysconfig.get_paths()["purelib"],
    "ref": paged_attention_ref.__module__,
}
if sys.argv[1] == "whole":  # transformers finds the hub package; the runners and service load
    import transformers
    import transformers.integrations.hub_kernels  # imports the hub symbols it finds
    from transformers.utils import import_utils
    import turnout.runner_v1, turnout.runner_v2, turnout.engine, turnout.dashboard.app
    got["transformers"] = transformers.__version__
    got["hub_kernels_available"] = import_utils.is_kernels_available()
print(json.dumps(got))
"""


@pytest.mark.parametrize("where", ["elsewhere", "repo-root"])
def test_both_kernels_packages_import_as_themselves(
    fresh_venv: Path, tmp_path: Path, where: str
) -> None:
    # From the repository root with -P (as make test runs everything): the folders there are
    # not on sys.path, so neither kernels/ shadows the other. What the names resolve to is
    # checked from both folders; transformers and the rest (about 10 s) from the other one.
    cwd = ROOT if where == "repo-root" else tmp_path
    scope = "names" if where == "repo-root" else "whole"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [str(fresh_venv / "bin" / "python"), "-P", "-c", _BOTH_KERNELS, scope],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = __import__("json").loads(proc.stdout.strip().splitlines()[-1])
    site = Path(got["site"])
    assert Path(got["hub"]).is_relative_to(site / "kernels"), got
    assert Path(got["ours"]).is_relative_to(site / "turnout" / "kernels"), got
    assert got["ref"] == "turnout.kernels.paged_attention"
    if scope == "whole":
        assert got["hub_kernels_available"] is True
        major, minor = (int(x) for x in got["transformers"].split(".")[:2])
        assert (major, minor) >= (5, 25), got["transformers"]


@pytest.mark.parametrize(
    "args",
    [
        ["decide", "--architecture", "Qwen3ForCausalLM"],
        ["decide", "--", "vllm", "serve", "Qwen/Qwen3-8B", "-tp", "2"],
        ["lint"],
        ["serve", "--help"],
        ["generate", "--help"],
    ],
    ids=" ".join,
)
def test_the_installed_command_runs(fresh_venv: Path, tmp_path: Path, args: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [str(fresh_venv / "bin" / "turnout"), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    if args[0] == "decide":  # the packs shipped in the wheel decide: qwen3 is the first canary
        assert "Using V2 Model Runner" in proc.stdout, proc.stdout
    if args[0] == "lint":
        assert "0 error(s)" in proc.stdout, proc.stdout
