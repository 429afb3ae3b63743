"""Capability manifests: what each runner of this build can serve, declared by the runner.

A :class:`RunnerManifest` lists the architectures the model layer loads that the runner drives (per
runner kind), the speculative methods it implements, the options it honours or refuses by name
(:data:`FEATURES`; nothing is silently ignored, docs/architecture.md §5.5), the pooling tasks, the
platforms, and whether it needs Triton. Each runner package exposes its ``MANIFEST``, built in its
hub module from the code that implements or refuses each thing (the model layer's architecture
tuples, ``runner_v1/spec_decode.py``, ``runner_v2/refusals.py``), never from a second list.

The oracle never imports the runners (docs/architecture.md §2), so the manifests are written
into the ``turnout`` policy pack as generated data, ``policies/turnout/manifests.json``; the
pack reads it through its ``pack.manifests`` key and refuses an architecture no runner serves.
Regenerate it after a change to the model layer or a runner::

    python -m turnout.engine.capabilities --write     # rewrite policies/turnout/manifests.json
    python -m turnout.engine.capabilities --check     # exit 1 when the file and the runners differ

This module imports no torch; building a manifest (:func:`live_manifests`) imports the runners
and with them the model layer.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Options a deployment or a request can ask a runner for (EngineConfig and SamplingParams
#: terms); every runner either honours or refuses each one.
FEATURES: dict[str, str] = {
    "chunked_prefill": "EngineConfig.enable_chunked_prefill: a prompt split over steps",
    "cpu_offload": "EngineConfig.cpu_offload_gb > 0: weights streamed from host memory",
    "logits_processors": "SamplingParams.logits_processors: per-request Python hooks",
    "logprobs": "SamplingParams.logprobs: top-k logprobs of sampled tokens",
    "prefix_caching": "EngineConfig.enable_prefix_caching: KV blocks of shared prefixes reused",
    "prompt_logprobs": "SamplingParams.prompt_logprobs: top-k logprobs of prompt tokens",
}
RUNNER_KINDS = ("generate", "pooling")
#: Where the generated file lives, and the command that writes it.
MANIFESTS_FILE = Path(__file__).resolve().parents[1] / "policies" / "turnout" / "manifests.json"
WRITE_COMMAND = "python -m turnout.engine.capabilities --write"
FORMAT_VERSION = 1


class ManifestError(ValueError):
    """A manifest that is not well-formed (an unknown feature, one both honoured and refused)."""


@dataclass(frozen=True)
class RunnerManifest:
    """What one runner serves (frozen).

    Attributes:
        runner: ``"v1"`` or ``"v2"`` (the package is ``runner_<runner>``).
        architectures: runner kind (``generate`` | ``pooling``) -> HF architecture names,
            sorted, as ``(kind, names)`` pairs.
        speculative_methods: vLLM method names it implements (``"none"`` is implied).
        honoured / refused: :data:`FEATURES` names, together each exactly once.
        pooling_tasks: vLLM pooling task names (``classify``, ``embed``, ``reward``,
            ``score``) its pooling path serves; which architecture serves which:
            ``engine/model/pooling_config.py``.
        platforms: device types it runs on (``cpu``, ``cuda``).
        requires_triton: it refuses to start without Triton.
        async_scheduling: the engine plans step N+1 before it collects step N.
        cuda_graphs: it replays CUDA graphs on CUDA (unless ``enforce_eager``).
        tensor_parallel_architectures: the generating architectures it runs at
            ``tensor_parallel_size > 1`` (the model layer shards them:
            ``engine.model.parallel_layers``); the engine refuses the others by name.
    """

    runner: str
    architectures: tuple[tuple[str, tuple[str, ...]], ...]
    speculative_methods: tuple[str, ...]
    honoured: tuple[str, ...]
    refused: tuple[str, ...]
    pooling_tasks: tuple[str, ...]
    platforms: tuple[str, ...]
    requires_triton: bool
    async_scheduling: bool
    cuda_graphs: bool
    tensor_parallel_architectures: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        both = set(self.honoured) & set(self.refused)
        missing = set(FEATURES) - set(self.honoured) - set(self.refused)
        unknown = (set(self.honoured) | set(self.refused)) - set(FEATURES)
        kinds = [k for k, _ in self.architectures]
        if both or missing or unknown or not set(kinds) <= set(RUNNER_KINDS):
            raise ManifestError(
                f"runner {self.runner}: features both honoured and refused {sorted(both)}, neither "
                f"{sorted(missing)}, unknown {sorted(unknown)}; runner kinds {kinds}"
            )
        unserved = sorted(
            set(self.tensor_parallel_architectures) - set(self.architectures_for("generate"))
        )
        if unserved:
            raise ManifestError(
                f"runner {self.runner}: tensor parallelism for architectures it does not "
                f"generate with: {unserved}"
            )

    @classmethod
    def build(
        cls,
        runner: str,
        *,
        architectures: Mapping[str, Sequence[str]],
        refused: Sequence[str],
        speculative_methods: Sequence[str] = (),
        pooling_tasks: Sequence[str] = (),
        platforms: Sequence[str] = (),
        requires_triton: bool = False,
        async_scheduling: bool = False,
        cuda_graphs: bool = False,
        tensor_parallel_architectures: Sequence[str] = (),
    ) -> RunnerManifest:
        """A manifest that honours every feature of :data:`FEATURES` but ``refused``.

        Raises:
            ManifestError: a refused name that is not a feature.
        """
        unknown = sorted(set(refused) - set(FEATURES))
        if unknown:
            raise ManifestError(f"runner {runner}: refuses unknown features {unknown}")
        return cls(
            runner=runner,
            architectures=tuple(
                (k, tuple(sorted(architectures[k]))) for k in RUNNER_KINDS if architectures.get(k)
            ),
            speculative_methods=tuple(sorted(speculative_methods)),
            honoured=tuple(sorted(set(FEATURES) - set(refused))),
            refused=tuple(sorted(refused)),
            pooling_tasks=tuple(sorted(pooling_tasks)),
            platforms=tuple(sorted(platforms)),
            requires_triton=requires_triton,
            async_scheduling=async_scheduling,
            cuda_graphs=cuda_graphs,
            tensor_parallel_architectures=tuple(sorted(tensor_parallel_architectures)),
        )

    def architectures_for(self, runner_kind: str) -> tuple[str, ...]:
        """The architectures served with ``runner_kind`` (empty for a kind it lacks)."""
        return dict(self.architectures).get(runner_kind, ())

    def serves_architecture(self, architecture: str, runner_kind: str) -> bool:
        return architecture in self.architectures_for(runner_kind)

    def honours(self, feature: str) -> bool:
        """Raises KeyError for a name that is not in :data:`FEATURES`."""
        if feature not in FEATURES:
            raise KeyError(f"unknown feature {feature!r}; known: {', '.join(FEATURES)}")
        return feature in self.honoured

    def to_json(self) -> dict[str, Any]:
        """The object ``policies/turnout/manifests.json`` holds per runner (oracle.schema
        ``RunnerManifestSpec`` reads it)."""
        return {
            "architectures": {k: list(v) for k, v in self.architectures},
            "speculative_methods": list(self.speculative_methods),
            "features": {f: f in self.honoured for f in sorted(FEATURES)},
            "pooling_tasks": list(self.pooling_tasks),
            "platforms": list(self.platforms),
            "requires_triton": self.requires_triton,
            "async_scheduling": self.async_scheduling,
            "cuda_graphs": self.cuda_graphs,
            "tensor_parallel_architectures": list(self.tensor_parallel_architectures),
        }


def model_layer_architectures() -> dict[str, tuple[str, ...]]:
    """Runner kind -> the architectures ``engine.model`` loads (its config tuples: encoders and
    sequence classifiers pool, the other decoders generate). Imports the model layer (torch)."""
    from turnout.engine.model import config

    pooling = tuple(config.POOLING_ARCHITECTURES)
    generate = tuple(a for a in config.SUPPORTED_ARCHITECTURES if a not in pooling)
    return {"generate": generate, "pooling": pooling}


def live_manifests() -> dict[str, RunnerManifest]:
    """Each runner's ``MANIFEST`` (the packages are imported by name, as the engine builds
    runners: engine never imports a runner statically)."""
    from turnout.engine.runner_protocol import RUNNER_NAMES

    out = {}
    for name in RUNNER_NAMES:
        manifest = importlib.import_module(f"turnout.runner_{name}").MANIFEST
        if not isinstance(manifest, RunnerManifest) or manifest.runner != name:
            raise ManifestError(
                f"runner_{name}.MANIFEST is not the RunnerManifest of runner {name}"
            )
        out[name] = manifest
    return out


def render(manifests: Mapping[str, RunnerManifest]) -> str:
    """The text of ``manifests.json`` for ``manifests`` (stable: sorted keys, one trailing
    newline), so that the file changes only when a manifest does."""
    body = {
        "generated_by": WRITE_COMMAND,
        "format": FORMAT_VERSION,
        "runners": {name: m.to_json() for name, m in sorted(manifests.items())},
    }
    return json.dumps(body, indent=2, sort_keys=True) + "\n"


def check_file(path: Path = MANIFESTS_FILE) -> str | None:
    """None when ``path`` holds the live manifests; else what to run, and why."""
    want = render(live_manifests())
    try:
        have = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return f"{path} does not exist: run `{WRITE_COMMAND}`"
    if have == want:
        return None
    return (
        f"{path} differs from the runners' manifests (the model layer or a runner changed): "
        f"run `{WRITE_COMMAND}` and commit the file"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m turnout.engine.capabilities",
        description="the runners' capability manifests",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"rewrite {MANIFESTS_FILE.name}")
    mode.add_argument("--check", action="store_true", help="exit 1 when the file is stale")
    args = parser.parse_args(argv)
    if args.check:
        problem = check_file()
        print(problem or f"{MANIFESTS_FILE} is current")
        return 1 if problem else 0
    text = render(live_manifests())
    if args.write:
        MANIFESTS_FILE.write_text(text, encoding="utf-8")
        print(f"wrote {MANIFESTS_FILE}")
    else:
        sys.stdout.write(text)
    return 0


__all__ = [
    "FEATURES",
    "MANIFESTS_FILE",
    "RUNNER_KINDS",
    "ManifestError",
    "RunnerManifest",
    "check_file",
    "live_manifests",
    "model_layer_architectures",
    "render",
]

if __name__ == "__main__":
    # Run the imported module's main, so that the runners' manifests are instances of its
    # RunnerManifest (not of this __main__ copy's).
    from turnout.engine.capabilities import main as _main

    raise SystemExit(_main())
