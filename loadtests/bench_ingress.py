"""Benchmark: what the ingress costs over calling the engine handle directly.

Starts the app in-process with the simulated engine decoding fast (so the serving path, not
the engine, is what is measured), then streams the same prompt N times

- through the ingress: HTTP POST /v1/responses with SSE (proxy -> ingress -> engine), and
- through the engine deployment's handle (engine -> caller), no protocol work at all,

and prints time to first event / first chunk and streamed tokens per second for both.

    python loadtests/bench_ingress.py --requests 20 --output-tokens 1024

This is a benchmark, not a test: it prints numbers and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import time
import uuid
from dataclasses import dataclass

import httpx
import ray
from ray import serve

from serve_app.app import build_app
from serve_app.config import AppArgs, EngineConfig
from serve_app.engines.base import GenerateRequest, SamplingSettings
from serve_app.harmony.encoding import CALL_TOKEN, RETURN_TOKEN
from serve_app.harmony.render import render_request
from serve_app.protocol.requests import ResponsesRequest

APP_NAME = "bench"
MODEL = "gpt-oss-120b"


@dataclass
class Sample:
    first_event_s: float
    tokens: int
    stream_s: float  # from the first event to the last

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.stream_s if self.stream_s > 0 else float("nan")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _body(prompt: str) -> dict:
    return {"model": MODEL, "input": prompt, "stream": True, "prompt_cache_key": str(uuid.uuid4())}


async def through_ingress(client: httpx.AsyncClient, url: str, prompt: str) -> Sample:
    start = time.perf_counter()
    first = last = 0.0
    tokens = 0
    async with client.stream("POST", f"{url}/v1/responses", json=_body(prompt)) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            now = time.perf_counter()
            first = first or now
            last = now
            event = json.loads(line[6:])
            if event["type"] in ("response.completed", "response.incomplete"):
                tokens = event["response"]["usage"]["output_tokens"]
    return Sample(first - start, tokens, last - first)


async def through_handle(handle, prompt: str) -> Sample:
    request = ResponsesRequest.model_validate({"model": MODEL, "input": prompt})
    token_ids = render_request(request).token_ids
    generate = GenerateRequest(
        request_id=f"bench-{uuid.uuid4().hex}",
        prompt_token_ids=token_ids,
        sampling=SamplingSettings(max_tokens=100_000, stop_token_ids=(RETURN_TOKEN, CALL_TOKEN)),
        session_id=str(uuid.uuid4()),
    )
    start = time.perf_counter()
    first = last = 0.0
    tokens = 0
    async for chunk in handle.options(session_id=generate.session_id).generate.remote(generate):
        now = time.perf_counter()
        first = first or now
        last = now
        tokens += len(chunk.token_ids)
    return Sample(first - start, tokens, last - first)


def _row(name: str, samples: list[Sample]) -> str:
    ttfe = sorted(sample.first_event_s * 1000 for sample in samples)
    rates = [sample.tokens_per_s for sample in samples]
    p90 = ttfe[min(len(ttfe) - 1, int(0.9 * len(ttfe)))]
    return (
        f"{name:<22} {statistics.median(ttfe):>9.1f} {p90:>9.1f} "
        f"{statistics.median(rates):>12.0f} {statistics.mean(s.tokens for s in samples):>8.0f}"
    )


async def run(args: argparse.Namespace, url: str) -> None:
    handle = serve.get_deployment_handle("EngineDeployment", app_name=APP_NAME).options(stream=True)
    prompt = "Benchmark prompt: " + "lorem ipsum " * args.prompt_words
    async with httpx.AsyncClient(timeout=120) as client:
        await through_ingress(client, url, prompt)  # warm-up: first request pays imports
        await through_handle(handle, prompt)
        ingress = [await through_ingress(client, url, prompt) for _ in range(args.requests)]
        direct = [await through_handle(handle, prompt) for _ in range(args.requests)]
    print(
        f"\n{args.requests} sequential streams, ~{args.output_tokens} output tokens each, "
        f"simulated engine at {args.decode_tokens_per_s} tokens/s per request\n"
    )
    print(f"{'path':<22} {'TTFE p50':>9} {'TTFE p90':>9} {'tokens/s p50':>12} {'tokens':>8}")
    print(f"{'':<22} {'(ms)':>9} {'(ms)':>9}")
    print(_row("ingress (HTTP + SSE)", ingress))
    print(_row("engine handle", direct))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--output-tokens", type=int, default=1024)
    parser.add_argument("--prompt-words", type=int, default=500)
    parser.add_argument("--decode-tokens-per-s", type=float, default=20000)
    args = parser.parse_args()

    port = _free_port()
    ray.init(include_dashboard=False, logging_level="ERROR")
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    engine = EngineConfig(
        kind="simulated",
        options={
            "default_output_tokens": args.output_tokens,
            "decode_tokens_per_s": args.decode_tokens_per_s,
        },
    )
    app_args = AppArgs(engine=engine, default_max_output_tokens=args.output_tokens * 2)
    serve.run(build_app(app_args), name=APP_NAME, route_prefix="/")
    try:
        asyncio.run(run(args, f"http://127.0.0.1:{port}"))
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
