"""What a turn sent to an engine replica would wait for: its queued uncached prefill.

On an engine replica, `PrefillLedger` follows the requests that have not had their first token
yet, each with the prompt tokens it will compute (its prompt minus what the KV summary says the
replica holds of its conversation), and measures the replica's prefill rate from the requests
that did: uncached tokens over the time from when its prefill could start (its arrival, or the
previous first token, whichever is later) to its first token. Prefills share the accelerator,
so that is the rate the queue drains at. It goes in the routing-stats report (`report`):

- ``queued_prefill_tokens``: uncached prompt tokens of the requests waiting for a first token,
  less what the one in progress has computed (by the measured rate since its prefill could
  start): a long prefill a second in is that much nearer its end, and with reports a second
  apart, counting it whole made a busy replica look up to a period further behind;
- ``queued_prefill_tokens_ahead`` (issue 49): for each rank of request the replica has seen
  (``GenerateRequest.priority``, a service tier's), what a turn of that rank arriving now would
  wait for: the engine serves the earliest deadline first, so the queued requests due no later
  than that turn would be (a request's deadline is its arrival plus its ``deadline_s``: one
  that has waited long enough counts ahead of the most urgent turns), less what the prefill in
  progress has done. A router places a priority turn by it, not behind a flex flood it would
  pass;
- ``prefill_tokens_per_s``: the measured rate (absent until measured);
- ``decoding``: requests past their first token (the decode load);
- ``shared_prefix_tokens``: what a turn of a conversation the replica holds none of finds
  cached (the system and developer prompt every conversation of an app shares): the median of
  the engine's own counts over the latest such turns. A router needs it to price moving a
  conversation here (only its own history is computed again, not the shared prompt), and the
  ledger to estimate such a turn's uncached tokens before the engine counts them: without it, a
  new conversation's first turn counted its whole prompt (nearly 5,000 tokens of Codex's
  prompt, a second at 5,000 tokens/s) where it computed about 60. Absent until counted.

Engine-neutral, from what the deployment sees of its requests (their first chunks), so vLLM and
the simulated engine report alike; the routing simulator keeps one per replica the same way.
Pure Python; times are the caller's clock.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any

QUEUED_KEY = "queued_prefill_tokens"
QUEUED_AHEAD_KEY = "queued_prefill_tokens_ahead"
RATE_KEY = "prefill_tokens_per_s"
DECODING_KEY = "decoding"
SHARED_KEY = "shared_prefix_tokens"
# Prefills shorter than this measure the decode step and the transport more than the prefill.
MIN_MEASURED_TOKENS = 256
MEASURED_PREFILLS = 64  # the rate is over the latest this many
SHARED_SAMPLES = 64  # the shared prefix is the median over the latest this many cold turns


@dataclass
class _Waiting:
    uncached_tokens: int
    arrived: float
    prompt_tokens: int | None  # a turn of a conversation the replica held none of: its prompt
    due: float  # its deadline: arrival plus its deadline_s (the engine serves the earliest)


class PrefillLedger:
    def __init__(self) -> None:
        self._waiting: dict[str, _Waiting] = {}
        self._decoding: set[str] = set()
        self._last_first_token = float("-inf")
        # (tokens, seconds) of the latest measured prefills.
        self._measured: deque[tuple[int, float]] = deque(maxlen=MEASURED_PREFILLS)
        # Cached tokens the engine counted for the latest turns that arrived cold.
        self._cold_cached: deque[int] = deque(maxlen=SHARED_SAMPLES)
        # Each rank of request seen, with its deadline_s (the latest said: the app's settings).
        self._deadlines: dict[int, float] = {}

    def arrived(
        self,
        request_id: str,
        uncached_tokens: int,
        now: float,
        cold_prompt: int | None = None,
        *,
        deadline_s: float = 0.0,
        priority: int = 0,
    ) -> None:
        """A request with ``uncached_tokens`` to compute (an estimate) arrived; ``cold_prompt``:
        its prompt tokens, if the replica holds nothing of its conversation (the engine's
        count at its first token then says what such a turn finds cached); ``deadline_s`` and
        ``priority``: its scheduling (``GenerateRequest``'s)."""
        self._deadlines[priority] = deadline_s
        self._waiting[request_id] = _Waiting(
            max(uncached_tokens, 0), now, cold_prompt, now + deadline_s
        )

    @property
    def shared_prefix_tokens(self) -> int | None:
        """What a turn of a conversation this replica holds none of finds cached (None until
        one was counted: a router then takes the other replicas' figure)."""
        return int(statistics.median(self._cold_cached)) if self._cold_cached else None

    def first_token(self, request_id: str, uncached_tokens: int | None, now: float) -> None:
        """The request's first token came at ``now``; ``uncached_tokens`` as the engine counted
        them (None: as estimated on arrival)."""
        waiting = self._waiting.pop(request_id, None)
        if waiting is None:
            return
        self._decoding.add(request_id)
        if uncached_tokens is not None and waiting.prompt_tokens is not None:
            self._cold_cached.append(max(waiting.prompt_tokens - uncached_tokens, 0))
        tokens = waiting.uncached_tokens if uncached_tokens is None else uncached_tokens
        began = max(waiting.arrived, self._last_first_token)
        self._last_first_token = max(self._last_first_token, now)
        if tokens >= MIN_MEASURED_TOKENS and now > began:
            self._measured.append((tokens, now - began))

    def ended(self, request_id: str) -> bool:
        """Finished, failed or aborted (before or after its first token); whether it was
        here (not ended already)."""
        waiting = self._waiting.pop(request_id, None) is not None
        decoding = request_id in self._decoding
        self._decoding.discard(request_id)
        return waiting or decoding

    def queued_tokens(self, now: float) -> int:
        """The waiting requests' uncached tokens, less the progress of the one prefilling (the
        first due: prefills run earliest deadline first) since it could start, at the
        measured rate."""
        queued = sum(waiting.uncached_tokens for waiting in self._waiting.values())
        return queued - self._head_done(now)

    def queued_ahead(self, now: float) -> dict[str, int]:
        """For each rank seen, the uncached tokens a turn of it arriving ``now`` would wait for:
        those of the requests due no later than it would be, less the progress of the one
        prefilling if it is among them. By rank as a string (the report crosses Ray)."""
        head = self._head()
        done = self._head_done(now)
        ahead: dict[str, int] = {}
        for rank, deadline_s in sorted(self._deadlines.items()):
            due = now + deadline_s
            tokens = sum(w.uncached_tokens for w in self._waiting.values() if w.due <= due)
            if head is not None and head.due <= due:
                tokens -= done
            ahead[str(rank)] = tokens
        return ahead

    def _head(self) -> _Waiting | None:
        """The waiting request the engine prefills first: the earliest due (then arrival)."""
        return min(self._waiting.values(), key=lambda waiting: waiting.due, default=None)

    def _head_done(self, now: float) -> int:
        """What the prefill in progress has computed since it could start, at the measured
        rate (0 without one, or before the rate is measured)."""
        rate = self.tokens_per_s
        head = self._head()
        if head is None or rate is None:
            return 0
        began = max(head.arrived, self._last_first_token)
        return round(min(head.uncached_tokens, rate * max(now - began, 0.0)))

    @property
    def tokens_per_s(self) -> float | None:
        seconds = sum(seconds for _, seconds in self._measured)
        return sum(tokens for tokens, _ in self._measured) / seconds if seconds else None

    def report(self, now: float) -> dict[str, Any]:
        report: dict[str, Any] = {
            QUEUED_KEY: self.queued_tokens(now),
            QUEUED_AHEAD_KEY: self.queued_ahead(now),
            DECODING_KEY: len(self._decoding),
        }
        rate = self.tokens_per_s
        if rate is not None:
            report[RATE_KEY] = rate
        shared = self.shared_prefix_tokens
        if shared is not None:
            report[SHARED_KEY] = shared
        return report
