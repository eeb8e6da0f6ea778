"""A 400 from pydantic's errors on a request body or query: the deepest error, with OpenAI's
``param`` path written the way the client wrote the body (pydantic's union branch and tag
labels left out) or the query parameter's name. Apart from `errors`, which the request models
import: this module imports them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from serve_app.protocol import builtin_tools, mcp_items, request_tools, requests
from serve_app.protocol.errors import InvalidRequest, param_path

# Pydantic names union branches in error locations ("str", "list[...]", a model's class name,
# an item's tag after its index); OpenAI's `param` names only the fields the client wrote.
_TYPE_LABELS = {"str", "int", "float", "bool", "dict", "list", "none"}
_FASTAPI_PLACES = {"body", "query"}


def _client_loc(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    tags = {*requests.INPUT_ITEM_TYPES, *request_tools.TOOL_TAGS}
    models = {
        name
        for module in (requests, request_tools, mcp_items, builtin_tools)
        for name, value in vars(module).items()
        if isinstance(value, type) and issubclass(value, BaseModel)
    }
    cleaned: list[int | str] = []
    for index, part in enumerate(loc):
        # FastAPI's location names where the value was; OpenAI's `param` only the field
        # (`limit`, never `query.limit`).
        if index == 0 and part in _FASTAPI_PLACES:
            continue
        if isinstance(part, str):
            if part in _TYPE_LABELS or "[" in part or "(" in part:
                continue
            # The tag right after an index; a field of that name after it stays
            # (`tools[0].function.name` in the Chat-Completions form).
            if part in tags and index and isinstance(loc[index - 1], int):
                continue
            if part in models and cleaned:  # `conversation: str | ConversationRef`
                continue
        cleaned.append(part)
    return tuple(cleaned)


def from_validation_errors(errors: list[dict[str, Any]]) -> InvalidRequest:
    """One clear 400 from pydantic's errors: the most specific one, with OpenAI's param path.

    A union (``input`` is a string *or* a list) reports one error per branch; the deepest
    location is the branch the client meant.
    """
    if not errors:
        return InvalidRequest("Invalid request body.")
    best = max(errors, key=lambda error: len(_client_loc(tuple(error.get("loc", ())))))
    loc = _client_loc(tuple(best.get("loc", ())))
    param = param_path(loc) or None
    message = str(best.get("msg", "Invalid value"))
    if param:
        message = f"Invalid value for '{param}': {message}"
    code = "invalid_value" if best.get("type") != "missing" else "missing_required_parameter"
    return InvalidRequest(message, param=param, code=code)
