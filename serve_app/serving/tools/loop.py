"""The tool loop: a completion's pending server-run calls run, their outputs go back to the
model as the tools' harmony messages, and the model's next completion continues the response.

`EventLoop` (serving/turn/events.py) streams each completion; when one ends with calls of tools
the server runs pending, it hands them to `ToolLoop.run_calls`, then asks
`ToolLoop.next_completion` for the engine request that continues (or None: the response ends).

A round, as the client sees it: each call's running events (in the model's order, at once), its
runner working concurrently with the others, each call's done events and ``output_item.done``
in the model's order as soon as it and every call before it finished. The continuation's prompt
is the last prompt, the completion up to its last ``<|call|>``, the tools' messages and
``<|start|>assistant``: exactly the tokens the engine replica holds in its prefix cache, sent
with the same session id and cache salt (so the same replica), nothing re-rendered. Each
result is held to what the model may be given first (bounds.py: the piece limit, then tokens
within what the context leaves), its message rendered there, off the event loop when large.

A call of a tool the request does not have (no item: harmony/items.py, `UnknownCall`) is
answered here too (`answer_unknown`, unknown.py): an error the model reads, in the model's
order among the round's results, counted as a call the server ran. Such a call alone is a
round: the response goes on as after any server-run call, within the same bounds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Literal, Protocol

from openai.types.responses import Response, ResponseStreamEvent

from serve_app.config import AppArgs
from serve_app.constraints import build as constraint_build
from serve_app.constraints.spec import CompletionConstraint
from serve_app.engines.base import GenerateRequest
from serve_app.harmony.encoding import CALL_TOKEN, START_TOKEN, get_encoding
from serve_app.harmony.items import UnknownCall
from serve_app.harmony.stream import ResponseStreamTranslator
from serve_app.harmony.tools import ToolRegistry, ToolSpec
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.stream_items import CALL_CHANNEL, OpenItem
from serve_app.serving.tools import unknown
from serve_app.serving.tools.bounds import Bounded, Budget, OutputBounds
from serve_app.serving.tools.contract import (
    CancelScope,
    ToolCall,
    ToolResult,
    ToolRunners,
    ToolServer,
    ToolSession,
)

logger = logging.getLogger(__name__)


class Turn(Protocol):
    """What the loop reads and sets of a turn (`serving.turn.state.Turn`, which imports this
    package: named here by its shape, not imported)."""

    request: ResponsesRequest
    generate: GenerateRequest
    translator: ResponseStreamTranslator
    owner: str | None
    tools: ToolRegistry
    completions: int
    output_tokens: int
    server_calls: int
    # The response's session with each tool server it called (`ToolServer.session`), by
    # the server's identity; closed at the response's end (`ToolLoop.close_sessions`).
    tool_sessions: dict[int, ToolSession]

    @property
    def response(self) -> Response: ...


@dataclasses.dataclass
class Round:
    """One round's calls and what running them gave (None: not run, or cancelled)."""

    calls: list[OpenItem] = dataclasses.field(default_factory=list)
    results: list[ToolResult | None] = dataclasses.field(default_factory=list)
    # Each result's harmony message as the continuation's prompt appends it (bounds.py
    # rendered it when it checked the result's size): beside ``results``, in the same order.
    messages: list[list[int]] = dataclasses.field(default_factory=list)
    # The answers to the completion's calls of tools the request does not have
    # (`ToolLoop.answer_unknown`): each (how many of ``calls`` the model made before it, its
    # harmony message), in the model's order.
    unknown: list[tuple[int, list[int]]] = dataclasses.field(default_factory=list)
    # The same completion also called a tool the client runs.
    client_called: bool = False
    # Tokens in the context when the calls were made (the prompt and the completion that
    # made them): what the results' bound leaves room for.
    context_tokens: int = 0

    @property
    def awaits_client(self) -> bool:
        return any(result is not None and result.awaits_client for result in self.results)

    @property
    def answered(self) -> bool:
        """Whether the model has anything to read: a call ran, or a call was answered."""
        return bool(self.calls or self.unknown)


