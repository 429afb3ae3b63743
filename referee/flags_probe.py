"""What vLLM's own ``vllm serve`` parser makes of a command line: accepted or refused, why.

:func:`verdict` runs a line as ``vllm`` itself would (``vllm/entrypoints/cli/main.py``):
``--omni`` anywhere hands the line to vllm-omni (absent here, so vLLM exits with its error);
then the top-level ``FlexibleArgumentParser.parse_args``, whose own rewriting (underscores to
dashes in option names, ``-O3``, dotted ``--x.y v`` collected into one JSON value,
``--config FILE.yaml``, ``--model`` moved to the positional) runs before argparse (prefix
abbreviations allowed, types and choices checked, the JSON-valued flags validated by their
config classes). ``--speculative-config`` is plain JSON in the parser and is checked when the
engine builds ``SpeculativeConfig(**d)`` (unknown keys refused, ``--spec-method`` with a
method in the JSON refused); that check is replayed as the ``startup`` stage. Nothing else of
start-up (``validate_parsed_serve_args``, ``create_engine_config``) is run: those look at
files, devices and models, not at the command line.

:data:`PROBES` are lines that show each of these behaviours; flags.json records what the
release made of each (values read at the dotted paths named), and the oracle's parser must
reproduce every one (tests/oracle/test_command_table.py).
"""

from __future__ import annotations

import contextlib
import enum
import io
import json
import os
import re
import tempfile
from typing import Any

