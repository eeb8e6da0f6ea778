"""The channel between an engine replica and an ingress replica (serve_app.serving.engine.channel),
both ends for real (`HandleEngineClient`, the engine deployment's class, the simulated engine),
joined by a stand-in for Ray's streamed handle calls that behaves as Ray's do: the replica's
generator runs on as a task of its own, its items are serialized and queue for the caller (an item
that cannot be pickled fails the call), and cancelling the call cancels that task. No Ray (the
session app's tests run the same code through Serve)."""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ray.exceptions import ActorDiedError
from ray.serve.exceptions import RequestCancelledError

from serve_app.engines.base import EngineError, GenerateChunk, GenerateRequest, SamplingSettings
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from serve_app.routing import local_routers
from serve_app.routing.prefill import DECODING_KEY, QUEUED_KEY
from serve_app.serving.engine import deployment as engine_deployment
from serve_app.serving.engine.channel import ChannelClosed, Outbox
from serve_app.serving.engine.client import HandleEngineClient
from serve_app.serving.engine.deployment import EngineDeployment

CALLER = "ingress-1"
_DONE = object()
# What "nothing hangs" waits for before failing a scenario (see its test).
HANG_S = 20


class _Call:
    """A streamed handle call as Ray runs it: the generator is driven by a task of its own."""

    def __init__(self, generator: AsyncIterator[Any], items_seen: list[int]) -> None:
        self._items: asyncio.Queue[Any] = asyncio.Queue()
        self._items_seen = items_seen
        self._hung = False
        self._flowing = asyncio.Event()  # cleared: items wait (`hold`)
        self._flowing.set()
        self._task = asyncio.create_task(self._drive(generator))

    async def _drive(self, generator: AsyncIterator[Any]) -> None:
        try:
            async with contextlib.aclosing(generator):
                async for item in generator:
                    self._items_seen.append(1)
                    # As Ray does: the caller gets a copy, and an item that cannot be serialized
                    # fails the whole call (the replica's generator is closed).
                    self._items.put_nowait(pickle.loads(pickle.dumps(item)))
            self._items.put_nowait(_DONE)
        except asyncio.CancelledError:  # Ray's caller gets an error of its own
            if not self._hung:
                self._items.put_nowait(RequestCancelledError("cancelled"))
        except Exception as exc:  # handed to the caller, as Ray does
            self._items.put_nowait(exc)

    def __aiter__(self) -> _Call:
        return self

    async def __anext__(self) -> Any:
        item = await self._items.get()
        await self._flowing.wait()
        if item is _DONE:
            self._items.put_nowait(_DONE)
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._items.put_nowait(item)
            raise item
        return item

    def cancel(self) -> None:
        if not self._flowing.is_set():  # held: what waited is dropped, the caller told at once
            while not self._items.empty():
                self._items.get_nowait()
            self._items.put_nowait(RequestCancelledError("cancelled"))
            self._flowing.set()
        if self._hung:  # as a gRPC call cancelled by its caller: the caller's wait ends
            self._items.put_nowait(RequestCancelledError("cancelled"))
        self._task.cancel()

    def die(self) -> None:
        """The replica's process died: the call stops and its caller gets Ray's error."""
        self._task.cancel()
        self._items.put_nowait(ActorDiedError())

    def hold(self) -> None:
        """The replica's items stop reaching the caller, heartbeats included, until `release`:
        as from a replica whose event loop is starved (alive, its actor listed by Ray)."""
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    def hang(self) -> None:
        """The replica stops sending and no error comes, as over gRPC from a replica that died
        (issue 31) or from one whose event loop is stuck: only cancelling the call ends the
        caller's wait."""
        self._hung = True
        self._task.cancel()


class _Handle:
    """The handle methods the engine client calls, on one replica: ``generate`` and ``channel``."""

    def __init__(self, replica: Any) -> None:
        self.replica = replica
        self.items: dict[str, list[int]] = {"generate": [], "channel": []}

    def options(self, **_: Any) -> _Handle:
        return self

    @property
    def generate(self) -> Any:
        return _Method(lambda *a, **k: self.replica.generate(*a, **k), self.items["generate"])

    @property
    def channel(self) -> Any:
        return _Method(lambda *a, **k: self.replica.channel(*a, **k), self.items["channel"])


