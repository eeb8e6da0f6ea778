"""One replica's prefill as vLLM's scheduler steps it with chunked prefill, for sim_routing.py.

Each step takes up to ``max_batched_tokens`` prompt tokens: the prefills already running first,
in the order they started, then waiting ones by (priority, arrival). While more than one
prefill is eligible, each takes at most ``long_prefill_tokens`` a step (vLLM's
``long_prefill_token_threshold``: a long prefill no longer makes every turn behind it wait for
all of it). A step lasts its tokens at the prefill rate; a prefill's first token comes at the
end of the step that computes its last prompt token. Decode is modelled apart, as in the
replay. A budget of 0 is one prefill at a time, whole (the replay's own model, but in priority
order).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Prefill:
    request: tuple[int, int]  # (session index, turn index)
    remaining: int
    priority: float
    seq: int
    started: bool = False


@dataclass
class SteppedPrefill:
    max_batched_tokens: int
    long_prefill_tokens: int
    tokens_per_s: float
    jobs: list[Prefill] = field(default_factory=list)
    step: dict[int, int] = field(default_factory=dict)  # job seq -> tokens this step
    seq: int = 0

    @property
    def busy(self) -> bool:
        return bool(self.step)

    def add(self, request: tuple[int, int], tokens: int, priority: float) -> None:
        self.seq += 1
        # vLLM computes at least the prompt's last token, even on a full hit.
        self.jobs.append(Prefill(request, max(tokens, 1), priority, self.seq))

    def queued_tokens(self) -> int:
        return sum(job.remaining for job in self.jobs)

    def start_step(self, now: float) -> float | None:
        """Plans the next step; returns when it ends, or None when nothing is left."""
        budget = self.max_batched_tokens
        cap = self.long_prefill_tokens if len(self.jobs) > 1 else 0
        running = [job for job in self.jobs if job.started]
        waiting = sorted(
            (job for job in self.jobs if not job.started), key=lambda job: (job.priority, job.seq)
        )
        self.step = {}
        order = [*running, *waiting]
        if not self.max_batched_tokens:  # one prefill at a time, whole
            order, budget = order[:1], sum(job.remaining for job in order[:1])
        for job in order:
            take = min(job.remaining, budget, cap or job.remaining)
            if take <= 0:
                continue
            self.step[job.seq] = take
            job.started = True
            budget -= take
        if not self.step:
            return None
        return now + sum(self.step.values()) / self.tokens_per_s

    def end_step(self) -> list[tuple[int, int]]:
        """Applies the step that ended; returns the requests whose prefill it finished."""
        done = []
        for job in self.jobs:
            job.remaining -= self.step.get(job.seq, 0)
            if job.remaining <= 0:
                done.append(job.request)
        self.jobs = [job for job in self.jobs if job.remaining > 0]
        self.step = {}
        return done
