"""One Responses turn, end to end: the door (`admit`), rendering, the engine request, the
event loop and persistence, each a module of this package; `ResponsesService` composes them.

Plain Python (no Ray, no FastAPI): the ingress deployment calls it, and it reaches the engines
through an `EngineClient`, whose errors are ours (`RateLimited`), so the whole protocol path
runs in tests without a cluster. Its 4xx rules live in serve_app.serving.admission.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

from openai.types.responses import Response, ResponseStreamEvent

from serve_app.config import AppArgs
from serve_app.engines.base import SERVER_ERROR
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.harmony.render import RenderedPrompt
from serve_app.harmony.stream import ResponseStreamTranslator
from serve_app.harmony.tools import ToolRegistry, ToolSpec
from serve_app.protocol.errors import ServerError
from serve_app.protocol.prompt_cache_diagnostics import PromptFingerprint
from serve_app.protocol.requests import InputItem, ResponsesRequest
from serve_app.protocol.responses import initial_response, new_response_id, usage
from serve_app.routing.keys import cache_salt, key_digest, routing_key
from serve_app.serving import metrics
from serve_app.serving.admission import responses as rules
from serve_app.serving.engine.client import EngineClient
from serve_app.serving.moderation import Moderator, TurnModeration, input_text
from serve_app.serving.tools import mcp_turn, tool_search
from serve_app.serving.tools.bounds import OutputBounds
from serve_app.serving.tools.builtin import register_builtin_runners
from serve_app.serving.tools.contract import ToolContext, ToolDescription, ToolRunners
from serve_app.serving.tools.loop import ToolLoop
from serve_app.serving.tools.mcp.client import McpClient
from serve_app.serving.tools.mcp_once import OnceCalls
from serve_app.serving.tools.mcp_turn import McpTurns
from serve_app.serving.turn import cache_diagnostics, context_management, history
from serve_app.serving.turn.admit import Door
from serve_app.serving.turn.engine_request import engine_request
from serve_app.serving.turn.events import EventLoop
from serve_app.serving.turn.persistence import NOT_STORED_MESSAGE, NotStored, Persistence
from serve_app.serving.turn.rendering import Renderer
from serve_app.serving.turn.state import Ask, Context, Turn
from serve_app.store.base import ResponseStore

logger = logging.getLogger(__name__)

ENCRYPTED_REASONING = "reasoning.encrypted_content"


class ResponsesService:
    def __init__(
        self,
        args: AppArgs,
        engine: EngineClient,
        vault: ReasoningVault,
        store: ResponseStore,
        tools: ToolRunners | None = None,
        moderator: Moderator | None = None,
    ) -> None:
        self._args = args
        # The moderation model's client, when the app serves one (`AppArgs.moderation`).
        self._moderator = moderator
        self._vault = vault
        self._door = Door(args, store, vault)
        self._store = store
        self._renderer = Renderer(args, vault)
        self._persistence = Persistence(store)
        # The runners of the tools the server runs, by kind (serving/tools/contract.py).
        self._tools = tools if tools is not None else ToolRunners()
        # What the model is given of a tool's result; large ones counted in the render pool.
        bounds = OutputBounds(args, self._renderer.pool)
        # MCP servers' tools: listed once the response exists, their calls run by the loop,
        # an approved call run once whoever asks (the store decides).
        mcp_client = McpClient(args.tools)
        self._mcp = McpTurns(
            mcp_client,
            OnceCalls(store, args.tools.resolved()),
            args.tools.max_calls_per_response,
            vault,
            bounds,
        )
        self._tools.add_server(mcp_turn.McpToolServer(self._mcp))
        # gpt-oss's browser and python; the MCP clients whose sessions end with the service.
        self._mcp_clients = [mcp_client, *register_builtin_runners(self._tools, args.tools)]
        tool_search.register(self._tools)  # needs no configuration: always run
        self._engine = engine
        self._loop = EventLoop(engine, self._persistence, ToolLoop(args, self._tools, bounds))

    @property
    def tools(self) -> ToolRunners:
        return self._tools

    @property
    def vault(self) -> ReasoningVault:
        return self._vault

    def warm(self) -> None:
        """Start the render workers now (an ingress replica starting)."""
        self._renderer.pool.warm()

    async def warmed(self, timeout_s: float) -> bool:
        """Wait until a render worker `warm` started is ready, at most ``timeout_s``."""
        return await self._renderer.pool.warmed(timeout_s)

    def close(self) -> None:
        """Stop the render workers, if any started, and end the MCP sessions (the replica is
        going away): `aclose` waits for the sessions to end."""
        self._renderer.pool.close()
        for client in self._mcp_clients:
            client.close()

    async def aclose(self) -> None:
        self.close()
        await asyncio.gather(*(client.aclose() for client in self._mcp_clients))

    async def prepare(self, ask: Ask) -> Turn:
        """The request through the door, rendered, and the engine request built: everything
        that can reject it happens before any event is sent."""
        context = await self._door.admit(ask, generating=True)
        request, owner = context.request, ask.owner
        # What the tool servers add to the door's tools, and their work before the model
        # (decided here, done once the response exists: `Turn.tools_first`).
        door_tools = _door_tools(context)
        described = await self._tools.describe(_tool_context(context, owner, generating=True))
        context = replace(context, tools=_with_specs(door_tools, _described_specs(described)))
        prompt = await self._renderer.render(context, owner, truncate=True)
        max_tokens = rules.output_budget(self._args, request, len(prompt.token_ids))
        response = initial_response(
            request, response_id=new_response_id(), model=request.model, service_tier=context.tier
        )
        kept = cache_diagnostics.fingerprint(
            request, context.history, prompt.token_ids, self._args.model
        )
        compared = await cache_diagnostics.comparison(
            self._store, request, owner, ask.recent_prompts
        )
        # Known before the engine is asked: every event's response carries it (a server-side
        # compaction changes it: `retarget`).
        response.prompt_cache_diagnostics = cache_diagnostics.answer(
            compared, prompt.token_ids, kept
        )
        key = routing_key(request.prompt_cache_key, prompt.token_ids, owner=owner)
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
            request,
            prompt,
            request_id=response.id,
            max_tokens=max_tokens,
            session_id=key,
            cache_salt=cache_salt(owner),
            tier=context.tier,
            tiers=self._args.service_tiers,
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
            moderation=self._moderation(request, response.id),
            owner=owner,
            prompt=kept,
            comparison=compared if isinstance(compared, PromptFingerprint) else None,
            history=context.history,
            tools=prompt.tools,
            tier=context.tier,
            before_answer=(
                functools.partial(context_management.compact_first, self)
                if context_management.due(self._args, request, len(prompt.token_ids))
                else None
            ),
            tools_first=(
                functools.partial(self._tools_first, described, door_tools)
                if any(description.stage for description in described)
                else None
            ),
        )

    async def _tools_first(
        self, described: list[ToolDescription], door_tools: ToolRegistry, turn: Turn
    ) -> AsyncIterator[list[ResponseStreamEvent]]:
        """The tool servers' stages (`Turn.tools_first`: an MCP server listed, approved calls
        run), then the turn pointed at the prompt that shows what they did, unless the one
        rendered before shows it already."""
        stages = [d.stage for d in described if d.stage]
        for stage in stages:
            async with contextlib.aclosing(stage.run(turn)) as batches:
                async for batch in batches:
                    yield batch
        if not any(stage.changed_prompt() for stage in stages):
            return  # the prompt rendered before (with the servers' last listings) stands
        turn.server_items = [item for stage in stages for item in stage.rendered_items()]
        specs = [spec for d in described for spec in (d.stage.specs() if d.stage else d.specs)]
        await self.retarget(turn, turn.request, _with_specs(door_tools, specs))

    def _moderation(self, request: ResponsesRequest, response_id: str) -> TurnModeration | None:
        """The turn's moderation, when it asked (the door made sure the app serves it)."""
        if request.moderation is None or self._moderator is None:
            return None
        return TurnModeration(self._moderator, request.moderation, response_id, input_text(request))

    async def retarget(
        self, turn: Turn, request: ResponsesRequest, tools: ToolRegistry | None = None
    ) -> None:
        """Point ``turn``'s engine request at ``request`` rendered after ``turn.history`` and
        before ``turn.server_items`` (a compacted context: serve_app.serving.turn.
        context_management; the MCP stage's work), with ``tools`` when they changed."""
        if turn.server_items:
            shown = [*request.input_items, *turn.server_items]
            request = request.model_copy(update={"input": shown})
        context = Context(request, turn.history, tools=tools or turn.tools, tier=turn.tier)
        prompt = await self._renderer.render(context, turn.owner, truncate=True)
        turn.tools = turn.translator.tools = prompt.tools
        max_tokens = rules.output_budget(self._args, request, len(prompt.token_ids))
        key = routing_key(request.prompt_cache_key, prompt.token_ids, owner=turn.owner)
        # The prompt a later request may reuse is the compacted one.
        turn.prompt = cache_diagnostics.fingerprint(
            request, turn.history, prompt.token_ids, self._args.model
        )
        if turn.comparison is not None:
            # The answer is generated from the compacted prompt (its usage too): the events
            # from the compaction item's on, and the stored response, carry its diagnostics.
            turn.response.prompt_cache_diagnostics = cache_diagnostics.answer(
                turn.comparison, prompt.token_ids, turn.prompt
            )
        turn.generate = engine_request(
            request,
            prompt,
            request_id=turn.response.id,
            max_tokens=max_tokens,
            session_id=key,
            cache_salt=cache_salt(turn.owner),
            tier=turn.tier,
            tiers=self._args.service_tiers,
        )

    async def render(self, ask: Ask) -> RenderedPrompt:
        """The prompt for a request (``/v1/responses/input_tokens``): its stored history (if it
        continues one) and its input, as is (no truncation)."""
        context = await self._door.admit(ask)
        described = await self._tools.describe(_tool_context(context, ask.owner, generating=False))
        tools = _with_specs(_door_tools(context), _described_specs(described))
        return await self._renderer.render(replace(context, tools=tools), ask.owner, truncate=False)

    async def context(self, ask: Ask) -> Context:
        """The door's first half (the request alone, its history loaded and references
        resolved): what compaction summarizes."""
        return await self._door.context(ask)

    def _summarize_reasoning(self, request: ResponsesRequest) -> bool:
        """A summary was asked for, and the operator lets the chain of thought fill it."""
        asked = request.reasoning is not None and request.reasoning.summary is not None
        return asked and self._args.reasoning_summary == "chain_of_thought"

    def events(self, turn: Turn) -> AsyncIterator[ResponseStreamEvent]:
        """The turn's events, from ``response.created`` to exactly one terminal event."""
        return self._loop.events(turn)

    def event_batches(self, turn: Turn) -> AsyncIterator[list[ResponseStreamEvent]]:
        """``events``, as one non-empty list per engine chunk (`EventLoop.event_batches`)."""
        return self._loop.event_batches(turn)

    async def run(self, turn: Turn) -> Response:
        """The non-streaming form: the same Response the stream's terminal event carries."""
        return await self._loop.run(turn)

    @staticmethod
    def continuation(turn: Turn) -> list[InputItem]:
        """The items a request continuing this turn's response starts from."""
        return history.continuation(turn)

    async def save(self, turn: Turn) -> None:
        """Store the turn's response as it is now (a background one in progress); `NotStored`
        if it could not be."""
        await self._persistence.save(turn)

    async def prewarm(self, turn: Turn, *, routable: bool) -> list[ResponseStreamEvent]:
        """A prewarm (``prompt_cache_options.prewarm``, or a WebSocket's ``generate: false``),
        over HTTP and WebSocket alike: the prompt prefilled into the engine's prefix cache, then
        answered as OpenAI answers it, ``response.created`` and ``response.completed`` with no
        output and zero usage, stored first like any response. Its events, in order.

        ``routable``: answer only once every router would send the next turn to the replica
        warmed (`EngineClient.await_routable`, a second at most in the configs). Over HTTP the
        next turn may reach another ingress replica, whose router knows a conversation from
        the engine replicas' reports only; and that turn holds no answer of the model's, so
        the router takes it for a new conversation and does not wait for reports. A
        WebSocket's next turn comes through this replica's router, which placed the prewarm."""
        await self._prefill(turn)
        key = turn.generate.session_id
        if routable and key is not None and not await self._engine.await_routable(key):
            logger.warning(
                "prewarm %s: answered before every router could find the replica it warmed",
                turn.response.id,
            )
        events = turn.translator.writer.answer_at_once(usage(0, 0, 0, 0))
        if (failed := await self.keep(turn)) is not None:
            events[-1] = failed
        return events

    async def _prefill(self, turn: Turn) -> None:
        """Prefill the turn's prompt where its routing key places it. An engine samples at
        least one token per request (vLLM schedules no prefill-only request), so one is asked
        for, unconstrained, and dropped. Best effort: an engine at capacity or failing leaves
        the cache cold, and the prewarm is still answered (the next turn prefills it)."""
        sampling = replace(turn.generate.sampling, max_tokens=1, logprobs=None)
        asked = replace(turn.generate, sampling=sampling, constraint=None)
        try:
            async with contextlib.aclosing(self._engine.stream(asked)) as chunks:
                async for chunk in chunks:
                    if chunk.finish_reason is not None:
                        break
        except Exception as error:
            logger.warning("prewarm %s: the prompt was not prefilled: %r", asked.request_id, error)

    async def keep(self, turn: Turn) -> ResponseStreamEvent | None:
        """`Persistence.keep`, for a caller that sends the terminal event itself (a WebSocket
        prewarm): None once stored; if it could not be, the response is now ``failed`` and
        this is the ``response.failed`` to send in place of its terminal event."""
        try:
            await self._persistence.keep(turn)
        except NotStored:
            return turn.translator.fail_ended(NOT_STORED_MESSAGE, SERVER_ERROR)
        return None


def _with_specs(tools: ToolRegistry, specs: Sequence[ToolSpec]) -> ToolRegistry:
    """``tools`` and, after the request's own, the servers' tools (an MCP server's listing)."""
    return replace(tools, tools=(*tools.tools, *specs)) if specs else tools


def _described_specs(described: Sequence[ToolDescription]) -> list[ToolSpec]:
    return [spec for description in described for spec in description.specs]


def _door_tools(context: Context) -> ToolRegistry:
    """The registry the door built (once: `Door.admit`, with the tools the history's searches
    loaded); missing, the request fails with a logged error rather than render with another."""
    if context.tools is None:
        logger.error("a request past the door without its tools")
        raise ServerError("The request's tools were not prepared.")
    return context.tools


def _tool_context(context: Context, owner: str | None, *, generating: bool) -> ToolContext:
    items = [*context.history, *context.request.input_items]
    return ToolContext(context.request, items, owner, context.mcp, generating)