class _Method:
    def __init__(self, call: Any, items_seen: list[int]) -> None:
        self._call = call
        self._items_seen = items_seen

    def remote(self, *args: Any, **kwargs: Any) -> _Call:
        call = _Call(self._call(*args, **kwargs), self._items_seen)
        _CALLS.append(call)
        return call


_CALLS: list[_Call] = []  # every call made, to kill the replica under them


class _Recording(SimulatedEngine):
    """The simulated engine, keeping each request's tokens as it produced them."""

    def __init__(self, config: SimulatedEngineConfig) -> None:
        super().__init__(config)
        self.produced: dict[str, list[int]] = {}

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        tokens = self.produced.setdefault(request.request_id, [])
        async for chunk in super().generate(request):
            tokens.extend(chunk.token_ids)
            yield chunk


class _BareReplica(EngineDeployment.func_or_class):  # type: ignore[name-defined,misc]
    def __del__(self) -> None:
        pass


async def _replica(decode_tokens_per_s: float, output_tokens: int) -> Any:
    engine = _Recording(
        SimulatedEngineConfig(
            decode_tokens_per_s=decode_tokens_per_s, default_output_tokens=output_tokens
        )
    )
    await engine.start()

    async def everyone_alive() -> set[str]:
        return {CALLER}

    replica = _BareReplica.__new__(_BareReplica)
    replica._serve(engine, "engine-1", everyone_alive, caller_check_period_s=0.1)
    return replica


def _request(request_id: str, max_tokens: int) -> GenerateRequest:
    prompt = [200006, 1428, 200008, 12194, 200007]
    return GenerateRequest(request_id, prompt, SamplingSettings(max_tokens))


async def _tokens(client: HandleEngineClient, request: GenerateRequest) -> list[GenerateChunk]:
    return [chunk async for chunk in client.stream(request)]


@pytest.fixture
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """The replica (its answers 60 tokens long, or as many as the test's parameter), the
    handle stand-in and an engine client with a caller name, so it opens channels."""
    output_tokens = getattr(request, "param", 60)
    replica = await _replica(decode_tokens_per_s=200, output_tokens=output_tokens)
    handle = _Handle(replica)
    yield replica, handle, HandleEngineClient(handle, caller=CALLER)
    await replica._engine.shutdown()


async def _channel_open(client: HandleEngineClient) -> None:
    for _ in range(100):
        if client._channels:
            return
        await asyncio.sleep(0.01)
    pytest.fail("no channel was opened")


async def test_requests_ride_one_channel_with_every_token_in_order(served: Any) -> None:
    replica, handle, client = served
    first = await _tokens(client, _request("r0", 60))  # no channel yet: its own stream
    assert first[-1].finish_reason is not None and first[0].replica == "engine-1"
    await _channel_open(client)
    handle.items["generate"].clear()

    answers = await asyncio.gather(*(_tokens(client, _request(f"r{i}", 60)) for i in range(1, 17)))
    for i, chunks in enumerate(answers, start=1):
        assert [t for chunk in chunks for t in chunk.token_ids] == replica._engine.produced[f"r{i}"]
        assert [chunk.finish_reason for chunk in chunks][-1] == "length"
        assert all(chunk.finish_reason is None for chunk in chunks[:-1])
        assert chunks[0].replica == "engine-1"  # cache-hit attribution still works
    # Each request's own stream carried its marker only; the channel carried the chunks, many
    # requests' per item.
    assert len(handle.items["generate"]) == 16
    chunks_sent = sum(len(chunks) for chunks in answers)
    assert chunks_sent >= 4 * len(handle.items["channel"]), (chunks_sent, handle.items)


