"""What deferred tools save and what the server's search costs, in this process (no app):

    PYTHONPATH=. python loadtests/bench_tool_search.py

Prints the prompt tokens of a request (the count `/v1/responses/input_tokens` answers) with no
tools, with `tool_search` alone, with a function shown or deferred, and with 100 functions of 8
parameters shown or deferred behind `tool_search`; then the CPU of one search over 500 deferred
tools, the first time their words are read and once cached.
"""

from __future__ import annotations

import time
from typing import Any

from serve_app.harmony.render import render_request
from serve_app.protocol import tool_search
from serve_app.protocol.requests import ResponsesRequest

MODEL = "gpt-oss-120b"
SEARCH = {"type": "tool_search"}


def _function(name: str, parameters: int, deferred: bool) -> dict[str, Any]:
    properties = {
        f"p{index}": {"type": "string", "description": "a parameter of some length"}
        for index in range(parameters)
    }
    return {
        "type": "function",
        "name": name,
        "description": f"Does thing {name}.",
        "parameters": {"type": "object", "properties": properties},
        "defer_loading": deferred,
    }


def tokens(tools: list[dict[str, Any]]) -> int:
    request = ResponsesRequest.model_validate({"model": MODEL, "input": "hi", "tools": tools})
    return len(render_request(request).token_ids)


def search_ms(count: int, rounds: int = 20) -> tuple[float, float]:
    tools = [_function(f"tool_{index}", 8, deferred=True) for index in range(count)]
    parsed = ResponsesRequest.model_validate({"model": MODEL, "tools": [SEARCH, *tools]}).tools
    tool_search._words.cache_clear()
    began = time.perf_counter()
    tool_search.search(parsed, '{"query": "thing 42 parameter"}')
    first = (time.perf_counter() - began) * 1000
    began = time.perf_counter()
    for _ in range(rounds):
        tool_search.search(parsed, '{"query": "thing 42 parameter"}')
    return first, (time.perf_counter() - began) * 1000 / rounds


def main() -> None:
    print(f"no tools: {tokens([])} tokens; tool_search alone: {tokens([SEARCH])}")
    print(
        f"one function shown: {tokens([SEARCH, _function('f', 1, False)])}; "
        f"deferred: {tokens([SEARCH, _function('f', 1, True)])}"
    )
    shown = [_function(f"tool_{index}", 8, False) for index in range(100)]
    deferred = [_function(f"tool_{index}", 8, True) for index in range(100)]
    print(f"100 functions shown: {tokens(shown)}; deferred: {tokens([SEARCH, *deferred])}")
    first, cached = search_ms(500)
    print(f"one search over 500 deferred tools: {first:.1f} ms first, {cached:.1f} ms cached")


if __name__ == "__main__":
    main()
