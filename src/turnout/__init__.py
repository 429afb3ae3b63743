"""turnout: the compatibility oracle and rollout control for LLM model runners, and both runners.

The sub-packages live in folders at the repository root (``oracle/``, ``engine/``, ``kernels/``,
``runner_v1/``, ``runner_v2/``, ``dashboard/``, ``policies/``); ``src/turnout/`` links them
under this one import root (README, "Layout"). This file makes ``turnout`` a regular package,
so a stray folder named ``turnout`` on ``sys.path`` (a checkout in the working directory) cannot
join or replace it the way a namespace package's portions can.
"""
