"""Which item a harmony message opens when its recipient is a tool the server runs, and
``max_tool_calls`` over a response's completions (`items.CallLimit`), through the translator.
The server-run kind is the test kind ``echo`` (tests/support/echo_tool.py)."""

from __future__ import annotations

from typing import Any

from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from serve_app.harmony.encoding import get_encoding
from serve_app.harmony.items import CallLimit, UnknownCall
from serve_app.harmony.stream import ResponseStreamTranslator
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.responses import initial_response, new_response_id
from serve_app.protocol.tool_items import ToolResult
from tests.support import MODEL
from tests.support.echo_tool import ECHO_SPEC, register_echo

EVENT = TypeAdapter(ResponseStreamEvent)
CALL_A = '<|channel|>commentary to=testtools.echo <|constrain|>json<|message|>{"text":"a"}<|call|>'


def tokens(harmony: str) -> list[int]:
    return get_encoding().encode(harmony, allowed_special="all")


def translator(max_tool_calls: int | None = None) -> ResponseStreamTranslator:
    register_echo()
    request = ResponsesRequest.model_validate({"model": MODEL, "input": "x"})
    response = initial_response(request, response_id=new_response_id(), model=MODEL)
    made = ResponseStreamTranslator(
        response, ToolRegistry((ECHO_SPEC,)), max_tool_calls=max_tool_calls
    )
    made.start()
    return made


def dumped(events: list[Any]) -> list[dict[str, Any]]:
    return [EVENT.validate_python(event.model_dump()).model_dump() for event in events]


def test_a_server_run_call_opens_its_kinds_item_and_stays_pending_at_call() -> None:
    translate = translator()
    events = dumped(translate.feed(tokens(CALL_A)))
    assert events[0]["type"] == "response.output_item.added"
    assert events[0]["item"]["type"] == "mcp_call" and events[0]["item"]["status"] == "in_progress"
    assert events[-1]["type"] == "response.mcp_call_arguments.done"
    assert events[-1]["arguments"] == '{"text":"a"}'
    pending = translate.writer.pending_calls
    assert [(call.name, call.namespace, call.tool_kind) for call in pending] == [
        ("echo", "testtools", "echo")
    ]
    assert translate.output_items == [] and translate.writer.tool_calls == 1
    assert not translate.at_safe_boundary  # its output is owed


def test_a_response_ending_before_its_calls_ran_closes_them_incomplete() -> None:
    translate = translator()
    translate.feed(tokens(CALL_A))
    events = dumped(translate.finish("stop", prompt_tokens=10, cached_tokens=0))
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert done[0]["item"]["status"] == "incomplete"
    assert translate.response.output[0].status == "incomplete"  # type: ignore[union-attr]


def test_a_call_past_max_tool_calls_in_a_later_completion_is_refused() -> None:
    translate = translator(max_tool_calls=1)
    translate.feed(tokens(CALL_A))
    # The limit was reached in this completion: the rest of it is dropped.
    assert translate.tool_calls_exhausted
    (call,) = translate.writer.take_pending_calls()
    translate.writer.close_tool_call(call, ToolResult(output="echo: a"))
    translate.begin_completion()
    assert not translate.tool_calls_exhausted  # the next completion may answer
    events = dumped(
        translate.feed(
            tokens(f"<|channel|>analysis<|message|>More.<|end|><|start|>assistant{CALL_A}")
        )
    )
    # Its reasoning streams; the call past the limit is refused: no item, the rest dropped.
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    assert added == ["reasoning"]
    assert translate.tool_calls_exhausted and translate.writer.pending_calls == []
    assert translate.writer.tool_calls == 1


def test_call_limit_counts_calls_over_completions() -> None:
    limit = CallLimit(2)
    limit.begin(0)
    assert not limit.exhausted(1) and limit.exhausted(2)  # reached in this completion
    limit.begin(2)
    assert not limit.exhausted(2)
    assert not limit.refuses(2, "assistant") and not limit.refuses(2, None)
    assert limit.refuses(2, "functions.x") and limit.exhausted(2)
    unbounded = CallLimit(None)
    assert not unbounded.refuses(10**6, "functions.x") and not unbounded.exhausted(10**6)


def test_an_unknown_call_after_a_server_run_call_is_kept_after_it() -> None:
    """No item for a recipient the request has no tool of; the call is kept with its place
    among the completion's server-run calls (the tool loop answers in the model's order)."""
    translate = translator()
    events = dumped(
        translate.feed(
            tokens(
                f"{CALL_A}<|start|>assistant<|channel|>commentary to=functions.gone"
                ' <|constrain|>json<|message|>{"x":1}<|call|>'
            )
        )
    )
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    assert added == ["mcp_call"]
    assert len(translate.writer.pending_calls) == 1
    assert translate.unknown_calls.calls == [UnknownCall("functions.gone", "commentary", 1)]
    assert translate.writer.tool_calls == 2
    translate.begin_completion()  # the next completion: the last one's are gone
    assert translate.unknown_calls.calls == []
