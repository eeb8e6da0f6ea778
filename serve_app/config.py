"""Typed application arguments: the ``args`` of a Serve config's application."""

from __future__ import annotations

import os
import re
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
    # On a connection with the beta `OpenAI-Beta: responses_multi_agent=v1`: how long a
    # response whose model called tools the client runs waits for their outputs
    # (`response.inject`) before it completes with the calls, as without the beta. It holds no
    # engine slot meanwhile; its lane waits (serve_app/serving/inject.py).
    websocket_inject_wait_s: float = Field(default=30.0, gt=0)
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
    # Empty (the default): no `mcp` tool is accepted. A name's addresses are checked when it is
    # reached: private and loopback ones only for an entry naming such an address or
    # `localhost`; link-local and metadata ones never. $SERVE_APP_MCP_ALLOW (commas) overrides.
    mcp_allow: list[str] = Field(default_factory=list)
    # Resolving the name, the TCP (and TLS) connect, and the MCP handshake (initialize).
    mcp_connect_timeout_s: float = Field(default=10.0, gt=0)
    # One `tools/list` in all (connect and handshake included).
    mcp_list_timeout_s: float = Field(default=30.0, gt=0)
    # One `tools/call` in all (connect and handshake included): past it the call fails.
    mcp_call_timeout_s: float = Field(default=60.0, gt=0)
    # Text of one MCP call's result (its output or its error) kept at all; a longer result
    # fails the call (the model reads why). Bytes of UTF-8: a memory bound, checked before
    # anything counts tokens (what the model is given is bounded below, in tokens).
    mcp_max_output_bytes: int = Field(default=1024 * 1024, gt=0)
    # Tokens of one server-run call's output (or error), as its harmony message, the model is
    # given (MCP, browser, python, tool_search); never more than the context leaves less
    # `output_reserve_tokens` (shared by a round's calls). Past it, or the tokenizer's piece
    # limit (harmony/pieces.py, checked first), the call fails and the model reads why
    # (serving/tools/bounds.py). 16k tokens (~64 KB of prose): most of the 131k context left.
    max_output_tokens: int = Field(default=16384, gt=0)
    # Tokens of the context a tool's output never takes: the model's room to answer after it.
    output_reserve_tokens: int = Field(default=8192, ge=0)
    # Bytes one HTTP response (or SSE event) from an MCP server may carry; more is cut off as
    # it arrives (never buffered whole) and fails the call or the listing.
    mcp_max_response_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    # Tools one server may list; more fails the listing.
    mcp_max_tools: int = Field(default=1000, gt=0)
    # Calls in flight to one server (its URL and credentials) from one ingress replica; more
    # wait their turn (within their own timeout).
    mcp_max_concurrent_calls: int = Field(default=8, gt=0)
    # An MCP session (one per owner, server URL and headers) is kept this long after its last
    # operation, for that owner's next listing or call, then ended; at most this many open per
    # ingress replica (past it, the least recently used idle one is ended for a new one).
    mcp_session_ttl_s: float = Field(default=30.0, gt=0)
    mcp_max_sessions: int = Field(default=256, gt=0)
    # Calls of tools the server runs in one response (MCP, approved ones included, browser,
    # python, tool_search), whatever the request's `max_tool_calls` (which bounds them too):
    # past it a call is not run, its item fails and the model reads why.
    max_calls_per_response: int = Field(default=64, gt=0)
    # gpt-oss's own tools (docs/protocol.md#gpt-oss-tools): the MCP tool server that runs the
    # `browser` (a request's web_search) and the one that runs `python` (code_interpreter), as
    # vLLM's --tool-server; streamable HTTP URLs (`http://127.0.0.1:8765/mcp`), one server may
    # be both. Unset (the default): a request offering that tool is a 400. The operator's own
    # servers, so not held to `mcp_allow`: reached at the name written here, also where it
    # resolves to a private or loopback address (a cluster Service, a sidecar), never a
    # link-local or metadata one; the timeouts and bounds above apply.
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


class ModerationArgs(BaseModel):
    """The moderation model (a request's ``moderation``, docs/protocol.md#moderation):
    gpt-oss-safeguard served as its own engine deployment (``ModerationEngine``) in the same
    Serve application, the operator's policy its prompt. Unset (the default): a request asking
    for moderation is a 400 naming ``moderation``."""

    model_config = ConfigDict(extra="forbid")

    # The name results carry in `model`, and the names a request's `moderation.model` may use
    # (OpenAI's default name among them, so clients written for OpenAI work unchanged; the
    # results still name this model, the one that judged).
    model: str = "gpt-oss-safeguard-20b"
    model_aliases: list[str] = Field(default_factory=lambda: ["omni-moderation-latest"])
    # The classifier's engine: vLLM with gpt-oss-safeguard's weights on GPUs, or the simulated
    # engine (a script plays the classifier: tests, laptops).
    engine: EngineConfig = Field(default_factory=EngineConfig)
    # The policy the classifier is given (a text file); unset: the shipped default, OpenAI's
    # moderation categories (serve_app/protocol/moderation_policy.md). Its categories are the
    # bullets that start with a backticked name; its output format is one JSON object.
    policy_file: str | None = None
    # gpt-oss-safeguard's reasoning effort (harmony's system message): low answers fastest.
    reasoning_effort: Literal["low", "medium", "high"] = "low"
    # A category scored at least this is flagged.
    threshold: float = Field(default=0.5, gt=0, le=1)
    # Output is judged every this many tokens of output text (each judgement sees the window
    # before it too, so content split across two windows is judged whole).
    output_window_tokens: int = Field(default=128, gt=0)
    # One judgement taking longer is an error result (`moderation_timeout`): the most
    # moderation can add to a response's time to first token (with `block` on the input).
    timeout_s: float = Field(default=5.0, gt=0)
    # The classifier's output budget (its reasoning and the JSON answer), and the most tokens
    # of content one judgement reads (an input's last ones).
    max_answer_tokens: int = Field(default=1024, gt=0)
    max_content_tokens: int = Field(default=8192, gt=0)

    def served_names(self) -> set[str]:
        return {self.model, *self.model_aliases}


