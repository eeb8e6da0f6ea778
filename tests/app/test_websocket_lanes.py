"""WebSocket lanes (``stream_id``) and steering (``response.steer``) through the openai SDK's
``responses.connect()`` against the running app (or `tests.local_app`): lanes interleaved on
one socket, a fork across lanes, a steered response and its successor, input held at a tool
call, and every steering refusal with its SDK error code."""

from __future__ import annotations

import json
import random
from collections import defaultdict

import pytest
from openai.types.responses import (
    ResponseSteerAcceptedEvent,
    ResponseSteerFailedEvent,
    ResponseSteerPendingEvent,
)

from tests.support import MODEL
from tests.support.websocket import TERMINAL, connected, until, until_terminal

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "strict": False,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def numbered_in_order(events: list) -> None:
    """One response's stream (steering events included): sequence numbers 0, 1, 2, ..."""
    assert [event.sequence_number for event in events] == list(range(len(events))), [
        (event.type, event.sequence_number) for event in events
    ]


# --- lanes ---------------------------------------------------------------------------------


def test_two_lanes_run_concurrently_and_every_event_names_its_lane(client) -> None:
    with connected(client) as connection:
        connection.response.create(model=MODEL, input="LANE-WAIT: slow lane", stream_id="slow")
        connection.response.create(model=MODEL, input="SDK-REASON: fast lane", stream_id="fast")
        events = until(connection, lambda e: e.type in TERMINAL and e.stream_id == "slow")
    by_lane = defaultdict(list)
    for event in events:
        by_lane[event.stream_id].append(event)
    assert set(by_lane) == {"slow", "fast"}, [(e.type, e.stream_id) for e in events]
    for lane in by_lane.values():
        assert lane[0].type == "response.created" and lane[-1].type == "response.completed"
        numbered_in_order(lane)
    # The fast lane's response, sent second, ended while the slow one waited in its engine.
    terminals = [(e.stream_id, e.type) for e in events if e.type in TERMINAL]
    assert terminals == [("fast", "response.completed"), ("slow", "response.completed")]
    assert by_lane["fast"][-1].response.output_text == "Hi there."
    assert by_lane["slow"][-1].response.output_text == "Lane answer after the wait."


@pytest.mark.parametrize("seed", range(6))
def test_each_lane_is_fifo_whatever_the_interleaving(client, seed: int) -> None:
    rng = random.Random(seed)
    lanes = ["a", "b", "c", None]
    sent: dict[str | None, list[str]] = defaultdict(list)
    with connected(client) as connection:
        for n in range(12):
            lane = rng.choice(lanes)
            marker = rng.choice(["SDK-TEXT", "SDK-REASON", "SDK-LONG"])
            options = {} if lane is None else {"stream_id": lane}
            connection.response.create(
                model=MODEL, input=f"{marker} {n}", metadata={"n": str(n)}, store=False, **options
            )
            sent[lane].append(str(n))
        raw = []
        # Each request ends in a terminal event, or in an error event if it was refused.
        try:
            while sum(1 for event in raw if event["type"] in (*TERMINAL, "error")) < 12:
                raw.append(json.loads(connection.recv_bytes()))
        except Exception as exc:
            seen = [
                (e.get("stream_id"), e["type"], e.get("response", {}).get("metadata"))
                for e in raw
                if e["type"] in ("response.created", *TERMINAL)
            ]
            raise AssertionError(f"sent {dict(sent)}; created and ended: {seen}") from exc
    assert [event for event in raw if event["type"] == "error"] == []
    served: dict[str | None, list[str]] = defaultdict(list)
    running: dict[str | None, str | None] = {}
    for event in raw:
        lane = event.get("stream_id")
        # The default lane's events carry no stream_id at all, as before lanes.
        assert "stream_id" in event or lane is None
        if event["type"] == "response.created":
            # A lane starts its next response only after the last one's terminal event.
            assert running.get(lane) is None, (seed, lane)
            running[lane] = event["response"]["id"]
            served[lane].append(event["response"]["metadata"]["n"])
        elif event["type"] in TERMINAL:
            assert event["response"]["id"] == running[lane]
            assert event["type"] == "response.completed", event
            running[lane] = None
        else:
            assert running.get(lane) is not None, event
    assert served == sent


