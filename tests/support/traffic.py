"""Real clients' traffic as fixtures (issue 45): the corpus's files, and their replay.

The corpus, ``tests/fixtures/traffic/<client>-<version>/<scenario>.json``, is what real clients
sent while the tests of tests/clients/ drove them (scripts/record_traffic.py records it: one
file per test, under the client that sent its first request). Each file names its client,
version, test and date, and holds the test's exchanges in the order they began:

- an HTTP request: method, path, query, the headers the client sent (less ``authorization``,
  ``host`` and ``content-length``), the raw body (``body``: the text when it is UTF-8,
  ``body_base64`` otherwise);
- a WebSocket: the handshake's path, query and headers, and each message the client sent, its
  raw text, in order;

and, for each request or message, what the recording server answered: its status and end (an
SSE stream's last event, a JSON response's status; a message's terminal events), the ids it
minted there (``minted``: every id of the server's prefixes, ``resp_``, ``msg_``, ``fc_``,
``call_``, ``mcpr_``..., first seen in that answer, in order) and the digests of the blobs it
sealed there (``sealed``: each new ``encrypted_content``).

`replay` plays a file against a base URL, in order, the recorded bytes changed only where they
must be: the API key is the replay's; an id the recording server minted is replaced by the id
the replay's server minted at the same place (the n-th new id of that prefix in the answer to
the same request), and so is a sealed blob (the n-th new blob of that answer); the origin of
each test MCP server the recording named (``mcp_servers``: origin -> role of
tests/support/mcp_app.py) by the replay's. Every answer is checked: its status and end as
recorded, every SSE event and WebSocket event and every JSON body valid as the openai SDK
types it. The first answer whose status or end differs stops the replay (later requests
name what it would have made) and is its outcome, a `Deviation`.
"""

from __future__ import annotations

import asyncio
import base64
import fnmatch
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml
from openai.types import Model
from openai.types.beta.beta_responses_server_event import BetaResponsesServerEvent
from openai.types.conversations import Conversation
from openai.types.responses import (
    CompactedResponse,
    Response,
    ResponseInputItem,
    ResponseOutputItem,
    ResponsesServerEvent,
    ResponseStreamEvent,
)
from openai.types.responses.input_token_count_response import InputTokenCountResponse
from openai.types.shared import ErrorObject
from pydantic import BaseModel, TypeAdapter, ValidationError
from websockets.asyncio.client import connect

from serve_app.protocol.builtin_items import CodeInterpreterCallItems, WebSearchCallItems
from serve_app.protocol.mcp_events import APPROVAL_PREFIX, CALL_PREFIX, LIST_PREFIX
from serve_app.protocol.responses import ITEM_ID_PREFIXES
from tests.support import REPO

CORPUS = REPO / "tests" / "fixtures" / "traffic"
# The outcome of each corpus file through each shipped config, where it is not the recording's.
EXPECTED = CORPUS / "expected.yaml"
# The configs that ship (configs/*.yaml), each replaying the corpus in the fast tier.
SHIPPED = ("local.yaml", "gpt-oss.yaml", "gpt-oss-shared-kv.yaml")
# Where docs/testing.md shows `replay_table` (scripts/record_traffic.py writes it there).
DOCS = REPO / "docs" / "testing.md"
TABLE_START = "<!-- replay table: scripts/record_traffic.py --table writes it -->"
TABLE_END = "<!-- end of the replay table -->"

# --- what the server mints -------------------------------------------------------------------

# Every prefix of an id the server mints (serve_app/protocol/responses.py and the tool items'
# builders): ``resp_`` and ``conv_`` + 32 hex, a call's ``call_`` + 24, an item's + 32.
PREFIXES = sorted(
    {
        "resp",
        "conv",
        "call",
        "item",
        *ITEM_ID_PREFIXES.values(),
        LIST_PREFIX,
        CALL_PREFIX,
        APPROVAL_PREFIX,
        WebSearchCallItems.id_prefix,
        CodeInterpreterCallItems.id_prefix,
    },
    key=lambda prefix: (-len(prefix), prefix),
)
MINTED_ID = re.compile(
    rf"(?<![A-Za-z0-9_])(?:{'|'.join(PREFIXES)})_[0-9a-f]{{24}}(?:[0-9a-f]{{8}})?(?![A-Za-z0-9])"
)
# A sealed blob as JSON carries it (urlsafe base64, so never escaped).
SEALED_BLOB = re.compile(r'"encrypted_content"\s*:\s*"([A-Za-z0-9_\-=]+)"')
# The events that end a response, over SSE or a WebSocket (an error event ends a request too).
TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")
# Handshake headers the WebSocket library makes itself (a replay's own key and extensions).
HANDSHAKE_OWN = frozenset(
    {"connection", "upgrade", "sec-websocket-key", "sec-websocket-version"}
    | {"sec-websocket-extensions", "sec-websocket-protocol"}
)


