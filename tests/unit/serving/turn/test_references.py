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


async def referencing_session(api) -> dict[str, object]:
    """A response, another referencing its output items, what each read of the second gives
    (its input items, a chain continuing it), then the same once the first is deleted."""
    client = sdk_client(api)
    first = await client.responses.create(model=MODEL, input="hello", reasoning={"effort": "low"})
    named = [reference(item.id) for item in first.output]
    second = await client.responses.create(
        model=MODEL, input=[*named, {"role": "user", "content": "more"}]
    )
    seen: dict[str, object] = {"second": second.id, "named": [item["id"] for item in named]}
    for moment in ("stored", "first deleted"):
        items = await client.responses.input_items.list(second.id, order="asc")
        count = await client.responses.input_tokens.count(
            model=MODEL, input="next", previous_response_id=second.id
        )
        again = await client.responses.create(
            model=MODEL, input=[named[-1], {"role": "user", "content": "again"}]
        )
        seen[moment] = {
            "input_items": [item.model_dump(exclude_none=True) for item in items.data],
            "chain_tokens": count.input_tokens,
            "reference_again": again.status,
        }
        if moment == "stored":
            await client.responses.delete(first.id)
    return seen


def comparable(items: list[dict]) -> list[dict]:
    """Items without what differs between two runs: ids, sealed reasoning."""
    return [
        {key: value for key, value in item.items() if key not in ("id", "encrypted_content")}
        for item in items
    ]


async def test_references_stored_by_reference_read_as_the_copies_did(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same session on the app as it is and on one that stores copies (the previous
    version's way): the same input items, chain and references, before and after the item's
    first holder is deleted; the first stores markers, not copies."""
    import json
    import sqlite3

    from serve_app.serving import ingress
    from tests.support import helpers

    async with helpers.in_process_api(tmp_path / "refs.db") as api:
        by_reference = await referencing_session(api)

    def stored(database: str, response_id: object) -> list[bool]:
        raw = sqlite3.connect(tmp_path / database).execute(
            "SELECT input_items_json FROM responses WHERE id = ?", (response_id,)
        )
        return [item.get("stored_row") is not None for item in json.loads(raw.fetchone()[0])]

    assert stored("refs.db", by_reference["second"]) == [True, True, False]
    monkeypatch.setattr(ingress, "as_stored_input", lambda item: None)  # nothing matches
    async with helpers.in_process_api(tmp_path / "copies.db") as api:
        copies = await referencing_session(api)
    assert stored("copies.db", copies["second"]) == [False, False, False]
    for moment in ("stored", "first deleted"):
        got, expected = by_reference[moment], copies[moment]
        assert comparable(got["input_items"]) == comparable(expected["input_items"])
        assert [item["id"] for item in got["input_items"]][:2] == by_reference["named"]
        assert got["chain_tokens"] == expected["chain_tokens"]
        assert got["reference_again"] == expected["reference_again"] == "completed"
