"""Item references without Ray: {"type": "item_reference", "id": ...} (or an item with only
its id) parses as a reference, is resolved (serve_app.serving.turn.references) before rendering, and
only to an item of the same owner (in-process, two API keys). Against the running app, with the
scripted turns REF-*: tests/app/test_item_references.py.
"""

from __future__ import annotations

import openai
import pytest

from serve_app.protocol.errors import InvalidRequest
from serve_app.protocol.requests import ItemReference, MessageItem, ResponsesRequest
from serve_app.serving.admission import responses as validation
from tests.support import MODEL
from tests.support.helpers import sdk_client


def reference(item_id: str) -> dict[str, str]:
    return {"type": "item_reference", "id": item_id}


def test_a_reference_may_leave_out_its_type_or_send_it_null() -> None:
    items = [{"id": "a"}, {"id": "b", "type": None}, reference("c")]
    parsed = ResponsesRequest.model_validate({"model": MODEL, "input": items}).input_items
    assert [(type(item), item.type, item.id) for item in parsed] == [
        (ItemReference, "item_reference", "a"),
        (ItemReference, "item_reference", "b"),
        (ItemReference, "item_reference", "c"),
    ]


def test_a_reference_left_unresolved_is_refused_before_rendering() -> None:
    # The service resolves references before rendering; nothing renders a guess at one.
    request = ResponsesRequest.model_validate({"model": MODEL, "input": [reference("rs_1")]})
    history = [MessageItem(role="user", content="earlier")]
    with pytest.raises(InvalidRequest) as caught:
        validation.check_items(request, history)
    assert (caught.value.param, caught.value.code) == ("input[0].id", "item_not_found")


async def test_another_keys_items_are_not_found(two_keys_api) -> None:
    alice, bob = sdk_client(two_keys_api, "key-alice"), sdk_client(two_keys_api, "key-bob")
    created = await alice.responses.create(model=MODEL, input="hello")
    message = created.output[-1]
    conversation = await alice.conversations.create(items=[{"role": "user", "content": "note"}])
    (note,) = (await alice.conversations.items.list(conversation.id)).data
    for item_id in (message.id, note.id):
        with pytest.raises(openai.BadRequestError) as caught:
            await bob.responses.create(
                model=MODEL, input=[{"role": "user", "content": "x"}, reference(item_id)]
            )
        assert caught.value.body["param"] == "input[1].id"
        assert caught.value.body["code"] == "item_not_found"
        assert caught.value.body["message"] == f"Item with id '{item_id}' not found."
    answered = await alice.responses.create(
        model=MODEL,
        input=[reference(note.id), reference(message.id), {"role": "user", "content": "x"}],
    )
    assert answered.status == "completed"
