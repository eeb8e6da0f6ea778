"""The event writer alone (no harmony): what it is told becomes OpenAI's events, in order.

The translator's tests (tests/unit/harmony/test_stream.py) cover it through harmony token ids;
these drive `ResponseEventWriter` directly, as any other decoder would, and read the events
back as a client does (SSE, the openai SDK's models and its stream accumulator).
"""

from __future__ import annotations

import json
from typing import Any

from openai._types import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent
from openai.types.responses.response_output_text import Logprob, LogprobTopLogprob
from pydantic import TypeAdapter

from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.responses import dump_response, initial_response, new_response_id, usage
from serve_app.protocol.sse import encode_event
from serve_app.protocol.stream_events import ResponseEventWriter
from tests.support import MODEL

EVENT = TypeAdapter(ResponseStreamEvent)


def new_writer(**options: Any) -> ResponseEventWriter:
    request = ResponsesRequest.model_validate({"model": MODEL, "input": "hi"})
    response = initial_response(request, response_id=new_response_id(), model=MODEL)
    return ResponseEventWriter(response, **options)


def wire(writer: ResponseEventWriter) -> list[dict[str, Any]]:
    """The events written so far as a client reads them, checked by the SDK's accumulator."""
    out = []
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    for event in writer.take_events():
        raw = encode_event(event).decode()
        data = json.loads(raw.split("\ndata: ", 1)[1])
        state.handle_event(EVENT.validate_python(data))
        out.append(data)
    return out


def entry(token: str, logprob: float) -> Logprob:
    return Logprob(
        token=token,
        bytes=list(token.encode()),
        logprob=logprob,
        top_logprobs=[LogprobTopLogprob(token=token, bytes=list(token.encode()), logprob=logprob)],
    )


def test_items_opened_grown_and_closed_become_the_events_in_order() -> None:
    writer = new_writer(summarize_reasoning=True, seal_reasoning=lambda text: f"sealed:{text}")
    writer.start()
    writer.start()  # once
    reasoning = writer.open_reasoning()
    writer.text(reasoning, "Think")
    writer.text(reasoning, "ing.")
    writer.close(reasoning, "completed")
    call = writer.open_function_call("close_agent", "multi_agent_v1")
    writer.close(call, "completed")  # no arguments: "{}"
    message = writer.open_message("final_answer")
    writer.text(message, "Hi", [entry("Hi", -0.1)])
    writer.close(message, "incomplete", [entry("!", -0.2)])  # no delta carried "!"'s entry
    writer.finish("incomplete", usage(10, 0, 9, 2), incomplete_reason="max_output_tokens")
    events = wire(writer)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    items = events[-1]["response"]["output"]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.done"] == [
        0,
        1,
        2,
    ]
    assert items[0]["content"] == [{"type": "reasoning_text", "text": "Thinking."}]
    assert items[0]["summary"] == [{"type": "summary_text", "text": "Thinking."}]
    assert items[0]["encrypted_content"] == "sealed:Thinking."
    assert items[1]["arguments"] == "{}" and items[1]["namespace"] == "multi_agent_v1"
    assert items[2]["status"] == "incomplete"
    assert [e["token"] for e in items[2]["content"][0]["logprobs"]] == ["Hi", "!"]
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert writer.tool_calls == 1
    assert dump_response(writer.response)["output"] == items
    assert [item.id for item in writer.output_items] == [item["id"] for item in items]


def test_completed_cancelled_and_failed_endings() -> None:
    completed = new_writer()
    completed.start()
    custom = completed.open_custom_tool_call("apply_patch")
    completed.text(custom, "*** Begin Patch")
    completed.close(custom, "completed")
    completed.finish("completed", usage(1, 0, 1, 0))
    events = wire(completed)
    assert events[-1]["type"] == "response.completed"
    assert isinstance(events[-1]["response"]["completed_at"], int)
    assert events[-1]["response"]["output"][0]["input"] == "*** Begin Patch"

    cancelled = new_writer()
    cancelled.start()
    cancelled.finish("cancelled", usage(1, 0, 0, 0))
    (*_, terminal) = wire(cancelled)
    assert terminal["type"] == "response.incomplete"
    assert terminal["response"]["status"] == "cancelled"
    assert terminal["response"]["incomplete_details"] is None

    failed = new_writer()
    failed.start()
    failed.fail("server_error", "boom")
    (*_, terminal) = wire(failed)
    assert terminal["type"] == "response.failed"
    assert terminal["response"]["error"] == {"code": "server_error", "message": "boom"}
    assert terminal["response"]["status"] == "failed"
