"""Typed application arguments: the ``args`` of a Serve config's application."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["simulated", "vllm"] = "simulated"
    # Options of the chosen engine: SimulatedEngineConfig or VLLMEngineConfig fields.
    options: dict[str, Any] = Field(default_factory=dict)


# Overrides `store.url` when set: the URL of a shared store carries a password, which belongs in
# a secret (k8s/rayservice.template.yaml sets it from the serve-app Secret), not in a config file.
STORE_URL_ENV = "SERVE_APP_STORE_URL"


def _default_store_url() -> str:
    data_dir = Path(os.environ.get("SERVE_APP_DATA_DIR", "~/.local/share/serve_app")).expanduser()
    return f"sqlite+aiosqlite:///{data_dir / 'responses.db'}"


class StoreConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # SQLAlchemy async URL. The default is an SQLite file (WAL) under $SERVE_APP_DATA_DIR, for
    # one node; several ingress replicas on several nodes share a PostgreSQL URL instead
    # (postgresql+asyncpg://user:password@host/db): an ingress replica on SQLite refuses to
    # start on a cluster of more than one node (serve_app/store/shared.py).
    # $SERVE_APP_STORE_URL overrides it.
    url: str = Field(default_factory=_default_store_url)
    # The connection pool of each ingress replica (SQLAlchemy's, default 5 + 10). A request
    # holds a connection only while it reads its history or stores its turn, never while it
    # streams, so the pool is sized by the store calls in flight, not by the ingress's
    # max_ongoing_requests (512 in configs/gpt-oss.yaml): 16 + 16 lets a burst of 32 turns end
    # at once; 4 ingress replicas then open 128 at most, within k8s/postgres.yaml's
    # max_connections. A request that finds none free waits pool_timeout_s, then fails (500).
    pool_size: int = Field(default=16, gt=0)
    max_overflow: int = Field(default=16, ge=0)
    pool_timeout_s: float = Field(default=10.0, gt=0)
    # Stored responses are kept this many days from their ``created_at`` (OpenAI keeps them
    # 30), then answer 404 like an unknown id (at once: a read checks the age) and are
    # deleted by every ingress replica's sweep. None keeps them forever. Conversations and
    # their items never expire (as at OpenAI); they go when deleted (docs/reliability.md).
    retention_days: float | None = Field(default=30, gt=0)
    # How often each ingress replica sweeps, and how many expired responses one transaction
    # deletes (each with its items, events and run): short transactions, whatever the backlog.
    sweep_interval_s: float = Field(default=600, gt=0)
    sweep_batch: int = Field(default=500, gt=0)

    def resolved_url(self) -> str:
        """$SERVE_APP_STORE_URL when set, else ``url``; read where the store is opened (the
        ingress replica), so the variable comes from that node's environment."""
        return os.environ.get(STORE_URL_ENV) or self.url

    def retention_s(self) -> float | None:
        return None if self.retention_days is None else self.retention_days * 86400


class BackgroundArgs(BaseModel):
    """Leases of background responses (serve_app/serving/background.py).

    The ingress replica running a background response renews its lease every ``renew_s``;
    once ``lease_s`` passes without a renewal (the replica died, the app restarted), any
    replica ends the response as ``failed``. ``lease_s`` is how long an orphan can look alive,
    and must cover a few missed renewals (a slow store) plus the clock skew between nodes.
    """

    model_config = ConfigDict(extra="forbid")

    lease_s: float = Field(default=10, gt=0)
    renew_s: float = Field(default=2, gt=0)
    # How long an ingress replica being stopped (a redeploy, a scale-down) lets its background
    # runs go on before it ends those left `failed`, saying why. Serve kills the replica
    # `graceful_shutdown_timeout_s` (the ResponsesIngress deployment's option; Serve's default
    # 20 s) after it began stopping it, and Ray has no public way to read that from a replica:
    # keep this a margin under it (tests/deploy/test_deployment.py checks the shipped configs).
    shutdown_grace_s: float = Field(default=18, ge=0)

    @model_validator(mode="after")
    def _renewed_within_the_lease(self) -> BackgroundArgs:
        if self.renew_s >= self.lease_s:
            raise ValueError("background.renew_s must be shorter than background.lease_s")
        return self


