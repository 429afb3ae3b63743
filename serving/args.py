"""The flags of ``turnout engine serve``: vLLM's ``vllm serve`` names where they mean the same.

Parsed with argparse, as vLLM parses them, so a bad flag is refused the way ``vllm serve``
refuses it (``error: unrecognized arguments: --max-num-seq 8``, ``error: argument --port:
invalid int value: 'x'``; exit status 2). Flags whose vLLM meaning differs are named here:

* ``--runner`` picks turnout's runner: ``auto`` (the rollout decides), ``v1`` or ``v2`` (a
  pin). vLLM's ``--runner`` picks a model runner *type* (``generate``, ``pooling``), which
  turnout reads from the model's architecture.
* ``--drain-timeout`` (turnout) and ``--shutdown-timeout`` (vLLM 0.33's name for the same
  wait) set the seconds requests in flight get to finish after SIGTERM.
* ``--dtype auto`` is vLLM's rule on a GPU (the checkpoint's bfloat16 or float16, float32
  checkpoints downcast to bfloat16: ``server.auto_dtype``) and float32 on the CPU; ``half``
  and ``float`` are vLLM's aliases of ``float16`` and ``float32``.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnout.oracle.wire import address_problem

DEFAULT_PORT = 8000  # vllm serve's
DEFAULT_DRAIN_TIMEOUT_S = 30.0
_DTYPES = {"auto": None, "bfloat16": "bfloat16", "float16": "float16", "half": "float16",
           "float32": "float32", "float": "float32"}  # fmt: skip


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text!r}")
    return value


@dataclass
class ServeArgs:
    """The parsed flags (see :func:`build_parser` for each one's meaning)."""

    model: Path
    host: str | None = None
    port: int = DEFAULT_PORT
    served_model_name: list[str] | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_queued_reqs: int | None = None
    api_key: list[str] | None = None
    dtype: str = "auto"
    enforce_eager: bool = False
    runner: str = "auto"
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT_S
    tokenizer: Path | None = None
    device: str | None = None
    pack: str = "turnout"
    deployment_id: str | None = None
    seed: int | None = None
    block_size: int | None = None
    enable_prefix_caching: bool | None = None
    max_logprobs: int | None = None
    num_kv_blocks: int | None = None
    uvicorn_log_level: str = "info"
    advertise_address: str | None = None

    def address(self) -> str:
        """host:port where this server answers, as the service lists it."""
        if self.advertise_address:
            return self.advertise_address
        host = self.host if self.host not in (None, "", "0.0.0.0", "::") else socket.gethostname()
        assert host is not None
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def served_model_names(self) -> list[str]:
        """``--served-model-name`` values, else the model path as given (vLLM's default)."""
        return list(self.served_model_name) if self.served_model_name else [str(self.model)]

    def engine_args(self) -> dict[str, Any]:
        """The :class:`~turnout.engine.config.EngineConfig` fields the flags set."""
        fields = {
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "dtype": _DTYPES[self.dtype],
            "seed": self.seed,
            "block_size": self.block_size,
            "enable_prefix_caching": self.enable_prefix_caching,
            "max_logprobs": self.max_logprobs,
            "num_kv_blocks": self.num_kv_blocks,
        }
        args = {k: v for k, v in fields.items() if v is not None}
        if self.enforce_eager:
            args["enforce_eager"] = True
        return args


def build_parser(prog: str = "turnout engine serve") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Serve a model over the OpenAI API on the runner the rollout chooses.",
        allow_abbrev=False,  # vLLM's FlexibleArgumentParser refuses abbreviations too
    )
    p.add_argument("model", type=Path, help="HF model directory or .gguf file")
    p.add_argument("--host", default=None, help="address to bind (default: all interfaces)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default 8000)")
    p.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="names clients use in `model` (default: the model path)",
    )
    p.add_argument("--max-model-len", type=_positive_int, default=None)
    p.add_argument("--max-num-seqs", type=_positive_int, default=None)
    p.add_argument("--max-num-batched-tokens", type=_positive_int, default=None)
    p.add_argument(
        "--max-num-queued-reqs",
        type=_positive_int,
        default=None,
        help="waiting requests at most; more get 503 with Retry-After (default: no bound)",
    )
    p.add_argument("--api-key", nargs="+", default=None, help="accepted bearer tokens for /v1")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="auto")
    p.add_argument(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="no CUDA graphs (runner_v2)",
    )
    p.add_argument(
        "--runner",
        choices=("auto", "v1", "v2"),
        default="auto",
        help="auto: the rollout decides; v1 or v2: a pin (reported as one)",
    )
    p.add_argument(
        "--drain-timeout",
        "--shutdown-timeout",
        dest="drain_timeout",
        type=_seconds,
        default=DEFAULT_DRAIN_TIMEOUT_S,
        help="seconds in-flight requests get after SIGTERM (default 30)",
    )
    p.add_argument("--tokenizer", type=Path, default=None)
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    p.add_argument("--pack", default="turnout", help="policy pack name or folder")
    p.add_argument(
        "--deployment-id",
        default=None,
        help="the deployment's id (canary split; default TURNOUT_DEPLOYMENT_ID, else the host)",
    )
    p.add_argument(
        "--advertise-address",
        type=_address,
        default=None,
        help="host:port the service lists for Prometheus to scrape (default: --host and "
        "--port; the host name when binding every interface)",
    )
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--block-size", type=_positive_int, default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--max-logprobs", type=int, default=None)
    p.add_argument("--num-kv-blocks", type=_positive_int, default=None)
    p.add_argument(
        "--uvicorn-log-level",
        choices=("critical", "debug", "error", "info", "trace", "warning"),
        default="info",
    )
    return p


def _address(text: str) -> str:
    problem = address_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def parse_args(argv: Sequence[str], prog: str = "turnout engine serve") -> ServeArgs:
    """Parse and check; exits with status 2 and argparse's message on a bad flag or a model
    path that does not exist."""
    parser = build_parser(prog)
    ns = parser.parse_args(list(argv))
    if not ns.model.exists():
        parser.error(f"argument model: {ns.model}: no such file or directory")
    return ServeArgs(**vars(ns))


__all__ = ["ServeArgs", "build_parser", "parse_args"]