OMNI_ERROR = "--omni flag requires a valid instance of vllm-omni to be installed."
CONFIG_FILE = "serve-probe.yaml"  # the --config file of the probes, written next to the run
CONFIG_TEXT = (
    "tensor-parallel-size: 4\nenable-prefix-caching: false\nenforce_eager: true\n"
    "compilation-config:\n  mode: 3\nport: 8001\n"
)
# (what it shows, argv after `vllm serve`, dotted paths to read from the namespace)
PROBES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("space form", ("m", "--tensor-parallel-size", "2"), ("tensor_parallel_size",)),
    ("= form", ("m", "--tensor-parallel-size=2"), ("tensor_parallel_size",)),
    ("underscores", ("m", "--tensor_parallel_size", "2"), ("tensor_parallel_size",)),
    ("short alias", ("m", "-tp", "2"), ("tensor_parallel_size",)),
    ("prefix abbreviation", ("m", "--tensor-parallel", "8"), ("tensor_parallel_size",)),
    ("ambiguous prefix", ("m", "--enable", "1"), ()),
    ("short alias prefix", ("m", "-t", "2"), ("tensor_parallel_size",)),
    ("last one wins", ("m", "-tp", "2", "--tensor-parallel-size", "4"), ("tensor_parallel_size",)),
    ("-O3", ("m", "-O3"), ("optimization_level",)),
    ("-O 3", ("m", "-O", "3"), ("optimization_level",)),
    ("-O=3", ("m", "-O=3"), ("optimization_level",)),
    ("-O alone", ("m", "-O"), ()),
    (
        "dotted keys",
        (
            "m",
            "--speculative-config.method",
            "mtp",
            "--speculative_config.num_speculative_tokens",
            "2",
        ),
        ("speculative_config",),
    ),
    ("dotted = form on a short alias", ("m", "-cc.mode=3"), ("compilation_config.mode",)),
    (
        "dotted nested",
        ("m", "-cc.pass_config.enable_sp=true"),
        ("compilation_config.pass_config.enable_sp",),
    ),
    (
        "dotted list items",
        ("m", "-cc.custom_ops+", "+rms_norm", "-cc.custom_ops+=-silu_and_mul,+quant_fp8"),
        ("compilation_config.custom_ops",),
    ),
    (
        "dotted after JSON: the dotted value replaces it",
        ("m", "--compilation-config", '{"cudagraph_mode": "FULL"}', "-cc.mode", "1"),
        ("compilation_config.mode", "compilation_config.cudagraph_mode"),
    ),
    (
        "dotted value not JSON",
        ("m", "--speculative-config.model", "org/draft"),
        ("speculative_config",),
    ),
    (
        "dotted human-readable int",
        ("m", "--kv-transfer-config.kv_buffer_size", "1k"),
        ("kv_transfer_config.kv_buffer_size",),
    ),
    ("dotted flag without a value", ("m", "--speculative-config.method"), ()),
    ("negated switch", ("m", "--no-enable-prefix-caching"), ("enable_prefix_caching",)),
    ("switch given a value", ("m", "--enforce-eager=true"), ()),
    (
        "--model moved to the positional",
        ("--model", "m", "-tp", "2"),
        ("model_tag", "tensor_parallel_size"),
    ),
    ("--model= form", ("-tp", "2", "--model=m"), ("model_tag",)),
    ("model given twice", ("m", "--model", "other"), ()),
    ("extra positional", ("m", "other"), ()),
    ("served model name without a model", ("--served-model-name", "x"), ()),
    ("invalid JSON", ("m", "--kv-transfer-config", "{bad"), ()),
    ("unknown key", ("m", "--compilation-config", '{"not_a_key": 1}'), ()),
    ("unknown nested key", ("m", "--compilation-config", '{"pass_config": {"nope": 1}}'), ()),
    ("wrong value type in JSON", ("m", "--kv-transfer-config", '{"kv_port": "x"}'), ()),
    (
        "JSON with human-readable number",
        ("m", "--kv-transfer-config", '{"kv_buffer_size": 2k}'),
        ("kv_transfer_config.kv_buffer_size",),
    ),
    ("plain JSON", ("m", "--speculative-config", '{"method": "ngram", "not_a_key": 1}'), ()),
    ("JSON null", ("m", "--kv-transfer-config", "None"), ("kv_transfer_config",)),
    ("environment variable as an int", ("m", "--port", "$MASTER_PORT"), ()),
    ("human-readable int", ("m", "--max-num-batched-tokens", "16k"), ("max_num_batched_tokens",)),
    ("human-readable int with a binary suffix", ("m", "--max-model-len", "1.5K"), ()),
    ("auto", ("m", "--max-model-len", "auto"), ("max_model_len",)),
    ("choices", ("m", "--dtype", "bf16"), ()),
    ("optional value", ("m", "--quantization", "None"), ("quantization",)),
    (
        "several values",
        ("m", "--served-model-name", "a", "b", "--port", "8001"),
        ("served_model_name", "port"),
    ),
    ("negative number as a value", ("m", "--gpu-memory-utilization", "-0.5"), ()),
    ("unknown flag", ("m", "--not-a-flag", "1"), ()),
    ("--omni", ("m", "--omni"), ()),
    (
        "--config file, command line wins",
        ("m", "--config", CONFIG_FILE, "-tp", "2"),
        (
            "tensor_parallel_size",
            "enable_prefix_caching",
            "enforce_eager",
            "compilation_config.mode",
            "port",
        ),
    ),
    ("--config= form", ("m", f"--config={CONFIG_FILE}"), ()),
    ("help", ("m", "--help"), ()),
)


def _last_error(text: str) -> str:
    text = re.sub(r" at 0x[0-9a-f]+>", ">", text)  # "<function loads at 0x7f...>": no address
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        if ": error: " in line:
            return "\n".join([line.split(": error: ", 1)[1], *lines[i + 1 :]])
    return "\n".join(lines[-3:])


