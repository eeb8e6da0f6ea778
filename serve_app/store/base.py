"""The response store's interface: small, so SQLite and PostgreSQL (or anything) fit behind it."""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class StoredResponse:
    id: str
    previous_response_id: str | None
    # The Response as clients see it (wire JSON), including its output items.
    response: dict[str, Any]
    # The request's input items as given, each with an id (minted where the client sent none).
    input_items: list[dict[str, Any]]
    # A digest of the API key that created it (None when the API is open).
    owner: str | None = None
    # What prompt-cache diagnostics keep of its rendered prompt (`PromptFingerprint`'s JSON,
    # serve_app/protocol/prompt_cache_diagnostics.py); None: not kept. Never the prompt's text.
    prompt_fingerprint: str | None = None

    @property
    def output_items(self) -> list[dict[str, Any]]:
        return list(self.response.get("output") or [])


@dataclass(frozen=True)
class PromptRecord:
    """A stored response's prompt fingerprint, as `ResponseStore.prompt_record` finds it:
    None when the response was kept without one (stored before diagnostics existed)."""

    fingerprint: str | None


@dataclass(frozen=True)
class StoredConversation:
    id: str
    created_at: int
    metadata: dict[str, str]
    owner: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "conversation",
            "created_at": self.created_at,
            "metadata": self.metadata,
        }


@dataclass(frozen=True)
class BackgroundRun:
    """The lease of a background response: which replica runs it, until when it holds it
    (wall clock, epoch seconds), and whether the run is over (ended by its runner, or ended
    for it by another replica once the lease lapsed)."""

    response_id: str
    runner: str
    lease_expires_at: float
    ended: bool


@dataclass(frozen=True)
class IssuedItem:
    """An item the server issued (an MCP approval request) by its id, with the digest of what
    it said: a later request's copy counts only if it matches."""

    item_id: str
    digest: str


@dataclass(frozen=True)
class ToolClaim:
    """A call that must run once (an approved MCP call): which response's turn runs it, since
    when (epoch seconds), and its result once it ran (JSON, as the claimant recorded it)."""

    claimant: str
    claimed_at: float
    result: str | None = None

    @property
    def settled(self) -> bool:
        return self.result is not None


# Builds the end of a run its runner left: from the stored response (wire JSON), the JSON of
# its persisted ``response.output_item.done`` events in order, and the last persisted sequence
# number, the final response and the events that close the stream.
RunEnding = Callable[[dict[str, Any], list[str], int], tuple[dict[str, Any], list[tuple[int, str]]]]


@dataclass(frozen=True)
class ItemPage:
    items: list[dict[str, Any]]
    has_more: bool


def cut_page(
    entries: Sequence[tuple[dict[str, Any], bool]], limit: int, complete: bool = True
) -> ItemPage | None:
    """One page of a list of items, from the items after the cursor in listing order.

    Each entry is (item, whether it is the first item with its id in listing order). Clients
    choose some ids and may repeat one, and ``after`` names only an id: it resolves to the
    first item with that id, so a page may end only on such an item (or at the end of the
    list), or the next page would start again behind it and paging would never end. The page
    ends at the last such item within ``limit``; if there is none, at the first one after
    (the only page longer than ``limit``: with a limit of 1 and an id repeated right after).
    Every item is then listed exactly once. None: ``entries`` stop before the page does and
    the list goes on (``complete`` false): fetch more and call again.
    """
    items: list[dict[str, Any]] = []
    end = 0
    for item, resolves_here in entries:
        if end and len(items) >= limit:
            return ItemPage(items[:end], has_more=True)
        items.append(item)
        if resolves_here and (len(items) <= limit or not end):
            end = len(items)
    if complete:
        return ItemPage(items, has_more=False)
    return None


