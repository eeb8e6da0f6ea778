"""One Responses turn, end to end: validate, render, generate, translate.

Plain Python (no Ray, no FastAPI): the ingress deployment calls it, and it reaches the engines
through an `EngineClient`, so the whole protocol path runs in tests without a cluster.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from ray.serve.exceptions import BackPressureError

from serve_app.config import AppArgs
from serve_app.constraints import spec as constraint_spec
from serve_app.constraints.spec import CompletionConstraint
from serve_app.engines.base import SERVER_ERROR, GenerateChunk, GenerateRequest, SamplingSettings
from serve_app.harmony import compaction
from serve_app.harmony.encoding import CALL_TOKEN, RETURN_TOKEN
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.harmony.render import RenderedPrompt, render_request
from serve_app.harmony.stream import ResponseStreamTranslator
from serve_app.harmony.tools import ToolRegistry
from serve_app.harmony.truncation import truncate_to_fit
from serve_app.protocol.errors import InvalidRequest, NotFound, model_not_found
from serve_app.protocol.requests import InputItem, MessageItem, ResponsesRequest
from serve_app.protocol.responses import (
    dump_response,
    initial_response,
    new_item_id,
    new_response_id,
)
from serve_app.protocol.strict_schema import check_request as check_strict_schemas
from serve_app.routing import metrics as routing_metrics
from serve_app.routing.keys import key_digest, routing_key
from serve_app.serving import metrics
from serve_app.serving.engine_client import EngineClient
from serve_app.serving.references import resolve_references
from serve_app.store.base import ResponseStore, StoredResponse

logger = logging.getLogger(__name__)

ENCRYPTED_REASONING = "reasoning.encrypted_content"
OUTPUT_TEXT_LOGPROBS = "message.output_text.logprobs"
RATE_LIMITED = "rate_limit_exceeded"
RETRY_AFTER_S = 1


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
    arrived_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None

    @property
    def response(self) -> Response:
        return self.translator.response


@dataclass(frozen=True)
class Context:
    """A request with its item references resolved, and the stored items it continues."""

    request: ResponsesRequest
    history: list[InputItem]


class GenerationFailed(Exception):
    """The engines could not produce a non-streaming answer (a stream ends in
    ``response.failed`` instead). The ingress answers 429 for ``rate_limit_exceeded``, 400 for
    the codes of a request the engine rejected (``CLIENT_ERROR_CODES``), else 500."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class ResponsesService:
    def __init__(
        self, args: AppArgs, engine: EngineClient, vault: ReasoningVault, store: ResponseStore
    ) -> None:
        self._args = args
        self._engine = engine
        self._vault = vault
        self._store = store

    async def prepare(
        self,
        request: ResponsesRequest,
        owner: str | None = None,
        recent: Mapping[str, list[InputItem]] | None = None,
        *,
        check_limits: bool = True,
    ) -> Turn:
        """Everything that can reject the request happens here, before any event is sent.
        ``recent``: contexts of responses not in the store (a WebSocket connection's), by id.
        ``check_limits`` false: the server built the request (compaction's), so its item count
        is not the client's to keep within ``max_input_items``."""
        context = await self.context(request, owner, recent, check_limits=check_limits)
        request, history = context.request, context.history
        # A strict schema OpenAI would refuse is a 400 here, not a promise we cannot keep.
        check_strict_schemas(request)
        prompt = render_request(request, history=history, vault=self._vault, owner=owner)
        if request.background and not request.store:
            raise InvalidRequest(
                "Background responses are stored: they need `store` true.", param="store"
            )
        prompt = self._truncated(request, history, prompt, owner)
        max_tokens = self._max_output_tokens(request, len(prompt.token_ids))
        response = initial_response(request, response_id=new_response_id(), model=request.model)
        key = routing_key(request.prompt_cache_key, prompt.token_ids)
        metrics.ROUTING_KEYS.labels(
            "prompt_cache_key" if request.prompt_cache_key else "derived"
        ).inc()
        # Sealed for this caller's key only: another key's requests cannot open it.
        seal = (
            functools.partial(self._vault.seal, owner=owner)
            if ENCRYPTED_REASONING in request.include
            else None
        )
        generate = GenerateRequest(
            request_id=response.id,
            prompt_token_ids=prompt.token_ids,
            sampling=SamplingSettings(
                max_tokens=max_tokens,
                temperature=1.0 if request.temperature is None else request.temperature,
                top_p=1.0 if request.top_p is None else request.top_p,
                stop_token_ids=(RETURN_TOKEN, CALL_TOKEN),
                logprobs=_logprobs_wanted(request),
            ),
            session_id=key,
            constraint=_constraint(request, prompt.tools),
        )
        translator = ResponseStreamTranslator(
            response,
            prompt.tools,
            seal_reasoning=seal,
            summarize_reasoning=self._summarize_reasoning(request),
            max_tool_calls=request.max_tool_calls,
        )
        logger.info(
            "response %s: %d prompt tokens, max %d output tokens, conversation %s",
            response.id,
            len(prompt.token_ids),
            max_tokens,
            key_digest(key),
            extra={"response_id": response.id, "conversation": key_digest(key)},
        )
        return Turn(
            request=request, generate=generate, translator=translator, owner=owner, history=history
        )

    async def render(self, request: ResponsesRequest, owner: str | None = None) -> RenderedPrompt:
        """The prompt for a request: its stored history (if it continues one) and its input."""
        context = await self.context(request, owner)
        return render_request(
            context.request, history=context.history, vault=self._vault, owner=owner
        )

    async def context(
        self,
        request: ResponsesRequest,
        owner: str | None,
        recent: Mapping[str, list[InputItem]] | None = None,
        *,
        check_limits: bool = True,
    ) -> Context:
        """The items a request continues, and the request, with the item references in both
        replaced by the stored items they name (checked against its limits and model first).
        Before rendering: a referenced tool call must pair with an output like a whole one."""
        history = await self.history(request, owner, recent, check_limits=check_limits)
        history_param = "conversation" if request.conversation_id else "previous_response_id"
        given = request.input_items
        history, inputs = await resolve_references(
            self._store, owner, history, given, history_param=history_param
        )
        if inputs is not given:
            request = request.model_copy(update={"input": inputs})
        return Context(request, history)

    async def history(
        self,
        request: ResponsesRequest,
        owner: str | None,
        recent: Mapping[str, list[InputItem]] | None = None,
        *,
        check_limits: bool = True,
    ) -> list[InputItem]:
        """The items a request continues as stored, references unresolved (checked against
        its limits and model first); ``context`` resolves them."""
        if request.model not in self._args.served_names():
            raise model_not_found(request.model)
        if check_limits:
            self._check_limits(request)
        if request.conversation_id is not None:
            if request.previous_response_id is not None:
                raise InvalidRequest(
                    "Use `conversation` or `previous_response_id`, not both.",
                    param="conversation",
                )
            return await self._conversation_history(request.conversation_id, owner)
        if recent is not None and request.previous_response_id in recent:
            return recent[request.previous_response_id]
        return await self._history(request.previous_response_id, owner)

    def _check_limits(self, request: ResponsesRequest) -> None:
        limits = self._args.limits
        if len(request.input_items) > limits.max_input_items:
            raise InvalidRequest(
                f"Too many input items: at most {limits.max_input_items}.", param="input"
            )
        if len(request.tools) > limits.max_tools:
            raise InvalidRequest(f"Too many tools: at most {limits.max_tools}.", param="tools")

    async def _conversation_history(
        self, conversation_id: str, owner: str | None
    ) -> list[InputItem]:
        conversation = await self._store.get_conversation(conversation_id)
        if conversation is None or conversation.owner != owner:
            raise NotFound(
                f"Conversation with id '{conversation_id}' not found.", param="conversation"
            )
        return _INPUT_ITEMS.validate_python(await self._store.conversation_items(conversation_id))

    async def _history(
        self, previous_response_id: str | None, owner: str | None
    ) -> list[InputItem]:
        """The stored conversation a request continues: each turn's input, then its output."""
        if previous_response_id is None:
            return []
        chain = await self._store.chain(previous_response_id)
        # Another key's responses are not found, as if they did not exist.
        if chain is None or any(stored.owner != owner for stored in chain):
            raise NotFound(
                f"Previous response with id '{previous_response_id}' not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        items = [item for stored in chain for item in [*stored.input_items, *stored.output_items]]
        return _INPUT_ITEMS.validate_python(items)

    def _summarize_reasoning(self, request: ResponsesRequest) -> bool:
        """A summary was asked for, and the operator lets the chain of thought fill it."""
        asked = request.reasoning is not None and request.reasoning.summary is not None
        return asked and self._args.reasoning_summary == "chain_of_thought"

    def _truncated(
        self,
        request: ResponsesRequest,
        history: list[InputItem],
        prompt: RenderedPrompt,
        owner: str | None,
    ) -> RenderedPrompt:
        """With ``truncation: "auto"``, the prompt with the oldest items dropped until it leaves
        room for the output allowance (as OpenAI, which subtracts it from the context); a
        prompt that fits stays as it is. ``disabled``: the prompt as it is."""
        if request.truncation != "auto":
            return prompt
        context = self._args.max_context_tokens
        allowance = min(
            request.max_output_tokens or self._args.default_max_output_tokens, context - 1
        )

        def fits(prompt_tokens: int) -> bool:
            return prompt_tokens + allowance <= context

        if fits(len(prompt.token_ids)):
            return prompt
        # When nothing fits, the shortest prompt: it gets what room is left, or the 400 below.
        items = [*history, *request.input_items]
        return truncate_to_fit(request, items, fits, self._vault, owner)

    def _max_output_tokens(self, request: ResponsesRequest, prompt_tokens: int) -> int:
        room = self._args.max_context_tokens - prompt_tokens
        if room <= 0:
            raise InvalidRequest(
                f"Your input has {prompt_tokens} tokens, more than this model's context of "
                f"{self._args.max_context_tokens} tokens allows.",
                param="input",
                code="context_length_exceeded",
            )
        wanted = request.max_output_tokens or self._args.default_max_output_tokens
        return min(wanted, room)

    async def events(self, turn: Turn) -> AsyncIterator[ResponseStreamEvent]:
        """The turn's events, from ``response.created`` to exactly one terminal event."""
        async with contextlib.aclosing(self.event_batches(turn)) as batches:
            async for batch in batches:
                for event in batch:
                    yield event

    async def event_batches(self, turn: Turn) -> AsyncIterator[list[ResponseStreamEvent]]:
        """``events``, as one non-empty list per engine chunk: what a transport sends in one
        write (one ASGI message costs the same whether it carries one event or ten)."""
        translator = turn.translator
        if started := translator.start():
            yield started
        terminal: list[ResponseStreamEvent] = []
        prompt_tokens = cached_tokens = 0
        first_token_seen = False
        replica = None
        try:
            async for chunk in self._engine_chunks(turn):
                replica = replica or chunk.replica
                prompt_tokens = chunk.num_prompt_tokens or prompt_tokens
                cached_tokens = max(cached_tokens, chunk.num_cached_tokens)
                if chunk.token_ids and not first_token_seen:
                    first_token_seen = True
                    turn.first_token_at = time.monotonic()
                    metrics.TIME_TO_FIRST_TOKEN.observe(turn.first_token_at - turn.arrived_at)
                if fed := translator.feed(chunk.token_ids, chunk.logprobs):
                    yield fed
                if chunk.finish_reason == "error":
                    # The engine's code says whose fault it was (invalid_prompt: the client's).
                    code = chunk.error_code or SERVER_ERROR
                    terminal = translator.fail(chunk.error or "The engine failed.", code)
                elif chunk.finish_reason is not None:
                    terminal = translator.finish(
                        chunk.finish_reason,
                        prompt_tokens=prompt_tokens,
                        cached_tokens=cached_tokens,
                    )
                if terminal:
                    break
            if not terminal:
                terminal = translator.fail("The engine stream ended early.", "server_error")
        except BackPressureError:
            # Every engine replica is full and the queue too. Codex retries this code after
            # the delay the message names; non-streaming callers get 429 with Retry-After.
            logger.warning("response %s: engines at capacity", turn.response.id)
            terminal = translator.fail(
                f"The engines are at capacity. Please try again in {RETRY_AFTER_S}s.",
                RATE_LIMITED,
            )
        except Exception as exc:  # a replica died or the handle failed: never hang the client
            logger.exception("response %s: engine call failed", turn.response.id)
            terminal = translator.fail(f"The engine failed: {type(exc).__name__}", "server_error")
        if turn.request.store:
            # Stored before the terminal event, so a client chaining right after it finds it.
            await self.save(turn)
        if turn.request.conversation_id is not None:
            await self._extend_conversation(turn)
        if terminal:
            yield terminal
        routing_metrics.record_prompt(replica, prompt_tokens, cached_tokens)
        self._record(turn)

    async def _engine_chunks(self, turn: Turn) -> AsyncIterator[GenerateChunk]:
        """The engine's chunks, until the translator has made the ``max_tool_calls`` calls
        allowed: then a ``stop`` in place of the rest, and the engine request is aborted."""
        async with contextlib.aclosing(self._engine.stream(turn.generate)) as chunks:
            async for chunk in chunks:
                yield chunk
                if chunk.finish_reason is not None:
                    return
                if turn.translator.tool_calls_exhausted:
                    # Closing the engine stream unfinished cancels the engine request.
                    yield GenerateChunk(finish_reason="stop")
                    return

    async def run(self, turn: Turn) -> Response:
        """The non-streaming form: the same Response the stream's terminal event carries."""
        async for _ in self.events(turn):
            pass
        return turn.response

    async def compact(self, request: ResponsesRequest, owner: str | None = None) -> dict[str, Any]:
        """``POST /v1/responses/compact``: the model summarizes the history; the answer keeps
        the user's messages and one sealed ``compaction`` item standing in for the rest."""
        context = await self.context(request, owner)
        items = [*context.history, *context.request.input_items]
        ask = request.model_copy(
            update={
                "input": [*items, MessageItem(role="user", content=compaction.SUMMARY_REQUEST)],
                "previous_response_id": None,
                "conversation": None,
                "tool_choice": "none",
                "store": False,
                "stream": False,
                "background": False,
                "include": [],
                # As at OpenAI, compaction takes no output limit: a cut summary is no summary.
                "max_output_tokens": None,
            }
        )
        # The ask holds the stored history and the summary request as input items too.
        response = await self.run(await self.prepare(ask, owner, check_limits=False))
        if response.status == "failed" and response.error is not None:
            raise GenerationFailed(response.error.message, response.error.code)
        summary = response.output_text.strip()
        if not summary and response.status == "incomplete":
            raise InvalidRequest(
                "The history leaves no room in the model's context to write its summary.",
                param="input",
                code="context_length_exceeded",
            )
        if not summary:
            raise GenerationFailed("The model wrote no summary.", "server_error")
        metrics.COMPACTIONS.inc()
        compaction_id = new_item_id("cmp")
        kept = [stored_item(item) for item in items if _is_user_message(item)]
        sealed = compaction.seal_summary(self._vault, summary, owner)
        return {
            "id": compaction_id,
            "object": "response.compaction",
            "created_at": int(time.time()),
            "output": [
                *kept,
                {"id": compaction_id, "type": "compaction", "encrypted_content": sealed},
            ],
            "usage": response.usage.model_dump(mode="json") if response.usage else None,
        }

    def continuation(self, turn: Turn) -> list[InputItem]:
        """The items a request continuing this turn's response starts from."""
        output = _INPUT_ITEMS.validate_python(dump_response(turn.response)["output"])
        return [*turn.history, *turn.request.input_items, *output]

    async def save(self, turn: Turn) -> None:
        """Store the turn's response as it is now (final, or a background one in progress)."""
        request = turn.request
        stored = StoredResponse(
            id=turn.response.id,
            previous_response_id=request.previous_response_id,
            response=dump_response(turn.response),
            input_items=[stored_item(item) for item in request.input_items],
            owner=turn.owner,
        )
        try:
            await self._store.put(stored)
        except Exception:  # the answer still reaches the client; only later chaining suffers
            logger.exception("response %s: could not be stored", stored.id)

    async def _extend_conversation(self, turn: Turn) -> None:
        items = [stored_item(item) for item in turn.request.input_items]
        items += dump_response(turn.response)["output"]
        try:
            await self._store.append_items(turn.request.conversation_id, items)
        except Exception:
            logger.exception("response %s: conversation not extended", turn.response.id)

    def _record(self, turn: Turn) -> None:
        response = turn.response
        metrics.REQUESTS.labels(response.status or "unknown").inc()
        metrics.E2E_LATENCY.observe(time.monotonic() - turn.arrived_at)
        usage = response.usage
        if usage is not None:
            metrics.PROMPT_TOKENS.inc(usage.input_tokens)
            metrics.CACHED_PROMPT_TOKENS.inc(usage.input_tokens_details.cached_tokens)
            metrics.GENERATION_TOKENS.inc(usage.output_tokens)
            if turn.first_token_at is not None and usage.output_tokens > 1:
                decode_s = time.monotonic() - turn.first_token_at
                metrics.TIME_PER_OUTPUT_TOKEN.observe(decode_s / (usage.output_tokens - 1))
        logger.info(
            "response %s: %s, usage %s",
            response.id,
            response.status,
            usage,
            extra={"response_id": response.id, "status": response.status},
        )


_INPUT_ITEMS = TypeAdapter(list[InputItem])
_ID_PREFIXES = {
    "message": "msg",
    "reasoning": "rs",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "compaction": "cmp",
}


def stored_item(item: InputItem) -> dict[str, Any]:
    """An input item as stored: the client's fields, and an id (minted if it sent none)."""
    data = item.model_dump(mode="json", exclude_none=True, by_alias=True)
    data.setdefault("id", new_item_id(_ID_PREFIXES.get(data["type"], "item")))
    if data["type"] == "message" and isinstance(data["content"], str):
        # As OpenAI lists them: string content becomes one text part.
        part_type = "output_text" if data["role"] == "assistant" else "input_text"
        data["content"] = [{"type": part_type, "text": data["content"]}]
    return data


def _is_user_message(item: InputItem) -> bool:
    return isinstance(item, MessageItem) and item.role == "user"


def _logprobs_wanted(request: ResponsesRequest) -> int | None:
    """Alternatives per token to ask the engine for: only when the client includes the output
    text's logprobs (then ``top_logprobs``, 0 meaning the sampled token's own only)."""
    if OUTPUT_TEXT_LOGPROBS not in request.include:
        return None
    return request.top_logprobs or 0


def _constraint(request: ResponsesRequest, tools: ToolRegistry) -> CompletionConstraint | None:
    """What the engine must enforce, or None where there is nothing to enforce: plain text,
    a non-strict ``text.format``, ``tool_choice`` auto over tools that are all non-strict
    functions or grammar-less custom tools (Codex's usual request), and ``tool_choice`` none
    with no tools to forbid. Only those get None: a constraint costs a grammar compile (cached
    per distinct grammar) and a mask per token in the engine."""
    if request.tool_choice == "none" and not request.tools:
        return None
    return constraint_spec.from_request(request, tools)
