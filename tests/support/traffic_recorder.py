"""The recording half of tests/support/traffic.py: what scripts/record_traffic.py wraps the app in.

`TrafficRecorder` is a pure ASGI middleware: it passes every request and WebSocket to the app
unchanged and keeps, for the test running (tests/support/traffic_plugin.py names it on
``/_traffic/begin`` at each test's set-up and ends it on ``/_traffic/end``), the bytes the
client sent and what the app answered. Requests outside a test are not kept.

`recording_files` turns one test's traffic into corpus files: the exchanges of the clients it
knows by their User-Agent (a test's own plumbing, httpx fetching metrics or a stored response,
is not a client and is left out), under the client that sent the test's first request.
"""

from __future__ import annotations

import ast
import base64
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import packages_distributions, version
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.support.helpers import JS_DIR
from tests.support.traffic import CORPUS, TERMINAL, Seen, blob_digest, sse_events, ws_end

CONTROL = "/_traffic/"
# Not kept: the key is the replay's, the host and length are the connection's.
DROPPED_HEADERS = frozenset({"authorization", "host", "content-length"})

# A client and its version from its User-Agent, first match wins (a client built on another
# names itself first: the Agents SDKs' requests go through the openai SDKs).
USER_AGENTS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^codex_\w+/(\S+)"), "codex"),
    (re.compile(r"\bopencode/(\S+)"), "opencode"),
    (re.compile(r"^Agents/Python (\S+)"), "agents-python"),
    (re.compile(r"^Agents/JavaScript (\S+)"), "agents-js"),
    (re.compile(r"\bpydantic-ai/(\S+)"), "pydantic-ai"),
    # The Vercel AI SDK names its core (``ai/7.0.173``: generateText) or its OpenAI provider
    # (``ai-sdk-openai/4.0.118``: streamText), never both: its version is the installed core's.
    (re.compile(r"(?:^|\s)(?:ai|ai-sdk-openai)/\S+"), "ai-sdk"),
    (re.compile(r"^(?:Async)?OpenAI/Python (\S+)"), "openai-python"),  # the class names itself
    (re.compile(r"^OpenAI/JS (\S+)"), "openai-node"),
]
# Clients whose version their User-Agent does not say: the npm package tests/js installed.
NPM_VERSIONS = {"ai-sdk": "ai"}
# Clients whose requests carry the openai SDK's User-Agent: named by the distribution the test
# module imports (its installed version), when it imports one.
ON_OPENAI_PYTHON = {"langchain-openai": "langchain", "pydantic-ai-slim": "pydantic-ai"}


def client_of(headers: Iterable[tuple[str, str]], imports: Mapping[str, str]) -> tuple[str, str]:
    """``(client, version)`` from a request's User-Agent and the test module's imported
    distributions; ``("", "")`` for none the corpus knows."""
    agent = next((value for name, value in headers if name == "user-agent"), "")
    matches = ((client, pattern.search(agent)) for pattern, client in USER_AGENTS)
    client, found = next(((client, found) for client, found in matches if found), ("", None))
    if found is None:
        return "", ""
    if client in NPM_VERSIONS:
        return client, npm_version(NPM_VERSIONS[client])
    if client == "openai-python":
        for distribution, wrapper in ON_OPENAI_PYTHON.items():
            if distribution in imports:
                return wrapper, imports[distribution]
    return client, found[1]


def npm_version(package: str) -> str:
    manifest = JS_DIR / "node_modules" / package / "package.json"
    return json.loads(manifest.read_text())["version"]


def imported_distributions(module: Path) -> dict[str, str]:
    """The installed distributions (name: version) whose packages ``module`` imports, anywhere
    in it (some tests import inside a test function)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    owners = packages_distributions()
    return {dist: version(dist) for name in sorted(names) for dist in owners.get(name, [])}


# --- what one test sent ----------------------------------------------------------------------


@dataclass
class WsMessage:
    text: str
    answers: list[str] = field(default_factory=list)  # the server's messages until the next


@dataclass
class Exchange:
    """One HTTP request or one WebSocket connection, as it went."""

    transport: str
    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    body: bytes = b""
    status: int = 0
    content_type: str = ""
    answer: bytearray = field(default_factory=bytearray)
    messages: list[WsMessage] = field(default_factory=list)


@dataclass
class Scenario:
    """One test's traffic: its node id, the distributions its module imports, its exchanges."""

    test: str
    imports: dict[str, str]
    exchanges: list[Exchange] = field(default_factory=list)
    passed: bool = False


def left_out(traffic: Scenario) -> list[str]:
    """The User-Agents of the test's exchanges no known client sent (its own plumbing)."""
    return [
        dict(exchange.headers).get("user-agent", "(none)")
        for exchange in traffic.exchanges
        if not client_of(exchange.headers, traffic.imports)[0]
    ]


def _headers(scope: Scope) -> list[tuple[str, str]]:
    raw = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in scope["headers"]]
    return [(name, value) for name, value in raw if name.lower() not in DROPPED_HEADERS]


def _exchange(scope: Scope) -> Exchange:
    return Exchange(
        transport="websocket" if scope["type"] == "websocket" else "http",
        method=scope.get("method", "GET"),
        path=scope["path"],
        query=scope.get("query_string", b"").decode("latin-1"),
        headers=_headers(scope),
    )


