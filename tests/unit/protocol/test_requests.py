"""Types as strict as OpenAI's: a value of the wrong JSON type is a 400 naming its field, never
coerced (``temperature: true``, ``stream: 0``, ``max_output_tokens: "5"``).

The fields come from the request models themselves: every field of every model reachable from
``ResponsesRequest`` (and the conversations' bodies), walked over a valid request that holds one
of each kind of item and tool, each given a value of each JSON type its annotation does not take.
A field added to a model is swept without a change here; a new nested model needs an example in
``REQUESTS`` (a test says so). Runs the ingress's own app in-process: fast.
"""

from __future__ import annotations

import copy
import json
import types
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import httpx
import pytest
from pydantic import BaseModel

from serve_app.config import AppArgs, ModerationArgs, ToolArgs
from serve_app.protocol.requests import ResponsesRequest
from serve_app.serving.conversations import ConversationCreate
from tests.support import MODEL
from tests.support.helpers import in_process_api

Loc = tuple[str | int, ...]

# One value per JSON type. Each is a value lax validation would coerce where it could (1 is
# True, "1" is 1), so a case passes only when types are strict.
JSON_VALUES: dict[str, Any] = {
    "boolean": True,
    "integer": 1,
    "number": 1.5,
    "string": "1",
    "null": None,
    "object": {"key": "value"},
    "array": ["value"],
}

