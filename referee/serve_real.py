"""One ``vllm serve`` case through the installed release's own code, as ``vllm serve`` runs it.

The line is parsed by the release's ``vllm serve`` parser (:func:`referee.flags.serve_parser`),
turned into ``AsyncEngineArgs.from_cli_args`` and built with ``create_engine_config()``: the
release's ``ModelConfig`` reads the model folder's config.json and inspects the model class,
and the real ``VllmConfig.__post_init__`` runs, with every check, default and log line of the
release. Nothing of it is restated here. What stands in for the machine is
:mod:`referee.stand_in` (compiled extensions, the device's queries) and, as in
:mod:`referee.harness`, the packages a feature needs being installed (NIXL, Ray).

The answer is ``{"decision": "v1"|"v2"|"error", "error"?, "warnings"}``: the runner
``VllmConfig.use_v2_model_runner`` chooses, or the text of the exception that stopped the
config (what ``vllm serve`` prints before it exits), and the log records that the selection
itself wrote (``use_v2_model_runner``'s own lines, INFO and above, once each, in order).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from referee import stand_in
from referee.harness import _OWNED_ENV as HARNESS_ENV
from referee.harness import error_text
from referee.serve_gen import resolve

# Variables a case may set, or vLLM's config code sets for the process (the external launcher
# turns multiprocessing off, enforce_eager sets TORCH_COMPILE_DISABLE, ...): cleared before
# each case and restored after, or one case's config would leak into the next.
_OWNED_ENV = tuple(sorted({*HARNESS_ENV, "VLLM_USE_V2_MODEL_RUNNER", "VLLM_BATCH_INVARIANT"}))
_SELECTION = "use_v2_model_runner"  # the function whose log lines are the selection's


class _Records(logging.Handler):
    """Every vLLM log record of the case, INFO and above: (function, level, message)."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.records: list[tuple[str, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.funcName, record.levelname, record.getMessage()))


_RECORDS = _Records()
_PARSER: list[Any] = []


def prepare() -> None:
    """Once per process, before vLLM is imported: the stand-ins, no logging set-up of vLLM's
    own (it would replace the handler), offline model files."""
    os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
    os.environ["HF_HUB_OFFLINE"] = "1"
    stand_in.install()
    root = logging.getLogger("vllm")
    if _RECORDS not in root.handlers:
        root.addHandler(_RECORDS)
        root.setLevel(logging.INFO)
    # Assumption, as in referee.harness: the packages a feature needs are installed where it is
    # deployed (NIXL for elastic EP and its connector, Ray for the ray executor).
    # Arctic Inference for suffix decoding likewise.
    import vllm.config.speculative as speculative
    import vllm.distributed.nixl_utils as nixl
    from vllm.v1.executor import ray_utils

    nixl.is_nixl_available = lambda: True
    ray_utils.assert_ray_available = lambda: None
    if hasattr(speculative, "has_arctic_inference"):
        speculative.has_arctic_inference = lambda: True


@contextlib.contextmanager
def _device(case: dict[str, Any]) -> Iterator[None]:
    import vllm.config.vllm as vv
    import vllm.platforms as vp

    from referee.harness import _modules_binding_platform, _reset_once_caches

    saved_env = {k: os.environ.get(k) for k in _OWNED_ENV}
    saved_platform, saved_triton = vp._current_platform, vv.HAS_TRITON
    bound = _modules_binding_platform()
    try:
        for key in _OWNED_ENV:
            os.environ.pop(key, None)
        os.environ.update(RANK="0", LOCAL_RANK="0")  # torchrun's, for the external launcher
        os.environ.update(case.get("env") or {})
        device = stand_in.platform(case["platform"], case["device_capability"])
        vp._current_platform = device
        for module in bound:
            module.current_platform = device
        vv.HAS_TRITON = True  # the wheels' CUDA and ROCm builds ship Triton
        _reset_once_caches()
        yield
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        vp._current_platform, vv.HAS_TRITON = saved_platform, saved_triton
        for module, value in bound.items():
            module.current_platform = value


def run_case(case: dict[str, Any], models: Path) -> dict[str, Any]:
    """vLLM's answer for one case of :func:`referee.serve_gen.generate`; ``models`` is the
    folder of :func:`referee.serve_gen.write_models`."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    from referee.flags import serve_parser

    argv = [*resolve(case["argv"], models), "--skip-tokenizer-init"]
    if not _PARSER:  # built once, outside the case's device (it installs a platform of its own)
        _PARSER.append(serve_parser()[0])
    top = _PARSER[0]
    _RECORDS.records = []
    with _device(case):
        try:
            args = top.parse_args(argv[1:])
        except SystemExit:
            return {"decision": "invalid", "error": "the parser refused the line", "warnings": []}
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag
        try:
            config = AsyncEngineArgs.from_cli_args(args).create_engine_config(
                usage_context=UsageContext.OPENAI_API_SERVER
            )
            decision = "v2" if config.use_v2_model_runner else "v1"
            error = None
        except (ValueError, AssertionError, TypeError, NotImplementedError, ArithmeticError) as exc:
            decision, error = "error", error_text(exc)
    warnings: list[dict[str, str]] = []
    for func, level, message in _RECORDS.records:
        line = {"level": level, "message": message}
        if func == _SELECTION and line not in warnings:
            warnings.append(line)
    out: dict[str, Any] = {"decision": decision, "warnings": warnings}
    if error is not None:
        out["error"] = error
    return out
