"""Soak: is every acknowledged `store: true` response and conversation append retrievable?

Starts the app as users run it (``serve run`` on configs/local.yaml, on a Ray cluster of its
own, stopped at the end) with a free port, TWO ingress replicas sharing one store and two engine
replicas, once per store: SQLite (a file in a temporary folder, the default kind) and
PostgreSQL (a throwaway server, as tests/support/postgres.py starts it). Then one of:

``writes``: ``--writers`` (64) concurrent writers create ``--responses`` (5,000) stored
responses (streamed over SSE, not streamed, and a share over WebSocket; each a Codex session's
first turn, about 4,000 prompt tokens, or one line with ``--prompt short``) and ``--appends``
(2,000) conversation appends (``POST /v1/conversations/{id}/items``, and responses with
``conversation``) spread over one conversation per 20 appends. Then every acknowledged id is
fetched (``GET /v1/responses/{id}``; each conversation's items listed).

``faults``: the locust Codex replay (loadtests/locustfile.py on sessions from
loadtests/traces.py) at twice the engine's capacity (``--users``, default 2 x engine replicas x
``--engine-slots``) for ``--duration`` (600 s), half of its sessions stored and chained by
``previous_response_id``, while an engine replica is killed every ``--kill-every`` (120 s) and
an ingress replica once, halfway (``ray.kill`` on the replica actor, as tests/app/test_faults.py
does). Then every acknowledged stored response is fetched.

Each prints, per store: acknowledged, lost (acknowledged but not retrievable), refused with a
proper error (429/5xx in OpenAI's shape, or ``response.failed`` with a code), hung streams (no
terminal event within ``--stream-bound``) and improper failures, with their details
(loadtests/outcomes.py), and how many times the app's log says a store write failed.

    PYTHONPATH=. python loadtests/soak_store.py writes                  # 5,000 + 2,000, 64 writers
    PYTHONPATH=. python loadtests/soak_store.py writes --responses 500 --appends 200 --stores sqlite
    PYTHONPATH=. python loadtests/soak_store.py faults --duration 600   # kills included

This is a soak, not a test: it prints numbers and asserts nothing. With $SERVE_APP_API_KEY set
(an app with API keys), every request carries it.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import outcomes
from common import MODEL, free_port
from traces import generate

from serve_app.protocol.sse import TERMINAL_EVENT_TYPES

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The throwaway PostgreSQL server the store tests use; `serve run` as the tests start it.
from tests.support import postgres, serve_run  # noqa: E402

CONFIG = ROOT / "configs" / "local.yaml"
REPLICAS = 2  # of the ingress and of the engine
STARTUP_TIMEOUT_S = 300
ITEMS_PER_CONVERSATION = 20  # appends per conversation (so conversations see concurrent appends)
# What the app logs when it could not store a response or extend a conversation, once each
# (serving/turn/service.py).
STORE_FAILURES = re.compile(r"could not be stored|conversation not extended")


# --- the app, as users run it -----------------------------------------------------------------


def soak_config(port: int, store_url: str, engine_slots: int | None) -> dict:
    """configs/local.yaml with a free port, the store, two replicas of each deployment and short
    answers; with ``engine_slots``, that many generations per engine replica (its capacity)."""
    config = yaml.safe_load(CONFIG.read_text())
    config["http_options"]["port"] = port
    app = config["applications"][0]
    app["args"]["store"] = {"url": store_url}
    app["args"]["engine"]["options"]["default_output_tokens"] = 16
    for deployment in app["deployments"]:
        deployment["num_replicas"] = REPLICAS
        if deployment["name"] == "EngineDeployment" and engine_slots is not None:
            # Plus each ingress replica's channel, as the configs count them.
            deployment["max_ongoing_requests"] = engine_slots + REPLICAS
            deployment["max_queued_requests"] = engine_slots + REPLICAS
    return config


@contextlib.contextmanager
def store_url(kind: str, folder: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite+aiosqlite:///{folder / 'responses.db'}"
        return
    url, data = postgres.start()
    try:
        yield url
    finally:
        postgres.stop(data)
        shutil.rmtree(data, ignore_errors=True)


# `serve run`'s environment: the repository importable (serve_app, as the app's config names
# it), every failed store write on a line of its own (to count).
SERVE_ENV = {
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
}


def store_failures_logged(app: serve_run.ServeRun) -> int:
    """Lines of the app's log (replicas log to `serve run`'s output) saying a write failed."""
    return sum(1 for line in app.log.open(errors="replace") if STORE_FAILURES.search(line))


# --- writers ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    op: str
    outcome: str  # acked, refused, hung, improper (loadtests/outcomes.py)
    detail: str = ""
    response_id: str | None = None
    conversation: str | None = None
    items: list[str] = field(default_factory=list)  # ids that must be in the conversation

    @property
    def stored(self) -> bool:
        """Something the server stored: it must be retrievable."""
        return self.response_id is not None or bool(self.items)


def _codex_turns(count: int) -> list[dict]:
    """First turns of Codex-like sessions (loadtests/traces.py): Codex's real instructions and
    tools, a task; about 4,000 prompt tokens each, as a coding agent's request is."""
    sessions = generate(count, 2.0, seed=27, min_turns=1, max_turns=1)
    return [{"input": s.turn_input(0), "tools": s.tools} for s in sessions]


