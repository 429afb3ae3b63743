"""Run one spec through an installed vLLM release's own runner selection.

Imported only inside a referee virtual environment (``make referee``), where ``vllm`` is the
release's wheel installed with ``--no-deps`` plus the few packages ``vllm.config`` imports
(referee/requirements.txt). The ``VllmConfig`` is built with ``object.__new__`` (its own
``__post_init__`` needs a downloaded model): its sub-configs are vLLM's real classes built with
the spec's values (so their defaults, validators and properties such as
``ParallelConfig.use_ubatching`` are the release's own), the model and speculative configs are
stand-ins holding only the facts the selection reads, and the platform is a ``Platform``
subclass of the spec's ``PlatformEnum``. :mod:`referee.replay` then runs the part of
``VllmConfig.__post_init__`` around the selection. Log lines are captured only while the
selection runs (``use_v2_model_runner`` and the validators), with vLLM's ``*_once``
deduplication, which is why a warning of the early evaluation stays in the log.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from referee.architectures import model_facts
from referee.build import build_config, make_platform

# Variables the harness sets per case; everything else of the process environment is left
# alone, and these are restored after each case (vLLM's own hooks set some of them).
_OWNED_ENV = (
    "VLLM_USE_V2_MODEL_RUNNER",
    "VLLM_USE_BREAKABLE_CUDAGRAPH",
    "TORCH_COMPILE_DISABLE",
    "VLLM_BATCH_INVARIANT",
    "VLLM_WORKER_MULTIPROC_METHOD",
    "NUMEXPR_MAX_THREADS",
    "TORCHINDUCTOR_COMPILE_THREADS",
    "VLLM_DISABLE_SHARED_EXPERTS_STREAM",
    "TORCHINDUCTOR_CPP_DYNAMIC_THREADS",
    "VLLM_SSM_CONV_STATE_LAYOUT",
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
)


class Capture(logging.Handler):
    """Collects vLLM's log records while ``on`` is set (the selection is running)."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.on = False
        self.records: list[dict[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if self.on and record.levelno >= logging.INFO:
            self.records.append({"level": record.levelname, "message": record.getMessage()})

    @contextlib.contextmanager
    def selecting(self) -> Iterator[None]:
        self.on = True
        try:
            yield
        finally:
            self.on = False


_CAPTURE = Capture()


def _install_stubs() -> None:
    """``vllm.compilation.breakable_cudagraph`` imports vLLM's CUDA ops at import time, which
    a CPU machine lacks; ``_maybe_enable_breakable_cudagraph`` needs only its
    ``is_breakable_cudagraph_enabled``, whose body in every release 0.29-0.33 is
    ``bool(envs.VLLM_USE_BREAKABLE_CUDAGRAPH)`` (compilation/breakable_cudagraph.py:54)."""
    import sys
    import types

    name = "vllm.compilation.breakable_cudagraph"
    if name in sys.modules:
        return
    import vllm.envs as envs

    stub = types.ModuleType(name)
    stub.is_breakable_cudagraph_enabled = lambda: bool(envs.VLLM_USE_BREAKABLE_CUDAGRAPH)
    sys.modules[name] = stub
    # Assumption: the packages a feature needs are installed where it is deployed (elastic EP
    # with async EPLB refuses to start without NIXL, which this CPU environment lacks).
    import vllm.distributed.nixl_utils as nixl

    nixl.is_nixl_available = lambda: True
    from vllm.v1.executor import ray_utils  # the ray backend refuses to start without ray

    ray_utils.assert_ray_available = lambda: None


def _install_capture() -> None:
    root = logging.getLogger("vllm")
    if _CAPTURE not in root.handlers:
        root.addHandler(_CAPTURE)
        root.setLevel(logging.DEBUG)
        for handler in root.handlers:  # keep vLLM's own console handler quiet
            if handler is not _CAPTURE:
                handler.setLevel(logging.CRITICAL + 1)


def _reset_once_caches() -> None:
    import vllm.logger as vlog

    for name in (
        "_print_debug_once",
        "_print_info_once",
        "_print_warning_once",
        "_print_error_once",
    ):
        fn = getattr(vlog, name, None)
        if fn is not None and hasattr(fn, "cache_clear"):
            fn.cache_clear()
    import vllm.config.vllm as vv

    for name in ("default_breakable_cudagraph_architectures",):
        fn = getattr(vv, name, None)
        if fn is not None and hasattr(fn, "cache_clear"):
            fn.cache_clear()


@contextlib.contextmanager
def _environment(spec: dict[str, Any], facts: dict[str, Any]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in _OWNED_ENV}
    import vllm.config.vllm as vv
    import vllm.platforms as vp

    saved_triton = vv.HAS_TRITON
    saved_platform = vp._current_platform
    bound = _modules_binding_platform()
    try:
        for key in _OWNED_ENV:
            os.environ.pop(key, None)
        # torchrun sets these for the external_launcher backend (ParallelConfig reads RANK)
        os.environ.update(RANK="0", LOCAL_RANK="0")
        for key, value in (spec.get("env") or {}).items():
            os.environ[key] = str(value)
        vv.HAS_TRITON = bool(spec.get("triton_available", True))
        platform = make_platform(spec)
        vp._current_platform = platform
        for module in bound:  # modules that did `from vllm.platforms import current_platform`
            module.current_platform = platform
        _reset_once_caches()
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        vv.HAS_TRITON = saved_triton
        vp._current_platform = saved_platform
        for module, value in bound.items():
            module.current_platform = value


def _modules_binding_platform() -> dict[Any, Any]:
    """The loaded vLLM modules that bound ``current_platform`` at import (0.33's
    vllm/config/vllm.py does), with the object they bound: the harness's platform replaces it
    for the case, as ``vllm.platforms._current_platform`` is replaced."""
    import sys

    from vllm.platforms.interface import Platform

    return {
        m: m.current_platform
        for name, m in list(sys.modules.items())
        if name.startswith("vllm.")
        and name != "vllm.platforms"
        and m is not None
        and isinstance(m.__dict__.get("current_platform"), Platform)
    }


def error_text(exc: BaseException) -> str:
    """The message a user sees. A pydantic ValidationError of a config class gives its first
    error: a validator's own ValueError text, or the field and pydantic's message
    ("mamba_cache_mode: Input should be 'align' or 'none'")."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
        except Exception:  # not a pydantic error after all
            return str(exc)
        ctx = first.get("ctx") or {}
        inner = ctx.get("error")
        if inner is not None:
            return str(inner)
        loc = ".".join(str(p) for p in first.get("loc", ()))
        msg = str(first.get("msg", exc))
        return f"{loc}: {msg}" if loc else msg
    return str(exc)


def run_case(spec: dict[str, Any], release: str) -> dict[str, Any]:
    """``{"decision": "v1"|"v2"|"error", "error": str?, "warnings": [{level, message}]}``.

    The release is the installed one; ``release`` ("0.31") selects which of its
    ``__post_init__`` steps :mod:`referee.replay` replays.
    """
    from referee.replay import replay

    _install_capture()
    _install_stubs()
    facts = model_facts(spec)
    _CAPTURE.records = []
    with _environment(spec, facts):
        try:
            cfg = build_config(spec, facts, release)
            runner = replay(cfg, spec, facts, release, _CAPTURE)
        except (ValueError, AssertionError, TypeError, NotImplementedError) as exc:
            return {
                "decision": "error",
                "error": error_text(exc),
                "warnings": list(_CAPTURE.records),
            }
    return {"decision": runner, "warnings": list(_CAPTURE.records)}
