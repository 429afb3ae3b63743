"""The new runner (MRV2 style): a GPU-resident request table, Triton input preparation and
asynchronous output."""
