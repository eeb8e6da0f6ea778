"""``moderation`` on the running app (Ray Serve): the ingress reaches the moderation model's
own deployment (``ModerationEngine``, the simulated engine playing gpt-oss-safeguard with
tests/fixtures/moderation_script.yaml) through its handle. Every mode and failure in this
process: tests/unit/serving/test_moderation.py."""

from __future__ import annotations

import httpx
from openai import OpenAI
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.support import API_KEY, MODEL
from tests.support.traffic import sse_events

CLASSIFIER = "gpt-oss-safeguard-20b"


def test_both_sides_are_scored_by_the_moderation_deployment(client: OpenAI) -> None:
    response = client.responses.create(
        model=MODEL, input="MOD-VIOLENT: I will hurt him.", moderation={"model": CLASSIFIER}
    )
    assert response.status == "completed"
    assert response.moderation is not None
    judged = response.moderation.input
    assert judged.type == "moderation_result" and judged.flagged
    assert judged.categories["violence"] and judged.category_scores["violence"] == 0.93
    assert response.moderation.output.type == "moderation_result"


def test_a_flagged_input_under_block_streams_no_output(app_url: str) -> None:
    body = {
        "model": MODEL,
        "input": "MOD-VIOLENT: I will hurt him.",
        "stream": True,
        "moderation": {"model": CLASSIFIER, "policy": {"input": {"mode": "block"}}},
    }
    answer = httpx.post(
        f"{app_url}/v1/responses",
        json=body,
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    events = list(sse_events(answer.text))
    for event in events:
        TypeAdapter(ResponseStreamEvent).validate_python(event)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.incomplete",
    ]
    final = TypeAdapter(Response).validate_python(events[-1]["response"])
    assert final.incomplete_details is not None
    assert final.incomplete_details.reason == "content_filter"
    assert final.output == []
