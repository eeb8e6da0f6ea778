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

    python scripts/tiny_gpt_oss.py /tmp/tiny-gpt-oss [--tokenizer]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# o200k_harmony: the ids harmony renders and parses.
VOCAB_SIZE = 201088
RETURN, CALL, END_OF_TEXT = 200002, 200012, 199999


def write_checkpoint(out: Path, seed: int = 0) -> None:
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
    model.save_pretrained(out, safe_serialization=True)
    # No quantization_config: vLLM then loads the experts unquantized (bf16).
    written = json.loads((out / "config.json").read_text())
    written.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(written, indent=2))
    # vLLM merges these into every request's stop ids; harmony's own stop ids are ours.
    generation = {"eos_token_id": [RETURN, CALL, END_OF_TEXT], "pad_token_id": END_OF_TEXT}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", action="store_true", help="also write tokenizer.json")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    write_checkpoint(args.out, args.seed)
    if args.tokenizer:
        from serve_app.constraints.vocab import write_hf_tokenizer

        write_hf_tokenizer(args.out)
    print(f"tiny gpt-oss checkpoint in {args.out}")


if __name__ == "__main__":
    main()
