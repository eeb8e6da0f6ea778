"""Liveness of the streams from engine replicas (serve_app.serving.engine.liveness): a request
whose engine replica goes silent fails within 2 s, on a channel or on its own stream, and a
stream that is only quiet (the engine pausing) lives on on its heartbeats. The real classes
(`HandleEngineClient`, the engine deployment's class, the simulated engine), joined by the
stand-in for Ray's streamed handle calls of tests/unit/serving/engine/test_channel.py, whose
``hang`` stops a call's items without an error, as the gRPC transport did with a killed replica
(issue 31)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from ray import cloudpickle

from serve_app.engines.base import GenerateChunk, GenerateRequest
from serve_app.serving.engine.client import HandleEngineClient
from serve_app.serving.engine.deployment import EngineDeployment
from serve_app.serving.engine.liveness import SILENCE_S, EngineSilent
from tests.unit.serving.engine.test_channel import (
    _CALLS,
    CALLER,
    _channel_open,
    _Handle,
    _Recording,
    _replica,
    _request,
    _tokens,
)

DEADLINE_S = 2.0  # the issue's: a request whose engine replica died fails within this


async def _fails_silent_within(stream: AsyncIterator[GenerateChunk], deadline_s: float) -> float:
    """Read ``stream`` to its end: it must end with `EngineSilent` within ``deadline_s``."""
    started = time.monotonic()
    with pytest.raises(EngineSilent):
        async with asyncio.timeout(deadline_s + 3):  # a hang fails here, not at pytest's timeout
            async for _ in stream:
                pass
    return time.monotonic() - started


@pytest.fixture
async def replica() -> AsyncIterator[Any]:
    replica = await _replica(decode_tokens_per_s=200, output_tokens=4000)
    yield replica
    await replica._engine.shutdown()


async def test_requests_on_a_channel_fail_within_2s_when_the_replica_goes_silent(
    replica: Any,
) -> None:
    client = HandleEngineClient(_Handle(replica), caller=CALLER)
    await _tokens(client, _request("r0", 5))
    await _channel_open(client)
    streams = [client.stream(_request(f"long{i}", 10_000)) for i in range(3)]
    for stream in streams:
        await anext(stream)
    for call in _CALLS:  # the replica stops sending on every call, the channel's among them
        call.hang()
    took = await asyncio.gather(*(_fails_silent_within(s, DEADLINE_S) for s in streams))
    assert max(took) < DEADLINE_S, took
    assert min(took) > SILENCE_S - 0.3, took  # not before its silence was long enough
    await asyncio.sleep(0)
    assert not client._channels  # the next request to that replica opens a new channel


async def test_a_request_on_its_own_stream_fails_within_2s_when_the_replica_goes_silent(
    replica: Any,
) -> None:
    client = HandleEngineClient(_Handle(replica), caller=CALLER, channels=False)
    _CALLS.clear()
    stream = client.stream(_request("own", 10_000))
    await anext(stream)
    (call,) = _CALLS
    call.hang()
    assert await _fails_silent_within(stream, DEADLINE_S) < DEADLINE_S


class _Pausing(_Recording):
    """The simulated engine, pausing ``pause_s`` after its first token (a long prefill, or a
    request waiting for a batch slot, looks the same to the stream)."""

    pause_s = 2 * SILENCE_S

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        first = True
        async for chunk in super().generate(request):
            yield chunk
            if first and chunk.token_ids:
                first = False
                await asyncio.sleep(self.pause_s)


@pytest.mark.parametrize("shipped", [False, True], ids=["as-defined", "as-serve-ships-it"])
async def test_a_quiet_stream_lives_on_its_heartbeats_on_a_channel_and_on_its_own(
    shipped: bool,
) -> None:
    if shipped:
        # Serve ships the deployment's class to its replicas by value (cloudpickle: the
        # module's name is bound to the Deployment, not the class), and its methods' globals go
        # as copies: a module-level singleton such as `HEARTBEAT` is then another object there.
        # Unpickled in this process, cloudpickle puts those copies on the class itself.
        cloudpickle.loads(cloudpickle.dumps(EngineDeployment.func_or_class))
    replicas = [await _replica(decode_tokens_per_s=200, output_tokens=20) for _ in range(2)]
    for replica in replicas:
        replica._engine.__class__ = _Pausing  # the same engine, pausing mid-answer
    on_channel = HandleEngineClient(_Handle(replicas[0]), caller=CALLER)
    own = HandleEngineClient(_Handle(replicas[1]), caller=CALLER, channels=False)
    try:
        await _tokens(on_channel, _request("r0", 2))  # opens the channel (pauses too)
        await _channel_open(on_channel)
        started = time.monotonic()
        answers = await asyncio.gather(
            _tokens(on_channel, _request("channel", 20)), _tokens(own, _request("own", 20))
        )
        assert time.monotonic() - started > _Pausing.pause_s  # they were silent that long
        for chunks in answers:
            assert [chunk.finish_reason for chunk in chunks][-1] == "length"
            assert sum(len(chunk.token_ids) for chunk in chunks) == 20
    finally:
        for replica in replicas:
            await replica._engine.shutdown()
