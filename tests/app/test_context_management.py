"""Server-side compaction (``context_management``, issue 30 part 1) through the openai SDK, over
HTTP (streamed and not) and the WebSocket mode, stateless and chained.

The scripted engine (tests/fixtures/engine_script.yaml) writes the summary when asked for one
("Context compaction:") and answers "Resuming from the summary: Paris is sunny." only when
the summary is the newest message: so that answer shows the turn generated from the compacted
context. The JavaScript clients: tests/clients/test_js_context_management.py; the unscripted
engine and a failing summary: tests/unit/serving/test_context_management.py.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from openai import BadRequestError, OpenAI

from tests.support import AUTH, MODEL, open_responses
from tests.support.helpers import wait_for
from tests.support.weather_history import HISTORY as WEATHER_HISTORY
from tests.support.weather_history import TOOLS
from tests.support.websocket import until_terminal

HISTORY: list[dict[str, Any]] = [
    *WEATHER_HISTORY,
    {"role": "user", "content": "CM-ASK: and what should I wear?"},
]
NEXT = {"role": "user", "content": "CM-NEXT: and tomorrow?"}
RESUMED = "Resuming from the summary: Paris is sunny."
THRESHOLD = 1000  # HISTORY renders to about 1,300 tokens: over it
COMPACT = [{"type": "compaction", "compact_threshold": THRESHOLD}]
CM0 = "context_management[0]"


def as_input(items: list[Any]) -> list[dict[str, Any]]:
    """Output items as a client appends them to its next input."""
    return [item.model_dump(exclude_none=True, warnings=False) for item in items]


def count(client: OpenAI, **request: Any) -> int:
    return client.responses.input_tokens.count(model=MODEL, tools=TOOLS, **request).input_tokens


def test_a_prompt_over_the_threshold_is_compacted_first_and_continued_stateless(
    client: OpenAI,
) -> None:
    assert count(client, input=HISTORY) > THRESHOLD
    first = client.responses.create(
        model=MODEL, input=HISTORY, tools=TOOLS, store=False, context_management=COMPACT
    )
    assert [item.type for item in first.output] == ["compaction", "message"]
    assert first.output_text == RESUMED  # generated from the summary alone
    compacted = first.output[0]
    assert compacted.id.startswith("cmp_") and compacted.encrypted_content
    assert "COMPACTED-SUMMARY-7" not in compacted.encrypted_content  # sealed
    open_responses.check_output_item(compacted.model_dump(exclude_unset=True))

    # Stateless: the client appends the output; what came before the compaction item renders
    # as nothing (the client may drop it), so the next prompt is small and not compacted again.
    full = [*HISTORY, *as_input(first.output), NEXT]
    dropped = [*as_input(first.output), NEXT]
    assert count(client, input=full) == count(client, input=dropped) < THRESHOLD
    second = client.responses.create(
        model=MODEL, input=full, tools=TOOLS, store=False, context_management=COMPACT
    )
    assert second.status == "completed"
    assert "compaction" not in [item.type for item in second.output]
    assert second.usage.input_tokens < THRESHOLD


def test_a_prompt_under_the_threshold_is_answered_as_without_it(client: OpenAI) -> None:
    plain = client.responses.create(model=MODEL, input=HISTORY, tools=TOOLS, store=False)
    high = [{"type": "compaction", "compact_threshold": 100_000}]
    managed = client.responses.create(
        model=MODEL, input=HISTORY, tools=TOOLS, store=False, context_management=high
    )
    assert [item.type for item in managed.output] == [item.type for item in plain.output]
    assert "compaction" not in [item.type for item in managed.output]
    assert managed.usage.input_tokens == plain.usage.input_tokens
    assert managed.output_text == plain.output_text


def test_chained_by_previous_response_id_with_only_the_new_input(client: OpenAI) -> None:
    first = client.responses.create(
        model=MODEL, input=HISTORY, tools=TOOLS, store=True, context_management=COMPACT
    )
    assert [item.type for item in first.output] == ["compaction", "message"]
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[NEXT],
        tools=TOOLS,
        context_management=COMPACT,
    )
    assert second.status == "completed"
    assert "compaction" not in [item.type for item in second.output]
    # The stored chain renders from its compaction item on.
    assert second.usage.input_tokens < THRESHOLD
    assert count(client, previous_response_id=first.id, input=[NEXT]) < THRESHOLD
    listed = client.responses.retrieve(first.id)
    assert listed.output[0].type == "compaction"


def test_the_stream_carries_the_compaction_item_before_the_answer(client: OpenAI) -> None:
    stream = client.responses.create(
        model=MODEL,
        input=HISTORY,
        tools=TOOLS,
        store=False,
        stream=True,
        context_management=COMPACT,
    )
    events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[:3] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
    ]
    assert events[2].item.type == "compaction" and events[2].output_index == 0
    done = kinds.index("response.output_item.done")
    compacting = kinds[3:done]
    assert compacting and set(compacting) == {"response.compaction.compacting"}
    assert all(event.item_id == events[2].item.id for event in events[3:done])
    assert events[done].item.type == "compaction" and events[done].item.encrypted_content
    # Then the answer, at output index 1, and one terminal event with both items.
    after = events[done + 1]
    assert after.type == "response.output_item.added" and after.output_index == 1
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert kinds[-1] == "response.completed"
    final = events[-1].response
    assert [item.type for item in final.output] == ["compaction", "message"]
    assert final.output[0].encrypted_content == events[done].item.encrypted_content
    assert final.output_text == RESUMED
    for event in (events[2], events[done]):
        open_responses.check_output_item(event.item.model_dump(exclude_unset=True))


def test_websocket_compacts_and_continues_on_the_socket(client: OpenAI) -> None:
    key = str(uuid.uuid4())
    with client.responses.connect() as connection:
        connection.response.create(
            model=MODEL,
            input=HISTORY,
            tools=TOOLS,
            store=False,
            prompt_cache_key=key,
            context_management=COMPACT,
        )
        first = until_terminal(connection)
        kinds = [event.type for event in first]
        assert "response.compaction.compacting" in kinds
        response = first[-1].response
        assert response.status == "completed", response.error
        assert [item.type for item in response.output] == ["compaction", "message"]
        assert response.output_text == RESUMED
        # Chained on the socket with only the new input (store: false: the socket's memory).
        connection.response.create(
            model=MODEL,
            previous_response_id=response.id,
            input=[NEXT],
            tools=TOOLS,
            store=False,
            prompt_cache_key=key,
            context_management=COMPACT,
        )
        second = until_terminal(connection)[-1].response
        assert second.status == "completed", second.error
        assert "compaction" not in [item.type for item in second.output]
        assert second.usage.input_tokens < THRESHOLD


@pytest.mark.parametrize(
    ("entries", "param"),
    [
        ([{"type": "compaction", "compact_threshold": 999}], f"{CM0}.compact_threshold"),
        ([{"type": "summary"}], f"{CM0}.type"),
        ([{"type": "compaction"}, {"type": "compaction"}], "context_management[1]"),
        ([{"type": "compaction", "compact_threshold": "many"}], f"{CM0}.compact_threshold"),
        ({"type": "compaction"}, "context_management"),
    ],
)
def test_bad_context_management_is_a_400_naming_it(
    app_url: str, client: OpenAI, entries: Any, param: str
) -> None:
    body = {"model": MODEL, "input": "hi", "context_management": entries}
    answer = httpx.post(f"{app_url}/v1/responses", json=body, headers=AUTH, timeout=30)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    with pytest.raises(BadRequestError) as raised:
        client.responses.create(model=MODEL, input="hi", context_management=entries)
    assert raised.value.body["param"] == param
    with client.responses.connect() as connection:
        connection.response.create(model=MODEL, input="hi", context_management=entries)
        event = connection.recv()
        assert event.type == "error" and event.error.param == param


def test_background_and_conversation_turns_compact_too(client: OpenAI) -> None:
    """A background run compacts as a streamed one; a conversation keeps the compaction item
    among its items, and its next turn renders from it."""
    started = client.responses.create(
        model=MODEL, input=HISTORY, tools=TOOLS, background=True, context_management=COMPACT
    )
    assert wait_for(lambda: client.responses.retrieve(started.id).status == "completed")
    done = client.responses.retrieve(started.id)
    assert done.status == "completed", done.error
    assert [item.type for item in done.output] == ["compaction", "message"]
    assert done.output_text == RESUMED

    conversation = client.conversations.create()
    first = client.responses.create(
        model=MODEL,
        input=HISTORY,
        tools=TOOLS,
        conversation=conversation.id,
        context_management=COMPACT,
    )
    assert [item.type for item in first.output] == ["compaction", "message"]
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert "compaction" in [item.type for item in items]
    second = client.responses.create(
        model=MODEL,
        input=[NEXT],
        tools=TOOLS,
        conversation=conversation.id,
        context_management=COMPACT,
    )
    assert "compaction" not in [item.type for item in second.output]
    assert second.usage.input_tokens < THRESHOLD
