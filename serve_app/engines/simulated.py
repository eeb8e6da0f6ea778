"""The simulated engine: a CPU stand-in for vLLM, honest about being one.

It has no model weights. It emits well-formed harmony completions made with the real
encoding, models a block-level prefix KV cache (`PrefixKVCache`) so routing and load tests
measure real cache behaviour, and models time: prefill of the *uncached* prompt tokens (one
prefill at a time, first come first served, as prefills share one accelerator) and decode steps
that slow down as more requests decode together.

What it says:
- By default, a short analysis message and a final answer that says it comes from the simulated
  engine, padded with filler words to ``default_output_tokens``. It never calls a tool on its
  own: an agent driven by it cannot be made to run anything, unless the request itself
  requires a call (``tool_choice`` required or named; see Constraints below).
- With a script (tests), the first turn whose ``match`` regex is found (``re.search``) in the
  decoded prompt's last message, header included, e.g. ``<|start|>user<|message|>…<|end|>``::

      turns:
        - match: "RESULT-42"            # optional: a turn without match matches anything
          items:
            - reasoning: "analysis channel text"
            - preamble: "commentary text with no recipient"
            - text: "final answer (ends with <|return|>)"
            - function_call: {name: exec_command, arguments: {cmd: ls}, namespace: functions}
            - custom_tool_call: {name: apply_patch, input: "raw text"}
            - raw: "<|channel|>final<|message|>harmony text, specials included"
            - sleep: 0.5                # seconds, cut short by abort
            - fail: "EngineError message raised at this point"
            - fail: {message: "prompt rejected", code: invalid_prompt}   # with the error's code

  The script comes from ``config.script`` (a YAML/JSON path or the mapping itself), else the
  file ``$SERVE_APP_SIM_SCRIPT`` names. A turn plays out whole: stop tokens inside it (one
  ``<|call|>`` per tool call) do not end it; its end gives finish reason "stop". ``max_tokens``
  and abort cut it like any other output.

Constraints (``GenerateRequest.constraint``, issue 20): honoured with the llguidance grammar
vLLM's guidance backend enforces too. Unscripted, a completion that must be
JSON or must call a tool is sampled under the grammar's token mask (seeded like the default
answer), so it is valid by construction, not scripted; where a free final answer is allowed the
default answer stands (it obeys), and under ``tool_choice`` auto the sampler answers and never
calls a tool on its own. A scripted turn is checked against the constraint, each message
ending in ``<|return|>`` or ``<|call|>`` as its own completion: a turn that breaks it is an
`EngineError` (the test script is misconfigured), never silently invalid output.

Logprobs (``SamplingSettings.logprobs`` = k): deterministic stand-ins, a function of
(``seed``, position, token) only (`token_logprobs`). The sampled token gets a probability in
[0.5, 0.95), the most likely; the top k are the sampled token then k - 1 distinct filler words,
in decreasing order, sharing at most 90% of what is left, so every value is a valid
log-probability (≤ 0) and the shown ones sum to less than 1. No model computed them.

The output depends only on the prompt, the script and ``seed``; only the timing is wall-clock.
The chunk with the first token reports ``engine_ttft_s`` from the time model (arrival to the
modelled first token), so a benchmark on a busy host measures where requests were sent, not
how late the host's timers fired.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import random
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, TypeAlias

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from serve_app.constraints.matcher import ConstraintError, new_matcher
from serve_app.constraints.sampling import DeadEnd, MaskedSampler
from serve_app.constraints.spec import CompletionConstraint
from serve_app.constraints.vocab import harmony_tokenizer
from serve_app.engines.base import (
    SERVER_ERROR,
    Engine,
    EngineError,
    FinishReason,
    GenerateChunk,
    GenerateRequest,
    TokenLogprob,
)
from serve_app.engines.kv_events import KVEvent, KVEventSink
from serve_app.engines.prefix_cache import PrefixCacheStats, PrefixKVCache
from serve_app.harmony import tools
from serve_app.harmony.encoding import (
    CALL_TOKEN,
    END_TOKEN,
    RETURN_TOKEN,
    START_TOKEN,
    get_encoding,
)

logger = logging.getLogger(__name__)

SCRIPT_ENV = "SERVE_APP_SIM_SCRIPT"
# Below this many seconds ahead of schedule the decode loop does not sleep (timer resolution):
# at high decode rates several tokens then go out in one chunk, keeping the modelled rate.
_MIN_SLEEP_S = 0.001
# Tool names and namespaces go into a harmony header: no spaces, no special-token brackets.
_HEADER_NAME = r"^[^\s<>|]+$"
# Single-token words (checked at first use) the default answer is padded with.
_FILLER_WORDS = (
    *("placeholder", "simulated", "engine", "tokens", "stand", "in", "for", "a", "model"),
    *("answer", "decode", "time", "routing", "cache", "block", "prefix", "latency"),
    *("throughput", "replica", "request", "stream", "harmony", "words", "filler", "text"),
)


# --------------------------------------------------------------------------------------------
# The script: what a test wants the "model" to say. Its items are named ``Script*``: they are
# steps of a scripted completion, not the Responses items of serve_app.protocol.requests.


class _ScriptItem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScriptReasoning(_ScriptItem):
    """An ``analysis`` message (chain of thought)."""

    reasoning: str


class ScriptPreamble(_ScriptItem):
    """A ``commentary`` message with no recipient (a preamble shown to the user)."""

    preamble: str


class ScriptText(_ScriptItem):
    """A ``final`` message, ended with ``<|return|>``."""

    text: str


class FunctionCallSpec(_ScriptItem):
    name: str = Field(pattern=_HEADER_NAME)
    # A dict is sent as compact JSON text; a string is sent as is (e.g. deliberately bad JSON).
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    namespace: str | None = Field(default=None, pattern=_HEADER_NAME)


class ScriptFunctionCall(_ScriptItem):
    """``commentary to=functions.NAME <|constrain|>json``, ended with ``<|call|>``."""

    function_call: FunctionCallSpec


class CustomToolCallSpec(_ScriptItem):
    name: str = Field(pattern=_HEADER_NAME)
    input: str
    namespace: str | None = Field(default=None, pattern=_HEADER_NAME)


class ScriptCustomToolCall(_ScriptItem):
    """``commentary to=functions.NAME`` with raw text input, ended with ``<|call|>``."""

    custom_tool_call: CustomToolCallSpec


class ScriptRaw(_ScriptItem):
    """Harmony text encoded verbatim, special tokens included (for malformed-output tests)."""

    raw: str


class Failure(_ScriptItem):
    message: str
    # ``server_error``: the engine failed; ``invalid_prompt`` / ``invalid_request``: vLLM
    # rejected the request as the client's fault (a 400 for the client).
    code: str = SERVER_ERROR


class ScriptFail(_ScriptItem):
    """The engine raises ``EngineError`` here, after streaming the items before it: a message
    (a ``server_error``), or ``{message, code}``."""

    fail: str | Failure

    @property
    def failure(self) -> Failure:
        return self.fail if isinstance(self.fail, Failure) else Failure(message=self.fail)


class ScriptSleep(_ScriptItem):
    """Pause the stream for this many seconds (abortable)."""

    sleep: float = Field(ge=0)


ScriptItem: TypeAlias = (
    ScriptReasoning
    | ScriptPreamble
    | ScriptText
    | ScriptFunctionCall
    | ScriptCustomToolCall
    | ScriptRaw
    | ScriptFail
    | ScriptSleep
)
_ITEM_TYPES: dict[str, type[_ScriptItem]] = {
    "reasoning": ScriptReasoning,
    "preamble": ScriptPreamble,
    "text": ScriptText,
    "function_call": ScriptFunctionCall,
    "custom_tool_call": ScriptCustomToolCall,
    "raw": ScriptRaw,
    "fail": ScriptFail,
    "sleep": ScriptSleep,
}


class ScriptTurn(BaseModel):
    """One assistant turn, played when ``match`` is found in the prompt's last message.

    A turn without ``match`` matches any prompt. Stop tokens are ignored inside a turn (several
    tool calls each end with ``<|call|>`` and the stream goes on); the turn's end ends the
    request with finish reason "stop".
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    match: re.Pattern[str] | None = None
    items: tuple[ScriptItem, ...] = Field(min_length=1)

    @field_validator("items", mode="before")
    @classmethod
    def _parse_items(cls, items: Any) -> Any:
        """Parse each item by its one key, so a typo gets a one-line error, not a union dump."""
        if not isinstance(items, list | tuple):
            return items
        return [item if isinstance(item, _ScriptItem) else _parse_item(item) for item in items]


