"""Item references: ``{"type": "item_reference", "id": ...}``, or an item sent back with only
its id, stands for a stored item of the same owner, which replaces it before rendering.

The Vercel AI SDK sends earlier reasoning, messages and tool calls back this way whenever its
responses are stored (its default), on every tool step and chat turn. An id names an input or
output item of any stored response, or a conversation item (``ResponseStore.find_items``); a
resolved item renders exactly as if the client had sent it whole. Another owner's item is not
found, as if it did not exist.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pydantic import TypeAdapter, ValidationError

from serve_app.protocol.errors import InvalidRequest
from serve_app.protocol.requests import InputItem, ItemReference
from serve_app.store.base import ResponseStore

_INPUT_ITEM = TypeAdapter(InputItem)


async def resolve_references(
    store: ResponseStore,
    owner: str | None,
    history: list[InputItem],
    inputs: list[InputItem],
    *,
    history_param: str,
) -> tuple[list[InputItem], list[InputItem]]:
    """``history`` and ``inputs`` with every reference replaced by the item it names (one
    store lookup for all). A reference that names nothing of ``owner``'s is a 400
    ``item_not_found`` naming ``input[i].id``, or ``history_param`` for one in the history (a
    conversation's items may hold references)."""
    ids = {item.id for item in [*history, *inputs] if isinstance(item, ItemReference)}
    if not ids:
        return history, inputs
    found = await store.find_items(ids, owner)
    return (
        _replace(history, found, lambda _: history_param),
        _replace(inputs, found, lambda index: f"input[{index}].id"),
    )


def _replace(
    items: Sequence[InputItem], found: dict[str, dict], param: Callable[[int], str]
) -> list[InputItem]:
    resolved: list[InputItem] = []
    for index, item in enumerate(items):
        if not isinstance(item, ItemReference):
            resolved.append(item)
            continue
        stored = found.get(item.id)
        if stored is None:
            raise InvalidRequest(
                f"Item with id '{item.id}' not found.", param=param(index), code="item_not_found"
            )
        try:
            resolved.append(_INPUT_ITEM.validate_python(stored))
        except ValidationError as error:  # stored, yet not an item a request may send
            raise InvalidRequest(
                f"Item with id '{item.id}' cannot be used as input.",
                param=param(index),
                code="invalid_value",
            ) from error
    return resolved
