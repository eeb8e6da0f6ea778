"""The simulated engine: harmony completions, scripts, stop/length/abort/fail, cache counts.

Prompts are rendered with openai_harmony directly, so these tests do not depend on the
Responses rendering. Timing parameters are fast; nothing asserts on wall-clock speed (the
timeouts below only keep a broken abort from hanging the run; the time model's figures are
the engine's own arithmetic).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import replace
from pathlib import Path

import pytest
from openai_harmony import Author, Conversation, Message, Role, SystemContent
from pydantic import ValidationError

from serve_app.engines.base import EngineError, GenerateChunk, GenerateRequest, SamplingSettings
from serve_app.engines.simulated import (
    SCRIPT_ENV,
    EngineScript,
    SimulatedEngine,
    SimulatedEngineConfig,
    last_message_text,
    token_logprobs,
)
from serve_app.harmony.encoding import CALL_TOKEN, END_TOKEN, RETURN_TOKEN, get_encoding

HARMONY_STOPS = (RETURN_TOKEN, CALL_TOKEN)
FAST = {"decode_tokens_per_s": 100_000, "prefill_tokens_per_s": 1e8}

SCRIPT = {
    "turns": [
        {
            "match": "RESULT-42",
            "items": [{"reasoning": "The tool said 42."}, {"text": "The answer is 42."}],
        },
        {
            "match": "TOOL-PLEASE",
            "items": [
                {"reasoning": "Need ls."},
                {"function_call": {"name": "exec_command", "arguments": {"cmd": "ls -la"}}},
            ],
        },
        {
            "match": "TWO-CALLS",
            "items": [
                {"preamble": "Running two things."},
                {"function_call": {"name": "lookup", "namespace": "mcp", "arguments": '{"q":1}'}},
                {"custom_tool_call": {"name": "apply_patch", "input": "*** Begin Patch <|call|>"}},
            ],
        },
        {"match": "BREAK", "items": [{"text": "partial"}, {"fail": "boom"}]},
        {"match": "REJECT", "items": [{"fail": {"message": "bad", "code": "invalid_prompt"}}]},
        {"match": "NAP", "items": [{"reasoning": "Wait."}, {"sleep": 60}, {"text": "late"}]},
        {"match": "RAW", "items": [{"raw": "<|channel|>final<|message|>no end"}]},
    ]
}


def prompt(*messages: Message) -> list[int]:
    """A harmony prompt ending with ``<|start|>assistant``, as the ingress renders one."""
    system = Message.from_role_and_content(Role.SYSTEM, SystemContent.new())
    conversation = Conversation.from_messages([system, *messages])
    return get_encoding().render_conversation_for_completion(conversation, Role.ASSISTANT)


def user(text: str) -> Message:
    return Message.from_role_and_content(Role.USER, text)


def tool_call(name: str, arguments: str) -> Message:
    return (
        Message.from_role_and_content(Role.ASSISTANT, arguments)
        .with_channel("commentary")
        .with_recipient(f"functions.{name}")
        .with_content_type("<|constrain|>json")
    )


def tool_output(name: str, output: str) -> Message:
    return (
        Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{name}"), output)
        .with_channel("commentary")
        .with_recipient("assistant")
    )


def engine(**overrides: object) -> SimulatedEngine:
    return SimulatedEngine(SimulatedEngineConfig(**{**FAST, "script": SCRIPT, **overrides}))


def request(
    tokens: list[int], request_id: str = "r1", max_tokens: int = 4096, stops=HARMONY_STOPS
) -> GenerateRequest:
    return GenerateRequest(request_id, tokens, SamplingSettings(max_tokens, stop_token_ids=stops))


async def collect(sim: SimulatedEngine, generate: GenerateRequest) -> list[GenerateChunk]:
    return [chunk async for chunk in sim.generate(generate)]


def tokens_of(chunks: list[GenerateChunk]) -> list[int]:
    return [token for chunk in chunks for token in chunk.token_ids]


def parse(tokens: list[int]) -> list[Message]:
    return get_encoding().parse_messages_from_completion_tokens(tokens, Role.ASSISTANT)


# -- Scripted turns ---------------------------------------------------------------------------


async def test_scripted_tool_call_decodes_to_the_exact_call() -> None:
    chunks = await collect(engine(), request(prompt(user("TOOL-PLEASE now"))))
    tokens = tokens_of(chunks)
    reasoning, call = parse(tokens)
    assert (reasoning.channel, reasoning.recipient) == ("analysis", None)
    assert reasoning.content[0].text == "Need ls."
    assert (call.channel, call.recipient) == ("commentary", "functions.exec_command")
    assert call.content_type == "<|constrain|>json"
    assert json.loads(call.content[0].text) == {"cmd": "ls -la"}
    assert tokens[-1] == CALL_TOKEN
    assert chunks[-1].finish_reason == "stop"
    assert all(chunk.finish_reason is None for chunk in chunks[:-1])


async def test_completion_starts_with_a_channel_after_the_prompts_assistant_header() -> None:
    chunks = await collect(engine(), request(prompt(user("TOOL-PLEASE"))))
    text = get_encoding().decode(tokens_of(chunks))
    assert text.startswith("<|channel|>analysis<|message|>")
    assert "<|start|>assistant<|channel|>commentary to=functions.exec_command " in text


async def test_several_calls_in_one_turn_play_out_despite_stop_tokens() -> None:
    chunks = await collect(engine(), request(prompt(user("TWO-CALLS"))))
    preamble, call, custom = parse(tokens_of(chunks))
    assert (preamble.channel, preamble.recipient) == ("commentary", None)
    assert preamble.content[0].text == "Running two things."
    assert (call.recipient, call.content[0].text) == ("mcp.lookup", '{"q":1}')
    assert call.content_type == "<|constrain|>json"
    assert custom.recipient == "functions.apply_patch"
    assert custom.content_type is None
    # Special-token text in an item's content stays text: it does not end the message.
    assert custom.content[0].text == "*** Begin Patch <|call|>"
    assert tokens_of(chunks).count(CALL_TOKEN) == 2
    assert chunks[-1].finish_reason == "stop"


async def test_the_turn_is_chosen_by_the_last_message_only() -> None:
    sim = engine()
    # The tool output is the last message: its turn plays, not the earlier task's.
    after_tool = prompt(
        user("TOOL-PLEASE"),
        tool_call("exec_command", "{}"),
        tool_output("exec_command", "RESULT-42"),
    )
    reasoning, final = parse(tokens_of(await collect(sim, request(after_tool, "a"))))
    assert reasoning.content[0].text == "The tool said 42."
    assert final.channel == "final" and final.content[0].text == "The answer is 42."
    # A marker in an earlier message does not match.
    later = prompt(user("TOOL-PLEASE"), user("just chat"))
    messages = parse(tokens_of(await collect(sim, request(later, "b"))))
    assert all(message.recipient is None for message in messages)
    assert "simulated engine" in messages[-1].content[0].text


def test_last_message_text_is_the_message_before_the_assistant_header() -> None:
    tokens = prompt(user("first"), tool_output("exec_command", "the output"))
    text = last_message_text(tokens)
    assert text.startswith("<|start|>functions.exec_command<|channel|>commentary to=assistant")
    assert text.endswith("the output<|end|>")
    assert "first" not in text
    assert last_message_text([]) == ""


async def test_a_turn_without_match_matches_anything() -> None:
    script = {"turns": [{"match": "NEVER", "items": [{"text": "no"}]}, {"items": [{"text": "y"}]}]}
    chunks = await collect(engine(script=script), request(prompt(user("whatever"))))
    (final,) = parse(tokens_of(chunks))
    assert final.content[0].text == "y"


async def test_raw_items_are_emitted_verbatim() -> None:
    chunks = await collect(engine(), request(prompt(user("RAW"))))
    assert get_encoding().decode(tokens_of(chunks)) == "<|channel|>final<|message|>no end"
    assert chunks[-1].finish_reason == "stop"


async def test_fail_raises_mid_stream_after_the_tokens_before_it() -> None:
    sim = engine()
    seen: list[GenerateChunk] = []
    with pytest.raises(EngineError, match="boom"):
        async for chunk in sim.generate(request(prompt(user("BREAK it")))):
            seen.append(chunk)
    (final,) = parse(tokens_of(seen))
    assert final.content[0].text == "partial"
    assert sim.num_ongoing_requests() == 0


async def test_fail_with_a_code_raises_an_engine_error_with_that_code() -> None:
    with pytest.raises(EngineError, match="bad") as caught:
        await collect(engine(), request(prompt(user("REJECT it"))))
    assert caught.value.code == "invalid_prompt"
    with pytest.raises(EngineError) as plain:
        await collect(engine(), request(prompt(user("BREAK it"))))
    assert plain.value.code == "server_error"


# -- Default answer ---------------------------------------------------------------------------


async def test_default_answer_is_harmless_and_says_what_it_is() -> None:
    sim = engine(script=None, default_output_tokens=80)
    chunks = await collect(sim, request(prompt(user("run `rm -rf /` with exec_command now"))))
    tokens = tokens_of(chunks)
    messages = parse(tokens)
    assert [message.channel for message in messages] == ["analysis", "final"]
    assert all(message.recipient is None for message in messages)
    assert CALL_TOKEN not in tokens
    assert "simulated engine" in messages[-1].content[0].text
    assert "no model weights" in messages[-1].content[0].text
    assert len(tokens) == 80 and tokens[-1] == RETURN_TOKEN
    assert chunks[-1].finish_reason == "stop"


async def test_default_answer_is_deterministic_given_the_seed() -> None:
    tokens = prompt(user("hello"))
    first = tokens_of(await collect(engine(seed=7), request(tokens)))
    again = tokens_of(await collect(engine(seed=7), request(tokens)))
    other = tokens_of(await collect(engine(seed=8), request(tokens)))
    assert first == again
    assert first != other


async def test_default_answer_stops_after_a_stop_token() -> None:
    chunks = await collect(engine(), request(prompt(user("hello")), stops=(END_TOKEN,)))
    tokens = tokens_of(chunks)
    assert tokens[-1] == END_TOKEN and tokens.count(END_TOKEN) == 1
    assert [message.channel for message in parse(tokens)] == ["analysis"]
    assert chunks[-1].finish_reason == "stop"


async def test_max_tokens_cuts_with_length() -> None:
    sim = engine()
    chunks = await collect(sim, request(prompt(user("hello")), max_tokens=5))
    assert len(tokens_of(chunks)) == 5
    assert chunks[-1].finish_reason == "length"
    scripted = await collect(sim, request(prompt(user("TOOL-PLEASE")), "r2", max_tokens=3))
    assert len(tokens_of(scripted)) == 3
    assert scripted[-1].finish_reason == "length"


# -- Abort, cancellation, bookkeeping ---------------------------------------------------------


async def _started(
    sim: SimulatedEngine, generate: GenerateRequest, ongoing: int = 1
) -> tuple[asyncio.Task, list]:
    """Run ``generate`` in a task until the engine has ``ongoing`` requests admitted."""
    seen: list[GenerateChunk] = []

    async def consume() -> None:
        async for chunk in sim.generate(generate):
            seen.append(chunk)

    task = asyncio.create_task(consume())
    while sim.num_ongoing_requests() < ongoing:
        await asyncio.sleep(0)
    return task, seen


async def test_abort_during_decode_ends_the_stream_promptly() -> None:
    # At 1 token/s the answer would take minutes: only the abort can end it in time.
    sim = engine(decode_tokens_per_s=1, default_output_tokens=500)
    task, seen = await _started(sim, request(prompt(user("hello")), "slow"))
    while not seen:
        await asyncio.sleep(0.01)
    await sim.abort("slow")
    await asyncio.wait_for(task, timeout=10)
    assert seen[-1].finish_reason == "abort"
    assert 0 < len(tokens_of(seen)) < 500
    assert sim.num_ongoing_requests() == 0
    await sim.abort("slow")  # idempotent


async def test_abort_during_prefill_and_during_a_scripted_sleep() -> None:
    sim = engine(prefill_tokens_per_s=0.001)
    task, seen = await _started(sim, request(prompt(user("hello")), "prefill"))
    await sim.abort("prefill")
    await asyncio.wait_for(task, timeout=10)
    assert [chunk.finish_reason for chunk in seen] == ["abort"]
    assert seen[0].token_ids == [] and seen[0].num_prompt_tokens > 0

    sim = engine()
    task, seen = await _started(sim, request(prompt(user("NAP")), "nap"))
    while not seen:
        await asyncio.sleep(0.01)
    await sim.abort("nap")
    await asyncio.wait_for(task, timeout=10)
    assert seen[-1].finish_reason == "abort"
    assert [message.content[0].text for message in parse(tokens_of(seen))] == ["Wait."]
    assert sim.num_ongoing_requests() == 0


async def test_prefills_queue_and_an_abort_hands_the_turn_on() -> None:
    sim = engine(prefill_tokens_per_s=0.001)  # the first prefill would never end by itself
    first, first_seen = await _started(sim, request(prompt(user("one")), "first"))
    second, second_seen = await _started(sim, request(prompt(user("two")), "second"), 2)
    third, third_seen = await _started(sim, request(prompt(user("three")), "third"), 3)
    await sim.abort("second")  # aborted while queued behind "first"
    await asyncio.wait_for(second, timeout=10)
    assert [chunk.finish_reason for chunk in second_seen] == ["abort"]
    sim.config.prefill_tokens_per_s = 1e8  # later prefills are fast again
    await sim.abort("first")  # leaving the head of the queue wakes "third"
    await asyncio.wait_for(asyncio.gather(first, third), timeout=10)
    assert first_seen[-1].finish_reason == "abort"
    assert third_seen[-1].finish_reason == "stop"
    assert sim.num_ongoing_requests() == 0


async def test_a_request_queued_behind_the_same_prefix_reuses_it() -> None:
    sim = engine()
    tokens = prompt(user("hello"))
    first, second = await asyncio.gather(
        collect(sim, request(tokens, "a")), collect(sim, request(tokens, "b"))
    )
    assert first[0].num_cached_tokens == 0
    assert second[0].num_cached_tokens == (len(tokens) - 1) // 16 * 16


async def test_a_cancelled_consumer_frees_the_request() -> None:
    sim = engine(decode_tokens_per_s=1)
    task, _ = await _started(sim, request(prompt(user("hello"))))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sim.num_ongoing_requests() == 0


async def test_unknown_abort_is_a_no_op_and_duplicate_ids_are_refused() -> None:
    sim = engine(decode_tokens_per_s=1)
    await sim.abort("never-seen")
    task, _ = await _started(sim, request(prompt(user("hello")), "dup"))
    with pytest.raises(EngineError, match="already running"):
        await collect(sim, request(prompt(user("hello")), "dup"))
    assert sim.num_ongoing_requests() == 1
    await sim.abort("dup")
    await asyncio.wait_for(task, timeout=10)
    assert sim.num_ongoing_requests() == 0


# -- Time model --------------------------------------------------------------------------------


async def test_the_first_token_reports_the_time_model_not_a_stalled_host() -> None:
    sim = engine(prefill_tokens_per_s=1_000, decode_tokens_per_s=100, batch_slowdown=0)
    submitted = time.monotonic()
    first, first_seen = await _started(sim, request(prompt(user("one")), "a"))
    second, second_seen = await _started(sim, request(prompt(user("two")), "b"), 2)
    # The second arrives this long after the first at most (longer on a loaded host), and the
    # first's prefill has run that long by then.
    between_s = time.monotonic() - submitted
    time.sleep(0.3)  # the host stalls with both queued: every timer fires late
    await asyncio.wait_for(asyncio.gather(first, second), timeout=10)

    def prefill_s(chunks: list[GenerateChunk]) -> float:
        return (chunks[0].num_prompt_tokens - chunks[0].num_cached_tokens) / 1_000

    step_s = 1 / 100
    first_token = next(chunk for chunk in first_seen if chunk.token_ids)
    second_token = next(chunk for chunk in second_seen if chunk.token_ids)
    # Arrival to the modelled first token: its prefill, queued behind the other's, then a step.
    assert first_token.engine_ttft_s == pytest.approx(prefill_s(first_seen) + step_s, abs=0.002)
    queued_behind_s = prefill_s(first_seen) + prefill_s(second_seen) + step_s
    assert queued_behind_s - between_s - 0.002 <= second_token.engine_ttft_s
    assert second_token.engine_ttft_s <= queued_behind_s + 0.002
    later = [chunk.engine_ttft_s for chunk in first_seen + second_seen if chunk.token_ids]
    assert later.count(None) == len(later) - 2  # only each request's first token is stamped


# -- Prefix cache ------------------------------------------------------------------------------


async def test_cached_tokens_are_reported_from_the_first_chunk_on() -> None:
    sim = engine()
    tokens = prompt(user("hello"))
    first = await collect(sim, request(tokens, "r1"))
    second = await collect(sim, request(tokens, "r2"))
    assert all(chunk.num_cached_tokens == 0 for chunk in first)
    full_blocks = (len(tokens) - 1) // 16 * 16
    assert full_blocks > 0
    assert all(chunk.num_cached_tokens == full_blocks for chunk in second)
    assert all(chunk.num_prompt_tokens == len(tokens) for chunk in first + second)


async def test_the_next_turn_reuses_the_prompt_and_the_output() -> None:
    sim = engine()
    turn1 = prompt(user("TOOL-PLEASE"))
    output = tokens_of(await collect(sim, request(turn1, "r1")))
    tool_result = get_encoding().encode(
        "<|start|>functions.exec_command to=assistant<|channel|>commentary<|message|>RESULT-42"
        "<|end|><|start|>assistant",
        allowed_special="all",
    )
    turn2 = [*turn1, *output, *tool_result]
    chunks = await collect(sim, request(turn2, "r2"))
    assert chunks[0].num_cached_tokens == (len(turn1) + len(output)) // 16 * 16
    assert parse(tokens_of(chunks))[-1].content[0].text == "The answer is 42."
    stats = sim.cache_stats()
    assert stats.lookups == 2 and stats.hit_tokens == chunks[0].num_cached_tokens
    # Turn 2 extends turn 1, so its blocks include all of turn 1's.
    assert stats.used_blocks == (len(turn2) + len(tokens_of(chunks))) // 16


async def test_a_prompt_is_served_from_cache_only_under_its_own_cache_salt() -> None:
    """Two tenants send the same prompt: neither is served (or sped up) by the other's
    blocks, and each one's repeat still is."""
    sim = engine()
    tokens = prompt(user("the same long question " * 20))
    full_blocks = (len(tokens) - 1) // 16 * 16

    async def cached(request_id: str, salt: str | None) -> int:
        chunks = await collect(sim, replace(request(tokens, request_id), cache_salt=salt))
        return chunks[0].num_cached_tokens

    assert await cached("a1", "tenant-a") == 0
    assert await cached("b1", "tenant-b") == 0
    assert await cached("open1", None) == 0
    assert await cached("a2", "tenant-a") == full_blocks
    assert await cached("b2", "tenant-b") == full_blocks


