"""What a completion must obey, engine-neutral: the data an engine needs (``build`` makes it
from a request, in the ingress; this module knows nothing of the Responses API).

Harmony's structure decides where a constraint applies. The analysis channel (and, where tools
are offered, commentary preambles) stays free; the message that ends the completion is
constrained: a ``final`` message (``<|return|>``) whose body may have to be JSON matching the
``text.format`` schema, or one tool call (``<|call|>``, a stop token: one call per completion)
whose body may have to match the tool's parameters or grammar. ``tool_choice`` decides which of
those endings are allowed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

BodyKind = Literal["text", "json", "lark", "regex"]


@dataclass(frozen=True)
class Body:
    """A message body: free text, JSON matching a schema, or text matching a grammar."""

    kind: BodyKind = "text"
    # The JSON schema as compact JSON text (hashable, one cache key per distinct schema), or
    # the lark / regex grammar text. Keys keep the client's order: llguidance writes an
    # object's properties in the order the schema lists them (as OpenAI's strict mode does),
    # so sorting them would force alphabetical keys on the model.
    source: str = ""

    @classmethod
    def json_schema(cls, schema: dict[str, Any]) -> Body:
        return cls("json", json.dumps(schema, separators=(",", ":")))

    @property
    def free(self) -> bool:
        return self.kind == "text"


FREE = Body()


@dataclass(frozen=True)
class ToolCallRule:
    """One tool the completion may end by calling."""

    recipient: str  # functions.NAME, or NAMESPACE.NAME for a namespace tool
    kind: Literal["function", "custom"]
    body: Body = FREE


@dataclass(frozen=True)
class CompletionConstraint:
    """The endings a completion may have; everything before them is free harmony messages."""

    # The final answer's body; None when the completion must end in a tool call.
    final: Body | None
    tool_calls: tuple[ToolCallRule, ...] = ()

    @property
    def preambles(self) -> bool:
        """Commentary without a recipient (a preamble to tool calls) only where tools are."""
        return bool(self.tool_calls)