class Limits(BaseModel):
    """What one request or connection may carry or hold; beyond it the answer is a 4xx (or a
    closed WebSocket), never a crash, a hang, or another tenant starved."""

    model_config = ConfigDict(extra="forbid")

    # One request body, and one WebSocket message.
    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    max_input_items: int = Field(default=4096, gt=0)
    max_tools: int = Field(default=512, gt=0)
    # Responses a WebSocket connection remembers for `previous_response_id` (newest kept).
    max_connection_responses: int = Field(default=64, gt=0)
    # A request body not received whole within this many seconds of the request's start is a
    # 408 and its connection is closed: a body trickled in holds one of the ingress replica's
    # request slots (Ray Serve's `max_ongoing_requests`) for as long as it lasts.
    body_timeout_s: float = Field(default=30.0, gt=0)
    # Open WebSocket connections per ingress replica, in all and per API key (without keys
    # only the total applies). Each holds one of the replica's `max_ongoing_requests` slots
    # (256 by default, 512 in configs/gpt-oss.yaml) for its whole life: the total stays well
    # below it, so HTTP requests and `/health` always find a slot. Beyond: a 429 error event
    # (`rate_limit_exceeded`) and close code 1013 (try again later).
    max_websockets_per_replica: int = Field(default=128, gt=0)
    max_websockets_per_key: int = Field(default=16, gt=0)
    # A WebSocket connection with no message for this long while no response streams is
    # closed (1000), freeing its slot; the client reconnects for its next turn.
    websocket_idle_timeout_s: float = Field(default=300.0, gt=0)
    # Bytes of messages a WebSocket connection may queue behind the response it is streaming;
    # more closes it (1008), so a client's input held in memory stays bounded in bytes.
    max_websocket_pending_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    # Requests a WebSocket connection may queue, all lanes together, behind the responses
    # running; one more closes a connection that names no lane (1008, as a flood), and is
    # refused with a 429 error event on a lane (`stream_id`), the connection kept.
    max_websocket_queued_requests: int = Field(default=16, gt=0)
    # Lanes (`stream_id`) with a response running or queued on one connection: their
    # responses run concurrently. A `response.create` opening one more is refused with a 429
    # error event (`rate_limit_exceeded`, param `stream_id`).
    max_websocket_lanes: int = Field(default=8, gt=0)
    # Accepted `response.steer` inputs one response may hold before its successor commits
    # them; one more is `response.steer.failed` with `too_many_pending_steers`. Their bytes
    # count against `max_websocket_pending_bytes` too.
    max_websocket_steers_per_response: int = Field(default=8, gt=0)
    # Rendering off the event loop (serve_app/serving/turn/render_pool.py): a request with more
    # than this many characters of text (request and history) renders in a worker process;
    # up to it, on the loop, which it holds for a few ms at most (docs/reliability.md).
    render_inline_chars: int = Field(default=2048, ge=0)
    # Worker processes per ingress replica, started with it (each ~133 MB, docs/reliability.md).
    render_workers: int = Field(default=2, gt=0)
    # Characters of text one owner (API key; everyone, for an open API) may have queued or
    # rendering in those workers at once; more is a 429 `rate_limit_exceeded` (param `input`).
    # A request over it alone passes when the owner has nothing there.
    max_render_chars_per_owner: int = Field(default=16 * 1024 * 1024, gt=0)


