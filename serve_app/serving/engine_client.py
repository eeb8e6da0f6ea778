"""How the ingress reaches engine replicas: a Serve handle, streamed and keyed for routing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from ray.serve.exceptions import BackPressureError

from serve_app.engines.base import Engine, GenerateChunk, GenerateRequest, error_chunk
from serve_app.protocol.errors import RateLimited


class EngineClient(Protocol):
    def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Stream a request's chunks; closing the iterator early aborts the request."""
        ...


class HandleEngineClient:
    """Calls the engine deployment through its handle. Ray's back-pressure error (every engine
    replica and the queue full) comes out as `RateLimited`.

    ``session_id`` carries the routing key, so the engine deployment's request router can keep
    a conversation on the replica that holds its prefix in KV cache. ``caller``: the name of
    this (ingress) replica's actor, so an engine replica aborts the requests of a caller that
    died (see serve_app.serving.engine_deployment).
    """

    def __init__(self, handle, caller: str | None = None) -> None:  # a DeploymentHandle
        self._handle = handle.options(stream=True)
        self._caller = caller

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        call = self._handle.options(session_id=request.session_id).generate
        response = call.remote(request, caller=self._caller)
        finished = False
        try:
            async for chunk in response:
                yield chunk
                finished = chunk.finish_reason is not None
        except BackPressureError as exc:
            # Every engine replica is full, and the queue too: ours, so the service needs no Ray.
            # The call never reached a replica: nothing to cancel (cancelling it would raise
            # Ray's error again, in place of ours).
            finished = True
            raise RateLimited() from exc
        finally:
            if not finished:
                # The client went away (or the ingress failed): cancel the engine call, which
                # makes the engine replica abort the request and free its KV blocks.
                response.cancel()


class InProcessEngineClient:
    """Runs an engine in the caller's process: the ingress app without Ray (tests, debugging).
    An engine's exception ends the stream with an error chunk, as the engine deployment's does."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        finished = False
        try:
            async for chunk in self._engine.generate(request):
                yield chunk
                finished = chunk.finish_reason is not None
        except Exception as exc:
            finished = True  # the engine is done with the request
            yield error_chunk(request.request_id, exc)
        finally:
            if not finished:
                await self._engine.abort(request.request_id)
