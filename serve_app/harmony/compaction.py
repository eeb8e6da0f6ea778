"""Compaction: a model-written summary that stands in for a long history.

``POST /v1/responses/compact`` asks the model for the summary (the request below), seals it
with the server's key and returns it as a ``compaction`` item. When a client sends that item
back in a later ``input``, it renders as one user message holding the summary, in place of
everything it replaced.

Server-side compaction (``context_management``, serve_app/serving/turn/context_management.py)
seals its summary marked as standing in for *everything* before it: rendering drops the items
before the last such item (`context_start`), as OpenAI lets a client drop them itself. A
``/compact`` summary is not marked: the user messages kept before it stay.
"""

from __future__ import annotations

from collections.abc import Sequence

from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.protocol.requests import CompactionItem, InputItem

# Bound to the sealed blob, so only a compaction summary opens as one.
PURPOSE = b"compaction"

SUMMARY_REQUEST = (
    "Context compaction: the conversation above is about to be replaced by your summary. "
    "Write a summary that lets you continue the work without it: the user's goals and "
    "constraints, what was done (files, commands, tool results that matter), decisions and "
    "their reasons, what is still open, and the next step. Plain text, no preamble."
)

SUMMARY_PREFIX = "Summary of the earlier conversation (it was compacted):\n\n"


# Leads the sealed text of a server-side compaction's summary (never shown: `open_summary`
# strips it). Only this server seals, so only its own summaries carry it.
_REPLACES_ALL = "\x00serve_app:context-compaction\x00"


def seal_summary(
    vault: ReasoningVault, summary: str, owner: str | None = None, *, replaces_all: bool = False
) -> str:
    """``owner``: the API key's digest the summary is for (None when the API is open).
    ``replaces_all``: a server-side compaction's, standing in for every item before it."""
    return vault.seal((_REPLACES_ALL if replaces_all else "") + summary, PURPOSE, owner=owner)


def open_summary(vault: ReasoningVault | None, blob: str, owner: str | None = None) -> str | None:
    """The summary a compaction item holds; None if this server did not seal it for ``owner``
    (serve_app.serving.admission.responses turns that into a 400)."""
    text = _open(vault, blob, owner)
    return text.removeprefix(_REPLACES_ALL) if text is not None else None


def context_start(
    items: Sequence[InputItem], vault: ReasoningVault | None, owner: str | None
) -> int:
    """Where the context a prompt renders starts: the last server-side compaction item (it
    stands in for everything before it), else 0. Only compaction items are opened."""
    for index in range(len(items) - 1, -1, -1):
        item = items[index]
        if isinstance(item, CompactionItem):
            text = _open(vault, item.encrypted_content, owner)
            if text is not None and text.startswith(_REPLACES_ALL):
                return index
    return 0


def _open(vault: ReasoningVault | None, blob: str, owner: str | None) -> str | None:
    return vault.open(blob, PURPOSE, owner=owner) if vault is not None else None
