"""Constrained decoding through harmony (issue 20): what a completion must obey, as a grammar.

``spec`` builds an engine-neutral `CompletionConstraint` from a request, ``grammar`` writes it
as an llguidance Lark grammar over harmony's token structure, ``matcher`` compiles it (cached)
against the o200k_harmony vocabulary built offline in ``vocab``, and ``sampling`` draws seeded
tokens under its mask (the simulated engine's way of honouring a constraint).

The ingress puts the constraint on `GenerateRequest.constraint`; the simulated engine honours
it (sampling under the mask where it must, checking scripted turns). vLLM does not yet: mapping
it to vLLM's guidance backend is the next step (README, "Not supported").
"""
