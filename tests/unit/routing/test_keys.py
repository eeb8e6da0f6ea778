"""Routing keys: prompt_cache_key when given, else a digest of the prompt's start; each under
its owner when the API has keys, with the owner's cache salt."""

from __future__ import annotations

from serve_app.harmony.render import render_request
from serve_app.protocol.requests import ResponsesRequest
from serve_app.routing.keys import cache_salt, continues_conversation, routing_key
from serve_app.serving.http.auth import ApiKeys


def prompt(*messages: tuple[str, str], instructions: str = "Be brief.") -> list[int]:
    body = {
        "model": "m",
        "instructions": instructions,
        "input": [{"role": role, "content": text} for role, text in messages],
    }
    return render_request(ResponsesRequest.model_validate(body)).token_ids


def test_prompt_cache_key_wins() -> None:
    assert routing_key("conv-1", prompt(("user", "hi")), owner=None) == "conv-1"


def test_later_turns_of_a_keyless_conversation_share_its_key() -> None:
    first = prompt(("user", "fix the bug"))
    later = prompt(("user", "fix the bug"), ("assistant", "done"), ("user", "thanks"))
    assert routing_key(None, first, owner=None) == routing_key(None, later, owner=None)
    assert routing_key(None, first, owner=None).startswith("prefix:")


def test_other_conversations_get_other_keys() -> None:
    key = routing_key(None, prompt(("user", "fix the bug")), owner=None)
    assert key != routing_key(None, prompt(("user", "write docs")), owner=None)
    longer = prompt(("user", "fix the bug"), instructions="Be long.")
    assert key != routing_key(None, longer, owner=None)


def test_a_prompt_with_the_models_earlier_messages_continues_a_conversation() -> None:
    assert not continues_conversation(prompt(("user", "fix the bug")))
    assert not continues_conversation(prompt(("developer", "rules"), ("user", "fix the bug")))
    assert continues_conversation(
        prompt(("user", "fix the bug"), ("assistant", "done"), ("user", "thanks"))
    )
    assert not continues_conversation([])


KEYS = ApiKeys(["key-alice", "key-bob"])
ALICE, BOB = KEYS.owner("Bearer key-alice"), KEYS.owner("Bearer key-bob")


def test_two_owners_with_the_same_key_or_prompt_are_two_conversations() -> None:
    first = prompt(("user", "fix the bug"))
    for cache_key in ("conv-1", None):
        alice = routing_key(cache_key, first, owner=ALICE)
        assert alice != routing_key(cache_key, first, owner=BOB)
        assert alice != routing_key(cache_key, first, owner=None)
        # Each owner's own turns still share one key.
        later = prompt(("user", "fix the bug"), ("assistant", "done"), ("user", "thanks"))
        assert routing_key(cache_key, later, owner=ALICE) == alice
    # A client cannot name its way into another owner's namespace.
    forged = f"owner:{BOB}:conv-1"
    assert routing_key(forged, first, owner=ALICE) != routing_key("conv-1", first, owner=BOB)
    assert routing_key(forged, first, owner=None) == forged  # an open API: one tenant


def test_each_owner_has_its_own_cache_salt_and_an_open_api_none() -> None:
    assert cache_salt(ALICE) != cache_salt(BOB)
    assert cache_salt(None) is None
    for salt in (cache_salt(ALICE), cache_salt(BOB)):
        # What vLLM's own server would accept (vllm/entrypoints/generate/base/protocol.py).
        assert salt and len(salt) <= 128 and not set(salt) & set("@/\\\x00")
