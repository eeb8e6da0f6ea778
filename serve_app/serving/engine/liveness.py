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
  carried anything, and a stream silent for `SILENCE_S` is declared dead: its call is cancelled
  and each request on it fails (``EngineSilent``, a ``server_error`` to its client) within
  ``SILENCE_S`` plus one watchdog period of the replica's last word.

`HEARTBEAT_S` is well below `SILENCE_S` so that a late heartbeat (a busy replica, a loaded
machine) is not mistaken for a death. A watchdog round that itself comes late (this replica's
loop was held up, and what arrived meanwhile may not be read yet) judges nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from serve_app.config import StreamingArgs

logger = logging.getLogger(__name__)

# `StreamingArgs.heartbeat_s` and `.silence_s`: their values for a replica built without app args.
_DEFAULTS = StreamingArgs().resolved()
HEARTBEAT_S = _DEFAULTS.heartbeat_s
SILENCE_S = _DEFAULTS.silence_s


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The item of a request's own stream that had nothing else to carry for `HEARTBEAT_S`."""


HEARTBEAT = Heartbeat()


class EngineSilent(ConnectionError):
    """A stream from an engine replica carried nothing, heartbeats included, for `SILENCE_S`:
    the replica, or the way to it, is dead."""


class Pulse:
    """One watched stream: `beat` on each item it carries; ``silent`` once declared dead."""

    __slots__ = ("last", "on_silence", "silent")

    def __init__(self, on_silence: Callable[[], None]) -> None:
        self.last = time.monotonic()
        self.on_silence = on_silence
        self.silent = False

    def beat(self) -> None:
        self.last = time.monotonic()


class Watchdog:
    """Declares dead the streams silent for ``silence_s``, checked every ``period_s`` while any
    is watched: each one's ``on_silence`` is called once (it cancels the stream's call)."""

    def __init__(self, silence_s: float = SILENCE_S, period_s: float = HEARTBEAT_S) -> None:
        self.silence_s = silence_s
        self._period_s = period_s
        self._pulses: set[Pulse] = set()
        self._task: asyncio.Task | None = None

    def watch(self, on_silence: Callable[[], None]) -> Pulse:
        pulse = Pulse(on_silence)
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
            now = time.monotonic()
            late = now - last_round > 2 * self._period_s
            last_round = now
            if late:  # this loop was held up: what came meanwhile may not be read yet
                continue
            for pulse in [p for p in self._pulses if now - p.last > self.silence_s]:
                self._pulses.discard(pulse)
                pulse.silent = True
                try:
                    pulse.on_silence()
                except Exception:  # one stream's failure to cancel must not stop the others'
                    logger.exception("cancelling a silent engine stream failed")
