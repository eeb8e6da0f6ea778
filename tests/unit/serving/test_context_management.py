"""Server-side compaction (issue 30 part 1) in-process: the unscripted simulated engine
compacts and continues, and a summary the engine fails to write ends the turn failed. The
scripted turns through the SDK: tests/app/test_context_management.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from openai import InternalServerError

from serve_app.engines.simulated import SimulatedEngineConfig
from tests.support import MODEL
from tests.support.helpers import in_process_api, sdk_client

TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "user", "content": "OLD-TOOL-OUTPUT " + "sunny and warm, " * 300},
    {"role": "user", "content": "CM-ASK: and what should I wear?"},
]
NEXT = {"role": "user", "content": "CM-NEXT: and tomorrow?"}
COMPACT = [{"type": "compaction", "compact_threshold": 1000}]


def as_input(items: list[Any]) -> list[dict[str, Any]]:
    return [item.model_dump(exclude_none=True, warnings=False) for item in items]


async def test_unscripted_turns_compact_too(tmp_path: Path) -> None:
    """The unscripted simulated engine writes a placeholder summary: the turn still compacts,
    answers from it, and the next turn continues from the compaction item."""
    async with in_process_api(tmp_path / "cm.db") as api:
        client = sdk_client(api)
        first = await client.responses.create(
            model=MODEL, input=HISTORY, tools=TOOLS, store=False, context_management=COMPACT
        )
        kinds = [item.type for item in first.output]
        assert kinds[0] == "compaction" and kinds[-1] == "message"  # reasoning may come between
        assert "compaction" not in kinds[1:]
        assert first.status == "completed" and first.output_text
        second = await client.responses.create(
            model=MODEL,
            input=[*as_input(first.output), NEXT],
            tools=TOOLS,
            store=False,
            context_management=COMPACT,
        )
        assert [item.type for item in second.output][-1] == "message"
        assert "compaction" not in [item.type for item in second.output]


async def test_a_summary_that_fails_ends_the_turn_failed(tmp_path: Path) -> None:
    """The engine fails while writing the summary: the stream ends in ``response.failed``
    with the engine's error (after the compaction item was announced), the non-streamed
    request is a 500 in OpenAI's shape; nothing hangs."""
    script = {"turns": [{"match": "Context compaction:", "items": [{"fail": "summary fault"}]}]}
    engine = SimulatedEngineConfig(script=script, decode_tokens_per_s=50_000)
    async with in_process_api(tmp_path / "cm.db", engine=engine) as api:
        client = sdk_client(api)
        stream = await client.responses.create(
            model=MODEL, input=HISTORY, tools=TOOLS, stream=True, context_management=COMPACT
        )
        events = [event async for event in stream]
        kinds = [event.type for event in events]
        assert kinds[2] == "response.output_item.added" and events[2].item.type == "compaction"
        assert kinds[-1] == "response.failed" and kinds.count("response.failed") == 1
        failed = events[-1].response
        assert failed.error.code == "server_error" and "summary fault" in failed.error.message
        assert "response.output_item.done" not in kinds
        with pytest.raises(InternalServerError) as error:
            await client.responses.create(
                model=MODEL, input=HISTORY, tools=TOOLS, context_management=COMPACT
            )
        assert error.value.body["code"] == "server_error"
        # Stored as it ended (as any failed response): failed, no half compaction in it.
        stored = await client.responses.retrieve(failed.id)
        assert stored.status == "failed" and stored.output == []