@pytest.mark.parametrize("served", [4000], indirect=True)
async def test_a_client_leaving_aborts_its_request_on_the_channel_at_once(served: Any) -> None:
    replica, _, client = served
    await _tokens(client, _request("r0", 5))
    await _channel_open(client)
    long = _request("long", 10_000)
    stream = client.stream(long)
    await anext(stream)
    assert replica._engine.num_ongoing_requests() == 1
    await stream.aclose()  # the client went away
    for _ in range(100):
        if replica._engine.num_ongoing_requests() == 0:
            break
        await asyncio.sleep(0.01)
    assert replica._engine.num_ongoing_requests() == 0
    assert long.request_id not in replica._callers._requests.get(CALLER, set())


@pytest.mark.parametrize("served", [4000], indirect=True)
async def test_requests_on_a_channel_fail_at_once_when_the_engine_replica_dies(
    served: Any,
) -> None:
    _, _, client = served
    await _tokens(client, _request("r0", 5))
    await _channel_open(client)
    streams = [client.stream(_request(f"long{i}", 10_000)) for i in range(3)]
    for stream in streams:
        await anext(stream)
    for call in _CALLS:  # every call on the replica: the channel's and each request's
        call.die()
    for stream in streams:
        with pytest.raises((ActorDiedError, ChannelClosed)):
            async with asyncio.timeout(2):
                async for _ in stream:
                    pass
    await asyncio.sleep(0)
    assert not client._channels  # the next request to a replica opens a new one


@pytest.mark.parametrize("served", [4000], indirect=True)
async def test_a_channel_that_ends_mid_request_fails_the_request_not_hangs(served: Any) -> None:
    replica, _, client = served
    await _tokens(client, _request("r0", 5))
    await _channel_open(client)
    stream = client.stream(_request("long", 10_000))
    await anext(stream)
    replica._outboxes[CALLER].close()  # as when the watch finds the caller gone
    with pytest.raises(ChannelClosed):
        async with asyncio.timeout(5):
            async for _ in stream:
                pass
    for _ in range(100):
        if replica._engine.num_ongoing_requests() == 0:
            break
        await asyncio.sleep(0.01)
    assert replica._engine.num_ongoing_requests() == 0  # nothing left generating for nobody


async def test_an_idle_channel_closes_and_a_request_moves_to_the_reopened_one_midway(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_deployment, "CHANNEL_IDLE_S", 0.2)
    replica, handle, client = served
    await _tokens(client, _request("r0", 5))
    await _channel_open(client)
    await _tokens(client, _request("r1", 5))
    for _ in range(100):  # idle: both ends let it go
        if not client._channels and not replica._outboxes:
            break
        await asyncio.sleep(0.05)
    assert not client._channels and not replica._outboxes
    handle.items["generate"].clear()
    # No channel: it starts on its own stream; its first chunk has the client open one, and
    # the rest of it moves there (its own stream carries a chunk or two and the marker).
    chunks = await _tokens(client, _request("r2", 60))
    assert [t for chunk in chunks for t in chunk.token_ids] == replica._engine.produced["r2"]
    assert [chunk.finish_reason for chunk in chunks][-1] == "length"
    assert len(chunks) >= 5 and len(handle.items["generate"]) <= 3, (chunks, handle.items)
    assert handle.items["channel"]
    assert client._channels


class _LastChunkAsTheWaitGivesUp(asyncio.Event):
    """The outbox's "something is pending" event, whose first wait is given up (the channel
    idle) just as the last request puts its last chunk and ends: the race the CI caught."""

    def __init__(self, outbox: Outbox) -> None:
        super().__init__()
        self._outbox = outbox
        self._raced = False

    async def wait(self) -> Literal[True]:
        if self._raced:
            return await super().wait()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:  # wait_for's timeout
            self._raced = True
            self._outbox.put("r1", GenerateChunk(token_ids=[7], finish_reason="stop"))
            self._outbox.requests.clear()  # the request is done: only its chunk is left
            raise
        raise AssertionError("the idle wait never timed out")


