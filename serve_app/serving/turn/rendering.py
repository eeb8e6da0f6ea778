"""An admitted request rendered as harmony token ids: its history and input, truncated when it
asks for ``truncation: "auto"``. Rendering only renders; harmony refusing client content is a
400 from the door's rule (`unrenderable_is_a_400`).

A large request renders in a worker process (`RenderPool`, render_pool.py), not on the
ingress's event loop: harmony's tokenizer holds the GIL for as long as it runs.
"""

from __future__ import annotations

import logging

from serve_app.config import AppArgs
from serve_app.harmony.cache_breakpoints import breakpoint_positions
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.harmony.render import RenderedPrompt, render_request
from serve_app.harmony.truncation import truncate_to_fit
from serve_app.protocol.errors import ServerError
from serve_app.serving.admission import responses as rules
from serve_app.serving.turn.render_pool import RenderPool
from serve_app.serving.turn.state import Context

logger = logging.getLogger(__name__)


class Renderer:
    def __init__(self, args: AppArgs, vault: ReasoningVault) -> None:
        self._args = args
        self._vault = vault
        self.pool = RenderPool(args, vault, render_token_ids)

    async def render(
        self, context: Context, owner: str | None, *, truncate: bool
    ) -> RenderedPrompt:
        """The prompt; ``truncate``: cut to fit as the request asks (a turn), or as is (a
        token count). Inline or in the pool (`RenderPool.token_ids`): the same token ids."""
        # The door's registry (`Door.admit`), so the prompt's tools are those wherever it
        # renders: none is built here (one built without the history would miss the tools
        # its searches loaded).
        tools = context.tools
        if tools is None:
            logger.error("response for %s: rendered without the door's tools", owner or "-")
            raise ServerError("The request's tools were not prepared.")
        with rules.unrenderable_is_a_400():
            token_ids = await self.pool.token_ids(context, owner, truncate)
        items = [*context.history, *context.request.input_items]
        marks = tuple(breakpoint_positions(token_ids, items))
        return RenderedPrompt(token_ids=token_ids, tools=tools, breakpoints=marks)


def render_token_ids(
    args: AppArgs, vault: ReasoningVault, context: Context, owner: str | None, truncate: bool
) -> list[int]:
    """The prompt's token ids (raises `UnrenderableRequest`): what `Renderer.render` runs,
    on the event loop for a small request, in a worker process for a large one."""
    request, history = context.request, context.history
    prompt = render_request(request, history=history, vault=vault, owner=owner, tools=context.tools)
    if truncate:
        prompt = _truncated(args, vault, context, prompt, owner)
    return prompt.token_ids


def _truncated(
    args: AppArgs,
    vault: ReasoningVault,
    context: Context,
    prompt: RenderedPrompt,
    owner: str | None,
) -> RenderedPrompt:
    """With ``truncation: "auto"``, the prompt with the oldest items dropped until it leaves
    room for the output allowance (as OpenAI, which subtracts it from the context); a
    prompt that fits stays as it is. ``disabled``: the prompt as it is."""
    request = context.request
    if request.truncation != "auto":
        return prompt
    window = args.max_context_tokens
    allowance = min(request.max_output_tokens or args.default_max_output_tokens, window - 1)

    def fits(prompt_tokens: int) -> bool:
        return prompt_tokens + allowance <= window

    if fits(len(prompt.token_ids)):
        return prompt
    # When nothing fits, the shortest prompt: it gets what room is left, or the 400 after.
    items = [*context.history, *request.input_items]
    return truncate_to_fit(request, items, fits, vault, owner, tools=prompt.tools)
