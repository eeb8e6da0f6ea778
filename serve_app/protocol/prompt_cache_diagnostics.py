"""Prompt-cache diagnostics, the pure comparison: what a response keeps of its rendered prompt
(`PromptFingerprint`: digests of its token-id blocks and the settings the cache depends on) and
how a request's prompt is compared with a comparison response's (`diagnose`), answering as the
openai SDK types ``prompt_cache_diagnostics`` (``openai.types.responses.response``). No harmony,
no Ray: the serving layer renders and looks up (serve_app/serving/turn/cache_diagnostics.py).

The fingerprint never holds prompt text: 6-byte BLAKE2b digests of each block of
`BLOCK_TOKENS` token ids (a quarter of a byte per prompt token as stored), the prompt's length
and digests of the settings. A divergence is found to the block: the reusable prefix is the blocks
both prompts share, and the comparison's last, partial block counts when the request's prompt
holds the same tokens there (a request that continues the comparison's prompt is a hit).
"""

from __future__ import annotations

import base64
import hashlib
import json
from array import array
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from openai.types.responses.response import (
    PromptCacheDiagnostics,
    PromptCacheDiagnosticsCacheHit,
    PromptCacheDiagnosticsCacheMiss,
    PromptCacheDiagnosticsComparisonResponseNotFound,
    PromptCacheDiagnosticsUnavailable,
)

# Tokens per digested block: two of vLLM's default KV blocks (16 tokens), so a divergence is
# located within 32 tokens. 6-byte digests: a false match (2**-48 a block) would only place a
# divergence later. With base64, a quarter of a byte per prompt token is kept
# (docs/protocol.md has the measurements: loadtests/bench_cache_diagnostics.py).
BLOCK_TOKENS = 32
DIGEST_BYTES = 6
FORMAT_VERSION = 1

Reason = Literal[
    "model_changed",
    "prompt_cache_key_changed",
    "tools_changed",
    "text_format_changed",
    "reasoning_effort_changed",
    "verbosity_changed",
    "context_compacted",
    "input_changed",
    "service_tier_changed",
]

# OpenAI's order: the first reason in it that explains a divergence is the one answered.
# Each names the `PromptSettings` field it is decided by (input: by the tokens alone).
_SETTING_REASONS: tuple[tuple[Reason, str], ...] = (
    ("model_changed", "model"),
    ("prompt_cache_key_changed", "prompt_cache_key"),
    ("tools_changed", "tools"),
    ("text_format_changed", "text_format"),
    ("reasoning_effort_changed", "reasoning_effort"),
    ("verbosity_changed", "verbosity"),
    ("context_compacted", "compaction"),
)
# Settings the cache is keyed by rather than rendered into the prompt: a change leaves
# nothing reusable, whatever the tokens. The model's weights make its KV; the
# prompt_cache_key places the conversation on its home replica (serve_app/routing/);
# verbosity and the service tier are not in gpt-oss's prompt here, and are counted as OpenAI
# keys its cache by them (docs/protocol.md says so).
_KEYED_BY = frozenset(
    {"model_changed", "prompt_cache_key_changed", "verbosity_changed", "service_tier_changed"}
)


@dataclass(frozen=True)
class PromptSettings:
    """What a request's prompt cache depends on besides its tokens; digests where the value
    is large (tools, text format) or the client's (a compaction's sealed blob)."""

    model: str
    prompt_cache_key: str | None
    tools: str
    text_format: str
    reasoning_effort: str
    verbosity: str
    compaction: str | None
    service_tier: str


