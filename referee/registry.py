"""The release's model registry as pack data: which draft architectures vLLM accepts.

``SpeculativeConfig.__post_init__`` builds a ModelConfig for a draft model (methods
``draft_model``, ``eagle``, ``eagle3``, ``dflash``), which refuses an architecture the
release's ``ModelRegistry`` lacks; for the EAGLE-style methods ``EAGLEConfig`` then renames the
architecture (``LlamaForCausalLM`` -> ``EagleLlamaForCausalLM``) and the renamed one is looked
up again. Both refusals quote the whole registry. A pack cannot run that code, so this module
writes what it needs into the pack's capability_matrix.yaml, between marker comments:

- ``derived.draft_registered``: the registered architectures;
- ``derived.renamed_draft_registered``: per method, the registered architectures whose renamed
  form is registered too (computed with the release's own ``EAGLEConfig``);
- ``derived.draft_lacks_pipeline_parallel``: per method, the draft architectures whose model
  class (renamed where the method renames it) does not implement ``SupportsPP``: in 0.29 the
  draft's ParallelConfig keeps the target's pipeline size and the draft's ModelConfig is
  verified with it (``SpeculativeConfig.create_draft_parallel_config``). ``draft_model``
  drafts are asked over the architecture pool only (referee.architectures; loading every
  registered class takes packages the referee lacks);
- ``texts.registered_architectures``: the registry as the refusal prints it.

    python -m referee draft-registry --release 0.31 [--write]

Run in the release's referee environment (the registry comes from its vLLM).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

from referee.replay import classes_without_pp, registered_architectures

RENAMED_DRAFT_METHODS = ("eagle", "eagle3", "dflash")
_DERIVED = ("  # >>> draft registry", "  # <<< draft registry")
_TEXTS = ("# >>> registry text", "# <<< registry text")
_WIDTH = 96


def renamed(arch: str, method: str) -> str:
    """``arch`` as the release's ``EAGLEConfig`` names it for ``method``."""
    from transformers import PretrainedConfig
    from vllm.transformers_utils.configs.eagle import EAGLEConfig

    draft = PretrainedConfig(architectures=[arch], vocab_size=32000)  # EAGLEConfig reads it
    return str(EAGLEConfig(draft, method=method, model_type="eagle").architectures[0])


_PP_PROBE = """
import json, logging, sys
from referee.serve_real import prepare
prepare()
logging.getLogger("vllm").setLevel(logging.CRITICAL)
from vllm.model_executor.models.interfaces import supports_pp
from vllm.model_executor.models.registry import ModelRegistry
out = []
for arch in json.loads(sys.argv[1]):
    try:
        if not supports_pp(ModelRegistry.models[arch].load_model_cls()):
            out.append(arch)
    except Exception:  # an optional package of that model is missing here
        pass
print(json.dumps(out))
"""


@cache
def without_pp(names: tuple[str, ...]) -> frozenset[str]:
    """Those of ``names`` (registered) whose model class lacks ``SupportsPP``, asked in a child
    process with the real-code referee's stand-ins (as referee.replay's class probe)."""
    proc = subprocess.run(
        [sys.executable, "-c", _PP_PROBE, json.dumps(list(names))],
        capture_output=True,
        text=True,
        check=True,
    )
    return frozenset(json.loads(proc.stdout.strip().splitlines()[-1]))


def _flow_list(names: list[str], indent: str, prefix: str = "") -> list[str]:
    """``prefix[a, b, ...]`` wrapped at :data:`_WIDTH` columns, continuation lines at
    ``indent``."""
    lines, line = [], prefix + "["
    for i, name in enumerate(names):
        word = name + ("]" if i == len(names) - 1 else ",")
        margin = 0 if lines else len(indent)
        if len(indent) - margin + len(line) + len(word) + 1 > _WIDTH and not line.endswith("["):
            lines.append(line.rstrip())
            line = ""
        line += word + " "
    lines.append(line.rstrip())
    return [lines[0]] + [indent + x for x in lines[1:]]


def blocks(release: str) -> tuple[list[str], list[str]]:
    """The derived block and the texts block for ``release``'s pack (lines, no markers)."""
    registry = list(registered_architectures())
    head = f"python -m referee draft-registry --release {release} --write"
    derived = [
        "  draft_registered:",
        f"    description: the architecture is in vLLM {release}'s ModelRegistry ({head})",
        "    any:",
        "\n".join(_flow_list(registry, " " * 26, "      - draft_architecture: ")),
        "  renamed_draft_registered:",
        "    description: the draft's architecture, renamed by EAGLEConfig for the method"
        f" (Eagle..., Eagle3..., DFlash...), is in vLLM {release}'s ModelRegistry ({head})",
        "    any:",
    ]
    registered = set(registry)
    # method -> {draft architecture: its renamed form}, for the renamed forms registered
    fits: dict[str, dict[str, str]] = {}
    for method in RENAMED_DRAFT_METHODS:
        names = {a: renamed(a, method) for a in registry}
        fits[method] = {a: r for a, r in names.items() if r in registered}
        prefix = f"      - {{speculative_method: {method}, draft_architecture: "
        derived.append("\n".join(_flow_list(list(fits[method]), " " * 10, prefix)) + "}")
    derived += [
        "  draft_lacks_pipeline_parallel:",
        "    description: the draft's model class (renamed by EAGLEConfig for the method) does"
        f" not implement SupportsPP in vLLM {release} ({head})",
        "    any:",
    ]
    pool_without_pp = sorted(classes_without_pp())
    derived.append(
        "\n".join(
            _flow_list(
                pool_without_pp,
                " " * 10,
                "      - {speculative_method: draft_model, draft_architecture: ",
            )
        )
        + "}"
    )
    for method in RENAMED_DRAFT_METHODS:
        lacking = without_pp(tuple(sorted(set(fits[method].values()))))
        names = [a for a, r in fits[method].items() if r in lacking]
        if names:
            prefix = f"      - {{speculative_method: {method}, draft_architecture: "
            derived.append("\n".join(_flow_list(names, " " * 10, prefix)) + "}")
    quoted = [repr(a) for a in registry]
    text = _flow_list(quoted, "    ", "    dict_keys(")
    text[-1] += ")"
    texts = [
        "texts:",
        f"  # vLLM {release}'s ModelRegistry.get_supported_archs(), as its refusal prints it",
        "  registered_architectures: >-",
        *text,
    ]
    return derived, texts


def write(release: str, pack_file: Path) -> None:
    """Replace the marked blocks of ``pack_file`` with :func:`blocks`; raises SystemExit when a
    marker pair is missing."""
    derived, texts = blocks(release)
    source = pack_file.read_text(encoding="utf-8")
    for (begin, end), body in ((_DERIVED, derived), (_TEXTS, texts)):
        pattern = re.compile(
            rf"^{re.escape(begin)}[^\n]*\n.*?^{re.escape(end)}[^\n]*$", re.M | re.S
        )
        if not pattern.search(source):
            raise SystemExit(f"{pack_file}: no '{begin.strip()}' ... '{end.strip()}' markers")
        replacement = "\n".join([begin, *body, end])
        source = pattern.sub(lambda _m, r=replacement: r, source)
    pack_file.write_text(source, encoding="utf-8")
