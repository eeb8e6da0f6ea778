"""Render a checked Responses request into harmony prompt token ids, and nothing else: every
rejection was decided before (serve_app.serving.admission.responses, which also turns an
`UnrenderableRequest` into the client's 400).

Layout of the prompt (gpt-oss's harmony format):

- a system message: reasoning effort and the current date;
- a developer message: ``instructions`` plus the leading system/developer input messages (Codex
  sends its base prompt as ``input[0]``), and the tools: function tools in ``functions``,
  custom (freeform) tools as tools whose input is raw text, namespace tools as namespaces; then
  a ``text.format`` json_schema as harmony's ``# Response Formats``. We write this message's text
  (tool schemas via typescript.py) and render the system message with harmony's note that calls
  go to the commentary channel, which harmony adds only when it sees the tools itself;
- the history items in order, tool results as messages from ``functions.NAME``;
- ``<|start|>assistant`` for the completion.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from openai_harmony import (
    Author,
    Conversation,
    HarmonyError,
    Message,
    RenderConversationConfig,
    RenderOptions,
    Role,
    SystemContent,
)

from serve_app.harmony import builtin, client_tools, compaction
from serve_app.harmony.encoding import REASONING_EFFORTS, get_encoding
from serve_app.harmony.mcp_tools import McpHistory
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.harmony.tools import (
    DEFAULT_NAMESPACE,
    ToolRegistry,
    ToolSpec,
    output_specs,
    recipient,
)
from serve_app.harmony.typescript import NamespaceText, ToolText, tools_section
from serve_app.protocol import json_schema
from serve_app.protocol.builtin_tools import CodeInterpreterCallItem, WebSearchCallItem
from serve_app.protocol.client_tools import CALL_TOOL, ClientCallItem, ClientOutputItem
from serve_app.protocol.request_tools import NamedToolChoice
from serve_app.protocol.requests import (
    CompactionItem,
    CustomToolCallItem,
    FunctionCallItem,
    InputItem,
    ItemReference,
    MessageItem,
    ReasoningItem,
    ResponsesRequest,
    ToolCallItem,
    ToolOutputItem,
)
from serve_app.protocol.tool_search import (
    TOOL_SEARCH_NAME,
    ToolSearchCallItem,
    ToolSearchOutputItem,
)

logger = logging.getLogger(__name__)

_JSON_CONTENT_TYPE = "<|constrain|>json"


class UnrenderableRequest(ValueError):
    """Harmony cannot render the request's content (or an item the checks before rendering
    should have turned away reached it)."""


@dataclass(frozen=True)
class RenderedPrompt:
    token_ids: list[int]
    tools: ToolRegistry
    # Where each ``prompt_cache_breakpoint`` of the prompt ends, ascending
    # (`cache_breakpoints.breakpoint_positions`; set by the ingress's renderer).
    breakpoints: tuple[int, ...] = ()


def render_request(
    request: ResponsesRequest,
    *,
    history: Sequence[InputItem] = (),
    vault: ReasoningVault | None = None,
    owner: str | None = None,
    now: datetime | None = None,
    tools: ToolRegistry | None = None,
) -> RenderedPrompt:
    """Prompt token ids for ``history`` (earlier stored items, if any) + the request's input.
    ``owner``: the caller's key digest (None when the API is open); sealed reasoning and
    compaction items open only for the owner they were sealed for. ``tools``: the request's,
    when the caller built them already (the turn's door, `Door.admit`, does); else built here."""
    items = [*history, *request.input_items]
    if tools is None:
        tools = ToolRegistry.from_request(request, items=items)
    leading, rest = split_leading_instructions(items)
    # A server-side compaction item stands in for what came before it (instructions stay).
    rest = rest[compaction.context_start(rest, vault, owner) :]
    messages = [
        *_developer_message(request, leading, tools),
        *_history_messages(rest, tools, vault, owner),
    ]
    encoding = get_encoding()
    # The developer message is our text (see typescript.py), so harmony cannot see the function
    # tools that make its system message route tool calls to the commentary channel: say so.
    has_functions = any(spec.recipient.startswith(f"{DEFAULT_NAMESPACE}.") for spec in tools.tools)
    try:
        token_ids = encoding.render(
            _system_message(request, now or datetime.now(UTC), tools),
            RenderOptions(conversation_has_function_tools=has_functions),
        ) + encoding.render_conversation_for_completion(
            Conversation.from_messages(messages),
            Role.ASSISTANT,
            RenderConversationConfig(auto_drop_analysis=False),
        )
    except (ValueError, HarmonyError) as error:
        raise UnrenderableRequest(
            f"The request cannot be rendered for the model: {error}"
        ) from error
    return RenderedPrompt(token_ids=token_ids, tools=tools)


def split_leading_instructions(
    items: Sequence[InputItem],
) -> tuple[list[MessageItem], list[InputItem]]:
    """The leading system/developer messages belong in harmony's developer message."""
    count = 0
    for item in items:
        if not (isinstance(item, MessageItem) and item.role in ("system", "developer")):
            break
        count += 1
    return list(items[:count]), list(items[count:])  # type: ignore[arg-type]


def _system_message(request: ResponsesRequest, now: datetime, tools: ToolRegistry) -> Message:
    content = (
        SystemContent.new()
        .with_reasoning_effort(REASONING_EFFORTS[request.effort])
        .with_conversation_start_date(now.date().isoformat())
    )
    # gpt-oss's own browser and python tools are described here, as it was trained; a tool
    # the request is served without is said to be unavailable here too.
    content = builtin.with_builtin_tools(content, tools)
    content = builtin.with_unavailable_notes(content, request.tools)
    return Message.from_role_and_content(Role.SYSTEM, content)


def _developer_message(
    request: ResponsesRequest, leading: list[MessageItem], tools: ToolRegistry
) -> list[Message]:
    """Harmony's developer message: ``# Instructions``, ``# Tools`` rendered by typescript.py
    (harmony's own renders Pydantic and zod schemas as ``any``), ``# Response Formats``."""
    instructions = _instructions(request, leading, tools)
    sections = ["# Instructions", instructions] if instructions else []
    shown = tools.namespaces()
    if shown:
        sections.append(tools_section(_namespace_texts(request, shown)))
    response_format = _response_format(request)
    if response_format:
        sections.append(response_format)
    if not sections:
        return []
    return [Message.from_role_and_content(Role.DEVELOPER, "\n\n".join(sections))]


def _instructions(
    request: ResponsesRequest, leading: list[MessageItem], tools: ToolRegistry
) -> str:
    parts = [request.instructions or ""] + [message.text for message in leading]
    if tools.required:
        choice = request.tool_choice
        if isinstance(choice, NamedToolChoice):
            parts.append(f"You must call the `{choice.name}` tool now.")
        else:
            parts.append("You must call one of the tools now.")
    if tools.allowed is not None:
        names = ", ".join(f"`{name}`" for name in sorted(tools.allowed))
        parts.append(f"You may call only these tools: {names}.")
    text_format = request.text.format if request.text else None
    if text_format is not None and text_format.type == "json_object":
        parts.append("Answer with a JSON object.")
    return "\n\n".join(part for part in parts if part)


def _response_format(request: ResponsesRequest) -> str | None:
    """A ``text.format`` json_schema as gpt-oss was trained to read it (harmony's format.md,
    "Structured output"): a ``# Response Formats`` section at the end of the developer message,
    ``## name``, the description as a comment, then the schema as compact JSON. The schema is
    resolved first, so the nested models behind Pydantic's ``$ref``s are in it."""
    text_format = request.text.format if request.text else None
    if text_format is None or text_format.type != "json_schema":
        return None
    schema = json_schema.resolve(text_format.schema_ or {})
    lines = ["# Response Formats", "", f"## {text_format.name or 'response'}", ""]
    lines += [f"// {line}" for line in (text_format.description or "").splitlines()]
    lines.append(json.dumps(schema, ensure_ascii=False, separators=(",", ":")))
    return "\n".join(lines)


def _namespace_texts(
    request: ResponsesRequest, grouped: dict[str | None, list[ToolSpec]]
) -> list[NamespaceText]:
    return [
        NamespaceText(
            name=namespace or DEFAULT_NAMESPACE,
            description=_namespace_description(request, namespace) if namespace else None,
            tools=[_tool_text(spec) for spec in specs],
        )
        for namespace, specs in grouped.items()
    ]


def _namespace_description(request: ResponsesRequest, namespace: str) -> str | None:
    for tool in request.tools:
        if getattr(tool, "type", None) == "namespace" and getattr(tool, "name", None) == namespace:
            return getattr(tool, "description", None)
        if getattr(tool, "type", None) == "mcp" and getattr(tool, "server_label", "") == namespace:
            return getattr(tool, "server_description", None)
    return None


def _tool_text(spec: ToolSpec) -> ToolText:
    if spec.parameters is not None:  # a function, or a server-run tool with a JSON schema
        return ToolText(spec.name, spec.description, json_schema.resolve(spec.parameters))
    # Harmony has no freeform tool type: a tool without parameters whose message body is the
    # raw input, and a description saying so.
    note = "This is a FREEFORM tool: send the raw input text as the message, not JSON."
    if spec.grammar:
        note += f" The input must match this grammar:\n{spec.grammar}"
    description = f"{spec.description}\n{note}" if spec.description else note
    return ToolText(spec.name, description, parameters=None)


# --- history -------------------------------------------------------------------------------


def _history_messages(
    items: list[InputItem], tools: ToolRegistry, vault: ReasoningVault | None, owner: str | None
) -> list[Message]:
    """The history as harmony messages. Chain of thought is kept between the tool calls of the
    current turn and dropped for turns that ended in a final answer: dropped here, because
    harmony's own auto-drop (off in `render_request`) only drops analysis before the first
    final message."""
    recipients = _call_recipients(items, tools)
    last_final = _last_final_answer(items)
    mcp = McpHistory(items)
    messages: list[Message] = []
    for index, item in enumerate(items):
        if isinstance(item, ReasoningItem):
            if index > last_final:
                messages.extend(_reasoning_message(item, vault, owner))
        elif isinstance(item, WebSearchCallItem | CodeInterpreterCallItem):
            # Chain of thought too (the analysis channel): dropped once answered.
            if index > last_final:
                messages.extend(builtin.history_messages(item))
        elif isinstance(item, MessageItem):
            messages.append(_message(item, is_preamble=_is_preamble(items, index)))
        elif isinstance(item, ToolCallItem):
            messages.append(_tool_call_message(item, recipients[item.call_id]))
        elif isinstance(item, ToolOutputItem):
            messages.append(_tool_output_message(item, recipients[item.call_id]))
        elif isinstance(item, CompactionItem):
            messages.append(_compaction_message(item, vault, owner))
        elif isinstance(item, ToolSearchCallItem):
            messages.append(_search_call_message(item))
        elif isinstance(item, ToolSearchOutputItem):
            messages.append(_search_output_message(item))
        elif isinstance(item, ItemReference):
            raise UnrenderableRequest(f"Item with id '{item.id}' was not resolved.")
        else:
            messages.extend(mcp.messages(item))
    return messages


def tool_output_tokens(
    outputs: Sequence[ToolOutputItem], calls: list[InputItem], tools: ToolRegistry
) -> list[int]:
    """The harmony tokens of client tools' outputs, each the tool's message as a re-rendered
    history would have it (`_tool_output_message`): what a response resumed in place with
    injected outputs reads after its last ``<|call|>``, so a later turn's prompt continues the
    same tokens the engine holds. ``calls``: the items that hold the calls they answer."""
    recipients = _call_recipients(calls, tools)
    encoding = get_encoding()
    tokens: list[int] = []
    for item in outputs:
        tokens.extend(encoding.render(_tool_output_message(item, recipients[item.call_id])))
    return tokens


def _compaction_message(
    item: CompactionItem, vault: ReasoningVault | None, owner: str | None
) -> Message:
    summary = compaction.open_summary(vault, item.encrypted_content, owner)
    if summary is None:
        raise UnrenderableRequest("A compaction item could not be opened.")
    return Message.from_role_and_content(Role.USER, compaction.SUMMARY_PREFIX + summary)


def _call_recipients(items: list[InputItem], tools: ToolRegistry) -> dict[str, str]:
    recipients = {}
    for item in items:
        if isinstance(item, ClientCallItem):
            recipients[item.call_id] = recipient(CALL_TOOL[item.type])
        elif isinstance(item, FunctionCallItem | CustomToolCallItem):
            spec = tools.by_name(item.name, item.namespace)
            # `namespace` = the name: a deferred top-level tool's call (OpenAI's wire shape).
            namespace = None if item.namespace == item.name else item.namespace
            recipients[item.call_id] = spec.recipient if spec else recipient(item.name, namespace)
    return recipients


def _is_preamble(items: list[InputItem], index: int) -> bool:
    """An assistant message the model wrote before tool calls (harmony's commentary channel).

    Our own output marks it with ``phase: commentary``; clients that drop the phase still send
    it right before the calls it announced, and re-rendering it as ``final`` would end the turn.
    """
    item = items[index]
    if not isinstance(item, MessageItem) or item.role != "assistant":
        return False
    if item.phase is not None:
        return item.phase == "commentary"
    for later in items[index + 1 :]:
        if isinstance(later, ReasoningItem):
            continue
        return isinstance(later, ToolCallItem)
    return False


def _last_final_answer(items: list[InputItem]) -> int:
    finals = [
        index
        for index, item in enumerate(items)
        if isinstance(item, MessageItem)
        and item.role == "assistant"
        and not _is_preamble(items, index)
    ]
    return finals[-1] if finals else -1


def _message(item: MessageItem, *, is_preamble: bool) -> Message:
    if item.role == "user":
        return Message.from_role_and_content(Role.USER, item.text)
    if item.role in ("system", "developer"):
        return Message.from_role_and_content(Role.DEVELOPER, item.text)
    channel = "commentary" if is_preamble else "final"
    return Message.from_role_and_content(Role.ASSISTANT, item.text).with_channel(channel)


def _reasoning_message(
    item: ReasoningItem, vault: ReasoningVault | None, owner: str | None
) -> list[Message]:
    text = _reasoning_text(item, vault, owner)
    if not text:
        return []
    return [Message.from_role_and_content(Role.ASSISTANT, text).with_channel("analysis")]


def _reasoning_text(item: ReasoningItem, vault: ReasoningVault | None, owner: str | None) -> str:
    """Full reasoning text if the client kept it, else what we sealed (for this owner), else
    the summary."""
    if item.content:
        return "".join(part.text for part in item.content)
    if item.encrypted_content and vault is not None:
        opened = vault.open(item.encrypted_content, owner=owner)
        if opened is not None:
            return opened
    return "\n".join(part.text for part in item.summary)


def _tool_call_message(item: ToolCallItem, recipient: str) -> Message:
    if isinstance(item, FunctionCallItem):
        body, content_type = item.arguments, _JSON_CONTENT_TYPE
    elif isinstance(item, ClientCallItem):
        body = client_tools.call_arguments(item.arguments())
        content_type = _JSON_CONTENT_TYPE
    else:
        body, content_type = item.input, None
    message = (
        Message.from_role_and_content(Role.ASSISTANT, body)
        .with_channel("commentary")
        .with_recipient(recipient)
    )
    return message.with_content_type(content_type) if content_type else message


def _tool_output_message(item: ToolOutputItem, recipient: str) -> Message:
    text = client_tools.output_text(item) if isinstance(item, ClientOutputItem) else item.text
    return (
        Message.from_author_and_content(Author.new(Role.TOOL, recipient), text)
        .with_channel("commentary")
        .with_recipient("assistant")
    )


# --- tool search ---------------------------------------------------------------------------


def _search_call_message(item: ToolSearchCallItem) -> Message:
    """The model's search, as it wrote it: a call to ``functions.tool_search``."""
    arguments = item.arguments
    body = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return (
        Message.from_role_and_content(Role.ASSISTANT, body)
        .with_channel("commentary")
        .with_recipient(recipient(TOOL_SEARCH_NAME))
        .with_content_type(_JSON_CONTENT_TYPE)
    )


def _search_output_message(item: ToolSearchOutputItem) -> Message:
    """The tools a search loaded, shown where the search answered (the prompt before it, and
    its cached prefix, stay as they were)."""
    return (
        Message.from_author_and_content(
            Author.new(Role.TOOL, recipient(TOOL_SEARCH_NAME)), search_output_text(item)
        )
        .with_channel("commentary")
        .with_recipient("assistant")
    )


def search_output_text(item: ToolSearchOutputItem) -> str:
    """What the model reads of a ``tool_search_output``: the tools' definitions as the
    developer message writes tools (the server's search answers the model with this same text
    inside the response, so a later turn renders the same tokens)."""
    grouped: dict[str | None, list[ToolSpec]] = {}
    for spec in output_specs(item):
        grouped.setdefault(spec.namespace, []).append(spec)
    descriptions = {tool.name: tool.description for tool in item.tools if tool.type == "namespace"}
    texts = [
        NamespaceText(
            name=namespace or DEFAULT_NAMESPACE,
            description=descriptions.get(namespace) if namespace else None,
            tools=[_tool_text(spec) for spec in specs],
        )
        for namespace, specs in grouped.items()
    ]
    return tools_section(texts) if texts else "No tools found."
