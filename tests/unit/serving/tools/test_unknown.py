"""What the model reads of a call of a tool the request does not have
(serve_app/serving/tools/unknown.py); the loop's part: tests/unit/serving/tools/test_loop.py."""

from __future__ import annotations

from typing import Any

from serve_app.harmony.items import UnknownCall
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol.requests import ResponsesRequest
from serve_app.serving.tools.unknown import (
    LISTED_CHARS,
    NAME_CHARS,
    answer_tokens,
    unknown_tool_error,
)
from tests.support import MODEL
from tests.support.helpers import decode


def registry(**body: Any) -> ToolRegistry:
    return ToolRegistry.from_request(
        ResponsesRequest.model_validate({"model": MODEL, "input": "x", **body})
    )


def function(name: str) -> dict[str, Any]:
    return {"type": "function", "name": name}


def test_the_error_names_the_tools_as_the_model_calls_them() -> None:
    tools = registry(
        tools=[
            function("get_weather"),
            {"type": "namespace", "name": "repo", "description": "r", "tools": [function("ls")]},
        ]
    )
    assert unknown_tool_error("repo_browser.search", tools) == (
        'No tool named "repo_browser.search" is available. '
        "Available tools: functions.get_weather, repo.ls."
    )


def test_a_request_without_tools_is_said_so() -> None:
    assert unknown_tool_error("functions.x", registry()) == (
        'No tool named "functions.x" is available. This request offers no tools: answer '
        "without calling one."
    )


def test_only_the_tools_allowed_are_listed() -> None:
    tools = registry(
        tools=[function("a"), function("b")],
        tool_choice={"type": "allowed_tools", "mode": "auto", "tools": [function("b")]},
    )
    assert unknown_tool_error("x", tools).endswith("Available tools: functions.b.")


def test_the_error_is_bounded_however_many_tools_and_however_long_the_name() -> None:
    tools = registry(tools=[function(f"tool_number_{index:03d}") for index in range(300)])
    error = unknown_tool_error("n" * 5000, tools)
    assert len(error) < LISTED_CHARS + NAME_CHARS + 100
    assert "functions.tool_number_000, " in error
    listed = error.count("functions.tool_number_")
    assert error.endswith(f"(and {300 - listed} more).") and 0 < listed < 300


def test_the_answer_is_the_recipients_tool_message_on_the_calls_channel() -> None:
    call = UnknownCall("functions.gone", "commentary", 0)
    assert decode(answer_tokens(call, "No.")) == (
        "<|start|>functions.gone<|channel|>commentary to=assistant<|message|>Error: No.<|end|>"
    )