# -- Configuration and script loading ---------------------------------------------------------


def test_script_from_yaml_json_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    yaml_path = tmp_path / "script.yaml"
    yaml_path.write_text("turns:\n  - match: 'hi'\n    items:\n      - text: hello\n")
    json_path = tmp_path / "script.json"
    json_path.write_text(json.dumps(SCRIPT))
    assert EngineScript.load(yaml_path).turns[0].items[0].text == "hello"
    assert len(EngineScript.load(json_path).turns) == len(SCRIPT["turns"])

    monkeypatch.setenv(SCRIPT_ENV, str(yaml_path))
    assert len(SimulatedEngine(SimulatedEngineConfig()).script.turns) == 1
    # The config wins over the environment.
    configured = SimulatedEngine(SimulatedEngineConfig(script=str(json_path)))
    assert len(configured.script.turns) == len(SCRIPT["turns"])
    monkeypatch.delenv(SCRIPT_ENV)
    assert SimulatedEngine(SimulatedEngineConfig()).script.turns == ()


@pytest.mark.parametrize(
    "turn",
    [
        {"items": [{"shell": "rm -rf /"}]},
        {"items": [{"text": "a", "reasoning": "b"}]},
        {"items": []},
        {"match": "([unclosed", "items": [{"text": "a"}]},
        {"items": [{"function_call": {"name": "bad name", "arguments": {}}}]},
        {"items": [{"function_call": {"name": "x<|call|>"}}]},
        {"items": [{"sleep": -1}]},
    ],
)
def test_bad_scripts_are_rejected(turn: dict) -> None:
    with pytest.raises(ValidationError):
        EngineScript.load({"turns": [turn]})


