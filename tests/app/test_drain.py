"""Streams finish while the engine deployment is downscaled under them.

The shared session app is left alone: this test runs an app of its own on the session's Ray
cluster (``serve.run``, route prefix ``/drain``, no CPUs reserved): one ingress replica and two
engine replicas of the simulated engine, with configs/local.yaml's deployment options (its
shutdown budgets among them). Turns stream until both engine replicas serve one; then the app
is deployed again with one engine replica. A `serve.run` is a new version of each deployment,
so Serve replaces the ingress replica and both engine replicas (one of them for good), each
draining while its streams run: a redeploy and a downscale at once.
Each stream must end ``response.completed`` with every token: the stopped replica gets no new
requests, its channels and its caller watch leave the draining requests alone, and the budget
(``graceful_shutdown_timeout_s``) outlasts them.

A background response started before the redeploy, with no client following it on the
replica Serve stops (one would hold the replica's drain), finishes on that replica too: its
``__del__`` lets it run within the budget, and a client reading it through the new replica
sees its events continue where it left them.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml
from openai import AsyncOpenAI
from ray import serve

from serve_app.config import AppArgs
from serve_app.serving.engine.deployment import EngineDeployment
from serve_app.serving.ingress import ResponsesIngress
from tests.support import MODEL
from tests.support.helpers import REPO

APP = "drain"
PREFIX = "/drain"
# 1,600 tokens at 200 tokens/s: each turn streams for 8 s, most of it after the downscale.
OUTPUT_TOKENS = 1600
MAX_TURNS = 8
# Ray's request-router config serializes its class between a global register and unregister
# (ray.cloudpickle, not thread-safe): building a deployment's options in one thread while
# another builds them, or parses them in serve.status(), failed once with "... is not
# registered for pickle by value". The test's threads take turns.
_SERVE_CONFIGS = threading.Lock()


def _deploy(engine_replicas: int, store_url: str) -> None:
    """configs/local.yaml's app, on no CPUs (the session app holds them), blocking until
    Serve has it running."""
    config = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())["applications"][0]
    engine_options = {**config["args"]["engine"]["options"], "default_output_tokens": 1600}
    args = AppArgs.model_validate(
        {
            **config["args"],
            "engine": {"kind": "simulated", "options": engine_options},
            "store": {"url": store_url},
        }
    )
    options = {
        deployment["name"]: {
            key: value
            for key, value in deployment.items()
            if key not in ("name", "num_replicas", "ray_actor_options")
        }
        for deployment in config["deployments"]
    }
    for deployment in ("ResponsesIngress", "EngineDeployment"):
        assert options[deployment].get("graceful_shutdown_timeout_s"), deployment
    with _SERVE_CONFIGS:
        engine = EngineDeployment.options(
            **options["EngineDeployment"],
            num_replicas=engine_replicas,
            ray_actor_options={"num_cpus": 0},
        ).bind(args.engine)
        ingress = ResponsesIngress.options(
            **options["ResponsesIngress"], num_replicas=1, ray_actor_options={"num_cpus": 0}
        ).bind(engine, args)
    serve.run(ingress, name=APP, route_prefix=PREFIX)


def _replicas_streaming() -> set[str]:
    """The drain app's engine replicas with a call in flight (a stream or a channel; none of
    the turns has ended yet, so a channel means a stream too), asked of the replica actors."""
    prefix = f"SERVE_REPLICA::{APP}#EngineDeployment#"
    actors = [
        actor
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["name"].startswith(prefix)
    ]
    ongoing = {
        actor["name"]: ray.get_actor(
            actor["name"], namespace=actor["namespace"]
        ).get_num_ongoing_requests.remote()
        for actor in actors
    }
    return {
        name for name, count in zip(ongoing, ray.get(list(ongoing.values())), strict=True) if count
    }


async def _turn(client: AsyncOpenAI, started: asyncio.Event) -> dict[str, Any]:
    stream = await client.responses.create(
        model=MODEL,
        input="tell me a long story",
        prompt_cache_key=f"drain-{uuid.uuid4()}",
        stream=True,
    )
    last: Any = None
    async for event in stream:
        if event.type == "response.output_text.delta" or event.type.endswith(".delta"):
            started.set()
        last = event
    return {"type": last.type, "output_tokens": last.response.usage.output_tokens}


@pytest.fixture
def drain_app(app_cluster: None, tmp_path: Path):
    store_url = f"sqlite+aiosqlite:///{tmp_path / 'drain.db'}"
    _deploy(2, store_url)
    yield store_url
    serve.delete(APP)


async def test_streams_finish_while_their_engine_replica_is_stopped(
    app_url: str, drain_app: str
) -> None:
    # A turn cut short fails (an error, or a stream that ends early) rather than hanging.
    client = AsyncOpenAI(
        base_url=f"{app_url}{PREFIX}/v1", api_key="sk-test", max_retries=0, timeout=120
    )
    turns: list[asyncio.Task] = []
    streaming: set[str] = set()
    while len(streaming) < 2 and len(turns) < MAX_TURNS:
        started = asyncio.Event()
        turns.append(asyncio.create_task(_turn(client, started)))
        await asyncio.wait_for(started.wait(), 60)
        streaming = await asyncio.to_thread(_replicas_streaming)
    assert len(streaming) == 2, "the turns did not reach both engine replicas"
    assert not any(turn.done() for turn in turns)

    # One engine replica: Serve stops one of the two, each serving a turn now.
    downscale = asyncio.create_task(asyncio.to_thread(_deploy, 1, drain_app))
    watch = asyncio.create_task(_stopping_while_streaming(turns))
    results = await asyncio.gather(*turns, return_exceptions=True)
    assert await watch, "no engine replica was stopping while the turns streamed"
    assert all(
        isinstance(result, dict) and result["type"] == "response.completed" for result in results
    ), results
    assert min(result["output_tokens"] for result in results) >= OUTPUT_TOKENS, results
    await downscale
    for _ in range(100):  # the stopped replica goes once its channels have closed
        if await asyncio.to_thread(_engine_replica_states) == {"RUNNING": 1}:
            break
        await asyncio.sleep(0.5)
    assert await asyncio.to_thread(_engine_replica_states) == {"RUNNING": 1}


async def _stopping_while_streaming(turns: list[asyncio.Task]) -> bool:
    """Whether an engine replica was seen stopping before every turn had ended."""
    while not all(turn.done() for turn in turns):
        if "STOPPING" in await asyncio.to_thread(_engine_replica_states):
            return True
        await asyncio.sleep(0.2)
    return False


def _engine_replica_states() -> dict[str, int]:
    return _replica_states("EngineDeployment")


def _replica_states(deployment: str) -> dict[str, int]:
    with _SERVE_CONFIGS:
        status = serve.status().applications[APP].deployments[deployment]
    return {getattr(state, "value", state): n for state, n in status.replica_states.items() if n}


async def test_a_background_response_finishes_while_its_ingress_replica_is_replaced(
    app_url: str, drain_app: str
) -> None:
    client = AsyncOpenAI(
        base_url=f"{app_url}{PREFIX}/v1", api_key="sk-test", max_retries=0, timeout=120
    )
    raw = await client.responses.with_raw_response.create(
        model=MODEL,
        input="tell me a long story",
        prompt_cache_key=f"drain-{uuid.uuid4()}",
        background=True,
    )
    created, runner = raw.parse(), raw.headers["x-serve-app-replica"]
    # Followed until its text streams, then left: no request of it holds the replica's drain.
    seen = await _follow(client, created.id, -1, until_text=True)

    redeploy = asyncio.create_task(asyncio.to_thread(_deploy, 1, drain_app))
    stopping_at = await _ingress_stopping()
    # A client following it again from where it left, through whichever replica serves now.
    rest = await _follow(client, created.id, seen[-1].sequence_number)
    await redeploy

    final = await client.responses.retrieve(created.id)
    assert final.status == "completed", final.error
    assert final.usage.output_tokens >= OUTPUT_TOKENS
    assert rest[-1].type == "response.completed"
    whole = await _follow(client, created.id, -1)
    numbers = [event.sequence_number for event in whole]
    assert numbers == list(range(len(whole)))
    assert [event.sequence_number for event in seen + rest] == numbers
    assert whole[-1].type == "response.completed"
    text = "".join(event.delta for event in whole if event.type == "response.output_text.delta")
    assert text and text == final.output_text
    # It ran on the replica that was replaced, and ended after Serve began stopping it.
    answered = await client.responses.with_raw_response.retrieve(created.id)
    assert answered.headers["x-serve-app-replica"] != runner
    assert final.completed_at is not None and final.completed_at >= int(stopping_at)


async def _follow(
    client: AsyncOpenAI, response_id: str, after: int, until_text: bool = False
) -> list[Any]:
    """A background response's events after ``after``: to its end, or (``until_text``) to
    its first text delta."""
    events = []
    stream = await client.responses.retrieve(response_id, stream=True, starting_after=after)
    async with stream:
        async for event in stream:
            events.append(event)
            if until_text and event.type == "response.output_text.delta":
                break
    return events


async def _ingress_stopping() -> float:
    """When the drain app's ingress replica was first seen stopping (time.time())."""
    deadline = time.monotonic() + 60
    while "STOPPING" not in await asyncio.to_thread(_replica_states, "ResponsesIngress"):
        assert time.monotonic() < deadline, "the ingress replica was not stopped"
        await asyncio.sleep(0.2)
    return time.time()
