"""Whether the database a URL names exists, and making it: the command line's direct
database mode (``turnout db upgrade``, the bootstrap admin token) makes one only when told to
(``--create``), so that a typo in a path or a name does not start a new, empty database.
``turnout serve`` creates its database as before (``make run`` on a fresh checkout)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError

from turnout.dashboard.store.db import Database
from turnout.dashboard.store.errors import DatabaseUnavailable

# Databases of a PostgreSQL server one can connect to in order to look another one up.
_MAINTENANCE = ("postgres", "template1")


def _safe(url: str) -> str:
    """``url`` without its password (as given when it does not parse)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def _url(url: str) -> URL:
    try:
        return make_url(url)
    except ArgumentError as err:
        raise DatabaseUnavailable(
            f"{_safe(url)!r} is not a database URL: use sqlite:///path/to/file.db or "
            "postgresql+psycopg://user@host/db"
        ) from err


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (None: in memory, or not SQLite). Raises DatabaseUnavailable
    for a URL that does not parse."""
    parsed = _url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def database_exists(url: str) -> bool:
    """Whether the database exists: the SQLite file is there (an in-memory one always is),
    the PostgreSQL server lists the database. Nothing is created.

    Raises:
        DatabaseUnavailable: the URL does not parse, or the server cannot be reached to tell.
    """
    parsed = _url(url)
    if parsed.get_backend_name() == "sqlite":
        path = sqlite_file(url)
        return path is None or path.exists()
    db = Database(url)
    try:
        db.check()
        return True
    except DatabaseUnavailable as err:
        listed = _listed(parsed)
        if listed is None:  # no maintenance database answers either: say the first error
            raise err from None
        return listed
    finally:
        db.dispose()


def _listed(parsed: URL) -> bool | None:
    """Whether the server of ``parsed`` lists its database (None: it cannot be asked)."""
    for maintenance in _MAINTENANCE:
        engine = create_engine(parsed.set(database=maintenance))
        try:
            with engine.connect() as conn:
                found = conn.execute(
                    text("SELECT 1 FROM pg_database WHERE datname = :name"),
                    {"name": parsed.database},
                ).first()
            return found is not None
        except OperationalError:
            continue
        finally:
            engine.dispose()
    return None


def create_database(url: str) -> None:
    """Make the database of ``url``: the directory of a SQLite file (the file itself comes
    with the first connection), or the PostgreSQL database (``CREATE DATABASE``, from a
    maintenance database of the server).

    Raises:
        DatabaseUnavailable: the URL does not parse, the directory cannot be made, or the
            server refuses.
    """
    parsed = _url(url)
    if parsed.get_backend_name() == "sqlite":
        Database(url).dispose()  # makes the directory, or says why it cannot
        return
    last: DBAPIError | None = None
    for maintenance in _MAINTENANCE:
        engine = create_engine(parsed.set(database=maintenance), isolation_level="AUTOCOMMIT")
        try:
            conn = engine.connect()
        except OperationalError as err:  # try the next maintenance database
            last = err
            engine.dispose()
            continue
        try:
            with conn:
                quoted = conn.dialect.identifier_preparer.quote_identifier(parsed.database or "")
                conn.execute(text(f"CREATE DATABASE {quoted}"))
            return
        except DBAPIError as err:  # no CREATEDB privilege, a name the server refuses
            last = err
            break
        finally:
            engine.dispose()
    reason = str(getattr(last, "orig", None) or last).strip().splitlines()[0]
    raise DatabaseUnavailable(f"cannot create the database {_safe(url)}: {reason}")
