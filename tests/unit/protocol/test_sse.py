"""The SSE writer's direct path for delta events writes what the openai models' dump writes."""

from __future__ import annotations

import json

import pytest
from openai.types.responses import (
    ResponseCustomToolCallInputDeltaEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseReasoningSummaryTextDeltaEvent,
    ResponseReasoningTextDeltaEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
)
from openai.types.responses.response_text_delta_event import Logprob, LogprobTopLogprob

from serve_app.protocol import sse

TEXTS = [
    "Hello",
    ' wörld ✓ "quoted" \\ back\nslash\t',
    "",
    '\u2028 emoji 🎉 {"a": 1}',
    "controls \x00\x08\x1f\x7f \u0085 </script>",
]


def _events(delta: str) -> list[ResponseStreamEvent]:
    common = {"item_id": "item_1", "output_index": 3, "delta": delta, "sequence_number": 41}
    return [
        ResponseTextDeltaEvent(
            type="response.output_text.delta", content_index=0, logprobs=[], **common
        ),
        ResponseReasoningTextDeltaEvent(
            type="response.reasoning_text.delta", content_index=0, **common
        ),
        ResponseReasoningSummaryTextDeltaEvent(
            type="response.reasoning_summary_text.delta", summary_index=0, **common
        ),
        ResponseFunctionCallArgumentsDeltaEvent(
            type="response.function_call_arguments.delta", **common
        ),
        ResponseCustomToolCallInputDeltaEvent(
            type="response.custom_tool_call_input.delta", **common
        ),
    ]


def _dumped(event: ResponseStreamEvent) -> bytes:
    """The reference: the openai model's own dump, framed as the writer frames it."""
    data = json.dumps(sse.event_data(event), ensure_ascii=False, separators=(",", ":"))
    return f"event: {event.type}\ndata: {data}\n\n".encode()


@pytest.mark.parametrize("delta", TEXTS)
def test_every_delta_type_is_written_as_the_model_dumps_it(delta: str) -> None:
    events = _events(delta)
    assert {event.type for event in events} == set(sse._DELTA_FIELDS)  # every type it writes
    for event in events:
        assert sse._delta_json(event) is not None  # the direct path, not the fallback
        assert sse.encode_event(event) == _dumped(event)


def test_a_delta_with_logprobs_takes_the_full_dump() -> None:
    entry = Logprob(
        token="Hi", logprob=-0.5, top_logprobs=[LogprobTopLogprob(token="Hi", logprob=-0.5)]
    )
    event = ResponseTextDeltaEvent(
        type="response.output_text.delta",
        item_id="msg_1",
        output_index=0,
        content_index=0,
        delta="Hi",
        logprobs=[entry],
        sequence_number=7,
    )
    assert sse._delta_json(event) is None
    assert sse.encode_event(event) == _dumped(event)
    assert json.loads(sse.event_json(event))["logprobs"][0]["token"] == "Hi"


def test_fields_left_unset_stay_out_as_in_the_dump() -> None:
    event = ResponseTextDeltaEvent.model_construct(
        type="response.output_text.delta",
        item_id="msg_1",
        output_index=0,
        content_index=0,
        delta="x",
        sequence_number=1,
    )
    assert "logprobs" not in json.loads(sse.event_json(event))
    assert sse.encode_event(event) == _dumped(event)
