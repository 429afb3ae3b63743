"""Whether enabling changes wait for a second operator, held in the database so that every
process writing to it follows the service.

``TURNOUT_REQUIRE_APPROVAL`` is read by each process. Were it only that, an operator running
``turnout canary enable`` from a shell without the variable would flip a stage the service
holds for approval. So the service records its setting in ``service_meta`` when it starts,
and every process (the service's replicas, the command line) requires approval when its own
setting or the recorded one says so.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from turnout.dashboard.store.models import ServiceMeta

KEY = "require_approval"


def record(*, session: Session, required: bool) -> None:
    """Record the starting service's setting (the caller commits)."""
    row = session.get(ServiceMeta, KEY)
    if row is None:
        session.add(ServiceMeta(key=KEY, value="true" if required else "false"))
    else:
        row.value = "true" if required else "false"


def recorded(*, session: Session) -> bool:
    """The setting the service last started with (False when none ever recorded one)."""
    row = session.get(ServiceMeta, KEY)
    return row is not None and row.value == "true"


__all__ = ["KEY", "record", "recorded"]