# Strict-mode schemas (the `strict: true` tool and format below are checked as OpenAI does).
PARAMETERS = {
    "type": "object",
    "properties": {"q": {"type": "string"}},
    "required": ["q"],
    "additionalProperties": False,
}
CALL = {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"}
# A valid request with one of each kind of item and tool; `state` items need the server's state
# (a stored item, a summary sealed with its key), so only the sweep sends them.
MAIN_REQUEST: dict[str, Any] = {
    "model": MODEL,
    "instructions": "Answer briefly.",
    "input": [
        {"type": "message", "id": "msg_1", "role": "user", "content": "Look it up."},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Look it up."}],
            "content": [{"type": "reasoning_text", "text": "I should look it up."}],
            "encrypted_content": "not-sealed-here",
        },
        {**CALL, "id": "fc_1", "namespace": "docs"},
        {"type": "function_call_output", "id": "fco_1", "call_id": "call_1", "output": "found"},
        {
            "type": "custom_tool_call",
            "id": "ctc_1",
            "call_id": "call_2",
            "name": "apply_patch",
            "input": "*** Begin Patch\n*** End Patch",
        },
        {
            "type": "custom_tool_call_output",
            "call_id": "call_2",
            "output": [{"type": "input_text", "text": "Done."}],
        },
        {
            "type": "message",
            "role": "assistant",
            "phase": "final_answer",
            "content": [{"type": "output_text", "text": "It is done."}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "input_text",
                    "text": "Thanks.",
                    "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "30m"},
                }
            ],
        },
        # gpt-oss's browser and python calls, as the SDK writes them (each action's form).
        {
            "type": "web_search_call",
            "id": "ws_1",
            "status": "completed",
            "action": {"type": "search", "query": "q", "sources": [{"type": "url", "url": "u"}]},
        },
        {"type": "web_search_call", "action": {"type": "open_page", "url": "u"}},
        {"type": "web_search_call", "action": {"type": "find_in_page", "pattern": "p", "url": "u"}},
        {
            "type": "code_interpreter_call",
            "id": "ci_1",
            "code": "print(1)",
            "container_id": "auto",
            "outputs": [{"type": "logs", "logs": "1"}, {"type": "image", "url": "u"}],
            "status": "completed",
        },
        {
            "type": "tool_search_call",
            "call_id": "call_3",
            "execution": "client",
            "arguments": {"paths": ["later"]},
        },
        {
            "type": "tool_search_output",
            "call_id": "call_3",
            "execution": "client",
            "tools": [
                {"type": "function", "name": "later", "parameters": PARAMETERS},
                {
                    "type": "namespace",
                    "name": "more",
                    "tools": [{"type": "custom", "name": "x", "format": {"type": "text"}}],
                },
            ],
        },
    ],
    "tools": [
        {
            "type": "function",
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": PARAMETERS,
            "strict": True,
        },
        {  # the Chat-Completions form
            "type": "function",
            "function": {"name": "define", "description": "Define.", "parameters": PARAMETERS},
        },
        {
            "type": "custom",
            "name": "apply_patch",
            "description": "Patch files.",
            "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
        },
        {
            "type": "namespace",
            "name": "docs",
            "description": "Documentation.",
            "tools": [
                {"type": "function", "name": "search", "parameters": PARAMETERS},
                {"type": "custom", "name": "note"},
            ],
        },
        {
            "type": "web_search",
            "filters": {"allowed_domains": ["docs.local"]},
            "search_context_size": "low",
            "user_location": {"type": "approximate", "city": "Paris"},
            "external_web_access": False,
            "search_content_types": ["text"],
        },
        {
            "type": "code_interpreter",
            "container": {"type": "auto", "file_ids": ["f"], "memory_limit": "1g"},
            "allowed_callers": ["direct"],
        },
        {"type": "function", "name": "later", "parameters": PARAMETERS, "defer_loading": True},
        {"type": "tool_search", "execution": "client", "description": "Find.", "parameters": {}},
    ],
    "tool_choice": {"type": "function", "name": "lookup"},
    "parallel_tool_calls": False,
    "reasoning": {"effort": "low", "summary": "auto"},
    "text": {
        "format": {
            "type": "json_schema",
            "name": "answer",
            "description": "The answer.",
            "schema": {
                "type": "object",
                "properties": {"a": {"type": "string"}},
                "required": ["a"],
                "additionalProperties": False,
            },
            "strict": True,
        },
        "verbosity": "low",
    },
    "max_output_tokens": 64,
    "temperature": 0.5,
    "top_p": 0.9,
    "prompt_cache_key": "strict-types",
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "metadata": {"purpose": "strict types"},
    "stream": False,
    "background": False,
    "user": "tester",
    "context_management": [{"type": "compaction", "compact_threshold": 2000}],
    "moderation": {
        "model": "omni-moderation-latest",
        "policy": {"input": {"mode": "block"}, "output": {"mode": "score"}},
    },
    "prompt_cache_options": {
        "mode": "implicit",
        "ttl": "12h",
        "prewarm": False,
        "comparison_response_id": "resp_earlier",
    },
}
STATE_ITEMS = [
    {"type": "item_reference", "id": "msg_stored"},
    {"type": "compaction", "id": "cmp_1", "encrypted_content": "sealed-summary"},
]
# The other forms of union fields: a stored conversation, tool choices.
OTHER_FORMS: dict[str, Any] = {
    "model": MODEL,
    "input": [*STATE_ITEMS, {"role": "user", "content": "Hi."}],
    "conversation": {"id": "conv_1"},
    "tool_choice": {"type": "function", "function": {"name": "lookup"}},
    "tools": MAIN_REQUEST["tools"][:1],
}
HOSTED_CHOICE: dict[str, Any] = {
    "model": MODEL,
    "input": "Hi.",
    "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []},
    # A type no model here types (refused at the door, but its `type` is a string first).
    "tools": [{"type": "file_search", "vector_store_ids": []}],
}

# MCP: the tool with its filter forms, and every MCP input item.
MCP_ITEMS: list[dict[str, Any]] = [
    {
        "type": "mcp_list_tools",
        "id": "mcpl_1",
        "server_label": "docs",
        "tools": [
            {
                "name": "echo",
                "input_schema": PARAMETERS,
                "description": "Echo.",
                "annotations": {"readOnlyHint": True},
            }
        ],
        "error": None,
    },
    {
        "type": "mcp_call",
        "id": "mcp_1",
        "server_label": "docs",
        "name": "echo",
        "arguments": "{}",
        "output": "hi",
        "error": {"type": "http_error", "code": 500, "message": "down"},
        "approval_request_id": "mcpr_0",
        "status": "failed",
    },
    {
        "type": "mcp_approval_request",
        "id": "mcpr_1",
        "server_label": "docs",
        "name": "echo",
        "arguments": "{}",
    },
    {
        "type": "mcp_approval_response",
        "id": "mcpa_1",
        "approval_request_id": "mcpr_1",
        "approve": True,
        "reason": "fine",
    },
]
MCP_FORMS: dict[str, Any] = {
    "model": MODEL,
    "input": MCP_ITEMS,
    "tools": [
        {
            "type": "mcp",
            "server_label": "docs",
            "server_url": "http://127.0.0.1:9/mcp",
            "connector_id": "connector_gmail",
            "tunnel_id": "tunnel_1",
            "allowed_tools": {"tool_names": ["echo"], "read_only": True},
            "headers": {"X-Key": "k"},
            "authorization": "token",
            "require_approval": {
                "always": {"tool_names": ["echo"], "read_only": False},
                "never": {"tool_names": ["add"]},
            },
            "server_description": "Docs.",
            "defer_loading": False,
        }
    ],
}

