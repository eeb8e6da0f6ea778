"""Blobs sealed on one ingress replica open on every other (issue 38): the session app runs two
ingress replicas with no reasoning key set, so they share the key the deployment generated in
its store (serve_app/serving/reasoning_keys.py). With a key per replica, about half of these
requests were refused (a compaction item) or rendered without their reasoning (a sealed
reasoning item).

Each request goes on a connection of its own (a kept-alive connection stays on one replica
behind HAProxy), and the test checks that both replicas answered (``x-serve-app-replica``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tests.support import MODEL
from tests.support.weather_history import HISTORY, TOOLS

REQUESTS = 16
HEADERS = {"Authorization": "Bearer sk-test"}
REPLICA_HEADER = "x-serve-app-replica"
QUESTION = {"role": "user", "content": "SDK-TOOL: weather in Paris?"}


def post(url: str, body: dict[str, Any]) -> httpx.Response:
    # A client per request: a new connection each time, routed afresh.
    with httpx.Client(headers=HEADERS, timeout=60) as client:
        return client.post(url, json=body)


def made_by_the_app(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """What the app answers ``body`` (a blob it seals). Tried up to three times: on a loaded
    machine the engine may be reported silent (a 500), which is not what this file tests."""
    for _ in range(3):
        answer = post(url, body)
        if answer.status_code < 500:
            break
    assert answer.status_code == 200, answer.text
    return answer.json()


def post_many(url: str, body: dict[str, Any]) -> list[httpx.Response]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda _: post(url, body), range(REQUESTS)))


def assert_both_replicas_served(answers: list[httpx.Response]) -> None:
    served = {answer.headers[REPLICA_HEADER] for answer in answers}
    # "local": the one process of tests/local_app.py (SERVE_APP_TEST_URL), no replicas.
    assert served == {"local"} or len(served) >= 2, f"all went to one replica: {served}"


def test_a_compaction_item_opens_on_every_ingress_replica(app_url: str) -> None:
    made = made_by_the_app(
        f"{app_url}/v1/responses/compact", {"model": MODEL, "input": HISTORY, "tools": TOOLS}
    )
    items = [*made["output"], {"role": "user", "content": "and tomorrow?"}]
    assert items[-2]["type"] == "compaction"

    # Counted, not generated: the same rendering as a turn (a compaction item the replica
    # cannot open is a 400 invalid_encrypted_content here too), no engine in the way.
    body = {"model": MODEL, "input": items, "tools": TOOLS}
    answers = post_many(f"{app_url}/v1/responses/input_tokens", body)
    refused = [
        (answer.headers[REPLICA_HEADER], answer.text) for answer in answers if answer.is_error
    ]
    assert not refused, f"{len(refused)} of {REQUESTS} refused: {refused[:2]}"
    assert_both_replicas_served(answers)
    counts = {answer.json()["input_tokens"] for answer in answers}
    assert len(counts) == 1, counts
    # The summary stands in for the history it replaced (about 1,000 tokens of tool output).
    full = post(f"{app_url}/v1/responses/input_tokens", {**body, "input": [*HISTORY, items[-1]]})
    assert counts.pop() < full.json()["input_tokens"] - 500


def test_sealed_reasoning_is_rendered_on_every_ingress_replica(app_url: str) -> None:
    body = {
        "model": MODEL,
        "input": [QUESTION],
        "tools": TOOLS,
        "store": False,
        "include": ["reasoning.encrypted_content"],
    }
    reasoning, call = made_by_the_app(f"{app_url}/v1/responses", body)["output"]
    assert reasoning["type"] == "reasoning" and call["type"] == "function_call"
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
    call = {key: call[key] for key in ("type", "call_id", "name", "arguments")}

    def count(*history: dict[str, Any]) -> int:
        answer = post(
            f"{app_url}/v1/responses/input_tokens",
            {"model": MODEL, "input": [QUESTION, *history, call, result], "tools": TOOLS},
        )
        assert answer.status_code == 200, answer.text
        return answer.json()["input_tokens"]

    # What the prompt counts with the reasoning rendered (the client sends its text), and
    # without it (a blob the server cannot open is ignored).
    text = [{"type": "reasoning_text", "text": "I need the weather tool."}]
    rendered = count({"type": "reasoning", "summary": [], "content": text})
    dropped = count()
    assert rendered > dropped

    sealed = {
        "type": "reasoning",
        "summary": [],
        "encrypted_content": reasoning["encrypted_content"],
    }
    answers = post_many(
        f"{app_url}/v1/responses/input_tokens",
        {"model": MODEL, "input": [QUESTION, sealed, call, result], "tools": TOOLS},
    )
    assert all(answer.status_code == 200 for answer in answers), answers[0].text
    assert_both_replicas_served(answers)
    counts = [answer.json()["input_tokens"] for answer in answers]
    ignored = sum(tokens != rendered for tokens in counts)
    assert ignored == 0, f"the sealed reasoning was ignored by {ignored} of {REQUESTS}: {counts}"
