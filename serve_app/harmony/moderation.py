"""gpt-oss-safeguard's prompt and answer, in harmony.

As its guide says (OpenAI cookbook, "User guide for gpt-oss-safeguard"): the policy is the
instructions (a chat "system" message, which gpt-oss's template renders as harmony's developer
message), the content to classify is the user message, and the reasoning effort goes in the
system message; the model reasons in the ``analysis`` channel and writes the format its policy
asks for in the ``final`` channel. Only that final message is read: its text goes to
serve_app.protocol.moderation.parse_answer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

from openai_harmony import (
    Conversation,
    Message,
    RenderConversationConfig,
    Role,
    SystemContent,
)

from serve_app.harmony.encoding import REASONING_EFFORTS, RETURN_TOKEN, STOP_TOKENS, get_encoding

logger = logging.getLogger(__name__)

# Said before the content is cut to its last tokens: the classifier should know it reads a part.
_CUT_NOTE = "[earlier content omitted]\n"


def classifier_prompt(
    policy: str,
    content: str,
    *,
    effort: Literal["low", "medium", "high"] = "low",
    max_content_tokens: int = 8192,
) -> list[int]:
    """The prompt token ids asking gpt-oss-safeguard to judge ``content`` under ``policy``:
    its last ``max_content_tokens`` tokens (the most recent text matters most, and a prompt
    must fit the classifier's context)."""
    encoding = get_encoding()
    content = _last_tokens(content, max_content_tokens)
    system = SystemContent.new().with_reasoning_effort(REASONING_EFFORTS[effort])
    messages = [
        Message.from_role_and_content(Role.SYSTEM, system),
        Message.from_role_and_content(Role.DEVELOPER, f"# Instructions\n\n{policy}"),
        Message.from_role_and_content(Role.USER, content),
    ]
    return encoding.render_conversation_for_completion(
        Conversation.from_messages(messages),
        Role.ASSISTANT,
        RenderConversationConfig(auto_drop_analysis=False),
    )


def _last_tokens(text: str, limit: int) -> str:
    encoding = get_encoding()
    # A token is rarely over 8 characters: encode only the tail that can hold the last ones
    # (a long input costs no more than a short one).
    tail = text[-limit * 8 :]
    tokens = encoding.encode(tail, disallowed_special=())
    if len(tokens) <= limit:
        return tail if tail == text else _CUT_NOTE + tail
    return _CUT_NOTE + encoding.decode_utf8(tokens[-limit:])


def count_tokens(text: str) -> int:
    """Tokens of ``text`` read as text (special-token names too): output windows are measured
    in them."""
    return len(get_encoding().encode(text, disallowed_special=()))


def stop_tokens() -> tuple[int, ...]:
    """Where the classifier's sampling stops: the end of its final answer (or a stray call)."""
    return STOP_TOKENS


def classifier_answer(token_ids: Sequence[int]) -> str | None:
    """The text of the classifier's last ``final`` message in its completion; None when there
    is none (it ran out of tokens reasoning, or wrote no harmony). Never raises: a completion
    harmony cannot parse is read as the text after its last ``<|message|>``."""
    encoding = get_encoding()
    tokens = list(token_ids)
    if not tokens:
        return None
    try:
        messages = encoding.parse_messages_from_completion_tokens(tokens, Role.ASSISTANT)
    except Exception as error:  # malformed harmony: salvage the last message's text
        logger.info("moderation: classifier output not parsed as harmony (%s)", error)
        return _salvaged(tokens)
    finals = [m for m in messages if m.channel == "final"]
    if not finals:
        return None
    return "".join(getattr(part, "text", "") for part in finals[-1].content)


def _salvaged(tokens: list[int]) -> str | None:
    text = get_encoding().decode_utf8([t for t in tokens if t != RETURN_TOKEN])
    _, found, after = text.rpartition("<|message|>")
    return after if found else None