class ResponseStore(abc.ABC):
    @abc.abstractmethod
    async def start(self) -> None:
        """Connect and create the schema if needed."""

    @abc.abstractmethod
    async def ping(self) -> None:
        """One cheap round trip to the store (readiness); raises when it cannot answer."""

    @abc.abstractmethod
    async def put(self, stored: StoredResponse) -> None:
        """Insert or replace a response (atomically: all of it or none). Returns once it is
        committed; raises if it could not be (after the store's own retries)."""

    async def save_turn(
        self,
        stored: StoredResponse | None,
        conversation_id: str | None,
        items: list[dict[str, Any]],
        issued: Sequence[IssuedItem] = (),
        owner: str | None = None,
    ) -> None:
        """What a turn leaves: its response (if stored), with ``conversation_id`` its items
        at the end of that conversation, and the items it ``issued`` to ``owner`` (MCP
        approval requests), in one transaction, so a failure leaves none. (This
        default writes them one after the other: override it.)"""
        if stored is not None:
            await self.put(stored)
        if conversation_id is not None:
            await self.append_items(conversation_id, items)
        if issued:
            await self.issue_items(owner, issued)

    @abc.abstractmethod
    async def issue_items(self, owner: str | None, items: Sequence[IssuedItem]) -> None:
        """Record ``items`` as issued to ``owner`` (an id recorded already is kept as is)."""

    @abc.abstractmethod
    async def issued_digests(self, owner: str | None, item_ids: Collection[str]) -> dict[str, str]:
        """The digests of those of ``item_ids`` issued to ``owner``, by id (others absent)."""

    @abc.abstractmethod
    async def get(self, response_id: str) -> StoredResponse | None: ...

    async def prompt_record(self, response_id: str, owner: str | None) -> PromptRecord | None:
        """The response's prompt fingerprint if it is ``owner``'s (None: no such response of
        theirs). This default reads the whole response: a store overrides it with a read of
        the fingerprint alone."""
        stored = await self.get(response_id)
        if stored is None or stored.owner != owner:
            return None
        return PromptRecord(stored.prompt_fingerprint)

    @abc.abstractmethod
    async def delete(self, response_id: str) -> bool:
        """Remove a response; True if it existed. Responses continuing it keep their own items."""

    @abc.abstractmethod
    async def find_items(self, item_ids: Collection[str], owner: str | None) -> dict[str, dict]:
        """Stored items by id, for item references: the input and output items of stored
        responses and the items of conversations, of ``owner`` only. Ids not found are absent;
        an id stored more than once (clients choose some ids) gives the latest such item."""

    async def chain(self, response_id: str) -> list[StoredResponse] | None:
        """The response and its ancestors, oldest first; None if ``response_id`` is unknown.

        A response continued twice is the parent of both branches (a fork): each branch's chain
        walks back through it, so both stay valid.
        """
        chain: list[StoredResponse] = []
        next_id: str | None = response_id
        while next_id is not None:
            stored = await self.get(next_id)
            if stored is None:
                if not chain:
                    return None
                break  # an ancestor was deleted: the chain starts after it
            chain.append(stored)
            next_id = stored.previous_response_id
        chain.reverse()
        return chain

    async def sweep_expired(self, batch: int) -> int:
        """Delete up to ``batch`` responses past the store's retention, with their items;
        how many (a store that keeps everything deletes none)."""
        return 0

    # --- background responses: their events, persisted as they happen ---------------------

    @abc.abstractmethod
    async def append_events(self, response_id: str, events: list[tuple[int, str]]) -> None:
        """Persist (sequence_number, event JSON) pairs of a background response."""

    @abc.abstractmethod
    async def events_after(self, response_id: str, after: int) -> list[tuple[int, str]]:
        """Persisted events with a sequence number above ``after``, in order."""

    @abc.abstractmethod
    async def request_cancel(self, response_id: str) -> None:
        """Flag a background response for cancellation (whichever replica runs it stops it)."""

    @abc.abstractmethod
    async def cancel_requested(self, response_id: str) -> bool: ...

    # --- background runs: a lease that the replica running one renews ---------------------

    @abc.abstractmethod
    async def claim_run(self, response_id: str, runner: str, lease_s: float) -> None:
        """Record that ``runner`` runs the response, holding it for ``lease_s`` from now."""

    @abc.abstractmethod
    async def renew_run(self, response_id: str, runner: str, lease_s: float) -> bool:
        """Extend the runner's lease to ``lease_s`` from now. False: the run is no longer
        the runner's to continue (ended, by another replica after a lapse, or deleted)."""

    @abc.abstractmethod
    async def finish_run(self, response_id: str, runner: str) -> None:
        """The runner ended its run itself (its final response and events are stored)."""

    @abc.abstractmethod
    async def get_run(self, response_id: str) -> BackgroundRun | None: ...

    @abc.abstractmethod
    async def lapsed_runs(self) -> list[str]:
        """Runs not ended whose lease has lapsed: their runner is gone."""

    @abc.abstractmethod
    async def end_run(
        self, response_id: str, ending: RunEnding, *, only_if_lapsed: bool = True
    ) -> bool:
        """End a run for its runner, in one transaction: a compare-and-set on the run (not
        ended, and with ``only_if_lapsed`` its lease lapsed), then, if the response is still
        ``queued`` or ``in_progress``, the final response and events ``ending`` builds. True
        only for the one caller that ended it. A background response with no run recorded
        (stored by an older version) counts as lapsed."""

    # --- conversations: a durable list of items that responses read and extend ------------

    @abc.abstractmethod
    async def put_conversation(
        self, conversation: StoredConversation, items: list[dict[str, Any]] | None = None
    ) -> None:
        """Create a conversation, or replace its metadata; with ``items``, add them at its
        end in the same transaction (a conversation created with its first items)."""

    @abc.abstractmethod
    async def get_conversation(self, conversation_id: str) -> StoredConversation | None: ...

    @abc.abstractmethod
    async def delete_conversation(self, conversation_id: str) -> bool: ...

    @abc.abstractmethod
    async def append_items(self, conversation_id: str, items: list[dict[str, Any]]) -> None:
        """Add items at the end of a conversation (one transaction)."""

    @abc.abstractmethod
    async def conversation_items(self, conversation_id: str) -> list[dict[str, Any]]:
        """The conversation's items, oldest first."""

    @abc.abstractmethod
    async def conversation_page(
        self,
        conversation_id: str,
        *,
        after: str | None,
        limit: int,
        order: Literal["asc", "desc"],
    ) -> ItemPage | None:
        """A page of the conversation's items in ``order``, after the item with id ``after``
        (the first such item in that order, see `cut_page`); None if there is no such item."""

    @abc.abstractmethod
    async def delete_item(self, conversation_id: str, item_id: str) -> bool:
        """Remove every item with that id from the conversation (ids may repeat)."""

    # --- calls that must run once: an approved MCP call, whichever replica is asked --------

    @abc.abstractmethod
    async def claim_tool_call(self, owner: str | None, claim_id: str, claimant: str) -> ToolClaim:
        """Take the call ``claim_id`` of ``owner`` for ``claimant`` unless it is taken
        (insert-if-absent: of claimants at once, one wins); the claim as it stands after. The
        call is ``claimant``'s to run only when the answer names it, unsettled."""

    @abc.abstractmethod
    async def settle_tool_call(
        self, owner: str | None, claim_id: str, claimant: str, result: str
    ) -> bool:
        """Record the result of ``claimant``'s run of the call; False if the claim was not its
        own or was settled already."""

    @abc.abstractmethod
    async def tool_claim(self, owner: str | None, claim_id: str) -> ToolClaim | None:
        """The claim of ``claim_id`` as it stands (None: nobody took it)."""

    # --- secrets the server makes for itself, shared by every replica ----------------------

    @abc.abstractmethod
    async def shared_secret(self, name: str, proposal: str | None) -> str | None:
        """The secret stored under ``name``. With ``proposal``, it is stored first unless a
        value is there already (insert-if-absent): of replicas proposing at once, one wins and
        every one gets its value. Without, only read (None: nothing stored). Never replaced."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
