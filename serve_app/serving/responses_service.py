"""One Responses turn, end to end: admit (the one door for rejections), render, generate,
translate.

Plain Python (no Ray, no FastAPI): the ingress deployment calls it, and it reaches the engines
through an `EngineClient`, whose errors are ours (`RateLimited`), so the whole protocol path
runs in tests without a cluster. Its 4xx rules live in serve_app.serving.validation.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from serve_app.config import AppArgs
from serve_app.constraints import spec as constraint_spec
from serve_app.constraints.spec import CompletionConstraint
from serve_app.engines.base import (
    CLIENT_ERROR_CODES,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    SERVER_ERROR,
    GenerateChunk,
    GenerateRequest,
    SamplingSettings,
)
from serve_app.harmony import compaction
from serve_app.harmony.encoding import STOP_TOKENS
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.harmony.render import RenderedPrompt, render_request
from serve_app.harmony.stream import ResponseStreamTranslator
from serve_app.harmony.tools import ToolRegistry
from serve_app.harmony.truncation import truncate_to_fit
from serve_app.protocol.errors import (
    RATE_LIMITED,
    APIError,
    InvalidRequest,
    RateLimited,
    ServerError,
)
from serve_app.protocol.requests import InputItem, ItemReference, MessageItem, ResponsesRequest
from serve_app.protocol.responses import (
    ITEM_ID_PREFIXES,
    dump_response,
    initial_response,
    new_item_id,
    new_response_id,
)
from serve_app.routing import metrics as routing_metrics
from serve_app.routing.keys import key_digest, routing_key
from serve_app.serving import context_management, metrics, validation
from serve_app.serving.engine_client import EngineClient
from serve_app.serving.references import find_referenced, replace_references
from serve_app.store.base import ResponseStore, StoredResponse

logger = logging.getLogger(__name__)

ENCRYPTED_REASONING = "reasoning.encrypted_content"
OUTPUT_TEXT_LOGPROBS = "message.output_text.logprobs"
NOT_STORED_MESSAGE = "The response could not be stored. Please try again."


class NotStored(ServerError):
    """A write the client asked for (``store: true``, a conversation) did not commit, even
    after the store's retries: the client is told (a 500 ``server_error``, or
    ``response.failed`` on a stream), never answered as if it were stored."""

    def __init__(self, message: str = NOT_STORED_MESSAGE) -> None:
        super().__init__(message, code=SERVER_ERROR)


@contextlib.contextmanager
def stored_or_fail(what: str, message: str = NOT_STORED_MESSAGE) -> Iterator[None]:
    """Around a store write a client waits on: a failure is logged and becomes `NotStored`."""
    try:
        yield
    except NotStored:
        raise
    except Exception as error:
        logger.exception("%s could not be stored", what)
        raise NotStored(message) from error


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
    # The prompt reached its `context_management` threshold: compact before the answer.
    compact: bool = False

    @property
    def response(self) -> Response:
        return self.translator.response


@dataclass(frozen=True)
class Context:
    """A request with its item references resolved, and the stored items it continues; after
    `ResponsesService.admit`, its tools as rendering sees them too (built once per request)."""

    request: ResponsesRequest
    history: list[InputItem]
    tools: ToolRegistry | None = None


def failed_response_error(message: str, code: str) -> APIError:
    """A failed response's error as the HTTP error a non-streaming client can act on (a stream
    ends in ``response.failed`` with the same message and code instead): 429 for
    ``rate_limit_exceeded``, 400 for the codes of a request the engine rejected
    (``CLIENT_ERROR_CODES``: retrying cannot help), else 500."""
    if code == RATE_LIMITED:
        return RateLimited(message)
    if code in CLIENT_ERROR_CODES:
        return InvalidRequest(message, code=code)
    return ServerError(message, code=code)


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
        """The request through the door (`admit`), rendered, and the engine request built:
        everything that can reject it happens before any event is sent. ``recent``: contexts
        of responses not in the store (a WebSocket connection's), by id. ``check_limits``
        false: the server built the request (compaction's), so its item count is not the
        client's to keep within ``max_input_items``."""
        context = await self.admit(
            request, owner, recent, check_limits=check_limits, generating=True
        )
        request, history = context.request, context.history
        prompt = self._render(request, history, owner, context.tools, truncate=True)
        max_tokens = validation.output_budget(self._args, request, len(prompt.token_ids))
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
        generate = engine_request(
            request, prompt, request_id=response.id, max_tokens=max_tokens, session_id=key
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
            request=request,
            generate=generate,
            translator=translator,
            owner=owner,
            history=history,
            compact=context_management.due(self._args, request, len(prompt.token_ids)),
        )

    @property
    def vault(self) -> ReasoningVault:
        return self._vault

    def retarget(self, turn: Turn, request: ResponsesRequest) -> None:
        """Point ``turn``'s engine request at ``request`` rendered after ``turn.history`` (a
        compacted context: serve_app.serving.context_management)."""
        prompt = self._render(request, turn.history, turn.owner, None, truncate=True)
        max_tokens = validation.output_budget(self._args, request, len(prompt.token_ids))
        key = routing_key(request.prompt_cache_key, prompt.token_ids)
        turn.generate = engine_request(
            request, prompt, request_id=turn.response.id, max_tokens=max_tokens, session_id=key
        )

    async def render(self, request: ResponsesRequest, owner: str | None = None) -> RenderedPrompt:
        """The prompt for a request (``/v1/responses/input_tokens``): its stored history (if it
        continues one) and its input, as is (no truncation)."""
        context = await self.admit(request, owner)
        return self._render(context.request, context.history, owner, context.tools, truncate=False)

    async def admit(
        self,
        request: ResponsesRequest,
        owner: str | None,
        recent: Mapping[str, list[InputItem]] | None = None,
        *,
        check_limits: bool = True,
        generating: bool = False,
    ) -> Context:
        """The one door for rejections: every 4xx a request can earn before rendering, decided
        by serve_app.serving.validation's rules in order. Returns the request with its item
        references replaced by the stored items they name, and the items it continues.
        ``generating``: also the rules only a request to generate is held to (strict schemas,
        background needs store); a token count is not."""
        context = await self.context(request, owner, recent, check_limits=check_limits)
        if generating:
            validation.check_strict_schemas(context.request)
        tools = validation.check_items(context.request, context.history, self._vault, owner)
        if generating:
            validation.check_generation(context.request, tools)
        return replace(context, tools=tools)

    async def context(
        self,
        request: ResponsesRequest,
        owner: str | None,
        recent: Mapping[str, list[InputItem]] | None = None,
        *,
        check_limits: bool = True,
    ) -> Context:
        """The door's first half: the request alone checked, the items it continues loaded,
        and the item references in both checked and replaced by the stored items they name.
        ``recent``: contexts of responses not in the store (a WebSocket connection's), by id."""
        validation.check_request(self._args, request, check_limits=check_limits)
        history = await self._history(request, owner, recent)
        if history is None:
            raise validation.history_not_found(request)
        given = request.input_items
        if not any(isinstance(item, ItemReference) for item in [*history, *given]):
            return Context(request, history)
        found = await find_referenced(self._store, owner, [*history, *given])
        validation.check_references(
            history, given, found, history_param=validation.history_param(request)
        )
        request = request.model_copy(update={"input": replace_references(given, found)})
        return Context(request, replace_references(history, found))

    async def _history(
        self,
        request: ResponsesRequest,
        owner: str | None,
        recent: Mapping[str, list[InputItem]] | None,
    ) -> list[InputItem] | None:
        """The items a request continues as stored, references unresolved; None when the
        conversation or previous response is not the caller's. Loading only."""
        if request.conversation_id is not None:
            return await self._conversation_history(request.conversation_id, owner)
        if recent is not None and request.previous_response_id in recent:
            return recent[request.previous_response_id]
        return await self._chain_history(request.previous_response_id, owner)

    async def _conversation_history(
        self, conversation_id: str, owner: str | None
    ) -> list[InputItem] | None:
        conversation = await self._store.get_conversation(conversation_id)
        if conversation is None or conversation.owner != owner:
            return None
        return _INPUT_ITEMS.validate_python(await self._store.conversation_items(conversation_id))

    async def _chain_history(
        self, previous_response_id: str | None, owner: str | None
    ) -> list[InputItem] | None:
        """The stored chain a request continues: each turn's input, then its output."""
        if previous_response_id is None:
            return []
        chain = await self._store.chain(previous_response_id)
        # Another key's responses are not found, as if they did not exist.
        if chain is None or any(stored.owner != owner for stored in chain):
            return None
        items = [item for stored in chain for item in [*stored.input_items, *stored.output_items]]
        return _INPUT_ITEMS.validate_python(items)

    def _render(
        self,
        request: ResponsesRequest,
        history: list[InputItem],
        owner: str | None,
        tools: ToolRegistry | None,
        *,
        truncate: bool,
    ) -> RenderedPrompt:
        with validation.unrenderable_is_a_400():
            prompt = render_request(
                request, history=history, vault=self._vault, owner=owner, tools=tools
            )
            return self._truncated(request, history, prompt, owner) if truncate else prompt

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
        return truncate_to_fit(request, items, fits, self._vault, owner, tools=prompt.tools)

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
            if turn.compact:
                async for batch in context_management.compact_first(self, turn):
                    yield batch
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
        except RateLimited as busy:
            # Every engine replica is full and the queue too (the engine client's word for
            # it). Codex retries this code after the delay the message names; non-streaming
            # callers get 429 with Retry-After.
            logger.warning("response %s: engines at capacity", turn.response.id)
            terminal = translator.fail(busy.message, RATE_LIMITED)
        except APIError as error:  # a compaction that could not be made (context_management)
            terminal = translator.fail(error.message, error.code or SERVER_ERROR)
        except Exception as exc:  # a replica died or the handle failed: never hang the client
            logger.exception("response %s: engine call failed", turn.response.id)
            terminal = translator.fail(f"The engine failed: {type(exc).__name__}", "server_error")
        try:
            # Stored before the terminal event, so a client chaining right after it finds it,
            # and so no client is told of a response that is not stored.
            await self._keep(turn)
        except NotStored:
            failed = turn.translator.fail_ended(NOT_STORED_MESSAGE, SERVER_ERROR)
            if turn.request.background:
                raise  # its runner ends the run failed, in the store (BackgroundRunner)
            terminal[-1:] = [failed]
        finally:
            routing_metrics.record_prompt(replica, prompt_tokens, cached_tokens)
            self._record(turn)
        if terminal:
            yield terminal

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
        ask = context_management.summary_request(request, items)
        # The ask holds the stored history and the summary request as input items too.
        response = await self.run(await self.prepare(ask, owner, check_limits=False))
        summary = context_management.summary_of(response)
        metrics.COMPACTIONS.inc()
        compaction_id = new_item_id(ITEM_ID_PREFIXES["compaction"])
        kept = [
            context_management.kept_message(stored_item(item))
            for item in items
            if _is_user_message(item)
        ]
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
        """Store the turn's response as it is now (final, or a background one in progress);
        `NotStored` if it could not be."""
        with stored_or_fail(f"response {turn.response.id}"):
            await self._store.put(self._stored(turn))

    async def keep(self, turn: Turn) -> bool:
        """`_keep`, for a caller that sends the terminal event itself (a WebSocket prewarm):
        False, and the response now ``failed``, if it could not be stored."""
        try:
            await self._keep(turn)
        except NotStored:
            turn.translator.fail_ended(NOT_STORED_MESSAGE, SERVER_ERROR)
            return False
        return True

    async def _keep(self, turn: Turn) -> None:
        """What the ended turn leaves, in one transaction: its response (``store: true``) and
        its input and output at the end of its conversation. `NotStored` if that failed:
        then nothing of it is stored (no response a later turn could chain to, no half
        conversation)."""
        request = turn.request
        if not request.store and request.conversation_id is None:
            return
        stored = self._stored(turn) if request.store else None
        items: list[dict[str, Any]] = []
        if request.conversation_id is not None:
            # The same input items (and minted ids) as the stored response's.
            items = stored.input_items if stored else self._input_items(turn)
            items = [*items, *dump_response(turn.response)["output"]]
        with stored_or_fail(f"response {turn.response.id}"):
            await self._store.save_turn(stored, request.conversation_id, items)

    def _stored(self, turn: Turn) -> StoredResponse:
        return StoredResponse(
            id=turn.response.id,
            previous_response_id=turn.request.previous_response_id,
            response=dump_response(turn.response),
            input_items=self._input_items(turn),
            owner=turn.owner,
        )

    @staticmethod
    def _input_items(turn: Turn) -> list[dict[str, Any]]:
        return [stored_item(item) for item in turn.request.input_items]

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


def stored_item(item: InputItem) -> dict[str, Any]:
    """An input item as stored: the client's fields, and an id (minted if it sent none)."""
    data = item.model_dump(mode="json", exclude_none=True, by_alias=True)
    data.setdefault("id", new_item_id(ITEM_ID_PREFIXES.get(data["type"], "item")))
    if data["type"] == "message" and isinstance(data["content"], str):
        # As OpenAI lists them: string content becomes one text part.
        part_type = "output_text" if data["role"] == "assistant" else "input_text"
        data["content"] = [{"type": part_type, "text": data["content"]}]
    return data


def _is_user_message(item: InputItem) -> bool:
    return isinstance(item, MessageItem) and item.role == "user"


def engine_request(
    request: ResponsesRequest,
    prompt: RenderedPrompt,
    *,
    request_id: str,
    max_tokens: int,
    session_id: str | None,
) -> GenerateRequest:
    """What the engine is asked for a turn: the prompt's token ids and the request's sampling
    (the engine's defaults where it sets none), stopping at harmony's ``<|return|>`` or
    ``<|call|>``, and what the completion must obey. ``session_id``: the routing key."""
    return GenerateRequest(
        request_id=request_id,
        prompt_token_ids=prompt.token_ids,
        sampling=SamplingSettings(
            max_tokens=max_tokens,
            temperature=DEFAULT_TEMPERATURE if request.temperature is None else request.temperature,
            top_p=DEFAULT_TOP_P if request.top_p is None else request.top_p,
            stop_token_ids=STOP_TOKENS,
            logprobs=_logprobs_wanted(request),
        ),
        session_id=session_id,
        constraint=_constraint(request, prompt.tools),
    )


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
