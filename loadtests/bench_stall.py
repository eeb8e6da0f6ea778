"""The largest gap between the tokens of running streams while one heavy valid request is
served by the same ingress (issue 38, point 4: no request holds the event loop).

    PYTHONPATH=. python loadtests/bench_stall.py                 # before and after, Ray-free
    PYTHONPATH=. python loadtests/bench_stall.py --pieces 380    # the issue's 7.6 MB request
    PYTHONPATH=. python loadtests/bench_stall.py --serve-run     # before and after, serve run
    PYTHONPATH=. python loadtests/bench_stall.py --url http://127.0.0.1:8000   # a running app

Without ``--url`` it starts the ingress's FastAPI app on uvicorn (as ``tests.local_app``: one
process, the simulated engine on the same event loop) twice: *before*, every request rendered
on the event loop (``limits.render_inline_chars`` beyond any body: the code before the render
pool), and *after*, with the defaults. Each round opens ``--streams`` SSE streams, waits until
all stream, sends the heavy request (``--pieces`` pieces of 19,999 characters, each just under
the door's limit, to ``/v1/responses/input_tokens``), then prints the largest gap between two
deliveries of one stream while it was served, against the largest gap in as long before it.
The machine is shared and noisy: read the ratio, with the load average printed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from common import MODEL, free_port

PIECE_CHARS = 19_999
# Far beyond any body the app takes (16 MiB): every request renders on the event loop.
ALL_INLINE = 1 << 40


@dataclass
class Stream:
    """When each delivery carrying text (reasoning or output) arrived, for one stream."""

    deliveries: list[float] = field(default_factory=list)
    status: str = ""


@dataclass
class Round:
    name: str
    status: int
    served_s: float
    gap_s: float  # the largest gap of any stream while the heavy request was served
    quiet_gap_s: float  # the same, over as long a window before it
    load: tuple[float, float, float]


def largest_gap(streams: list[Stream], start: float, end: float) -> float:
    """The longest time any stream went without a delivery within [start, end] (a gap that
    overlaps the window counts whole, as the client waited it)."""
    longest = 0.0
    for stream in streams:
        times = [start, *[t for t in stream.deliveries if start < t < end], end]
        before = [t for t in stream.deliveries if t <= start]
        after = [t for t in stream.deliveries if t >= end]
        if before:
            times[0] = before[-1]
        if after:
            times[-1] = after[0]
        longest = max(longest, *(b - a for a, b in itertools.pairwise(times)))
    return longest


def quiet_gap(streams: list[Stream], start: float, end: float) -> float:
    """The longest time between two deliveries of one stream, both within [start, end]: the
    noise before the heavy request (a gap that runs into it is its doing, not counted)."""
    longest = 0.0
    for stream in streams:
        times = [t for t in stream.deliveries if start <= t <= end]
        longest = max(longest, *(b - a for a, b in itertools.pairwise(times)), 0.0)
    return longest


async def sse_stream(host: str, port: int, stream: Stream, stop: asyncio.Event) -> None:
    """One streamed response, read until ``stop`` (its connection closed then, which aborts it)."""
    body = json.dumps({"model": MODEL, "input": "Tell me a long story.", "stream": True})
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        (
            f"POST /v1/responses HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        + body.encode()
    )
    try:
        while not stop.is_set():
            try:  # a read cancelled by the timeout loses nothing: the data stays buffered
                data = await asyncio.wait_for(reader.read(1 << 16), 0.5)
            except TimeoutError:
                continue
            if not data:
                stream.status = "ended"
                return
            if b"delta\ndata: " in data:  # reasoning or output text
                stream.deliveries.append(time.perf_counter())
    finally:
        writer.close()


def heavy_body(pieces: int) -> bytes:
    text = " ".join(["a" * PIECE_CHARS] * pieces)
    return json.dumps({"model": MODEL, "input": text}).encode()


async def post(host: str, port: int, path: str, body: bytes) -> int:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        + body
    )
    await writer.drain()
    status_line = await reader.readline()
    await reader.read()
    writer.close()
    return int(status_line.split()[1])


async def run_round(name: str, url: str, streams: int, pieces: int) -> Round:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    body = heavy_body(pieces)
    stop = asyncio.Event()
    opened = [Stream() for _ in range(streams)]
    tasks = [asyncio.create_task(sse_stream(host, port, s, stop)) for s in opened]
    while not all(s.deliveries for s in opened):  # every stream is streaming
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)
    started = time.perf_counter()
    status = await post(host, port, "/v1/responses/input_tokens", body)
    ended = time.perf_counter()
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    served = ended - started
    if any(s.status == "ended" for s in opened):
        print(f"warning: a stream ended during round {name}: raise --output-tokens")
    quiet_window = min(served, 1.0)
    return Round(
        name=name,
        status=status,
        served_s=served,
        gap_s=largest_gap(opened, started, ended),
        quiet_gap_s=quiet_gap(opened, started - quiet_window, started),
        load=os.getloadavg(),
    )


def report(result: Round) -> str:
    load = " ".join(f"{value:.2f}" for value in result.load)
    return (
        f"{result.name:>7}: heavy request {result.status} in {result.served_s:6.2f} s; "
        f"largest token gap while served {result.gap_s * 1000:8.0f} ms "
        f"(before it: {result.quiet_gap_s * 1000:4.0f} ms); load average {load}"
    )


def serve(port: int, render_inline_chars: int, tokens_per_s: float, output_tokens: int) -> None:
    """The app, Ray-free (as tests.local_app), for one round."""
    from pathlib import Path

    import uvicorn

    from serve_app.config import AppArgs, Limits
    from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
    from serve_app.harmony.reasoning_vault import ReasoningVault
    from serve_app.serving.engine.client import InProcessEngineClient
    from serve_app.serving.ingress import create_api
    from serve_app.store.sql import SqlResponseStore

    async def run() -> None:
        folder = Path(tempfile.mkdtemp(prefix="bench_stall_"))
        store = SqlResponseStore(f"sqlite+aiosqlite:///{folder / 'responses.db'}")
        await store.start()
        engine = SimulatedEngine(
            SimulatedEngineConfig(
                decode_tokens_per_s=tokens_per_s, default_output_tokens=output_tokens
            )
        )
        await engine.start()
        args = AppArgs(
            default_max_output_tokens=output_tokens + 1000,
            limits=Limits(render_inline_chars=render_inline_chars),
        )
        api = create_api(args, InProcessEngineClient(engine), ReasoningVault("bench"), store)
        api.state.service.warm()  # as the ingress replica does
        config = uvicorn.Config(api, host="127.0.0.1", port=port, log_level="warning")
        try:
            await uvicorn.Server(config).serve()
        finally:
            await api.state.service.aclose()
            await engine.shutdown()
            await store.close()

    asyncio.run(run())


def start_app(render_inline_chars: int | None, options: argparse.Namespace) -> tuple:
    port = free_port()
    command = [sys.executable, __file__, "--serve", str(port)]
    command += ["--tokens-per-s", str(options.tokens_per_s)]
    command += ["--output-tokens", str(options.output_tokens)]
    if render_inline_chars is not None:
        command += ["--render-inline-chars", str(render_inline_chars)]
    process = subprocess.Popen(command)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2).read()
            return process, url
        except OSError:
            time.sleep(0.5)
    process.kill()
    raise RuntimeError("the app did not start")


def serve_run_app(render_inline_chars: int | None, options: argparse.Namespace, folder: str):
    """``serve run configs/local.yaml`` (one ingress and one engine replica, the simulated
    engine at ``--tokens-per-s``): the ingress in a Ray replica, as users run it."""
    from pathlib import Path

    import yaml

    from tests.support import REPO, serve_run

    config = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    config["http_options"]["port"] = free_port()
    app = config["applications"][0]
    app["args"]["default_max_output_tokens"] = options.output_tokens + 1000
    engine = app["args"]["engine"]["options"]
    engine.update(
        decode_tokens_per_s=options.tokens_per_s, default_output_tokens=options.output_tokens
    )
    if render_inline_chars is not None:
        app["args"].setdefault("limits", {})["render_inline_chars"] = render_inline_chars
    run = serve_run.start(config, Path(folder))
    try:
        serve_run.wait_healthy(run)
    except BaseException:
        serve_run.stop(run)
        raise
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an app already running (one round, as it is)")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--pieces", type=int, default=40, help="19,999-character pieces")
    parser.add_argument("--tokens-per-s", type=float, default=50.0)
    parser.add_argument("--output-tokens", type=int, default=30_000)
    parser.add_argument(
        "--serve-run", action="store_true", help="the app under `serve run` (Ray), not uvicorn"
    )
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--render-inline-chars", type=int, default=None, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.serve:
        from serve_app.config import Limits

        inline = options.render_inline_chars
        if inline is None:
            inline = Limits().render_inline_chars
        serve(options.serve, inline, options.tokens_per_s, options.output_tokens)
        return
    mb = len(heavy_body(options.pieces)) / 1e6
    print(f"{options.streams} streams; heavy request: {options.pieces} pieces, {mb:.1f} MB")
    if options.url:
        print(report(asyncio.run(run_round("app", options.url, options.streams, options.pieces))))
        return
    results = []
    for name, inline in (("before", ALL_INLINE), ("after", None)):
        if options.serve_run:
            from tests.support import serve_run

            with tempfile.TemporaryDirectory() as folder:
                run = serve_run_app(inline, options, folder)
                try:
                    rounds = asyncio.run(run_round(name, run.url, options.streams, options.pieces))
                finally:
                    serve_run.stop(run)
            results.append(rounds)
        else:
            process, url = start_app(inline, options)
            try:
                results.append(asyncio.run(run_round(name, url, options.streams, options.pieces)))
            finally:
                process.terminate()
                process.wait(timeout=30)
        print(report(results[-1]))
    before, after = results
    print(f"largest gap, before / after: {before.gap_s / after.gap_s:.1f}x")


if __name__ == "__main__":
    main()
