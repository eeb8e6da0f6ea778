"""The store's reads of responses that age: which responses have expired (``retention_s``
from their ``created_at``, on a clock tests move), a chain in one recursive query that stops
at an expired or missing link, and the oldest expired responses for a sweep to delete."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from sqlalchemy import ColumnElement, Integer, Select, literal, select, true
from sqlalchemy.orm import aliased

from serve_app.store.tables import ResponseRow

# A chain longer than this is cut there (a guard: the recursive query ends even on a cycle).
MAX_CHAIN_LINKS = 100_000


class Expiry:
    def __init__(self, retention_s: float | None, clock: Callable[[], float] = time.time) -> None:
        self.retention_s = retention_s
        self._clock = clock

    def cutoff(self) -> int | None:
        """Responses created at or before this (epoch seconds) have expired; None: none."""
        if self.retention_s is None:
            return None
        return math.floor(self._clock() - self.retention_s)

    def alive(self, row: type[ResponseRow]) -> ColumnElement[bool]:
        """``row`` (the responses table, or an alias of it) has not expired."""
        cutoff = self.cutoff()
        return true() if cutoff is None else row.created_at > cutoff


def chain_query(response_id: str, expiry: Expiry) -> Select:
    """The response and its ancestors, oldest first: a recursive CTE follows
    ``previous_response_id`` to the root, or to the first link that is gone (deleted, expired)."""
    parent = aliased(ResponseRow)
    links = (
        select(ResponseRow.id, ResponseRow.previous_response_id, literal(0, Integer).label("depth"))
        .where(ResponseRow.id == response_id, expiry.alive(ResponseRow))
        .cte("links", recursive=True)
    )
    links = links.union_all(
        select(parent.id, parent.previous_response_id, links.c.depth + 1).where(
            parent.id == links.c.previous_response_id,
            expiry.alive(parent),
            links.c.depth < MAX_CHAIN_LINKS,
        )
    )
    return (
        select(ResponseRow).join(links, ResponseRow.id == links.c.id).order_by(links.c.depth.desc())
    )


def expired_query(cutoff: int, batch: int) -> Select:
    """The ids of up to ``batch`` expired responses, oldest first, that no other transaction
    holds: PostgreSQL skips rows another sweeper has locked (SQLite has no row locks: its
    writers take turns)."""
    return (
        select(ResponseRow.id)
        .where(ResponseRow.created_at <= cutoff)
        .order_by(ResponseRow.created_at)
        .limit(batch)
        .with_for_update(skip_locked=True)
    )
