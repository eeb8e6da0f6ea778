"""The simulated engine's script language: what a test wants the "model" to say.

``turns: [{match: REGEX?, items: [...]}]`` (the package docstring lists the items). Its items
are named ``Script*``: they are steps of a scripted completion, not the Responses items of
serve_app.protocol.requests.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeAlias

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from serve_app.engines.base import SERVER_ERROR

SCRIPT_ENV = "SERVE_APP_SIM_SCRIPT"
# Tool names and namespaces go into a harmony header: no spaces, no special-token brackets.
_HEADER_NAME = r"^[^\s<>|]+$"


class _ScriptItem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScriptReasoning(_ScriptItem):
    """An ``analysis`` message (chain of thought)."""

    reasoning: str


class ScriptPreamble(_ScriptItem):
    """A ``commentary`` message with no recipient (a preamble shown to the user)."""

    preamble: str


class ScriptText(_ScriptItem):
    """A ``final`` message, ended with ``<|return|>``."""

    text: str


class FunctionCallSpec(_ScriptItem):
    name: str = Field(pattern=_HEADER_NAME)
    # A dict is sent as compact JSON text; a string is sent as is (e.g. deliberately bad JSON).
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    namespace: str | None = Field(default=None, pattern=_HEADER_NAME)


class ScriptFunctionCall(_ScriptItem):
    """``commentary to=functions.NAME <|constrain|>json``, ended with ``<|call|>``."""

    function_call: FunctionCallSpec


class CustomToolCallSpec(_ScriptItem):
    name: str = Field(pattern=_HEADER_NAME)
    input: str
    namespace: str | None = Field(default=None, pattern=_HEADER_NAME)


class ScriptCustomToolCall(_ScriptItem):
    """``commentary to=functions.NAME`` with raw text input, ended with ``<|call|>``."""

    custom_tool_call: CustomToolCallSpec


class BuiltinCallSpec(_ScriptItem):
    # gpt-oss's own tools: `browser.search`, `browser.open`, `browser.find`, `python`.
    to: str = Field(pattern=_HEADER_NAME)
    # A dict is sent as JSON text (the browser's arguments); a string as is (python's code).
    input: dict[str, Any] | str


class ScriptBuiltinCall(_ScriptItem):
    """``analysis to=TO code``, as gpt-oss calls its browser and python, ended with
    ``<|call|>``."""

    builtin_call: BuiltinCallSpec


class ScriptRaw(_ScriptItem):
    """Harmony text encoded verbatim, special tokens included (for malformed-output tests)."""

    raw: str


class Failure(_ScriptItem):
    message: str
    # ``server_error``: the engine failed; ``invalid_prompt`` / ``invalid_request``: vLLM
    # rejected the request as the client's fault (a 400 for the client).
    code: str = SERVER_ERROR


class ScriptFail(_ScriptItem):
    """The engine raises ``EngineError`` here, after streaming the items before it: a message
    (a ``server_error``), or ``{message, code}``."""

    fail: str | Failure

    @property
    def failure(self) -> Failure:
        return self.fail if isinstance(self.fail, Failure) else Failure(message=self.fail)


class ScriptSleep(_ScriptItem):
    """Pause the stream for this many seconds (abortable)."""

    sleep: float = Field(ge=0)


ScriptItem: TypeAlias = (
    ScriptReasoning
    | ScriptPreamble
    | ScriptText
    | ScriptFunctionCall
    | ScriptCustomToolCall
    | ScriptBuiltinCall
    | ScriptRaw
    | ScriptFail
    | ScriptSleep
)
_ITEM_TYPES: dict[str, type[_ScriptItem]] = {
    "reasoning": ScriptReasoning,
    "preamble": ScriptPreamble,
    "text": ScriptText,
    "function_call": ScriptFunctionCall,
    "custom_tool_call": ScriptCustomToolCall,
    "builtin_call": ScriptBuiltinCall,
    "raw": ScriptRaw,
    "fail": ScriptFail,
    "sleep": ScriptSleep,
}


class ScriptTurn(BaseModel):
    """One assistant turn, played when ``match`` is found in the prompt's last message.

    A turn without ``match`` matches any prompt. Stop tokens are ignored inside a turn (several
    tool calls each end with ``<|call|>`` and the stream goes on); the turn's end ends the
    request with finish reason "stop".
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    match: re.Pattern[str] | None = None
    items: tuple[ScriptItem, ...] = Field(min_length=1)

    @field_validator("items", mode="before")
    @classmethod
    def _parse_items(cls, items: Any) -> Any:
        """Parse each item by its one key, so a typo gets a one-line error, not a union dump."""
        if not isinstance(items, list | tuple):
            return items
        return [item if isinstance(item, _ScriptItem) else _parse_item(item) for item in items]


def _parse_item(item: Any) -> _ScriptItem:
    kind = next(iter(item)) if isinstance(item, Mapping) and len(item) == 1 else None
    if kind not in _ITEM_TYPES:
        raise ValueError(f"a script item is one key of {sorted(_ITEM_TYPES)}: got {item!r}")
    return _ITEM_TYPES[kind].model_validate(item)


class EngineScript(BaseModel):
    """``turns: [{match: REGEX?, items: [...]}]``, from YAML/JSON or a dict."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    turns: tuple[ScriptTurn, ...] = ()

    @classmethod
    def load(cls, source: str | Path | Mapping[str, Any]) -> EngineScript:
        """From a mapping, or a YAML/JSON file path."""
        if isinstance(source, Mapping):
            return cls.model_validate(source)
        path = Path(source)
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        return cls.model_validate(data or {})

    def turn_index(self, last_message: str) -> int | None:
        """Index of the first turn whose ``match`` is found in ``last_message`` (re.search)."""
        for index, turn in enumerate(self.turns):
            if turn.match is None or turn.match.search(last_message):
                return index
        return None


def load_script(source: str | Path | Mapping[str, Any] | None) -> EngineScript:
    """The configured script, else the file ``$SERVE_APP_SIM_SCRIPT`` names, else none."""
    if source is None:
        source = os.environ.get(SCRIPT_ENV) or None
    return EngineScript.load(source) if source is not None else EngineScript()