async def test_an_idle_channel_sends_a_last_chunk_that_came_as_it_gave_up_waiting() -> None:
    outbox = Outbox(window_s=0, idle_s=0.01)
    outbox.requests["r1"] = asyncio.create_task(asyncio.sleep(0))
    outbox._ready = _LastChunkAsTheWaitGivesUp(outbox)
    batches = [send.batch async for send in outbox.sends() if send.batch]  # empty: heartbeats
    assert [[(rid, chunk.token_ids) for rid, chunk in batch] for batch in batches] == [
        [("r1", [7])]
    ]


async def test_a_first_token_is_not_held_back_by_the_channel_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine_deployment, "STREAM_WINDOW_S", 0.5)
    replica = await _replica(decode_tokens_per_s=200, output_tokens=400)
    client = HandleEngineClient(_Handle(replica), caller=CALLER)
    try:
        await _tokens(client, _request("r0", 5))
        await _channel_open(client)
        busy = asyncio.create_task(_tokens(client, _request("busy", 400)))  # keeps sends paced
        await asyncio.sleep(0.1)
        loop = asyncio.get_running_loop()
        started = loop.time()
        stream = client.stream(_request("new", 400))
        chunk = await anext(stream)
        while not chunk.token_ids:
            chunk = await anext(stream)
        # Well inside the 0.5 s window a later send would wait for.
        assert loop.time() - started < 0.25
        await stream.aclose()
        busy.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await busy
    finally:
        await replica._engine.shutdown()


async def test_without_a_caller_every_request_streams_on_its_own(served: Any) -> None:
    replica, handle, _ = served
    client = HandleEngineClient(handle)  # e.g. a benchmark calling the engine directly
    for i in range(3):
        chunks = await _tokens(client, _request(f"r{i}", 20))
        assert [t for chunk in chunks for t in chunk.token_ids] == replica._engine.produced[f"r{i}"]
    assert handle.items["channel"] == [] and not replica._outboxes


# --- many requests moving onto a channel as they finish, fail, are cancelled, their callers leave


class _ForeignChunk:
    """An item that is not a `GenerateChunk`: it has what the deployment reads of a chunk
    (token_ids, engine_ttft_s, replica, finish_reason) and, like an engine's own output
    object holding a handle, cannot be serialized."""

    def __init__(self, token_ids: list[int]) -> None:
        self.token_ids = token_ids
        self.finish_reason = None
        self.engine_ttft_s = None
        self.replica = None
        self._handle = threading.Lock()


End = Literal["stop", "length", "abort", "error", "crash", "foreign", "hang"]
Caller = Literal["reads", "leaves", "cancels"]


@dataclass(frozen=True)
class _Plan:
    """One request's script: ``tokens`` one-token chunks, then its ``end`` (a finish chunk, an
    engine error, a foreign item, or nothing until it is stopped); ``pace``: the loop turns the
    engine yields before each step; the caller reads it all, leaves after ``patience`` chunks,
    or has its task cancelled after ``patience`` loop turns; ``delay``: turns before it starts."""

    tokens: int
    end: End
    pace: tuple[int, ...]
    caller: Caller
    patience: int
    delay: int


def _token(request_id: str, step: int) -> int:
    return int(request_id.removeprefix("q")) * 100 + step


