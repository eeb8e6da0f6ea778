"""LangChain's `ChatOpenAI` (langchain-openai, `use_responses_api=True`) against the app.

The scripted engine plays the model (the turns marked LANGCHAIN- in
tests/fixtures/engine_script.yaml). Each test checks what a LangChain user gets back (the
message's text, its tool calls, the parsed object, the reasoning blocks) and the few request
fields that make the test mean what it says (streamed or not, `text.format`, `reasoning`).

What LangChain sends (docs/protocol.md, "Other clients"): `input` as typed `message` items, no
`store` (so the default, stored), no `instructions`; the tool loop sends the whole history back,
its reasoning items with their ids and `reasoning_text` content; `with_structured_output(...,
method="json_schema", strict=True)` is `text.format` with Pydantic's schema, `$defs` and `anyOf`
null included. It shows reasoning only from summaries (`content_blocks`), so it must ask for them.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from tests.support import API_KEY, MODEL
from tests.support.helpers import recording_http_client

HELLO = "Hello from the scripted engine, through LangChain."
CHAIN_OF_THOUGHT = "s-t-r-a-w-b-e-r-r-y: one r after t, two after e, so three."


def chat_model(app_url: str, bodies: list[dict[str, Any]], **options: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model=MODEL,
        base_url=f"{app_url}/v1",
        api_key=API_KEY,
        use_responses_api=True,
        max_retries=0,
        http_client=recording_http_client(bodies),
        **options,
    )


def streamed(model: Any, messages: Any) -> tuple[list[AIMessage], AIMessage]:
    """The chunks of ``model.stream(messages)`` and the message they add up to."""
    chunks = list(model.stream(messages))
    total = chunks[0]
    for chunk in chunks[1:]:
        total += chunk
    return chunks, total


def item_types(body: dict[str, Any]) -> list[str]:
    return [item.get("type", "message") for item in body["input"]]


def test_plain_turn(app_url: str) -> None:
    bodies: list[dict[str, Any]] = []
    message = chat_model(app_url, bodies).invoke("LANGCHAIN-HELLO: say hello")
    assert message.text == HELLO
    assert message.tool_calls == []
    assert message.id.startswith("resp_")
    assert message.response_metadata["status"] == "completed"
    usage = message.usage_metadata
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["output_token_details"]["reasoning"] > 0
    (body,) = bodies
    assert body["stream"] is False and "store" not in body
    assert item_types(body) == ["message"]


def test_plain_turn_streamed(app_url: str) -> None:
    bodies: list[dict[str, Any]] = []
    chunks, message = streamed(chat_model(app_url, bodies), "LANGCHAIN-HELLO: say hello")
    # The text came in deltas (LangChain's chunks take text from `output_text.delta` only; how
    # many depends on how the engine's tokens were batched) among the stream's other events.
    pieces = [chunk.text for chunk in chunks if chunk.text]
    assert pieces and len(chunks) > len(pieces)
    assert "".join(pieces) == message.text == HELLO
    assert message.id.startswith("resp_")
    assert message.usage_metadata["output_tokens"] > 0
    (body,) = bodies
    assert body["stream"] is True


@tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    return f"LANGCHAIN-WEATHER {city.upper()}: snow, -3 degrees"


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
def test_tool_call_round_trip(app_url: str, stream: bool) -> None:
    bodies: list[dict[str, Any]] = []
    model = chat_model(app_url, bodies).bind_tools([get_weather])
    messages: list[BaseMessage] = [HumanMessage("LANGCHAIN-TOOL: what is the weather in Oslo?")]

    call = streamed(model, messages)[1] if stream else model.invoke(messages)
    assert [(c["name"], c["args"]) for c in call.tool_calls] == [("get_weather", {"city": "Oslo"})]
    assert call.tool_calls[0]["id"].startswith("call_")
    assert call.text == ""
    # The ToolMessage goes back with the call, as a LangChain agent loop does.
    messages += [call, get_weather.invoke(call.tool_calls[0])]
    answer = streamed(model, messages)[1] if stream else model.invoke(messages)
    assert answer.text == "It is snowing in Oslo: -3 degrees."
    assert answer.tool_calls == []

    first, second = bodies
    assert [t["name"] for t in first["tools"]] == ["get_weather"]
    # The whole history again: the reasoning item (with its id and text), the call, its output.
    assert item_types(second) == ["message", "reasoning", "function_call", "function_call_output"]
    output = second["input"][3]
    assert output["output"] == "LANGCHAIN-WEATHER OSLO: snow, -3 degrees"
    assert output["call_id"] == call.tool_calls[0]["id"]


class Work(BaseModel):
    title: str
    year: int


class Author(BaseModel):
    """An author and their works."""

    name: str = Field(description="Full name")
    born: int
    died: int | None
    works: list[Work]


def test_structured_output_with_a_strict_json_schema(app_url: str) -> None:
    bodies: list[dict[str, Any]] = []
    model = chat_model(app_url, bodies).with_structured_output(
        Author, method="json_schema", strict=True
    )
    author = model.invoke("LANGCHAIN-AUTHOR: who wrote the first published program?")
    assert author == Author(
        name="Ada Lovelace",
        born=1815,
        died=1852,
        works=[Work(title="Notes on the Analytical Engine", year=1843)],
    )
    (body,) = bodies
    format_ = body["text"]["format"]
    assert (format_["type"], format_["name"], format_["strict"]) == ("json_schema", "Author", True)
    # Pydantic's schema as it writes it: the nested model under $defs, the optional field as
    # anyOf with null. The app's strict check takes it (a 400 otherwise).
    assert "Work" in format_["schema"]["$defs"]
    assert {"type": "null"} in format_["schema"]["properties"]["died"]["anyOf"]


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
def test_reasoning_shown_from_summaries(app_url: str, stream: bool) -> None:
    bodies: list[dict[str, Any]] = []
    model = chat_model(app_url, bodies, reasoning={"effort": "low", "summary": "auto"})
    prompt = "LANGCHAIN-THINK: how many r's in strawberry?"
    message = streamed(model, prompt)[1] if stream else model.invoke(prompt)
    blocks = message.content_blocks
    assert [block["type"] for block in blocks] == ["reasoning", "text"]
    # LangChain's reasoning text is the summary: the chain of thought as the model wrote it.
    assert blocks[0]["reasoning"] == CHAIN_OF_THOUGHT
    assert message.text == "Strawberry has three r's."
    assert bodies[0]["reasoning"] == {"effort": "low", "summary": "auto"}


def test_reasoning_not_shown_without_summaries(app_url: str) -> None:
    """Without `summary` LangChain keeps the reasoning item but shows no reasoning text: the
    app sends the chain of thought as `content` only, as OpenAI does."""
    bodies: list[dict[str, Any]] = []
    message = chat_model(app_url, bodies).invoke("LANGCHAIN-THINK: how many r's in strawberry?")
    reasoning = message.content_blocks[0]
    assert reasoning["type"] == "reasoning" and "reasoning" not in reasoning
    assert message.text == "Strawberry has three r's."
