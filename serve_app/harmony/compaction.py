"""Compaction: a model-written summary that stands in for a long history.

``POST /v1/responses/compact`` asks the model for the summary (the request below), seals it
with the server's key and returns it as a ``compaction`` item. When a client sends that item
back in a later ``input``, it renders as one user message holding the summary, in place of
everything it replaced.
"""

from __future__ import annotations

from serve_app.harmony.reasoning_vault import ReasoningVault

# Bound to the sealed blob, so only a compaction summary opens as one.
PURPOSE = b"compaction"

SUMMARY_REQUEST = (
    "Context compaction: the conversation above is about to be replaced by your summary. "
    "Write a summary that lets you continue the work without it: the user's goals and "
    "constraints, what was done (files, commands, tool results that matter), decisions and "
    "their reasons, what is still open, and the next step. Plain text, no preamble."
)

SUMMARY_PREFIX = "Summary of the earlier conversation (it was compacted):\n\n"


def seal_summary(vault: ReasoningVault, summary: str, owner: str | None = None) -> str:
    """``owner``: the API key's digest the summary is for (None when the API is open)."""
    return vault.seal(summary, PURPOSE, owner=owner)


def open_summary(vault: ReasoningVault | None, blob: str, owner: str | None = None) -> str | None:
    """The summary a compaction item holds; None if this server did not seal it for ``owner``
    (serve_app.serving.admission.responses turns that into a 400)."""
    return vault.open(blob, PURPOSE, owner=owner) if vault is not None else None