def _parse_item(item: Any) -> _ScriptItem:
    kind = next(iter(item)) if isinstance(item, Mapping) and len(item) == 1 else None
    if kind not in _ITEM_TYPES:
        raise ValueError(f"a script item is one key of {sorted(_ITEM_TYPES)}: got {item!r}")
    return _ITEM_TYPES[kind].model_validate(item)


class EngineScript(BaseModel):
    """``turns: [{match: REGEX?, items: [...]}]``, from YAML/JSON or a dict."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    turns: tuple[ScriptTurn, ...] = ()

    @classmethod
    def load(cls, source: str | Path | Mapping[str, Any]) -> EngineScript:
        """From a mapping, or a YAML/JSON file path."""
        if isinstance(source, Mapping):
            return cls.model_validate(source)
        path = Path(source)
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        return cls.model_validate(data or {})

    def turn_index(self, last_message: str) -> int | None:
        """Index of the first turn whose ``match`` is found in ``last_message`` (re.search)."""
        for index, turn in enumerate(self.turns):
            if turn.match is None or turn.match.search(last_message):
                return index
        return None


def load_script(source: str | Path | Mapping[str, Any] | None) -> EngineScript:
    """The configured script, else the file ``$SERVE_APP_SIM_SCRIPT`` names, else none."""
    if source is None:
        source = os.environ.get(SCRIPT_ENV) or None
    return EngineScript.load(source) if source is not None else EngineScript()


# --------------------------------------------------------------------------------------------
# Configuration.


class SimulatedEngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Prefix cache model: block size and capacity (KV tokens the replica can keep cached).
    block_size: int = Field(default=16, gt=0)
    kv_cache_tokens: int = Field(default=262_144, gt=0)
    # Prefill speed for uncached prompt tokens; one prefill runs at a time, in arrival order.
    prefill_tokens_per_s: float = Field(default=20_000, gt=0)
    # Decode speed of one request decoding alone.
    decode_tokens_per_s: float = Field(default=200, gt=0)
    # Each other request decoding at the same time slows a decode step by this fraction.
    batch_slowdown: float = Field(default=0.02, ge=0)
    # Length in tokens of the default answer (it is never shorter than its fixed sentences).
    default_output_tokens: int = Field(default=64, ge=1)
    # A script file (YAML/JSON) or the script itself; None falls back to $SERVE_APP_SIM_SCRIPT.
    script: str | dict[str, Any] | None = None
    # Seeds the default answer's filler words (mixed with the prompt).
    seed: int = 0

    @model_validator(mode="after")
    def _cache_holds_a_block(self) -> SimulatedEngineConfig:
        if self.kv_cache_tokens < self.block_size:
            raise ValueError("kv_cache_tokens must be at least block_size")
        return self


# --------------------------------------------------------------------------------------------
# Plans: what one request will stream, as steps.


@dataclass(frozen=True)
class _Emit:
    tokens: tuple[int, ...]
    # The default answer honours the request's stop tokens; a scripted turn plays out whole.
    honour_stop: bool


@dataclass(frozen=True)
class _Fail:
    message: str
    code: str


@dataclass(frozen=True)
class _Sleep:
    seconds: float


@dataclass(frozen=True)
class _Sample:
    """Tokens drawn one decode step at a time under a constraint's mask, until its grammar
    ends (a stop token, honoured) or ``max_tokens`` cuts it."""

    sampler: MaskedSampler

    @property
    def tokens(self) -> Iterator[int]:
        while not self.sampler.done:
            try:
                token = self.sampler.next_token()
            except DeadEnd as exc:
                # A server fault (500 / response.failed), said plainly: the request was valid.
                raise EngineError(f"constrained decoding reached a dead end: {exc}") from exc
            yield token


_Step: TypeAlias = _Emit | _Fail | _Sleep | _Sample


class _Harmony:
    """Harmony messages as completion tokens, built with the real encoding."""

    def __init__(self) -> None:
        self.encoding = get_encoding()
        self.start_assistant = tuple(self.header("<|start|>assistant"))

    def header(self, text: str) -> list[int]:
        return self.encoding.encode(text, allowed_special="all")

    def text(self, text: str) -> list[int]:
        # Content is plain text: "<|call|>" in a reasoning string must not end the message.
        return self.encoding.encode(text, disallowed_special=())

    def message(self, header: str, content: str, end: int) -> list[int]:
        """``HEADER<|message|>CONTENT`` + ``end``; the ``<|start|>assistant`` is the caller's."""
        return [*self.header(f"{header}<|message|>"), *self.text(content), end]

    def item_tokens(self, item: ScriptItem) -> list[int]:
        match item:
            case ScriptReasoning(reasoning=text):
                return self.message("<|channel|>analysis", text, END_TOKEN)
            case ScriptPreamble(preamble=text):
                return self.message("<|channel|>commentary", text, END_TOKEN)
            case ScriptText(text=text):
                return self.message("<|channel|>final", text, RETURN_TOKEN)
            case ScriptFunctionCall(function_call=call):
                arguments = call.arguments
                if not isinstance(arguments, str):
                    arguments = json.dumps(arguments, ensure_ascii=False)
                to = tools.recipient(call.name, call.namespace)
                header = f"<|channel|>commentary to={to} <|constrain|>json"
                return self.message(header, arguments, CALL_TOKEN)
            case ScriptCustomToolCall(custom_tool_call=call):
                to = tools.recipient(call.name, call.namespace)
                return self.message(f"<|channel|>commentary to={to}", call.input, CALL_TOKEN)
            case ScriptRaw(raw=text):
                return self.header(text)
        raise TypeError(f"not a message item: {item!r}")

    def turn_plan(self, turn: ScriptTurn) -> list[_Step]:
        """A turn's steps; every message after the first gets its own ``<|start|>assistant``."""
        steps: list[_Step] = []
        emitted = False
        for item in turn.items:
            if isinstance(item, ScriptFail):
                steps.append(_Fail(item.failure.message, item.failure.code))
            elif isinstance(item, ScriptSleep):
                steps.append(_Sleep(item.sleep))
            else:
                tokens = self.item_tokens(item)
                if emitted and not isinstance(item, ScriptRaw):
                    tokens = [*self.start_assistant, *tokens]
                steps.append(_Emit(tuple(tokens), honour_stop=False))
                emitted = True
        return steps

    @cached_property
    def filler(self) -> list[int]:
        """Token ids of the single-token filler words (with their leading space)."""
        ids = [self.text(f" {word}") for word in _FILLER_WORDS]
        return [tokens[0] for tokens in ids if len(tokens) == 1]

    def default_answer(self, prompt_tokens: int, length: int, rng: random.Random) -> list[int]:
        """The harmless answer: say what this is, pad with filler words to ``length`` tokens."""
        analysis = self.message(
            "<|channel|>analysis",
            "Simulated engine, no model weights: answer with a placeholder, call no tools.",
            END_TOKEN,
        )
        final_head = [
            *self.start_assistant,
            *self.header("<|channel|>final<|message|>"),
            *self.text(
                "Placeholder answer from serve_app's simulated engine (no model weights loaded; "
                f"prompt: {prompt_tokens} tokens):"
            ),
        ]
        tokens = [*analysis, *final_head]
        padding = max(length - len(tokens) - 1, 0)
        tokens.extend(rng.choice(self.filler) for _ in range(padding))
        tokens.append(RETURN_TOKEN)
        return tokens


