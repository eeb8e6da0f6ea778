"""Harmony messages as completion tokens, built with the real encoding: a scripted turn's
steps, the default answer, and the prompt's last message (what a script turn matches)."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from functools import cached_property

from serve_app.engines.simulated.script import (
    ScriptBuiltinCall,
    ScriptCustomToolCall,
    ScriptFail,
    ScriptFunctionCall,
    ScriptItem,
    ScriptPreamble,
    ScriptRaw,
    ScriptReasoning,
    ScriptSleep,
    ScriptText,
    ScriptTurn,
)
from serve_app.engines.simulated.steps import Emit, Fail, Sleep, Step
from serve_app.harmony import tools
from serve_app.harmony.encoding import (
    CALL_TOKEN,
    END_TOKEN,
    RETURN_TOKEN,
    START_TOKEN,
    get_encoding,
)

# Single-token words (checked at first use) the default answer is padded with.
_FILLER_WORDS = (
    *("placeholder", "simulated", "engine", "tokens", "stand", "in", "for", "a", "model"),
    *("answer", "decode", "time", "routing", "cache", "block", "prefix", "latency"),
    *("throughput", "replica", "request", "stream", "harmony", "words", "filler", "text"),
)


class HarmonyTokens:
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
            case ScriptBuiltinCall(builtin_call=call):
                body = call.input
                if not isinstance(body, str):
                    body = json.dumps(body, ensure_ascii=False)
                return self.message(f"<|channel|>analysis to={call.to} code", body, CALL_TOKEN)
            case ScriptRaw(raw=text):
                return self.header(text)
        raise TypeError(f"not a message item: {item!r}")

    def turn_plan(self, turn: ScriptTurn) -> list[Step]:
        """A turn's steps; every message after the first gets its own ``<|start|>assistant``."""
        steps: list[Step] = []
        emitted = False
        for item in turn.items:
            if isinstance(item, ScriptFail):
                steps.append(Fail(item.failure.message, item.failure.code))
            elif isinstance(item, ScriptSleep):
                steps.append(Sleep(item.sleep))
            else:
                tokens = self.item_tokens(item)
                if emitted and not isinstance(item, ScriptRaw):
                    tokens = [*self.start_assistant, *tokens]
                steps.append(Emit(tuple(tokens), honour_stop=False))
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


def last_message_text(prompt: Sequence[int]) -> str:
    """Decoded text of the prompt's last message, header included.

    That is the message before the trailing ``<|start|>assistant``: the user's task on a first
    turn, the tool output after a tool call. Empty if the prompt has no message.
    """
    encoder = harmony_tokens()
    end = len(prompt)
    trailer = encoder.start_assistant
    if tuple(prompt[end - len(trailer) :]) == trailer:
        end -= len(trailer)
    start = end - 1
    while start >= 0 and prompt[start] != START_TOKEN:
        start -= 1
    if start < 0:
        return ""
    return encoder.encoding.decode(list(prompt[start:end]))


_HARMONY: HarmonyTokens | None = None


def harmony_tokens() -> HarmonyTokens:
    """The one `HarmonyTokens` of the process (its encoding and filler ids load once)."""
    global _HARMONY
    if _HARMONY is None:
        _HARMONY = HarmonyTokens()
    return _HARMONY
