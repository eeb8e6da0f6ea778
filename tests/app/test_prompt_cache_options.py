"""``prompt_cache_options`` and ``prompt_cache_breakpoint`` through the openai SDK (issue 40):
a prewarm over HTTP, SSE and WebSocket fills the cache the next turn finds (for its tenant
only), ``mode: explicit`` without a breakpoint caches nothing, with one it caches, every bad
value is a 400 naming its param, and the Response echoes the options, stored alike."""

from __future__ import annotations

import uuid

import openai
import pytest
from openai import OpenAI

from tests.support import MODEL, OTHER_API_KEY
from tests.support.websocket import until_terminal

# The simulated engine caches whole blocks of 16 tokens: a prompt's last partial block is not
# reused, and every prompt of a tenant shares its first blocks (the system message).
BLOCK = 16


def long_input(tag: str) -> str:
    """A prompt of about 800 tokens no other test sends (a scripted turn: SDK-TEXT)."""
    return f"SDK-TEXT {tag} " + uuid.uuid4().hex * 40


def cached(response) -> int:
    return response.usage.input_tokens_details.cached_tokens


# Over HTTP, each request may reach either ingress replica: the turn after a prewarm must find
# the replica warmed through the other one's router too. Enough rounds that both orders happen.
PREWARM_ROUNDS = 6


def test_a_prewarm_over_http_answers_nothing_and_warms_the_next_turn(client: OpenAI) -> None:
    for round_ in range(PREWARM_ROUNDS):
        text, key = long_input(f"http prewarm {round_}"), str(uuid.uuid4())
        prewarm = client.beta.responses.create(
            model=MODEL, input=text, prompt_cache_key=key, prompt_cache_options={"prewarm": True}
        )
        assert prewarm.status == "completed" and prewarm.output == []
        assert (prewarm.usage.input_tokens, prewarm.usage.output_tokens) == (0, 0)
        turn = client.responses.create(model=MODEL, input=text, prompt_cache_key=key)
        assert cached(turn) >= turn.usage.input_tokens - BLOCK, (round_, turn.usage)
    # Another tenant sending the same prompt finds none of it: the prewarm was A's alone.
    other = OpenAI(base_url=str(client.base_url), api_key=OTHER_API_KEY, max_retries=0)
    theirs = other.responses.create(model=MODEL, input=text, prompt_cache_key=key)
    assert cached(theirs) < theirs.usage.input_tokens // 2, theirs.usage


def test_a_prewarm_over_sse_is_two_events_and_warms_the_next_turn(client: OpenAI) -> None:
    for round_ in range(PREWARM_ROUNDS):
        text, key = long_input(f"sse prewarm {round_}"), str(uuid.uuid4())
        stream = client.beta.responses.create(
            model=MODEL,
            input=text,
            prompt_cache_key=key,
            stream=True,
            prompt_cache_options={"prewarm": True, "ttl": "12h"},
        )
        events = list(stream)
        assert [event.type for event in events] == ["response.created", "response.completed"]
        assert events[-1].response.prompt_cache_options.ttl == "12h"
        turn = client.responses.create(model=MODEL, input=text, prompt_cache_key=key)
        assert cached(turn) >= turn.usage.input_tokens - BLOCK, (round_, turn.usage)


def test_a_prewarm_over_the_websocket_warms_the_next_turn(client: OpenAI) -> None:
    text, key = long_input("ws prewarm"), str(uuid.uuid4())
    with client.responses.connect() as connection:
        connection.response.create(
            model=MODEL,
            input=text,
            prompt_cache_key=key,
            store=False,
            prompt_cache_options={"prewarm": True},
        )
        events = until_terminal(connection)
        assert [event.type for event in events] == ["response.created", "response.completed"]
        connection.response.create(model=MODEL, input=text, prompt_cache_key=key, store=False)
        turn = until_terminal(connection)[-1].response
    assert cached(turn) >= turn.usage.input_tokens - BLOCK, turn.usage


def test_explicit_without_a_breakpoint_caches_nothing(client: OpenAI) -> None:
    text, key = long_input("explicit none"), str(uuid.uuid4())
    options = {"mode": "explicit"}
    for _ in range(2):  # the second finds nothing the first left
        turn = client.beta.responses.create(
            model=MODEL, input=text, prompt_cache_key=key, prompt_cache_options=options
        )
        assert cached(turn) == 0, turn.usage
        assert turn.prompt_cache_options.mode == "explicit"
    # Nor does a request that caches: at most the start every prompt of the tenant shares.
    implicit = client.responses.create(model=MODEL, input=text, prompt_cache_key=key)
    assert cached(implicit) < implicit.usage.input_tokens // 2, implicit.usage


