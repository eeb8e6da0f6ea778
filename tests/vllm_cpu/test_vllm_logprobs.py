"""Logprobs under a constraint (no vLLM needed): vLLM computes them after the grammar's mask,
so the tokens the grammar forbids come with -inf. The vLLM stage's GPU smoke row
(``top_logprobs`` on a strict ``json_schema`` answer) found them failing the whole Response with
a 500 (JSON has no -inf); the engine now reports them at a finite floor."""

from __future__ import annotations

import json
from dataclasses import dataclass

from serve_app.engines.vllm_engine import MIN_LOGPROB, _token_logprobs


@dataclass
class Logprob:  # vLLM's Logprob: the fields the engine reads
    logprob: float
    rank: int | None


def test_a_token_the_grammar_masked_gets_a_finite_logprob() -> None:
    # A forced position: the sampled token has all the probability, the runner-up none.
    positions = [{5: Logprob(0.0, 1), 7: Logprob(float("-inf"), 2)}]
    entries = _token_logprobs([5], positions, top=2, length=1)
    assert entries == [(0.0, ((5, 0.0), (7, MIN_LOGPROB)))]
    json.dumps(entries, allow_nan=False)  # what the Response's JSON needs


def test_finite_logprobs_pass_unchanged() -> None:
    positions = [{3: Logprob(-1.5, 2), 4: Logprob(-0.25, 1)}]
    assert _token_logprobs([3], positions, top=2, length=1) == [(-1.5, ((4, -0.25), (3, -1.5)))]