# The client-run tools (serve_app/protocol/client_tools.py), their calls and outputs.
CLIENT_TOOLS: dict[str, Any] = {
    "model": MODEL,
    "input": [
        {"role": "user", "content": "Run it."},
        {
            "type": "shell_call",
            "id": "sh_1",
            "call_id": "call_s",
            "action": {"commands": ["ls"], "timeout_ms": 1000, "max_output_length": 100},
            "status": "completed",
        },
        {
            "type": "shell_call_output",
            "id": "sho_1",
            "call_id": "call_s",
            "max_output_length": 100,
            "output": [{"stdout": "a", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}],
        },
        {
            "type": "local_shell_call",
            "id": "lsh_1",
            "call_id": "call_l",
            "action": {
                "type": "exec",
                "command": ["ls"],
                "env": {"A": "b"},
                "timeout_ms": 1000,
                "user": "me",
                "working_directory": "/tmp",
            },
            "status": "completed",
        },
        {"type": "local_shell_call_output", "id": "call_l", "call_id": "call_l", "output": "a"},
        {
            "type": "apply_patch_call",
            "id": "apc_1",
            "call_id": "call_p",
            "operation": {"type": "update_file", "path": "a.txt", "diff": "@@\n-a\n+b"},
            "status": "completed",
        },
        {
            "type": "apply_patch_call_output",
            "id": "apco_1",
            "call_id": "call_p",
            "status": "completed",
            "output": "Done.",
        },
    ],
    "tools": [
        {"type": "shell", "environment": {"type": "local"}},
        {"type": "local_shell"},
        {"type": "apply_patch"},
    ],
    "tool_choice": {"type": "shell"},
}


@dataclass(frozen=True)
class Endpoint:
    path: str
    model: type[BaseModel]
    examples: tuple[dict[str, Any], ...]


RESPONSES = Endpoint(
    "/v1/responses",
    ResponsesRequest,
    (MAIN_REQUEST, OTHER_FORMS, HOSTED_CHOICE, MCP_FORMS, CLIENT_TOOLS),
)
CONVERSATIONS = Endpoint(
    "/v1/conversations",
    ConversationCreate,
    (
        {"items": [*MAIN_REQUEST["input"], *STATE_ITEMS], "metadata": {"topic": "words"}},
        {"items": MCP_ITEMS},
        {"items": CLIENT_TOOLS["input"]},
    ),
)
ENDPOINTS = (RESPONSES, CONVERSATIONS)


# --- the models' fields, walked over examples ----------------------------------------------


