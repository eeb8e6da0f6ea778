"""Text harmony's tokenizer would take unbounded time over is a 400 at the door.

Byte-pair merging is quadratic in the length of one pre-tokenized piece (a run of letters, of
punctuation, or of whitespace), in Rust, holding the GIL: 200 kB of one letter blocked the
ingress's event loop for 16 s (serve_app.harmony.pieces). Real clients through the app in this
process; the same lengths in words are served."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
from openai import AsyncOpenAI

from serve_app.harmony.pieces import MAX_PIECE_CHARS, MAX_RUN_CHARS, long_piece
from tests.support import MODEL
from tests.support.helpers import in_process_api, sdk_client

OVER = MAX_PIECE_CHARS + 1


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[AsyncOpenAI]:
    async with in_process_api(tmp_path / "pieces.db") as api:
        yield sdk_client(api)


@pytest.mark.parametrize(
    ("text", "length"),
    [
        ("y" * OVER, OVER),  # letters
        ("y\u0301" * (OVER // 2 + 1), OVER + 1),  # letters and combining marks: one piece
        ("!" * OVER, OVER),  # punctuation
        (" " * OVER, OVER),  # whitespace
        ("y" * 100 + "!" * OVER + "y" * 100, OVER),  # a run inside a longer word
        ("a!" * (MAX_RUN_CHARS // 2 + 1), MAX_RUN_CHARS + 2),  # no break at all, too long to read
    ],
    ids=["letters", "marks", "punctuation", "whitespace", "inside", "unbroken"],
)
def test_a_piece_over_the_limit_is_found(text: str, length: int) -> None:
    assert long_piece(text) == length


@pytest.mark.parametrize(
    "text",
    [
        "y" * MAX_PIECE_CHARS,  # at the limit
        ("y" * 15_000 + "7") * 10,  # digits cut pieces
        ("y" * 15_000 + "!") * 4,  # so do changes between letters and punctuation
        "a!" * (MAX_PIECE_CHARS),  # short pieces, a long word
        "the quick brown fox " * 20_000,  # prose
        "\u0664" * (3 * MAX_PIECE_CHARS),  # other digits, cut by threes
    ],
    ids=["at-limit", "digits", "punctuation", "alternating", "prose", "arabic-digits"],
)
def test_text_without_such_a_piece_passes(text: str) -> None:
    assert long_piece(text) == 0


async def test_a_request_with_a_long_piece_is_a_400_naming_its_field(client: AsyncOpenAI) -> None:
    cases = {
        "input": "y" * OVER,
        "input[1].content[0].text": [
            {"role": "user", "content": "hello"},
            {"role": "user", "content": [{"type": "input_text", "text": "!" * OVER}]},
        ],
    }
    for param, given in cases.items():
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model=MODEL, input=given)
        error = caught.value.body
        assert isinstance(error, dict)
        assert (error["type"], error["param"]) == ("invalid_request_error", param)
        assert f"{OVER:,} characters without a break" in error["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model=MODEL, input="hi", instructions=" " * OVER)
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "instructions"


async def test_the_same_length_in_words_is_served(client: AsyncOpenAI) -> None:
    words = "the quick brown fox jumps " * (3 * MAX_PIECE_CHARS // 26)
    response = await client.responses.create(model=MODEL, input=words, max_output_tokens=16)
    assert response.status in ("completed", "incomplete")


async def test_conversation_items_with_a_long_piece_are_a_400(client: AsyncOpenAI) -> None:
    long_item = {"type": "message", "role": "user", "content": "y" * OVER}
    with pytest.raises(openai.BadRequestError) as caught:
        await client.conversations.create(items=[long_item])
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["param"] == "items[0].content"
    conversation = await client.conversations.create()
    with pytest.raises(openai.BadRequestError) as caught:
        await client.conversations.items.create(conversation.id, items=[long_item])
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["param"] == "items[0].content"