CODEX_TURNS: list[dict] = []


def _body(number: int, prompt: str, conversation: str | None = None) -> dict:
    """A stored response's request: with ``prompt`` "codex" a Codex session's first turn (a
    conversation's responses stay short: their history grows with every append)."""
    body = {"model": MODEL, "input": f"soak {number}: say something", "store": True}
    if conversation is not None:
        body["conversation"] = conversation
    elif prompt == "codex":
        if not CODEX_TURNS:
            CODEX_TURNS.extend(_codex_turns(50))
        body.update(CODEX_TURNS[number % len(CODEX_TURNS)])
    return body


def _ended(op: str, final: dict | None, conversation: str | None) -> Outcome:
    """The outcome of a turn whose terminal event (or non-streamed Response) is ``final``."""
    if final is None:
        return Outcome(op, "improper", "ended without a terminal event")
    response = final.get("response", final)
    status = response.get("status")
    if status in ("completed", "incomplete"):
        items = [item["id"] for item in response.get("output", []) if conversation]
        return Outcome(op, "acked", status, response["id"], conversation, items)
    if outcomes.failed_properly(response):
        return Outcome(op, "refused", f"failed: {outcomes.error_code(response)}")
    return Outcome(op, "improper", f"ended {status}: {response.get('error')}")


def _refused(op: str, status: int, content: bytes) -> Outcome:
    body = outcomes.json_or_text(content)
    detail = f"HTTP {status}: {outcomes.error_code(body) or body}"
    return Outcome(op, outcomes.http_refusal(status, body), detail)


def auth() -> dict[str, str]:
    """The bearer header of $SERVE_APP_API_KEY, when set (read when asked: a test sets it)."""
    key = os.environ.get("SERVE_APP_API_KEY")
    return {"authorization": f"Bearer {key}"} if key else {}


async def sse_response(client: httpx.AsyncClient, body: dict, bound_s: float) -> Outcome:
    op = "sse+conversation" if "conversation" in body else "sse"
    async with client.stream("POST", "/v1/responses", json={**body, "stream": True}) as reply:
        if reply.status_code != 200:
            return _refused(op, reply.status_code, await reply.aread())
        final = None
        async with asyncio.timeout(bound_s):
            async for line in reply.aiter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    if event["type"] in TERMINAL_EVENT_TYPES:
                        final = event
                        break
    return _ended(op, final, body.get("conversation"))


