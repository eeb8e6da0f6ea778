"""Routing keys: the conversation a request belongs to, and the tenant's cache salt.

Codex sends ``prompt_cache_key`` (its conversation id). Other clients often send none; their
turns still share the rendered prompt's start (system + developer message + first user
message), so a hash of that prefix keeps a conversation on one replica too.

Both are scoped by the caller's owner (the digest of its API key,
``serving/http/auth.py``): two tenants sending the same ``prompt_cache_key``, or the same
prompt, are two conversations to the router, and each tenant's prompts are cached under its own
`cache_salt`, so no tenant is served (or timed) from blocks another one computed. An open API
(no keys: owner None) has no tenants to tell apart: its keys are the client's own and its
requests unsalted, as before keys existed.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence

from serve_app.harmony.encoding import END_TOKEN, START_TOKEN, get_encoding

# Bound the hashed prefix so a huge first message costs little and long prompts still agree.
MAX_KEY_PREFIX_TOKENS = 8192


def routing_key(
    prompt_cache_key: str | None, prompt_token_ids: Sequence[int], *, owner: str | None
) -> str:
    """The conversation's key: ``prompt_cache_key``, else a digest of the prompt's start;
    under ``owner``'s namespace when the API has keys (the owner digest is hex, without the
    ``:`` that ends it, so no client-chosen key can reach into another owner's namespace)."""
    key = prompt_cache_key or "prefix:" + prefix_digest(prompt_token_ids)
    return key if owner is None else f"owner:{owner}:{key}"


def cache_salt(owner: str | None) -> str | None:
    """The engine's prefix-cache namespace for ``owner``'s requests (vLLM's ``cache_salt``):
    the owner digest itself (32 hex characters, within what vLLM accepts: at most 128, none of
    ``@ / \\`` or NUL). None for an open API: one anonymous tenant, unsalted."""
    return owner


def key_digest(key: str) -> str:
    """What logs name a conversation by: its turns correlate without the client's id recorded."""
    return hashlib.blake2b(key.encode(), digest_size=6).hexdigest()


def prefix_digest(prompt_token_ids: Sequence[int]) -> str:
    end = _end_of_first_user_message(prompt_token_ids)
    prefix = prompt_token_ids[: min(end, MAX_KEY_PREFIX_TOKENS)]
    digest = hashlib.blake2b(digest_size=16)
    digest.update(",".join(map(str, prefix)).encode())
    return digest.hexdigest()


def continues_conversation(prompt_token_ids: Sequence[int]) -> bool:
    """Whether the prompt holds an earlier message of the model's: a later turn of a
    conversation rather than its first. The prompt's own last header (``<|start|>assistant``,
    where the completion begins) does not count."""
    return _message_start(prompt_token_ids[:-1], "assistant") is not None


@functools.cache
def _role_tokens(role: str) -> tuple[int, ...]:
    return tuple(get_encoding().encode(role, allowed_special="all"))


def _message_start(token_ids: Sequence[int], role: str) -> int | None:
    """Index of the first ``<|start|>`` of a message from ``role``, if any."""
    role_tokens = _role_tokens(role)
    for index, token in enumerate(token_ids):
        if token == START_TOKEN and tuple(token_ids[index + 1 : index + 1 + len(role_tokens)]) == (
            role_tokens
        ):
            return index
    return None


def _end_of_first_user_message(token_ids: Sequence[int]) -> int:
    """Index just past the first user message's ``<|end|>`` (or the whole prompt)."""
    start = _message_start(token_ids, "user")
    if start is not None:
        for end in range(start, len(token_ids)):
            if token_ids[end] == END_TOKEN:
                return end + 1
    return len(token_ids)
