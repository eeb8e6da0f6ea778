"""Item references: ``{"type": "item_reference", "id": ...}``, or an item sent back with only
its id, stands for a stored item of the same owner, which replaces it before rendering.

The Vercel AI SDK sends earlier reasoning, messages and tool calls back this way whenever its
responses are stored (its default), on every tool step and chat turn. An id names an input or
output item of any stored response, or a conversation item (``ResponseStore.find_items``); a
resolved item renders exactly as if the client had sent it whole. Another owner's item is not
found, as if it did not exist.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError

from serve_app.protocol.requests import InputItem, ItemReference
from serve_app.serving.turn.persistence import stored_item
from serve_app.store.base import ResponseStore

_INPUT_ITEM = TypeAdapter(InputItem)


async def find_referenced(
    store: ResponseStore, owner: str | None, items: Iterable[InputItem]
) -> dict[str, InputItem | None]:
    """The stored items of ``owner``'s that the references among ``items`` name, by id (one
    store lookup for all): None for one stored yet not an item a request may send; an id that
    names nothing is absent. Loading only: serve_app.serving.admission.responses decides what is a
    400."""
    ids = {item.id for item in items if isinstance(item, ItemReference)}
    if not ids:
        return {}
    return {
        item_id: _as_input(stored)
        for item_id, stored in (await store.find_items(ids, owner)).items()
    }


def _as_input(stored: dict) -> InputItem | None:
    try:
        return _INPUT_ITEM.validate_python(stored)
    except ValidationError:
        return None


def replace_references(
    items: Sequence[InputItem], found: Mapping[str, InputItem | None]
) -> list[InputItem]:
    """``items`` with every reference replaced by the item it names (checked to exist first)."""
    return [
        found.get(item.id) or item if isinstance(item, ItemReference) else item for item in items
    ]


def as_stored_input(stored: dict[str, Any]) -> dict[str, Any] | None:
    """A stored item as the input of a response that referenced it stores it: resolved
    (`find_referenced`), then stored (`stored_item`). The store's ``as_input`` hook: an input
    item equal to this is stored by reference to that item (serve_app/store/references.py)."""
    item = _as_input(stored)
    return None if item is None else stored_item(item)