def test_explicit_with_a_breakpoint_caches_up_to_it(client: OpenAI) -> None:
    """Over one WebSocket, so both requests go through the router that placed the first: two
    first turns of one key sent back to back over HTTP may reach different ingress replicas
    before the engine replicas' reports name the first's placement (docs/routing.md)."""
    key = str(uuid.uuid4())
    marked = [
        {
            "role": "user",
            "content": [
                {
                    "type": "input_text",
                    "text": long_input("explicit marked"),
                    "prompt_cache_breakpoint": {"mode": "explicit"},
                },
                {"type": "input_text", "text": " and a question"},
            ],
        }
    ]
    options = {"mode": "explicit"}
    with client.responses.connect() as connection:
        turns = []
        for _ in range(2):
            connection.response.create(
                model=MODEL,
                input=marked,
                prompt_cache_key=key,
                store=False,
                prompt_cache_options=options,
            )
            turns.append(until_terminal(connection)[-1].response)
    first, second = turns
    assert second.status == "completed", second
    assert cached(second) >= first.usage.input_tokens - BLOCK, second.usage


def test_the_options_are_echoed_and_stored_alike(client: OpenAI) -> None:
    created = client.beta.responses.create(
        model=MODEL,
        input="SDK-TEXT echo",
        prompt_cache_options={"mode": "implicit", "ttl": "12h"},
        prompt_cache_retention="24h",
    )
    echoed = created.prompt_cache_options
    assert (echoed.mode, echoed.ttl, echoed.comparison_response_id) == ("implicit", "12h", None)
    assert created.prompt_cache_retention == "24h"  # independent of the ttl (the SDK's doc)
    stored = client.responses.retrieve(created.id)
    assert stored.prompt_cache_options.model_dump() == echoed.model_dump()
    # A background response carries them from its first form on, and stored.
    background = client.responses.create(
        model=MODEL,
        input="SDK-TEXT echo",
        background=True,
        prompt_cache_options={"mode": "explicit", "ttl": "12h"},
    )
    assert background.prompt_cache_options.mode == "explicit"
    again = client.responses.retrieve(background.id)
    assert (again.prompt_cache_options.mode, again.prompt_cache_options.ttl) == ("explicit", "12h")
    default = client.responses.create(model=MODEL, input="SDK-TEXT default")
    assert (default.prompt_cache_options.mode, default.prompt_cache_options.ttl) == (
        "implicit",
        "30m",
    )


def test_input_tokens_and_compact_take_the_fields(client: OpenAI) -> None:
    marked = [
        {
            "role": "user",
            "content": [
                {
                    "type": "input_text",
                    "text": "hi",
                    "prompt_cache_breakpoint": {"mode": "explicit"},
                }
            ],
        }
    ]
    options = {"prompt_cache_options": {"mode": "explicit", "ttl": "12h"}}
    plain = client.responses.input_tokens.count(model=MODEL, input="hi").input_tokens
    count = client.responses.input_tokens.count(model=MODEL, input=marked, extra_body=options)
    assert count.input_tokens == plain
    compacted = client.responses.compact(model=MODEL, input=marked, extra_body=options)
    assert compacted.output
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.compact(
            model=MODEL, input="hi", extra_body={"prompt_cache_options": {"ttl": "1d"}}
        )
    assert caught.value.body["param"] == "prompt_cache_options.ttl"  # type: ignore[index]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt_cache_options": {"mode": "always"}}, "prompt_cache_options.mode"),
        ({"prompt_cache_options": {"ttl": "24h"}}, "prompt_cache_options.ttl"),
        ({"prompt_cache_options": {"prewarm": 1}}, "prompt_cache_options.prewarm"),
        ({"prompt_cache_options": {"prewarm": True}, "background": True}, "background"),
        (
            {"prompt_cache_options": {"prewarm": True}, "conversation": "conv_unknown"},
            "conversation",
        ),
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "a"},
                            {"type": "input_text", "text": "b", "prompt_cache_breakpoint": "x"},
                        ],
                    }
                ]
            },
            "input[0].content[1].prompt_cache_breakpoint",
        ),
        (
            {
                "input": [
                    {
                        "role": "assistant",
                        "content": [
                            {
                                "type": "output_text",
                                "text": "a",
                                "prompt_cache_breakpoint": {"mode": "explicit"},
                            }
                        ],
                    }
                ]
            },
            "input[0].content[0].prompt_cache_breakpoint",
        ),
    ],
)
def test_each_bad_value_is_a_400_naming_its_param(client: OpenAI, fields: dict, param: str) -> None:
    body = {"input": "SDK-TEXT bad", **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input=body.pop("input"), extra_body=body)
    assert caught.value.body["param"] == param, caught.value.body  # type: ignore[index]
