"""Where deployment configs come from: ``vllm serve`` command lines (:func:`from_command`),
spec mappings and spec files (:func:`from_spec`, :func:`load_specs`), HF ``config.json`` files
(:func:`from_hf_config`), and a model id's config.json found as vLLM finds it — a local
directory, the HF cache, the hub, then ``policies/known_models.yaml``
(:func:`resolve_model_config`).

This package imports :mod:`oracle.config` and builds :class:`~oracle.config.DeploymentConfig`
values; ``oracle.config`` never imports it (tests/test_import_boundaries.py checks the rule).
"""

from turnout.oracle.sources.command import HintFor, ParsedCommand, command_to_fields, from_command
from turnout.oracle.sources.command_table import release_for_pack
from turnout.oracle.sources.hf_config import from_hf_config, hf_config_to_fields, read_hf_config
from turnout.oracle.sources.hub import ModelConfigSource, resolve_model_config
from turnout.oracle.sources.spec import SpecEntry, from_spec, load_specs, spec_to_fields

__all__ = [
    "HintFor",
    "ModelConfigSource",
    "ParsedCommand",
    "SpecEntry",
    "command_to_fields",
    "from_command",
    "from_hf_config",
    "from_spec",
    "hf_config_to_fields",
    "load_specs",
    "read_hf_config",
    "release_for_pack",
    "resolve_model_config",
    "spec_to_fields",
]
