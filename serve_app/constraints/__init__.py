"""Constrained decoding through harmony (issue 20): what a completion must obey, as a grammar.

``spec`` builds an engine-neutral `CompletionConstraint` from a request, ``grammar`` writes it
as an llguidance Lark grammar over harmony's token structure, ``matcher`` compiles it (cached)
against the o200k_harmony vocabulary built offline in ``vocab``, and ``sampling`` draws seeded
tokens under its mask (the simulated engine's way of honouring a constraint).

The ingress checks that each schema and grammar compiles (``validate``: a 400 naming the param)
and puts the constraint on `GenerateRequest.constraint`. The simulated engine honours it
(sampling under the mask where it must, checking scripted turns); the vLLM engine hands the same
grammar to vLLM's guidance backend as ``structured_outputs.grammar`` and follows the output with
its own matcher.
"""
