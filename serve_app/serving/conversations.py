"""``/v1/conversations``: durable item lists that responses read (``conversation``) and extend."""

from __future__ import annotations

import time

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from serve_app.protocol.request_base import STRICT_TYPES
from serve_app.protocol.requests import InputItem
from serve_app.protocol.responses import new_conversation_id
from serve_app.serving.admission import stored
from serve_app.serving.admission.responses import check_text
from serve_app.serving.http.auth import Owner
from serve_app.serving.http.pagination import Paging, listing
from serve_app.serving.turn.persistence import stored_item, stored_or_fail
from serve_app.store.base import ResponseStore, StoredConversation

MAX_ITEMS_PER_CALL = 20  # OpenAI's limit for items added in one call
NOT_STORED = "The conversation could not be stored. Please try again."


class ConversationCreate(BaseModel):
    model_config = ConfigDict(**STRICT_TYPES, extra="ignore")
    items: list[InputItem] = Field(default_factory=list, max_length=MAX_ITEMS_PER_CALL)
    metadata: dict[str, str] | None = None


class ConversationUpdate(BaseModel):
    model_config = ConfigDict(**STRICT_TYPES, extra="ignore")
    metadata: dict[str, str]


class ItemsCreate(BaseModel):
    model_config = ConfigDict(**STRICT_TYPES, extra="ignore")
    items: list[InputItem] = Field(min_length=1, max_length=MAX_ITEMS_PER_CALL)


def conversations_router(store: ResponseStore) -> APIRouter:
    router = APIRouter(prefix="/v1/conversations")

    async def existing(conversation_id: str, owner: str | None) -> StoredConversation:
        conversation = await store.get_conversation(conversation_id)
        return stored.owned_conversation(conversation_id, conversation, owner)

    @router.post("")
    async def create_conversation(body: ConversationCreate, owner: Owner) -> dict:
        check_text(body.items, "items")  # rendered by every response that continues it
        conversation = StoredConversation(
            id=new_conversation_id(),
            created_at=int(time.time()),
            metadata=body.metadata or {},
            owner=owner,
        )
        # With its first items, in one transaction: a failure leaves no empty conversation.
        with stored_or_fail(f"conversation {conversation.id}", NOT_STORED):
            await store.put_conversation(conversation, [stored_item(item) for item in body.items])
        return conversation.as_json()

    @router.get("/{conversation_id}")
    async def retrieve_conversation(conversation_id: str, owner: Owner) -> dict:
        return (await existing(conversation_id, owner)).as_json()

    @router.post("/{conversation_id}")
    async def update_conversation(
        conversation_id: str, body: ConversationUpdate, owner: Owner
    ) -> dict:
        conversation = await existing(conversation_id, owner)
        updated = StoredConversation(
            conversation.id, conversation.created_at, body.metadata, owner=owner
        )
        with stored_or_fail(f"conversation {conversation_id}", NOT_STORED):
            await store.put_conversation(updated)
        return updated.as_json()

    @router.delete("/{conversation_id}")
    async def delete_conversation(conversation_id: str, owner: Owner) -> dict:
        await existing(conversation_id, owner)
        await store.delete_conversation(conversation_id)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    @router.get("/{conversation_id}/items")
    async def list_items(conversation_id: str, owner: Owner, asked: Paging) -> dict:
        await existing(conversation_id, owner)
        found = await store.conversation_page(
            conversation_id, after=asked.after, limit=asked.limit, order=asked.order
        )
        stored.check_after(asked.after, found is not None)
        return listing(found)

    @router.post("/{conversation_id}/items")
    async def add_items(conversation_id: str, body: ItemsCreate, owner: Owner) -> dict:
        await existing(conversation_id, owner)
        check_text(body.items, "items")
        added = [stored_item(item) for item in body.items]
        with stored_or_fail(f"items of conversation {conversation_id}", NOT_STORED):
            await store.append_items(conversation_id, added)
        return {
            "object": "list",
            "data": added,
            "first_id": added[0]["id"],
            "last_id": added[-1]["id"],
            "has_more": False,
        }

    @router.get("/{conversation_id}/items/{item_id}")
    async def retrieve_item(conversation_id: str, item_id: str, owner: Owner) -> dict:
        await existing(conversation_id, owner)
        items = await store.conversation_items(conversation_id)
        item = next((item for item in items if item.get("id") == item_id), None)
        return stored.found_item(item_id, item)

    @router.delete("/{conversation_id}/items/{item_id}")
    async def delete_item(conversation_id: str, item_id: str, owner: Owner) -> dict:
        conversation = await existing(conversation_id, owner)
        if not await store.delete_item(conversation_id, item_id):
            raise stored.item_not_found(item_id)
        return conversation.as_json()

    return router