class TrafficRecorder:
    """Pure ASGI: the app's traffic during each test, kept in ``tests`` by test."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.tests: list[Scenario] = []
        self._current: Scenario | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(CONTROL):
            await self._control(scope, receive, send)
        elif scope["type"] in ("http", "websocket") and self._current is not None:
            exchange = _exchange(scope)
            self._current.exchanges.append(exchange)
            record = self._record_http if exchange.transport == "http" else self._record_ws
            await self.app(scope, *record(exchange, receive, send))
        else:
            await self.app(scope, receive, send)

    async def _control(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while (message := await receive())["type"] == "http.request":
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        notice = json.loads(body or b"{}")
        if scope["path"].endswith("/begin"):
            self._current = Scenario(notice["test"], notice.get("imports", {}))
            self.tests.append(self._current)
        elif self._current is not None:
            self._current.passed = bool(notice.get("passed"))
            self._current = None
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    @staticmethod
    def _record_http(exchange: Exchange, receive: Receive, send: Send) -> tuple[Receive, Send]:
        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                exchange.body += message.get("body", b"")
            return message

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
                headers = dict(message.get("headers", []))
                exchange.content_type = headers.get(b"content-type", b"").decode("latin-1")
            elif message["type"] == "http.response.body":
                exchange.answer += message.get("body", b"")
            await send(message)

        return receiving, sending

    @staticmethod
    def _record_ws(exchange: Exchange, receive: Receive, send: Send) -> tuple[Receive, Send]:
        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "websocket.receive":
                text = message.get("text")
                if text is None:  # a binary frame: kept as the text it decodes to
                    text = message.get("bytes", b"").decode("utf-8", "replace")
                exchange.messages.append(WsMessage(text))
            return message

        async def sending(message: Message) -> None:
            kind = message["type"]
            if kind == "websocket.accept":
                exchange.status = 101
            elif kind == "websocket.http.response.start":
                exchange.status = message["status"]
            elif kind == "websocket.send" and exchange.messages:
                sent = message.get("text") or message.get("bytes", b"").decode()
                exchange.messages[-1].answers.append(sent)
            await send(message)

        return receiving, sending


# --- corpus files ----------------------------------------------------------------------------


def scenario_name(test: str) -> str:
    """``test_codex_0169_runs_exec[http]`` -> ``codex-0169-runs-exec-http``."""
    name = test.split("::")[-1].removeprefix("test_")
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _http_entry(exchange: Exchange, seen: Seen) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "transport": "http",
        "method": exchange.method,
        "path": exchange.path,
        "query": exchange.query,
        "headers": [list(header) for header in exchange.headers],
    }
    try:
        entry["body"] = exchange.body.decode("utf-8")
        sent = entry["body"]
    except UnicodeDecodeError:
        entry["body_base64"] = base64.b64encode(exchange.body).decode()
        sent = ""
    seen.sent(f"{exchange.path}?{exchange.query} {sent}")
    text = exchange.answer.decode("utf-8", "replace")
    entry["answer"] = _answer(seen, text, status=exchange.status, end=_http_end(exchange, text))
    return entry


def _http_end(exchange: Exchange, text: str) -> str | None:
    """How the answer ended: an SSE stream's last event, a JSON response's status."""
    if exchange.content_type.startswith("text/event-stream"):
        events = list(sse_events(text))
        return events[-1]["type"] if events else "nothing"
    if exchange.status == 200 and exchange.content_type.startswith("application/json"):
        data = json.loads(text)
        return data.get("status") if isinstance(data, dict) else None
    return None


def _ws_entry(exchange: Exchange, seen: Seen) -> dict[str, Any]:
    messages = []
    for message in exchange.messages:
        seen.sent(message.text)
        events = map(json.loads, message.answers)
        ends = [ws_end(event) for event in events if event.get("type") in TERMINAL]
        answer = _answer(seen, "\n".join(message.answers), ends=ends)
        messages.append({"text": message.text, "answer": answer})
    return {
        "transport": "websocket",
        "path": exchange.path,
        "query": exchange.query,
        "headers": [list(header) for header in exchange.headers],
        "status": exchange.status,
        "messages": messages,
    }


def _answer(seen: Seen, text: str, **outcome: Any) -> dict[str, Any]:
    minted, sealed = seen.answered(text)
    answer = {key: value for key, value in outcome.items() if value is not None}
    return {**answer, "minted": minted, "sealed": [blob_digest(blob) for blob in sealed]}


def recording_files(
    traffic: Scenario, mcp_roles: Mapping[str, str], recorded: str
) -> dict[Path, dict[str, Any]]:
    """The corpus file of one test (by path; none when no known client spoke): its known
    clients' exchanges, under the client that sent the first."""
    known = []
    for exchange in traffic.exchanges:
        client = client_of(exchange.headers, traffic.imports)
        if client[0]:
            known.append((client, exchange))
    if not known:
        return {}
    (client, version), _ = known[0]
    seen = Seen()
    entries = []
    for (name, its_version), exchange in known:
        make = _ws_entry if exchange.transport == "websocket" else _http_entry
        entries.append({"client": f"{name} {its_version}", **make(exchange, seen)})
    text = json.dumps(entries)
    recording = {
        "client": client,
        "version": version,
        "test": traffic.test,
        "recorded": recorded,
        "recorder": "scripts/record_traffic.py",
        "user_agent": dict(known[0][1].headers).get("user-agent", ""),
        "mcp_servers": {origin: role for origin, role in mcp_roles.items() if origin in text},
        "exchanges": entries,
    }
    return {CORPUS / f"{client}-{version}" / f"{scenario_name(traffic.test)}.json": recording}


# A header, ``["name", "value"]``, on one line of the file (json's indent puts each on three).
_PAIR = re.compile(r'\[\n\s*("(?:[^"\\]|\\.)*"),\n\s*("(?:[^"\\]|\\.)*")\n\s*\]')


def dumps(recording: Mapping[str, Any]) -> str:
    """A corpus file's text: indented, a header a line, non-ASCII as it was sent."""
    text = json.dumps(recording, indent=1, ensure_ascii=False)
    return _PAIR.sub(r"[\1, \2]", text) + "\n"
