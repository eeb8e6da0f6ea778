"""Calls that must run once (serve_app/store/tool_claims.py): of claimants racing for one call,
on separate store instances (replicas) and after random pauses, exactly one wins, every one
reads the same claim, and the winner's result is what all of them read once it is settled; on
SQLite and on PostgreSQL. And the items the server issued (serve_app/store/issued_items.py),
kept per owner by their digests."""

from __future__ import annotations

import asyncio
import random
import uuid

from serve_app.store.base import IssuedItem
from serve_app.store.sql import SqlResponseStore
from tests.unit.store.test_sql import postgres_url, store_url  # noqa: F401 - fixtures

STORES = 6  # store instances, each its own engine and connections: replicas on one database
ROUNDS = 10  # calls raced for, each with its own random pauses


async def test_a_claim_is_taken_once_settled_once_and_kept_per_owner(
    store_url: str,  # noqa: F811
) -> None:
    store = SqlResponseStore(store_url)
    await store.start()
    call = f"mcpr_{uuid.uuid4().hex}"
    try:
        assert await store.tool_claim("alice", call) is None
        first = await store.claim_tool_call("alice", call, "resp_1")
        assert first.claimant == "resp_1" and not first.settled
        again = await store.claim_tool_call("alice", call, "resp_2")
        assert again.claimant == "resp_1" and again.claimed_at == first.claimed_at
        assert not await store.settle_tool_call("alice", call, "resp_2", '"theirs"')
        assert await store.settle_tool_call("alice", call, "resp_1", '"ran"')
        assert not await store.settle_tool_call("alice", call, "resp_1", '"again"')
        assert (await store.tool_claim("alice", call)).result == '"ran"'
        # Another owner's (and an open API's) claim of the same id is a claim of its own.
        assert (await store.claim_tool_call("bob", call, "resp_3")).claimant == "resp_3"
        assert (await store.claim_tool_call(None, call, "resp_4")).claimant == "resp_4"
    finally:
        await store.close()


async def test_claimants_at_once_on_many_replicas_one_wins_and_all_read_its_result(
    store_url: str,  # noqa: F811
) -> None:
    stores = [SqlResponseStore(store_url) for _ in range(STORES)]
    await asyncio.gather(*(store.start() for store in stores))
    rng = random.Random(46)
    try:
        for _ in range(ROUNDS):
            call = f"mcpr_{uuid.uuid4().hex}"
            pauses = [rng.uniform(0, 0.02) for _ in stores]

            async def take(store: SqlResponseStore, index: int, pause: float, call: str = call):
                await asyncio.sleep(pause)
                claim = await store.claim_tool_call("owner", call, f"resp_{index}")
                if claim.claimant == f"resp_{index}":  # the winner runs it and settles
                    await asyncio.sleep(rng.uniform(0, 0.01))
                    assert await store.settle_tool_call("owner", call, claim.claimant, '"ok"')
                return claim.claimant

            claimants = await asyncio.gather(
                *(
                    take(store, i, pause)
                    for i, (store, pause) in enumerate(zip(stores, pauses, strict=True))
                )
            )
            assert len(set(claimants)) == 1, claimants
            for store in stores:
                settled = await store.tool_claim("owner", call)
                assert settled.claimant == claimants[0] and settled.result == '"ok"'
    finally:
        await asyncio.gather(*(store.close() for store in stores))


async def test_issued_items_are_kept_per_owner_with_their_digests(
    store_url: str,  # noqa: F811
) -> None:
    """What the server issued (serve_app/store/issued_items.py): alone (``store: false``) or
    with the response that issued them, per owner, never replaced."""
    store = SqlResponseStore(store_url)
    await store.start()
    listing, asked = f"mcpl_{uuid.uuid4().hex}", f"mcpr_{uuid.uuid4().hex}"
    try:
        await store.issue_items("alice", [IssuedItem(listing, "d1")])
        await store.save_turn(None, None, [], [IssuedItem(asked, "d2")], owner="alice")
        await store.issue_items("alice", [IssuedItem(listing, "changed")])  # kept as it was
        found = await store.issued_digests("alice", [listing, asked, "mcpr_unknown"])
        assert found == {listing: "d1", asked: "d2"}
        assert await store.issued_digests("bob", [listing, asked]) == {}
        assert await store.issued_digests(None, [listing]) == {}
    finally:
        await store.close()
