"""Benchmark: what prompt-cache diagnostics add per request (issue 40, Build 2).

Every response keeps a fingerprint of its rendered prompt (serve_app/protocol/
prompt_cache_diagnostics.py): for prompts of 1k to 128k tokens, prints the CPU of building it
(what every request pays), of writing it as the store's JSON, of reading it back and comparing a
request with it (what a request naming ``comparison_response_id`` pays besides: the request's
own block digests are its fingerprint's, as serving passes them), the two together (what such
a request costs the ingress's event loop) and the bytes it adds to the stored response, beside
the bytes of the prompt's own text for scale. CPU time of this process (``time.process_time``),
the median of ``--repeat`` runs.

    python loadtests/bench_cache_diagnostics.py

This is a benchmark, not a test: it prints numbers and asserts nothing.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from serve_app.protocol.prompt_cache_diagnostics import (
    PromptFingerprint,
    PromptSettings,
    diagnose,
    fingerprint,
)

SETTINGS = PromptSettings(
    model="gpt-oss-120b",
    prompt_cache_key="conversation",
    tools="0" * 16,
    text_format="0" * 16,
    reasoning_effort="medium",
    verbosity="medium",
    compaction=None,
    service_tier="auto",
)
# About four bytes of text per gpt-oss token (o200k_harmony on English and code).
TEXT_BYTES_PER_TOKEN = 4


def cpu_ms(work: Callable[[], object], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        start = time.process_time()
        work()
        runs.append((time.process_time() - start) * 1000)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args()
    rng = random.Random(7)
    print(
        "| prompt tokens | fingerprint ms | to JSON ms | compare ms | on the loop ms "
        "| stored bytes | text bytes |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for tokens in (1_000, 8_000, 32_000, 100_000, 128_000):
        prompt = [rng.randrange(201_088) for _ in range(tokens)]
        # The next turn: the whole prompt, then its answer and a new message.
        following = [*prompt, *(rng.randrange(201_088) for _ in range(300))]
        kept = fingerprint(prompt, SETTINGS)
        text = kept.to_json()
        build = cpu_ms(lambda prompt=prompt: fingerprint(prompt, SETTINGS), args.repeat)
        dump = cpu_ms(kept.to_json, args.repeat)
        blocks = fingerprint(following, SETTINGS).blocks
        compare = cpu_ms(
            lambda text=text, following=following, blocks=blocks: diagnose(
                PromptFingerprint.from_json(text), following, SETTINGS, blocks
            ),
            args.repeat,
        )
        print(
            f"| {tokens:,} | {build:.2f} | {dump:.2f} | {compare:.2f} | {build + compare:.2f} "
            f"| {len(text):,} | {tokens * TEXT_BYTES_PER_TOKEN:,} |"
        )


if __name__ == "__main__":
    main()
