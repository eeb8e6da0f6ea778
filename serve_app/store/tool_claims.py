"""Calls that must run once, whichever replica and however many requests ask for them: one row
per (owner, claim id), the claim id being what names the call (an approved MCP call's
``approval_request_id``), holding who runs it and, once it ran, its result.

The first request to claim a call inserts the row (``INSERT ... ON CONFLICT DO NOTHING`` on
the primary key) and runs the call; every other claimant's insert does nothing, and it reads
the row back: the result once settled, else who runs it since when (it waits, or reads a
result that never came as unknown). On PostgreSQL a concurrent insert waits for the first
transaction to commit, then does nothing; SQLite's writers take turns (``BEGIN IMMEDIATE``).
A table of its own, so a store made by an older version gains it with ``create_all``.
"""

from __future__ import annotations

from sqlalchemy import Float, Insert, String, Text, delete, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from serve_app.store.base import ToolClaim
from serve_app.store.tables import Base

# The key of an open API's owner (None): owner digests are hex, so none is empty.
OPEN_OWNER = ""


class ToolClaimRow(Base):
    __tablename__ = "tool_claims"

    owner_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    claim_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    # The response whose turn runs the call, and when it took it (epoch seconds).
    claimant: Mapped[str] = mapped_column(String(64))
    claimed_at: Mapped[float] = mapped_column(Float, index=True)
    # The call's result (JSON, the caller's format), once it ran; None while it runs.
    result_json: Mapped[str | None] = mapped_column(Text)


def owner_key(owner: str | None) -> str:
    return OPEN_OWNER if owner is None else owner


async def claim(
    session: AsyncSession, owner: str | None, claim_id: str, claimant: str, now: float
) -> ToolClaim:
    """Take the call for ``claimant`` unless someone has; the claim as it stands after."""
    dialect = (await session.connection()).dialect.name
    await session.execute(_insert_if_absent(dialect, owner_key(owner), claim_id, claimant, now))
    found = await read(session, owner, claim_id)
    if found is None:  # only if the row was deleted between the two statements
        raise RuntimeError(f"the claim {claim_id!r} vanished while it was being taken")
    return found


async def settle(
    session: AsyncSession, owner: str | None, claim_id: str, claimant: str, result: str
) -> bool:
    """Record the result of ``claimant``'s run; whether the claim was still its own (the row
    not swept meanwhile) and unsettled."""
    done = await session.execute(
        update(ToolClaimRow)
        .where(
            ToolClaimRow.owner_key == owner_key(owner),
            ToolClaimRow.claim_id == claim_id,
            ToolClaimRow.claimant == claimant,
            ToolClaimRow.result_json.is_(None),
        )
        .values(result_json=result)
    )
    return done.rowcount == 1


async def read(session: AsyncSession, owner: str | None, claim_id: str) -> ToolClaim | None:
    row = (
        await session.execute(
            select(ToolClaimRow.claimant, ToolClaimRow.claimed_at, ToolClaimRow.result_json).where(
                ToolClaimRow.owner_key == owner_key(owner), ToolClaimRow.claim_id == claim_id
            )
        )
    ).first()
    if row is None:
        return None
    return ToolClaim(claimant=row.claimant, claimed_at=row.claimed_at, result=row.result_json)


async def sweep(session: AsyncSession, cutoff: float) -> int:
    """Forget the claims taken at or before ``cutoff`` (the store's retention)."""
    done = await session.execute(delete(ToolClaimRow).where(ToolClaimRow.claimed_at <= cutoff))
    return done.rowcount


def _insert_if_absent(dialect: str, owner: str, claim_id: str, claimant: str, now: float) -> Insert:
    if dialect not in ("postgresql", "sqlite"):  # the store runs on these two only
        raise RuntimeError(f"tool claims need SQLite or PostgreSQL, not {dialect}")
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    row = {"owner_key": owner, "claim_id": claim_id, "claimant": claimant, "claimed_at": now}
    return (
        insert(ToolClaimRow)
        .values(**row)
        .on_conflict_do_nothing(index_elements=["owner_key", "claim_id"])
    )