def token_logprobs(seed: int, position: int, token: int, top: int) -> TokenLogprob:
    """The simulated logprob of ``token`` at ``position`` and its ``top`` most likely tokens
    (``token`` first, then filler words), the same for the same arguments in any process."""
    rng = random.Random(hash((seed, position, token)))  # hash of ints: stable across processes
    sampled = 0.5 + 0.45 * rng.random()
    if top == 0:
        return math.log(sampled), ()
    others = [word for word in _harmony().filler if word != token]
    chosen = rng.sample(others, min(top - 1, len(others)))
    weights = sorted((rng.random() + 0.01 for _ in chosen), reverse=True)
    scale = 0.9 * (1 - sampled) / (sum(weights) or 1)
    alternatives = [
        (word, math.log(weight * scale)) for word, weight in zip(chosen, weights, strict=True)
    ]
    return math.log(sampled), ((token, math.log(sampled)), *alternatives)


def last_message_text(prompt: Sequence[int]) -> str:
    """Decoded text of the prompt's last message, header included.

    That is the message before the trailing ``<|start|>assistant``: the user's task on a first
    turn, the tool output after a tool call. Empty if the prompt has no message.
    """
    harmony = _harmony()
    end = len(prompt)
    trailer = harmony.start_assistant
    if tuple(prompt[end - len(trailer) :]) == trailer:
        end -= len(trailer)
    start = end - 1
    while start >= 0 and prompt[start] != START_TOKEN:
        start -= 1
    if start < 0:
        return ""
    return harmony.encoding.decode(list(prompt[start:end]))