# The tiers a request is served at (issue 49), most urgent first: every value of the API's
# `service_tier` resolves to one of them (serve_app/protocol/service_tiers.py).
ServedTier = Literal["priority", "default", "flex"]
SERVED_TIERS: tuple[ServedTier, ...] = ("priority", "default", "flex")
# An owner digest: what `ApiKeys.owner` makes of a key (serve_app/serving/http/auth.py).
_OWNER_DIGEST = re.compile(r"[0-9a-f]{32}")


class TierPolicy(BaseModel):
    """What one API key's requests may be served at: a request whose ``service_tier`` resolves
    to a tier not in ``allowed`` is a 400 naming ``service_tier``; ``auto`` (and a request
    that sets none) is served at ``auto``."""

    model_config = ConfigDict(extra="forbid")

    allowed: list[ServedTier] = Field(default_factory=lambda: list(SERVED_TIERS), min_length=1)
    auto: ServedTier = "default"

    @model_validator(mode="after")
    def _auto_is_allowed(self) -> TierPolicy:
        if self.auto not in self.allowed:
            raise ValueError(f"auto tier {self.auto!r} is not among the allowed {self.allowed}")
        return self


def _default_deadlines() -> dict[ServedTier, float]:
    return {"priority": 0.0, "default": 5.0, "flex": 60.0}


class ServiceTierArgs(BaseModel):
    """Service tiers (issue 49, docs/protocol.md#service-tiers): which tiers each API key may
    use, and how the engines order the tiers' requests.

    Every engine serves its waiting requests earliest deadline first, a request's deadline
    being its arrival at the engine plus its tier's ``deadline_s`` (ties: arrival). So a
    priority request goes ahead of the default and flex requests waiting, and a waiting
    request's effective priority improves with its wait: a flex request is never passed by a
    request arriving more than ``deadline_s["flex"] - deadline_s[its tier]`` seconds after it,
    which is how long flex can be held back by the other tiers (no starvation).
    """

    model_config = ConfigDict(extra="forbid")

    # Keys not listed in `keys`, and everyone when the API is open (no keys).
    default: TierPolicy = Field(default_factory=TierPolicy)
    # By owner digest: the 32 hex characters `python -m serve_app.serving.http.auth` prints for
    # a key (keys are secrets: a config names their digests, as the store does).
    keys: dict[str, TierPolicy] = Field(default_factory=dict)
    # Seconds after its arrival at an engine by which a request of each tier is due.
    deadline_s: dict[ServedTier, float] = Field(default_factory=_default_deadlines)
    # Per engine replica: at most this many of a tier's requests in the engine at once; the
    # rest wait in the replica (serve_app/serving/engine/tier_gate.py), so a flex flood cannot
    # fill the engine's batch (its decode slots, its KV cache) and make a priority turn wait
    # for a flex request to end. Unset: no cap.
    max_running: dict[ServedTier, int] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _keys_are_digests_and_tiers_ordered(self) -> ServiceTierArgs:
        for digest in self.keys:
            if not _OWNER_DIGEST.fullmatch(digest):
                raise ValueError(
                    f"service_tiers.keys: {digest!r} is not a key's digest (32 hex characters: "
                    "python -m serve_app.serving.http.auth prints it); never the key itself"
                )
        missing = [tier for tier in SERVED_TIERS if tier not in self.deadline_s]
        if missing:
            raise ValueError(f"service_tiers.deadline_s names no deadline for {missing}")
        if any(limit < 1 for limit in self.max_running.values()):
            raise ValueError("service_tiers.max_running: each at least 1")
        deadlines = [self.deadline_s[tier] for tier in SERVED_TIERS]
        if any(deadline < 0 for deadline in deadlines) or deadlines != sorted(deadlines):
            raise ValueError(
                "service_tiers.deadline_s: each 0 or more, priority's <= default's <= flex's"
            )
        return self

    def policy(self, owner: str | None) -> TierPolicy:
        """The policy of the key whose digest is ``owner`` (None: the API is open)."""
        return self.keys.get(owner, self.default) if owner is not None else self.default


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
    # The moderation model, when the app serves one (None: moderation is refused).
    moderation: ModerationArgs | None = None
    service_tiers: ServiceTierArgs = Field(default_factory=ServiceTierArgs)
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
