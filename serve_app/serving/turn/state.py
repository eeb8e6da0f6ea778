"""What a turn carries from the door to its stored end: the ask as it arrives (`Ask`), the
request with its history once admitted (`Context`), and the turn being generated (`Turn`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

from openai.types.responses import Response, ResponseStreamEvent

from serve_app.config import ServedTier
from serve_app.engines.base import GenerateRequest
from serve_app.harmony.stream import ResponseStreamTranslator
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol.prompt_cache_diagnostics import PromptFingerprint
from serve_app.protocol.requests import InputItem, ResponsesRequest
from serve_app.serving.moderation import TurnModeration
from serve_app.serving.tools.contract import ToolSession
from serve_app.serving.tools.mcp_trust import TrustedMcp
from serve_app.serving.turn.client_outputs import ClientOutputs


@dataclass(frozen=True)
class Ask:
    """A request at the door, with who sent it and how it is judged: what admitting,
    rendering and preparing a turn all take."""

    request: ResponsesRequest
    # Who made the request (a digest of their API key; None when the API is open).
    owner: str | None = None
    # Contexts of responses not in the store (a WebSocket connection's), by id.
    recent: Mapping[str, list[InputItem]] | None = None
    # The fingerprints of those responses' prompts, by id (prompt-cache diagnostics compare
    # with them: serve_app/serving/turn/cache_diagnostics.py).
    recent_prompts: Mapping[str, PromptFingerprint] | None = None
    # False: the server built the request (compaction's), so its item count is not the
    # client's to keep within ``max_input_items``.
    check_limits: bool = True


@dataclass(frozen=True)
class Context:
    """A request with its item references resolved, and the stored items it continues; once
    admitted, its tools as rendering sees them too (built once per request)."""

    request: ResponsesRequest
    history: list[InputItem]
    tools: ToolRegistry | None = None
    # The context's MCP listings and approval requests this server issued to the owner.
    mcp: TrustedMcp = field(default_factory=TrustedMcp)
    # The tier it is served at: its `service_tier` as its key's policy resolves it (issue 49).
    tier: ServedTier = "default"


@dataclass
class Turn:
    """A validated, rendered request, ready to generate."""

    request: ResponsesRequest
    generate: GenerateRequest
    translator: ResponseStreamTranslator
    # The items before the request's input: a stored chain or conversation, or none.
    history: list[InputItem] = field(default_factory=list)
    # Who made the request (a digest of their API key; None when the API is open).
    owner: str | None = None
    # The tier it is served at (issue 49): every engine request of the turn is scheduled so.
    tier: ServedTier = "default"
    # What it keeps of its rendered prompt for prompt-cache diagnostics (None: nothing).
    prompt: PromptFingerprint | None = None
    # The fingerprint of the response its diagnostics compare with, when one was found (a
    # server-side compaction compares the compacted prompt with it again).
    comparison: PromptFingerprint | None = None
    arrived_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    # Whether the response should end at its next safe boundary (`ResponseStreamTranslator.
    # at_safe_boundary`) as ``incomplete`` with reason ``steered``: a WebSocket steer waits
    # for it (serve_app.serving.steering). None: never.
    end_at_boundary: Callable[[], bool] | None = None
    # Where a response whose model called tools the client runs waits for their outputs and
    # goes on in place (a WebSocket with the ``response.inject`` beta: serve_app.serving.
    # inject). None: such a response ends with the calls.
    client_outputs: ClientOutputs | None = None
    # What runs after ``response.created`` and before the engine is asked for the answer
    # (a compaction, serve_app.serving.turn.context_management): its event batches; it may point
    # ``generate`` elsewhere. An `APIError` from it ends the turn failed.
    before_answer: Callable[[Turn], AsyncIterator[list[ResponseStreamEvent]]] | None = None
    # The server's tools' work before the model (an MCP server's listing, approved calls:
    # serve_app.serving.tools.mcp_turn): run once an engine took the response, it is stored
    # (``store: true``) and ``response.created`` is out, its event batches streamed as each
    # step starts; it points ``generate`` at the prompt with what it did. None: no such work.
    tools_first: Callable[[Turn], AsyncIterator[list[ResponseStreamEvent]]] | None = None
    # Items that work added after the request's input for the model to read (the approved
    # calls' outputs): rendered, not stored as input (they are the response's output).
    server_items: list[InputItem] = field(default_factory=list)
    # The client was told of the response before the engine was asked (a background run's
    # answer): the engines at capacity then end it ``failed`` (``rate_limit_exceeded``) in its
    # events, rather than refusing the request (serve_app.serving.turn.events).
    announced: bool = False
    # The tools as harmony sees them (what the tool loop resolves a pending call's spec in).
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    # The model's completions so far (the tool loop continues the response with another).
    completions: int = 0
    # Calls of server-run tools run so far (bounded: `ToolArgs.max_calls_per_response`).
    server_calls: int = 0
    # The response's session with each tool server it called (serving/tools/contract.py).
    tool_sessions: dict[int, ToolSession] = field(default_factory=dict)
    # Prompt and cached tokens of the completions before the current one (usage sums them),
    # and the output tokens of them all.
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    # The request's moderation (input beside the prefill, output in windows), when it asked.
    moderation: TurnModeration | None = None

    @property
    def response(self) -> Response:
        return self.translator.response
