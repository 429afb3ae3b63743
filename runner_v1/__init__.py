"""The old runner (MRV1 style): a CPU-side persistent batch prepared with numpy each step."""