class StreamingArgs(BaseModel):
    """How the tokens of a turn travel from its engine replica to its ingress replica
    (serve_app/serving/engine/). Each field's environment variable, when set, overrides it:
    read where it is used (`resolved`, in each replica), so from that node's environment."""

    model_config = ConfigDict(extra="forbid")

    # After a chunk is sent, the next is sent no sooner than this: tokens arriving meanwhile
    # ride together (each chunk through a handle, then each ASGI message through the HTTP proxy,
    # costs ~0.1-0.3 ms of CPU whatever it carries). The first token is never held back, so
    # time to first token is unchanged, and a token waits at most this long. 0: no window.
    # $SERVE_APP_STREAM_WINDOW_S overrides it.
    window_s: float = Field(default=0.02, ge=0)
    # Each ingress replica takes its requests' chunks from each engine replica over one channel
    # (a streaming call carrying all of them) once it is open; false keeps every request on its
    # own stream (to compare, or as a way out). $SERVE_APP_ENGINE_CHANNELS=0 turns it off.
    channels: bool = True
    # A channel with no request for this long closes (the next request opens it again).
    # $SERVE_APP_CHANNEL_IDLE_S overrides it.
    channel_idle_s: float = Field(default=2.0, gt=0)
    # A stream from an engine replica that has carried nothing for this long carries a
    # heartbeat (serve_app/serving/engine/liveness.py). $SERVE_APP_ENGINE_HEARTBEAT_S overrides it.
    heartbeat_s: float = Field(default=0.25, gt=0)
    # A stream silent (heartbeats included) for this long makes the ingress ask Ray whether its
    # engine replica's actor is gone: if so, the stream's requests fail now. Well above
    # `heartbeat_s`, so that a late heartbeat on a loaded machine is not taken for a death.
    # $SERVE_APP_ENGINE_SILENCE_S overrides it.
    silence_s: float = Field(default=1.5, gt=0)
    # A stream silent this long fails even though Ray still lists its replica alive: the
    # replica's loop is stuck, not merely starved by a burst of load (which held one for 1.5 s
    # under the overload test). $SERVE_APP_ENGINE_LIVE_SILENCE_S overrides it.
    live_silence_s: float = Field(default=15.0, gt=0)

    def resolved(self) -> StreamingArgs:
        """These settings with the environment's overrides applied."""
        env = os.environ
        update: dict[str, Any] = {}
        if (window := env.get(STREAM_WINDOW_ENV)) is not None:
            update["window_s"] = float(window)
        if (channels := env.get(CHANNELS_ENV)) is not None:
            update["channels"] = channels != "0"
        if (idle := env.get(CHANNEL_IDLE_ENV)) is not None:
            update["channel_idle_s"] = float(idle)
        if (heartbeat := env.get(HEARTBEAT_ENV)) is not None:
            update["heartbeat_s"] = float(heartbeat)
        if (silence := env.get(SILENCE_ENV)) is not None:
            update["silence_s"] = float(silence)
        if (live_silence := env.get(LIVE_SILENCE_ENV)) is not None:
            update["live_silence_s"] = float(live_silence)
        return self.model_copy(update=update)


STREAM_WINDOW_ENV = "SERVE_APP_STREAM_WINDOW_S"
CHANNELS_ENV = "SERVE_APP_ENGINE_CHANNELS"
CHANNEL_IDLE_ENV = "SERVE_APP_CHANNEL_IDLE_S"
HEARTBEAT_ENV = "SERVE_APP_ENGINE_HEARTBEAT_S"
SILENCE_ENV = "SERVE_APP_ENGINE_SILENCE_S"
LIVE_SILENCE_ENV = "SERVE_APP_ENGINE_LIVE_SILENCE_S"
API_KEYS_ENV = "SERVE_APP_API_KEYS"
API_KEYS_FILE_ENV = "SERVE_APP_API_KEYS_FILE"
REASONING_KEY_ENV = "SERVE_APP_REASONING_KEY"


