"""Bad requests over HTTP get OpenAI-shaped errors that name the offending parameter."""

from __future__ import annotations

import gzip
import json
import time

import httpx
import pytest
import zstandard

from tests.support import AUTH, MODEL
from tests.support.helpers import scrape_metrics


def post(app_url: str, body: object, **kwargs) -> httpx.Response:
    return httpx.post(f"{app_url}/v1/responses", json=body, headers=AUTH, timeout=30, **kwargs)


def assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["code"] is None or isinstance(error["code"], str)
    return error


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi"}, "model"),
        ({"model": MODEL, "input": 42}, "input"),
        ({"model": MODEL, "input": [{"type": "nonsense"}]}, "input[0]"),
        ({"model": MODEL, "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        (
            {"model": MODEL, "input": "hi", "tools": [{"type": "function", "name": "bad name!"}]},
            "tools[0].name",
        ),
    ],
)
def test_invalid_fields_are_400_with_param(app_url: str, body: dict, param: str) -> None:
    error = assert_openai_error(post(app_url, body), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_call_without_output_and_output_without_call(app_url: str) -> None:
    call = {"type": "function_call", "call_id": "call_a", "name": "f", "arguments": "{}"}
    user = {"role": "user", "content": "hi"}
    error = assert_openai_error(
        post(app_url, {"model": MODEL, "input": [user, user, user, call]}), 400
    )
    assert error["message"] == "No tool output found for function call call_a."
    assert error["param"] == "input[3].call_id"
    output = {"type": "function_call_output", "call_id": "call_b", "output": "x"}
    error = assert_openai_error(post(app_url, {"model": MODEL, "input": [user, output]}), 400)
    assert error["message"] == "No tool call found for function call output with call_id call_b."
    assert error["param"] == "input[1].call_id"


def test_malformed_json_is_400(app_url: str) -> None:
    response = httpx.post(
        f"{app_url}/v1/responses",
        content=b'{"model": ',
        timeout=30,
        headers={**AUTH, "content-type": "application/json"},
    )
    assert assert_openai_error(response, 400)["type"] == "invalid_request_error"


def test_unknown_model_is_404_model_not_found(app_url: str) -> None:
    error = assert_openai_error(post(app_url, {"model": "gpt-9", "input": "hi"}), 404)
    assert error["code"] == "model_not_found" and error["param"] == "model"


def test_unknown_previous_response_is_404(app_url: str) -> None:
    body = {"model": MODEL, "input": "hi", "previous_response_id": "resp_missing"}
    error = assert_openai_error(post(app_url, body), 404)
    assert error["param"] == "previous_response_id"


def test_unknown_route_is_404_in_openai_shape(app_url: str) -> None:
    assert_openai_error(httpx.get(f"{app_url}/v1/nothing-here", headers=AUTH, timeout=30), 404)


def test_web_search_without_a_browser_tool_server_is_served_without_it(app_url: str) -> None:
    # The session app names no tool server (gpt-oss's tools: tests/app/test_builtin_tools.py) and
    # keeps the default `web_search_without_browser: omit`: Codex's default request is served,
    # the tool left out and named (the strict 400: tests/unit/serving/admission/test_builtin.py).
    body = {"model": MODEL, "input": "SDK-TEXT", "tools": [{"type": "web_search"}]}
    response = post(app_url, body)
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "completed"
    assert response.headers["x-serve-app-omitted-tools"] == "web_search"


def test_a_tool_neither_shown_nor_run_is_refused_not_dropped(app_url: str) -> None:
    # Nothing silently dropped (serve_app/protocol/tool_types.py): OpenAI's 400 for a model
    # lacking the tool, naming it; the table's every row: tests/unit/protocol/test_tool_types.py.
    body = {"model": MODEL, "input": "SDK-TEXT", "tools": [{"type": "image_generation"}]}
    response = post(app_url, body)
    assert_openai_error(response, 400)
    assert response.json()["error"]["param"] == "tools[0].type"
    assert "Tool 'image_generation' is not supported" in response.json()["error"]["message"]


def test_metrics_count_requests(app_url: str) -> None:
    served_by = post(app_url, {"model": MODEL, "input": "SDK-TEXT"}).headers["x-serve-app-replica"]
    text = scrape_metrics(app_url)[served_by]
    assert 'serve_app_requests_total{status="completed"}' in text


ONE_MIB = 1024 * 1024
DEFAULT_BODY_LIMIT = 16 * ONE_MIB  # Limits.max_body_bytes: the test app keeps the default


def test_oversize_body_with_content_length_is_413(app_url: str) -> None:
    body = b'{"model": "' + b"x" * (DEFAULT_BODY_LIMIT + 1) + b'"}'
    response = httpx.post(
        f"{app_url}/v1/responses",
        content=body,
        timeout=60,
        headers={**AUTH, "content-type": "application/json"},
    )
    assert "16777216 bytes" in assert_openai_error(response, 413)["message"]


def test_oversize_chunked_body_is_413(app_url: str) -> None:
    # No Content-Length: the size is only known while reading, and the server stops reading
    # at the limit. (httpx sends the whole body before it reads the answer.)
    def chunks():
        yield b'{"model": "gpt-oss-120b", "input": "'
        for _ in range(4 * DEFAULT_BODY_LIMIT // ONE_MIB):
            yield b"y" * ONE_MIB

    try:
        response = httpx.post(
            f"{app_url}/v1/responses",
            content=chunks(),
            timeout=60,
            headers={**AUTH, "content-type": "application/json"},
        )
    except httpx.WriteError:
        pytest.fail("the server closed the connection without an answer")
    assert "content-length" not in response.request.headers
    assert "16777216 bytes" in assert_openai_error(response, 413)["message"]


def test_chunked_body_within_the_limit_is_served(app_url: str) -> None:
    def chunks():
        yield b'{"model": "gpt-oss-120b", '
        yield b'"input": "SDK-TEXT"}'

    response = httpx.post(
        f"{app_url}/v1/responses",
        content=chunks(),
        timeout=60,
        headers={**AUTH, "content-type": "application/json"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "completed"


COMPRESS = {"gzip": gzip.compress, "zstd": zstandard.ZstdCompressor().compress}


def post_encoded(app_url: str, content: bytes, encoding: str) -> httpx.Response:
    return httpx.post(
        f"{app_url}/v1/responses",
        content=content,
        timeout=60,
        headers={**AUTH, "content-type": "application/json", "content-encoding": encoding},
    )


@pytest.mark.parametrize("encoding", ["gzip", "zstd", "identity"])
def test_compressed_bodies_are_answered_like_plain_ones(app_url: str, encoding: str) -> None:
    body = json.dumps({"model": MODEL, "input": "SDK-TEXT", "metadata": {"via": encoding}})
    content = COMPRESS.get(encoding, bytes)(body.encode())
    response = post_encoded(app_url, content, encoding)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["status"] == "completed" and answer["metadata"] == {"via": encoding}
    assert answer["output"][-1]["content"][0]["text"] == "Hello from the scripted engine."


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_a_decompression_bomb_is_413_quickly(app_url: str, encoding: str) -> None:
    # 100 MB of zeros in ~100 kB (gzip) or ~3 kB (zstd): far within the limit on the wire,
    # far past it decoded. The server stops decoding at the limit.
    bomb = COMPRESS[encoding](bytes(100 * ONE_MIB))
    assert len(bomb) < ONE_MIB
    started = time.monotonic()
    response = post_encoded(app_url, bomb, encoding)
    assert time.monotonic() - started < 10
    assert "16777216 bytes" in assert_openai_error(response, 413)["message"]


@pytest.mark.parametrize("encoding", ["br", "foo", "gzip, br"])
def test_an_unknown_content_encoding_is_415(app_url: str, encoding: str) -> None:
    body = json.dumps({"model": MODEL, "input": "SDK-TEXT"}).encode()
    error = assert_openai_error(post_encoded(app_url, body, encoding), 415)
    assert error["type"] == "invalid_request_error"
    assert encoding in error["message"]


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_a_body_that_does_not_decode_is_400(app_url: str, encoding: str) -> None:
    body = json.dumps({"model": MODEL, "input": "SDK-TEXT"}).encode()
    for content in (body, COMPRESS[encoding](body)[:-4]):  # not compressed; cut short
        error = assert_openai_error(post_encoded(app_url, content, encoding), 400)
        assert encoding in error["message"]


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_a_compressed_body_in_pieces_and_members_is_decoded(app_url: str, encoding: str) -> None:
    # Two gzip members (zstd frames), each half of the JSON, sent chunked in 7-byte pieces:
    # decoding goes on across messages and members.
    body = json.dumps({"model": MODEL, "input": "SDK-TEXT"}).encode()
    content = COMPRESS[encoding](body[:20]) + COMPRESS[encoding](body[20:])

    def pieces():
        for start in range(0, len(content), 7):
            yield content[start : start + 7]

    response = httpx.post(
        f"{app_url}/v1/responses",
        content=pieces(),
        timeout=60,
        headers={**AUTH, "content-type": "application/json", "content-encoding": encoding},
    )
    assert "content-length" not in response.request.headers
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "completed"
