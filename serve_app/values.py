"""Values several layers share: the bottom layer, importing nothing of serve_app.

The Response echoes the sampling defaults an engine uses (``protocol`` and ``engines``); the
stream translator turns an engine's logprobs into the API's (``harmony`` and ``engines``).
"""

from __future__ import annotations

# What an engine samples with when the request sets nothing; the Response echoes them.
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0

# One sampled token's logprob and its top alternatives as (token id, logprob), best first. Ids
# only: the ingress decodes token text with harmony, so an engine needs no tokenizer.
TokenLogprob = tuple[float, tuple[tuple[int, float], ...]]
