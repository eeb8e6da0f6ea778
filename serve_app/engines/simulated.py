"""The simulated engine: a CPU stand-in for vLLM, honest about being one.

It emits well-formed harmony completions made with the real encoding, models a block-level
prefix KV cache (so routing and load tests measure real cache behaviour) and prefill/decode
time. It has no model: by default it answers with a short placeholder that says so and never
calls a tool. Tests script it with a file of assistant turns (see `EngineScript`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from serve_app.engines.base import Engine, EngineError, GenerateChunk, GenerateRequest
from serve_app.engines.prefix_cache import PrefixKVCache
from serve_app.harmony.encoding import get_encoding

logger = logging.getLogger(__name__)

SCRIPT_ENV = "SERVE_APP_SIM_SCRIPT"
START_TOKEN = 200006  # <|start|>
_SPECIAL = re.compile(r"<\|[a-z_]+\|>")
_FILLER = " The simulated engine streams placeholder words to model decode time."


class ScriptTurn(BaseModel):
    """One assistant turn to play when ``match`` is found in the prompt's last message.

    Items, in order: ``{reasoning: str}``, ``{preamble: str}`` (commentary text),
    ``{text: str}`` (final answer), ``{function_call: {name, arguments, namespace?}}``,
    ``{custom_tool_call: {name, input}}``, ``{raw: str}`` (harmony text as is, for malformed
    output), ``{fail: str}`` (the engine fails there), ``{sleep: seconds}``.
    """

    model_config = ConfigDict(extra="forbid")
    match: str | None = None
    items: list[dict[str, Any]] = Field(min_length=1)

    @model_validator(mode="after")
    def _known_items(self) -> ScriptTurn:
        known = {
            "reasoning",
            "preamble",
            "text",
            "function_call",
            "custom_tool_call",
            "raw",
            "fail",
            "sleep",
        }
        for item in self.items:
            if len(item) != 1 or next(iter(item)) not in known:
                raise ValueError(f"a script item is one of {sorted(known)}: got {item}")
        return self


class EngineScript(BaseModel):
    turns: list[ScriptTurn] = Field(default_factory=list)

    @classmethod
    def load(cls, source: str | Path | dict[str, Any]) -> EngineScript:
        if isinstance(source, dict):
            return cls.model_validate(source)
        return cls.model_validate(yaml.safe_load(Path(source).read_text()))

    def turn_for(self, last_message: str) -> ScriptTurn | None:
        for turn in self.turns:
            if turn.match is None or re.search(turn.match, last_message):
                return turn
        return None


class SimulatedEngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    block_size: int = Field(default=16, gt=0)
    kv_cache_tokens: int = Field(default=262_144, gt=0)
    # Prefill speed for uncached prompt tokens, and decode speed of one request alone.
    prefill_tokens_per_s: float = Field(default=20_000, gt=0)
    decode_tokens_per_s: float = Field(default=200, gt=0)
    # Each other request decoding at the same time slows a step by this fraction.
    batch_slowdown: float = Field(default=0.02, ge=0)
    # Length of the default placeholder answer, in tokens.
    default_output_tokens: int = Field(default=64, ge=8)
    # A script file (YAML/JSON) or the script itself; falls back to $SERVE_APP_SIM_SCRIPT.
    script: str | dict[str, Any] | None = None


@dataclass
class _Segment:
    tokens: list[int]
    fail: str | None = None
    sleep_s: float = 0.0


class SimulatedEngine(Engine):
    def __init__(self, config: SimulatedEngineConfig | None = None) -> None:
        self.config = config or SimulatedEngineConfig()
        self.cache = PrefixKVCache(self.config.block_size, self.config.kv_cache_tokens)
        self._script = _load_script(self.config.script)
        self._ongoing: set[str] = set()
        self._aborted: set[str] = set()

    async def start(self) -> None:
        get_encoding()  # load the vocab before the first request
        logger.info(
            "simulated engine (no model weights): %d scripted turns, KV cache %d tokens",
            len(self._script.turns),
            self.config.kv_cache_tokens,
        )

    def num_ongoing_requests(self) -> int:
        return len(self._ongoing)

    async def abort(self, request_id: str) -> None:
        if request_id in self._ongoing:
            self._aborted.add(request_id)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        if request.request_id in self._ongoing:
            raise EngineError(f"request id {request.request_id} is already running")
        self._ongoing.add(request.request_id)
        output: list[int] = []
        try:
            prompt = request.prompt_token_ids
            cached = self.cache.lookup(prompt)
            await asyncio.sleep((len(prompt) - cached) / self.config.prefill_tokens_per_s)
            head = GenerateChunk(num_prompt_tokens=len(prompt), num_cached_tokens=cached)
            async for chunk in self._decode(request, self._plan(prompt), output):
                chunk.num_prompt_tokens, chunk.num_cached_tokens = len(prompt), cached
                if head is not None:
                    chunk, head = head.merge(chunk), None
                yield chunk
        finally:
            self.cache.insert([*request.prompt_token_ids, *output])
            self._ongoing.discard(request.request_id)
            self._aborted.discard(request.request_id)

    async def _decode(
        self, request: GenerateRequest, plan: list[_Segment], output: list[int]
    ) -> AsyncIterator[GenerateChunk]:
        """Emit the plan's tokens at the modelled decode rate, as many per chunk as are due."""
        max_tokens = request.sampling.max_tokens
        due_at = time.monotonic()
        for segment in plan:
            if segment.sleep_s:
                await asyncio.sleep(segment.sleep_s)
                due_at = time.monotonic()
            if segment.fail is not None:
                raise EngineError(segment.fail)
            pending: list[int] = []
            for token in segment.tokens:
                if request.request_id in self._aborted:
                    yield GenerateChunk(token_ids=pending, finish_reason="abort")
                    return
                pending.append(token)
                output.append(token)
                if len(output) >= max_tokens:
                    yield GenerateChunk(token_ids=pending, finish_reason="length")
                    return
                due_at += self._step_seconds()
                wait = due_at - time.monotonic()
                if wait > 0.001:  # sleep only when a step is due: fast rates emit chunks
                    yield GenerateChunk(token_ids=pending)
                    pending = []
                    await asyncio.sleep(wait)
            if pending:
                yield GenerateChunk(token_ids=pending)
        yield GenerateChunk(finish_reason="stop")

    def _step_seconds(self) -> float:
        others = max(len(self._ongoing) - 1, 0)
        return (1 + self.config.batch_slowdown * others) / self.config.decode_tokens_per_s

    def _plan(self, prompt: Sequence[int]) -> list[_Segment]:
        last_message = _last_message_text(prompt)
        turn = self._script.turn_for(last_message)
        if turn is None:
            return [_Segment(self._default_answer(prompt, last_message))]
        return _turn_segments(turn)

    def _default_answer(self, prompt: Sequence[int], last_message: str) -> list[int]:
        """A harmless placeholder: short reasoning, then a final answer padded to length."""
        encoding = get_encoding()
        # The words only: special tokens in the snippet would end the message early.
        content = _SPECIAL.sub(" ", last_message.split("<|message|>")[-1])
        snippet = " ".join(content.split())[:80]
        head = encoding.encode(
            f"<|channel|>analysis<|message|>The last message reads: {snippet!r}. I am the "
            "simulated engine and only say so.<|end|><|start|>assistant<|channel|>final"
            "<|message|>This answer comes from serve_app's simulated engine (no model "
            f"weights); it read {len(prompt)} prompt tokens.",
            allowed_special="all",
        )
        filler = encoding.encode(_FILLER)
        body = list(head)
        while len(body) < self.config.default_output_tokens - 1:
            body.extend(filler)
        return [*body[: max(self.config.default_output_tokens - 1, len(head))], 200002]


