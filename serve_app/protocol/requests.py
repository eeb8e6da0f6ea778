"""The ``POST /v1/responses`` request body.

Lenient where real clients differ (Codex 0.169 and 0.63, the openai SDK, the Agents SDK):
``input`` as a string or items, message content as a string or parts, tools flat or nested
Chat-Completions style, hosted tools this server cannot run. Strict where a mistake would
silently change the conversation: unknown item types, missing call ids, calls without outputs.
Unknown top-level fields are ignored, as OpenAI ignores them. Types are as strict as OpenAI's:
``temperature: true``, ``stream: 0`` or ``max_output_tokens: "5"`` is a 400 naming the field,
never coerced (JSON's integers still pass for numbers).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic import Discriminator as PydanticDiscriminator
from pydantic_core import InitErrorDetails, PydanticCustomError

logger = logging.getLogger(__name__)


# Pydantic's strict mode: no coercion between JSON types (a boolean is not a number, a number
# not a string), as OpenAI answers; an integer still passes where a number is expected. Every
# request model sets it, so fields added later inherit it.
STRICT_TYPES = ConfigDict(strict=True)


class _Lenient(BaseModel):
    """Ignore fields we do not use (clients send many: ids, status, client_metadata...), but
    take the ones we use only with their JSON type."""

    model_config = ConfigDict(**STRICT_TYPES, extra="ignore")


class Opaque:
    """Marks a field the model never reads as text (``Annotated[str, OPAQUE]``): a sealed blob,
    which the server opens with its key or treats as one it cannot open. It is never tokenized,
    so the rule for text the tokenizer reads (serve_app.serving.admission.responses.check_text)
    passes over it."""

    def __repr__(self) -> str:
        return "OPAQUE"


OPAQUE = Opaque()


# --- content parts -------------------------------------------------------------------------

TEXT_PART_TYPES = {"input_text", "output_text", "text", "summary_text", "reasoning_text"}
# The model reads text only; these parts are replaced by a short note in the prompt.
NON_TEXT_PART_TYPES = {"input_image", "input_file", "input_audio", "image_url"}


class ContentPart(_Lenient):
    type: str
    text: str | None = None
    refusal: str | None = None

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

# The longest item id a client may choose. The store keeps any id up to it (and indexes it:
# 256 characters fit a PostgreSQL index entry); longer is a 400 naming the item's `id`.
MAX_ITEM_ID_LENGTH = 256
ItemId = Annotated[str, Field(max_length=MAX_ITEM_ID_LENGTH)]


class MessageItem(_Lenient):
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart]
    id: ItemId | None = None
    # Set on assistant messages we returned: "commentary" marks a preamble before tool calls.
    phase: Literal["commentary", "final_answer"] | None = None

    @property
    def text(self) -> str:
        return join_parts(self.content)


class ReasoningSummary(_Lenient):
    type: str = "summary_text"
    text: str


class ReasoningContent(_Lenient):
    type: str = "reasoning_text"
    text: str


class ReasoningItem(_Lenient):
    type: Literal["reasoning"]
    id: ItemId | None = None
    summary: list[ReasoningSummary] = Field(default_factory=list)
    content: list[ReasoningContent] | None = None
    encrypted_content: Annotated[str | None, OPAQUE] = None


class _ToolCall(_Lenient):
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    namespace: str | None = None
    id: ItemId | None = None


class _ToolOutput(_Lenient):
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


class ItemReference(_Lenient):
    """A stored item named by its id; the service replaces it with that item before rendering.
    ``type`` is optional (the openai SDK's ``ItemReference``): an item with only an id is one."""

    # The SDK allows `type: null`; it is read as "item_reference".
    type: Literal["item_reference"] | None = "item_reference"
    id: str = Field(min_length=1, max_length=MAX_ITEM_ID_LENGTH)

    @field_validator("type", mode="before")
    @classmethod
    def _null_type(cls, value: Any) -> Any:
        return "item_reference" if value is None else value


class CompactionItem(_Lenient):
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
    | Annotated[CompactionItem, Tag("compaction")],
    PydanticDiscriminator(
        _item_tag,
        custom_error_type="invalid_item_type",
        custom_error_message=f"unsupported input item type; expected one of {INPUT_ITEM_TYPES}",
    ),
]

ToolCallItem = FunctionCallItem | CustomToolCallItem
ToolOutputItem = FunctionCallOutputItem | CustomToolCallOutputItem


# --- tools ---------------------------------------------------------------------------------


def _validate_function_form(value: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
    """Validate the Chat-Completions form ``{"type": "function", "function": {...}}`` as its
    flat Responses twin, with errors located where the client wrote the field
    (``tools[0].function.strict``, not ``tools[0].strict``)."""
    if not (isinstance(value, dict) and isinstance(value.get("function"), dict)):
        return handler(value)
    try:
        return handler({"type": "function", **value["function"]})
    except ValidationError as exc:
        moved = [
            InitErrorDetails(
                type=PydanticCustomError(error["type"], error["msg"]),
                loc=("function", *error["loc"]),
                input=error["input"],
            )
            for error in exc.errors()
        ]
        raise ValidationError.from_exception_data(exc.title, moved) from None


class FunctionTool(_Lenient):
    """A function tool, flat (Responses) or nested ``{"function": {...}}`` (Chat Completions)."""

    type: Literal["function"] = "function"
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_\-.]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    # Sent in the Chat-Completions form: errors about its fields name `tools[i].function.X`.
    _chat_form: bool = PrivateAttr(default=False)

    @model_validator(mode="wrap")
    @classmethod
    def _flatten_nested(cls, value: Any, handler: ModelWrapValidatorHandler[FunctionTool]) -> Any:
        tool = _validate_function_form(value, handler)
        if isinstance(value, dict) and isinstance(value.get("function"), dict):
            tool._chat_form = True
        return tool

    @property
    def chat_form(self) -> bool:
        return self._chat_form


