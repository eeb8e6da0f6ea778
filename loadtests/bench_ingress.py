"""Benchmark: what the ingress costs over calling the engine handle directly.

Starts the app in-process with the simulated engine decoding fast (so the serving path, not
the engine, is what is measured), then streams the same prompt N times

- through the ingress: HTTP POST /v1/responses with SSE (proxy -> ingress -> engine), and
- through the engine deployment's handle (engine -> caller), no protocol work at all,

and prints time to first event / first chunk and streamed tokens per second for both. Then it
plays a ten-turn Codex conversation (the sample trace's first turn: its developer prompt,
environment and task, then a short user message per turn) two ways, and prints per-turn latency
(send to terminal event) and bytes sent per turn:

- SSE: every turn POSTs the whole history (``store: false``, as Codex does over HTTP);
- WebSocket: one connection; each turn sends only its new message with ``previous_response_id``.

    python loadtests/bench_ingress.py --requests 20 --output-tokens 1024

This is a benchmark, not a test: it prints numbers and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import ray
from ray import serve
from websockets.asyncio.client import connect

from serve_app.app import build_app
from serve_app.config import AppArgs, EngineConfig
from serve_app.engines.base import GenerateChunk
from serve_app.harmony.render import render_request
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.sse import TERMINAL_EVENT_TYPES
from serve_app.serving.turn.engine_request import engine_request

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import MODEL, free_port, percentile
from traces import SAMPLE, load_traces

APP_NAME = "bench"


@dataclass
class Sample:
    first_event_s: float
    tokens: int
    stream_s: float  # from the first event to the last

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.stream_s if self.stream_s > 0 else float("nan")


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
    generate = engine_request(
        request,
        render_request(request),
        request_id=f"bench-{uuid.uuid4().hex}",
        max_tokens=100_000,
        session_id=str(uuid.uuid4()),
        cache_salt=None,
    )
    start = time.perf_counter()
    first = last = 0.0
    tokens = 0
    async for chunk in handle.options(session_id=generate.session_id).generate.remote(generate):
        if not isinstance(chunk, GenerateChunk):  # a heartbeat, or the marker of a channel
            continue
        now = time.perf_counter()
        first = first or now
        last = now
        tokens += len(chunk.token_ids)
    return Sample(first - start, tokens, last - first)


@dataclass
class Turn:
    latency_s: float  # from sending the request to the terminal event
    sent_bytes: int


def _conversation(turns: int) -> list[list[dict]]:
    """Each turn's new input: the sample trace's first turn, then one user message a turn."""
    first = load_traces(SAMPLE)[0].turns[0]["new_items"]
    follow_ups = [
        [{"type": "message", "role": "user", "content": f"Turn {index}: go on with the next step."}]
        for index in range(2, turns + 1)
    ]
    return [first, *follow_ups]


async def ten_turns_over_sse(client: httpx.AsyncClient, url: str, turns: int) -> list[Turn]:
    history: list[dict] = []
    key = str(uuid.uuid4())
    played = []
    for new_items in _conversation(turns):
        history += new_items
        body = json.dumps(
            {
                "model": MODEL,
                "input": history,
                "stream": True,
                "store": False,
                "prompt_cache_key": key,
            }
        ).encode()
        start = time.perf_counter()
        headers = {"content-type": "application/json"}
        async with client.stream(
            "POST", f"{url}/v1/responses", content=body, headers=headers
        ) as response:
            async for line in response.aiter_lines():
                event = json.loads(line[6:]) if line.startswith("data: ") else {}
                if event.get("type") in TERMINAL_EVENT_TYPES:
                    final = event["response"]
        played.append(Turn(time.perf_counter() - start, len(body)))
        history += final["output"]  # Codex keeps the output items and re-sends them
    return played


async def ten_turns_over_websocket(url: str, turns: int) -> list[Turn]:
    played = []
    previous = None
    key = str(uuid.uuid4())
    async with connect(url.replace("http://", "ws://", 1) + "/v1/responses") as socket:
        for new_items in _conversation(turns):
            message = {
                "type": "response.create",
                "model": MODEL,
                "input": new_items,
                "store": False,
                "prompt_cache_key": key,
            }
            if previous:
                message["previous_response_id"] = previous
            text = json.dumps(message)
            start = time.perf_counter()
            await socket.send(text)
            while (event := json.loads(await socket.recv()))["type"] not in TERMINAL_EVENT_TYPES:
                pass
            played.append(Turn(time.perf_counter() - start, len(text.encode())))
            previous = event["response"]["id"]
    return played


def _turn_row(name: str, played: list[Turn]) -> str:
    latencies = sorted(turn.latency_s * 1000 for turn in played)
    p90 = percentile(latencies, 0.9)
    sent = statistics.mean(turn.sent_bytes for turn in played)
    return f"{name:<22} {statistics.median(latencies):>9.1f} {p90:>9.1f} {sent:>12.0f}"


def _row(name: str, samples: list[Sample]) -> str:
    ttfe = sorted(sample.first_event_s * 1000 for sample in samples)
    rates = [sample.tokens_per_s for sample in samples]
    p90 = percentile(ttfe, 0.9)
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

    async with httpx.AsyncClient(timeout=120) as client:
        sse = [
            turn
            for _ in range(args.conversations)
            for turn in await ten_turns_over_sse(client, url, 10)
        ]
    websocket = [
        turn for _ in range(args.conversations) for turn in await ten_turns_over_websocket(url, 10)
    ]
    print(f"\n{args.conversations} ten-turn conversations per transport, one after another\n")
    print(f"{'transport':<22} {'turn p50':>9} {'turn p90':>9} {'bytes sent':>12}")
    print(f"{'':<22} {'(ms)':>9} {'(ms)':>9} {'per turn':>12}")
    print(_turn_row("HTTP + SSE", sse))
    print(_turn_row("WebSocket", websocket))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--output-tokens", type=int, default=1024)
    parser.add_argument("--prompt-words", type=int, default=500)
    parser.add_argument("--decode-tokens-per-s", type=float, default=20000)
    parser.add_argument("--conversations", type=int, default=5, help="ten-turn, per transport")
    args = parser.parse_args()

    port = free_port()
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
