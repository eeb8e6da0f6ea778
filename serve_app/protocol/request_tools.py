"""The tools of a ``POST /v1/responses`` request and its ``tool_choice``: function tools flat
(Responses) or nested (Chat Completions), custom (freeform) tools, namespaces, ``tool_search``
(tools marked ``defer_loading`` stay hidden until the model searches), any other type parsed only
to be refused at the door (tool_types.py, the table of every type), and the ``allowed_tools``
choice."""

from __future__ import annotations

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

from serve_app.protocol.builtin_tools import (
    BUILTIN_TOOL_TYPES,
    CODE_INTERPRETER_TYPE,
    CodeInterpreterTool,
    WebSearchTool,
)
from serve_app.protocol.client_tools import (
    CLIENT_TOOL_TYPES,
    ApplyPatchTool,
    LocalShellTool,
    ShellTool,
)
from serve_app.protocol.mcp_items import McpTool
from serve_app.protocol.request_base import STRICT_TYPES, Lenient


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


class FunctionTool(Lenient):
    """A function tool, flat (Responses) or nested ``{"function": {...}}`` (Chat Completions)."""

    type: Literal["function"] = "function"
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_\-.]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    # Hidden from the model until a `tool_search` finds it.
    defer_loading: bool | None = None
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


class CustomToolFormat(Lenient):
    type: Literal["text", "grammar"] = "text"
    syntax: str | None = None
    definition: str | None = None


class CustomTool(Lenient):
    """A freeform tool whose input is raw text (Codex's apply_patch with a lark grammar)."""

    type: Literal["custom"]
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_\-.]+$")
    description: str | None = None
    format: CustomToolFormat | None = None
    defer_loading: bool | None = None


class NamespaceTool(Lenient):
    type: Literal["namespace"]
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_\-]+$")
    description: str | None = None
    tools: list[Annotated[FunctionTool | CustomTool, Field(discriminator="type")]] = Field(
        default_factory=list
    )
    # Not in the SDK's NamespaceTool (its inner tools carry it), but OpenAI's tool search guide
    # defers whole namespaces: every inner tool is deferred.
    defer_loading: bool | None = None

    def deferred(self, inner: FunctionTool | CustomTool) -> bool:
        return bool(self.defer_loading or inner.defer_loading)


class ToolSearchTool(Lenient):
    """``tool_search``: the model searches the request's deferred tools. ``execution`` server
    (OpenAI's default): the server answers; client: the call goes back to the client, which
    answers with a ``tool_search_output`` item (``description``/``parameters``: what the model
    is shown for it then)."""

    type: Literal["tool_search"]
    execution: Literal["server", "client"] | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None


class HostedTool(BaseModel):
    """A tool of a type no model here types (file_search, image_generation, an unknown type...):
    parsed only to be refused at the door (tool_types.py), so its settings stay opaque (an
    ``image_generation`` tool's mask is a base64 data URL)."""

    model_config = ConfigDict(**STRICT_TYPES, extra="allow")
    type: str


class OmittedTool(BaseModel):
    """A tool of the request that this deployment cannot run and serves the request without
    (tool_types.py, `omitted`: Codex's web_search with no browser server). Never parsed from a
    body: the door puts it in place of the client's tool (serve_app.serving.admission.tools,
    `omit_unavailable`). The model is not offered it and reads ``note`` instead; the Response
    echoes the tool as sent."""

    model_config = ConfigDict(frozen=True)
    type: str
    sent: dict[str, Any]
    # The line of the system message that tells the model the tool is unavailable.
    note: str

    def echo(self) -> dict[str, Any]:
        return self.sent


def omitted_types(tools: list[Any]) -> list[str]:
    """The types of a request's omitted tools, each once, in their order."""
    return list(dict.fromkeys(tool.type for tool in tools if isinstance(tool, OmittedTool)))


# The typed tool types (each a model above, gpt-oss's browser and python tagged by
# `_tool_tag`); any other type is a `HostedTool`.
TYPED_TOOLS = ("function", "custom", "namespace", "tool_search", "mcp", *CLIENT_TOOL_TYPES)
TOOL_TAGS = (*TYPED_TOOLS, "web_search", "code_interpreter", "hosted")


def _tool_tag(value: Any) -> str:
    tool_type = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if tool_type in BUILTIN_TOOL_TYPES:  # gpt-oss's browser and python (builtin_tools.py)
        return tool_type if tool_type == CODE_INTERPRETER_TYPE else "web_search"
    return tool_type if tool_type in TYPED_TOOLS else "hosted"


Tool = Annotated[
    Annotated[FunctionTool, Tag("function")]
    | Annotated[CustomTool, Tag("custom")]
    | Annotated[NamespaceTool, Tag("namespace")]
    | Annotated[McpTool, Tag("mcp")]
    | Annotated[ShellTool, Tag("shell")]
    | Annotated[LocalShellTool, Tag("local_shell")]
    | Annotated[ApplyPatchTool, Tag("apply_patch")]
    | Annotated[WebSearchTool, Tag("web_search")]
    | Annotated[CodeInterpreterTool, Tag("code_interpreter")]
    | Annotated[ToolSearchTool, Tag("tool_search")]
    | Annotated[HostedTool, Tag("hosted")],
    PydanticDiscriminator(_tool_tag),
]


class NamedToolChoice(Lenient):
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


@dataclass(frozen=True)
class AllowedTools:
    """``tool_choice: {"type": "allowed_tools", "mode": ..., "tools": [...]}``: the model may
    call only these function, custom or client-run tools (by name), and must call one when
    ``required``. Hosted tools among them are left out, as hosted tools are."""

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
    # A client-run tool (`{"type": "shell"}`) is named by its type (the function the model
    # calls: serve_app.harmony.client_tools).
    names |= {
        tool["type"]
        for tool in (tools if isinstance(tools, list) else [])
        if isinstance(tool, dict) and tool.get("type") in CLIENT_TOOL_TYPES
    }
    return AllowedTools(frozenset(names), required=extra.get("mode") == "required")


def client_tool_choice(choice: ToolChoice) -> str | None:
    """The client-run tool a ``{"type": "shell"}`` or ``{"type": "apply_patch"}`` choice
    forces (the SDK's ``tool_choice_shell`` and ``tool_choice_apply_patch``), else None."""
    if isinstance(choice, OtherToolChoice) and choice.type in ("shell", "apply_patch"):
        return choice.type
    return None
