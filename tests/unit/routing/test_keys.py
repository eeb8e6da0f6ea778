"""Routing keys: prompt_cache_key when given, else a digest of the prompt's start."""

from __future__ import annotations

from serve_app.harmony.render import render_request
from serve_app.protocol.requests import ResponsesRequest
from serve_app.routing.keys import continues_conversation, routing_key


def prompt(*messages: tuple[str, str], instructions: str = "Be brief.") -> list[int]:
    body = {
        "model": "m",
        "instructions": instructions,
        "input": [{"role": role, "content": text} for role, text in messages],
    }
    return render_request(ResponsesRequest.model_validate(body)).token_ids


def test_prompt_cache_key_wins() -> None:
    assert routing_key("conv-1", prompt(("user", "hi"))) == "conv-1"


def test_later_turns_of_a_keyless_conversation_share_its_key() -> None:
    first = prompt(("user", "fix the bug"))
    later = prompt(("user", "fix the bug"), ("assistant", "done"), ("user", "thanks"))
    assert routing_key(None, first) == routing_key(None, later)
    assert routing_key(None, first).startswith("prefix:")


def test_other_conversations_get_other_keys() -> None:
    key = routing_key(None, prompt(("user", "fix the bug")))
    assert key != routing_key(None, prompt(("user", "write docs")))
    assert key != routing_key(None, prompt(("user", "fix the bug"), instructions="Be long."))


def test_a_prompt_with_the_models_earlier_messages_continues_a_conversation() -> None:
    assert not continues_conversation(prompt(("user", "fix the bug")))
    assert not continues_conversation(prompt(("developer", "rules"), ("user", "fix the bug")))
    assert continues_conversation(
        prompt(("user", "fix the bug"), ("assistant", "done"), ("user", "thanks"))
    )
    assert not continues_conversation([])
