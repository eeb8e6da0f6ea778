"""What a turn leaves in the store: its response (``store: true``) and its items at the end of
its conversation, in one transaction, before the client is told the turn ended. A write the
client waits on that fails is `NotStored`, never answered as if it were stored."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from serve_app.engines.base import SERVER_ERROR
from serve_app.protocol.errors import ServerError
from serve_app.protocol.requests import InputItem
from serve_app.protocol.responses import ITEM_ID_PREFIXES, dump_response, new_item_id
from serve_app.serving.tools import mcp_trust
from serve_app.serving.turn.state import Turn
from serve_app.store.base import ResponseStore, StoredResponse

logger = logging.getLogger(__name__)

NOT_STORED_MESSAGE = "The response could not be stored. Please try again."


class NotStored(ServerError):
    """A write the client asked for (``store: true``, a conversation) did not commit, even
    after the store's retries: the client is told (a 500 ``server_error``, or
    ``response.failed`` on a stream), never answered as if it were stored."""

    def __init__(self, message: str = NOT_STORED_MESSAGE) -> None:
        super().__init__(message, code=SERVER_ERROR)


@contextlib.contextmanager
def stored_or_fail(what: str, message: str = NOT_STORED_MESSAGE) -> Iterator[None]:
    """Around a store write a client waits on: a failure is logged and becomes `NotStored`."""
    try:
        yield
    except NotStored:
        raise
    except Exception as error:
        logger.exception("%s could not be stored", what)
        raise NotStored(message) from error


def stored_item(item: InputItem) -> dict[str, Any]:
    """An input item as stored: the client's fields, and an id (minted if it sent none)."""
    data = item.model_dump(mode="json", exclude_none=True, by_alias=True)
    data.setdefault("id", new_item_id(ITEM_ID_PREFIXES.get(data["type"], "item")))
    if data["type"] == "message" and isinstance(data["content"], str):
        # As OpenAI lists them: string content becomes one text part.
        part_type = "output_text" if data["role"] == "assistant" else "input_text"
        data["content"] = [{"type": part_type, "text": data["content"]}]
    return data


class Persistence:
    def __init__(self, store: ResponseStore) -> None:
        self._store = store

    async def save(self, turn: Turn) -> None:
        """Store the turn's response as it is now (final, or a background one in progress);
        `NotStored` if it could not be."""
        with stored_or_fail(f"response {turn.response.id}"):
            await self._store.put(self._stored(turn))

    async def keep(self, turn: Turn) -> None:
        """What the ended turn leaves, in one transaction: its response (``store: true``) and
        its input and output at the end of its conversation. `NotStored` if that failed:
        then nothing of it is stored (no response a later turn could chain to, no half
        conversation)."""
        request = turn.request
        output = dump_response(turn.response)["output"]
        # The approval requests it issued: recorded whether or not the response is stored
        # (serve_app/serving/tools/mcp_trust.py), or no approval of them could count.
        issued = mcp_trust.issued(request, output)
        if not request.store and request.conversation_id is None:
            if issued:
                with stored_or_fail(f"response {turn.response.id}'s approval requests"):
                    await self._store.issue_items(turn.owner, issued)
            return
        stored = self._stored(turn) if request.store else None
        items: list[dict[str, Any]] = []
        if request.conversation_id is not None:
            # The same input items (and minted ids) as the stored response's.
            items = stored.input_items if stored else _input_items(turn)
            items = [*items, *output]
        with stored_or_fail(f"response {turn.response.id}"):
            await self._store.save_turn(
                stored, request.conversation_id, items, issued, owner=turn.owner
            )

    @staticmethod
    def _stored(turn: Turn) -> StoredResponse:
        return StoredResponse(
            id=turn.response.id,
            previous_response_id=turn.request.previous_response_id,
            response=dump_response(turn.response),
            input_items=_input_items(turn),
            owner=turn.owner,
            prompt_fingerprint=turn.prompt.to_json() if turn.prompt else None,
        )


def _input_items(turn: Turn) -> list[dict[str, Any]]:
    return [stored_item(item) for item in turn.request.input_items]