@dataclass(frozen=True)
class PromptFingerprint:
    """What diagnostics keep of one response's rendered prompt."""

    settings: PromptSettings
    token_count: int
    # The digests of the prompt's blocks of BLOCK_TOKENS, in order (the last may be partial).
    blocks: bytes

    def to_json(self) -> str:
        return json.dumps(
            {
                "v": FORMAT_VERSION,
                "block": BLOCK_TOKENS,
                "tokens": self.token_count,
                "blocks": base64.b64encode(self.blocks).decode("ascii"),
                "settings": asdict(self.settings),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> PromptFingerprint | None:
        """None for a record this version cannot compare (another format or block size)."""
        try:
            data = json.loads(text)
            if data.get("v") != FORMAT_VERSION or data.get("block") != BLOCK_TOKENS:
                return None
            return cls(
                settings=PromptSettings(**data["settings"]),
                token_count=int(data["tokens"]),
                blocks=base64.b64decode(data["blocks"]),
            )
        except (ValueError, TypeError, KeyError):
            return None


def digest(value: Any) -> str:
    """A short stable digest of a JSON-able value (a setting too large to keep as is)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=DIGEST_BYTES).hexdigest()


def _block_digest(data: memoryview) -> bytes:
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()


def _token_bytes(token_ids: Sequence[int]) -> memoryview:
    return memoryview(array("I", token_ids).tobytes())


def block_digests(token_ids: Sequence[int]) -> bytes:
    """The digests of ``token_ids``'s blocks of BLOCK_TOKENS, concatenated."""
    data, width = _token_bytes(token_ids), 4 * BLOCK_TOKENS
    return b"".join(_block_digest(data[at : at + width]) for at in range(0, len(data), width))


def fingerprint(token_ids: Sequence[int], settings: PromptSettings) -> PromptFingerprint:
    return PromptFingerprint(settings, len(token_ids), block_digests(token_ids))


def common_prefix(
    comparison: PromptFingerprint, token_ids: Sequence[int], blocks: bytes | None = None
) -> int:
    """The tokens at the start of ``token_ids`` that the comparison's prompt shares, to the
    block (its last block, partial or not, only when the request holds all of it).
    ``blocks``: ``token_ids``'s own `block_digests` when the caller has them (a request's
    fingerprint): its whole blocks are then compared digest to digest, and only the
    comparison's last partial block, if any, is hashed again."""
    if blocks is None:
        blocks = block_digests(token_ids)
    whole = comparison.token_count // BLOCK_TOKENS
    shared = _shared_digests(comparison.blocks, blocks, min(whole, len(token_ids) // BLOCK_TOKENS))
    tail = comparison.token_count
    if shared < whole or tail == whole * BLOCK_TOKENS or tail > len(token_ids):
        return shared * BLOCK_TOKENS
    # The comparison's last block is partial: the request's block there is longer (or as
    # long), so its digest is of other tokens; the same tokens are hashed to compare.
    start, stored = whole * BLOCK_TOKENS, comparison.blocks[whole * DIGEST_BYTES :]
    same = _block_digest(_token_bytes(token_ids[start:tail])) == stored
    return tail if same else start


def _shared_digests(first: bytes, second: bytes, limit: int) -> int:
    """How many digests, of the first ``limit``, the two concatenations share from the start:
    a binary search on prefixes, each compared at C speed."""
    if first[: limit * DIGEST_BYTES] == second[: limit * DIGEST_BYTES]:
        return limit
    low, high = 0, limit - 1  # low shared, high+1 not
    while low < high:
        middle = (low + high + 1) // 2
        if first[: middle * DIGEST_BYTES] == second[: middle * DIGEST_BYTES]:
            low = middle
        else:
            high = middle - 1
    return low


def comparable_tokens(comparison: PromptFingerprint, request_tokens: int) -> int:
    """The tokens a divergence is looked for in: all of the comparison's prompt when the
    request holds as many; else the request's whole blocks (the comparison keeps a digest per
    block, so a request ending inside one of its blocks is compared up to that block)."""
    if request_tokens >= comparison.token_count:
        return comparison.token_count
    return request_tokens // BLOCK_TOKENS * BLOCK_TOKENS


def diagnose(
    comparison: PromptFingerprint,
    token_ids: Sequence[int],
    settings: PromptSettings,
    blocks: bytes | None = None,
) -> PromptCacheDiagnostics:
    """The request's prompt (``token_ids``, ``settings``) against the comparison response's:
    a hit when it holds all of the comparison's prompt (or the comparison holds all of it, to
    the block: `comparable_tokens`) with nothing the cache is keyed by changed, else a miss
    with the first reason in OpenAI's order that explains it. Counts: the request's tokens
    after the divergence, and the comparison's tokens before it. ``blocks``: as for
    `common_prefix`."""
    shared = common_prefix(comparison, token_ids, blocks)
    diverged = shared < comparable_tokens(comparison, len(token_ids))
    before = comparison.settings
    for reason, field in _SETTING_REASONS:
        if getattr(before, field) != getattr(settings, field) and (diverged or reason in _KEYED_BY):
            return _miss(reason, token_ids, 0 if reason in _KEYED_BY else shared)
    if diverged:
        return _miss("input_changed", token_ids, shared)
    if before.service_tier != settings.service_tier:
        return _miss("service_tier_changed", token_ids, 0)
    return PromptCacheDiagnosticsCacheHit(type="cache_hit")


def _miss(
    reason: Reason, token_ids: Sequence[int], reusable: int
) -> PromptCacheDiagnosticsCacheMiss:
    return PromptCacheDiagnosticsCacheMiss(
        type="cache_miss",
        reason=reason,
        cache_missed_tokens=len(token_ids) - reusable,
        comparison_reusable_tokens=reusable,
    )


def not_found() -> PromptCacheDiagnostics:
    return PromptCacheDiagnosticsComparisonResponseNotFound(type="comparison_response_not_found")


def unavailable() -> PromptCacheDiagnostics:
    return PromptCacheDiagnosticsUnavailable(type="unavailable")
