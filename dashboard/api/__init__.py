"""The JSON API under ``/api/v1`` (thin routes; the store and the oracle do the work)."""