def _startup(ns: Any) -> str | None:
    """vLLM's start-up check of ``--speculative-config`` keys (EngineArgs.
    create_speculative_config); the text is the shape of pydantic's refusal."""
    import dataclasses

    from vllm.config import SpeculativeConfig

    spec = getattr(ns, "speculative_config", None)
    if spec is not None and not isinstance(spec, dict):
        return f"AttributeError: '{type(spec).__name__}' object has no attribute 'items'"
    spec = dict(spec or {})
    for flag, key in (
        ("--spec-method", "method"),
        ("--spec-model", "model"),
        ("--spec-tokens", "num_speculative_tokens"),
    ):
        if getattr(ns, flag[2:].replace("-", "_"), None) is not None and key in spec:
            return f"{flag} and --speculative-config['{key}'] are mutually exclusive"
    names = {f.name for f in dataclasses.fields(SpeculativeConfig) if f.init}
    unknown = [k for k in spec if k.replace("-", "_") not in names]
    if unknown:
        return (
            f"1 validation error for SpeculativeConfig\n{unknown[0].replace('-', '_')}\n"
            "  Unexpected keyword argument"
        )
    return None


def verdict(top: Any, argv: list[str]) -> tuple[dict[str, Any], Any]:
    """``({"accepted", "stage", "error"}, namespace or None)`` for ``argv`` (starting with
    ``vllm serve``), as the installed release's ``vllm`` command would treat it."""
    if "--omni" in argv:
        return {"accepted": False, "stage": "cli", "error": OMNI_ERROR}, None
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            ns = top.parse_args(list(argv[1:]))
    except SystemExit as exc:
        text = "help" if exc.code == 0 else _last_error(err.getvalue())
        return {"accepted": False, "stage": "parser", "error": text}, None
    except Exception as exc:  # vLLM's own rewriting raises before argparse
        return {"accepted": False, "stage": "parser", "error": f"{type(exc).__name__}: {exc}"}, None
    if getattr(ns, "subparser", None) != "serve":
        return {"accepted": False, "stage": "parser", "error": "not vllm serve"}, None
    problem = _startup(ns)
    if problem is not None:
        return {"accepted": False, "stage": "startup", "error": problem}, ns
    return {"accepted": True, "stage": None, "error": None}, ns


def plain(value: Any) -> Any:
    """A parsed value as JSON: IntEnum members by value, other enums by name."""
    if isinstance(value, enum.Enum):
        return value.value if isinstance(value, int) else value.name
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return {"unserialisable": type(value).__name__}


def read(ns: Any, path: str) -> Any:
    """The value at a dotted path of a namespace (attributes or keys)."""
    value = ns
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else getattr(value, part, None)
    return plain(value)


def behaviours(top: Any) -> dict[str, Any]:
    """Every probe's verdict and values, run in a scratch folder holding the --config file."""
    out = []
    with tempfile.TemporaryDirectory() as scratch:
        here = os.getcwd()
        os.chdir(scratch)
        try:
            with open(CONFIG_FILE, "w", encoding="utf-8") as fh:
                fh.write(CONFIG_TEXT)
            for note, args, paths in PROBES:
                got, ns = verdict(top, ["vllm", "serve", *args])
                if ns is not None and got["accepted"]:
                    got["values"] = {p: read(ns, p) for p in paths}
                out.append({"note": note, "argv": list(args), **got})
        finally:
            os.chdir(here)
    return {
        "config_file": {"name": CONFIG_FILE, "text": CONFIG_TEXT},
        "omni_error": OMNI_ERROR,
        "probes": out,
    }


def dumps(table: dict[str, Any]) -> str:
    """flags.json's text: one action, config field, enum or probe a line (diffs between
    releases read line by line)."""

    def block(value: Any, indent: str, depth: int) -> str:
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            rows = [indent + " " + json.dumps(v) for v in value]
            return "[\n" + ",\n".join(rows) + "\n" + indent + "]"
        if (
            depth
            and isinstance(value, dict)
            and any(
                isinstance(v, dict) or (isinstance(v, list) and v and isinstance(v[0], dict))
                for v in value.values()
            )
        ):
            rows = [
                f"{indent} {json.dumps(k)}: {block(v, indent + ' ', depth - 1)}"
                for k, v in value.items()
            ]
            return "{\n" + ",\n".join(rows) + "\n" + indent + "}"
        return json.dumps(value)

    return block(table, "", 4) + "\n"
