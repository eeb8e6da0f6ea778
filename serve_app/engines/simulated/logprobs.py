"""Logprob stand-ins: deterministic, a function of (``seed``, position, token) only.

The sampled token gets a probability in [0.5, 0.95), the most likely; the top k are the sampled
token then k - 1 distinct filler words, in decreasing order, sharing at most 90% of what is
left, so every value is a valid log-probability (<= 0) and the shown ones sum to less than 1.
No model computed them.
"""

from __future__ import annotations

import math
import random

from serve_app.engines.base import TokenLogprob
from serve_app.engines.simulated.tokens import harmony_tokens


def token_logprobs(seed: int, position: int, token: int, top: int) -> TokenLogprob:
    """The simulated logprob of ``token`` at ``position`` and its ``top`` most likely tokens
    (``token`` first, then filler words), the same for the same arguments in any process."""
    rng = random.Random(hash((seed, position, token)))  # hash of ints: stable across processes
    sampled = 0.5 + 0.45 * rng.random()
    if top == 0:
        return math.log(sampled), ()
    others = [word for word in harmony_tokens().filler if word != token]
    chosen = rng.sample(others, min(top - 1, len(others)))
    weights = sorted((rng.random() + 0.01 for _ in chosen), reverse=True)
    scale = 0.9 * (1 - sampled) / (sum(weights) or 1)
    alternatives = [
        (word, math.log(weight * scale)) for word, weight in zip(chosen, weights, strict=True)
    ]
    return math.log(sampled), ((token, math.log(sampled)), *alternatives)
