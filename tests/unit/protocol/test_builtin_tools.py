"""web_search, web_search_preview and code_interpreter as the openai SDK types them: parsed,
echoed as the SDK's tools, a wrong field a 400 naming it; web_search_call and
code_interpreter_call items as the SDK writes them are input items."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import (
    ResponseCodeInterpreterToolCall,
    ResponseFunctionWebSearch,
    Tool,
)
from openai.types.responses.tool_param import CodeInterpreter
from openai.types.responses.web_search_preview_tool_param import WebSearchPreviewToolParam
from openai.types.responses.web_search_tool_param import WebSearchToolParam
from pydantic import TypeAdapter, ValidationError

from serve_app.protocol.body_errors import from_validation_errors
from serve_app.protocol.builtin_tools import (
    CodeInterpreterCallItem,
    CodeInterpreterTool,
    WebSearchCallItem,
    WebSearchTool,
)
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.responses import initial_response
from tests.support import MODEL

WEB_SEARCH: WebSearchToolParam = {
    "type": "web_search",
    "filters": {"allowed_domains": ["docs.local"]},
    "search_context_size": "high",
    "user_location": {"type": "approximate", "city": "Paris", "country": "FR"},
    "external_web_access": False,
}
PREVIEW: WebSearchPreviewToolParam = {
    "type": "web_search_preview_2025_03_11",
    "search_context_size": "low",
    "search_content_types": ["text"],
}
CODE: CodeInterpreter = {"type": "code_interpreter", "container": {"type": "auto"}}
CODE_BY_ID: CodeInterpreter = {"type": "code_interpreter", "container": "auto"}


def parse(**body: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": MODEL, "input": "hi", **body})


def test_the_sdks_tools_parse_and_echo_as_the_sdks() -> None:
    request = parse(tools=[WEB_SEARCH, PREVIEW, CODE, CODE_BY_ID])
    assert [type(tool) for tool in request.tools] == [
        WebSearchTool,
        WebSearchTool,
        CodeInterpreterTool,
        CodeInterpreterTool,
    ]
    echoed = initial_response(request, response_id="resp_1", model=MODEL).tools
    sdk = TypeAdapter(list[Tool]).validate_python([WEB_SEARCH, PREVIEW, CODE, CODE_BY_ID])
    assert [tool.model_dump(exclude_none=True) for tool in echoed] == [
        tool.model_dump(exclude_none=True) for tool in sdk
    ]


@pytest.mark.parametrize(
    ("tool", "param"),
    [
        ({"type": "web_search", "search_context_size": "huge"}, "tools[0].search_context_size"),
        ({"type": "web_search", "filters": {"allowed_domains": "x"}},
         "tools[0].filters.allowed_domains"),
        ({"type": "web_search", "user_location": {"type": "exact"}}, "tools[0].user_location.type"),
        ({"type": "code_interpreter"}, "tools[0].container"),
        ({"type": "code_interpreter", "container": {"type": "x"}}, "tools[0].container.type"),
        ({"type": "code_interpreter", "container": 5}, "tools[0].container"),
    ],
)  # fmt: skip
def test_a_wrong_field_is_a_400_naming_it(tool: dict, param: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse(tools=[tool])
    assert from_validation_errors(caught.value.errors()).param == param


SEARCH = ResponseFunctionWebSearch.model_validate(
    {
        "id": "ws_1",
        "type": "web_search_call",
        "status": "completed",
        "action": {"type": "search", "query": "zebras", "sources": [{"type": "url", "url": "u"}]},
    }
)
OPEN = ResponseFunctionWebSearch.model_validate(
    {"id": "ws_2", "type": "web_search_call", "status": "completed",
     "action": {"type": "open_page", "url": "http://docs.local/z.md"}}
)  # fmt: skip
FIND = ResponseFunctionWebSearch.model_validate(
    {"id": "ws_3", "type": "web_search_call", "status": "failed",
     "action": {"type": "find_in_page", "pattern": "z", "url": "http://docs.local/z.md"}}
)  # fmt: skip
CODE_CALL = ResponseCodeInterpreterToolCall.model_validate(
    {"id": "ci_1", "type": "code_interpreter_call", "status": "completed", "code": "print(1)",
     "container_id": "auto", "outputs": [{"type": "logs", "logs": "1\n"},
                                         {"type": "image", "url": "http://x/i.png"}]}
)  # fmt: skip


def test_the_sdks_items_are_input_items() -> None:
    items = [item.model_dump() for item in (SEARCH, OPEN, FIND, CODE_CALL)]
    request = parse(input=items)
    assert [type(item) for item in request.input_items] == [
        WebSearchCallItem,
        WebSearchCallItem,
        WebSearchCallItem,
        CodeInterpreterCallItem,
    ]
    code = request.input_items[3]
    assert isinstance(code, CodeInterpreterCallItem) and code.logs == "1\n"


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"type": "web_search_call", "action": {"type": "search", "query": 5}},
         "input[0].action.query"),
        ({"type": "web_search_call", "action": {"type": "nope"}}, "input[0].action"),
        ({"type": "web_search_call"}, "input[0].action"),
        ({"type": "code_interpreter_call", "code": 1}, "input[0].code"),
        ({"type": "code_interpreter_call", "outputs": [{"type": "logs", "logs": 3}]},
         "input[0].outputs[0].logs"),
    ],
)  # fmt: skip
def test_a_malformed_item_is_a_400_naming_its_field(item: dict, param: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse(input=[item])
    assert from_validation_errors(caught.value.errors()).param == param