def prefix_of(minted_id: str) -> str:
    return minted_id.rsplit("_", 1)[0]


def blob_digest(blob: str) -> str:
    """What the corpus keeps of a sealed blob (the blob itself is long and says nothing)."""
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def ids_in(text: str) -> list[str]:
    """The minted-looking ids in ``text``, each once, in order of first appearance."""
    return list(dict.fromkeys(MINTED_ID.findall(text)))


def blobs_in(text: str) -> list[str]:
    return list(dict.fromkeys(SEALED_BLOB.findall(text)))


@dataclass
class Seen:
    """The ids and blobs one side of a replay (or the recording) has seen so far: what a new
    answer mints is what it shows that none of the requests sent and answers read before did."""

    ids: set[str] = field(default_factory=set)
    blobs: set[str] = field(default_factory=set)

    def sent(self, text: str) -> None:
        self.ids.update(ids_in(text))
        self.blobs.update(blobs_in(text))

    def answered(self, text: str) -> tuple[list[str], list[str]]:
        """The ids and blobs ``text`` mints, in order; now seen."""
        minted = [found for found in ids_in(text) if found not in self.ids]
        sealed = [found for found in blobs_in(text) if found not in self.blobs]
        self.sent(text)
        return minted, sealed


# --- the replay's substitutions --------------------------------------------------------------


@dataclass
class Substitutions:
    """What a replay puts in place of the recording's: ids and blobs the recording server minted
    (by the replay server's at the same place of the same answer) and MCP servers' origins."""

    ids: dict[str, str] = field(default_factory=dict)
    blobs: dict[str, str] = field(default_factory=dict)  # recorded digest -> replay's blob
    origins: dict[str, str] = field(default_factory=dict)

    def learn(self, recorded: Mapping[str, Any], minted: list[str], sealed: list[str]) -> None:
        """Pair the recording's answer (its ``minted`` and ``sealed``) with the replay's:
        the n-th new id of each prefix, the n-th new blob."""
        theirs = _by_prefix(recorded.get("minted", []))
        ours = _by_prefix(minted)
        for prefix, ids in theirs.items():
            self.ids.update(zip(ids, ours.get(prefix, []), strict=False))
        self.blobs.update(zip(recorded.get("sealed", []), sealed, strict=False))

    def apply(self, text: str) -> str:
        for recorded, replayed in self.origins.items():
            text = re.sub(rf"{re.escape(recorded)}(?![0-9])", replayed, text)
        text = MINTED_ID.sub(lambda match: self.ids.get(match[0], match[0]), text)
        return SEALED_BLOB.sub(self._blob, text)

    def _blob(self, match: re.Match[str]) -> str:
        replayed = self.blobs.get(blob_digest(match[1]))
        return match[0] if replayed is None else match[0].replace(match[1], replayed)