class CustomToolFormat(_Lenient):
    type: Literal["text", "grammar"] = "text"
    syntax: str | None = None
    definition: str | None = None


class CustomTool(_Lenient):
    """A freeform tool whose input is raw text (Codex's apply_patch with a lark grammar)."""

    type: Literal["custom"]
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_\-.]+$")
    description: str | None = None
    format: CustomToolFormat | None = None


class NamespaceTool(_Lenient):
    type: Literal["namespace"]
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_\-]+$")
    description: str | None = None
    tools: list[Annotated[FunctionTool | CustomTool, Field(discriminator="type")]] = Field(
        default_factory=list
    )


class HostedTool(BaseModel):
    """A tool OpenAI runs server-side (web_search, file_search...): accepted, not rendered, so
    its settings are opaque (an ``image_generation`` tool's mask is a base64 data URL)."""

    model_config = ConfigDict(**STRICT_TYPES, extra="allow")
    type: str


TOOL_TAGS = ("function", "custom", "namespace", "hosted")


def _tool_tag(value: Any) -> str:
    tool_type = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return tool_type if tool_type in ("function", "custom", "namespace") else "hosted"


Tool = Annotated[
    Annotated[FunctionTool, Tag("function")]
    | Annotated[CustomTool, Tag("custom")]
    | Annotated[NamespaceTool, Tag("namespace")]
    | Annotated[HostedTool, Tag("hosted")],
    PydanticDiscriminator(_tool_tag),
]


class NamedToolChoice(_Lenient):
    """``{"type": "function", "name": ...}``, nested ``{"function": {"name"}}``, or custom."""

    type: Literal["function", "custom"]
    name: str

    @model_validator(mode="wrap")
    @classmethod
    def _flatten_nested(
        cls, value: Any, handler: ModelWrapValidatorHandler[NamedToolChoice]
    ) -> Any:
        return _validate_function_form(value, handler)


class OtherToolChoice(BaseModel):
    """Hosted tool choices...: accepted and treated as ``auto``; ``allowed_tools`` is read
    from its extra fields (``allowed_tools()``) and enforced."""

    model_config = ConfigDict(**STRICT_TYPES, extra="allow")
    type: str

    @field_validator("type")
    @classmethod
    def _not_a_named_choice(cls, value: str) -> str:
        # A malformed function or custom choice is the client's error, not `auto`.
        if value in ("function", "custom"):
            raise ValueError(f"a {value} tool choice needs a string `name`")
        return value


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice | OtherToolChoice


# --- the request ---------------------------------------------------------------------------

ReasoningEffortName = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


ReasoningSummaryName = Literal["auto", "concise", "detailed"]


class ReasoningOptions(_Lenient):
    effort: ReasoningEffortName | None = None
    summary: ReasoningSummaryName | None = None


class TextFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextOptions(_Lenient):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ConversationRef(_Lenient):
    id: str = Field(min_length=1)


class ContextManagement(_Lenient):
    """One entry of ``context_management``: ``{"type": "compaction", "compact_threshold": N}``
    compacts the history before generating once the prompt reaches N tokens (judged in
    serve_app.serving.admission.responses; run by serve_app.serving.turn.context_management)."""

    type: str
    compact_threshold: int | None = None


class ResponsesRequest(_Lenient):
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
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    safety_identifier: str | None = Field(default=None, max_length=128)
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    context_management: list[ContextManagement] | None = None

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

    def hosted_tool_types(self) -> list[str]:
        return [tool.type for tool in self.tools if isinstance(tool, HostedTool)]


@dataclass(frozen=True)
class AllowedTools:
    """``tool_choice: {"type": "allowed_tools", "mode": ..., "tools": [...]}``: the model may
    call only these function or custom tools (by name), and must call one when ``required``.
    Hosted tools among them are left out, as hosted tools are."""

    names: frozenset[str]
    required: bool


def allowed_tools(choice: ToolChoice) -> AllowedTools | None:
    """The ``allowed_tools`` choice, else None. Parsing only: a malformed one is a 400 at the
    door (serve_app.serving.admission.tools) before anything reads it; its malformed entries
    are skipped here."""
    if not isinstance(choice, OtherToolChoice) or choice.type != "allowed_tools":
        return None
    extra = choice.model_extra or {}
    tools = extra.get("tools")
    names = {
        tool["name"]
        for tool in (tools if isinstance(tools, list) else [])
        if isinstance(tool, dict)
        and tool.get("type") in ("function", "custom")
        and isinstance(tool.get("name"), str)
    }
    return AllowedTools(frozenset(names), required=extra.get("mode") == "required")
