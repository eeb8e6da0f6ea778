"""The store's part for the tools the server runs (issue 46), on SQLAlchemy as the rest of
`SqlResponseStore` (which mixes it in, and whose transactions it runs in): the approval
requests it issued (issued_items.py) and the calls that must run once (tool_claims.py)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from serve_app.store import issued_items, tool_claims
from serve_app.store.base import IssuedItem, ToolClaim


class ToolLedger:
    """`ResponseStore`'s tool methods, for a store with `_transact` (a retried write
    transaction) and `_session` (a read)."""

    _transact: Callable[[Callable[[AsyncSession], Awaitable[Any]]], Awaitable[Any]]
    _session: Callable[[], AsyncSession]

    async def issue_items(self, owner: str | None, items: Sequence[IssuedItem]) -> None:
        if items:
            await self._transact(lambda session: issued_items.issue(session, owner, items))

    async def issued_digests(self, owner: str | None, item_ids: Collection[str]) -> dict[str, str]:
        async with self._session() as session:
            return await issued_items.digests(session, owner, item_ids)

    async def claim_tool_call(self, owner: str | None, claim_id: str, claimant: str) -> ToolClaim:
        now = time.time()
        return await self._transact(
            lambda session: tool_claims.claim(session, owner, claim_id, claimant, now)
        )

    async def settle_tool_call(
        self, owner: str | None, claim_id: str, claimant: str, result: str
    ) -> bool:
        return await self._transact(
            lambda session: tool_claims.settle(session, owner, claim_id, claimant, result)
        )

    async def tool_claim(self, owner: str | None, claim_id: str) -> ToolClaim | None:
        async with self._session() as session:
            return await tool_claims.read(session, owner, claim_id)
