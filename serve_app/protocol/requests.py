"""The ``POST /v1/responses`` request body.

Lenient where real clients differ (Codex 0.169 and 0.63, the openai SDK, the Agents SDK):
``input`` as a string or items, message content as a string or parts, tools flat or nested
Chat-Completions style, tools of any type (the door refuses those not shown or run here:
tool_types.py). Strict where a mistake would
silently change the conversation: unknown item types, missing call ids, calls without outputs.
Unknown top-level fields are ignored, as OpenAI ignores them. Types are as strict as OpenAI's:
``temperature: true``, ``stream: 0`` or ``max_output_tokens: "5"`` is a 400 naming the field,
never coerced (JSON's integers still pass for numbers).
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from pydantic import Discriminator as PydanticDiscriminator
from pydantic import (
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from serve_app.protocol import mcp_items
from serve_app.protocol.builtin_tools import CodeInterpreterCallItem, WebSearchCallItem
from serve_app.protocol.client_tools import (
    ApplyPatchCallItem,
    ApplyPatchCallOutputItem,
    ClientCallItem,
    ClientOutputItem,
    LocalShellCallItem,
    LocalShellCallOutputItem,
    ShellCallItem,
    ShellCallOutputItem,
)
from serve_app.protocol.moderation import ModerationOptions
from serve_app.protocol.prompt_cache import (
    BREAKPOINT_PART_TYPES,
    PromptCacheBreakpoint,
    PromptCacheOptions,
)
from serve_app.protocol.request_base import MAX_ITEM_ID_LENGTH, OPAQUE, ItemId, Lenient
from serve_app.protocol.request_tools import Tool, ToolChoice
from serve_app.protocol.service_tiers import ServiceTier
from serve_app.protocol.tool_search import ToolSearchCallItem, ToolSearchOutputItem

logger = logging.getLogger(__name__)


# --- content parts -------------------------------------------------------------------------

TEXT_PART_TYPES = {"input_text", "output_text", "text", "summary_text", "reasoning_text"}
# The model reads text only; these parts are replaced by a short note in the prompt.
NON_TEXT_PART_TYPES = {"input_image", "input_file", "input_audio", "image_url"}


class ContentPart(Lenient):
    type: str
    text: str | None = None
    refusal: str | None = None
    # Where a reusable prefix ends (issue 40): on a part the client wrote, not the model's.
    prompt_cache_breakpoint: PromptCacheBreakpoint | None = None

    @field_validator("prompt_cache_breakpoint")
    @classmethod
    def _on_an_input_part(
        cls, value: PromptCacheBreakpoint | None, info: ValidationInfo
    ) -> PromptCacheBreakpoint | None:
        kind = info.data.get("type")
        if value is not None and kind not in BREAKPOINT_PART_TYPES:
            raise ValueError(
                f"`{kind}` parts cannot carry a prompt cache breakpoint (only "
                f"{', '.join(sorted(BREAKPOINT_PART_TYPES))} can)"
            )
        return value

    @model_validator(mode="after")
    def _known_type(self) -> ContentPart:
        known = TEXT_PART_TYPES | NON_TEXT_PART_TYPES | {"refusal"}
        if self.type not in known:
            raise ValueError(f"unsupported content part type {self.type!r}")
        if self.type in TEXT_PART_TYPES and self.text is None:
            raise ValueError(f"a {self.type} part needs `text`")
        return self

    def as_text(self) -> str:
        if self.type == "refusal":
            return self.refusal or ""
        if self.type in NON_TEXT_PART_TYPES:
            return f"[{self.type} omitted: this model reads text only]"
        return self.text or ""


def join_parts(content: str | list[ContentPart]) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.as_text() for part in content)


# --- input items ---------------------------------------------------------------------------

# `MAX_ITEM_ID_LENGTH`, `ItemId`: request_base.py (item modules beside this one share them).


class MessageItem(Lenient):
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart]
    id: ItemId | None = None
    # Set on assistant messages we returned: "commentary" marks a preamble before tool calls.
    phase: Literal["commentary", "final_answer"] | None = None

    @property
    def text(self) -> str:
        return join_parts(self.content)


class ReasoningSummary(Lenient):
    type: str = "summary_text"
    text: str


class ReasoningContent(Lenient):
    type: str = "reasoning_text"
    text: str


class ReasoningItem(Lenient):
    type: Literal["reasoning"]
    id: ItemId | None = None
    summary: list[ReasoningSummary] = Field(default_factory=list)
    content: list[ReasoningContent] | None = None
    encrypted_content: Annotated[str | None, OPAQUE] = None


class _ToolCall(Lenient):
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    namespace: str | None = None
    id: ItemId | None = None


class _ToolOutput(Lenient):
    call_id: str = Field(min_length=1)
    output: str | list[ContentPart]
    id: ItemId | None = None

    @property
    def text(self) -> str:
        return join_parts(self.output)


class FunctionCallItem(_ToolCall):
    type: Literal["function_call"]
    arguments: str


class FunctionCallOutputItem(_ToolOutput):
    type: Literal["function_call_output"]


class CustomToolCallItem(_ToolCall):
    type: Literal["custom_tool_call"]
    input: str


class CustomToolCallOutputItem(_ToolOutput):
    type: Literal["custom_tool_call_output"]


class ItemReference(Lenient):
    """A stored item named by its id; the service replaces it with that item before rendering.
    ``type`` is optional (the openai SDK's ``ItemReference``): an item with only an id is one."""

    # The SDK allows `type: null`; it is read as "item_reference".
    type: Literal["item_reference"] | None = "item_reference"
    id: str = Field(min_length=1, max_length=MAX_ITEM_ID_LENGTH)

    @field_validator("type", mode="before")
    @classmethod
    def _null_type(cls, value: Any) -> Any:
        return "item_reference" if value is None else value


class CompactionItem(Lenient):
    """A summary from ``POST /v1/responses/compact`` standing in for the history it replaced;
    the summary is sealed in ``encrypted_content`` with the server's key."""

    type: Literal["compaction"]
    encrypted_content: Annotated[str, OPAQUE] = Field(min_length=1)
    id: ItemId | None = None


INPUT_ITEM_TYPES = (
    "message",
    "reasoning",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "item_reference",
    "compaction",
    *mcp_items.MCP_ITEM_TYPES,
    *("shell_call", "shell_call_output", "local_shell_call", "local_shell_call_output"),
    *("apply_patch_call", "apply_patch_call_output"),
    "web_search_call",
    "code_interpreter_call",
    "tool_search_call",
    "tool_search_output",
)


def _item_tag(value: Any) -> str | None:
    # Messages may omit `type` (the SDK's EasyInputMessage): a `role` makes them messages.
    # Item references may too: an `id` alone (with a null `type` at most) is a reference. An
    # item carrying fields of its own without a type is malformed, not a reference.
    if isinstance(value, dict):
        item_type = value.get("type")
        if item_type is None and "role" in value:
            return "message"
        if item_type is None and "id" in value and value.keys() <= {"id", "type"}:
            return "item_reference"
        return item_type if item_type in INPUT_ITEM_TYPES else None
    return getattr(value, "type", None)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[CustomToolCallItem, Tag("custom_tool_call")]
    | Annotated[CustomToolCallOutputItem, Tag("custom_tool_call_output")]
    | Annotated[ItemReference, Tag("item_reference")]
    | Annotated[CompactionItem, Tag("compaction")]
    | Annotated[mcp_items.McpListToolsItem, Tag("mcp_list_tools")]
    | Annotated[mcp_items.McpCallItem, Tag("mcp_call")]
    | Annotated[mcp_items.McpApprovalRequestItem, Tag("mcp_approval_request")]
    | Annotated[mcp_items.McpApprovalResponseItem, Tag("mcp_approval_response")]
    | Annotated[ShellCallItem, Tag("shell_call")]
    | Annotated[ShellCallOutputItem, Tag("shell_call_output")]
    | Annotated[LocalShellCallItem, Tag("local_shell_call")]
    | Annotated[LocalShellCallOutputItem, Tag("local_shell_call_output")]
    | Annotated[ApplyPatchCallItem, Tag("apply_patch_call")]
    | Annotated[ApplyPatchCallOutputItem, Tag("apply_patch_call_output")]
    | Annotated[WebSearchCallItem, Tag("web_search_call")]
    | Annotated[CodeInterpreterCallItem, Tag("code_interpreter_call")]
    | Annotated[ToolSearchCallItem, Tag("tool_search_call")]
    | Annotated[ToolSearchOutputItem, Tag("tool_search_output")],
    PydanticDiscriminator(
        _item_tag,
        custom_error_type="invalid_item_type",
        custom_error_message=f"unsupported input item type; expected one of {INPUT_ITEM_TYPES}",
    ),
]

