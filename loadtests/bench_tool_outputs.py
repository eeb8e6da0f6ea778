"""What a large tool output costs the ingress (issue 46, item 3): the whole API in this process
(Ray-free, the scripted simulated engine playing the model, as tests/unit/serving/tools/
test_loop.py runs it), a server-run tool (the tests' echo kind) answering with a big text.

    PYTHONPATH=. python loadtests/bench_tool_outputs.py              # both cases
    PYTHONPATH=. python loadtests/bench_tool_outputs.py --case words # two 900 KB outputs only
    PYTHONPATH=. python loadtests/bench_tool_outputs.py --run-chars 40000   # a shorter run

Cases:

- ``run``: one call answers ``--run-chars`` (700,000) characters of one letter, no space: a
  single tokenizer piece, whose byte-pair merging takes time quadratic in its length. Printed:
  the response's HTTP status and its status, the wall time, and this process's CPU time.
- ``words``: one completion makes two calls, each answering ``--words-bytes`` (900 KB) of
  words. Printed: the longest the event loop went without running a 5 ms ticker (what every
  other stream of the replica waits), the wall time and the response's status.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serve_app.protocol.tool_items import ToolResult
from serve_app.serving.tools.contract import ToolCall
from tests.support import MODEL
from tests.support.echo_tool import EchoRunner
from tests.unit.serving.tools import test_loop

SCRIPT = {
    "turns": [
        {"match": "too large|echo", "items": [{"text": "Read it."}]},
        {"match": "ONE-RUN", "items": [test_loop.call("run")]},
        {"match": "TWO-BIG", "items": [test_loop.call("words1"), test_loop.call("words2")]},
    ]
}


@dataclass
class BigRunner(EchoRunner):
    """``run``: a run of one letter; ``words*``: text of words."""

    run_chars: int = 700_000
    words_bytes: int = 900_000

    async def run(self, call: ToolCall) -> ToolResult:
        text = str(json.loads(call.arguments or "{}").get("text", ""))
        if text == "run":
            return ToolResult(output="a" * self.run_chars)
        if text.startswith("words"):
            line = "The quick brown fox jumps over the lazy dog, again and again. "
            text = line * (self.words_bytes // len(line) + 1)
            return ToolResult(output=text[: self.words_bytes])
        return await super().run(call)


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def ticker(stalls: list[float], stop: asyncio.Event) -> None:
    """Ticks every 5 ms; records each gap between ticks."""
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.005)
        now = time.perf_counter()
        stalls.append(now - last)
        last = now


async def case(app: Any, text: str) -> tuple[int, str, float, float, float]:
    """(HTTP status, response status, wall s, CPU s, longest loop stall s)."""
    stalls: list[float] = []
    stop = asyncio.Event()
    tick = asyncio.create_task(ticker(stalls, stop))
    started, cpu = time.perf_counter(), cpu_s()
    answer = await app.http.post("/v1/responses", json={"model": MODEL, "input": text}, timeout=900)
    wall, used = time.perf_counter() - started, cpu_s() - cpu
    stop.set()
    await tick
    status = answer.json().get("status", "") if answer.status_code == 200 else answer.text[:200]
    return answer.status_code, status, wall, used, max(stalls, default=0.0)


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=["run", "words", "both"], default="both")
    parser.add_argument("--run-chars", type=int, default=700_000)
    parser.add_argument("--words-bytes", type=int, default=900_000)
    args = parser.parse_args(argv)
    test_loop.SCRIPT = SCRIPT  # loop_app's engine plays this script
    runner = BigRunner(run_chars=args.run_chars, words_bytes=args.words_bytes)
    with tempfile.TemporaryDirectory() as folder:
        async with test_loop.loop_app(Path(folder), runner) as app:
            # The render workers started and ready, as an ingress replica warms them at start.
            app.api.state.service.warm()
            large = "warm up: echo " + "word " * 1000  # rendered in a worker
            await asyncio.gather(case(app, large), case(app, large))
            if args.case in ("words", "both"):
                code, status, wall, used, stall = await case(app, "TWO-BIG")
                print(
                    f"two {args.words_bytes:,}-byte outputs: HTTP {code} {status}; "
                    f"longest event-loop stall {stall * 1000:.0f} ms; wall {wall:.2f} s"
                )
            if args.case in ("run", "both"):
                code, status, wall, used, stall = await case(app, "ONE-RUN")
                print(
                    f"one {args.run_chars:,}-character run: HTTP {code} {status}; "
                    f"wall {wall:.2f} s; CPU {used:.2f} s; longest event-loop stall "
                    f"{stall * 1000:.0f} ms"
                )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
