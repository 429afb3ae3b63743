"""Triton kernels of turnout, each with a pure-torch reference.

Imports torch and (optionally) triton only. Each module holds a private ``_verb_kernel``, a
typed launcher ``verb()`` and a reference ``verb_ref()``; see docs/kernels.md.
"""
