"""When a streamed turn opens: the time to its HTTP headers, to ``response.created`` and to its
first output delta (TTFT), as a client sees them, against a running app.

Issue 38 moved the ``200`` and ``response.created`` after the engine replica takes the request
(so a refusal is a 429 before the stream); this shows what that costs the opening and that TTFT
is unchanged. Run it against the app before and after a change, on the same machine:

    python -m tests.local_app --port 8123 &
    PYTHONPATH=. python loadtests/bench_open.py --url http://127.0.0.1:8123 --requests 200

or on Ray: ``--serve`` starts ``serve run configs/local.yaml`` (one ingress, one engine replica)
on a free port for the run (``--no-channels``: every request on its own stream, where the engine
replica's `Accepted` is one item more per request):

    PYTHONPATH=. python loadtests/bench_open.py --serve --no-channels
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import yaml

from tests.support import serve_run  # the repository's root on PYTHONPATH, as the usage says

ROOT = Path(__file__).resolve().parent.parent

MODEL = "gpt-oss-120b"


async def one_turn(http: httpx.AsyncClient, url: str, index: int) -> dict[str, float]:
    body = {
        "model": MODEL,
        "input": f"SDK-TEXT: turn {index}",
        "stream": True,
        "store": False,
        "prompt_cache_key": f"bench-open-{index}",
    }
    started = time.perf_counter()
    seen: dict[str, float] = {}
    async with http.stream("POST", f"{url}/v1/responses", json=body) as response:
        seen["headers"] = time.perf_counter() - started
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            kind = json.loads(line[6:])["type"]
            now = time.perf_counter() - started
            if kind == "response.created":
                seen.setdefault("created", now)
            elif kind.endswith(".delta"):
                seen.setdefault("first delta", now)
    return seen


async def main(url: str, requests: int, concurrency: int, key: str | None) -> None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60, headers=headers) as http:

        async def bounded(index: int) -> dict[str, float]:
            async with limit:
                return await one_turn(http, url, index)

        await one_turn(http, url, -1)  # warm
        results = await asyncio.gather(*(bounded(i) for i in range(requests)))
    print(f"{requests} streamed turns, {concurrency} at a time, against {url}")
    for what in ("headers", "created", "first delta"):
        times = sorted(result[what] * 1000 for result in results if what in result)
        p90 = times[int(0.9 * (len(times) - 1))]
        print(f"  {what:12s} median {statistics.median(times):7.1f} ms   p90 {p90:7.1f} ms")


@contextlib.contextmanager
def served(channels: bool) -> Iterator[str]:
    """``serve run configs/local.yaml`` on a free port, for the block; its URL."""
    config = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())
    config["http_options"]["port"] = port = serve_run.free_port()
    # The replicas run elsewhere than `.`: PYTHONPATH absolute, to import this tree.
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {"RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": pythonpath}
    if not channels:
        env["SERVE_APP_ENGINE_CHANNELS"] = "0"
    with (
        tempfile.TemporaryDirectory(prefix="bench_open_") as folder,
        serve_run.running(config, Path(folder), env, startup_timeout_s=300),
    ):
        yield f"http://127.0.0.1:{port}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8123")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--key", default=None, help="an API key, if the app is closed")
    parser.add_argument("--serve", action="store_true", help="on serve run configs/local.yaml")
    parser.add_argument("--no-channels", action="store_true", help="with --serve: no channels")
    parser.add_argument("--rounds", type=int, default=1)
    options = parser.parse_args()
    with served(not options.no_channels) if options.serve else contextlib.nullcontext() as url:
        for _ in range(options.rounds):
            run = main(url or options.url, options.requests, options.concurrency, options.key)
            asyncio.run(run)
