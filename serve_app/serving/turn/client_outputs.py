"""A response that waits for the outputs of the client's tools (the WebSocket beta's
``response.inject``), and goes on in place with them.

Without it a response whose model calls a tool the client runs ends there (``completed``, the
call in its output) and the client answers in a new request. With it (`Turn.client_outputs`,
set by serve_app/serving/inject.py on a connection with the beta header) the completion that
made the calls ends, and the response waits, at most ``wait_s``, for the client to put the
outputs in. Offers (one per ``response.inject``) queue here as they arrive and are decided only
at the wait, in arrival order, on the turn's own task: every decision sees the calls the
response owes then, none races the response's end. Committed outputs become the response's
own items; once every call has its output the model's next completion continues the response
(the same id, stream and engine session: serving/tools/loop.py `ToolLoop.continue_with`). When
the wait ends first (its bound, or the client continuing the response with a
``response.create`` instead), the response ends as it would have without the beta, holding the
outputs committed so far. Offers still queued when the response ends are refused by the owner
(`ClientOutputs.close`): the response already completed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from openai.types.responses import ResponseOutputItem

from serve_app.protocol.client_tools import OWED_CALL_TYPES
from serve_app.protocol.requests import ToolOutputItem

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Committed:
    """One offer's outputs, committed: as the model reads them (``inputs``) and as the
    response's items (``items``)."""

    inputs: list[ToolOutputItem]
    items: list[ResponseOutputItem]


class Judge(Protocol):
    """Who decides an offer (the WebSocket layer: it knows the client's message and answers it)."""

    def decide(self, offer: Any, owed: Mapping[str, str]) -> Committed | None:
        """Commit ``offer`` against the calls the response owes (call id -> call type), its
        acceptance sent; or refuse it, its refusal sent (None)."""
        ...

    def refuse_ended(self, offer: Any) -> None:
        """Refuse ``offer``: the response ended before it was decided."""
        ...


def owed_calls(
    items: Sequence[ResponseOutputItem], committed: Sequence[Committed] = ()
) -> dict[str, str]:
    """The calls of tools the client runs that have no output yet (among ``items``, the
    response's own, or ``committed``): call id -> call type, in the model's order."""
    owed: dict[str, str] = {}
    for item in items:
        if item.type in OWED_CALL_TYPES:
            owed[item.call_id] = item.type  # type: ignore[union-attr]
    answered = {getattr(item, "call_id", None) for item in items if item.type.endswith("_output")}
    answered |= {output.call_id for batch in committed for output in batch.inputs}
    return {call_id: kind for call_id, kind in owed.items() if call_id not in answered}


class ClientOutputs:
    """One response's box of offers, and its wait for them."""

    def __init__(self, wait_s: float, judge: Judge) -> None:
        self._wait_s = wait_s
        self._judge = judge
        self._offers: deque[Any] = deque()
        self._arrived = asyncio.Event()
        self._released = False
        self._closed = False

    def offer(self, offer: Any) -> None:
        """Queue ``offer`` (decided at the response's next wait, or refused at its end)."""
        if self._closed:
            self._judge.refuse_ended(offer)
            return
        self._offers.append(offer)
        self._arrived.set()

    def release(self) -> None:
        """End the current wait now (the client continues the response another way)."""
        self._released = True
        self._arrived.set()

    def close(self) -> None:
        """The response ended: offers never decided are refused, later ones too."""
        self._closed = True
        while self._offers:
            self._judge.refuse_ended(self._offers.popleft())

    async def collect(self, items: Sequence[ResponseOutputItem]) -> list[Committed]:
        """Wait, at most ``wait_s``, until every call the response owes (among ``items``)
        has its output; the outputs committed meanwhile, in commit order."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait_s
        committed: list[Committed] = []
        while True:
            self._decide_queued(items, committed)
            if not owed_calls(items, committed) or self._released:
                return committed
            left = deadline - loop.time()
            if left <= 0:
                return committed
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                # Offers that came as the bound passed are still decided (they arrived first).
                self._decide_queued(items, committed)
                return committed

    def _decide_queued(
        self, items: Sequence[ResponseOutputItem], committed: list[Committed]
    ) -> None:
        while self._offers:
            offer = self._offers.popleft()
            decided = self._judge.decide(offer, owed_calls(items, committed))
            if decided is not None:
                committed.append(decided)
