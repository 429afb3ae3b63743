"""The rollout-control service: canary store, JSON API, pages, auth and metrics."""