_HARMONY: _Harmony | None = None
_VOCABULARY_LOADED = False


def _harmony() -> _Harmony:
    global _HARMONY
    if _HARMONY is None:
        _HARMONY = _Harmony()
    return _HARMONY


# --------------------------------------------------------------------------------------------
# The engine.


@dataclass
class _Running:
    """One admitted request."""

    request: GenerateRequest
    aborted: bool = False
    decoding: bool = False
    # The pending wait, resolved early by `abort` so the stream ends promptly.
    wakeup: asyncio.Future[None] | None = None
    # Block keys of the prompt once its KV exists (after prefill): the output extends them.
    prompt_keys: list[int] | None = None
    output: list[int] = field(default_factory=list)
    # Monotonic times: arrival, and by the time model, the end of prefill and the first token.
    arrived: float = field(default_factory=time.monotonic)
    prefilled_at: float = 0.0
    first_token_at: float = 0.0


class _Aborted(Exception):
    """Internal: the request was aborted while waiting."""


class SimulatedEngine(Engine):
    """Token ids in, harmony completion token ids out, with modelled cache and timing."""

    def __init__(self, config: SimulatedEngineConfig | None = None) -> None:
        self.config = config or SimulatedEngineConfig()
        # Its KV-cache events go to whoever subscribed (the engine deployment's summary).
        self._kv_sinks: list[KVEventSink] = []
        self.cache = PrefixKVCache(
            self.config.block_size, self.config.kv_cache_tokens, on_events=self._publish
        )
        self.script = load_script(self.config.script)
        self._plans: dict[int, list[_Step]] = {}
        # Scripted turns already checked against a constraint: None if the turn obeys it, else
        # why not.
        self._checked: dict[tuple[int, CompletionConstraint], str | None] = {}
        self._running: dict[str, _Running] = {}
        self._num_decoding = 0
        # Requests waiting for prefill, the one prefilling first.
        self._prefill_queue: deque[_Running] = deque()
        # When the modelled accelerator finishes the prefills admitted so far (monotonic).
        self._prefill_free_at = 0.0

    # -- Engine contract ---------------------------------------------------------------------

    async def start(self) -> None:
        # Load the vocabulary and encode every scripted turn now, so a bad script fails the
        # replica's start-up rather than a request.
        for index in range(len(self.script.turns)):
            self._turn_plan(index)
        _harmony()
        logger.info(
            "simulated engine (no model weights): %d scripted turns, KV cache %d tokens",
            len(self.script.turns),
            self.config.kv_cache_tokens,
        )

    def num_ongoing_requests(self) -> int:
        return len(self._running)

    def subscribe_kv_events(self, sink: KVEventSink) -> bool:
        self._kv_sinks.append(sink)
        return True

    def _publish(self, events: Sequence[KVEvent]) -> None:
        for sink in self._kv_sinks:
            sink(events)

    async def abort(self, request_id: str) -> None:
        running = self._running.get(request_id)
        if running is None:
            return  # finished, never seen or already aborted: idempotent
        running.aborted = True
        _resolve(running.wakeup)

    async def shutdown(self) -> None:
        for request_id in list(self._running):
            await self.abort(request_id)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        if request.request_id in self._running:
            raise EngineError(f"request id {request.request_id!r} is already running")
        running = _Running(request)
        self._running[request.request_id] = running
        prompt = request.prompt_token_ids
        counts = {"num_prompt_tokens": len(prompt), "num_cached_tokens": 0}
        try:
            try:
                counts["num_cached_tokens"] = await self._prefill(running)
            except _Aborted:
                yield GenerateChunk(finish_reason="abort", **counts)
                return
            if request.constraint is not None:
                await _vocabulary_loaded()
            stamped = False
            async with contextlib.aclosing(self._decode(running, self._plan(request))) as steps:
                async for token_ids, finish in steps:
                    chunk = GenerateChunk(token_ids=token_ids, finish_reason=finish, **counts)
                    if request.sampling.logprobs is not None:
                        chunk.logprobs = self._logprobs(running, token_ids)
                    if token_ids and not stamped:
                        chunk.engine_ttft_s = running.first_token_at - running.arrived
                        stamped = True
                    yield chunk
        finally:
            if running.prompt_keys is not None:  # aborted before prefill: nothing to cache
                self.cache.insert(
                    [*prompt, *running.output], running.prompt_keys, request.session_id
                )
            if running.decoding:
                self._num_decoding -= 1
            del self._running[request.request_id]

    def _logprobs(self, running: _Running, token_ids: list[int]) -> list[TokenLogprob]:
        # The chunk's tokens are the last ones of the output so far.
        first = len(running.output) - len(token_ids)
        top = running.request.sampling.logprobs or 0
        return [
            token_logprobs(self.config.seed, first + offset, token, top)
            for offset, token in enumerate(token_ids)
        ]

    # -- Metrics ---------------------------------------------------------------------------

    def cache_stats(self) -> PrefixCacheStats:
        """The prefix-cache model's counters, for metrics."""
        return self.cache.stats()

    # -- Timing ----------------------------------------------------------------------------

    async def _prefill(self, running: _Running) -> int:
        """Prefill the prompt's uncached tokens; returns the prompt tokens served from cache.

        Prefills run one at a time in arrival order because they share one accelerator: cache
        misses cost the replica throughput, not only the request latency, which is what makes
        cache-affine routing matter. The cache is looked up when the prefill starts, as vLLM's
        scheduler does, so a request queued behind one with the same prefix reuses its blocks.

        Each prefill ends at a time the model sets (after the arrival and the prefill before
        it), not after a sleep of its length: a timer that fires late on a busy host delays
        this prefill, not every one queued behind it.
        """
        queue = self._prefill_queue
        queue.append(running)
        try:
            while queue[0] is not running:
                await self._sleep(running, None)  # woken when the request ahead leaves
            prompt = running.request.prompt_token_ids
            session = running.request.session_id
            hit_keys = self.cache.lookup_blocks(prompt, session)
            cached = len(hit_keys) * self.cache.block_size
            uncached_s = (len(prompt) - cached) / self.config.prefill_tokens_per_s
            running.prefilled_at = max(running.arrived, self._prefill_free_at) + uncached_s
            self._prefill_free_at = running.prefilled_at
            await self._sleep(running, running.prefilled_at - time.monotonic())
            # vLLM caches a prompt's full blocks once computed, before the request ends.
            running.prompt_keys = self.cache.insert(prompt, hit_keys, session)
            return cached
        finally:
            was_first = queue[0] is running
            queue.remove(running)
            if was_first and running.prompt_keys is None:
                # Aborted mid-prefill: the accelerator is free now, not when it would have ended.
                self._prefill_free_at = min(self._prefill_free_at, time.monotonic())
            if was_first and queue:
                _resolve(queue[0].wakeup)

    async def _sleep(self, running: _Running, seconds: float | None) -> None:
        """Sleep (None: until woken) that `abort` cuts short; raises `_Aborted` once aborted."""
        if running.aborted:
            raise _Aborted
        if seconds is None or seconds > 0:
            loop = asyncio.get_running_loop()
            wakeup: asyncio.Future[None] = loop.create_future()
            timer = None if seconds is None else loop.call_later(seconds, _resolve, wakeup)
            running.wakeup = wakeup
            try:
                await wakeup
            finally:
                if timer is not None:
                    timer.cancel()
                running.wakeup = None
        if running.aborted:
            raise _Aborted

    def _step_seconds(self) -> float:
        others = max(self._num_decoding - 1, 0)
        return (1 + self.config.batch_slowdown * others) / self.config.decode_tokens_per_s

    async def _decode(
        self, running: _Running, plan: list[_Step]
    ) -> AsyncIterator[tuple[list[int], FinishReason | None]]:
        """Play ``plan`` one token per decode step; the last pair carries the finish reason.

        A token exists once its step has passed, timed from the modelled end of prefill, so
        ``running.first_token_at`` is the time model's and a late timer is caught up on.
        Tokens that fall due within the timer resolution go out together, so a fast decode
        rate costs few wake-ups and still keeps its rate.
        """
        running.decoding = True
        self._num_decoding += 1
        sampling = running.request.sampling
        stop_ids = frozenset(sampling.stop_token_ids)
        output = running.output
        pending: list[int] = []
        due = running.prefilled_at
        try:
            if sampling.max_tokens <= len(output):
                yield [], "length"
                return
            for step in plan:
                if isinstance(step, _Fail):
                    if pending:
                        yield pending, None
                        pending = []
                    raise EngineError(step.message, code=step.code)
                if isinstance(step, _Sleep):
                    if pending:
                        yield pending, None
                        pending = []
                    await self._sleep(running, step.seconds)
                    due = time.monotonic()
                    continue
                honour_stop = isinstance(step, _Sample) or step.honour_stop
                for token in step.tokens:
                    due += self._step_seconds()
                    wait = due - time.monotonic()
                    if wait > _MIN_SLEEP_S:
                        if pending:
                            yield pending, None
                            pending = []
                        await self._sleep(running, wait)
                    elif running.aborted:
                        raise _Aborted
                    if not output:
                        running.first_token_at = due
                    pending.append(token)
                    output.append(token)
                    if honour_stop and token in stop_ids:
                        yield pending, "stop"
                        return
                    if len(output) >= sampling.max_tokens:
                        yield pending, "length"
                        return
            yield pending, "stop"
        except _Aborted:
            yield pending, "abort"

    # -- What to say ----------------------------------------------------------------------

    def _plan(self, request: GenerateRequest) -> list[_Step]:
        prompt = request.prompt_token_ids
        index = self.script.turn_index(last_message_text(prompt)) if self.script.turns else None
        if index is not None:
            if request.constraint is not None:
                self._check_turn(index, request.constraint)
            return self._turn_plan(index)
        # Same prompt and seed, same answer; Random(int) is stable across processes.
        seed = hash((self.config.seed, tuple(prompt)))
        sampled = _to_sample(request.constraint)
        if sampled is not None:
            return [_Sample(MaskedSampler(_matcher(sampled), seed))]
        rng = random.Random(seed)
        tokens = _harmony().default_answer(len(prompt), self.config.default_output_tokens, rng)
        return [_Emit(tuple(tokens), honour_stop=True)]

    def _check_turn(self, index: int, constraint: CompletionConstraint) -> None:
        key = (index, constraint)
        if key not in self._checked:
            self._checked[key] = _turn_violation(self._turn_plan(index), constraint)
        violation = self._checked[key]
        if violation is not None:
            raise EngineError(
                f"simulated engine: scripted turn {index} breaks the request's constraint "
                f"({violation}); the test script is misconfigured"
            )

    def _turn_plan(self, index: int) -> list[_Step]:
        plan = self._plans.get(index)
        if plan is None:
            plan = self._plans[index] = _harmony().turn_plan(self.script.turns[index])
        return plan


