"""The decision core of turnout: deployment configs, policy packs, the three-state policy, the
Decision and its explanation. Torch-free; imports only the standard library, pydantic and PyYAML
(plus an HTTP client in ``oracle.client``).

Public API (docs/oracle-api.md)::

    from turnout.oracle import load_pack, DeploymentConfig, decide, from_command
    pack = load_pack("turnout")
    d = decide(DeploymentConfig(architecture="Qwen3ForCausalLM"), pack=pack)
    d = decide(from_command("vllm serve Qwen/Qwen3-8B -tp 2"), pack=pack)
    d.runner, d.messages, d.to_json()
"""

from turnout.oracle.config import DeploymentConfig
from turnout.oracle.decision import (
    CanaryOutcome,
    CanarySnapshot,
    CohortState,
    Decision,
    Message,
    Reason,
)
from turnout.oracle.errors import ConfigError, ErrorCode, Issue, OracleError, PackError
from turnout.oracle.explain import Change, Explanation, Suggestion, explain
from turnout.oracle.matrix import Cell, enumerate_matrix
from turnout.oracle.pack import Pack, decide, load_pack
from turnout.oracle.pack_types import Cohort, RuleInfo
from turnout.oracle.sources import from_command, from_hf_config, from_spec, load_specs

__all__ = [
    "CanaryOutcome",
    "CanarySnapshot",
    "Cell",
    "Change",
    "Cohort",
    "CohortState",
    "ConfigError",
    "Decision",
    "DeploymentConfig",
    "ErrorCode",
    "Explanation",
    "Issue",
    "Message",
    "OracleError",
    "Pack",
    "PackError",
    "Reason",
    "RuleInfo",
    "Suggestion",
    "decide",
    "enumerate_matrix",
    "explain",
    "from_command",
    "from_hf_config",
    "from_spec",
    "load_pack",
    "load_specs",
]
