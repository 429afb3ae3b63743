"""The fleet tests start the service (tests/dashboard's helpers) and engine servers
(tests/serving's helpers) together: both helper folders are put on the import path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parent.parent
for folder in ("dashboard", "serving"):
    if str(_TESTS / folder) not in sys.path:
        sys.path.insert(0, str(_TESTS / folder))


def _dashboard_conftest() -> object:
    """tests/dashboard/conftest.py under a name of its own: its store fixtures (``db_url``
    on SQLite and PostgreSQL, ``pg_schema_url``) serve the fleet tests too."""
    spec = importlib.util.spec_from_file_location(
        "dashboard_conftest", _TESTS / "dashboard" / "conftest.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_store = _dashboard_conftest()
db_url = _store.db_url  # type: ignore[attr-defined]
pg_schema_url = _store.pg_schema_url  # type: ignore[attr-defined]
