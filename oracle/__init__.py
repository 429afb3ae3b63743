"""The decision core of turnout: deployment configs, policy packs, the three-state policy, the
Decision and its explanation. Torch-free; imports only the standard library, pydantic and PyYAML
(plus an HTTP client in ``oracle.client``)."""
