"""Which failed writes the store runs again, and the pause before each try.

A transaction that fails for a transient reason (SQLite busy or locked, a PostgreSQL
serialization failure or deadlock, a dropped connection) is run again, a few times with a
growing pause (`SqlResponseStore._transact`); what still fails raises."""

from __future__ import annotations

import random
import sqlite3

from sqlalchemy.exc import DBAPIError

# A write that fails for a transient reason is tried this many times in all, pausing between
# tries for a random time up to a bound that doubles from the first to the last (full jitter:
# writers that collided do not collide again in step). On SQLite each try also waits up to
# ``busy_timeout`` (5 s) for the write lock, so a write gives up after about half a minute.
WRITE_ATTEMPTS = 6
FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0
# SQLite's "database is busy" and "a table is locked" (extended codes keep these low bits).
_SQLITE_BUSY_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
_SQLITE_BUSY_MESSAGES = ("database is locked", "database is busy", "database table is locked")
# PostgreSQL: serialization_failure, deadlock_detected; the server going away (class 57P:
# admin_shutdown, crash_shutdown, cannot_connect_now) and connection exceptions (class 08).
_PG_TRANSIENT_STATES = ("40001", "40P01", "57P01", "57P02", "57P03")


def transient(error: BaseException) -> bool:
    """Whether a failed transaction may succeed if run again: nothing of it was committed and
    the cause passes (contention, a connection lost). Constraint violations and bugs are not."""
    if not isinstance(error, DBAPIError):
        return False
    if error.connection_invalidated:
        return True
    cause = error.orig
    if isinstance(cause, sqlite3.OperationalError):
        code = getattr(cause, "sqlite_errorcode", None)
        if code is not None and code & 0xFF in _SQLITE_BUSY_CODES:
            return True
        return str(cause).lower().startswith(_SQLITE_BUSY_MESSAGES)
    state = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    return isinstance(state, str) and (state in _PG_TRANSIENT_STATES or state.startswith("08"))


def backoff_s(attempt: int) -> float:
    """The pause after the ``attempt``-th failed try (1-based)."""
    return random.uniform(0, min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (attempt - 1)))
