"""What pushing an engine replica's load over its channels costs (serve_app.serving.engine.channel).

An `Outbox` with the replica's real `ReplicaReporter.load` (and one without, as before) is fed
turns arriving at ``--rates`` per second, each changing the prefill ledger three times (it
arrives, has its first token ``--prefill-s`` later, ends ``--decode-s`` after that), for
``--seconds``. Two channels: ``other``, an ingress none of these turns came from (only the
load goes to it), and ``own``, the ingress they came from (their tokens ride it, one chunk a
turn every ``--token-s``). Printed: sends per second on each with and without the load, and
the CPU of one push at each end (process time, mean of ``--repeat``): the replica's
``load()`` and the send's pickling, the ingress's unpickling and a router's
``TTFTPredictor.pushed``.

    PYTHONPATH=. python loadtests/bench_channel_load.py [--rates 10 50 --seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import pickle
import random
import time
from collections.abc import Callable
from typing import Any

from serve_app.engines.base import GenerateChunk
from serve_app.routing.replica_report import ReplicaReporter
from serve_app.routing.ttft import TTFTPredictor
from serve_app.serving.engine.channel import ChannelSend, Outbox

WINDOW_S = 0.02  # StreamingArgs.window_s


async def _turn(
    index: int, reporter: ReplicaReporter, outboxes: list[Outbox], own: Outbox | None, args: Any
) -> None:
    request_id = f"t{index}"

    def changed() -> None:
        for outbox in outboxes:
            outbox.load_changed()

    reporter.arrived(request_id, f"s{index}", 6_000)
    changed()
    await asyncio.sleep(args.prefill_s)
    reporter.first_token(request_id, 1_200, reporter.now())
    changed()
    ends_at = time.monotonic() + args.decode_s
    while time.monotonic() < ends_at:
        if own is not None:
            own.put(request_id, GenerateChunk(token_ids=[1]), urgent=False)
        await asyncio.sleep(args.token_s)
    reporter.ended(request_id)
    changed()


async def _run(rate: float, with_load: bool, args: Any) -> dict[str, float]:
    """Sends per second on the ``other`` and ``own`` channels over ``args.seconds``."""
    reporter = ReplicaReporter("engine-1")
    load = reporter.load if with_load else None
    other = Outbox(WINDOW_S, idle_s=60, heartbeat_s=1.0, load=load)
    own = Outbox(WINDOW_S, idle_s=60, heartbeat_s=1.0, load=load)
    counts = {"other": 0, "own": 0}

    async def read(name: str, outbox: Outbox) -> None:
        async for send in outbox.sends():
            pickle.loads(pickle.dumps(send))  # as Ray ships it
            counts[name] += 1

    readers = [asyncio.create_task(read("other", other)), asyncio.create_task(read("own", own))]
    own.requests["keep-open"] = asyncio.create_task(asyncio.sleep(3600))
    rng = random.Random(7)
    turns: list[asyncio.Task] = []
    ends_at = time.monotonic() + args.seconds
    index = 0
    while time.monotonic() < ends_at:
        turns.append(asyncio.create_task(_turn(index, reporter, [other, own], own, args)))
        index += 1
        await asyncio.sleep(rng.expovariate(rate))
    counted = dict(counts)  # over the arrivals' seconds; the turns still running then end
    for task in turns:
        task.cancel()
    for outbox in (other, own):
        outbox.close()
    own.requests["keep-open"].cancel()
    await asyncio.gather(*turns, *readers, return_exceptions=True)
    return {name: count / args.seconds for name, count in counted.items()}


def _cpu_us(step: Callable[[], Any], repeat: int) -> float:
    started = time.process_time()
    for _ in range(repeat):
        step()
    return (time.process_time() - started) / repeat * 1e6


def _push_costs(repeat: int) -> dict[str, float]:
    reporter = ReplicaReporter("engine-1")
    for index in range(32):  # a busy replica: 32 requests waiting or decoding
        reporter.arrived(f"r{index}", f"s{index}", 6_000)
        if index % 2:
            reporter.first_token(f"r{index}", 1_200, reporter.now())
    predictor = TTFTPredictor()
    predictor.update({"engine-1": reporter.report()})
    shipped = pickle.dumps(ChannelSend([], reporter.load()))
    loads = [reporter.load() for _ in range(repeat)]  # each newer than the one before
    pushes = iter(loads)
    return {
        "replica: load() + pickle (us)": _cpu_us(
            lambda: pickle.dumps(ChannelSend([], reporter.load())), repeat
        ),
        "ingress: unpickle (us)": _cpu_us(lambda: pickle.loads(shipped), repeat),
        "router: TTFTPredictor.pushed (us)": _cpu_us(
            lambda: predictor.pushed("engine-1", next(pushes)), repeat
        ),
        "pickled send, load only (bytes)": len(shipped),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[10.0, 50.0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--prefill-s", type=float, default=0.2)
    parser.add_argument("--decode-s", type=float, default=2.0)
    parser.add_argument("--token-s", type=float, default=0.01)
    parser.add_argument("--repeat", type=int, default=20_000)
    args = parser.parse_args()
    print("arrivals/s | channel | sends/s without load | sends/s with load")
    for rate in args.rates:
        without = asyncio.run(_run(rate, False, args))
        with_load = asyncio.run(_run(rate, True, args))
        for name in ("other", "own"):
            print(f"{rate:g} | {name} | {without[name]:.1f} | {with_load[name]:.1f}")
    for name, value in _push_costs(args.repeat).items():
        print(f"{name}: {value:.1f}")


if __name__ == "__main__":
    main()
