"""The history the compaction tests compact (tests/app/test_compaction.py, /v1/responses/compact;
tests/app/test_context_management.py, server-side compaction): a weather tool call with a long
output (about 1,000 tokens: what compaction takes out of the prompt), then the assistant's
answer. The scripted engine writes the summary for any "Context compaction:" request
(tests/fixtures/engine_script.yaml)."""

from __future__ import annotations

from typing import Any

TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
OLD_OUTPUT = "OLD-TOOL-OUTPUT " + "sunny and warm, " * 300
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "type": "function_call",
        "call_id": "call_w",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    },
    {"type": "function_call_output", "call_id": "call_w", "output": OLD_OUTPUT},
    {"role": "assistant", "content": "OLD-ANSWER: it is sunny."},
]
