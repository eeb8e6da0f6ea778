"""Benchmark: what ``moderation`` adds to a response's time to first token.

The app in this process over real HTTP (uvicorn), the simulated engine as gpt-oss-120b and a
second simulated engine as gpt-oss-safeguard-20b on a deployment of its own (its time model:
prefill and decode rates below; it reasons a little, then answers every category of the shipped
policy in JSON). The same streamed requests (a fresh ~``--prompt-words`` prompt each, so no
prefix is cached), ``--concurrency`` at a time, the modes taking turns batch by batch:

- ``score``: results only; nothing waits for the classifier, TTFT should not move;
- ``block`` on the input: output is held until the input's verdict, judged beside the prefill,
  so TTFT is the longer of the two, not their sum;
- ``block`` on both: the output's windows are judged as it streams, TTFT as above.

Prints, per mode, TTFT (request sent to the first output delta, reasoning or text) p50/p90 and
its added p50/p90 over no moderation, the judgement's own time (the classifier's request, from
the ingress), and the bound the docs state: TTFT with ``block`` <= max(TTFT without, one
judgement) + a small overhead, and never more than ``timeout_s`` over TTFT without.

    python loadtests/bench_moderation.py --requests 24 --concurrency 1

This is a benchmark, not a test: it prints numbers and asserts nothing. One run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from serve_app.config import AppArgs, EngineConfig, ModerationArgs  # noqa: E402
from serve_app.engines.base import GenerateChunk, GenerateRequest  # noqa: E402
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig  # noqa: E402
from serve_app.protocol.moderation import OPENAI_CATEGORIES  # noqa: E402
from serve_app.serving.engine.client import InProcessEngineClient  # noqa: E402
from tests.support.helpers import in_process_api, on_uvicorn  # noqa: E402

MODEL = "gpt-oss-120b"
CLASSIFIER = "gpt-oss-safeguard-20b"
# gpt-oss-120b as configs/local.yaml models it.
MAIN = {"prefill_tokens_per_s": 20_000, "decode_tokens_per_s": 200, "default_output_tokens": 96}
# gpt-oss-safeguard-20b: 3.6B active parameters against 5.1B, on a GPU of its own: faster.
SCORES = ", ".join(f'"{name}": 0.01' for name in OPENAI_CATEGORIES)
ANSWER = f'{{"violation": 0, "categories": {{{SCORES}}}}}'
CLASSIFIER_TURNS = {
    "turns": [
        {
            "items": [
                {"reasoning": "The content is an ordinary request. " * 4},
                {"text": ANSWER},
            ]
        }
    ]
}
CLASSIFIER_ENGINE = {
    "prefill_tokens_per_s": 40_000,
    "decode_tokens_per_s": 400,
    "script": CLASSIFIER_TURNS,
}
MODES: dict[str, dict[str, Any] | None] = {
    "none": None,
    "score": {"input": {"mode": "score"}, "output": {"mode": "score"}},
    "block input": {"input": {"mode": "block"}, "output": {"mode": "score"}},
    "block both": {"input": {"mode": "block"}, "output": {"mode": "block"}},
}


class Timed:
    """The classifier's engine client, timing each judgement from the ingress."""

    def __init__(self, inner: InProcessEngineClient) -> None:
        self._inner = inner
        self.input_judgements: list[float] = []

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        started = time.monotonic()
        try:
            async for chunk in self._inner.stream(request):
                yield chunk
        finally:
            if request.request_id.endswith("-mod-input"):
                self.input_judgements.append(time.monotonic() - started)

    async def ping(self) -> None: ...

    async def await_routable(self, session_id: str) -> bool:
        return True


def prompt(index: int, words: int) -> str:
    return f"Request {index}: " + " ".join(f"w{index}x{n}" for n in range(words))


async def ttft(client: httpx.AsyncClient, body: dict[str, Any]) -> float:
    """Seconds from sending the request to its first output delta."""
    sent = time.monotonic()
    first: float | None = None
    async with client.stream("POST", "/v1/responses", json=body) as answer:
        # Read to its end, so the next request finds the engine free.
        async for line in answer.aiter_lines():
            if first is None and line.startswith("data:") and '.delta"' in line:
                first = time.monotonic() - sent
    if first is None:
        raise RuntimeError("the stream had no output delta")
    return first


async def run_batch(
    client: httpx.AsyncClient, mode: str, size: int, words: int, base: int
) -> list[float]:
    """``size`` requests of ``mode`` at once, their TTFTs."""
    policy = MODES[mode]

    async def one(index: int) -> float:
        body: dict[str, Any] = {
            "model": MODEL,
            "input": prompt(base + index, words),
            "stream": True,
        }
        if policy is not None:
            body["moderation"] = {"model": CLASSIFIER, "policy": policy}
        return await ttft(client, body)

    return list(await asyncio.gather(*(one(i) for i in range(size))))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def main(args: argparse.Namespace) -> None:
    classifier = SimulatedEngine(SimulatedEngineConfig.model_validate(CLASSIFIER_ENGINE))
    await classifier.start()
    timed = Timed(InProcessEngineClient(classifier))
    app_args = AppArgs(
        moderation=ModerationArgs(engine=EngineConfig(options=CLASSIFIER_ENGINE), timeout_s=5)
    )
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            in_process_api(
                Path(tmp) / "bench.db",
                app_args,
                engine=SimulatedEngineConfig.model_validate(MAIN),
                moderation=timed,
            ) as api,
            on_uvicorn(api) as url,
            httpx.AsyncClient(base_url=url, timeout=60) as client,
        ):
            # Warm-up: the vocabulary, the policy's prefix in the classifier's cache.
            await run_batch(client, "score", 2, args.prompt_words, 100_000)
            results: dict[str, list[float]] = {mode: [] for mode in MODES}
            judgements: dict[str, list[float]] = {mode: [] for mode in MODES}
            # The modes take turns, a batch each, so a busy moment of the host falls on all.
            for batch in range(max(1, args.requests // args.concurrency)):
                for number, mode in enumerate(MODES):
                    timed.input_judgements.clear()
                    base = (batch * len(MODES) + number) * args.concurrency
                    results[mode] += await run_batch(
                        client, mode, args.concurrency, args.prompt_words, base
                    )
                    judgements[mode] += timed.input_judgements
    print(
        f"{args.requests} streamed requests per mode, {args.concurrency} at a time, prompts of "
        f"~{args.prompt_words} words (simulated engines: gpt-oss-120b prefill "
        f"{MAIN['prefill_tokens_per_s']}/s decode {MAIN['decode_tokens_per_s']}/s; "
        f"safeguard prefill {CLASSIFIER_ENGINE['prefill_tokens_per_s']}/s decode "
        f"{CLASSIFIER_ENGINE['decode_tokens_per_s']}/s)"
    )
    none = results["none"]
    base50, base90 = pct(none, 0.5), pct(none, 0.9)
    print(f"{'mode':<12} {'TTFT p50':>9} {'p90':>7} {'added p50':>10} {'p90':>7} {'judge p50':>10}")
    for mode in MODES:
        values = results[mode]
        judged = judgements[mode]
        p50, p90 = pct(values, 0.5), pct(values, 0.9)
        judge = f"{statistics.median(judged) * 1000:8.0f}ms" if judged else f"{'-':>10}"
        print(
            f"{mode:<12} {p50 * 1000:7.0f}ms {p90 * 1000:5.0f}ms "
            f"{(p50 - base50) * 1000:8.0f}ms {(p90 - base90) * 1000:5.0f}ms {judge}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--prompt-words", type=int, default=1500)
    asyncio.run(main(parser.parse_args()))
