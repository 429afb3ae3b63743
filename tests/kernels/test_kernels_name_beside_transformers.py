"""turnout.kernels beside Hugging Face's ``kernels`` (README, "Layout").

transformers 5 requires the hub package ``kernels`` and imports symbols from it
(``transformers/integrations/hub_kernels.py``). turnout's Triton kernels import as
``turnout.kernels`` only, so both packages load, each as itself, in the environment
``make test`` builds (the editable install). Checked in fresh interpreters started in the
repository root (with ``-P``, as make test runs everything) and in another folder, with a
transformers generate call; tests/test_wheel.py checks the same for the installed wheel.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
# make test installs the hub package from the lock (transformers 5 requires it); a GPU image
# with an older transformers may have none, and then there is nothing to run beside.
# (by its distribution: tests/kernels/ itself would import as a namespace package `kernels`).
try:
    importlib.metadata.version("kernels")
except importlib.metadata.PackageNotFoundError:
    pytest.skip("Hugging Face's kernels package is not installed", allow_module_level=True)
ROOT = Path(__file__).resolve().parents[2]

_CHECK = r"""
import json
import torch
import kernels
from kernels import get_kernel  # the hub package's own API
import transformers
from transformers.utils import import_utils
import transformers.integrations.hub_kernels  # imports the hub symbols it finds
import turnout.kernels
from turnout.kernels.paged_attention import paged_attention_ref
cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                               num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(cfg).eval()
out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False)
print(json.dumps({
    "hub_kernels_available": import_utils.is_kernels_available(),
    "hub": kernels.__file__,
    "ours": turnout.kernels.__file__,
    "ref": paged_attention_ref.__module__,
    "generated": out.shape[1],
}))
"""


@pytest.mark.parametrize("where", ["repo-root", "elsewhere"])
def test_transformers_and_the_hub_kernels_run_beside_ours(where: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONSAFEPATH": "1"}  # PYTHONPATH kept: src/ where nothing is installed
    proc = subprocess.run(
        [sys.executable, "-c", _CHECK],
        cwd=ROOT if where == "repo-root" else tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["hub_kernels_available"] is True
    assert Path(result["hub"]).parent.parent.name == "site-packages", result
    assert Path(result["ours"]).resolve() == ROOT / "kernels" / "__init__.py"  # this tree's
    assert result["ref"] == "turnout.kernels.paged_attention"
    assert result["generated"] == 7