def _by_prefix(ids: Iterable[str]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for minted_id in ids:
        grouped.setdefault(prefix_of(minted_id), []).append(minted_id)
    return grouped


# --- the corpus ------------------------------------------------------------------------------


def corpus_files(corpus: Path = CORPUS) -> list[Path]:
    return sorted(corpus.glob("*/*.json"))


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def body_bytes(exchange: Mapping[str, Any]) -> bytes:
    if "body_base64" in exchange:
        return base64.b64decode(exchange["body_base64"])
    return (exchange.get("body") or "").encode()


def transports(recording: Mapping[str, Any]) -> list[str]:
    """The transports a file's exchanges use (``http``, ``websocket``), in order."""
    return list(dict.fromkeys(exchange["transport"] for exchange in recording["exchanges"]))


def file_id(path: Path) -> str:
    return path.relative_to(CORPUS).as_posix()


def refusals() -> list[dict[str, Any]]:
    """The table of expected.yaml: what a shipped config refuses, and why."""
    return yaml.safe_load(EXPECTED.read_text())["refusals"]


def expected_refusal(path: Path, config: str) -> dict[str, Any] | None:
    """The refusal of corpus file ``path`` the table gives ``config``; None: answered as
    recorded."""
    name = file_id(path)
    for refusal in refusals():
        files = refusal["files"]
        if config in refusal["configs"] and any(fnmatch.fnmatch(name, f) for f in files):
            return refusal
    return None


# --- the table docs/testing.md shows ----------------------------------------------------------


def replay_table(files: Iterable[Path]) -> str:
    """Client and version x transport, a row each, x the shipped configs and the session app:
    how many files, and what each config answers them (expected.yaml)."""
    rows: dict[tuple[str, str], list[Path]] = {}
    for path in files:
        recording = load(path)
        key = (f"{recording['client']} {recording['version']}", " + ".join(transports(recording)))
        rows.setdefault(key, []).append(path)
    head = ["client and version", "transport", "files", *(f"`{c}`" for c in SHIPPED)]
    lines = [_row([*head, "session app, fast path"]), _row(["---"] * (len(head) + 1))]
    for (client, transport), paths in sorted(rows.items()):
        cells = [_outcomes(paths, config) for config in SHIPPED]
        lines.append(_row([client, transport, str(len(paths)), *cells, _outcomes(paths, None)]))
    return "\n".join(lines)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _outcomes(paths: list[Path], config: str | None) -> str:
    """``200`` (every file answered as recorded, all 200), or each outcome with its count."""
    counts: dict[str, int] = {}
    for path in paths:
        refusal = expected_refusal(path, config) if config else None
        if refusal is None:
            statuses = {exchange_status(e) for e in load(path)["exchanges"]}
            outcome = "200" if statuses == {200} else "as recorded"
        else:
            outcome = f"{refusal['status']} `{refusal['param']}`"
        counts[outcome] = counts.get(outcome, 0) + 1
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{outcome} ({count})" for outcome, count in sorted(counts.items()))


def exchange_status(exchange: Mapping[str, Any]) -> int:
    """An HTTP request's recorded status; a WebSocket's 200 when every response it asked for
    completed (or ended as a response does), its first error's status otherwise."""
    if exchange["transport"] == "http":
        return exchange["answer"]["status"]
    ends = [end for message in exchange["messages"] for end in message["answer"]["ends"]]
    errors = [end.removeprefix("error ") for end in ends if end.startswith("error")]
    if not errors:
        return 200
    return int(errors[0]) if errors[0].isdigit() else 0


def docs_with_table(text: str, table: str) -> str:
    """docs/testing.md's ``text`` with ``table`` between its markers."""
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    return f"{text[:start]}\n{table}\n{text[end:]}"


# --- checking answers ------------------------------------------------------------------------


class ModelList(BaseModel):
    data: list[Model]


class CompactedAnswer(CompactedResponse):
    """A compaction as the SDK's ``responses.compact`` reads it: OpenAI keeps the user's messages
    as they were sent (input messages), which the SDK's type calls output items."""

    output: list[ResponseOutputItem | ResponseInputItem]  # type: ignore[assignment]


STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(ResponsesServerEvent)
# A WebSocket opened with a beta's header is answered with that beta's events too: as the SDK's
# beta client reads them (``response.inject.created`` / ``.failed``: responses_multi_agent=v1).
BETA_SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(BetaResponsesServerEvent)
ERROR: TypeAdapter[Any] = TypeAdapter(ErrorObject)
# A JSON answer's type, by method and path (a path segment ``*`` is any id).
JSON_ANSWERS: dict[tuple[str, str], TypeAdapter[Any]] = {
    ("POST", "/v1/responses"): TypeAdapter(Response),
    ("GET", "/v1/responses/*"): TypeAdapter(Response),
    ("POST", "/v1/responses/*/cancel"): TypeAdapter(Response),
    ("POST", "/v1/responses/compact"): TypeAdapter(CompactedAnswer),
    ("POST", "/v1/responses/input_tokens"): TypeAdapter(InputTokenCountResponse),
    ("GET", "/v1/models"): TypeAdapter(ModelList),
    ("POST", "/v1/conversations"): TypeAdapter(Conversation),
    ("GET", "/v1/conversations/*"): TypeAdapter(Conversation),
}


def sse_events(text: str) -> Iterator[dict[str, Any]]:
    """The JSON data of each event of an SSE body, each checked against its ``event:`` name."""
    for block in re.split(r"\r?\n\r?\n", text):
        name, data = None, []
        for line in block.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
        if not data:
            continue
        event = json.loads("\n".join(data))
        assert name in (None, event.get("type")), f"event: {name} carries {event.get('type')}"
        yield event


def json_adapter(method: str, path: str) -> TypeAdapter[Any] | None:
    """The type of a JSON answer to ``method path``: a literal route first, then one with ids."""
    if (method, path) in JSON_ANSWERS:
        return JSON_ANSWERS[method, path]
    parts = path.split("/")
    for (known_method, known_path), adapter in JSON_ANSWERS.items():
        known = known_path.split("/")
        if (known_method, len(known)) == (method, len(parts)) and all(
            k in ("*", p) for k, p in zip(known, parts, strict=True)
        ):
            return adapter
    return None


def stream_end(events: list[dict[str, Any]]) -> str:
    """How an SSE stream ended: its last event's type (``response.completed``...)."""
    return events[-1]["type"] if events else "nothing"


def error_of(answer: Mapping[str, Any]) -> dict[str, Any]:
    """The ``error`` of an HTTP error body or of a WebSocket error event (OpenAI's error may
    leave out ``param`` and ``code``; the SDK's type names them)."""
    return {"param": None, "code": None, **(answer.get("error") or {})}


def valid(adapter: TypeAdapter[Any], data: Any, at: str) -> None:
    """``data`` as the openai SDK types it, or a failure naming the exchange and the event."""
    try:
        adapter.validate_python(data)
    except ValidationError as error:
        what = data.get("type", "the body") if isinstance(data, dict) else "the body"
        raise AssertionError(f"exchange {at}: {what} is not valid for the SDK: {error}") from None


# --- the replay ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Deviation:
    """The first answer that was not the recording's: which exchange (``3``, or ``3.1`` for a
    WebSocket's second message), what came instead, and the error's param, code and message."""

    at: str
    status: int | str
    recorded: int | str
    param: str | None = None
    code: str | None = None
    message: str = ""

    def __str__(self) -> str:
        return (
            f"exchange {self.at}: {self.status} (recorded {self.recorded}), "
            f"param {self.param!r}, code {self.code!r}: {self.message}"
        )


class Stop(Exception):
    def __init__(self, deviation: Deviation) -> None:
        super().__init__(str(deviation))
        self.deviation = deviation


@dataclass
class Replay:
    """One corpus file played against ``base_url`` with ``api_key``; ``origins``: the replay's
    MCP test server origin of each role the recording names."""

    recording: Mapping[str, Any]
    base_url: str
    api_key: str
    origins: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 60
    subs: Substitutions = field(default_factory=Substitutions)
    seen: Seen = field(default_factory=Seen)

    async def run(self) -> Deviation | None:
        self.subs.origins = {
            origin: self.origins[role] for origin, role in self.recording["mcp_servers"].items()
        }
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s) as http:
                for index, exchange in enumerate(self.recording["exchanges"]):
                    if exchange["transport"] == "websocket":
                        await self._websocket(str(index), exchange)
                    else:
                        await self._http(http, str(index), exchange)
        except Stop as stop:
            return stop.deviation
        return None

    # --- HTTP

    async def _http(self, http: httpx.AsyncClient, at: str, exchange: Mapping[str, Any]) -> None:
        path = self.subs.apply(exchange["path"])
        query = self.subs.apply(exchange["query"])
        body = self._body(exchange)
        # Built bare: exactly the recorded headers, the replay's key, none of httpx's own.
        headers = [(name, self.subs.apply(value)) for name, value in exchange["headers"]]
        headers.append(("authorization", f"Bearer {self.api_key}"))
        url = self.base_url + path + (f"?{query}" if query else "")
        request = httpx.Request(exchange["method"], url, headers=headers, content=body)
        self.seen.sent(f"{path}?{query} {body.decode(errors='replace')}")
        answer = await http.send(request)
        text = answer.text
        recorded = exchange["answer"]
        self._check_status(at, answer.status_code, recorded, text)
        end = self._check_http_body(at, exchange["method"], path, answer, text)
        if recorded.get("end") and end != recorded["end"]:
            raise Stop(Deviation(at, str(end), recorded["end"], message=text[-2000:]))
        self.subs.learn(recorded, *self.seen.answered(text))

    def _body(self, exchange: Mapping[str, Any]) -> bytes:
        if "body_base64" in exchange:  # not text: sent as recorded
            return body_bytes(exchange)
        return self.subs.apply(exchange.get("body") or "").encode()

    def _check_status(self, at: str, status: int, recorded: Mapping[str, Any], text: str) -> None:
        if status == recorded["status"]:
            return
        error = _json_or_empty(text).get("error") or {}
        raise Stop(
            Deviation(
                at,
                status,
                recorded["status"],
                error.get("param"),
                error.get("code"),
                error.get("message") or text[:2000],
            )
        )

    def _check_http_body(
        self, at: str, method: str, path: str, answer: httpx.Response, text: str
    ) -> str | None:
        """Every event or the JSON body valid for the SDK; the stream's end or the response's
        status."""
        kind = answer.headers.get("content-type", "")
        if kind.startswith("text/event-stream"):
            events = list(sse_events(text))
            for event in events:
                valid(STREAM_EVENT, event, at)
            return stream_end(events)
        if not kind.startswith("application/json"):
            return None
        data = answer.json()
        if answer.status_code >= 400:
            valid(ERROR, error_of(data), at)
            return None
        if adapter := json_adapter(method, urlsplit(path).path):
            valid(adapter, data, at)
        return data.get("status") if isinstance(data, dict) else None

    # --- WebSocket

    async def _websocket(self, at: str, exchange: Mapping[str, Any]) -> None:
        url = self.base_url.replace("http", "ws", 1) + self.subs.apply(exchange["path"])
        if query := self.subs.apply(exchange["query"]):
            url += f"?{query}"
        recorded = [(n, v) for n, v in exchange["headers"] if n.lower() not in HANDSHAKE_OWN]
        headers = [(name, self.subs.apply(value)) for name, value in recorded]
        headers.append(("authorization", f"Bearer {self.api_key}"))
        options = {"additional_headers": headers, "user_agent_header": None}
        beta = any(name.lower() == "openai-beta" for name, _ in recorded)
        events = BETA_SERVER_EVENT if beta else SERVER_EVENT
        async with connect(url, open_timeout=self.timeout_s, **options) as socket:
            for index, message in enumerate(exchange["messages"]):
                await self._message(socket, f"{at}.{index}", message, events)

    async def _message(
        self, socket: Any, at: str, message: Mapping[str, Any], events: TypeAdapter[Any]
    ) -> None:
        text = self.subs.apply(message["text"])
        self.seen.sent(text)
        await socket.send(text)
        recorded = message["answer"]
        received: list[str] = []
        ends: list[str] = []
        while len(ends) < len(recorded["ends"]) or self._awaits_minted(recorded, received):
            received.append(await _recv(socket, self.timeout_s))
            event = json.loads(received[-1])
            valid(events, event, at)
            if event["type"] in TERMINAL:
                ends.append(ws_end(event))
                if ends[-1] != recorded["ends"][len(ends) - 1]:
                    raise Stop(_ws_deviation(at, event, recorded["ends"][len(ends) - 1]))
        self.subs.learn(recorded, *self.seen.answered("\n".join(received)))

    def _awaits_minted(self, recorded: Mapping[str, Any], received: list[str]) -> bool:
        """Whether a message the recording answered without a terminal event (a response
        waiting for the client's tool outputs, to be injected) has yet to mint what the
        recording's answer did: the ids the client's next message names. Without this wait
        the next message went out before them, naming the recording's ids."""
        if recorded["ends"]:
            return False
        wanted = _by_prefix(recorded.get("minted", []))
        new = _by_prefix(i for i in ids_in("\n".join(received)) if i not in self.seen.ids)
        return any(len(new.get(prefix, [])) < len(ids) for prefix, ids in wanted.items())


def _ws_deviation(at: str, event: Mapping[str, Any], recorded: str) -> Deviation:
    if event["type"] != "error":
        return Deviation(at, event["type"], recorded, message=json.dumps(event)[:2000])
    error = error_of(event)
    return Deviation(
        at,
        event.get("status") or "error",
        recorded,
        error.get("param"),
        error.get("code"),
        error.get("message", ""),
    )


def ws_end(event: Mapping[str, Any]) -> str:
    """A WebSocket terminal event as the corpus keeps it: its type, an error with its status."""
    if event["type"] == "error":
        return f"error {event.get('status')}"
    return event["type"]


async def _recv(socket: Any, timeout_s: float) -> str:
    message = await asyncio.wait_for(socket.recv(), timeout_s)
    return message if isinstance(message, str) else message.decode()


def _json_or_empty(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


async def replay(
    path: Path, base_url: str, api_key: str, origins: Mapping[str, str] | None = None
) -> Deviation | None:
    """Play the corpus file ``path`` against ``base_url``: None when every answer was the
    recording's (and valid for the SDK), else the first that was not."""
    return await Replay(load(path), base_url, api_key, origins or {}).run()
