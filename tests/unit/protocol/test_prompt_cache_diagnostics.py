"""The pure comparison of prompt-cache diagnostics: where two prompts diverge (to the block),
which reason explains it (OpenAI's order), the counts, and the fingerprint's round trip."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types.responses.response import (
    PromptCacheDiagnosticsCacheHit,
    PromptCacheDiagnosticsCacheMiss,
)

from serve_app.protocol.prompt_cache_diagnostics import (
    BLOCK_TOKENS,
    PromptFingerprint,
    PromptSettings,
    block_digests,
    common_prefix,
    diagnose,
    fingerprint,
)

SETTINGS = PromptSettings(
    model="gpt-oss-120b",
    prompt_cache_key="k",
    tools="t0",
    text_format="f0",
    reasoning_effort="medium",
    verbosity="medium",
    compaction=None,
    service_tier="auto",
)
PROMPT = list(range(1000, 1100))  # 100 tokens: 3 full blocks and a partial one


def test_the_same_prompt_and_a_continuation_are_hits() -> None:
    kept = fingerprint(PROMPT, SETTINGS)
    assert isinstance(diagnose(kept, PROMPT, SETTINGS), PromptCacheDiagnosticsCacheHit)
    # The comparison's last, partial block is reused by a prompt that continues it.
    assert isinstance(diagnose(kept, [*PROMPT, 7, 8, 9], SETTINGS), PromptCacheDiagnosticsCacheHit)
    # A prompt the comparison holds all of is reused whole too.
    assert isinstance(diagnose(kept, PROMPT[:40], SETTINGS), PromptCacheDiagnosticsCacheHit)


@pytest.mark.parametrize("at", [0, 31, 32, 33, 50, 95, 96, 99])
def test_a_changed_token_is_input_changed_counted_to_its_block(at: int) -> None:
    kept = fingerprint(PROMPT, SETTINGS)
    changed = list(PROMPT)
    changed[at] = 1
    miss = diagnose(kept, [*changed, 5], SETTINGS)
    assert isinstance(miss, PromptCacheDiagnosticsCacheMiss)
    assert miss.reason == "input_changed"
    reusable = at // BLOCK_TOKENS * BLOCK_TOKENS
    assert miss.comparison_reusable_tokens == reusable
    assert miss.cache_missed_tokens == len(PROMPT) + 1 - reusable


# Each reason by the one setting changed, with the prompt changed where it renders (a keyed
# setting need not change the tokens: it is its reason all the same, and nothing is reusable).
@pytest.mark.parametrize(
    ("field", "reason", "keyed"),
    [
        ("model", "model_changed", True),
        ("prompt_cache_key", "prompt_cache_key_changed", True),
        ("tools", "tools_changed", False),
        ("text_format", "text_format_changed", False),
        ("reasoning_effort", "reasoning_effort_changed", False),
        ("verbosity", "verbosity_changed", True),
        ("compaction", "context_compacted", False),
        ("service_tier", "service_tier_changed", True),
    ],
)
def test_each_setting_is_its_reason(field: str, reason: str, keyed: bool) -> None:
    kept = fingerprint(PROMPT, SETTINGS)
    settings = dataclasses.replace(SETTINGS, **{field: "changed"})
    diverging = [*PROMPT[:32], 0, *PROMPT[33:]]
    miss = diagnose(kept, diverging, settings)
    assert isinstance(miss, PromptCacheDiagnosticsCacheMiss)
    # The service tier is last in OpenAI's order: after input_changed.
    last = field == "service_tier"
    assert miss.reason == ("input_changed" if last else reason)
    assert miss.comparison_reusable_tokens == (0 if keyed and not last else 32)
    # Unchanged tokens: a rendered setting explains nothing (the prompt is the same), a keyed
    # one is still the miss.
    same = diagnose(kept, PROMPT, settings)
    if keyed:
        assert isinstance(same, PromptCacheDiagnosticsCacheMiss) and same.reason == reason
    else:
        assert isinstance(same, PromptCacheDiagnosticsCacheHit)


def test_the_first_reason_in_openais_order_wins() -> None:
    kept = fingerprint(PROMPT, SETTINGS)
    settings = dataclasses.replace(
        SETTINGS, tools="t1", reasoning_effort="high", compaction="c", service_tier="flex"
    )
    miss = diagnose(kept, [0, *PROMPT], settings)
    assert isinstance(miss, PromptCacheDiagnosticsCacheMiss) and miss.reason == "tools_changed"
    # input_changed comes before service_tier_changed.
    settings = dataclasses.replace(SETTINGS, service_tier="flex")
    miss = diagnose(kept, [0, *PROMPT], settings)
    assert isinstance(miss, PromptCacheDiagnosticsCacheMiss) and miss.reason == "input_changed"


def test_the_fingerprint_round_trips_and_holds_no_token_ids() -> None:
    kept = fingerprint(PROMPT, SETTINGS)
    text = kept.to_json()
    assert PromptFingerprint.from_json(text) == kept
    assert "1000" not in text  # digests, not the ids
    # A quarter of a byte per token (6-byte digests of 32 tokens, base64), plus settings.
    long = fingerprint(list(range(32_000)), SETTINGS).to_json()
    assert len(long) <= 32_000 // 4 + 400
    assert PromptFingerprint.from_json("{}") is None
    assert PromptFingerprint.from_json("not json") is None
    assert PromptFingerprint.from_json(text.replace('"v":1', '"v":2')) is None


@given(
    st.lists(st.integers(0, 200_000), min_size=1, max_size=300),
    st.lists(st.integers(0, 200_000), max_size=300),
    st.data(),
)
def test_the_common_prefix_is_the_true_one_rounded_to_the_block(
    prompt: list[int], other: list[int], data: st.DataObject
) -> None:
    # The second prompt shares a random part of the first's start.
    shared = data.draw(st.integers(0, len(prompt)))
    second = [*prompt[:shared], *other]
    true = 0
    while true < min(len(prompt), len(second)) and prompt[true] == second[true]:
        true += 1
    found = common_prefix(fingerprint(prompt, SETTINGS), second)
    # The same given the request's own digests (its fingerprint's, as serving passes them).
    assert common_prefix(fingerprint(prompt, SETTINGS), second, block_digests(second)) == found
    if true >= len(prompt):
        assert found == len(prompt)
    else:
        assert found == true // BLOCK_TOKENS * BLOCK_TOKENS


def test_random_prompts_agree_with_a_token_by_token_comparison() -> None:
    rng = random.Random(7)
    for _ in range(200):
        prompt = [rng.randrange(50) for _ in range(rng.randrange(1, 240))]
        second = list(prompt[: rng.randrange(len(prompt) + 1)])
        second += [rng.randrange(50) for _ in range(rng.randrange(0, 120))]
        result = diagnose(fingerprint(prompt, SETTINGS), second, SETTINGS)
        given_digests = diagnose(
            fingerprint(prompt, SETTINGS), second, SETTINGS, block_digests(second)
        )
        assert given_digests == result
        true = 0
        while true < min(len(prompt), len(second)) and prompt[true] == second[true]:
            true += 1
        # A shorter request is compared on its whole blocks.
        comparable = len(prompt) if len(second) >= len(prompt) else len(second) // 32 * 32
        if true >= comparable:
            assert isinstance(result, PromptCacheDiagnosticsCacheHit)
        else:
            assert isinstance(result, PromptCacheDiagnosticsCacheMiss)
            assert result.comparison_reusable_tokens == true // BLOCK_TOKENS * BLOCK_TOKENS