def test_config_rejects_a_cache_smaller_than_a_block() -> None:
    with pytest.raises(ValidationError):
        SimulatedEngineConfig(block_size=16, kv_cache_tokens=8)
    with pytest.raises(ValidationError):
        SimulatedEngineConfig(unknown_option=1)


async def test_start_encodes_every_scripted_turn() -> None:
    sim = engine()
    await sim.start()
    assert sim.num_ongoing_requests() == 0


# -- Logprobs -----------------------------------------------------------------------------------


def logprobs_request(tokens: list[int], top: int | None, request_id: str = "r1") -> GenerateRequest:
    sampling = SamplingSettings(4096, stop_token_ids=HARMONY_STOPS, logprobs=top)
    return GenerateRequest(request_id, tokens, sampling)


async def test_logprobs_only_when_asked_one_per_token_and_deterministic() -> None:
    tokens = prompt(user("hello"))
    plain = await collect(engine(script=None, seed=3), logprobs_request(tokens, None))
    assert all(chunk.logprobs is None for chunk in plain)
    # Slow enough to stream in several chunks.
    slow = engine(script=None, seed=3, decode_tokens_per_s=400, default_output_tokens=40)
    asked = await collect(slow, logprobs_request(tokens, 4))
    assert len([chunk for chunk in asked if chunk.token_ids]) > 1
    plain = await collect(engine(script=None, seed=3, default_output_tokens=40), request(tokens))
    again_engine = engine(script=None, seed=3, default_output_tokens=40)
    again = await collect(again_engine, logprobs_request(tokens, 4, "r2"))
    assert tokens_of(asked) == tokens_of(plain)
    entries = [entry for chunk in asked for entry in chunk.logprobs or []]
    assert len(entries) == len(tokens_of(asked))
    assert entries == [entry for chunk in again for entry in chunk.logprobs or []]
    # A function of (seed, position, token): however the stream was chunked.
    output = tokens_of(asked)
    assert entries == [token_logprobs(3, i, token, 4) for i, token in enumerate(output)]
    for token, (logprob, top) in zip(tokens_of(asked), entries, strict=True):
        assert logprob <= 0
        # The sampled token is the most likely; then distinct alternatives, decreasing.
        assert top[0] == (token, logprob) and len(top) == 4
        values = [value for _, value in top]
        assert values == sorted(values, reverse=True) and values[0] > values[1]
        assert len({alt for alt, _ in top}) == 4
        assert sum(math.exp(value) for value in values) < 1


async def test_zero_top_logprobs_gives_the_sampled_tokens_only() -> None:
    chunks = await collect(engine(script=None), logprobs_request(prompt(user("hi")), 0))
    entries = [entry for chunk in chunks for entry in chunk.logprobs or []]
    assert entries and all(top == () and logprob <= 0 for logprob, top in entries)


def test_merged_chunks_keep_logprobs_aligned() -> None:
    first = GenerateChunk(token_ids=[1, 2], logprobs=[(-0.1, ()), (-0.2, ())])
    last = GenerateChunk(token_ids=[3], logprobs=[(-0.3, ((3, -0.3),))], finish_reason="stop")
    merged = first.merge(last).merge(GenerateChunk(finish_reason="stop"))
    assert merged.token_ids == [1, 2, 3]
    assert merged.logprobs == [(-0.1, ()), (-0.2, ()), (-0.3, ((3, -0.3),))]
    assert GenerateChunk(token_ids=[1]).merge(GenerateChunk(token_ids=[2])).logprobs is None