async def json_response(client: httpx.AsyncClient, body: dict, bound_s: float) -> Outcome:
    op = "json+conversation" if "conversation" in body else "json"
    reply = await client.post("/v1/responses", json=body, timeout=bound_s)
    if reply.status_code != 200:
        return _refused(op, reply.status_code, reply.content)
    return _ended(op, reply.json(), body.get("conversation"))


async def ws_response(url: str, body: dict, bound_s: float) -> Outcome:
    from websockets.asyncio.client import connect

    ws_url = url.replace("http://", "ws://") + "/v1/responses"
    async with (
        asyncio.timeout(bound_s),
        connect(ws_url, max_size=None, additional_headers=auth()) as socket,
    ):
        await socket.send(json.dumps({"type": "response.create", **body}))
        async for message in socket:
            event = json.loads(message)
            if event["type"] == "error":
                status = event.get("status", 0)
                kind = outcomes.http_refusal(status, event)
                return Outcome("ws", kind, f"error {status}: {outcomes.error_code(event)}")
            if event["type"] in TERMINAL_EVENT_TYPES:
                return _ended("ws", event, None)
    return Outcome("ws", "improper", "closed without a terminal event")


async def append_items(client: httpx.AsyncClient, conversation: str, number: int) -> Outcome:
    item = {"type": "message", "role": "user", "content": f"soak append {number}"}
    path = f"/v1/conversations/{conversation}/items"
    reply = await client.post(path, json={"items": [item]})
    if reply.status_code != 200:
        return _refused("items", reply.status_code, reply.content)
    added = [item["id"] for item in reply.json()["data"]]
    return Outcome("items", "acked", "", None, conversation, added)


async def guarded(op: str, call: Any) -> Outcome:
    """A request's outcome; a timeout is a hung request, any other exception improper."""
    try:
        return await call
    except TimeoutError:
        return Outcome(op, "hung", "no terminal event in time")
    except httpx.TimeoutException as error:
        return Outcome(op, "hung", f"{type(error).__name__}")
    except Exception as error:  # a dropped connection, a cut stream: the client saw it fail
        return Outcome(op, "improper", f"{type(error).__name__}: {error}"[:200])


def plan(responses: int, appends: int, ws_share: float, conversations: list[str]) -> list[tuple]:
    """Each write to make, shuffled: (kind, number, conversation)."""
    rng = random.Random(27)
    jobs: list[tuple] = []
    for number in range(responses):
        draw = rng.random()
        kind = "ws" if draw < ws_share else "sse" if draw < (1 + ws_share) / 2 else "json"
        jobs.append((kind, number, None))
    for number in range(appends):
        conversation = conversations[number % len(conversations)]
        kind = ("items", "sse", "json")[number % 4 % 3]  # half items, half responses
        jobs.append((kind, responses + number, conversation))
    rng.shuffle(jobs)
    return jobs


