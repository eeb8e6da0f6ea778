"""scripts/tiny_gpt_oss.py ``--answer-tokens``: the scripted answer is well-formed harmony of
exactly the tokens asked (the weights themselves run in the vLLM stage's environment, which has
torch: loadtests/bench_peer.py serves them)."""

from __future__ import annotations

import sys

import pytest

from serve_app.harmony.encoding import (
    CHANNEL_TOKEN,
    MESSAGE_TOKEN,
    RETURN_TOKEN,
    get_encoding,
)
from tests.support import REPO

sys.path.insert(0, str(REPO / "scripts"))
from tiny_gpt_oss import answer_chain


@pytest.mark.parametrize("tokens", [5, 16, 128, 600])
def test_the_scripted_answer_is_a_final_message_of_the_tokens_asked(tokens: int) -> None:
    chain = answer_chain(tokens)
    encoding = get_encoding()
    assert encoding.decode_utf8(chain[:1]) == "assistant"  # the prompt's last token
    answer = chain[1:]
    assert len(answer) == tokens
    assert answer[:1] == [CHANNEL_TOKEN] and answer[2:3] == [MESSAGE_TOKEN]
    assert answer[-1] == RETURN_TOKEN
    assert len(set(chain)) == len(chain)  # each token predicts one successor only
    text = encoding.decode_utf8(answer)
    assert text.startswith("<|channel|>final<|message|> ") and text.endswith("<|return|>")
    words = encoding.decode_utf8(answer[3:-1]).split(" ")[1:]
    assert len(words) == tokens - 4 and all(word.isalpha() for word in words)


def test_more_words_than_o200k_has_is_an_error() -> None:
    with pytest.raises(ValueError, match="more than o200k"):
        answer_chain(200_000)