class _ScriptedEngine:
    """Plays each request's `_Plan`; ``running``: the requests it is generating, each with
    the event its `abort` sets."""

    def __init__(self, plans: dict[str, _Plan]) -> None:
        self.plans = plans
        self.running: dict[str, asyncio.Event] = {}

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Any]:
        request_id = request.request_id
        plan = self.plans[request_id]
        aborted = self.running[request_id] = asyncio.Event()
        try:
            for step in range(plan.tokens + 1):
                for _ in range(plan.pace[step % len(plan.pace)]):
                    await asyncio.sleep(0)
                if aborted.is_set():
                    yield GenerateChunk(finish_reason="abort")
                    return
                if step < plan.tokens:
                    yield GenerateChunk(token_ids=[_token(request_id, step)], num_prompt_tokens=5)
            match plan.end:
                case "stop" | "length" | "abort":
                    yield GenerateChunk(finish_reason=plan.end, num_prompt_tokens=5)
                case "error":
                    raise EngineError("scripted refusal", code="invalid_prompt")
                case "crash":
                    raise RuntimeError("scripted crash")
                case "foreign":
                    yield _ForeignChunk([_token(request_id, plan.tokens)])
                    yield GenerateChunk(finish_reason="stop")
                case "hang":
                    await aborted.wait()  # until its caller leaves (its producer is cancelled)
                    yield GenerateChunk(finish_reason="abort")
        finally:
            del self.running[request_id]

    async def abort(self, request_id: str) -> None:
        aborted = self.running.get(request_id)
        if aborted is not None:
            aborted.set()

    def num_ongoing_requests(self) -> int:
        return len(self.running)

    async def shutdown(self) -> None:
        pass


async def _scripted(plans: dict[str, _Plan]) -> tuple[Any, HandleEngineClient]:
    async def everyone_alive() -> set[str]:
        return {CALLER}

    replica = _BareReplica.__new__(_BareReplica)
    replica._serve(_ScriptedEngine(plans), "engine-1", everyone_alive, caller_check_period_s=0.1)
    return replica, HandleEngineClient(_Handle(replica), caller=CALLER)


@dataclass
class _Outcome:
    chunks: list[GenerateChunk]
    error: BaseException | None = None
    left: bool = False  # its caller left (aclose) or was cancelled before the end


async def _play(client: HandleEngineClient, request_id: str, plan: _Plan) -> _Outcome:
    """One caller, as the service reads a stream (or leaves it, as a client going away does)."""
    for _ in range(plan.delay):
        await asyncio.sleep(0)
    outcome = _Outcome([])
    stream = client.stream(_request(request_id, 100))
    try:
        async for chunk in stream:
            outcome.chunks.append(chunk)
            if plan.caller == "leaves" and len(outcome.chunks) >= plan.patience:
                if chunk.finish_reason is None:
                    outcome.left = True
                break
    except Exception as exc:
        outcome.error = exc
    finally:
        await stream.aclose()
    return outcome


async def _cancelled_after(task: asyncio.Task[_Outcome], turns: int) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()


def _expected_end(plan: _Plan) -> tuple[str, str | None]:
    """The finish reason and error code a request ends with when its caller reads it all."""
    match plan.end:
        case "stop" | "length" | "abort":
            return plan.end, None
        case "error":
            return "error", "invalid_prompt"
        case "crash" | "foreign":  # a fault of the server: that request's alone
            return "error", "server_error"
        case "hang":
            raise ValueError("a hanging request needs a caller that goes")


def _check(request_id: str, plan: _Plan, outcome: _Outcome | None) -> None:
    """Ended exactly once: its whole token stream and its finish, or a proper error; a caller
    that left has a prefix of it."""
    if outcome is None:  # cancelled: the caller is gone, nothing to deliver
        assert plan.caller == "cancels", request_id
        return
    assert outcome.error is None, (request_id, plan, outcome.error)
    tokens = [t for chunk in outcome.chunks for t in chunk.token_ids]
    script = [_token(request_id, step) for step in range(plan.tokens)]
    finishes = [chunk.finish_reason for chunk in outcome.chunks if chunk.finish_reason]
    assert len(finishes) <= 1, (request_id, plan, outcome.chunks)  # at most one end
    if outcome.chunks and outcome.chunks[-1].finish_reason is None:
        # No end: only a caller that left before it stops reading short.
        assert outcome.left and tokens == script[: len(tokens)], (request_id, plan, outcome)
        return
    assert finishes, (request_id, plan, outcome)
    last = outcome.chunks[-1]
    assert (last.finish_reason, last.error_code) == _expected_end(plan), (request_id, plan, last)
    assert tokens == script, (request_id, plan, tokens)


