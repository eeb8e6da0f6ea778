"""``tool_search``: its items and the search the server runs. No harmony, no Ray.

Tools marked ``defer_loading`` (function and custom tools, namespace members, whole namespaces)
are not shown to the model up front. The model calls the ``tool_search`` tool; the server (its
``execution: "server"``, OpenAI's default) or the client answers with the tools found, as a
``tool_search_output`` item whose ``tools`` are shown to the model from there on. Both items are
input items too, as the openai SDK types them (``ToolSearchCall``,
``ResponseToolSearchOutputItemParam``): a stored chain, a conversation or a stateless resend
keeps the tools found earlier shown.

The search is simple and deterministic: ``paths`` names namespaces or tools to load (the
Agents SDK's built-in client schema); ``query`` ranks deferred tools by how many of its words
their name, description and parameter text hold (name words count most), ties in the order the
request lists them.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field

from serve_app.protocol.request_base import ItemId, Lenient
from serve_app.protocol.request_tools import CustomTool, FunctionTool, NamespaceTool

# What one query search loads at most.
MAX_FOUND = 5
TOOL_SEARCH_NAME = "tool_search"

# The parameters the model sees for a tool_search the server runs, and for a client-run one
# without its own (`paths` only: what the Agents SDK's runner answers).
PATHS_PROPERTY = {
    "type": "array",
    "items": {"type": "string"},
    "description": "Names of namespaces or tools to load, as listed in the description.",
}
SERVER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "paths": PATHS_PROPERTY,
        "query": {"type": "string", "description": "Words describing the tools you need."},
    },
}
CLIENT_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {"paths": PATHS_PROPERTY}}
DEFAULT_DESCRIPTION = (
    "Load tools that are not shown yet: give `paths` (names listed below) or a `query`. "
    "The tools found are shown to you in the result, and you can call them afterwards."
)

LoadedTool = Annotated[FunctionTool | CustomTool | NamespaceTool, Field(discriminator="type")]


class ToolSearchCallItem(Lenient):
    """The model's search: ``arguments`` as it wrote them (a JSON object)."""

    type: Literal["tool_search_call"]
    arguments: Any = None
    call_id: str | None = None
    execution: Literal["server", "client"] = "server"
    id: ItemId | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class ToolSearchOutputItem(Lenient):
    """The tools a search found (function, custom or namespace tools), shown to the model from
    here on."""

    type: Literal["tool_search_output"]
    tools: list[LoadedTool] = Field(default_factory=list)
    call_id: str | None = None
    execution: Literal["server", "client"] = "server"
    id: ItemId | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


@dataclass(frozen=True, eq=False)
class _Candidate:
    """A deferred tool: top-level (``namespace`` None) or a namespace's member."""

    tool: FunctionTool | CustomTool
    namespace: NamespaceTool | None


def deferred_tools(tools: Sequence[object]) -> list[_Candidate]:
    """The request's deferred tools, in its order."""
    found: list[_Candidate] = []
    for tool in tools:
        if isinstance(tool, FunctionTool | CustomTool) and tool.defer_loading:
            found.append(_Candidate(tool, None))
        elif isinstance(tool, NamespaceTool):
            found += [_Candidate(inner, tool) for inner in tool.tools if tool.deferred(inner)]
    return found


def searchable_lines(tools: Sequence[object]) -> list[str]:
    """What the model sees of the deferred tools before searching (as OpenAI shows them: a
    namespace's name and description, a top-level tool's name and description; never their
    parameters)."""
    lines: list[str] = []
    namespaces_seen: set[str] = set()
    for candidate in deferred_tools(tools):
        namespace = candidate.namespace
        if namespace is None:
            lines.append(_line(candidate.tool.name, candidate.tool.description))
        elif namespace.name not in namespaces_seen:
            namespaces_seen.add(namespace.name)
            lines.append(_line(namespace.name, namespace.description, "namespace"))
    return lines


def _line(name: str, description: str | None, kind: str = "") -> str:
    text = f"- {name}" + (f" ({kind})" if kind else "")
    first = (description or "").strip().splitlines()
    return f"{text}: {first[0]}" if first else text


def search(tools: Sequence[object], arguments: str) -> list[dict[str, Any]]:
    """The tools a search with ``arguments`` (the model's JSON text) finds among ``tools``'
    deferred ones, as ``tool_search_output.tools`` holds them: top-level tools as sent, members
    under their namespace (one entry per namespace, members in the request's order)."""
    wanted = _arguments(arguments)
    candidates = deferred_tools(tools)
    chosen = {id(candidate) for candidate in _by_paths(candidates, wanted.get("paths"))}
    query = wanted.get("query")
    if isinstance(query, str) and query.strip():
        chosen |= {id(candidate) for candidate in _ranked(candidates, query)}
    return _grouped([candidate for candidate in candidates if id(candidate) in chosen])


def _arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError:
        # Not JSON: read it as a query, the search still answers.
        return {"query": text}
    return value if isinstance(value, dict) else {}


def _by_paths(candidates: list[_Candidate], paths: object) -> list[_Candidate]:
    if not isinstance(paths, list):
        return []
    names = {path.strip() for path in paths if isinstance(path, str)}
    return [
        candidate
        for candidate in candidates
        if candidate.tool.name in names
        or (
            candidate.namespace is not None
            and (
                candidate.namespace.name in names
                or f"{candidate.namespace.name}.{candidate.tool.name}" in names
            )
        )
    ]


_WORD = re.compile(r"[a-z0-9]+")


_CAMEL = re.compile(r"([a-z])([A-Z])")


@functools.lru_cache(maxsize=8192)
def _words(text: str) -> frozenset[str]:
    """The words of ``text``, cached: clients send the same tools turn after turn."""
    # `get_weather` and `getWeather` both read as "get weather".
    return frozenset(_WORD.findall(_CAMEL.sub(r"\1 \2", text).lower()))


def _ranked(candidates: list[_Candidate], query: str) -> list[_Candidate]:
    terms = _words(query)
    scored = []
    for order, candidate in enumerate(candidates):
        tool, namespace = candidate.tool, candidate.namespace
        name = _words(tool.name) | (_words(namespace.name) if namespace else set())
        about = _words(tool.description or "") | (
            _words(namespace.description or "") if namespace else set()
        )
        parameters = _words(json.dumps(getattr(tool, "parameters", None) or {}))
        score = sum(3 * (t in name) + 2 * (t in about) + (t in parameters) for t in terms)
        if score:
            scored.append((-score, order, candidate))
    return [candidate for *_, candidate in sorted(scored, key=lambda s: s[:2])][:MAX_FOUND]


def _grouped(chosen: list[_Candidate]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    members: dict[str, list[dict[str, Any]]] = {}
    for candidate in chosen:
        entry = candidate.tool.model_dump(exclude_none=True, by_alias=True)
        namespace = candidate.namespace
        if namespace is None:
            found.append(entry)
            continue
        if namespace.name not in members:
            members[namespace.name] = []
            found.append(
                {
                    "type": "namespace",
                    "name": namespace.name,
                    "description": namespace.description or "",
                    "tools": members[namespace.name],
                }
            )
        members[namespace.name].append(entry)
    return found