async def _vocabulary_loaded() -> None:
    """The llguidance vocabulary, built once (about a second) off the event loop, on the first
    constrained request: unconstrained requests and engine start-up never pay for it. Grammar
    compiles (milliseconds, cached) and per-token masks (about 0.2 ms) run inline."""
    global _VOCABULARY_LOADED
    if not _VOCABULARY_LOADED:
        await asyncio.to_thread(harmony_tokenizer)
        _VOCABULARY_LOADED = True


def _to_sample(constraint: CompletionConstraint | None) -> CompletionConstraint | None:
    """What an unscripted completion is sampled under, or None for the default answer.

    The default answer (analysis, then a free final message) obeys any constraint that allows
    a free final answer. Where the final answer must be JSON but a tool call is not required,
    the sampler answers and calls no tool: this engine never calls a tool on its own.
    """
    if constraint is None:
        return None
    if constraint.final is None:
        return constraint  # a call is required (tool_choice required or named)
    if constraint.final.free:
        return None
    return replace(constraint, tool_calls=())


def _matcher(constraint: CompletionConstraint, *, compact_json: bool = True) -> Any:
    try:
        return new_matcher(constraint, compact_json=compact_json)
    except ConstraintError as exc:
        # A schema or grammar llguidance rejects: the request's fault.
        message = f"the request's constraint cannot be compiled: {exc}"
        raise EngineError(message, "invalid_request") from exc


