"""The rules on what is stored: a response, conversation or item another key owns, or none
has, is not found (404, as if it did not exist); only a background response streams again or
is cancelled, and only while it runs; a list's ``after`` cursor names an item of the list; a
model is one this server serves."""

from __future__ import annotations

from typing import Any

from serve_app.config import AppArgs
from serve_app.protocol.errors import InvalidRequest, NotFound, model_not_found
from serve_app.store.base import StoredConversation, StoredResponse


def check_model(args: AppArgs, model: str) -> None:
    """``GET /v1/models/{model}``: a name or alias this server serves."""
    if model not in args.served_names():
        raise model_not_found(model)


def response_not_found(response_id: str) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.", param="response_id")


def owned_response(
    response_id: str, found: StoredResponse | None, owner: str | None
) -> StoredResponse:
    """The response the store ``found``, if it is ``owner``'s (another key's is not found)."""
    if found is None or found.owner != owner:
        raise response_not_found(response_id)
    return found


def check_streamable(response: dict[str, Any]) -> None:
    """``GET /v1/responses/{id}?stream=true``: only a background response streams again."""
    if not response.get("background"):
        raise InvalidRequest(
            "Only background responses can be streamed after they were created.",
            param="stream",
        )


def check_cancellable(response: dict[str, Any]) -> None:
    """``POST /v1/responses/{id}/cancel``: a background response still running."""
    if not response.get("background"):
        raise InvalidRequest("Only background responses can be cancelled.", param="response_id")
    if response.get("status") not in ("queued", "in_progress"):
        raise InvalidRequest(
            f"Cannot cancel a response with status '{response.get('status')}'.",
            param="response_id",
        )


def owned_conversation(
    conversation_id: str, found: StoredConversation | None, owner: str | None
) -> StoredConversation:
    """The conversation the store ``found``, if it is ``owner``'s (another key's is not
    found)."""
    if found is None or found.owner != owner:
        raise NotFound(
            f"Conversation with id '{conversation_id}' not found.", param="conversation_id"
        )
    return found


def found_item(item_id: str, found: dict[str, Any] | None) -> dict[str, Any]:
    """An item of a conversation, by its id."""
    if found is None:
        raise item_not_found(item_id)
    return found


def item_not_found(item_id: str) -> NotFound:
    return NotFound(f"Item with id '{item_id}' not found.", param="item_id")


def check_after(after: str | None, found: bool) -> None:
    """A list's ``after`` cursor names an item of the list (``found``)."""
    if after is not None and not found:
        raise InvalidRequest(f"No item with id '{after}' in this list.", param="after")
