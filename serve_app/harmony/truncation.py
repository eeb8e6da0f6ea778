"""``truncation: "auto"``: drop the oldest conversation items until the prompt fits the context.

As OpenAI does, items are dropped from the beginning of the conversation (a stored chain or
conversation first, then the request's own input), never the leading system/developer messages
(they are the instructions, rendered into harmony's developer message) and never the newest
item (the turn's task). A tool call goes together with its output, so the prompt never holds a
call without its result or the reverse. The number of dropped items is found by bisection:
each try is one render, and dropping more never makes the prompt longer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.harmony.render import (
    RenderedPrompt,
    render_request,
    split_leading_instructions,
)
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol.requests import (
    InputItem,
    ResponsesRequest,
    ToolCallItem,
    ToolOutputItem,
)
from serve_app.protocol.tool_search import ToolSearchCallItem, ToolSearchOutputItem

logger = logging.getLogger(__name__)


def truncate_to_fit(
    request: ResponsesRequest,
    items: Sequence[InputItem],
    fits: Callable[[int], bool],
    vault: ReasoningVault | None = None,
    owner: str | None = None,
    tools: ToolRegistry | None = None,
) -> RenderedPrompt:
    """The prompt of ``items`` (history + input) with the fewest oldest items dropped for
    ``fits(prompt_tokens)``; when none fits, the shortest one (every droppable item dropped).
    ``tools``: the request's (dropping items does not change them), built once for every try."""
    units = _droppable_units(items)
    bare = request.model_copy(update={"input": []})
    if tools is None:
        tools = ToolRegistry.from_request(request, items=items)

    def render(dropped_units: int) -> RenderedPrompt:
        dropped = {index for unit in units[:dropped_units] for index in unit}
        kept = [item for index, item in enumerate(items) if index not in dropped]
        return render_request(bare, history=kept, vault=vault, owner=owner, tools=tools)

    low, high = 0, len(units)
    best = render(high)
    if not fits(len(best.token_ids)):
        logger.info("truncation: all %d droppable items dropped", _count(units))
        return best
    # Invariant: dropping `high` units fits; dropping `low - 1` does not (or low is 0).
    while low < high:
        middle = (low + high) // 2
        prompt = render(middle)
        if fits(len(prompt.token_ids)):
            high, best = middle, prompt
        else:
            low = middle + 1
    logger.info("truncation: %d of %d items dropped", _count(units[:high]), len(items))
    return best


def _droppable_units(items: Sequence[InputItem]) -> list[list[int]]:
    """Indexes of the items to drop together, oldest first: each item alone, except that a tool
    call (a tool search too) takes its outputs along."""
    first = len(split_leading_instructions(items)[0])
    last = len(items) - 1
    outputs: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        if isinstance(item, ToolOutputItem) or (
            isinstance(item, ToolSearchOutputItem) and item.call_id
        ):
            outputs.setdefault(item.call_id, []).append(index)
    units: list[list[int]] = []
    taken: set[int] = set()
    for index in range(first, last):
        if index in taken:
            continue
        unit = [index]
        item = items[index]
        if isinstance(item, ToolCallItem | ToolSearchCallItem):
            unit += [out for out in outputs.get(item.call_id or "", []) if out not in taken]
        if last in unit:
            break  # the newest item stays, and with it the call it answers
        taken.update(unit)
        units.append(unit)
    return units


def _count(units: Sequence[Sequence[int]]) -> int:
    return sum(len(unit) for unit in units)
