"""The items a request continues, loaded from the store (loading only: the door decides what
is a 404), and the items a request continuing a turn starts from."""

from __future__ import annotations

from pydantic import TypeAdapter

from serve_app.protocol.requests import InputItem
from serve_app.protocol.responses import dump_response
from serve_app.serving.turn.state import Ask, Turn
from serve_app.store.base import ResponseStore

INPUT_ITEMS = TypeAdapter(list[InputItem])


async def load(store: ResponseStore, ask: Ask) -> list[InputItem] | None:
    """The items the ask's request continues as stored, references unresolved; None when the
    conversation or previous response is not the caller's."""
    request = ask.request
    if request.conversation_id is not None:
        return await _conversation(store, request.conversation_id, ask.owner)
    if ask.recent is not None and request.previous_response_id in ask.recent:
        return ask.recent[request.previous_response_id]
    return await _chain(store, request.previous_response_id, ask.owner)


async def _conversation(
    store: ResponseStore, conversation_id: str, owner: str | None
) -> list[InputItem] | None:
    conversation = await store.get_conversation(conversation_id)
    if conversation is None or conversation.owner != owner:
        return None
    return INPUT_ITEMS.validate_python(await store.conversation_items(conversation_id))


async def _chain(
    store: ResponseStore, previous_response_id: str | None, owner: str | None
) -> list[InputItem] | None:
    """The stored chain a request continues: each turn's input, then its output."""
    if previous_response_id is None:
        return []
    chain = await store.chain(previous_response_id)
    # Another key's responses are not found, as if they did not exist.
    if chain is None or any(stored.owner != owner for stored in chain):
        return None
    items = [item for stored in chain for item in [*stored.input_items, *stored.output_items]]
    return INPUT_ITEMS.validate_python(items)


def continuation(turn: Turn) -> list[InputItem]:
    """The items a request continuing this turn's response starts from."""
    output = INPUT_ITEMS.validate_python(dump_response(turn.response)["output"])
    return [*turn.history, *turn.request.input_items, *output]
