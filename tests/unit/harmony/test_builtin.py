"""gpt-oss's browser and python as harmony shows them: the system message is harmony's own
(`SystemContent.with_browser_tool()` / `.with_python_tool()`), token for token; recipients
resolve to the tools; stored calls render as the call and the tool's answer; the translator
opens their items (web_search_call, code_interpreter_call) with the SDK's events; a tool the
request is served without is one line of the system message."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from openai.types.responses import ResponseStreamEvent
from openai_harmony import (
    Author,
    Message,
    ReasoningEffort,
    RenderOptions,
    Role,
    SystemContent,
)
from pydantic import TypeAdapter

from serve_app.harmony import builtin
from serve_app.harmony.encoding import get_encoding
from serve_app.harmony.render import render_request
from serve_app.harmony.stream import ResponseStreamTranslator
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol.request_tools import OmittedTool
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.responses import initial_response, new_response_id
from serve_app.protocol.sse import encode_event
from tests.support import MODEL

NOW = datetime(2026, 11, 26, tzinfo=UTC)
ENCODING = get_encoding()
EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
WEB_SEARCH = {"type": "web_search"}
CODE_INTERPRETER = {"type": "code_interpreter", "container": {"type": "auto"}}


def request(*tools: dict, input: Any = "hi", **fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate(
        {"model": MODEL, "input": input, "tools": list(tools), **fields}
    )


def harmony_system(*kinds: str) -> list[int]:
    """Harmony's own system message with its own tool configs."""
    content = (
        SystemContent.new()
        .with_reasoning_effort(ReasoningEffort.MEDIUM)
        .with_conversation_start_date("2026-11-26")
    )
    if "browser" in kinds:
        content = content.with_browser_tool()
    if "python" in kinds:
        content = content.with_python_tool()
    return ENCODING.render(Message.from_role_and_content(Role.SYSTEM, content), RenderOptions())


@pytest.mark.parametrize(
    ("tools", "kinds"),
    [
        ([WEB_SEARCH], ("browser",)),
        ([{"type": "web_search_preview"}], ("browser",)),
        ([CODE_INTERPRETER], ("python",)),
        ([{"type": "code_interpreter", "container": "auto"}, WEB_SEARCH], ("browser", "python")),
        ([], ()),
    ],
)
def test_the_system_message_is_harmonys_own(tools: list[dict], kinds: tuple[str, ...]) -> None:
    tokens = render_request(request(*tools), now=NOW).token_ids
    expected = harmony_system(*kinds)
    assert tokens[: len(expected)] == expected
    # and nothing of them in the developer message (there is none: no instructions, no tools)
    assert ENCODING.decode(tokens[len(expected) :]).startswith("<|start|>user<|message|>hi")


def test_function_tools_stay_in_the_developer_message_beside_them() -> None:
    function = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    text = ENCODING.decode(render_request(request(WEB_SEARCH, function), now=NOW).token_ids)
    system, rest = text.split("<|end|>", 1)
    assert "namespace browser {" in system and "lookup" not in system
    assert "namespace functions {" in rest and "browser" not in rest.split("<|start|>user")[0]


def test_recipients_resolve_to_the_browser_and_python_only() -> None:
    function = {"type": "function", "name": "search"}
    tools = ToolRegistry.from_request(request(WEB_SEARCH, CODE_INTERPRETER, function))
    assert [(spec.kind, spec.recipient) for spec in tools.tools] == [
        ("browser", "browser.search"),
        ("browser", "browser.open"),
        ("browser", "browser.find"),
        ("python", "python"),
        ("function", "functions.search"),
    ]
    assert tools.resolve("browser.open").kind == "browser"
    assert tools.resolve("python").kind == "python"
    # A bare name is the client's function, never the browser's.
    assert tools.resolve("search").kind == "function"
    assert ToolRegistry.from_request(request(WEB_SEARCH)).resolve("search") is None


SEARCH_ITEM = {
    "type": "web_search_call",
    "id": "ws_1",
    "status": "completed",
    "action": {"type": "search", "query": "zebras", "sources": [{"type": "url", "url": "u1"}]},
}
CODE_ITEM = {
    "type": "code_interpreter_call",
    "id": "ci_1",
    "code": "print(42)",
    "container_id": "auto",
    "outputs": [{"type": "logs", "logs": "42\n"}],
    "status": "completed",
}


def call_and_answer(recipient: str, body: str, answer: str) -> list[int]:
    call = (
        Message.from_role_and_content(Role.ASSISTANT, body)
        .with_channel("analysis")
        .with_recipient(recipient)
        .with_content_type("code")
    )
    result = (
        Message.from_author_and_content(Author.new(Role.TOOL, recipient), answer)
        .with_channel("analysis")
        .with_recipient("assistant")
    )
    return ENCODING.render(call) + ENCODING.render(result)


