"""The openai JS SDK with ``moderation`` (tests/js/moderation_scenarios.mjs): what it sends is
accepted, and every Response and stream event it returns is exactly the openai SDK's type
(validated here with the Python SDK's types; the JS SDK reads them through its own). The app
runs in this process over real HTTP, with the simulated engine playing gpt-oss-safeguard
(tests/fixtures/moderation_script.yaml): the session app serves no moderation model."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from serve_app.config import AppArgs, EngineConfig, ModerationArgs
from serve_app.engines.simulated import SimulatedEngineConfig
from tests.support import MODERATION_SCRIPT, js_scenarios
from tests.support.helpers import in_process_api, on_uvicorn

RESPONSE: TypeAdapter[Any] = TypeAdapter(Response)
EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
VIOLENT = " ".join(f"word{i}" for i in range(60)) + " MOD-VIOLENT I will hurt him. " * 40


async def test_the_js_sdk_moderates(tmp_path: Path) -> None:
    args = AppArgs(
        moderation=ModerationArgs(
            engine=EngineConfig(options={"script": str(MODERATION_SCRIPT)}),
            output_window_tokens=32,
        )
    )
    turns = {
        "turns": [
            {"match": "TELL-VIOLENT", "items": [{"text": VIOLENT + " TAIL-SENTINEL"}]},
            {"items": [{"text": "Hello there."}]},
        ]
    }
    engine = SimulatedEngineConfig(script=turns, decode_tokens_per_s=300)
    async with in_process_api(tmp_path / "db", args, engine=engine) as api, on_uvicorn(api) as url:
        output = await asyncio.to_thread(
            js_scenarios.run, "moderation_scenarios.mjs", "moderation", url
        )
    result = output["result"]
    for name in ("scored", "inputBlocked", "failed"):
        RESPONSE.validate_python(result[name])
    for event in result["events"]:
        EVENT.validate_python(event)
    assert result["read"] == {
        "scoredInput": "moderation_result",
        "flagged": True,
        "reason": "content_filter",
        "failedCode": "moderation_failed",
    }
    assert result["inputBlocked"]["output"] == []
    final = result["events"][-1]
    assert final["type"] == "response.incomplete"
    assert final["response"]["incomplete_details"] == {"reason": "content_filter"}
    assert final["response"]["moderation"]["output"]["flagged"] is True
    assert "TAIL-SENTINEL" not in str(final["response"]["output"])
    assert result["refused"] == {
        "status": 400,
        "param": "moderation.policy.input.mode",
        "type": "invalid_request_error",
    }
