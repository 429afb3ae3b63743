"""Triton kernels of turnout, each with a pure-torch reference.

Imports torch and (optionally) triton only. Each module holds a private ``_verb_kernel``, a
typed launcher ``verb()`` and a reference ``verb_ref()``; docs/model-layer.md (*Kernels*)
and docs/runner-v2.md list them.
"""
