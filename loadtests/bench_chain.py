"""What continuing turn 100 of a ``previous_response_id`` chain costs against turn 10.

One chain of ``--turns`` (100) stored responses is built through the app's own FastAPI app in
this process (the simulated engine, an SQLite store in a temporary folder; no Ray), each turn
one short user message continuing the last. Then, for turn 10 and turn 100 (``--at``), the
turn is asked ``--repeats`` (15) times more, each a new branch continuing the same response,
and this prints per turn, as medians:

- ``statements``: SQL statements the store ran to load the chain (``ResponseStore.chain``),
  counted on the engine: the loader's round trips, exact on any machine;
- ``load ms``: the chain's load alone, wall clock;
- ``turn ms`` and ``turn cpu ms``: the whole ``POST /v1/responses`` (load, render, generate,
  store), wall clock and this process's CPU;

and the ratio of turn 100 to turn 10 of each. The machine is noisy: read the ratios.

    PYTHONPATH=. python loadtests/bench_chain.py
    PYTHONPATH=. python loadtests/bench_chain.py --turns 120 --at 5 25 100 120
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from sqlalchemy import event

from serve_app.config import AppArgs
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.serving.engine.client import InProcessEngineClient
from serve_app.serving.ingress import create_api
from serve_app.store.sql import SqlResponseStore


class StatementCounter:
    """SQL statements the store's engine runs while counting."""

    def __init__(self, store: SqlResponseStore) -> None:
        self.count = 0
        event.listen(store._engine.sync_engine, "before_cursor_execute", self._seen)

    def _seen(self, *_: object) -> None:
        self.count += 1


async def turn(client: httpx.AsyncClient, previous: str | None, number: int) -> str:
    body = {"model": "gpt-oss-120b", "input": f"turn {number}: go on", "store": True}
    if previous is not None:
        body["previous_response_id"] = previous
    answer = await client.post("/v1/responses", json=body)
    answer.raise_for_status()
    return answer.json()["id"]


async def measure(
    client: httpx.AsyncClient,
    store: SqlResponseStore,
    counter: StatementCounter,
    previous: str,
    number: int,
    repeats: int,
) -> dict[str, float]:
    statements, loads, walls, cpus = [], [], [], []
    for _ in range(repeats):
        before = counter.count
        started = time.perf_counter()
        await store.chain(previous)
        loads.append((time.perf_counter() - started) * 1000)
        statements.append(counter.count - before)
        started, cpu = time.perf_counter(), time.process_time()
        await turn(client, previous, number)
        walls.append((time.perf_counter() - started) * 1000)
        cpus.append((time.process_time() - cpu) * 1000)
    return {
        "statements": statistics.median(statements),
        "load ms": statistics.median(loads),
        "turn ms": statistics.median(walls),
        "turn cpu ms": statistics.median(cpus),
    }


async def main(turns: int, at: list[int], repeats: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        store = SqlResponseStore(f"sqlite+aiosqlite:///{Path(folder) / 'responses.db'}")
        await store.start()
        engine = SimulatedEngine(SimulatedEngineConfig(decode_tokens_per_s=50_000))
        await engine.start()
        api = create_api(AppArgs(), InProcessEngineClient(engine), ReasoningVault("k"), store)
        counter = StatementCounter(store)
        transport = httpx.ASGITransport(app=api)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
                chain: list[str] = []
                for number in range(1, turns + 1):
                    chain.append(await turn(client, chain[-1] if chain else None, number))
                results = {
                    number: await measure(
                        client, store, counter, chain[number - 2], number, repeats
                    )
                    for number in at
                }
        finally:
            await engine.shutdown()
            await store.close()
    columns = list(results[at[0]])
    print(f"{'turn':>6} " + " ".join(f"{name:>12}" for name in columns))
    for number, row in results.items():
        print(f"{number:>6} " + " ".join(f"{row[name]:>12.2f}" for name in columns))
    first, last = results[at[0]], results[at[-1]]
    ratios = " ".join(f"{last[name] / first[name]:>12.2f}" for name in columns)
    print(f"{f'{at[-1]}/{at[0]}':>6} {ratios}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--at", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--repeats", type=int, default=15)
    options = parser.parse_args()
    asyncio.run(main(options.turns, options.at, options.repeats))