class ToolLoop:
    """Runs the calls of tools the server runs, with the runners it was built with."""

    def __init__(
        self, args: AppArgs, runners: ToolRunners, bounds: OutputBounds | None = None
    ) -> None:
        self._args = args
        self._runners = runners
        # What the model is given of each result (bounds.py), large ones rendered off the loop.
        self._bounds = bounds or OutputBounds(args)

    @property
    def runners(self) -> ToolRunners:
        return self._runners

    async def run_calls(
        self, turn: Turn, calls: list[OpenItem], scope: CancelScope, done: Round
    ) -> AsyncIterator[list[ResponseStreamEvent]]:
        """Run ``calls`` concurrently in ``scope``; their events as they happen, each call
        closed in the model's order (its result in ``done``). Leaving early (the client went
        away, the response was cancelled) cancels the calls still running."""
        writer = turn.translator.writer
        for item in calls:
            writer.tool_running(item)
        yield writer.take_events()
        budget = self._bounds.budget(done.context_tokens, len(calls))
        tasks = [scope.spawn(self._run(turn, item, scope, budget)) for item in calls]
        try:
            for item, task in zip(calls, tasks, strict=True):
                bounded = await task
                done.calls.append(item)
                done.results.append(bounded.result)
                done.messages.append(bounded.tokens)
                writer.close_tool_call(item, bounded.result, "completed")
                yield writer.take_events()
        finally:
            if any(not task.done() for task in tasks):
                scope.cancel("the response ended")
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, turn: Turn, item: OpenItem, scope: CancelScope, budget: Budget) -> Bounded:
        """One call through its kind's runner, its result within ``budget`` (bounds.py);
        any failure a result the model reads."""
        spec = _spec(turn, item)
        result = await self._result(turn, item, scope, spec)
        channel = item.data.get(CALL_CHANNEL) or "commentary"
        return await self._bounds.apply(result, spec.recipient, channel, budget, turn.owner)

    async def _result(
        self, turn: Turn, item: OpenItem, scope: CancelScope, spec: ToolSpec
    ) -> ToolResult:
        """What the kind's server gives in the response's session (a call past the bound on
        calls per response: not run; a server that raises: a failed result)."""
        cap = self._args.tools.max_calls_per_response
        if turn.server_calls >= cap:
            return ToolResult(error=over_cap(cap))
        turn.server_calls += 1  # before any await: the round's calls are counted in order
        server = self._runners.server(spec.kind)
        if server is None:
            logger.error("response %s: no server for tool kind %r", turn.response.id, spec.kind)
            return ToolResult(error=f"The server cannot run {spec.recipient} now.")
        call = ToolCall(
            spec=spec,
            arguments=item.text,
            owner=turn.owner,
            request=turn.request,
            item_id=item.item_id,
            call_id=item.call_id,
            scope=scope,
            response_id=turn.response.id,
        )
        try:
            return await self._session(turn, server).run(call)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception(
                "response %s: tool %s failed",
                turn.response.id,
                spec.recipient,
                extra={"response_id": turn.response.id},
            )
            return ToolResult(error=f"The tool failed ({type(exc).__name__}).")

    def answer_unknown(self, turn: Turn, calls: Sequence[UnknownCall], done: Round) -> None:
        """Answer each call of a tool the request does not have (unknown.py): the error the
        model reads, in ``done`` beside the round's results. Each counts as a call the server
        ran: past ``tools.max_calls_per_response`` the answer is the loop's "Not run", as for
        any call, and the next completion may call nothing (`_constraint`)."""
        cap = self._args.tools.max_calls_per_response
        for call in calls:
            unknown.record(turn.response.id, call)
            if turn.server_calls >= cap:
                error = over_cap(cap)
            else:
                turn.server_calls += 1
                error = unknown.unknown_tool_error(call.recipient, turn.tools)
            done.unknown.append((call.after_calls, unknown.answer_tokens(call, error)))

    @staticmethod
    def _session(turn: Turn, server: ToolServer) -> ToolSession:
        """The response's session with ``server``, opened at its first call."""
        session = turn.tool_sessions.get(id(server))
        if session is None:
            session = turn.tool_sessions[id(server)] = server.session(turn.owner, turn.response.id)
        return session

    @staticmethod
    async def close_sessions(turn: Turn) -> None:
        """The response ended: each of its tool sessions let go (a failure logged, never the
        response's)."""
        sessions, turn.tool_sessions = list(turn.tool_sessions.values()), {}
        for session in sessions:
            try:
                await session.aclose()
            except Exception:
                logger.exception("response %s: a tool session did not close", turn.response.id)

    def next_completion(
        self, turn: Turn, completion: Sequence[int], done: Round
    ) -> GenerateRequest | Literal["stop", "length"]:
        """The engine request that continues the response after ``done``, or how the response
        ends here: ``stop`` (completed) when the model answered or called a tool the client
        runs in the same completion, a result awaits the client, the model tried a call past
        ``max_tool_calls`` or the rounds are at their bound; ``length`` (incomplete,
        ``max_output_tokens``) when no output tokens are left (`output_left`). A round of
        calls of tools the request does not have alone (`answer_unknown`) goes on the same."""
        translator = turn.translator
        if done.awaits_client or translator.call_limit.refused or not done.answered:
            return "stop"
        cut = after_last_call(completion)
        if cut is None or done.client_called:
            return "stop"
        if turn.completions >= self._runners.max_rounds:
            logger.warning("response %s: tool rounds at their bound", turn.response.id)
            return "stop"
        return self.continue_with(turn, completion[:cut], _tool_messages(done))

    def continue_with(
        self, turn: Turn, completion: Sequence[int], tool_messages: Sequence[int]
    ) -> GenerateRequest | Literal["length"]:
        """The engine request that continues the response after ``completion`` (cut after its
        last ``<|call|>``) with the tools' messages: the last prompt, the completion, the
        messages and ``<|start|>assistant``, the same session id and cache salt (so the same
        replica, its prefix cached); ``length`` when no output tokens are left. The server's
        tool rounds continue this way, and so does a response resumed with the outputs the
        client injected (serving/turn/client_outputs.py)."""
        prompt = [
            *turn.generate.prompt_token_ids,
            *completion,
            *tool_messages,
            *_ASSISTANT_START,
        ]
        max_tokens = self.output_left(turn, len(prompt))
        if max_tokens <= 0:
            return "length"
        return dataclasses.replace(
            turn.generate,
            request_id=f"{turn.response.id}-{turn.completions}",
            prompt_token_ids=prompt,
            sampling=dataclasses.replace(turn.generate.sampling, max_tokens=max_tokens),
            constraint=self._constraint(turn),
        )

    def output_left(self, turn: Turn, prompt_tokens: int) -> int:
        """Output tokens the next completion may write: ``max_output_tokens`` (or the default)
        less what the response wrote, within the room the prompt leaves in the context."""
        request = turn.request
        wanted = request.max_output_tokens or self._args.default_max_output_tokens
        written = turn.output_tokens
        return min(wanted - written, self._args.max_context_tokens - prompt_tokens)

    def _constraint(self, turn: Turn) -> CompletionConstraint | None:
        """The continuation's constraint: ``tool_choice`` required (or a named tool) asked for
        a first call, not one every completion; past ``max_tool_calls`` or the server's bound
        on calls per response, no call at all (further calls are ignored, as OpenAI ignores
        them)."""
        limit = turn.request.max_tool_calls
        reached = limit is not None and turn.translator.writer.tool_calls >= limit
        reached = reached or turn.server_calls >= self._args.tools.max_calls_per_response
        tools = dataclasses.replace(
            turn.tools,
            required=False,
            allowed=frozenset() if reached else turn.tools.allowed,
        )
        return constraint_build.from_request(turn.request, tools)