def _load_script(source: str | dict[str, Any] | None) -> EngineScript:
    source = source or os.environ.get(SCRIPT_ENV)
    return EngineScript.load(source) if source else EngineScript()


def _last_message_text(prompt: Sequence[int]) -> str:
    """The message before the trailing ``<|start|>assistant``: the user's task, a tool output."""
    starts = [index for index, token in enumerate(prompt) if token == START_TOKEN]
    if len(starts) < 2:
        return ""
    return get_encoding().decode(list(prompt[starts[-2] : starts[-1]]))


def _turn_segments(turn: ScriptTurn) -> list[_Segment]:
    encoding = get_encoding()
    segments: list[_Segment] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            text = "<|start|>assistant".join(texts)
            segments.append(_Segment(encoding.encode(text, allowed_special="all")))
            texts.clear()

    for item in turn.items:
        ((kind, value),) = item.items()
        if kind in ("fail", "sleep"):
            flush()
            segments.append(
                _Segment([], fail=str(value)) if kind == "fail" else _Segment([], sleep_s=value)
            )
            continue
        texts.append(_harmony_message(kind, value))
    flush()
    return _join_messages(segments)


def _join_messages(segments: list[_Segment]) -> list[_Segment]:
    """Messages after the first need their own ``<|start|>assistant`` header."""
    start = get_encoding().encode("<|start|>assistant", allowed_special="all")
    seen_tokens = False
    for segment in segments:
        if segment.tokens:
            if seen_tokens:
                segment.tokens = [*start, *segment.tokens]
            seen_tokens = True
    return segments


def _harmony_message(kind: str, value: Any) -> str:
    if kind == "reasoning":
        return f"<|channel|>analysis<|message|>{value}<|end|>"
    if kind == "preamble":
        return f"<|channel|>commentary<|message|>{value}<|end|>"
    if kind == "text":
        return f"<|channel|>final<|message|>{value}<|return|>"
    if kind == "function_call":
        arguments = value.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        recipient = f"{value.get('namespace') or 'functions'}.{value['name']}"
        return (
            f"<|channel|>commentary to={recipient} <|constrain|>json<|message|>{arguments}<|call|>"
        )
    if kind == "custom_tool_call":
        recipient = f"functions.{value['name']}"
        return f"<|channel|>commentary to={recipient}<|message|>{value['input']}<|call|>"
    return str(value)  # raw
