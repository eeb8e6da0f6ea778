"""gpt-oss's own tools as a request names them: ``web_search`` (and ``web_search_preview``),
which the model uses as its ``browser`` tool, and ``code_interpreter``, its ``python`` tool;
and the input items that carry their calls back (``web_search_call``,
``code_interpreter_call``). Typed as the openai SDK types them (``tool_param.py``,
``web_search_tool_param.py``, ``response_function_web_search_param.py``,
``response_code_interpreter_tool_call_param.py``): same field names, same enums."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from serve_app.protocol.request_base import Lenient

WEB_SEARCH_TYPES = (
    "web_search",
    "web_search_2025_08_26",
    "web_search_preview",
    "web_search_preview_2025_03_11",
)
CODE_INTERPRETER_TYPE = "code_interpreter"
BUILTIN_TOOL_TYPES = (*WEB_SEARCH_TYPES, CODE_INTERPRETER_TYPE)
# The one container this server runs code in: each response's calls share the tool server's
# session (a stateful notebook, as gpt-oss was trained), named by this id in the items.
AUTO_CONTAINER = "auto"


class WebSearchFilters(Lenient):
    allowed_domains: list[str] | None = None


class UserLocation(Lenient):
    type: Literal["approximate"] = "approximate"
    city: str | None = None
    country: str | None = None
    region: str | None = None
    timezone: str | None = None


class WebSearchTool(Lenient):
    """``web_search`` / ``web_search_preview``: gpt-oss's ``browser`` (search, open, find)."""

    type: Literal[
        "web_search",
        "web_search_2025_08_26",
        "web_search_preview",
        "web_search_preview_2025_03_11",
    ]
    filters: WebSearchFilters | None = None
    search_context_size: Literal["low", "medium", "high"] | None = None
    user_location: UserLocation | None = None
    external_web_access: bool | None = None
    search_content_types: list[Literal["text", "image"]] | None = None


class CodeInterpreterContainerAuto(Lenient):
    type: Literal["auto"]
    file_ids: list[str] | None = None
    memory_limit: Literal["1g", "4g", "16g", "64g"] | None = None
    network_policy: dict[str, Any] | None = None


class CodeInterpreterTool(Lenient):
    """``code_interpreter``: gpt-oss's ``python``. ``container`` is ``{"type": "auto"}`` or a
    container id; this server has one container, ``auto`` (any other id is a 400 at the
    door, serve_app.serving.admission.builtin)."""

    type: Literal["code_interpreter"]
    container: str | CodeInterpreterContainerAuto
    allowed_callers: list[Literal["direct", "programmatic"]] | None = None

    @property
    def container_id(self) -> str | None:
        """The container id the client named (None for ``{"type": "auto"}``)."""
        return self.container if isinstance(self.container, str) else None


BuiltinTool = WebSearchTool | CodeInterpreterTool


# --- input items -----------------------------------------------------------------------------


class SearchSource(Lenient):
    type: Literal["url"] = "url"
    url: str


class SearchAction(Lenient):
    type: Literal["search"]
    query: str | None = None
    queries: list[str] | None = None
    sources: list[SearchSource] | None = None


class OpenPageAction(Lenient):
    type: Literal["open_page"]
    url: str | None = None


class FindInPageAction(Lenient):
    type: Literal["find_in_page"]
    pattern: str
    url: str


_ACTION_CLASSES = {
    "search": "SearchAction",
    "open_page": "OpenPageAction",
    "find_in_page": "FindInPageAction",
}


def _action_tag(value: Any) -> str | None:
    # Tagged by class name, which a 400's `param` leaves out (body_errors.py), so an error
    # names `input[3].action.url`, from the one action its `type` names.
    action_type = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return _ACTION_CLASSES.get(action_type) if isinstance(action_type, str) else None


WebSearchAction = Annotated[
    Annotated[SearchAction, Tag("SearchAction")]
    | Annotated[OpenPageAction, Tag("OpenPageAction")]
    | Annotated[FindInPageAction, Tag("FindInPageAction")],
    Discriminator(
        _action_tag,
        custom_error_type="invalid_action_type",
        custom_error_message="action.type must be one of 'search', 'open_page', 'find_in_page'",
    ),
]


class WebSearchCallItem(Lenient):
    """A browser call the model made (``browser.search``, ``.open``, ``.find``). OpenAI's item
    carries no result text: what the renderer shows the model for it is in harmony/builtin.py."""

    type: Literal["web_search_call"]
    id: Annotated[str, Field(max_length=256)] | None = None
    action: WebSearchAction
    status: Literal["in_progress", "searching", "completed", "failed", "incomplete"] | None = None


class CodeLogs(Lenient):
    type: Literal["logs"]
    logs: str


class CodeImage(Lenient):
    type: Literal["image"]
    url: str


def _output_tag(value: Any) -> str | None:
    output_type = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if not isinstance(output_type, str):
        return None
    return {"logs": "CodeLogs", "image": "CodeImage"}.get(output_type)


CodeOutput = Annotated[
    Annotated[CodeLogs, Tag("CodeLogs")] | Annotated[CodeImage, Tag("CodeImage")],
    Discriminator(
        _output_tag,
        custom_error_type="invalid_output_type",
        custom_error_message="an output's type is 'logs' or 'image'",
    ),
]


class CodeInterpreterCallItem(Lenient):
    """A ``python`` call the model made: its code and (when the client kept them) outputs."""

    type: Literal["code_interpreter_call"]
    id: Annotated[str, Field(max_length=256)] | None = None
    code: str | None = None
    container_id: str | None = None
    outputs: list[CodeOutput] | None = None
    status: Literal["in_progress", "completed", "incomplete", "interpreting", "failed"] | None = (
        None
    )

    @property
    def logs(self) -> str | None:
        """The text outputs, joined (None: the item carries none)."""
        if not self.outputs:
            return None
        parts = [output.logs for output in self.outputs if isinstance(output, CodeLogs)]
        return "".join(parts) if parts else None


BUILTIN_ITEM_TYPES = ("web_search_call", "code_interpreter_call")