async def run_writes(url: str, args: argparse.Namespace) -> tuple[list[Outcome], float]:
    limits = httpx.Limits(max_connections=args.writers * 2)
    timeout = httpx.Timeout(args.stream_bound, connect=30)
    async with httpx.AsyncClient(
        base_url=url, headers=auth(), limits=limits, timeout=timeout
    ) as client:
        count = max(1, args.appends // ITEMS_PER_CONVERSATION) if args.appends else 0
        conversations = [await create_conversation(client) for _ in range(count)]
        jobs = plan(args.responses, args.appends, args.ws_share, conversations)
        queue: asyncio.Queue = asyncio.Queue()
        for job in jobs:
            queue.put_nowait(job)
        results: list[Outcome] = []

        async def writer() -> None:
            while not queue.empty():
                kind, number, conversation = queue.get_nowait()
                if kind == "items":
                    call = append_items(client, conversation, number)
                elif kind == "ws":
                    call = ws_response(url, _body(number, args.prompt), args.stream_bound)
                else:
                    make = sse_response if kind == "sse" else json_response
                    body = _body(number, args.prompt, conversation)
                    call = make(client, body, args.stream_bound)
                op = f"{kind}+conversation" if conversation and kind != "items" else kind
                results.append(await guarded(op, call))
                if len(results) % 500 == 0:
                    print(f"   {len(results)}/{len(jobs)} written", flush=True)

        started = time.monotonic()
        await asyncio.gather(*(writer() for _ in range(args.writers)))
        return results, time.monotonic() - started


async def create_conversation(client: httpx.AsyncClient) -> str:
    for _ in range(10):
        reply = await client.post("/v1/conversations", json={"metadata": {"soak": "27"}})
        if reply.status_code == 200:
            return reply.json()["id"]
        await asyncio.sleep(1)
    raise RuntimeError(f"could not create a conversation: {reply.status_code} {reply.text}")


# --- checking what was acknowledged ----------------------------------------------------------


async def fetch_response(client: httpx.AsyncClient, response_id: str) -> str:
    """``kept``, ``lost`` (404), or ``unchecked`` (the server would not say, after retries)."""
    for attempt in range(5):
        with contextlib.suppress(httpx.HTTPError):
            reply = await client.get(f"/v1/responses/{response_id}")
            if reply.status_code == 200 and reply.json().get("id") == response_id:
                return "kept"
            if reply.status_code == 404:
                return "lost"
        await asyncio.sleep(1 + attempt)
    return "unchecked"


async def conversation_items(client: httpx.AsyncClient, conversation: str) -> set[str] | None:
    """Every item id of the conversation (all pages), or None if it could not be listed."""
    ids: set[str] = set()
    after = None
    while True:
        params = {"limit": 100, "order": "asc", **({"after": after} if after else {})}
        for attempt in range(5):
            with contextlib.suppress(httpx.HTTPError):
                reply = await client.get(f"/v1/conversations/{conversation}/items", params=params)
                if reply.status_code == 200:
                    break
            await asyncio.sleep(1 + attempt)
        else:
            return None
        page = reply.json()
        ids.update(item["id"] for item in page["data"])
        if not page["has_more"]:
            return ids
        after = page["last_id"]


async def check(url: str, acked: list[Outcome]) -> dict[int, str]:
    """For each acknowledged outcome (by index): kept, lost or unchecked."""
    verdicts: dict[int, str] = {}
    limit = asyncio.Semaphore(16)
    async with httpx.AsyncClient(base_url=url, headers=auth(), timeout=60) as client:
        conversations = {o.conversation for o in acked if o.conversation}
        listed: dict[str, set[str] | None] = {}

        async def list_one(conversation: str) -> None:
            async with limit:
                listed[conversation] = await conversation_items(client, conversation)

        async def one(index: int, outcome: Outcome) -> None:
            verdict = "kept"
            if outcome.response_id is not None:
                async with limit:
                    verdict = await fetch_response(client, outcome.response_id)
            if outcome.conversation is not None and verdict == "kept":
                present = listed.get(outcome.conversation)
                if present is None:
                    verdict = "unchecked"
                elif not set(outcome.items) <= present:
                    verdict = "lost"
            verdicts[index] = verdict

        await asyncio.gather(*(list_one(conversation) for conversation in conversations))
        await asyncio.gather(*(one(index, outcome) for index, outcome in enumerate(acked)))
    return verdicts


# --- reporting --------------------------------------------------------------------------------


def report(
    store: str,
    results: list[Outcome],
    checked: list[Outcome],
    verdicts: dict[int, str],
    logged: int,
) -> str:
    """Counts by kind of request; ``checked`` are the acknowledged stored writes, each with its
    verdict (kept, lost, unchecked) by index."""
    by_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for outcome in results:
        by_op[outcome.op]["sent"] += 1
        by_op[outcome.op][outcome.outcome] += 1
    for index, outcome in enumerate(checked):
        by_op[outcome.op][verdicts[index]] += 1
    columns = ("sent", "acked", "kept", "lost", "unchecked", "refused", "hung", "improper")
    lines = [f"   {'':<18}" + "".join(f"{name:>10}" for name in columns)]
    for op in sorted(by_op):
        lines.append(f"   {op:<18}" + "".join(f"{by_op[op][name]:>10,}" for name in columns))
    total = collections.Counter()
    for counts in by_op.values():
        total.update(counts)
    lines.append(f"   {'all':<18}" + "".join(f"{total[name]:>10,}" for name in columns))
    details = collections.Counter(
        f"{o.outcome}: {o.op}: {o.detail}" for o in results if o.outcome != "acked"
    )
    head = (
        f"== {store}: acknowledged {total['acked']:,} (stored {len(checked):,}), "
        f"lost {total['lost']:,}, "
        f"refused properly {total['refused']:,}, hung {total['hung']:,}, "
        f"improper {total['improper']:,}; store writes the app logged as failed: {logged:,}"
    )
    lines = [head, *lines]
    for detail, count in details.most_common(12):
        lines.append(f"   {count:>6,} x {detail}")
    return "\n".join(lines)


# --- the locust replay with faults -----------------------------------------------------------


def kill_schedule(duration: float, every: float) -> list[tuple[float, str]]:
    """When to kill what: an engine replica every ``every`` seconds (a third of the run at
    most, so a short run sees two), an ingress replica once, halfway between two of them."""
    every = min(every, duration / 3)
    kills = [(at, "EngineDeployment") for at in range(int(every), int(duration), int(every))]
    ingress_at = duration / 2
    if any(at == ingress_at for at, _ in kills):
        ingress_at += every / 4
    return sorted([*kills, (ingress_at, "ResponsesIngress")])


def killer(
    schedule: list[tuple[float, str]], started: float, stop: threading.Event, log: list[str]
) -> None:
    import ray

    from tests.support.replicas import replica_actor, replica_actors

    for at, deployment in schedule:
        if stop.wait(max(0.0, started + at - time.monotonic())):
            return
        alive = replica_actors(deployment)
        if not alive:
            log.append(f"{at:>5.0f} s: no {deployment} replica alive to kill")
            continue
        victim = random.choice(alive)
        ray.kill(replica_actor(victim))
        when = f"{time.monotonic() - started:>5.0f} s ({time.strftime('%H:%M:%S')})"
        log.append(f"{when}: killed {victim['name']}")
        print(f"   {log[-1]}", flush=True)


def run_replay(
    app: serve_run.ServeRun, folder: Path, args: argparse.Namespace, users: int
) -> list[Outcome]:
    traces = folder / "traces.jsonl"
    sessions = generate(args.sessions, 2.0, seed=27)
    traces.write_text("".join(session.to_json() + "\n" for session in sessions))
    outcomes_file = folder / "outcomes.jsonl"
    locust = Path(sys.executable).parent / "locust"
    command = [str(locust), "-f", str(ROOT / "loadtests" / "locustfile.py"), "--headless"]
    command += ["-u", str(users), "-r", str(max(1, users // 10)), "-t", f"{args.duration}s"]
    command += ["--stop-timeout", str(int(args.stream_bound)), "--host", app.url, "--only-summary"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "TRACE_FILE": str(traces),
        "TRACE_TIME_SCALE": str(args.time_scale),
        "STORE_SHARE": str(args.store_share),
        "OUTCOMES_FILE": str(outcomes_file),
        "TURN_TIMEOUT_S": str(args.stream_bound),
    }
    serve_run.join(app, log_to_driver=False)
    schedule = kill_schedule(args.duration, args.kill_every)
    stop_kills, kills = threading.Event(), []
    with (folder / "locust.log").open("wb") as log:
        replay = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        started = time.monotonic()
        thread = threading.Thread(target=killer, args=(schedule, started, stop_kills, kills))
        thread.start()
        try:
            replay.wait(timeout=args.duration + args.stream_bound + 120)
        finally:
            stop_kills.set()
            thread.join()
            if replay.poll() is None:
                replay.kill()
                replay.wait()
    import ray

    ray.shutdown()
    return [
        Outcome(
            row["op"] + (" chained" if row["chained"] else ""),
            row["outcome"],
            row["detail"][:160],
            row["id"],
        )
        for row in outcomes.read(outcomes_file)
    ]


def wait_for_ingress(url: str, count: int, timeout_s: float = 180) -> None:
    """Both ingress replicas back (each names itself in ``x-serve-app-replica``)."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while len(seen) < count and time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            reply = httpx.get(f"{url}/v1/models", headers=auth(), timeout=10)
            if reply.status_code == 200:
                seen.add(reply.headers.get("x-serve-app-replica", ""))
        time.sleep(0.2)


# --- main -------------------------------------------------------------------------------------


def soak(store: str, args: argparse.Namespace) -> str:
    folder = Path(tempfile.mkdtemp(prefix=f"soak_{store}_", dir="/tmp"))
    port = free_port()
    faults = args.mode == "faults"
    try:
        with store_url(store, folder) as url:
            config = soak_config(port, url, args.engine_slots if faults else None)
            print(f"starting the app on {store} ({folder}, port {port}) ...", flush=True)
            with serve_run.running(
                config, folder, SERVE_ENV, STARTUP_TIMEOUT_S, stop_timeout_s=90
            ) as app:
                if faults:
                    users = args.users or 2 * REPLICAS * args.engine_slots
                    print(f"   replaying Codex sessions: {users} users, {args.duration} s")
                    results = run_replay(app, folder, args, users)
                    wait_for_ingress(app.url, REPLICAS)
                    took = args.duration
                else:
                    results, took = asyncio.run(run_writes(app.url, args))
                checked = [o for o in results if o.outcome == "acked" and o.stored]
                verdicts = asyncio.run(check(app.url, checked))
                logged = store_failures_logged(app)
        print(f"   {len(results):,} requests in {took:.0f} s")
        return report(store, results, checked, verdicts, logged)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["writes", "faults"])
    parser.add_argument("--stores", nargs="+", choices=["sqlite", "postgresql"])
    parser.add_argument("--responses", type=int, default=5000, help="writes: stored responses")
    parser.add_argument("--appends", type=int, default=2000, help="writes: conversation appends")
    parser.add_argument("--writers", type=int, default=64, help="writes: concurrent writers")
    parser.add_argument("--ws-share", type=float, default=0.1, help="writes: share on WebSocket")
    parser.add_argument(
        "--prompt",
        choices=["codex", "short"],
        default="codex",
        help="writes: each response a Codex session's first turn (~4k tokens), or one line",
    )
    parser.add_argument("--duration", type=int, default=600, help="faults: seconds of replay")
    parser.add_argument("--kill-every", type=float, default=120, help="faults: engine kills")
    parser.add_argument("--engine-slots", type=int, default=16, help="faults: per engine replica")
    parser.add_argument("--users", type=int, help="faults: default twice the engine's capacity")
    parser.add_argument("--store-share", type=float, default=0.5, help="faults: stored sessions")
    parser.add_argument("--sessions", type=int, default=200, help="faults: sessions in the trace")
    parser.add_argument("--time-scale", type=float, default=0.1, help="faults: think time scale")
    parser.add_argument("--stream-bound", type=float, default=120, help="seconds to a terminal")
    parser.add_argument("--keep", action="store_true", help="keep the temp folders (logs)")
    args = parser.parse_args()
    stores = args.stores or ["sqlite", "postgresql"]
    reports = []
    for store in stores:
        reports.append(soak(store, args))
        print(reports[-1], flush=True)
    print("\n" + "\n".join(reports), flush=True)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # the app stopped on a kill too
    main()
