"""WebSocket mode: the openai SDK's ``responses.connect()`` and a plain WebSocket client against
the running app."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from openai.types.responses.responses_server_event import ResponseWsError
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from serve_app.serving.websocket import MAX_PENDING_MESSAGES
from tests.support import AUTH, MODEL
from tests.support.helpers import wait_for
from tests.support.replicas import engine_ongoing
from tests.support.websocket import TERMINAL, until_terminal

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def socket_url(app_url: str) -> str:
    return app_url.replace("http://", "ws://", 1) + "/v1/responses"


def respond(connection, **create):
    """Create a response on the socket and return it as its terminal event carries it."""
    connection.response.create(model=MODEL, **create)
    return until_terminal(connection)[-1].response


def test_two_responses_in_sequence_on_one_socket_continue_with_store_false(client) -> None:
    key = str(uuid.uuid4())
    with client.responses.connect() as connection:
        connection.response.create(
            model=MODEL, input="SDK-REASON: hello", store=False, prompt_cache_key=key
        )
        first = until_terminal(connection)
        assert [event.type for event in first][:2] == ["response.created", "response.in_progress"]
        assert first[-1].type == "response.completed"
        first_response = first[-1].response
        assert first_response.output_text == "Hi there."

        # The same socket, continuing a response that was never stored: only the new message.
        connection.response.create(
            model=MODEL,
            input="SDK-TEXT: and again",
            store=False,
            prompt_cache_key=key,
            previous_response_id=first_response.id,
        )
        second = until_terminal(connection)
    done = second[-1]
    assert done.type == "response.completed", done
    assert done.response.output_text == "Hello from the scripted engine."
    usage = done.response.usage
    # The first turn is part of the prompt, and it came from the prefix cache.
    assert usage.input_tokens > first_response.usage.input_tokens + 5
    assert usage.input_tokens_details.cached_tokens >= first_response.usage.input_tokens // 2
    # No echo of old items: only this turn's output.
    assert [item.type for item in done.response.output] == ["message"]


def test_after_a_reconnect_a_store_false_response_is_not_found(client) -> None:
    with client.responses.connect() as connection:
        response_id = respond(connection, input="SDK-TEXT", store=False).id
    with client.responses.connect() as connection:
        connection.response.create(
            model=MODEL, input="SDK-TEXT", store=False, previous_response_id=response_id
        )
        error = connection.recv()
        assert isinstance(error, ResponseWsError)
        assert error.status == 404
        assert error.error.code == "previous_response_not_found"
        assert error.error.param == "previous_response_id"
        # The connection stays usable after an error.
        connection.response.create(model=MODEL, input="SDK-TEXT", store=False)
        assert until_terminal(connection)[-1].type == "response.completed"


def test_a_failed_continuation_evicts_what_it_continued(client) -> None:
    with client.responses.connect() as connection:
        response_id = respond(connection, input="SDK-TEXT", store=False).id
        orphan = {"type": "function_call_output", "call_id": "call_nowhere", "output": "x"}
        connection.response.create(
            model=MODEL, input=[orphan], store=False, previous_response_id=response_id
        )
        failed = connection.recv()
        assert failed.type == "error" and failed.status == 400
        assert failed.error.param == "input[0].call_id"
        # The client must now send the full history: the id it built on is gone.
        connection.response.create(
            model=MODEL, input="SDK-TEXT", store=False, previous_response_id=response_id
        )
        gone = connection.recv()
        assert gone.type == "error" and gone.error.code == "previous_response_not_found"


def test_stored_responses_continue_on_a_new_socket_and_over_http(client) -> None:
    with client.responses.connect() as connection:
        response_id = respond(connection, input="SDK-TEXT", store=True).id
    with client.responses.connect() as connection:
        connection.response.create(
            model=MODEL, input="SDK-REASON", store=False, previous_response_id=response_id
        )
        assert until_terminal(connection)[-1].type == "response.completed"
    assert client.responses.retrieve(response_id).status == "completed"


def test_plain_websocket_client_gets_sse_events_as_json_messages(app_url: str) -> None:
    with connect(socket_url(app_url), additional_headers=AUTH) as socket:
        create = {"type": "response.create", "model": MODEL, "input": "SDK-TOOL"}
        socket.send(json.dumps({**create, "tools": [WEATHER_TOOL]}))
        events = []
        while not events or events[-1]["type"] not in TERMINAL:
            events.append(json.loads(socket.recv(timeout=30)))
        done = [event for event in events if event["type"] == "response.output_item.done"]
        call = done[-1]["item"]
        assert call["type"] == "function_call" and json.loads(call["arguments"]) == {
            "city": "Paris"
        }
        assert events[-1]["type"] == "response.completed"
        assert [event["sequence_number"] for event in events] == list(range(len(events)))

        for bad, param in [("not json", None), (json.dumps({"type": "response.cancel"}), "type")]:
            socket.send(bad)
            error = json.loads(socket.recv(timeout=30))
            assert error["type"] == "error" and error["status"] == 400
            assert set(error["error"]) == {"message", "type", "param", "code"}
            assert error["error"]["param"] == param


def test_closing_the_socket_mid_stream_aborts_the_engine_request(
    app_url: str, app_cluster: None
) -> None:
    key = "websocket-disconnect-conversation"
    with connect(socket_url(app_url), additional_headers=AUTH) as socket:
        create = {"model": MODEL, "input": "SDK-SLOW: hold", "prompt_cache_key": key}
        socket.send(json.dumps({"type": "response.create", **create}))
        while json.loads(socket.recv(timeout=30))["type"] != "response.reasoning_text.done":
            pass
        assert engine_ongoing(key) >= 1  # the engine is paused mid-turn
    assert wait_for(lambda: engine_ongoing(key) == 0), "the engine request ran on"


def test_a_client_flooding_messages_is_closed(app_url: str, app_cluster: None) -> None:
    key = "websocket-flood-conversation"
    create = {"type": "response.create", "model": MODEL, "prompt_cache_key": key}
    with connect(socket_url(app_url), additional_headers=AUTH) as socket:
        socket.send(json.dumps({**create, "input": "SDK-SLOW: hold"}))
        while json.loads(socket.recv(timeout=30))["type"] != "response.reasoning_text.done":
            pass  # the slow response is now in the engine, paused mid-turn
        for _ in range(MAX_PENDING_MESSAGES + 8):  # queued behind the slow response
            socket.send(json.dumps({**create, "input": "SDK-TEXT"}))
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                socket.recv(timeout=30)
    assert closed.value.rcvd.code == 1008
    # The response that was streaming is gone from the engine too.
    assert wait_for(lambda: engine_ongoing(key) == 0)


def test_a_prewarm_is_answered_at_once_without_generating(client) -> None:
    # Codex opens each WebSocket session with `generate: false`. The engine only prefills the
    # prompt (one token, dropped): were the turn generated, it would stream reasoning and then
    # pause for a minute (SDK-SLOW).
    with client.responses.connect() as connection:
        started = time.monotonic()
        connection.response.create(
            model=MODEL,
            input="SDK-SLOW: hold",
            generate=False,
            store=False,
            prompt_cache_key="prewarm-no-engine",
            tools=[WEATHER_TOOL],
        )
        created = connection.recv()
        completed = connection.recv()
        elapsed = time.monotonic() - started
    assert [created.type, completed.type] == ["response.created", "response.completed"]
    assert elapsed < 5, elapsed
    response = completed.response
    assert response.id == created.response.id
    assert response.status == "completed" and response.output == []
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (0, 0, 0)
    # The request's echo, as on any response.
    assert response.prompt_cache_key == "prewarm-no-engine"
    assert [tool.name for tool in response.tools] == ["get_weather"]
    assert [created.sequence_number, completed.sequence_number] == [0, 1]


def test_a_prewarm_is_continued_by_its_id_with_its_whole_context(client) -> None:
    context = [
        {"role": "developer", "content": "Be friendly."},
        {"role": "user", "content": "SDK-REASON: hello"},
    ]
    with client.responses.connect() as connection:
        # The same context sent whole: the prompt the continuation must render.
        whole = respond(connection, input=context, store=False)
        connection.response.create(model=MODEL, input=context, generate=False, store=False)
        prewarm = until_terminal(connection)[-1].response
        # As Codex does next: the prewarm's id and only the items added since (none).
        connection.response.create(
            model=MODEL, input=[], store=False, previous_response_id=prewarm.id
        )
        events = until_terminal(connection)
    done = events[-1]
    assert done.type == "response.completed", done
    # The engine saw the prewarm's messages: it answered the last one, from the same prompt.
    assert done.response.output_text == whole.output_text == "Hi there."
    assert done.response.usage.input_tokens == whole.usage.input_tokens
    assert done.response.previous_response_id == prewarm.id


def test_prompt_cache_prewarm_is_a_prewarm_and_the_options_are_strict(app_url: str) -> None:
    with connect(socket_url(app_url), additional_headers=AUTH) as socket:
        # `prompt_cache_options.prewarm: true` is a prewarm too, whatever `generate` says.
        create = {"type": "response.create", "model": MODEL, "input": "SDK-SLOW: hold"}
        socket.send(json.dumps({**create, "prompt_cache_options": {"prewarm": True}}))
        events = [json.loads(socket.recv(timeout=5)) for _ in range(2)]
        assert [event["type"] for event in events] == ["response.created", "response.completed"]
        for bad, param in [
            ({"generate": "false"}, "generate"),
            ({"generate": 0}, "generate"),
            ({"prompt_cache_options": {"prewarm": "yes"}}, "prompt_cache_options.prewarm"),
            ({"temperature": True}, "temperature"),
        ]:
            create = {"type": "response.create", "model": MODEL, "input": "SDK-TEXT", **bad}
            socket.send(json.dumps(create))
            error = json.loads(socket.recv(timeout=30))
            assert error["type"] == "error" and error["status"] == 400, error
            assert error["error"]["param"] == param


def test_blobs_the_server_cannot_open_over_a_socket(client) -> None:
    # A megabyte without a break is never read as text: a reasoning item's is ignored (the
    # prompt as without it), a compaction item's is an error event naming it, as over HTTP
    # (tests/unit/harmony/test_reasoning_vault_blobs.py); the socket serves on.
    blob = "A" * (1 << 20)
    question = {"role": "user", "content": "weather in Paris?"}
    call = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"}
    result = {"type": "function_call_output", "call_id": "c1", "output": "SDK-TEXT: sunny"}
    thought = {"type": "reasoning", "summary": [], "encrypted_content": blob}
    with client.responses.connect() as connection:
        bare = respond(connection, input=[question, call, result], tools=[WEATHER_TOOL])
        connection.response.create(
            model=MODEL, input=[question, thought, call, result], tools=[WEATHER_TOOL], store=False
        )
        done = until_terminal(connection)[-1]
        assert done.type == "response.completed", done
        served = done.response
        assert served.usage.input_tokens == bare.usage.input_tokens
        # Continued from the socket's memory, the blob in the history is ignored the same way.
        continued = respond(
            connection, input="SDK-TEXT: again", previous_response_id=served.id, store=False
        )
        assert continued.status == "completed"

        connection.response.create(
            model=MODEL, input=[question, {"type": "compaction", "encrypted_content": blob}]
        )
        (refused,) = until_terminal(connection)
        assert isinstance(refused, ResponseWsError) and refused.status == 400
        assert refused.error.model_dump(exclude_unset=True) == {
            "type": "invalid_request_error",
            "code": "invalid_encrypted_content",
            "param": "input[1].encrypted_content",
            "message": refused.error.message,
        }
        assert respond(connection, input="SDK-TEXT: still here").status == "completed"
