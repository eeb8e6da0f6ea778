"""An admitted request rendered as harmony token ids: its history and input, truncated when it
asks for ``truncation: "auto"``. Rendering only renders; harmony refusing client content is a
400 from the door's rule (`unrenderable_is_a_400`)."""

from __future__ import annotations

from serve_app.config import AppArgs
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.harmony.render import RenderedPrompt, render_request
from serve_app.harmony.truncation import truncate_to_fit
from serve_app.serving.admission import responses as rules
from serve_app.serving.turn.state import Context


class Renderer:
    def __init__(self, args: AppArgs, vault: ReasoningVault) -> None:
        self._args = args
        self._vault = vault

    def render(self, context: Context, owner: str | None, *, truncate: bool) -> RenderedPrompt:
        """The prompt; ``truncate``: cut to fit as the request asks (a turn), or as is (a
        token count)."""
        request, history = context.request, context.history
        with rules.unrenderable_is_a_400():
            prompt = render_request(
                request, history=history, vault=self._vault, owner=owner, tools=context.tools
            )
            return self._truncated(context, prompt, owner) if truncate else prompt

    def _truncated(
        self, context: Context, prompt: RenderedPrompt, owner: str | None
    ) -> RenderedPrompt:
        """With ``truncation: "auto"``, the prompt with the oldest items dropped until it leaves
        room for the output allowance (as OpenAI, which subtracts it from the context); a
        prompt that fits stays as it is. ``disabled``: the prompt as it is."""
        request = context.request
        if request.truncation != "auto":
            return prompt
        window = self._args.max_context_tokens
        allowance = min(
            request.max_output_tokens or self._args.default_max_output_tokens, window - 1
        )

        def fits(prompt_tokens: int) -> bool:
            return prompt_tokens + allowance <= window

        if fits(len(prompt.token_ids)):
            return prompt
        # When nothing fits, the shortest prompt: it gets what room is left, or the 400 after.
        items = [*context.history, *request.input_items]
        return truncate_to_fit(request, items, fits, self._vault, owner, tools=prompt.tools)