plans = st.builds(
    _Plan,
    tokens=st.integers(0, 6),
    end=st.sampled_from(["stop", "length", "abort", "error", "crash", "foreign", "hang"]),
    pace=st.lists(st.integers(0, 4), min_size=1, max_size=4).map(tuple),
    caller=st.sampled_from(["reads", "leaves", "cancels"]),
    patience=st.integers(1, 12),
    delay=st.integers(0, 12),
).filter(lambda plan: plan.end != "hang" or plan.caller == "cancels")  # chunks may merge: a
# caller waiting for its n-th chunk of a request that never ends could wait for ever


@settings(
    # 50 scenarios in the fast tier, 400 in the thorough profile (scripts/test.sh).
    max_examples=min(settings().max_examples, 400),
    deadline=None,
    derandomize=True,  # the same interleavings every run: a failure reproduces
    suppress_health_check=[HealthCheck.too_slow],
)
@given(scenario=st.lists(plans, min_size=2, max_size=24), window_s=st.sampled_from([0, 0.002]))
async def test_requests_moving_onto_a_channel_as_they_end_each_end_once_on_their_own(
    scenario: list[_Plan], window_s: float
) -> None:
    """Requests start on their own streams, the first chunk opens the channel, and the rest
    move onto it, while each finishes, fails in the engine, yields a foreign item, or has its
    caller leave or its task cancelled, at points the plans shift about (the interleaving is
    the event loop's, set by each plan's pace and delay). With a stream window, a request's
    queue fills while it waits, and it moves onto the channel holding chunks, a finish or an
    error chunk, and its end. Each request ends once with its own stream or its own error;
    none hangs; nothing is left generating; the replica's prefill ledger ends empty, and the
    last load its channel pushed says so."""
    plans_by_id = {f"q{index}": plan for index, plan in enumerate(scenario)}
    replica, client = await _scripted(plans_by_id)
    loads = _Loads()
    local_routers.register(loads)
    with _stream_window(window_s):
        tasks = {
            request_id: asyncio.create_task(_play(client, request_id, plan))
            for request_id, plan in plans_by_id.items()
        }
        cancellers = [
            asyncio.create_task(_cancelled_after(tasks[request_id], plan.patience))
            for request_id, plan in plans_by_id.items()
            if plan.caller == "cancels"
        ]
        # Nothing hangs. A scenario takes milliseconds, but a hang lasts forever, so the bound
        # only has to outlast a starved machine: at 3 s one scenario ran out once in a CI run
        # at a load average of 24 on 2 cores (and passed when Hypothesis ran it again).
        async with asyncio.timeout(HANG_S):
            await asyncio.wait([*tasks.values(), *cancellers])
        outcomes = {rid: None if task.cancelled() else task.result() for rid, task in tasks.items()}
        # One request's fault never fails another: each whose engine ended it well ended well.
        harmed = {
            rid: outcome.error
            for rid, outcome in outcomes.items()
            if outcome is not None
            and outcome.error is not None
            and plans_by_id[rid].end in ("stop", "length", "abort")
        }
        assert not harmed, harmed
        for request_id, outcome in outcomes.items():
            _check(request_id, plans_by_id[request_id], outcome)
        await _settled(replica, client)
        assert replica._reporter.load()[DECODING_KEY] == 0
        assert replica._reporter.load()[QUEUED_KEY] == 0
        await asyncio.sleep(window_s + 0.05)  # the last change's push
        # Each send carries the load as of then: the latest one, if any came, is of now.
        if "engine-1" in client._channels and loads.latest:
            assert loads.latest[QUEUED_KEY] == loads.latest[DECODING_KEY] == 0, loads.latest
        for outbox in list(replica._outboxes.values()):
            outbox.close()
        for reader in list(client._channels.values()):
            await reader


class _Loads:
    """A router that keeps the latest load pushed to it."""

    report_wait_s = 0.0
    wants_loads = True

    def __init__(self) -> None:
        self.latest: dict[str, Any] = {}

    def placement_reported(self, key: str) -> bool:
        return True

    def push_load(self, replica: str, load: Any) -> None:
        self.latest = dict(load)