def _turn_violation(plan: Sequence[_Step], constraint: CompletionConstraint) -> str | None:
    """Why a scripted turn breaks ``constraint``, or None if it obeys it.

    A turn may play several messages ending in ``<|call|>`` (calls a real model would make in
    successive completions): each stop token ends one completion, checked from the grammar's
    start; the ``<|start|>assistant`` that opens the next one belongs to no completion. The last
    completion must end too, unless the turn fails on purpose.
    """
    harmony = _harmony()
    tokens = [token for step in plan if isinstance(step, _Emit) for token in step.tokens]
    completions: list[list[int]] = [[]]
    for token in tokens:
        completions[-1].append(token)
        if token in (RETURN_TOKEN, CALL_TOKEN):
            completions.append([])
    if not completions[-1]:
        completions.pop()
    for number, completion in enumerate(completions):
        if number and tuple(completion[: len(harmony.start_assistant)]) == harmony.start_assistant:
            completion = completion[len(harmony.start_assistant) :]
        # A script's JSON is json.dumps'd (spaces after , and :): valid JSON all the same.
        matcher = _matcher(constraint, compact_json=False)
        accepted = matcher.validate_tokens(completion)
        # validate_tokens does not count the grammar's last token (its stop token).
        if accepted < len(completion) - 1 or not matcher.consume_tokens(completion):
            seen = harmony.encoding.decode(completion[: accepted + 1])
            return f"not allowed at the end of {seen!r}"
    ends = bool(completions) and completions[-1][-1:] in ([RETURN_TOKEN], [CALL_TOKEN])
    if not ends and not any(isinstance(step, _Fail) for step in plan):
        return "it ends before the answer or tool call the constraint requires"
    return None


def _resolve(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)
