"""Liveness of the streams from engine replicas: heartbeats one way, a watchdog the other.

A request whose engine replica dies must fail at once, whatever carries its tokens. Ray's actor
transport reports a dead replica's streams failed, but the gRPC transport
(``RAY_SERVE_USE_GRPC_BY_DEFAULT=1``) left such a stream waiting until the client's own timeout
(60 s in tests/app/test_faults.py), and a replica alive but stuck (its event loop blocked) is
the same to a client on any transport. So the streams carry a heartbeat:

- the engine replica: a stream that has carried nothing for `HEARTBEAT_S` carries a heartbeat
  (on a channel an empty batch, on a request's own stream a `Heartbeat`): about four items a
  second on a stream with nothing to say, none on one carrying tokens;
- the ingress: a `Watchdog` (one per engine client, one task) notes when each stream last
  carried anything. A stream silent for `SILENCE_S` makes it ask Ray whether the stream's
  replica is gone (its named actor no longer listed: a kill shows there well under a second
  later). Gone: the stream is declared dead, its call cancelled and each request on it fails
  (``EngineSilent``, a ``server_error`` to its client) within ``SILENCE_S`` plus one watchdog
  period (and the question) of the replica's last word. Still listed, or no answer: the replica
  is alive and its loop busy (starved under overload: 1.5 s was seen) or stuck; its streams
  fail only once silent for `LIVE_SILENCE_S`. The question is asked again every period, so a
  replica that dies while silent fails its streams at the next.

`HEARTBEAT_S` is well below `SILENCE_S` so that a late heartbeat (a busy replica, a loaded
machine) is not mistaken for a death. A watchdog round that itself comes late (this replica's
loop was held up, and what arrived meanwhile may not be read yet) judges nothing.

The first item of every ``generate`` stream comes as the replica takes the request: an
`Accepted` (or the channel's marker), so the ingress knows its replica from then on, and
knows the request is the engine's (not refused by Ray's back-pressure): only then does a
client get its ``200`` and ``response.created`` (serve_app/serving/turn/events.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

from serve_app.config import StreamingArgs

logger = logging.getLogger(__name__)

# `StreamingArgs.heartbeat_s` and `.silence_s`: their values for a replica built without app args.
_DEFAULTS = StreamingArgs().resolved()
HEARTBEAT_S = _DEFAULTS.heartbeat_s
SILENCE_S = _DEFAULTS.silence_s
LIVE_SILENCE_S = _DEFAULTS.live_silence_s
# The longest the watchdog waits for Ray's answer; none by then: not known to be gone.
PROBE_TIMEOUT_S = 1.0

# Which of these engine replicas (their ids) Ray confirms gone; raising: it could not tell.
ReplicasGone = Callable[[Collection[str]], Awaitable[Collection[str]]]


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The item of a request's own stream that had nothing else to carry for `HEARTBEAT_S`."""


HEARTBEAT = Heartbeat()


@dataclass(frozen=True, slots=True)
class Accepted:
    """The first item of a request's own stream: ``replica`` has taken the request."""

    replica: str


class EngineSilent(ConnectionError):
    """A stream from an engine replica carried nothing, heartbeats included, for `SILENCE_S`
    and Ray lists the replica's actor no more (or for `LIVE_SILENCE_S` though it is listed):
    the replica, or the way to it, is dead or stuck."""


class Pulse:
    """One watched stream: `beat` on each item it carries; ``silent`` once declared dead.
    ``replica``: the engine replica it comes from, once known (the watchdog asks Ray about it)."""

    __slots__ = ("_clock", "last", "on_silence", "replica", "silent", "silent_for")

    def __init__(
        self,
        on_silence: Callable[[], None],
        replica: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self.last = clock()
        self.on_silence = on_silence
        self.replica = replica
        self.silent = False
        self.silent_for = 0.0  # how long, when declared dead

    def beat(self) -> None:
        self.last = self._clock()


class Watchdog:
    """Declares dead the streams silent for ``silence_s`` whose replica ``gone`` confirms gone,
    and those silent for ``live_silence_s`` whatever it says; checked every ``period_s`` while
    any is watched: each one's ``on_silence`` is called once (it cancels the stream's call).

    Without ``gone`` (no Ray to ask), or for a stream whose replica is not known yet, a silence
    of ``silence_s`` is a death, as it was before the question was asked."""

    def __init__(
        self,
        silence_s: float = SILENCE_S,
        period_s: float = HEARTBEAT_S,
        live_silence_s: float = LIVE_SILENCE_S,
        gone: ReplicasGone | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.silence_s = silence_s
        self.live_silence_s = max(live_silence_s, silence_s)
        self._period_s = period_s
        self._gone = gone
        self._clock = clock
        self._pulses: set[Pulse] = set()
        self._task: asyncio.Task | None = None
        self._busy: set[str] = set()  # replicas silent but alive, as of the last round (logged)

    def watch(self, on_silence: Callable[[], None], replica: str | None = None) -> Pulse:
        pulse = Pulse(on_silence, replica, self._clock)
        self._pulses.add(pulse)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="engine stream watchdog")
        return pulse

    def forget(self, pulse: Pulse | None) -> None:
        if pulse is not None:
            self._pulses.discard(pulse)

    async def _run(self) -> None:
        last_round = time.monotonic()
        while self._pulses:
            await asyncio.sleep(self._period_s)
            late = time.monotonic() - last_round > 2 * self._period_s
            if not late:  # else this loop was held up: what came meanwhile may not be read yet
                await self.check()
            last_round = time.monotonic()  # after the question: its wait is not lateness

    async def check(self) -> None:
        """One round: the silent streams judged, Ray asked about their replicas if need be."""
        now = self._clock()
        silent = [p for p in self._pulses if now - p.last > self.silence_s]
        if not silent:
            self._busy = set()
            return
        gone_of = self._gone
        asked = {p.replica for p in silent if p.replica is not None and gone_of is not None}
        gone = await _ask(gone_of, asked) if gone_of is not None and asked else set()
        now = self._clock()
        for pulse in silent:
            if pulse not in self._pulses or now - pulse.last <= self.silence_s:
                continue  # forgotten, or it spoke while Ray was asked
            unasked = pulse.replica not in asked
            if unasked or pulse.replica in gone or now - pulse.last > self.live_silence_s:
                self._declare_dead(pulse)
        self._note_busy({p.replica for p in silent if p in self._pulses and p.replica in asked})

    def _note_busy(self, busy: set[str | None]) -> None:
        """Log each replica once as it turns silent but alive (its loop held up, or stuck)."""
        for replica in busy - self._busy:
            logger.warning(
                "engine replica %s: silent for %g s but alive; its streams wait up to %g s",
                replica,
                self.silence_s,
                self.live_silence_s,
            )
        self._busy = {replica for replica in busy if replica is not None}

    def _declare_dead(self, pulse: Pulse) -> None:
        self._pulses.discard(pulse)
        pulse.silent = True
        pulse.silent_for = self._clock() - pulse.last
        try:
            pulse.on_silence()
        except Exception:  # one stream's failure to cancel must not stop the others'
            logger.exception("cancelling a silent engine stream failed")


async def _ask(gone: ReplicasGone, replicas: set[str]) -> set[str]:
    """Those of ``replicas`` Ray confirms gone; none when it cannot tell in time."""
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            return set(await gone(replicas)) & replicas
    except Exception as exc:  # no answer: not known to be gone, so the longer bound holds
        logger.warning("could not ask Ray whether engine replicas %s are gone: %r", replicas, exc)
        return set()
