"""Fuzzing: 10,000+ malformed or hostile requests, compressed ones too; every answer is a 4xx in
OpenAI's error shape or a valid response, never a 5xx, never a hang.

Runs the ingress's own FastAPI app in-process (the app every ingress replica serves) with the
simulated engine, so the volume fits in CI.
"""

from __future__ import annotations

import gzip
import json
import re
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
import zstandard
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses import Response

from serve_app.config import AppArgs, Limits
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.protocol.requests import INPUT_ITEM_TYPES
from serve_app.serving.engine.client import InProcessEngineClient
from serve_app.serving.ingress import create_api
from serve_app.store.sql import SqlResponseStore
from tests.support import MODEL, open_responses

# Per test, from the Hypothesis profile (tests/conftest.py): `thorough` (scripts/test.sh) draws
# 2,600 (over 10,000 requests in all); the fast tier's default draws 50. Each test's share of it
# is set by what one example costs and what more examples can still find (docs/testing.md).
EXAMPLES = settings().max_examples
SCHEMA_EXAMPLES = max(EXAMPLES // 26, 4)  # per operation of the OpenAPI schema (20 operations)
# The operations whose body is a whole request or a list of items: one example of theirs costs
# ~1.5 s of generation (issue 39's tools and items made those schemas big), a small one's
# milliseconds. Fewer examples each; all five still run, with schemathesis's coverage-phase
# cases (built at collection), and every answer is held to the same check.
BIG_BODY_PATHS = [
    "/v1/responses",
    "/v1/responses/input_tokens",
    "/v1/responses/compact",
    "/v1/conversations",
    "/v1/conversations/{conversation_id}/items",
]
BIG_SCHEMA_EXAMPLES = max(SCHEMA_EXAMPLES * 2 // 5, 4)
FUZZ = settings(
    deadline=None,
    derandomize=True,  # the same requests every run: a failure reproduces
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
TERMINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")
LIMITS = Limits(max_body_bytes=256 * 1024, max_input_items=64, max_tools=16)


def fuzz_api(data_dir: Path) -> FastAPI:
    """The app every ingress replica serves, on an in-process simulated engine and its own store;
    both start on the event loop of whichever client runs the app's lifespan."""
    store = SqlResponseStore(f"sqlite+aiosqlite:///{data_dir}/fuzz.db")
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

    async def start() -> None:
        await store.start()
        await engine.start()

    with warnings.catch_warnings():  # on_event is deprecated; create_api owns the lifespan
        warnings.simplefilter("ignore", DeprecationWarning)
        api.on_event("startup")(start)

    return api


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    api = fuzz_api(tmp_path_factory.mktemp("fuzz"))
    with TestClient(api, raise_server_exceptions=False) as client:
        yield client


def check(response: httpx.Response) -> None:
    check_answer(response.status_code, response.headers.get("content-type", ""), response.content)


def check_answer(status: int, content_type: str, content: bytes) -> None:
    """The one property: a valid response or stream, or a 4xx in OpenAI's error shape.
    Valid: by the openai SDK's models, and by the Open Responses specification when it is on
    this machine (tests/support/open_responses.py)."""
    assert status < 500, content[:500]
    spec = open_responses.available()
    if content_type.startswith("text/event-stream"):
        # Lines end at CR, LF or CRLF only, as SSE defines them: `str.splitlines` would also
        # split inside a JSON string holding U+2028 or U+0085, which JSON writes unescaped.
        lines = re.split(r"\r\n|\r|\n", content.decode())
        data = [line[6:] for line in lines if line.startswith("data: ")]
        assert json.loads(data[-1])["type"] in TERMINAL_EVENTS, data[-1][:500]
        for event in data if spec else ():
            open_responses.check_event(json.loads(event))
    elif status == 200 and content_type.startswith("application/json"):
        body = json.loads(content)
        if body.get("object") == "response":
            Response.model_validate(body)
            if spec:
                open_responses.check_response(body)
    elif status != 200:
        error = json.loads(content)["error"]
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
    check(http.post("/v1/responses", json=body))


@FUZZ
@given(
    raw=st.binary(max_size=2048),
    content_type=st.sampled_from(
        ["application/json", "text/plain", "application/x-www-form-urlencoded", ""]
    ),
)
def test_raw_bytes_and_invalid_utf8(http: TestClient, raw: bytes, content_type: str) -> None:
    check(http.post("/v1/responses", content=raw, headers={"content-type": content_type}))


ENCODINGS = ["gzip", "zstd", "identity", "GZIP", "x-gzip", "br", "deflate", "gzip, zstd", ""]
COMPRESSORS = {"gzip": gzip.compress, "zstd": zstandard.ZstdCompressor().compress}


@settings(FUZZ, max_examples=EXAMPLES // 4)
@given(
    body=json_values,
    encoding=st.sampled_from(ENCODINGS),
    compress_as=st.sampled_from([*COMPRESSORS, None]),
    cut=st.integers(min_value=0, max_value=40),
    noise=st.binary(max_size=64),
)
def test_compressed_bodies(http: TestClient, body, encoding, compress_as, cut, noise) -> None:
    """Bodies compressed one way and labelled another, cut short, or followed by noise."""
    raw = json.dumps({"model": MODEL, "input": body}).encode()
    content = COMPRESSORS[compress_as](raw) if compress_as else raw
    content = content[: len(content) - cut] + noise
    headers = {"content-type": "application/json", "content-encoding": encoding}
    check(http.post("/v1/responses", content=content, headers=headers))


# Four numbers and a path: an eighth of the volume still draws each path hundreds of times, and
# Hypothesis tries the bounds first; one example costs ~0.1 s (bodies up to 400 kB).
@settings(FUZZ, max_examples=max(EXAMPLES // 8, 10))
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


# Every operation of the app's own OpenAPI schema, with schemathesis: positive and negative
# cases (values that break the schema), each answer held to the same property.
# Built at import: schemathesis makes one test per operation at collection time (its fixture-based
# loader does not work with this pytest). It runs the app's lifespan once, on its own event loop.
SCHEMA_DATA_DIR = tempfile.TemporaryDirectory(prefix="serve-app-schemathesis-")
openapi = schemathesis.openapi.from_asgi("/openapi.json", fuzz_api(Path(SCHEMA_DATA_DIR.name)))


big_bodies = openapi.include(method="POST", path=BIG_BODY_PATHS)


@openapi.exclude(method="POST", path=BIG_BODY_PATHS).parametrize()
@settings(max_examples=SCHEMA_EXAMPLES, deadline=None, derandomize=True)
def test_every_operation_of_the_openapi_schema(case: schemathesis.Case) -> None:
    check_case(case)


@big_bodies.parametrize()
@settings(max_examples=BIG_SCHEMA_EXAMPLES, deadline=None, derandomize=True)
def test_every_operation_with_a_big_body(case: schemathesis.Case) -> None:
    check_case(case)


def check_case(case: schemathesis.Case) -> None:
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        # A served model, so generated requests reach rendering and the engine instead of
        # stopping at 404 model_not_found (the other tests send unknown models).
        case.body["model"] = MODEL
    response = case.call()
    assert not response.stream_cut_short
    content_type = response.headers.get("content-type", [""])[0]
    check_answer(response.status_code, content_type, response.content)
