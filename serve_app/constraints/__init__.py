"""Constrained decoding through harmony (issue 20): what a completion must obey, as a grammar.

``spec`` builds an engine-neutral `CompletionConstraint` from a request, ``grammar`` writes it
as an llguidance Lark grammar over harmony's token structure, ``matcher`` compiles it (cached)
against the o200k_harmony vocabulary built offline in ``vocab``, and ``sampling`` draws seeded
tokens under its mask (the simulated engine's way of honouring a constraint).

Not wired in yet: no engine receives a constraint, and `text.format`, strict tools and
`tool_choice` are still only asked for in the prompt (README, "Not supported"). The next step
is `GenerateRequest.constraint`, vLLM's guidance backend and the simulated engine's sampler.
"""
