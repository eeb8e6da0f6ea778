"""An approved MCP call runs once across the session app's two ingress replicas (issue 46): the
same ``mcp_approval_response`` (by ``previous_response_id``) sent by several clients at once,
each on a connection of its own so that both replicas take some, runs the side-effecting
``charge`` tool of the ``good`` test server once per approval, and every answer carries that
run's result. The claim is in the store both replicas share (serve_app/store/tool_claims.py);
tests/unit/serving/tools/test_mcp_once.py runs the same race in process, with two apps on one
store, and the refusals (429, 400) that must run nothing.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.support import AUTH, MODEL
from tests.support.mcp_app import port
from tests.support.mcp_servers import McpTestServer, mcp_server

ROUNDS = 5
SENDERS = 4
REPLICA_HEADER = "x-serve-app-replica"


@pytest.fixture(scope="module")
def good() -> McpTestServer:
    with mcp_server("good", port=port("once")) as server:
        yield server


def pay(url: str) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "pay", "server_url": url, "require_approval": "always"}


def post(url: str, body: dict[str, Any]) -> httpx.Response:
    # A client per request: a new connection each time, routed afresh.
    with httpx.Client(headers=AUTH, timeout=60) as client:
        return client.post(f"{url}/v1/responses", json=body)


def charges(app_url: str, server: McpTestServer) -> int:
    """The server's count of charges, asked through the app (a call that needs no approval)."""
    tool = {**pay(server.url), "require_approval": "never"}
    body = {"model": MODEL, "input": "MCP-CHARGES-TASK", "tools": [tool]}
    answer = post(app_url, body)
    assert answer.status_code == 200, answer.text
    (call,) = [item for item in answer.json()["output"] if item["type"] == "mcp_call"]
    return int(call["output"])


def test_one_approval_sent_at_once_through_both_replicas_runs_once(
    app_url: str, good: McpTestServer
) -> None:
    rng = random.Random(46)
    served: set[str] = set()
    for round_ in range(ROUNDS):
        body = {"model": MODEL, "input": "MCP-CHARGE-TASK", "tools": [pay(good.url)]}
        asked = post(app_url, body)
        assert asked.status_code == 200, asked.text
        (request,) = [i for i in asked.json()["output"] if i["type"] == "mcp_approval_request"]
        before = charges(app_url, good)
        approval = {
            "type": "mcp_approval_response",
            "approval_request_id": request["id"],
            "approve": True,
        }
        answer = {
            "model": MODEL,
            "previous_response_id": asked.json()["id"],
            "input": [approval],
            "tools": [pay(good.url)],
        }
        order = rng.sample(range(SENDERS), SENDERS)  # who sends first varies by round
        with ThreadPoolExecutor(max_workers=SENDERS) as pool:
            answers = list(pool.map(lambda _, body=answer: post(app_url, body), order))
        assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
        served |= {a.headers[REPLICA_HEADER] for a in answers}
        outputs = {
            item["output"]
            for a in answers
            for item in a.json()["output"]
            if item["type"] == "mcp_call"
        }
        assert outputs == {f"charge #{before + 1} of 5"}, f"round {round_}: {outputs}"
        assert charges(app_url, good) == before + 1, f"round {round_}"
    # "local": the one process of tests/local_app.py (SERVE_APP_TEST_URL), no replicas.
    assert served == {"local"} or len(served) >= 2, f"all went to one replica: {served}"