_ASSISTANT_START = [START_TOKEN, *get_encoding().encode("assistant", allowed_special=set())]


def over_cap(limit: int) -> str:
    """What the model reads of a call past the response's bound on server-run calls."""
    return (
        f"Not run: this response has run the {limit} tool calls it may run "
        "(max_tool_calls, or the server's bound per response)."
    )


def _spec(turn: Turn, item: OpenItem) -> ToolSpec:
    spec = turn.tools.by_name(item.name, item.namespace)
    return spec or ToolSpec(name=item.name, kind=item.tool_kind or "", namespace=item.namespace)


def after_last_call(completion: Sequence[int]) -> int | None:
    """Where the completion is cut for the continuation: after its last ``<|call|>`` (None:
    it has none; its calls were cut short, not made)."""
    for index in range(len(completion) - 1, -1, -1):
        if completion[index] == CALL_TOKEN:
            return index + 1
    return None


def _tool_messages(done: Round) -> list[int]:
    """The tools' harmony messages (author: the recipient; the call's channel: commentary, or
    analysis where gpt-oss calls its own browser and python), in the model's order: rendered
    when each result was bounded (bounds.py), off the event loop when large; the answers to
    calls of tools the request does not have where the model made those calls."""
    # Each message keyed by how many of the round's calls come before it and itself: the
    # n-th call's by n, an answer made after n calls by n (a stable sort puts the call first).
    ran = [
        (index + 1, message if result is not None else [])
        for index, (result, message) in enumerate(zip(done.results, done.messages, strict=True))
    ]
    ordered = sorted([*ran, *done.unknown], key=lambda entry: entry[0])
    return [token for _, message in ordered for token in message]


def client_calls(turn: Turn) -> int:
    """The calls of tools the client runs among the response's finished items."""
    return sum(
        item.type in ("function_call", "custom_tool_call") for item in turn.translator.output_items
    )
