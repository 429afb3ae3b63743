"""Where the shipped policy packs live, and their names."""

from __future__ import annotations

from pathlib import Path

POLICIES_DIR = Path(__file__).resolve().parent.parent / "policies"
# turnout: this project's runners; vllm-<release>: each vLLM release's own selection.
SHIPPED_PACKS = ("turnout", "vllm-0.29", "vllm-0.30", "vllm-0.31", "vllm-0.32", "vllm-0.33")
# The vLLM release packs, oldest first (each extends the one before it).
RELEASE_PACKS = tuple(p for p in SHIPPED_PACKS if p.startswith("vllm-"))