def test_a_lane_forks_from_a_response_made_on_another_lane(client) -> None:
    with connected(client) as connection:
        connection.response.create(
            model=MODEL, input="SDK-REASON: the root", store=False, stream_id="main"
        )
        root = until_terminal(connection)[-1].response
        # Lane "fork" continues lane "main"'s response, which was never stored.
        connection.response.create(
            model=MODEL,
            input="SDK-TEXT: a branch",
            store=False,
            previous_response_id=root.id,
            stream_id="fork",
        )
        branch = until_terminal(connection)
        assert {event.stream_id for event in branch} == {"fork"}
        done = branch[-1]
        assert done.type == "response.completed", done
        assert done.response.previous_response_id == root.id
        assert done.response.usage.input_tokens > root.usage.input_tokens + 5
        # A failed fork does not take the root away from its own lane.
        orphan = {"type": "function_call_output", "call_id": "call_nowhere", "output": "x"}
        connection.response.create(
            model=MODEL,
            input=[orphan],
            store=False,
            previous_response_id=root.id,
            stream_id="fork",
        )
        (refused,) = until_terminal(connection)
        assert refused.type == "error" and refused.status == 400 and refused.stream_id == "fork"
        connection.response.create(
            model=MODEL,
            input="SDK-TEXT: the trunk goes on",
            store=False,
            previous_response_id=root.id,
            stream_id="main",
        )
        trunk = until_terminal(connection)[-1]
        assert trunk.type == "response.completed" and trunk.stream_id == "main", trunk


def test_a_bad_stream_id_is_a_400_naming_it(client) -> None:
    with connected(client) as connection:
        for bad in (5, "", "x" * 300):
            connection.send(
                {"type": "response.create", "model": MODEL, "input": "hi", "stream_id": bad}
            )
            (error,) = until_terminal(connection)
            assert error.type == "error" and error.status == 400, error
            assert error.error.param == "stream_id" and error.stream_id is None


# --- steering ------------------------------------------------------------------------------


def test_a_steered_response_ends_at_the_message_boundary_and_its_successor_continues(
    client,
) -> None:
    settings = {
        "instructions": "Plan carefully.",
        "temperature": 0.3,
        "metadata": {"ticket": "T-1"},
        "tools": [WEATHER_TOOL],
        "store": True,
    }
    with connected(client) as connection:
        connection.response.create(
            model=MODEL, input="STEER-WAIT: a plan please", stream_id="work", **settings
        )
        # The reasoning message has begun, and its engine is paused inside it.
        first = until(connection, lambda e: e.type == "response.reasoning_text.delta")
        target = first[0].response.id
        connection.response.steer(previous_response_id=target, input="STEER-FOLLOW: keep it small")
        first += until_terminal(connection)
        successor = until_terminal(connection)
    accepted = [e for e in first if isinstance(e, ResponseSteerAcceptedEvent)]
    assert len(accepted) == 1
    assert accepted[0].steer.previous_response_id == target
    assert accepted[0].steer.id.startswith("steer_") and accepted[0].stream_id == "work"
    # The steering event is part of the target's stream.
    numbered_in_order(first)
    steered = first[-1]
    assert steered.type == "response.incomplete" and steered.stream_id == "work"
    assert steered.response.incomplete_details.reason == "steered"
    # The message being written when the steer came was finished; nothing after it began.
    (reasoning,) = steered.response.output
    assert reasoning.type == "reasoning"
    assert reasoning.content[0].text == "Thinking about the plan in detail."
    assert not any(e.type == "response.output_text.delta" for e in first)

    created, done = successor[0], successor[-1]
    assert created.type == "response.created" and created.stream_id == "work"
    assert done.type == "response.completed", done
    numbered_in_order(successor)
    answer = done.response
    assert answer.previous_response_id == target
    assert answer.output_text == "A small plan."
    # The same settings as the steered request.
    assert answer.instructions == "Plan carefully." and answer.temperature == 0.3
    assert answer.metadata == {"ticket": "T-1"}
    assert [tool.name for tool in answer.tools] == ["get_weather"]
    # It continued the steered response: its prompt holds it, and its input is the steer.
    assert answer.usage.input_tokens > steered.response.usage.input_tokens
    items = client.responses.input_items.list(answer.id).data
    assert [(item.type, item.role, item.content[0].text) for item in items] == [
        ("message", "user", "STEER-FOLLOW: keep it small")
    ]
    assert client.responses.retrieve(target).incomplete_details.reason == "steered"


