"""The door of a turn: every rule of serve_app.serving.admission a request to
``POST /v1/responses`` (or ``/input_tokens``, ``/compact``) is held to, in order, with the
loading they need between them. Nothing is rendered before it has passed."""

from __future__ import annotations

from dataclasses import replace

from serve_app.config import AppArgs
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.protocol.requests import ItemReference
from serve_app.serving.admission import responses as rules
from serve_app.serving.admission.mcp import check_mcp
from serve_app.serving.admission.tools import omit_unavailable
from serve_app.serving.tools import mcp_trust
from serve_app.serving.turn import history
from serve_app.serving.turn.references import find_referenced, replace_references
from serve_app.serving.turn.state import Ask, Context
from serve_app.store.base import ResponseStore


class Door:
    def __init__(self, args: AppArgs, store: ResponseStore, vault: ReasoningVault) -> None:
        self._args = args
        self._store = store
        self._vault = vault
        self._tool_args = args.tools.resolved()  # the MCP allowlist, its override applied

    async def admit(self, ask: Ask, *, generating: bool = False) -> Context:
        """Every 4xx a request can earn before rendering. Returns the request with its item
        references replaced by the stored items they name, and the items it continues.
        ``generating``: also the rules only a request to generate is held to (strict schemas,
        background needs store); a token count is not."""
        context = await self.context(ask)
        if generating:
            rules.check_strict_schemas(context.request)
        tools = rules.check_items(context.request, context.history, self._vault, ask.owner)
        items = [*context.history, *context.request.input_items]
        trusted = await mcp_trust.trusted(
            self._store, self._vault, ask.owner, context.request, items, len(context.history)
        )
        check_mcp(self._tool_args, context.request, items, len(context.history), trusted)
        if generating:
            rules.check_generation(context.request, tools)
        return replace(context, tools=tools, mcp=trusted)

    async def context(self, ask: Ask) -> Context:
        """The door's first half: the request alone checked (the tools it is served without
        left out first), the items it continues loaded, and the item references in both
        checked and replaced by the stored items they name."""
        request = omit_unavailable(self._args, ask.request)
        rules.check_request(self._args, request, check_limits=ask.check_limits)
        tier = rules.service_tier(self._args, request, ask.owner)
        continued = await history.load(self._store, ask)
        if continued is None:
            raise rules.history_not_found(request)
        given = request.input_items
        if not any(isinstance(item, ItemReference) for item in [*continued, *given]):
            return Context(request, continued, tier=tier)
        found = await find_referenced(self._store, ask.owner, [*continued, *given])
        rules.check_references(continued, given, found, history_param=rules.history_param(request))
        request = request.model_copy(update={"input": replace_references(given, found)})
        return Context(request, replace_references(continued, found), tier=tier)