class SecretArgs(BaseModel):
    """The ingress's secrets: API keys (serve_app/serving/http/auth.py) and the key that seals
    reasoning and compaction blobs (serve_app/harmony/reasoning_vault.py). Secrets belong in
    the environment (k8s/rayservice.template.yaml sets them from the serve-app Secret), not in
    a config file: each environment variable, when set, overrides its field, read where it is
    used (`resolved`, in the ingress replica)."""

    model_config = ConfigDict(extra="forbid")

    # Bearer keys any of which opens the API; none (and no file): the API is open.
    # $SERVE_APP_API_KEYS (comma-separated) overrides it.
    api_keys: list[str] = Field(default_factory=list)
    # A file of more keys, one a line (``#`` comments). $SERVE_APP_API_KEYS_FILE overrides it.
    api_keys_file: str | None = None
    # The key that seals reasoning and compaction blobs; comma-separated keys rotate: the first
    # seals, every one opens. Unset: one key the deployment generates once and keeps in the
    # response store, shared by every ingress replica and restart
    # (serve_app/serving/reasoning_keys.py). $SERVE_APP_REASONING_KEY overrides it.
    reasoning_key: str | None = None

    def resolved(self) -> SecretArgs:
        """These settings with the environment's overrides applied."""
        env = os.environ
        update: dict[str, Any] = {}
        if (keys := env.get(API_KEYS_ENV)) is not None:
            update["api_keys"] = [key.strip() for key in keys.split(",") if key.strip()]
        if keys_file := env.get(API_KEYS_FILE_ENV):
            update["api_keys_file"] = keys_file
        if reasoning_key := env.get(REASONING_KEY_ENV):
            update["reasoning_key"] = reasoning_key
        return self.model_copy(update=update)

    def reasoning_keys(self) -> list[str]:
        """The operator's reasoning keys, the sealing one first (none: unset)."""
        return [key.strip() for key in (self.reasoning_key or "").split(",") if key.strip()]


MCP_ALLOW_ENV = "SERVE_APP_MCP_ALLOW"


class ToolArgs(BaseModel):
    """Tools the server runs (serve_app/serving/tools/): what they may reach and how long and
    how much each may take. A request's `mcp` tool names its server; the server is reached only
    when its URL is under an `mcp_allow` prefix (serve_app/serving/tools/mcp/policy.py), and
    every bound below turns a slow, huge or broken server into a failed call the model reads,
    never a hang or a 500 (docs/protocol.md#what-the-server-may-reach)."""

    model_config = ConfigDict(extra="forbid")

    # URL prefixes of the MCP servers requests may name (`https://mcp.example.com/`,
    # `http://127.0.0.1:9000/mcp`): matched on scheme, host, port and whole path segments.
    # Empty (the default): no `mcp` tool is accepted. A name's addresses are checked when it
    # is reached: private and loopback ones only for an entry that names such an address or
    # `localhost`; link-local and metadata ones never. $SERVE_APP_MCP_ALLOW (comma-separated)
    # overrides it.
    mcp_allow: list[str] = Field(default_factory=list)
    # Resolving the name, the TCP (and TLS) connect, and the MCP handshake (initialize).
    mcp_connect_timeout_s: float = Field(default=10.0, gt=0)
    # One `tools/list` in all (connect and handshake included).
    mcp_list_timeout_s: float = Field(default=30.0, gt=0)
    # One `tools/call` in all (connect and handshake included): past it the call fails.
    mcp_call_timeout_s: float = Field(default=60.0, gt=0)
    # Text of one call's result the model is given; a longer result fails the call (the
    # model reads why). Bytes of UTF-8.
    mcp_max_output_bytes: int = Field(default=1024 * 1024, gt=0)
    # Bytes one HTTP response (or SSE event) from an MCP server may carry; more is cut off
    # as it arrives (never buffered whole) and fails the call or the listing.
    mcp_max_response_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    # Tools one server may list; more fails the listing.
    mcp_max_tools: int = Field(default=1000, gt=0)
    # Calls in flight to one server (its URL and credentials) from one ingress replica; more
    # wait their turn (within their own timeout).
    mcp_max_concurrent_calls: int = Field(default=8, gt=0)
    # An MCP session (one per owner, server URL and headers) is kept open this long after its
    # last operation, for that owner's next listing or call (a response's, or the next
    # response's): then ended. And at most this many open per ingress replica (past it, the
    # least recently used idle one is ended for a new one).
    mcp_session_ttl_s: float = Field(default=30.0, gt=0)
    mcp_max_sessions: int = Field(default=256, gt=0)
    # Calls of tools the server runs in one response (an MCP server's, approved ones included,
    # the browser, python, the server's tool_search), whatever the request's `max_tool_calls`
    # (which bounds them too): past it a call is not run, its item fails and the model reads
    # why. A bound on what one request can make the server do.
    max_calls_per_response: int = Field(default=64, gt=0)
    # gpt-oss's own tools (docs/protocol.md#gpt-oss-tools): the MCP tool server that runs the
    # `browser` (a request's web_search) and the one that runs `python` (code_interpreter), as
    # vLLM's --tool-server; streamable HTTP URLs (`http://127.0.0.1:8765/mcp`), one server may
    # be both. Unset (the default): a request offering that tool is a 400. The operator's own
    # servers, so not held to `mcp_allow`; the timeouts and bounds above apply.
    browser_server_url: str | None = None
    python_server_url: str | None = None
    # A `web_search` tool (or `web_search_preview`) without a browser server: Codex puts one in
    # every request unless its user turns it off, so by default ("omit") the request is served
    # without it (the model is told web search is unavailable; the answer's
    # `x-serve-app-omitted-tools` header names it). "refuse": OpenAI's 400 for a model lacking
    # the tool, naming `tools[i].type` (docs/protocol.md#the-tool-table).
    web_search_without_browser: Literal["omit", "refuse"] = "omit"

    @model_validator(mode="after")
    def _allow_entries_are_urls(self) -> ToolArgs:
        for entry in self.mcp_allow:
            parts = urlsplit(entry)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"tools.mcp_allow: {entry!r} is not an http(s) URL")
            if parts.username is not None or parts.password is not None:
                raise ValueError(f"tools.mcp_allow: {entry!r} carries credentials")
        return self

    def resolved(self) -> ToolArgs:
        """These settings with $SERVE_APP_MCP_ALLOW applied, read where the tools run (the
        ingress replica), so from that node's environment."""
        allow = os.environ.get(MCP_ALLOW_ENV)
        if allow is None:
            return self
        entries = [entry.strip() for entry in allow.split(",") if entry.strip()]
        return ToolArgs.model_validate({**self.model_dump(), "mcp_allow": entries})