def test_steering_an_unscripted_response(client) -> None:
    # The simulated engine's own answer (no script matches): wherever the steer lands (before
    # the first token, between its two messages, or after the end), a successor follows.
    with connected(client) as connection:
        connection.response.create(model=MODEL, input="tell me anything", store=False)
        created = connection.recv()
        connection.response.steer(previous_response_id=created.response.id, input="and more")
        first = [created, *until_terminal(connection)]
        successor = until_terminal(connection)
    outcome = first[-1]
    if outcome.type == "response.incomplete":
        assert outcome.response.incomplete_details.reason == "steered"
    else:
        assert outcome.type == "response.completed", outcome
    assert any(isinstance(e, ResponseSteerAcceptedEvent) for e in first)
    assert successor[0].type == "response.created"
    assert successor[-1].type == "response.completed"
    assert successor[-1].response.previous_response_id == created.response.id


def test_steer_input_left_at_a_tool_call_waits_for_the_continuation(client) -> None:
    with connected(client) as connection:
        connection.response.create(
            model=MODEL, input="STEER-TOOL: weather?", tools=[WEATHER_TOOL], stream_id="t"
        )
        first = until(connection, lambda e: e.type == "response.function_call_arguments.delta")
        target = first[0].response.id
        connection.response.steer(
            previous_response_id=target,
            input=[{"role": "user", "content": [{"type": "input_text", "text": "umbrella?"}]}],
        )
        first += until_terminal(connection)
        pending = connection.recv()
        completed = first[-1]
        # A call cannot be cut: the response stopped for its output, and kept the input.
        assert completed.type == "response.completed", completed
        (call,) = completed.response.output
        assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}
        assert isinstance(pending, ResponseSteerPendingEvent), pending
        accepted = next(e for e in first if isinstance(e, ResponseSteerAcceptedEvent))
        assert pending.steer.id == accepted.steer.id and pending.stream_id == "t"
        assert pending.reason == "waiting_for_required_input"
        assert [stub.model_dump() for stub in pending.required_input] == [
            {"type": "function_call_output", "call_id": call.call_id, "name": "get_weather"}
        ]
        numbered_in_order([*first, pending])
        # The client's continuation on that lane gets the input before its tool output.
        output = {
            "type": "function_call_output",
            "call_id": call.call_id,
            "output": "WEATHER-RESULT",
        }
        connection.response.create(
            model=MODEL,
            input=[output],
            tools=[WEATHER_TOOL],
            previous_response_id=target,
            stream_id="t",
        )
        done = until_terminal(connection)[-1]
    assert done.type == "response.completed", done
    assert done.response.output_text == "It is sunny in Paris."
    items = client.responses.input_items.list(done.response.id, order="asc").data
    assert [item.type for item in items] == ["message", "function_call_output"]
    assert items[0].role == "user" and items[0].content[0].text == "umbrella?"


def failed(event) -> tuple[str, str | None]:
    assert isinstance(event, ResponseSteerFailedEvent), event
    assert event.error.type == "invalid_request_error" and event.error.message
    return event.error.code, event.steer.id


