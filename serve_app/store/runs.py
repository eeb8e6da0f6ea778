"""The leases of background runs, as statements in a session's transaction
(`SqlResponseStore` runs each in one retried write: serve_app/store/sql.py).

The replica running a background response holds its run's lease (`RunRow`); a run whose lease
lapsed is ended by whichever replica takes it first (`end`, a compare-and-set), so exactly one
replica writes its ending (serve_app/serving/background.py).
"""

from __future__ import annotations

import json
import time

from sqlalchemy import Select, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from serve_app.store.base import RunEnding
from serve_app.store.tables import EventRow, ResponseRow, RunRow, item_rows
from serve_app.store.writes import persisted_ending_inputs


async def claim(session: AsyncSession, response_id: str, runner: str, lease_s: float) -> None:
    row = RunRow(
        response_id=response_id, runner=runner, lease_expires_at=time.time() + lease_s, ended=False
    )
    await session.merge(row)


async def renew(session: AsyncSession, response_id: str, runner: str, lease_s: float) -> bool:
    """Whether ``runner`` still held the run (and now holds it ``lease_s`` longer)."""
    result = await session.execute(
        update(RunRow)
        .where(RunRow.response_id == response_id, RunRow.runner == runner, RunRow.ended.is_(False))
        .values(lease_expires_at=time.time() + lease_s)
    )
    return result.rowcount == 1


async def finish(session: AsyncSession, response_id: str, runner: str) -> None:
    await session.execute(
        update(RunRow)
        .where(RunRow.response_id == response_id, RunRow.runner == runner)
        .values(ended=True)
    )


def lapsed_query() -> Select:
    """The runs not ended whose lease has lapsed."""
    return select(RunRow.response_id).where(
        RunRow.ended.is_(False), RunRow.lease_expires_at < time.time()
    )


async def end(
    session: AsyncSession, response_id: str, ending: RunEnding, only_if_lapsed: bool
) -> bool:
    """End the run of ``response_id`` with ``ending`` (its final response and closing events)
    if this session takes it; whether it did."""
    row = await session.get(ResponseRow, response_id)
    if row is None:
        return False
    if not await _take(session, response_id, only_if_lapsed):
        return False
    response = json.loads(row.response_json)
    if response.get("status") not in ("queued", "in_progress"):
        return False  # its runner finished it after all; the run is marked ended
    done_items, last = await persisted_ending_inputs(session, response_id)
    final, events = ending(response, done_items, last)
    row.response_json = json.dumps(final)
    session.add_all(
        EventRow(response_id=response_id, sequence_number=number, event_json=data)
        for number, data in events
    )
    output = [item for item in final.get("output") or [] if isinstance(item, dict)]
    session.add_all(item_rows(output, row.owner, response_id=response_id))
    return True


async def _take(session: AsyncSession, response_id: str, only_if_lapsed: bool) -> bool:
    """The compare-and-set: mark the run ended if it is not, and (``only_if_lapsed``) its
    lease lapsed. PostgreSQL locks the row for the update, and a second taker re-reads it
    once the first commits, finding it ended; SQLite's writers take turns."""
    condition = [RunRow.response_id == response_id, RunRow.ended.is_(False)]
    if only_if_lapsed:
        condition.append(RunRow.lease_expires_at < time.time())
    result = await session.execute(update(RunRow).where(*condition).values(ended=True))
    if result.rowcount == 1:
        return True
    if await session.get(RunRow, response_id) is not None:
        return False  # held by a live runner, or ended already
    # No run recorded: a background response from before leases. Recording it ended is
    # the compare-and-set here (a second recorder hits the primary key).
    session.add(RunRow(response_id=response_id, runner="", lease_expires_at=0, ended=True))
    await session.flush()
    return True
