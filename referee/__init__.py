"""The referee: vLLM's own runner selection, run on generated deployment configs.

The ``vllm-<release>`` packs claim to reproduce each release's choice between Model Runner V1
and V2. This package checks that claim against the release itself: :mod:`referee.generator`
makes seeded deployment specs (turnout's spec format, torch-free, no vLLM needed), and
:mod:`referee.harness` runs each one through the release's real selection code
(``VllmConfig.use_v2_model_runner`` and the ``_get_v2_/_get_v1_model_runner_unsupported_features``,
DBO and ``_validate_v*_model_runner`` helpers it calls) inside a virtual environment where that
release's wheel is installed with ``--no-deps`` (``make referee``). What the harness replays of
``VllmConfig.__post_init__`` around the selection is listed, step by step with the vLLM lines it
follows, in :mod:`referee.replay`; docs/oracle-releases.md says how to regenerate the golden files.

The same environments give the oracle its ``vllm serve`` parsers: :mod:`referee.flags` dumps
each release's own parser into ``policies/reference/vllm-<release>/flags.json``,
:mod:`referee.flags_probe` records what that parser makes of probe lines and recipe lines, and
:mod:`referee.flags_check` compares it with the oracle's on seeded lines (:mod:`referee.flags_gen`).

Nothing here is imported by the oracle, the service or the runners, and vLLM is never a run-time
or CI dependency: ``make test`` compares each pack with the golden files these modules wrote.
"""

RELEASES = ("0.29", "0.30", "0.31", "0.32", "0.33")
