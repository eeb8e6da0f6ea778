"""Fuzzing: 10,000+ malformed or hostile requests; every answer is a 4xx in OpenAI's error shape
or a valid response, never a 5xx, never a hang.

Runs the ingress's own FastAPI app in-process (the app every ingress replica serves) with the
simulated engine, so the volume fits in CI.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses import Response

from serve_app.config import AppArgs, Limits
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.protocol.requests import INPUT_ITEM_TYPES
from serve_app.serving.engine_client import InProcessEngineClient
from serve_app.serving.ingress import create_api
from serve_app.store.sql import SqlResponseStore

MODEL = "gpt-oss-120b"
EXAMPLES = 2600  # per test; four tests: over 10,000 requests in all
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same requests every run: a failure reproduces
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
pytestmark = pytest.mark.filterwarnings("ignore:\\s*on_event is deprecated:DeprecationWarning")
LIMITS = Limits(max_body_bytes=256 * 1024, max_input_items=64, max_tools=16)


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    store = SqlResponseStore(f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('fuzz')}/f.db")
    engine = SimulatedEngine(
        SimulatedEngineConfig(
            decode_tokens_per_s=1e7, prefill_tokens_per_s=1e9, default_output_tokens=8
        )
    )
    api = create_api(
        AppArgs(limits=LIMITS, max_context_tokens=8192),
        InProcessEngineClient(engine),
        ReasoningVault("fuzz"),
        store,
    )

    @api.on_event("startup")  # the store and engine start on the test client's event loop
    async def start() -> None:
        await store.start()
        await engine.start()

    with TestClient(api, raise_server_exceptions=False) as client:
        yield client


def check(response) -> None:
    """The one property: a valid response, or a 4xx in OpenAI's error shape."""
    assert response.status_code < 500, response.text[:500]
    if response.status_code == 200:
        body = response.json()
        if body.get("object") == "response":
            Response.model_validate(body)
        return
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["code"] is None or isinstance(error["code"], str)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=64),
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=12), children, max_size=6)
    ),
    max_leaves=40,
)
ITEM_TYPES = [*INPUT_ITEM_TYPES, "web_search_call", "compaction", "nonsense", ""]
items = st.fixed_dictionaries(
    {"type": st.sampled_from(ITEM_TYPES)},
    optional={
        "role": st.sampled_from(["user", "assistant", "system", "developer", "tool", "x"]),
        "content": st.one_of(st.text(max_size=200), json_values),
        "call_id": st.sampled_from(["call_a", "call_b", "", "call_a"]) | st.text(max_size=8),
        "name": st.sampled_from(["exec_command", "", "x y", "f"]) | st.text(max_size=8),
        "arguments": st.text(max_size=50) | json_values,
        "output": st.text(max_size=50) | json_values,
        "input": st.text(max_size=50),
        "encrypted_content": st.text(max_size=80),
        "summary": json_values,
    },
)
tools = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "custom", "namespace", "web_search", "mcp", "x"])},
    optional={
        "name": st.text(max_size=20),
        "parameters": json_values,
        "function": json_values,
        "tools": json_values,
        "format": json_values,
    },
)


@FUZZ
@given(body=json_values)
def test_arbitrary_json_bodies(http: TestClient, body) -> None:
    check(http.post("/v1/responses", json=body))


@FUZZ
@given(
    input_=st.one_of(st.text(max_size=300), st.lists(items, max_size=8)),
    tool_list=st.lists(tools, max_size=4),
    extra=st.dictionaries(
        st.sampled_from(
            [
                "tool_choice",
                "reasoning",
                "max_output_tokens",
                "temperature",
                "top_p",
                "include",
                "metadata",
                "text",
                "store",
                "stream",
                "previous_response_id",
                "conversation",
                "background",
                "model",
            ]
        ),
        json_values,
        max_size=4,
    ),
)
def test_mutated_requests(http: TestClient, input_, tool_list, extra) -> None:
    body = {"model": MODEL, "input": input_, "tools": tool_list, **extra}
    response = http.post("/v1/responses", json=body)
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        events = [
            json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")
        ]
        assert events[-1]["type"] in (
            "response.completed",
            "response.incomplete",
            "response.failed",
        )
    else:
        check(response)


@FUZZ
@given(
    raw=st.binary(max_size=2048),
    content_type=st.sampled_from(
        ["application/json", "text/plain", "application/x-www-form-urlencoded", ""]
    ),
)
def test_raw_bytes_and_invalid_utf8(http: TestClient, raw: bytes, content_type: str) -> None:
    check(http.post("/v1/responses", content=raw, headers={"content-type": content_type}))


@FUZZ
@given(
    depth=st.integers(min_value=1, max_value=400),
    size=st.integers(min_value=0, max_value=400_000),
    count=st.integers(min_value=0, max_value=200),
    path=st.sampled_from(["/v1/responses", "/v1/responses/input_tokens", "/v1/conversations"]),
)
def test_deep_huge_and_many(http: TestClient, depth: int, size: int, count: int, path) -> None:
    nested: object = "x"
    for _ in range(depth):
        nested = {"a": [nested]}
    body = {
        "model": MODEL,
        "input": [{"role": "user", "content": "y" * (size // max(count, 1))}] * count or "hi",
        "metadata": {"deep": json.dumps(nested)[:512]},
        "tools": [
            {"type": "function", "name": f"t{index}", "parameters": nested}
            for index in range(count % 40)
        ],
    }
    check(http.post(path, json=body))
