"""The ingress deployment: FastAPI over HTTP, the Responses protocol, CPU only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator

import ray
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from openai.types.responses import ResponseStreamEvent
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.config import AppArgs
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.protocol.body_errors import from_validation_errors
from serve_app.protocol.errors import (
    APIError,
    error_body,
)
from serve_app.protocol.prompt_cache import is_prewarm
from serve_app.protocol.request_tools import omitted_types
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.responses import dump_response
from serve_app.protocol.sse import encode_event
from serve_app.serving import metrics
from serve_app.serving.admission import stored as rules
from serve_app.serving.admission.responses import failed_response_error
from serve_app.serving.background import BackgroundRunner
from serve_app.serving.compaction import compact
from serve_app.serving.conversations import conversations_router
from serve_app.serving.engine.client import EngineClient, HandleEngineClient, replicas_gone
from serve_app.serving.engine.liveness import Watchdog
from serve_app.serving.http.auth import ApiKeys, Owner, RequireKey, caller
from serve_app.serving.http.body_limit import BodyLimits
from serve_app.serving.http.exposure import ApiAccess, Exposure, api_access, serve_http_host
from serve_app.serving.http.keepalive import KeepAliveStreamingResponse
from serve_app.serving.http.pagination import Paging
from serve_app.serving.http.pagination import page as _page
from serve_app.serving.logs import route_to_replica_log
from serve_app.serving.moderation import Moderator
from serve_app.serving.readiness import Readiness, not_ready_body
from serve_app.serving.reasoning_keys import shared_vault
from serve_app.serving.retention import RetentionSweep
from serve_app.serving.tools.contract import ToolRunners
from serve_app.serving.turn.references import as_stored_input
from serve_app.serving.turn.service import ResponsesService
from serve_app.serving.turn.state import Ask, Turn
from serve_app.serving.websocket import websocket_router
from serve_app.store.base import ResponseStore, StoredResponse
from serve_app.store.shared import alive_nodes, printable, require_shared_store
from serve_app.store.sql import SqlResponseStore

logger = logging.getLogger(__name__)

_HTTP_ERROR_TYPES = {404: "not_found_error", 405: "invalid_request_error"}
# Names the tools a request was served without (a web_search with no browser server), comma-
# separated: what a client sent that the model was not offered (docs/protocol.md).
OMITTED_TOOLS_HEADER = "x-serve-app-omitted-tools"
# How long a starting ingress replica waits for a render worker before taking requests: a
# worker's start took 12.7 s on a loaded machine (docs/reliability.md).
RENDER_WARM_TIMEOUT_S = 60.0


def app_store(url: str, args: AppArgs) -> SqlResponseStore:
    """The response store at ``url`` as the app uses it: the pool and retention of ``args``, and
    item references stored by reference (as the door resolves them)."""
    return SqlResponseStore(
        url, args.store, retention_s=args.store.retention_s(), as_input=as_stored_input
    )


def create_api(
    args: AppArgs,
    engine: EngineClient,
    vault: ReasoningVault,
    store: ResponseStore,
    replica_id: str = "local",
    api_keys: ApiKeys | None = None,
    access: ApiAccess | None = None,
    tools: ToolRunners | None = None,
    moderation: EngineClient | None = None,
) -> FastAPI:
    """The HTTP API, usable with any `EngineClient` (the Serve ingress passes a handle).
    ``access``: what `/health` says of the API (by default, closed when there are keys).
    ``tools``: the runners of the tools the server runs (serving/tools/contract.py).
    ``moderation``: the moderation model's engine, when ``args.moderation`` configures one."""
    api = FastAPI(title="serve_app", description="OpenAI Responses API for gpt-oss")
    api_keys = api_keys or ApiKeys([])
    access = access or ("closed" if api_keys.enabled else "open")
    readiness = Readiness(store, engine)
    limits = args.limits

    api.add_middleware(BodyLimits, max_bytes=limits.max_body_bytes, timeout_s=limits.body_timeout_s)
    # Added last, so it runs first: the key is checked before the body is read or validated.
    api.add_middleware(RequireKey, api_keys=api_keys)

    # Added after RequireKey, so it runs first and names the replica on its refusals too.
    api.add_middleware(NameTheReplica, replica_id=replica_id)

    moderator = (
        Moderator(args.moderation, moderation)
        if args.moderation is not None and moderation is not None
        else None
    )
    service = ResponsesService(args, engine, vault, store, tools, moderator)
    background = BackgroundRunner(service, store, replica_id, args.background)
    api.state.background = background  # the Serve ingress starts its lease sweep
    api.state.service = service  # its render workers stop with the replica (`close`)
    api.include_router(conversations_router(store))
    api.include_router(websocket_router(service, api_keys, limits))
    _install_error_handlers(api)
    created = int(time.time())

    @api.post("/v1/responses", response_model=None)
    async def create_response(body: ResponsesRequest, owner: Owner) -> Response:
        turn = await service.prepare(Ask(body, owner))
        answer = await _answer(turn, body)
        omitted = omitted_types(turn.request.tools)
        if omitted:  # the tools the request was served without (AppArgs.tools)
            answer.headers[OMITTED_TOOLS_HEADER] = ", ".join(omitted)
        return answer

    async def _answer(turn: Turn, body: ResponsesRequest) -> Response:
        if is_prewarm(body.prompt_cache_options):  # the WebSocket's prewarm too: one path
            return await _prewarm(service, turn, stream=bool(body.stream))
        if body.background:
            await background.start(turn)
            if body.stream:
                return _event_stream(background.stream(turn.response.id))
            return JSONResponse(dump_response(turn.response))
        if body.stream:
            return _event_stream(await _opened(service.event_batches(turn)))
        response = await service.run(turn)  # the engines at capacity: `RateLimited`, a 429
        if response.status == "failed" and response.error is not None:
            raise failed_response_error(response.error.message, response.error.code)
        return JSONResponse(dump_response(response))

    @api.post("/v1/responses/input_tokens")
    async def count_input_tokens(body: ResponsesRequest, owner: Owner) -> dict:
        prompt = await service.render(Ask(body, owner))
        return {"object": "response.input_tokens", "input_tokens": len(prompt.token_ids)}

    @api.post("/v1/responses/compact")
    async def compact_response(body: ResponsesRequest, owner: Owner) -> dict:
        return await compact(service, Ask(body, owner))

    @api.get("/v1/responses/{response_id}", response_model=None)
    async def retrieve_response(
        response_id: str, owner: Owner, stream: bool = False, starting_after: int = -1
    ) -> dict | Response:
        stored = await _stored(store, response_id, owner)
        if _running_in_background(stored) and await background.end_if_lapsed(response_id):
            stored = await _stored(store, response_id, owner)  # its runner was gone: ended now
        if not stream:
            return stored.response
        rules.check_streamable(stored.response)
        return _event_stream(background.stream(response_id, starting_after))

    @api.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, owner: Owner) -> dict:
        await _stored(store, response_id, owner)
        if not await store.delete(response_id):
            raise rules.response_not_found(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    @api.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(response_id: str, owner: Owner) -> dict:
        stored = await _stored(store, response_id, owner)
        rules.check_cancellable(stored.response)
        await store.request_cancel(response_id)
        return await _wait_until_settled(store, background, response_id, owner)

    @api.get("/v1/responses/{response_id}/input_items")
    async def list_input_items(response_id: str, owner: Owner, asked: Paging) -> dict:
        return _page((await _stored(store, response_id, owner)).input_items, asked)

    @api.get("/v1/models", dependencies=[Depends(caller)])
    async def list_models() -> dict:
        return {"object": "list", "data": [_model_card(name, created) for name in _names(args)]}

    @api.get("/v1/models/{model:path}", dependencies=[Depends(caller)])
    async def get_model(model: str) -> dict:
        rules.check_model(args, model)
        return _model_card(model, created)

    # `/health` goes through the replica like any request. Ray Serve's proxy hands a request to
    # a replica only while it holds fewer than `max_ongoing_requests` (256 below; the configs
    # may set more), and every open WebSocket and every request whose body is still arriving
    # holds one of those slots; at the limit the proxy queues everything else, `/health` too.
    # Serve's own health check is not affected: it is the controller's `check_health` call on
    # the replica actor (whose concurrency Serve sets above `max_ongoing_requests`), and the
    # proxy answers `/-/healthz` itself. So the limits keep user traffic from taking every
    # slot: `max_websockets_per_replica` below `max_ongoing_requests`, `body_timeout_s` for slow
    # bodies, and `RequireKey` refusing a request without a valid key before its body.
    #
    # `/health` is liveness, and says whether the API is open (no keys); `/ready` is
    # readiness: the store and an engine answer, or a 503 naming what did not
    # (serve_app/serving/readiness.py).
    @api.get("/health")
    async def health() -> dict:
        return {"status": "ok", "api": access}

    @api.get("/ready", response_model=None)
    async def ready() -> dict | JSONResponse:
        failures = await readiness.failures()
        if failures:
            return JSONResponse(not_ready_body(failures), status_code=503)
        return {"status": "ready", "api": access}

    @api.get("/metrics")
    async def prometheus_metrics() -> Response:
        # This process's metrics only (the replica that happened to answer); the service's,
        # every replica's, are on each Ray node's metrics port (serve_app/telemetry.py).
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return api


async def _prewarm(service: ResponsesService, turn: Turn, *, stream: bool) -> Response:
    """A prewarm over HTTP (`ResponsesService.prewarm`): its two events as SSE, or the
    completed response (a 500 in OpenAI's shape if it could not be stored)."""
    events = await service.prewarm(turn, routable=True)
    if stream:
        return _event_stream(_sse(_one_batch(events)))
    response = events[-1].response  # type: ignore[union-attr]: created/completed/failed
    if response.status == "failed" and response.error is not None:
        raise failed_response_error(response.error.message, response.error.code)
    return JSONResponse(dump_response(response))


async def _one_batch(
    events: list[ResponseStreamEvent],
) -> AsyncGenerator[list[ResponseStreamEvent]]:
    yield events


async def _sse(batches: AsyncGenerator[list[ResponseStreamEvent]]) -> AsyncIterator[bytes]:
    """One body message per engine chunk, all its events in it: each message is a round trip
    to the HTTP proxy. Closing this closes the events, which aborts the engine request."""
    async with contextlib.aclosing(batches):
        async for batch in batches:
            yield b"".join(encode_event(event) for event in batch)


async def _opened(batches: AsyncGenerator[list[ResponseStreamEvent]]) -> AsyncIterator[bytes]:
    """The stream's SSE, its first batch (``response.created``) read before the 200 is sent:
    it comes once an engine has taken the request, and a refusal before it (`RateLimited`)
    is answered as an HTTP 429, not a ``response.failed`` inside a 200 (OpenAI's way, which
    SDKs retry and load balancers count)."""
    try:
        first = await anext(batches)
    except BaseException:  # refused, failed, or the client left: the engine request ends
        await batches.aclose()
        raise

    async def stream() -> AsyncIterator[bytes]:
        yield b"".join(encode_event(event) for event in first)
        async for chunk in _sse(batches):
            yield chunk

    return stream()


class NameTheReplica:
    """Which ingress replica answered (``x-serve-app-replica``): for logs and debugging, and
    tests of shared state. Pure ASGI: Starlette's ``BaseHTTPMiddleware`` (``@app.middleware``)
    relays every message of a streamed body through a memory stream and a task of its own,
    which cost more CPU per streamed token than the rest of the ingress (bench_stream.py)."""

    def __init__(self, app: ASGIApp, replica_id: str) -> None:
        self.app = app
        self.header = (b"x-serve-app-replica", replica_id.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def named(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (name, value)
                    for name, value in message.get("headers", ())
                    if name.lower() != self.header[0]
                ]
                message = {**message, "headers": [*headers, self.header]}
            await send(message)

        await self.app(scope, receive, named)


def _event_stream(chunks: AsyncIterator[bytes]) -> StreamingResponse:
    # With a comment line after a silence, so that every front sees a client that left
    # (serve_app/serving/http/keepalive.py).
    return KeepAliveStreamingResponse(
        chunks,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _wait_until_settled(
    store: ResponseStore, background: BackgroundRunner, response_id: str, owner: str | None
) -> dict:
    """The response once its runner has stopped it, or the canceller has ended it because its
    runner is gone (or as it is when the wait runs out: a lease and a little more)."""
    deadline = time.monotonic() + background.lease.lease_s + 2
    checked_at = float("-inf")
    while True:
        stored = await _stored(store, response_id, owner)
        if stored.response.get("status") not in ("queued", "in_progress"):
            return stored.response
        if time.monotonic() > deadline:
            return stored.response
        if time.monotonic() - checked_at >= 1:  # the runner, if alive, stops it sooner
            checked_at = time.monotonic()
            await background.end_if_lapsed(response_id, cancelled=True)
            continue
        await asyncio.sleep(0.1)


def _running_in_background(stored: StoredResponse) -> bool:
    return bool(stored.response.get("background")) and stored.response.get("status") in (
        "queued",
        "in_progress",
    )


async def _stored(store: ResponseStore, response_id: str, owner: str | None) -> StoredResponse:
    return rules.owned_response(response_id, await store.get(response_id), owner)


def _names(args: AppArgs) -> list[str]:
    return [args.model, *args.model_aliases]


def _model_card(name: str, created: int) -> dict:
    return {"id": name, "object": "model", "created": created, "owned_by": "serve_app"}


def _install_error_handlers(api: FastAPI) -> None:
    @api.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        metrics.REQUESTS.labels("rejected").inc()
        logger.info("rejected: %s (param %s, code %s)", exc.message, exc.param, exc.code)
        return JSONResponse(exc.body(), status_code=exc.status_code, headers=exc.headers)

    @api.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return await api_error(request, from_validation_errors(list(exc.errors())))

    @api.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        error_type = _HTTP_ERROR_TYPES.get(exc.status_code, "invalid_request_error")
        return JSONResponse(error_body(str(exc.detail), error_type), status_code=exc.status_code)

    @api.exception_handler(Exception)
    async def unexpected_error(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return JSONResponse(
            error_body("The server had an error processing your request.", "server_error"),
            status_code=500,
        )


@serve.deployment(name="ResponsesIngress", max_ongoing_requests=256)
@serve.ingress()
class ResponsesIngress:
    """Routes are built per replica: they need the engine handle and the app's args."""

    async def __init__(self, engine_handle, args: AppArgs, moderation_handle=None) -> None:
        # The app's lines in this replica's Serve log, with their request's id (serving/logs.py).
        route_to_replica_log()
        store_url = args.store.resolved_url()
        nodes = alive_nodes()
        require_shared_store(store_url, nodes)
        # Closed by default: without keys, an app reachable beyond loopback refuses to start.
        api_keys = ApiKeys.from_env(args.secrets)
        exposure = Exposure(await serve_http_host(), nodes)
        access = api_access(api_keys.enabled, exposure, args.allow_open_api)
        logger.info("response store: %s", printable(store_url))
        self._store = app_store(store_url, args)
        await self._store.start()
        streaming = args.streaming.resolved()
        vault = await shared_vault(args.secrets.resolved(), self._store)
        actor_name = ray.get_runtime_context().get_actor_name()
        self._api = create_api(
            args,
            # Named so engine replicas abort this replica's requests should it die, and send
            # them its requests' chunks over one channel each (engine_channel).
            HandleEngineClient(
                engine_handle,
                caller=actor_name,
                channels=streaming.channels,
                watchdog=Watchdog(
                    streaming.silence_s,
                    streaming.heartbeat_s,
                    streaming.live_silence_s,
                    gone=replicas_gone,  # a silent replica's death confirmed with Ray
                ),
            ),
            vault,
            self._store,
            replica_id=serve.get_replica_context().replica_id.unique_id,
            api_keys=api_keys,
            access=access,
            # The moderation model's deployment, when the app has one: its judgements are
            # short, each on its own stream (no channel); named, so a judgement of a replica
            # that died is aborted there too.
            moderation=(
                HandleEngineClient(moderation_handle, caller=actor_name, channels=False)
                if moderation_handle is not None
                else None
            ),
        )
        # Background responses whose replica died (or whose app restarted) are ended now.
        self._api.state.background.start_sweeping()
        self._shutdown_grace_s = args.background.shutdown_grace_s
        await self._warm(self._api.state.service)
        # Expired responses are deleted by every replica (sweeps may overlap).
        self._retention = RetentionSweep(self._store, args.store)
        self._retention.start()

    @staticmethod
    async def _warm(service: ResponsesService) -> None:
        """Its render workers started, and one ready before the replica takes a request (Serve
        sends none until ``__init__`` returns); past `RENDER_WARM_TIMEOUT_S` it takes them
        anyway: a large request then waits for a worker, a small one renders here."""
        started = time.monotonic()
        service.warm()
        if await service.warmed(RENDER_WARM_TIMEOUT_S):
            logger.info("render workers ready in %.1f s", time.monotonic() - started)
        else:
            logger.warning(
                "render workers not ready after %.0f s: taking requests", RENDER_WARM_TIMEOUT_S
            )

    def __serve_build_asgi_app__(self) -> FastAPI:
        return self._api

    async def __del__(self) -> None:
        # Serve's graceful shutdown (a redeploy, a scale-down), once the replica's requests have
        # drained: the background responses running here finish first, within the shutdown's
        # budget (the replica and its engine handle work on meanwhile); those that cannot are
        # ended `failed` before Serve kills the replica, rather than when their leases lapse.
        await self._api.state.background.stop(self._shutdown_grace_s)
        await self._api.state.service.aclose()  # its render workers, its MCP sessions
        await self._retention.stop()
        await self._store.close()
