"""The rules of ``POST /v1/responses`` (and ``/input_tokens``, ``/compact``): every 4xx a
turn can earn.

The turn's door (`Door` in serve_app.serving.turn.admit) applies them in this order, before
anything is rendered: the request on its own (`check_request`, then the tier its key may use:
`service_tier`), the items it continues once
loaded (`history_not_found`, `check_references`), then request and items together
(`check_strict_schemas`, `check_items`, `check_generation`; the rules on tools and schemas are
in `tools`). Rendering only renders and loading only loads; neither rejects. Two
answers can only be known from the rendered prompt, and are decided here too, right after
rendering: harmony refusing client content (`unrenderable_is_a_400`) and the context length
(`output_budget`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence

from pydantic import BaseModel

from serve_app.config import AppArgs, ServedTier
from serve_app.engines.base import CLIENT_ERROR_CODES
from serve_app.harmony import compaction
from serve_app.harmony.pieces import MAX_PIECE_CHARS, long_piece
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.harmony.render import UnrenderableRequest
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol import prompt_cache
from serve_app.protocol.errors import (
    RATE_LIMITED,
    APIError,
    InvalidRequest,
    NotFound,
    RateLimited,
    ServerError,
    model_not_found,
)
from serve_app.protocol.request_base import OPAQUE
from serve_app.protocol.request_tools import HostedTool
from serve_app.protocol.requests import CompactionItem, InputItem, ItemReference, ResponsesRequest
from serve_app.protocol.service_tiers import served_tier
from serve_app.serving import metrics
from serve_app.serving.admission import builtin
from serve_app.serving.admission import tools as tool_rules


def check_prewarm(request: ResponsesRequest) -> None:
    """A prewarm (``prompt_cache_options.prewarm``) generates nothing: there is no run to leave
    in the background, and its input would join a conversation with no answer after it."""
    if not prompt_cache.is_prewarm(request.prompt_cache_options):
        return
    if request.background:
        raise InvalidRequest(
            "`prompt_cache_options.prewarm` is not supported with `background`: a prewarm "
            "generates nothing to run in the background.",
            param="background",
        )
    if request.conversation_id is not None:
        raise InvalidRequest(
            "`prompt_cache_options.prewarm` is not supported with `conversation`.",
            param="conversation",
        )


def check_request(args: AppArgs, request: ResponsesRequest, *, check_limits: bool = True) -> None:
    """What the request alone decides: a model we serve, within the limits (``check_limits``
    false: the server built the request, so its item count is not the client's to keep), and
    at most one of the two ways to continue, tools of types shown or run here."""
    if request.model not in args.served_names():
        raise model_not_found(request.model)
    if check_limits:
        _check_limits(args, request)
    tool_rules.check_tool_types(args, request)
    tool_rules.check_hosted_tool_choice(args, request)
    check_text(request)
    check_prewarm(request)
    check_context_management(request)
    check_moderation(args, request)
    builtin.check_builtin_tools(request)
    if request.conversation_id is not None and request.previous_response_id is not None:
        raise InvalidRequest(
            "Use `conversation` or `previous_response_id`, not both.", param="conversation"
        )


def check_moderation(args: AppArgs, request: ResponsesRequest) -> None:
    """``moderation`` only where the app serves a moderation model, by one of its names."""
    asked = request.moderation
    if asked is None:
        return
    served = args.moderation
    if served is None:
        raise InvalidRequest(
            "Moderation is not available on this server: it serves no moderation model.",
            param="moderation",
        )
    if asked.model not in served.served_names():
        names = ", ".join(sorted(served.served_names()))
        raise InvalidRequest(
            f"The moderation model `{asked.model}` does not exist (this server moderates "
            f"with: {names}).",
            param="moderation.model",
            code="model_not_found",
        )


def check_text(value: object, param: str = "") -> None:
    """No text harmony's tokenizer would take unbounded time over: a piece longer than
    `MAX_PIECE_CHARS` anywhere in ``value`` (a request, or items added to a conversation) is a
    400 naming its field (serve_app.harmony.pieces). Walked with a stack, not recursion: the
    door meets nesting deeper than Python's recursion limit before its other checks.

    What is never tokenized is not judged: a sealed blob (a field marked `OPAQUE`) is opened
    with the server's key or treated as unopenable whatever its size (a reasoning item's is
    ignored when rendering, a compaction item's is a 400 in `check_items`), and a hosted tool's
    settings are not rendered. The text of a blob that opens is the model's own, so it goes
    unchecked, as the model's output in a stored history does. Image and file parts become a
    note: the request model does not even keep their data."""
    stack: list[tuple[object, str]] = [(value, param)]
    while stack:
        node, at = stack.pop()
        if isinstance(node, str):
            length = long_piece(node)
            if length:
                raise InvalidRequest(
                    f"{at or 'The request'} holds {length:,} characters without a break (no "
                    "whitespace, digit, or change between letters and punctuation): more than "
                    f"the {MAX_PIECE_CHARS:,} the tokenizer takes in bounded time.",
                    param=at or None,
                )
        elif isinstance(node, HostedTool):
            continue  # accepted, never rendered: its settings are opaque
        elif isinstance(node, BaseModel):
            fields = [
                (field.alias or name, getattr(node, name))
                for name, field in type(node).model_fields.items()
                if OPAQUE not in field.metadata
            ]
            fields += (node.__pydantic_extra__ or {}).items()
            stack.extend((child, f"{at}.{name}" if at else name) for name, child in fields)
        elif isinstance(node, dict):
            stack.extend((child, f"{at}.{key}" if at else str(key)) for key, child in node.items())
        elif isinstance(node, list | tuple):
            stack.extend((child, f"{at}[{index}]") for index, child in enumerate(node))


# The smallest `compact_threshold` OpenAI takes (and what a summary turn needs room for).
MIN_COMPACT_THRESHOLD = 1000


def check_context_management(request: ResponsesRequest) -> None:
    """``context_management``: entries of a type we run (``compaction``, once), each
    ``compact_threshold`` at least `MIN_COMPACT_THRESHOLD`."""
    seen = False
    for index, entry in enumerate(request.context_management or ()):
        param = f"context_management[{index}]"
        if entry.type != "compaction":
            raise InvalidRequest(
                f"Invalid value for '{param}.type': '{entry.type}'. Supported values are: "
                "'compaction'.",
                param=f"{param}.type",
                code="invalid_value",
            )
        if seen:
            raise InvalidRequest(
                "Only one `compaction` entry is allowed in 'context_management'.",
                param=param,
                code="invalid_value",
            )
        seen = True
        threshold = entry.compact_threshold
        if threshold is not None and threshold < MIN_COMPACT_THRESHOLD:
            raise InvalidRequest(
                f"Invalid '{param}.compact_threshold': integer below minimum value. Expected a "
                f"value >= {MIN_COMPACT_THRESHOLD}, but got {threshold} instead.",
                param=f"{param}.compact_threshold",
                code="integer_below_min_value",
            )


def _check_limits(args: AppArgs, request: ResponsesRequest) -> None:
    limits = args.limits
    if len(request.input_items) > limits.max_input_items:
        raise InvalidRequest(
            f"Too many input items: at most {limits.max_input_items}.", param="input"
        )
    if len(request.tools) > limits.max_tools:
        raise InvalidRequest(f"Too many tools: at most {limits.max_tools}.", param="tools")


def service_tier(args: AppArgs, request: ResponsesRequest, owner: str | None) -> ServedTier:
    """The tier the request is served at (``service_tier`` resolved by its key's policy:
    `serve_app.protocol.service_tiers`); a tier the key may not use is a 400 naming
    ``service_tier``, before anything is loaded or rendered."""
    policy = args.service_tiers.policy(owner)
    tier = served_tier(request.service_tier, policy)
    if tier not in policy.allowed:
        metrics.TIER_REQUESTS.labels(tier, "rejected").inc()
        asked = request.service_tier or "auto"
        served = "" if asked == tier else f" (served as '{tier}')"
        allowed = ", ".join(f"'{name}'" for name in policy.allowed)
        raise InvalidRequest(
            f"This API key may not use service_tier '{asked}'{served}. Tiers it may use: "
            f"{allowed}.",
            param="service_tier",
            code="invalid_value",
        )
    return tier


def history_not_found(request: ResponsesRequest) -> NotFound:
    """The 404 for a conversation or previous response that is not the caller's (another key's
    is not found, as if it did not exist)."""
    if request.conversation_id is not None:
        return NotFound(
            f"Conversation with id '{request.conversation_id}' not found.", param="conversation"
        )
    return NotFound(
        f"Previous response with id '{request.previous_response_id}' not found.",
        param="previous_response_id",
        code="previous_response_not_found",
    )


def history_param(request: ResponsesRequest) -> str:
    """What an error about an item of the continued history names."""
    return "conversation" if request.conversation_id else "previous_response_id"


def check_references(
    history: Sequence[InputItem],
    inputs: Sequence[InputItem],
    found: Mapping[str, InputItem | None],
    *,
    history_param: str,
) -> None:
    """Every item reference names a stored item of the caller's (``found``: the stored items by
    id, None for one stored yet not an item a request may send). The error names
    ``input[i].id``, or ``history_param`` for a reference inside the history (a conversation's
    items may hold references)."""
    for items, param in ((history, lambda _: history_param), (inputs, _input_id_param)):
        for index, item in enumerate(items):
            if isinstance(item, ItemReference):
                _check_reference(item.id, found, param(index))


def _input_id_param(index: int) -> str:
    return f"input[{index}].id"


def _check_reference(item_id: str, found: Mapping[str, InputItem | None], param: str) -> None:
    if item_id not in found:
        raise InvalidRequest(
            f"Item with id '{item_id}' not found.", param=param, code="item_not_found"
        )
    if found[item_id] is None:
        raise InvalidRequest(
            f"Item with id '{item_id}' cannot be used as input.",
            param=param,
            code="invalid_value",
        )


def check_strict_schemas(request: ResponsesRequest) -> None:
    """A strict schema OpenAI would refuse is a 400 here, not a promise we cannot keep."""
    tool_rules.check_strict_schemas(request)


def check_items(
    request: ResponsesRequest,
    history: Sequence[InputItem] = (),
    vault: ReasoningVault | None = None,
    owner: str | None = None,
) -> ToolRegistry:
    """What the prompt's items decide, in the order rendering meets them: no reference left
    unresolved, every tool call paired with its output, a named ``tool_choice`` that exists,
    tool parameters harmony can take, and compaction items this server sealed for ``owner``.
    Returns the request's tools as rendering sees them (built once per request: the door
    passes them on to `check_generation` and rendering)."""
    items = [*history, *request.input_items]
    _check_resolved(items, first_input=len(history))
    tool_rules.check_tool_call_pairs(items, first_input=len(history))
    tool_rules.check_client_tools(request)
    tool_rules.check_tool_choice(request)
    tools = ToolRegistry.from_request(request, items=items)
    tool_rules.check_tool_parameters(tools)
    _check_compaction_items(items, vault, owner, len(history), history_param(request))
    return tools


def _check_resolved(items: Sequence[InputItem], first_input: int) -> None:
    """Defensive: the door (`Door.admit`) replaces references with stored items first; one
    left here names nothing that can be rendered."""
    for index, item in enumerate(items):
        if isinstance(item, ItemReference):
            raise InvalidRequest(
                f"Item with id '{item.id}' not found.",
                param=_input_id_param(index - first_input) if index >= first_input else "input",
                code="item_not_found",
            )


def _check_compaction_items(
    items: Sequence[InputItem],
    vault: ReasoningVault | None,
    owner: str | None,
    first_input: int,
    in_history: str,
) -> None:
    """Every compaction item opens for ``owner``, whatever its size (a blob is opened, never
    read as text). The error names the input item's ``encrypted_content``, or
    ``in_history`` (what `history_param` names) for one in the continued history."""
    for index, item in enumerate(items):
        if not isinstance(item, CompactionItem):
            continue
        if compaction.open_summary(vault, item.encrypted_content, owner) is None:
            raise InvalidRequest(
                "A compaction item could not be opened: it was made by another server, with "
                "another key or for another API key, or altered. Send the full history instead.",
                param=(
                    f"input[{index - first_input}].encrypted_content"
                    if index >= first_input
                    else in_history
                ),
                code="invalid_encrypted_content",
            )


def check_generation(request: ResponsesRequest, tools: ToolRegistry) -> None:
    """What only a request to generate decides (a token count does not): every schema or
    grammar it asks to enforce compiles, and a background response can be stored. ``tools``:
    the request's, as `check_items` returned them."""
    tool_rules.check_enforceable(request, tools)
    if request.background and not request.store:
        raise InvalidRequest(
            "Background responses are stored: they need `store` true.", param="store"
        )


@contextlib.contextmanager
def unrenderable_is_a_400() -> Iterator[None]:
    """Harmony refusing to render: only client content can make it fail, so the request is at
    fault, not the server."""
    try:
        yield
    except UnrenderableRequest as error:
        raise InvalidRequest(str(error)) from error


def output_budget(args: AppArgs, request: ResponsesRequest, prompt_tokens: int) -> int:
    """The output tokens the turn may write: what it asks for (or the default) within the room
    the prompt leaves in the context; no room at all is a 400 ``context_length_exceeded``."""
    room = args.max_context_tokens - prompt_tokens
    if room <= 0:
        raise InvalidRequest(
            f"Your input has {prompt_tokens} tokens, more than this model's context of "
            f"{args.max_context_tokens} tokens allows.",
            param="input",
            code="context_length_exceeded",
        )
    wanted = request.max_output_tokens or args.default_max_output_tokens
    return min(wanted, room)


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


def no_room_for_summary() -> InvalidRequest:
    """``/v1/responses/compact``: the summary ended before it began (the context was full)."""
    return InvalidRequest(
        "The history leaves no room in the model's context to write its summary.",
        param="input",
        code="context_length_exceeded",
    )
