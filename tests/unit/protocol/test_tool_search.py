"""The server's search (serve_app/protocol/tool_search.py): deterministic, over deferred tools
only, by `paths` or a ranked `query`, members grouped under their namespace."""

from __future__ import annotations

import json
from typing import Any

from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.tool_search import MAX_FOUND, search, searchable_lines


def _tools(*tools: dict[str, Any]) -> list[Any]:
    return ResponsesRequest.model_validate({"model": "m", "tools": list(tools)}).tools


def _fn(name: str, description: str = "", deferred: bool = True, **parameters: Any) -> dict:
    properties = {key: {"type": "string", "description": text} for key, text in parameters.items()}
    return {
        "type": "function",
        "name": name,
        "description": description,
        "parameters": {"type": "object", "properties": properties},
        "defer_loading": deferred,
    }


CRM = {
    "type": "namespace",
    "name": "crm",
    "description": "Customer records.",
    "tools": [
        {**_fn("lookup_customer", "Find a customer."), "defer_loading": True},
        {**_fn("delete_customer", "Remove a customer."), "defer_loading": True},
        _fn("list_regions", "Regions.", deferred=False),
    ],
}
TOOLS = _tools(
    _fn("get_weather", "Current weather in a city.", city="City name"),
    _fn("get_forecast", "Forecast for tomorrow.", place="where the weather is wanted"),
    _fn("send_invoice", "Send an invoice by mail."),
    _fn("shown_tool", "Weather too, but shown.", deferred=False),
    CRM,
)


def _names(found: list[dict[str, Any]]) -> list[str]:
    names = []
    for tool in found:
        if tool["type"] == "namespace":
            names += [f"{tool['name']}.{inner['name']}" for inner in tool["tools"]]
        else:
            names.append(tool["name"])
    return names


def test_a_query_ranks_by_name_then_description_then_parameters() -> None:
    found = search(TOOLS, json.dumps({"query": "weather"}))
    # Name words count most; a shown tool is never found (it is shown already); the result
    # keeps the request's order.
    assert _names(found) == ["get_weather", "get_forecast"]
    assert found[0] == {**TOOLS[0].model_dump(exclude_none=True)}


def test_paths_load_namespaces_and_tools_by_name() -> None:
    found = search(TOOLS, json.dumps({"paths": ["crm", "send_invoice"]}))
    assert _names(found) == ["send_invoice", "crm.lookup_customer", "crm.delete_customer"]
    assert found[1]["description"] == "Customer records."
    assert _names(search(TOOLS, json.dumps({"paths": ["crm.delete_customer"]}))) == [
        "crm.delete_customer"
    ]


def test_a_search_is_deterministic_and_bounded() -> None:
    many = _tools(*(_fn(f"tool_{n}", "does a thing") for n in range(20)))
    first = search(many, '{"query": "thing"}')
    assert first == search(many, '{"query": "thing"}')
    assert _names(first) == [f"tool_{n}" for n in range(MAX_FOUND)]


def test_bad_arguments_still_answer() -> None:
    assert search(TOOLS, "") == []
    assert search(TOOLS, "[1, 2]") == []
    assert _names(search(TOOLS, "invoice please")) == ["send_invoice"]  # not JSON: a query
    assert search(TOOLS, '{"query": "nothing matches zzz"}') == []


def test_the_model_sees_names_and_descriptions_never_parameters() -> None:
    lines = searchable_lines(TOOLS)
    assert lines == [
        "- get_weather: Current weather in a city.",
        "- get_forecast: Forecast for tomorrow.",
        "- send_invoice: Send an invoice by mail.",
        "- crm (namespace): Customer records.",
    ]


def test_the_best_matches_win_the_places() -> None:
    # Six tools mention the word only in their parameters, one in its description, one in its
    # name (listed last): the five places go to the name, the description, then the first
    # three by order.
    plain = [_fn(f"tool_{n}", "unrelated", arg="weather") for n in range(6)]
    tools = _tools(*plain, _fn("about", "the weather"), _fn("weather_now"))
    found = _names(search(tools, '{"query": "weather"}'))
    assert found == ["tool_0", "tool_1", "tool_2", "about", "weather_now"]
