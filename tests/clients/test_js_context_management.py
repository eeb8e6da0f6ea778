"""Server-side compaction (issue 30 part 1) through the JavaScript clients: the Agents JS
SDK's ``modelSettings.contextManagement`` (stateless from ``result.history``, and chained by
``previousResponseId``) and the openai JS SDK's ``context_management`` on a stream
(tests/js/context_and_numbers_scenarios.mjs, played by the scripted engine turns of
tests/fixtures/engine_script.yaml)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import js_scenarios

RESUMED = "Resuming from the summary: Paris is sunny."
THRESHOLD = 1000  # the scenarios' long input renders to about 1,300 tokens

SCRIPT = "context_and_numbers_scenarios.mjs"
COMPACT_SENT = [{"type": "compaction", "compact_threshold": THRESHOLD}]


def input_kinds(request: dict[str, Any]) -> list[str]:
    return [item.get("type") or item["role"] for item in request["body"]["input"]]


@pytest.mark.parametrize("scenario", ["agents-stateless", "agents-chained"])
def test_agents_js_context_management(app_url: str, scenario: str) -> None:
    """The Agents JS SDK's ``modelSettings.contextManagement``: the first run comes back
    compacted and answered from the summary; the second, from result.history (stateless) or
    by previousResponseId with only the new message, is not compacted again."""
    output = js_scenarios.run(SCRIPT, scenario, app_url)
    result, sent = output["result"], output["requests"]
    assert result["first"] == {"output": ["compaction", "message"], "finalOutput": RESUMED}
    assert "compaction" not in result["second"]["output"]
    assert [request["status"] for request in sent] == [200, 200]
    assert all(request["body"]["context_management"] == COMPACT_SENT for request in sent)
    if scenario == "agents-stateless":
        # The SDK sends the compaction item back (and drops what came before it itself).
        assert input_kinds(sent[1])[0] == "compaction" and sent[1]["body"]["store"] is False
    else:
        assert input_kinds(sent[1]) == ["user"] and sent[1]["body"]["previous_response_id"]


def test_openai_js_stream_with_context_management(app_url: str) -> None:
    result = js_scenarios.run(SCRIPT, "openai-stream", app_url)["result"]
    events = result["events"]
    assert [event["type"] for event in events[:3]] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
    ]
    assert events[2]["item_type"] == "compaction" and events[2]["output_index"] == 0
    done = next(i for i, event in enumerate(events) if event["type"] == "response.output_item.done")
    assert {event["type"] for event in events[3:done]} == {"response.compaction.compacting"}
    assert events[done]["item_type"] == "compaction" and events[done]["encrypted"] > 0
    assert events[done + 1]["output_index"] == 1
    assert result["output"] == ["compaction", "message"]


def test_agents_js_compaction_session(app_url: str) -> None:
    """The Agents JS SDK's ``OpenAIResponsesCompactionSession``: after the first run it compacts
    the session's history (``responses.compact`` by previous_response_id) and keeps the user's
    message and one compaction item; the next run sends the compaction item and its new message,
    and the app opens it. (The SDK compacts no more after that run: the history it keeps begins
    with the first message, which that run did not send.)"""
    output = js_scenarios.run(SCRIPT, "agents-compaction-session", app_url)
    result, sent = output["result"], output["requests"]
    assert result["finalOutputs"] == ["Hello from the scripted engine.", "Hi there."]
    assert result["kept"][0] == ["message", "compaction"]
    assert [(request["path"], request["status"]) for request in sent] == [
        ("/v1/responses", 200),
        ("/v1/responses/compact", 200),
        ("/v1/responses", 200),
    ]
    assert input_kinds(sent[2]) == ["compaction", "user"]
