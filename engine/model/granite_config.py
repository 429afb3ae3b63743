"""GraniteMultipliers: Granite's muP-style scalars (transformers ``granitemoe``, IBM Granite 3.0).

- ``embedding_multiplier``: the input embeddings are multiplied by it;
- ``attention_multiplier``: the softmax scale of attention, in place of ``head_dim ** -0.5``;
- ``residual_multiplier``: each sublayer's output is multiplied by it before the residual add;
- ``logits_scaling``: the LM head's logits are divided by it.

Defaults are transformers' (``GraniteMoeConfig``: all 1.0). Imports no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

GRANITE_ARCHITECTURES = ("GraniteMoeForCausalLM",)


@dataclass(frozen=True)
class GraniteMultipliers:
    embedding_multiplier: float = 1.0
    attention_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> GraniteMultipliers:
        """Read the four keys (missing ones take transformers' default, 1.0).

        Raises:
            ModelConfigError: a value that is not a positive finite number (named).
        """
        values = {}
        for key, default in asdict(cls()).items():
            value = d.get(key, default)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (math.isfinite(value) and value > 0)
            ):
                from turnout.engine.model.config import (
                    ModelConfigError,  # config imports this module
                )

                raise ModelConfigError(
                    f"config field `{key}` must be a positive number, got {value!r}"
                )
            values[key] = float(value)
        return cls(**values)

    def to_hf_dict(self) -> dict[str, float]:
        return asdict(self)


__all__ = ["GRANITE_ARCHITECTURES", "GraniteMultipliers"]