class AppArgs(BaseModel):
    """What ``serve_app.app:build_app`` takes (validated by Ray Serve from the YAML ``args``)."""

    model_config = ConfigDict(extra="forbid")

    # The name clients put in `model`; aliases are accepted too (e.g. "openai/gpt-oss-120b").
    model: str = "gpt-oss-120b"
    model_aliases: list[str] = Field(default_factory=list)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    limits: Limits = Field(default_factory=Limits)
    background: BackgroundArgs = Field(default_factory=BackgroundArgs)
    streaming: StreamingArgs = Field(default_factory=StreamingArgs)
    secrets: SecretArgs = Field(default_factory=SecretArgs)
    tools: ToolArgs = Field(default_factory=ToolArgs)
    # An app reachable beyond this machine (Serve's http_options.host not loopback, as in
    # configs/gpt-oss.yaml, or a Ray cluster of several nodes) refuses to start without API
    # keys (serve_app/serving/http/exposure.py); true serves it open to anyone who reaches it,
    # said in the log and on `/health` ("api": "open"). On loopback it is open without this.
    allow_open_api: bool = False
    # Context window of the model: prompt + output tokens.
    max_context_tokens: int = Field(default=131072, gt=0)
    # Used when a request sets no max_output_tokens (bounded by what the context leaves).
    default_max_output_tokens: int = Field(default=32768, gt=0)
    # What a reasoning item's `summary` holds when a request asks for one (`reasoning.summary`:
    # auto, concise or detailed). gpt-oss writes no summary, and clients that show reasoning read
    # only summaries (the AI SDK's reasoningText, LangChain, Codex's reasoning display), so
    # "chain_of_thought" fills it with the model's raw chain of thought (the analysis text, one
    # summary_text part streamed as it is generated, besides the reasoning_text content).
    # "none": summaries stay empty, for operators who won't show the chain of thought to
    # summary readers (it still goes to clients that read `content`).
    reasoning_summary: Literal["chain_of_thought", "none"] = "chain_of_thought"

    def served_names(self) -> set[str]:
        return {self.model, *self.model_aliases}