@contextlib.contextmanager
def _stream_window(seconds: float) -> Iterator[None]:
    saved = engine_deployment.STREAM_WINDOW_S
    engine_deployment.STREAM_WINDOW_S = seconds
    try:
        yield
    finally:
        engine_deployment.STREAM_WINDOW_S = saved


async def _settled(replica: Any, client: HandleEngineClient) -> None:
    """Soon (5 s: a loaded machine runs the tasks late, a hang still fails): nothing generating,
    watched or riding on the replica; no request waiting at the client."""
    for _ in range(500):
        riding = [rid for outbox in replica._outboxes.values() for rid in outbox.requests]
        if not (replica._engine.running or replica._producers or riding or client._lingering):
            break
        await asyncio.sleep(0.01)
    assert not replica._engine.running, replica._engine.running
    assert not replica._producers and not riding, (replica._producers, riding)
    assert not client._inboxes._queues and not client._lingering


async def test_a_foreign_item_queued_as_the_request_moves_onto_the_channel_fails_it_alone() -> None:
    """The issue's moment: a request streams on its own, its first chunk has the client open
    the channel, and while it waits out its window its queue gets an item that is not a chunk;
    it then moves onto the channel. Before: ``AssertionError`` in ``_Route.move_to``."""
    plans_by_id = {
        "q1": _Plan(3, "foreign", (0, 20), "reads", 0, 0),
        "q2": _Plan(40, "stop", (1,), "reads", 0, 0),
    }
    replica, client = await _scripted(plans_by_id)
    with _stream_window(0.2):  # the channel opens well within the first window
        first = asyncio.create_task(_play(client, "q1", plans_by_id["q1"]))
        await _channel_open(client)
        other = asyncio.create_task(_play(client, "q2", plans_by_id["q2"]))
        async with asyncio.timeout(10):
            outcomes = await asyncio.gather(first, other)
    for (request_id, plan), outcome in zip(plans_by_id.items(), outcomes, strict=True):
        _check(request_id, plan, outcome)
    await _settled(replica, client)


async def test_a_request_moved_to_a_channel_its_client_does_not_read_fails_with_an_error() -> None:
    """Two clients under one caller name, one without channels: the replica moves the second's
    request onto the first's channel. Before: ``AssertionError`` in the client's stream."""
    plans_by_id = {
        "q1": _Plan(1, "stop", (0,), "reads", 0, 0),
        "q2": _Plan(50, "stop", (1,), "reads", 0, 0),
    }
    replica, with_channels = await _scripted(plans_by_id)
    await _play(with_channels, "q1", plans_by_id["q1"])
    await _channel_open(with_channels)
    without = HandleEngineClient(_Handle(replica), caller=CALLER, channels=False)
    outcome = await asyncio.wait_for(_play(without, "q2", plans_by_id["q2"]), 5)
    assert isinstance(outcome.error, ChannelClosed), outcome
    for _ in range(100):  # its call was cancelled: the replica stopped generating it
        if not replica._engine.running:
            break
        await asyncio.sleep(0.01)
    assert not replica._engine.running


class _ForeignReplica:
    """A replica whose stream sends an item that is neither a chunk nor a marker."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()

    async def generate(self, request: GenerateRequest, caller: str | None = None) -> Any:
        try:
            yield {"token_ids": [1]}
            await asyncio.sleep(3600)
        finally:
            self.closed.set()


async def test_an_item_neither_a_chunk_nor_a_marker_fails_that_request_and_cancels_its_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    replica = _ForeignReplica()
    chunks = await asyncio.wait_for(
        _tokens(HandleEngineClient(_Handle(replica)), _request("r1", 5)), 5
    )
    assert [(c.finish_reason, c.error_code) for c in chunks] == [("error", "server_error")]
    await asyncio.wait_for(replica.closed.wait(), 5)  # the engine call was cancelled
    assert "request r1: unexpected engine error" in caplog.text
