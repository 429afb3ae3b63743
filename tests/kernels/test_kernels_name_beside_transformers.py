"""DESIGN §2: our top-level package `kernels` shares its name with Hugging Face's hub-kernels
package, which transformers probes for (`is_kernels_available()`) and, when it believes it
present, imports symbols from (`from kernels import get_kernel, ...`). transformers must keep
running beside ours: it must not take our package for the hub one, and ours must stay ours.

Checked in fresh interpreters started in the repository root (so `kernels` resolves to ours),
both as installed (`pip install -e .`: the import name maps to the `turnout` distribution)
and as a bare source tree (no distribution metadata for `kernels`, as on a GPU machine that
runs the tests from a copy of the repository).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]

_CHECK = r"""
import importlib.metadata, json, sys
if sys.argv[1] == "source-tree":  # hide the editable install's name mapping
    real = importlib.metadata.packages_distributions
    importlib.metadata.packages_distributions = lambda: {
        k: v for k, v in real().items() if k != "kernels"}
import torch
import transformers
from transformers.utils import import_utils
import transformers.integrations.hub_kernels  # imports hub symbols if it thinks they exist
import kernels
from kernels.paged_attention import paged_attention_ref
cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                               num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(cfg).eval()
out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False)
print(json.dumps({
    "hub_kernels_available": import_utils.is_kernels_available(),
    "ours": kernels.__file__,
    "ref": paged_attention_ref.__module__,
    "generated": out.shape[1],
}))
"""


@pytest.mark.parametrize("mode", ["installed", "source-tree"])
def test_transformers_runs_beside_our_kernels_package(mode: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _CHECK, mode], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["hub_kernels_available"] is False
    assert Path(result["ours"]).resolve().is_relative_to(ROOT)
    assert result["ref"] == "kernels.paged_attention"
    assert result["generated"] == 7
