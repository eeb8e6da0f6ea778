"""gpt-oss's own tools end to end, through the openai SDK: a request's ``web_search`` is the
model's browser and ``code_interpreter`` its python, run by the reference tool server
(serve_app/toolserver, started here on a document folder) that the app names in
``tools.browser_server_url`` / ``python_server_url``. The app is the Ray-free local app
(``python -m tests.local_app``, the same FastAPI app and scripted engine), started here with
those URLs, since the session app has no tool server. The scripted turns are in
tests/fixtures/engine_script.yaml (``BUILTIN-*``): each tool's answer picks the next turn.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.support import API_KEY, MODEL, REPO
from tests.support.serve_run import free_port
from tests.support.toolserver import ToolServer, tool_server
from tests.support.websocket import connected, until_terminal

ZEBRA = "# Zebras\n\nZebras have black and white stripes.\n"
HORSES = "# Horses\n\nHorses gallop across the plains.\n"
ZEBRA_URL = "http://docs.local/zebra.md"
WEB_SEARCH = [{"type": "web_search"}]
CODE_INTERPRETER = [{"type": "code_interpreter", "container": {"type": "auto"}}]


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToolServer]:
    docs = tmp_path_factory.mktemp("docs")
    (docs / "zebra.md").write_text(ZEBRA)
    (docs / "horses.md").write_text(HORSES)
    with tool_server(docs, "--python-wall-seconds", "10") as server:
        yield server


@contextlib.contextmanager
def local_app(log: Path, *args: str) -> Iterator[str]:
    """``python -m tests.local_app`` with ``args`` on a free port, until it answers /health."""
    port = free_port()
    command = [sys.executable, "-m", "tests.local_app", "--port", str(port), *args]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()[-4000:]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.3)
        else:
            raise RuntimeError(f"the local app did not start:\n{log.read_text()[-4000:]}")
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="module")
def app(tools: ToolServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("app") / "local_app.log"
    urls = ["--browser-server-url", tools.mcp_url, "--python-server-url", tools.mcp_url]
    with local_app(log, *urls) as url:
        yield url


@pytest.fixture
def sdk(app: str) -> OpenAI:
    return OpenAI(base_url=f"{app}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def output_types(response: Any) -> list[str]:
    return [item.type for item in response.output]


def calls_of(response: Any, item_type: str) -> list[Any]:
    return [item for item in response.output if item.type == item_type]


def check_browse(response: Any) -> None:
    """search -> open the first result -> the answer, each call completed."""
    assert response.status == "completed", response
    assert output_types(response) == [
        "reasoning",
        "web_search_call",
        "web_search_call",
        "reasoning",
        "message",
    ]
    search, opened = calls_of(response, "web_search_call")
    assert search.status == "completed" and opened.status == "completed"
    assert search.action.type == "search" and search.action.query == "zebra stripes"
    assert search.id.startswith("ws_")
    assert opened.action.type == "open_page" and opened.action.url == ZEBRA_URL
    assert response.output_text == "BUILTIN-ANSWER: zebras have black and white stripes."
    assert [tool.type for tool in response.tools] == ["web_search"]


def check_call_events(types: list[str], item_type: str, middle: list[str]) -> None:
    """Each call's events in OpenAI's order: added, ``middle``, done."""
    for index, event_type in enumerate(types):
        if event_type == f"response.{item_type}.completed":
            run = types[index - len(middle) : index + 2]
            assert run == [*middle, event_type, "response.output_item.done"], types


def test_browser_search_open_answer(sdk: OpenAI) -> None:
    response = sdk.responses.create(model=MODEL, input="BUILTIN-BROWSE zebras?", tools=WEB_SEARCH)
    check_browse(response)
    # Stored as answered.
    stored = sdk.responses.retrieve(response.id)
    assert stored.model_dump() == response.model_dump()


def test_search_sources_when_included(sdk: OpenAI) -> None:
    response = sdk.responses.create(
        model=MODEL,
        input="BUILTIN-BROWSE zebras?",
        tools=WEB_SEARCH,
        include=["web_search_call.action.sources"],
    )
    check_browse(response)
    search = calls_of(response, "web_search_call")[0]
    assert search.action.sources[0].url == ZEBRA_URL  # the best-ranked result first
    assert calls_of(sdk.responses.create(
        model=MODEL, input="BUILTIN-BROWSE zebras?", tools=WEB_SEARCH
    ), "web_search_call")[0].action.sources is None  # fmt: skip


def test_browser_streamed_over_sse(sdk: OpenAI) -> None:
    with sdk.responses.stream(
        model=MODEL, input="BUILTIN-BROWSE zebras?", tools=WEB_SEARCH
    ) as stream:
        types = [event.type for event in stream]
        response = stream.get_final_response()
    check_browse(response)
    middle = ["response.web_search_call.in_progress", "response.web_search_call.searching"]
    check_call_events(types, "web_search_call", middle)
    assert types.count("response.web_search_call.completed") == 2
    assert types[-1] == "response.completed"


def test_browser_over_websocket(sdk: OpenAI) -> None:
    with connected(sdk) as connection:
        connection.response.create(model=MODEL, input="BUILTIN-BROWSE zebras?", tools=WEB_SEARCH)
        events = until_terminal(connection)
    check_browse(events[-1].response)
    numbers = [event.sequence_number for event in events]
    assert numbers == list(range(len(events)))  # one stream across the tool rounds


def test_python_run_then_answer_with_outputs_included(sdk: OpenAI) -> None:
    with sdk.responses.stream(
        model=MODEL,
        input="BUILTIN-PYTHON what is 6 * 7?",
        tools=CODE_INTERPRETER,
        include=["code_interpreter_call.outputs"],
    ) as stream:
        events = list(stream)
        response = stream.get_final_response()
    assert response.status == "completed"
    assert output_types(response) == ["reasoning", "code_interpreter_call", "message"]
    (call,) = calls_of(response, "code_interpreter_call")
    assert call.code == "print(6 * 7)" and call.status == "completed"
    assert call.container_id == "auto" and call.id.startswith("ci_")
    assert [(output.type, output.logs) for output in call.outputs] == [("logs", "42\n")]
    assert response.output_text == "BUILTIN-ANSWER: 6 * 7 = 42."
    types = [event.type for event in events]
    code = "".join(e.delta for e in events if e.type == "response.code_interpreter_call_code.delta")
    assert code == "print(6 * 7)"
    first_delta = types.index("response.code_interpreter_call_code.delta")
    assert types[first_delta - 2 : first_delta] == [
        "response.output_item.added",
        "response.code_interpreter_call.in_progress",
    ]
    middle = [
        "response.code_interpreter_call_code.done",
        "response.code_interpreter_call.interpreting",
    ]
    check_call_events(types, "code_interpreter_call", middle)


def test_python_outputs_are_left_out_unless_included(sdk: OpenAI) -> None:
    response = sdk.responses.create(
        model=MODEL, input="BUILTIN-PYTHON what is 6 * 7?", tools=CODE_INTERPRETER
    )
    (call,) = calls_of(response, "code_interpreter_call")
    assert call.outputs is None and call.status == "completed"
    assert response.output_text == "BUILTIN-ANSWER: 6 * 7 = 42."  # the model read them


def test_a_failing_run_is_read_by_the_model(sdk: OpenAI) -> None:
    response = sdk.responses.create(model=MODEL, input="BUILTIN-PYFAIL", tools=CODE_INTERPRETER)
    assert response.status == "completed"
    (call,) = calls_of(response, "code_interpreter_call")
    assert call.code == "1 / 0"
    assert response.output_text == "BUILTIN-FAILED: the code raised ZeroDivisionError."


def test_the_calls_come_back_as_input_stored_and_resent(sdk: OpenAI) -> None:
    first = sdk.responses.create(model=MODEL, input="BUILTIN-BROWSE zebras?", tools=WEB_SEARCH)
    # By previous_response_id (the stored chain) ...
    chained = sdk.responses.create(
        model=MODEL, input="SDK-TEXT", tools=WEB_SEARCH, previous_response_id=first.id
    )
    assert chained.output_text == "Hello from the scripted engine."
    # ... and resent statelessly: web_search_call items are input items.
    items = [item.model_dump(exclude_none=True) for item in first.output]
    resent = sdk.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": "BUILTIN-BROWSE zebras?"}, *items,
               {"role": "user", "content": "SDK-TEXT"}],
        tools=WEB_SEARCH,
        store=False,
    )  # fmt: skip
    assert resent.output_text == "Hello from the scripted engine."
    count = sdk.responses.input_tokens.count(
        model=MODEL, input=[{"role": "user", "content": "hi"}, *items], tools=WEB_SEARCH
    )
    assert count.input_tokens > 0


def test_a_container_this_server_does_not_have_is_a_400(sdk: OpenAI) -> None:
    tools = [{"type": "code_interpreter", "container": "cntr_elsewhere"}]
    response = httpx.post(
        f"{sdk.base_url}responses",
        json={"model": MODEL, "input": "hi", "tools": tools},
        headers={"authorization": f"Bearer {API_KEY}"},
        timeout=30,
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "tools[0].container"
