"""Spec-complete Response objects, reasoning summaries, max_tool_calls and truncation, through
the openai SDK and the wire.

The ``app_url`` tests run against the app (the real one on Ray in CI, or
``python -m tests.local_app``) with the scripted turns marked ``SUM-`` in
tests/fixtures/engine_script.yaml. Tests that need other app args (``reasoning_summary: none``,
a small context) run the ingress app in-process. Every Response and event read here is also
checked against the Open Responses specification when it is on this machine
(tests/support/open_responses.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest

from serve_app.config import AppArgs
from serve_app.engines.base import GenerateChunk, GenerateRequest
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.harmony.tools import ToolRegistry
from serve_app.harmony.truncation import truncate_to_fit
from serve_app.protocol.requests import ResponsesRequest
from serve_app.serving.engine.client import InProcessEngineClient
from serve_app.serving.ingress import create_api
from serve_app.store.sql import SqlResponseStore
from tests.support import ENGINE_SCRIPT, MODEL
from tests.support.helpers import EXEC_TOOL, decode, in_process_api, sdk_client
from tests.support.open_responses import check_spec


async def stream_summary(api: Any) -> tuple[list[str], Any]:
    async with sdk_client(api).responses.stream(
        model=MODEL, input="hello", reasoning={"effort": "low", "summary": "detailed"}
    ) as stream:
        types = [event.type async for event in stream]
        return types, await stream.get_final_response()


async def test_operators_can_keep_summaries_empty(tmp_path: Path) -> None:
    async with in_process_api(tmp_path / "on.db") as api:
        types, final = await stream_summary(api)
    assert "response.reasoning_summary_text.delta" in types
    assert final.output[0].summary[0].text == final.output[0].content[0].text
    async with in_process_api(tmp_path / "off.db", AppArgs(reasoning_summary="none")) as api:
        types, final = await stream_summary(api)
    assert not [t for t in types if "reasoning_summary" in t]
    assert final.output[0].type == "reasoning" and final.output[0].summary == []
    assert final.output[0].content  # the chain of thought still reaches `content` readers


# --- max_tool_calls ------------------------------------------------------------------------


class RecordingEngineClient:
    """An in-process engine client that records how each engine stream ended."""

    def __init__(self, inner: InProcessEngineClient) -> None:
        self._inner = inner
        self.finishes: list[str | None] = []

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        finish = None
        try:
            async for chunk in self._inner.stream(request):
                finish = chunk.finish_reason
                yield chunk
        finally:
            self.finishes.append(finish)


async def test_the_engine_request_ends_at_the_last_call_allowed(tmp_path: Path) -> None:
    store = SqlResponseStore(f"sqlite+aiosqlite:///{tmp_path / 'calls.db'}")
    await store.start()
    # Slow enough that the turn comes in many chunks.
    engine = SimulatedEngine(SimulatedEngineConfig(script=str(ENGINE_SCRIPT)))
    await engine.start()
    engines = RecordingEngineClient(InProcessEngineClient(engine))
    api = create_api(AppArgs(), engines, ReasoningVault("k"), store)  # type: ignore[arg-type]
    body: dict[str, Any] = {"model": MODEL, "input": "SUM-CALLS go", "tools": [EXEC_TOOL]}
    try:
        client = sdk_client(api)
        whole = await client.responses.create(**body)
        bounded = await client.responses.create(**body, max_tool_calls=1)
    finally:
        await engine.shutdown()
        await store.close()
    # The bounded request was closed before the engine finished the turn (which aborts it).
    assert engines.finishes == ["stop", None]
    assert whole.usage is not None and bounded.usage is not None
    assert bounded.usage.output_tokens < whole.usage.output_tokens


# --- truncation ----------------------------------------------------------------------------

INSTRUCTIONS = "You are the TRUNC-INSTRUCTIONS assistant."


def long_conversation(turns: int) -> list[dict[str, Any]]:
    """Developer instructions, then user/assistant turns with a tool call, then the task."""
    items: list[dict[str, Any]] = [{"role": "developer", "content": INSTRUCTIONS}]
    for turn in range(turns):
        words = " ".join(f"turn{turn}-word{i}" for i in range(40))
        items.append({"role": "user", "content": f"OLD-{turn} {words}"})
        items.append({"role": "assistant", "content": f"answer {turn} {words}"})
        if turn == 0:
            items.append(
                {"type": "function_call", "call_id": "call_0", "name": "exec_command",
                 "arguments": '{"cmd":"ls"}'}
            )  # fmt: skip
            items.append({"type": "function_call_output", "call_id": "call_0", "output": "a b"})
    items.append({"role": "user", "content": "NEWEST-TASK: say hi"})
    return items


def rendered(items: list[dict[str, Any]], fits_below: int) -> tuple[str, int]:
    """The prompt ``truncate_to_fit`` makes of ``items``, and its length in tokens."""
    request = ResponsesRequest.model_validate(
        {"model": MODEL, "input": items, "tools": [EXEC_TOOL]}
    )
    prompt = truncate_to_fit(request, request.input_items, lambda tokens: tokens <= fits_below)
    return decode(prompt.token_ids), len(prompt.token_ids)


def test_truncation_drops_the_oldest_items_first() -> None:
    items = long_conversation(6)
    whole, length = rendered(items, fits_below=10**9)
    assert all(f"OLD-{turn} " in whole for turn in range(6))
    prompt, shorter = rendered(items, fits_below=length * 6 // 10)
    assert shorter <= length * 6 // 10
    kept = [turn for turn in range(6) if f"OLD-{turn} " in prompt]
    assert kept and kept == list(range(kept[0], 6)) and kept[0] > 0  # the newest turns
    # As few dropped as fit: one more turn would not.
    assert shorter > length * 6 // 10 - 2 * length // 6
    assert INSTRUCTIONS in prompt and "NEWEST-TASK" in prompt


def test_truncation_keeps_the_instructions_and_the_task_when_nothing_fits() -> None:
    prompt, _ = rendered(long_conversation(3), fits_below=1)
    assert INSTRUCTIONS in prompt and "NEWEST-TASK" in prompt
    assert "OLD-" not in prompt and "answer " not in prompt


@pytest.mark.parametrize("limit_tokens", range(200, 1200, 50))
def test_truncation_keeps_calls_with_their_outputs(limit_tokens: int) -> None:
    prompt, _ = rendered(long_conversation(3), fits_below=limit_tokens)
    # The call (`to=functions.exec_command`) and its output (from `functions.exec_command`)
    # are dropped together.
    has_call = '{"cmd":"ls"}' in prompt
    has_output = "<|start|>functions.exec_command" in prompt
    assert has_call == has_output
    assert INSTRUCTIONS in prompt and "NEWEST-TASK" in prompt


async def test_truncation_auto_fits_a_conversation_that_disabled_refuses(tmp_path: Path) -> None:
    args = AppArgs(max_context_tokens=900, default_max_output_tokens=64)
    body: dict[str, Any] = {"model": MODEL, "input": long_conversation(8), "tools": [EXEC_TOOL]}
    async with in_process_api(tmp_path / "t.db", args) as api:
        client = sdk_client(api)
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(**body)
        assert caught.value.code == "context_length_exceeded"
        response = await client.responses.create(**body, truncation="auto")
    assert response.status == "completed" and response.truncation == "auto"
    assert response.usage is not None
    # Room was left for the output allowance, as OpenAI leaves it.
    assert response.usage.input_tokens + 64 <= 900
    check_spec(response.to_dict())


async def test_truncation_auto_leaves_a_fitting_prompt_alone(tmp_path: Path) -> None:
    body: dict[str, Any] = {"model": MODEL, "input": long_conversation(2), "tools": [EXEC_TOOL]}
    async with in_process_api(tmp_path / "t.db") as api:
        client = sdk_client(api)
        whole = await client.responses.create(**body)
        auto = await client.responses.create(**body, truncation="auto")
    assert whole.usage is not None and auto.usage is not None
    assert auto.usage.input_tokens == whole.usage.input_tokens


async def test_a_requests_tools_are_built_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The door builds the request's tools once and rendering, truncation's every try included,
    uses them."""
    args = AppArgs(max_context_tokens=900, default_max_output_tokens=64)
    builds: list[object] = []
    build = ToolRegistry.from_request.__func__  # type: ignore[attr-defined]

    def counted(cls: type[ToolRegistry], *given: Any, **named: Any) -> ToolRegistry:
        builds.append(given[0])
        return build(cls, *given, **named)

    monkeypatch.setattr(ToolRegistry, "from_request", classmethod(counted))
    body: dict[str, Any] = {"model": MODEL, "input": long_conversation(8), "tools": [EXEC_TOOL]}
    async with in_process_api(tmp_path / "t.db", args) as api:
        response = await sdk_client(api).responses.create(**body, truncation="auto")
    assert response.status == "completed"
    assert len(builds) == 1


async def test_one_tenants_prompt_is_no_cache_hit_for_another(two_keys_api) -> None:
    """Two API keys send the same long prompt under the same ``prompt_cache_key``: the second
    key's first turn finds nothing cached (each key's prompts are cached under its own salt),
    while each key's repeat is served from its own cache."""
    alice, bob = sdk_client(two_keys_api, "key-alice"), sdk_client(two_keys_api, "key-bob")
    body = {"model": MODEL, "input": "One shared document. " * 200, "prompt_cache_key": "same"}

    async def cached(client: openai.AsyncOpenAI) -> tuple[int, int]:
        usage = (await client.responses.create(**body)).usage
        return usage.input_tokens_details.cached_tokens, usage.input_tokens

    assert (await cached(alice))[0] == 0
    hit, tokens = await cached(alice)
    assert tokens - 16 <= hit < tokens  # the same key's repeat: all but the last partial block
    assert await cached(bob) == (0, tokens)
    assert await cached(bob) == (hit, tokens)