ToolCallItem = FunctionCallItem | CustomToolCallItem | ClientCallItem
ToolOutputItem = FunctionCallOutputItem | CustomToolCallOutputItem | ClientOutputItem


# --- the request ---------------------------------------------------------------------------

ReasoningEffortName = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


ReasoningSummaryName = Literal["auto", "concise", "detailed"]


class ReasoningOptions(Lenient):
    effort: ReasoningEffortName | None = None
    summary: ReasoningSummaryName | None = None


class TextFormat(Lenient):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextOptions(Lenient):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ConversationRef(Lenient):
    id: str = Field(min_length=1)


class ContextManagement(Lenient):
    """One entry of ``context_management``: ``{"type": "compaction", "compact_threshold": N}``
    compacts the history before generating once the prompt reaches N tokens (judged in
    serve_app.serving.admission.responses; run by serve_app.serving.turn.context_management)."""

    type: str
    compact_threshold: int | None = None


class ResponsesRequest(Lenient):
    model: str = Field(min_length=1)
    input: str | list[InputItem] = Field(default_factory=list)
    instructions: str | None = None
    tools: list[Tool] = Field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    reasoning: ReasoningOptions | None = None
    text: TextOptions | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    prompt_cache_key: str | None = Field(default=None, max_length=1024)
    store: bool = True
    previous_response_id: str | None = Field(default=None, min_length=1)
    # A conversation whose items come before `input`, and that this response's items extend.
    conversation: str | ConversationRef | None = None
    include: list[str] = Field(default_factory=list)
    metadata: dict[str, str] | None = None
    stream: bool = False
    background: bool = False
    user: str | None = None
    # Accepted and echoed as OpenAI does (see protocol/responses.py::initial_response).
    truncation: Literal["auto", "disabled"] = "disabled"
    max_tool_calls: int | None = Field(default=None, ge=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # Every value the openai SDK types; what each is served at: protocol/service_tiers.py.
    service_tier: ServiceTier | None = None
    safety_identifier: str | None = Field(default=None, max_length=128)
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    context_management: list[ContextManagement] | None = None
    # Judged by the moderation model the app serves (serve_app/protocol/moderation.py); null
    # or absent: not moderated.
    moderation: ModerationOptions | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        # OpenAI's limits: 16 pairs, keys up to 64 characters, values up to 512.
        if value is None:
            return None
        if len(value) > 16:
            raise ValueError("metadata can hold at most 16 key-value pairs")
        for key, item in value.items():
            if len(key) > 64 or len(item) > 512:
                raise ValueError("metadata keys are at most 64 characters, values at most 512")
        return value

    @property
    def input_items(self) -> list[InputItem]:
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return self.input

    @property
    def effort(self) -> Literal["low", "medium", "high"]:
        effort = (self.reasoning.effort if self.reasoning else None) or "medium"
        if effort in ("none", "minimal"):
            return "low"
        return "high" if effort == "xhigh" else effort

    @property
    def conversation_id(self) -> str | None:
        if isinstance(self.conversation, ConversationRef):
            return self.conversation.id
        return self.conversation or None