def test_calls_of_the_current_turn_render_as_the_call_and_its_answer() -> None:
    user = {"role": "user", "content": "look"}
    open_page = {**SEARCH_ITEM, "id": "ws_2", "action": {"type": "open_page", "url": "u1"}}
    find = {**SEARCH_ITEM, "action": {"type": "find_in_page", "pattern": "z", "url": "u1"}}
    items = [user, SEARCH_ITEM, open_page, find, CODE_ITEM]
    tokens = render_request(request(WEB_SEARCH, CODE_INTERPRETER, input=items), now=NOW).token_ids
    expected = (
        call_and_answer("browser.search", '{"query": "zebras"}', "Sources:\n[0] u1")
        + call_and_answer("browser.open", '{"id": "u1"}', builtin.RESULT_NOT_KEPT)
        + call_and_answer("browser.find", '{"pattern": "z"}', builtin.RESULT_NOT_KEPT)
        + call_and_answer("python", "print(42)", "42\n")
    )
    user_end = ENCODING.encode("look", allowed_special=set())[-1]
    tail = tokens[
        tokens.index(user_end) + 2 : -2
    ]  # after `look<|end|>`, before `<|start|>assistant`
    assert tail == expected


def test_calls_before_a_final_answer_are_dropped_like_reasoning() -> None:
    items = [
        {"role": "user", "content": "look"},
        SEARCH_ITEM,
        CODE_ITEM,
        {"role": "assistant", "content": "Zebras are striped."},
        {"role": "user", "content": "thanks"},
    ]
    text = ENCODING.decode(render_request(request(WEB_SEARCH, input=items), now=NOW).token_ids)
    assert "to=browser.search" not in text and "to=python" not in text
    assert "Zebras are striped." in text


def translate(tools: list[dict], harmony: str, **fields: Any) -> list[dict[str, Any]]:
    """The wire events (each validated as the SDK's type) of a completion."""
    body = request(*tools, **fields)
    response = initial_response(body, response_id=new_response_id(), model=MODEL)
    translator = ResponseStreamTranslator(response, ToolRegistry.from_request(body))
    events = translator.start()
    for token in ENCODING.encode(harmony, allowed_special="all"):
        events += translator.feed([token])
    writer = translator.writer
    for item in writer.take_pending_calls():  # as the loop runs them, never run here
        writer.tool_running(item)
        writer.close_tool_call(item, None, "incomplete")
    events += writer.take_events()
    events += translator.finish("stop", prompt_tokens=10, cached_tokens=0)
    wire = []
    for event in events:
        raw = encode_event(event).decode()
        data = raw.split("data: ", 1)[1].strip()
        wire.append(EVENT.validate_json(data).model_dump(exclude_none=True))
    return wire


def test_a_browser_call_opens_a_web_search_call() -> None:
    wire = translate(
        [WEB_SEARCH],
        '<|channel|>analysis to=browser.search code<|message|>{"query": "zebras"}<|call|>',
    )
    types = [event["type"] for event in wire]
    assert types[2:] == [
        "response.output_item.added",
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.output_item.done",
        "response.completed",
    ]
    added, done = wire[2]["item"], wire[5]["item"]
    assert added["type"] == "web_search_call" and added["status"] == "in_progress"
    assert done["action"] == {"type": "search", "query": "zebras"}
    assert done["status"] == "incomplete"  # never run here


def test_a_python_call_streams_its_code() -> None:
    wire = translate(
        [CODE_INTERPRETER], "<|channel|>analysis to=python code<|message|>print(6 * 7)<|call|>"
    )
    types = [event["type"] for event in wire]
    deltas = [e["delta"] for e in wire if e["type"].endswith("call_code.delta")]
    assert "".join(deltas) == "print(6 * 7)" and len(deltas) > 1
    assert types[2:4] == [
        "response.output_item.added",
        "response.code_interpreter_call.in_progress",
    ]
    code_done = next(e for e in wire if e["type"] == "response.code_interpreter_call_code.done")
    assert code_done["code"] == "print(6 * 7)"
    assert types[-4:] == [
        "response.code_interpreter_call_code.done",
        "response.code_interpreter_call.interpreting",
        "response.output_item.done",
        "response.completed",
    ]
    final = wire[-2]["item"]
    assert final["type"] == "code_interpreter_call" and final["code"] == "print(6 * 7)"


def test_without_the_tool_a_browser_recipient_is_no_item() -> None:
    """No web_search in the request: `browser.search` is no tool of it, so the call is shown to
    no one (the tool loop answers it: tests/unit/serving/tools/test_loop.py)."""
    wire = translate([], '<|channel|>analysis to=browser.search code<|message|>{"q":1}<|call|>')
    assert [event["type"] for event in wire] == [
        "response.created",
        "response.in_progress",
        "response.completed",
    ]
    assert wire[-1]["response"]["output"] == []


def test_a_tool_served_without_is_one_line_after_the_identity_said_once() -> None:
    note = "Web search is unavailable on this server."
    omitted = [
        OmittedTool(type=kind, sent={"type": kind}, note=note)
        for kind in ("web_search", "web_search_preview")
    ]
    content = builtin.with_unavailable_notes(SystemContent.new(), [*omitted, object()])
    identity = SystemContent.new().model_identity
    assert content.model_identity == f"{identity}\n{note}"
    text = ENCODING.decode(ENCODING.render(Message.from_role_and_content(Role.SYSTEM, content)))
    assert text.count(note) == 1
    assert "# Tools" not in text  # no tool offered for it
    # Nothing omitted: harmony's system message as it was.
    assert builtin.with_unavailable_notes(SystemContent.new(), []) == SystemContent.new()