def branches(annotation: Any) -> list[Any]:
    """The types an annotation allows, unions and ``Annotated`` unwrapped."""
    if get_origin(annotation) is Annotated:
        return branches(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return [leaf for arg in get_args(annotation) for leaf in branches(arg)]
    return [annotation]


def json_types(annotation: Any) -> set[str]:
    """The JSON types a field's annotation takes (an integer is a number)."""
    taken: set[str] = set()
    for branch in branches(annotation):
        origin = get_origin(branch) or branch
        if branch is Any:
            return set(JSON_VALUES)
        if branch is type(None):
            taken.add("null")
        elif branch is bool:
            taken.add("boolean")
        elif branch is int:
            taken.add("integer")
        elif branch is float:
            taken |= {"integer", "number"}
        elif branch is str:
            taken.add("string")
        elif origin is Literal:
            taken |= {json_type(value) for value in get_args(branch)}
        elif origin is list:
            taken.add("array")
        elif origin is dict or (isinstance(branch, type) and issubclass(branch, BaseModel)):
            taken.add("object")
        else:
            raise AssertionError(f"no JSON type known for {branch!r}: teach json_types")
    return taken


def json_type(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string"}[type(value)]


def models_in(annotation: Any) -> list[type[BaseModel]]:
    found = []
    for branch in branches(annotation):
        if get_origin(branch) is list:
            found += models_in(get_args(branch)[0])
        elif isinstance(branch, type) and issubclass(branch, BaseModel):
            found.append(branch)
    return found


def reachable_models(model: type[BaseModel]) -> set[type[BaseModel]]:
    seen: set[type[BaseModel]] = set()
    todo = [model]
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo += [m for f in current.model_fields.values() for m in models_in(f.annotation)]
    return seen


@dataclass(frozen=True)
class FieldAt:
    """A field where a request holds it: its path, annotation, and whether it is a union tag."""

    path: Loc
    annotation: Any
    model: type[BaseModel]
    is_tag: bool


def which_model(annotation: Any, value: Any) -> type[BaseModel] | None:
    """The model a valid example value is an instance of (union branches tried in order)."""
    for model in models_in(annotation):
        try:
            model.model_validate(value)
        except ValueError:
            continue
        return model
    return None


def fields(
    model: type[BaseModel], example: dict, path: Loc = (), in_union: bool = False
) -> Iterator[FieldAt]:
    """Every field of ``model`` at ``path``, then those of the models its example holds;
    ``in_union``: the model is one branch of a union, chosen by its ``type``."""
    target, target_path = example, path
    if isinstance(example.get("function"), dict) and "function" not in model.model_fields:
        # The Chat-Completions form: the fields are under "function", the tag outside.
        target, target_path = example["function"], (*path, "function")
    for name, info in model.model_fields.items():
        key = info.alias or name
        is_tag = in_union and key == "type"
        yield FieldAt((*(path if is_tag else target_path), key), info.annotation, model, is_tag)
        value = target.get(key)
        if not models_in(info.annotation):
            continue
        union = len(models_in(info.annotation)) > 1
        elements = value if isinstance(value, list) else [value]
        for index, element in enumerate(elements):
            if not isinstance(element, dict):
                continue
            inner = which_model(info.annotation, element)
            assert inner is not None, f"the example at {param((*target_path, key))} is invalid"
            at = (*target_path, key, index) if isinstance(value, list) else (*target_path, key)
            yield from fields(inner, element, at, union)


def param(path: Loc) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def with_value(example: dict, path: Loc, value: Any) -> dict:
    body = copy.deepcopy(example)
    holder: Any = body
    for part in path[:-1]:
        holder = holder[part]
    holder[path[-1]] = value
    return body


@dataclass(frozen=True)
class Case:
    endpoint: Endpoint
    body: dict
    field: FieldAt
    sent: str  # the JSON type sent

    @property
    def id(self) -> str:
        return f"{self.endpoint.path}:{param(self.field.path)}={self.sent}"


def wrong_type_cases() -> list[Case]:
    cases: dict[str, Case] = {}
    for endpoint in ENDPOINTS:
        for example in endpoint.examples:
            for field in fields(endpoint.model, example):
                for sent in sorted(set(JSON_VALUES) - json_types(field.annotation)):
                    body = with_value(example, field.path, JSON_VALUES[sent])
                    case = Case(endpoint, body, field, sent)
                    cases.setdefault(case.id, case)
    return list(cases.values())


CASES = wrong_type_cases()


# --- the app -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def http(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    db: Path = tmp_path_factory.mktemp("strict") / "strict.db"
    # Tool servers named (never reached: the engine calls no tool), so web_search and
    # code_interpreter are served.
    unused = "http://127.0.0.1:9/mcp"
    # A moderation model (the simulated engine, unscripted), so `moderation` is served too.
    args = AppArgs(
        tools=ToolArgs(browser_server_url=unused, python_server_url=unused),
        moderation=ModerationArgs(),
    )
    async with in_process_api(db, args) as api:
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            yield client


def openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error"
    return body["error"]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
async def test_a_value_of_the_wrong_json_type_is_400_naming_its_field(
    http: httpx.AsyncClient, case: Case
) -> None:
    error = openai_error(await http.post(case.endpoint.path, json=case.body), 400)
    named = param(case.field.path)
    # A tag of the wrong type makes an object of no known kind: the object may be named.
    allowed = {named, param(case.field.path[:-1])} if case.field.is_tag else {named}
    assert error["param"] in allowed, (error, json.dumps(case.body)[:300])
    assert error["message"].startswith(f"Invalid value for '{error['param']}': ")


def test_the_sweep_covers_every_model_and_the_fields_named_in_the_issue() -> None:
    for endpoint in ENDPOINTS:
        walked = {field.model for ex in endpoint.examples for field in fields(endpoint.model, ex)}
        missing = reachable_models(endpoint.model) - walked
        assert not missing, f"add an example of {missing} to the examples of {endpoint.path}"
    swept = {param(case.field.path) for case in CASES}
    for name in [
        "temperature",
        "stream",
        "max_output_tokens",
        "reasoning.effort",
        "text.format.strict",
        "tools[0].strict",
        "tools[1].function.strict",
        "tools[3].tools[0].strict",
        "input[2].call_id",
        "input[0].content",
        "tool_choice.function.name",
        "conversation.id",
        "items[2].call_id",
    ]:
        assert name in swept
    sent = {(param(case.field.path), case.sent) for case in CASES}
    assert {
        ("temperature", "boolean"),
        ("stream", "integer"),
        ("max_output_tokens", "string"),
    } <= sent
    assert ("temperature", "integer") not in sent  # an integer is a number


async def test_right_types_pass(http: httpx.AsyncClient) -> None:
    response = await http.post("/v1/responses", json=MAIN_REQUEST)
    assert response.status_code == 200, response.text
    assert response.json()["status"] in ("completed", "incomplete")
    conversation = {"items": MAIN_REQUEST["input"], "metadata": {"topic": "words"}}
    created = await http.post("/v1/conversations", json=conversation)
    assert created.status_code == 200, created.text


async def test_an_integer_is_a_number(http: httpx.AsyncClient) -> None:
    floats = [
        field.path
        for field in fields(ResponsesRequest, MAIN_REQUEST)
        if json_types(field.annotation) >= {"integer", "number"} and not field.path[:-1]
    ]
    assert {("temperature",), ("top_p",)} <= set(floats)
    body = dict(MAIN_REQUEST)
    for path in floats:
        body = with_value(body, path, 1)
    response = await http.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["temperature"] == 1


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"temperature": True}, "temperature"),
        ({"stream": 0}, "stream"),
        ({"max_output_tokens": "5"}, "max_output_tokens"),
        ({"instructions": 5}, "instructions"),
        ({"store": "false"}, "store"),
    ],
)
async def test_the_issue_examples(http: httpx.AsyncClient, body: dict, named: str) -> None:
    response = await http.post("/v1/responses", json={"model": MODEL, "input": "Hi.", **body})
    error = openai_error(response, 400)
    assert error["param"] == named
    assert error["message"].startswith(f"Invalid value for '{named}': ")


@pytest.mark.parametrize(
    ("path", "body", "named"),
    [
        ("/v1/conversations", {"metadata": {"topic": 1}}, "metadata.topic"),
        ("/v1/conversations", {"items": [{"role": "user", "content": 5}]}, "items[0].content"),
        ("/v1/conversations/conv_any", {"metadata": ["x"]}, "metadata"),
        (
            "/v1/conversations/conv_any/items",
            {"items": [{**CALL, "call_id": 7}]},
            "items[0].call_id",
        ),
    ],
)
async def test_conversation_bodies_are_strict(
    http: httpx.AsyncClient, path: str, body: dict, named: str
) -> None:
    assert openai_error(await http.post(path, json=body), 400)["param"] == named
