"""Write a tiny, randomly initialised gpt-oss checkpoint, for running the real vLLM engine on CPU.

The architecture is gpt-oss's (``GptOssForCausalLM``: attention sinks, alternating sliding and
full attention, a mixture of experts) at a toy size, with harmony's whole vocabulary, so prompts
rendered by serve_app are valid input. Its output is random tokens: it exercises the engine
wrapper and the stream translator's robustness, not answers. ``--tokenizer`` also writes
gpt-oss's ``tokenizer.json``, converted offline from harmony's vocab (about 6 s, 28 MB): token
ids still go in and out, but the engine loads the tokenizer by default because vLLM's structured
outputs (constrained decoding) need it. Without it, serve the checkpoint with
``skip_tokenizer_init: true`` (constrained requests are then refused). Needs ``transformers``
and ``torch`` (the vLLM environment has both).

``--answer-tokens N`` writes weights that answer instead of babbling: after
``<|start|>assistant`` (the end of every prompt serve_app and vLLM's own server render) the model
writes ``<|channel|>final<|message|>``, ``N - 4`` ordinary word tokens, then ``<|return|>``: a
well-formed harmony answer of exactly ``N`` tokens, at temperature 1 as greedily (the next token
depends on the current one only, by a margin of 40 logits or more). Same shapes, so the same
compute per token: the attention and experts' outputs are zeroed (their projections still run),
each scripted token's embedding is a direction of its own and the output head maps it to the
next one. loadtests/bench_peer.py serves it, so that vLLM's own Responses API, which streams
nothing of random tokens until their end (its harmony parser never sees a message open), streams
each token as serve_app does.

    python scripts/tiny_gpt_oss.py /tmp/tiny-gpt-oss [--tokenizer] [--answer-tokens 64]
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

# o200k_harmony: the ids harmony renders and parses.
VOCAB_SIZE = 201088
RETURN, CALL, END_OF_TEXT = 200002, 200012, 199999
CHANNEL, MESSAGE = 200005, 200008
FIRST_ORDINARY_END = 199998  # o200k's ordinary tokens are 0..199997
SCRIPT_SCALE = 6.0  # the output head's scale for a scripted successor (script_answer)


def write_checkpoint(out: Path, seed: int = 0, answer_tokens: int = 0) -> None:
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(seed)
    config = GptOssConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=128,
        max_position_embeddings=16384,
        layer_types=["sliding_attention", "full_attention"],
        eos_token_id=RETURN,
        pad_token_id=END_OF_TEXT,
        torch_dtype="bfloat16",
    )
    model = GptOssForCausalLM(config).to(torch.bfloat16)
    if answer_tokens:
        script_answer(model, answer_chain(answer_tokens), seed)
    model.save_pretrained(out, safe_serialization=True)
    # No quantization_config: vLLM then loads the experts unquantized (bf16).
    written = json.loads((out / "config.json").read_text())
    written.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(written, indent=2))
    # vLLM merges these into every request's stop ids; harmony's own stop ids are ours.
    generation = {"eos_token_id": [RETURN, CALL, END_OF_TEXT], "pad_token_id": END_OF_TEXT}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))


def answer_chain(answer_tokens: int) -> list[int]:
    """The token ids the scripted model writes after ``<|start|>assistant``, that token first:
    ``assistant <|channel|> final <|message|>``, ``answer_tokens - 4`` distinct ordinary tokens
    that each decode to a space and a lower-case word, ``<|return|>``."""
    from serve_app.harmony.encoding import get_encoding

    encoding = get_encoding()
    (assistant,) = encoding.encode("assistant", allowed_special=set())
    (final,) = encoding.encode("final", allowed_special=set())
    words: list[int] = []
    token = 1000  # past the bytes and the shortest merges
    while len(words) < answer_tokens - 4 and token < FIRST_ORDINARY_END:
        text = encoding.decode([token])  # lossy: a partial UTF-8 sequence is not a word
        word = text[1:]
        plain = len(word) > 2 and word.isascii() and word.isalpha() and word.islower()
        if text.startswith(" ") and plain and token not in (assistant, final):
            words.append(token)
        token += 1
    if len(words) < answer_tokens - 4:
        raise ValueError(f"{answer_tokens} tokens: more than o200k has lower-case words")
    return [assistant, CHANNEL, final, MESSAGE, *words, RETURN]


def script_answer(model: Any, chain: list[int], seed: int) -> None:
    """Each token of ``chain`` but the last made to predict the next one, whatever came before:
    the layers add nothing to the residual stream (attention's output projection and every
    expert's down projection and biases zeroed), so the last hidden state is the current token's
    embedding, normalised; each scripted token's embedding is a random unit direction and the
    output head's row of its successor that direction scaled, every other row zero."""
    import torch

    generator = torch.Generator().manual_seed(seed + 1)
    hidden = model.config.hidden_size
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.self_attn.o_proj.bias.zero_()
            layer.mlp.experts.down_proj.zero_()
            layer.mlp.experts.down_proj_bias.zero_()
        directions = torch.randn(len(chain) - 1, hidden, generator=generator)
        directions /= directions.norm(dim=1, keepdim=True)
        # RMS-normalised, a unit direction has norm sqrt(hidden): the successor's logit is
        # SCRIPT_SCALE * sqrt(hidden) (~68 at hidden 128), any other scripted token's at most
        # its cosine times that (random directions in 128 dimensions: under ~0.45), the rest 0.
        model.lm_head.weight.zero_()
        for index, (token, successor) in enumerate(itertools.pairwise(chain)):
            model.model.embed_tokens.weight[token] = directions[index].to(torch.bfloat16)
            row = directions[index] * SCRIPT_SCALE
            model.lm_head.weight[successor] = row.to(torch.bfloat16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", action="store_true", help="also write tokenizer.json")
    parser.add_argument(
        "--answer-tokens",
        type=int,
        default=0,
        help="answer every prompt with a well-formed final message of this many tokens (>= 5); "
        "0: random weights, random tokens",
    )
    args = parser.parse_args()
    if args.answer_tokens and args.answer_tokens < 5:
        parser.error("--answer-tokens is at least 5: the header, one word, <|return|>")
    args.out.mkdir(parents=True, exist_ok=True)
    write_checkpoint(args.out, args.seed, args.answer_tokens)
    if args.tokenizer:
        from serve_app.constraints.vocab import write_hf_tokenizer

        write_hf_tokenizer(args.out)
    print(f"tiny gpt-oss checkpoint in {args.out}")


if __name__ == "__main__":
    main()
