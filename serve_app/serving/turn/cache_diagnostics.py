"""``prompt_cache_diagnostics`` for a turn: its rendered prompt's fingerprint (what the turn
keeps, in the store with its response or in the WebSocket connection's memory) and, given
``prompt_cache_options.comparison_response_id``, the comparison with that response's
(serve_app/protocol/prompt_cache_diagnostics.py compares; this module gathers).

The comparison is found as ``previous_response_id`` is: among the connection's own responses
first (``store: false`` ones included), then in the store, the caller's only. Another key's
response and an unknown id are ``comparison_response_not_found``, never a 404: the request
runs. A response kept without a fingerprint (stored before diagnostics existed) is
``unavailable``. A turn that compacts server-side compares its compacted prompt again with the
comparison found (`comparison`, then `answer`): its answer is generated from that prompt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from openai.types.responses.response import PromptCacheDiagnostics

from serve_app.protocol import prompt_cache_diagnostics as diagnostics
from serve_app.protocol.prompt_cache_diagnostics import PromptFingerprint, PromptSettings
from serve_app.protocol.requests import CompactionItem, InputItem, ResponsesRequest
from serve_app.protocol.responses import DEFAULT_VERBOSITY
from serve_app.store.base import ResponseStore

# What an absent setting is compared as (OpenAI's defaults), so leaving it out equals sending
# the default.
_DEFAULT_SERVICE_TIER = "auto"


def settings(request: ResponsesRequest, history: Sequence[InputItem], model: str) -> PromptSettings:
    """The request's settings the prompt cache depends on (``history``: the items before its
    input, where a compaction it continues may be; ``model``: the model the deployment serves,
    whichever of its names the request used: an alias shares its cache)."""
    text = request.text
    text_format = text.format if text else None
    return PromptSettings(
        model=model,
        prompt_cache_key=request.prompt_cache_key,
        tools=diagnostics.digest([tool.model_dump(mode="json") for tool in request.tools]),
        text_format=diagnostics.digest(
            text_format.model_dump(mode="json", by_alias=True) if text_format else None
        ),
        reasoning_effort=request.effort,  # as rendered: "minimal" and "low" are one prompt
        verbosity=(text.verbosity if text else None) or DEFAULT_VERBOSITY,
        compaction=_last_compaction([*history, *request.input_items]),
        service_tier=request.service_tier or _DEFAULT_SERVICE_TIER,
    )


def _last_compaction(items: Sequence[InputItem]) -> str | None:
    """A digest of the last compaction item (what the prompt starts over from), if any."""
    for item in reversed(items):
        if isinstance(item, CompactionItem):
            return diagnostics.digest(item.encrypted_content)
    return None


def fingerprint(
    request: ResponsesRequest,
    history: Sequence[InputItem],
    token_ids: Sequence[int],
    model: str,
) -> PromptFingerprint:
    """What the turn keeps of its prompt for later comparisons (``model``: the served one)."""
    return diagnostics.fingerprint(token_ids, settings(request, history, model))


async def comparison(
    store: ResponseStore,
    request: ResponsesRequest,
    owner: str | None,
    recent: Mapping[str, PromptFingerprint] | None = None,
) -> PromptFingerprint | PromptCacheDiagnostics | None:
    """What the request's prompt is compared with: None unless it names a comparison
    response; that response's fingerprint; or, when there is none to compare with, the answer
    already (``comparison_response_not_found``, ``unavailable``)."""
    options = request.prompt_cache_options
    comparison_id = options.comparison_response_id if options else None
    if comparison_id is None:
        return None
    if recent is not None and comparison_id in recent:
        return recent[comparison_id]
    record = await store.prompt_record(comparison_id, owner)
    if record is None:
        return diagnostics.not_found()
    kept = record.fingerprint
    found = PromptFingerprint.from_json(kept) if kept is not None else None
    return found if found is not None else diagnostics.unavailable()


def answer(
    found: PromptFingerprint | PromptCacheDiagnostics | None,
    token_ids: Sequence[int],
    prompt: PromptFingerprint,
) -> PromptCacheDiagnostics | None:
    """The diagnostics of a prompt (``token_ids``, fingerprinted as ``prompt``) given what
    `comparison` found. Called again when a server-side compaction changes the prompt the
    answer is generated from (`ResponsesService.retarget`)."""
    if isinstance(found, PromptFingerprint):
        return diagnostics.diagnose(found, token_ids, prompt.settings, prompt.blocks)
    return found