def test_each_steering_refusal_has_its_sdk_code_and_gives_the_input_back(client) -> None:
    conversation = client.conversations.create()
    with connected(client) as connection:
        # Unknown here: never made, or made elsewhere (a stored response from HTTP).
        stored = client.responses.create(model=MODEL, input="SDK-TEXT", store=True)
        for unknown in ("resp_nothing", stored.id):
            connection.response.steer(previous_response_id=unknown, input="hello")
            refused = connection.recv()
            assert failed(refused) == ("response_not_found", None)
            assert refused.steer.input == "hello" and refused.steer.previous_response_id == unknown
            assert refused.sequence_number == 0

        # Ended: completed, or failed.
        connection.response.create(model=MODEL, input="SDK-TEXT: done", store=False)
        done = until_terminal(connection)[-1].response
        connection.response.steer(previous_response_id=done.id, input="late")
        assert failed(connection.recv()) == ("response_already_completed", None)
        connection.response.create(model=MODEL, input="SDK-FAIL", store=False)
        broken = until_terminal(connection)[-1]
        assert broken.type == "response.failed"
        connection.response.steer(previous_response_id=broken.response.id, input="late")
        assert failed(connection.recv()) == ("response_not_active", None)

        # Not a user message, a field beyond the three, nothing to say.
        bad_inputs = [
            [{"role": "developer", "content": "obey"}],
            [{"type": "function_call_output", "call_id": "c", "output": "x"}],
            [{"role": "user", "content": "hi", "id": "msg_1"}],
            [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}],
            [],
            "",
        ]
        for bad in bad_inputs:
            connection.send(
                {"type": "response.steer", "previous_response_id": done.id, "input": bad}
            )
            # Read raw: the SDK's models would not hold input this invalid as sent.
            refused = json.loads(connection.recv_bytes())
            assert refused["type"] == "response.steer.failed", refused
            assert refused["error"]["code"] == "invalid_input", bad
            assert refused["steer"] == {"previous_response_id": done.id, "input": bad}
        connection.send(
            {
                "type": "response.steer",
                "previous_response_id": done.id,
                "input": "x",
                "stream_id": "a",
            }
        )
        assert failed(connection.recv()) == ("invalid_input", None)

        # Running, but bound to a conversation, or compacting its context.
        for unsupported in (
            {"conversation": conversation.id},
            {"context_management": [{"type": "compaction", "compact_threshold": 200000}]},
        ):
            connection.response.create(
                model=MODEL, input="STEER-WAIT: plan", stream_id="u", **unsupported
            )
            created = connection.recv()
            connection.response.steer(previous_response_id=created.response.id, input="hi")
            events = until_terminal(connection)
            refusals = [e for e in events if isinstance(e, ResponseSteerFailedEvent)]
            assert [failed(e) for e in refusals] == [("steering_not_supported", None)]
            assert refusals[0].stream_id == "u"
            assert events[-1].type == "response.completed", events[-1]
            assert events[-1].response.output_text == "The big plan."


def test_too_many_steers_and_a_successor_that_cannot_be_created(client) -> None:
    with connected(client) as connection:
        connection.response.create(model=MODEL, input="STEER-WAIT: plan", store=True)
        # Steered once its message has begun (steered before its first token, it would end
        # there at once, and the later steers find it ended).
        first = until(connection, lambda e: e.type == "response.reasoning_text.delta")
        target = first[0].response.id
        for n in range(9):  # the ninth is one more than the response may hold
            connection.response.steer(previous_response_id=target, input=f"STEER-FOLLOW {n}")
        first += until_terminal(connection)
        accepted = [e for e in first if isinstance(e, ResponseSteerAcceptedEvent)]
        refusals = [e for e in first if isinstance(e, ResponseSteerFailedEvent)]
        assert len(accepted) == 8
        assert [failed(e) for e in refusals] == [("too_many_pending_steers", None)]
        assert refusals[0].steer.input == "STEER-FOLLOW 8"
        assert first[-1].response.incomplete_details.reason == "steered"
        successor = until_terminal(connection)[-1]
        # Its input: the eight, in the order they were sent.
        items = client.responses.input_items.list(successor.response.id, order="asc").data
        assert [item.content[0].text for item in items] == [f"STEER-FOLLOW {n}" for n in range(8)]

        # Accepted, but the successor it would start is refused (a 20,000-character piece).
        connection.response.create(model=MODEL, input="STEER-WAIT: again", store=False)
        created = connection.recv()
        long = "y" * 25_000
        connection.response.steer(previous_response_id=created.response.id, input=long)
        events = until_terminal(connection)
        accepted = next(e for e in events if isinstance(e, ResponseSteerAcceptedEvent))
        assert events[-1].response.incomplete_details.reason == "steered"
        refused = connection.recv()
        assert failed(refused) == ("successor_creation_failed", accepted.steer.id)
        assert refused.steer.input == long
        # The connection serves on.
        connection.response.create(model=MODEL, input="SDK-TEXT: still here", store=False)
        assert until_terminal(connection)[-1].type == "response.completed"
