"""SQLite's side of the store: a private database file, WAL and ``busy_timeout`` on each
connection, and transactions that SQLAlchemy begins (``BEGIN IMMEDIATE`` for writes)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)


def private_sqlite_file(path: Path) -> None:
    """The store holds every tenant's prompts and answers: only this user may read it. The
    directories created for it are 0700, the database file 0600, made so before SQLite opens it
    (SQLite gives its -wal and -shm files the database file's mode). A store from before this
    is tightened too; a directory that already existed (``/tmp``, a home) is left as it is."""
    missing = [parent for parent in (path.parent, *path.parent.parents) if not parent.exists()]
    for directory in reversed(missing):
        directory.mkdir(mode=0o700, exist_ok=True)
        directory.chmod(0o700)  # whatever the umask
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            if file.exists() and file.stat().st_mode & 0o077:
                file.chmod(0o600)
                logger.warning("response store: %s was readable by others, now 0600", file)
        except OSError as error:
            logger.warning("response store: could not make %s private: %s", file, error)


# An execution option of the engine that write sessions use.
WRITES = "serve_app_writes"


def sqlite_pragmas(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")  # durable at each commit in WAL mode
    cursor.execute("PRAGMA busy_timeout=5000")  # writers from other replicas wait, not fail
    cursor.close()
    # SQLAlchemy emits BEGIN (sqlite_begin), not the driver.
    connection.isolation_level = None


def sqlite_begin(connection) -> None:
    """SQLAlchemy, not the sqlite3 module, begins each transaction: the module starts one only
    at the first INSERT/UPDATE/DELETE, so a read before it was outside the transaction. A
    writing transaction begins IMMEDIATE: it takes SQLite's one write lock at once, waiting for
    it (``busy_timeout``) rather than failing later when a read snapshot turns out stale. Reads
    begin DEFERRED and never wait."""
    writes = connection.get_execution_options().get(WRITES, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if writes else "BEGIN")
