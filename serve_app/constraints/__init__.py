"""Constrained decoding through harmony (issue 20): what a completion must obey, as a grammar.

``spec`` holds an engine-neutral `CompletionConstraint` (the data an engine needs), ``build``
makes one from a request (in the ingress: engines never see the Responses API), ``grammar``
writes it as an llguidance Lark grammar over harmony's token structure, ``matcher`` compiles it
(cached) against the o200k_harmony vocabulary built offline in ``vocab``, and ``sampling`` draws
seeded tokens under its mask (the simulated engine's way of honouring a constraint).

The ingress checks that each schema and grammar compiles (``validate``: a 400 naming the param)
and puts the constraint on `GenerateRequest.constraint`. The simulated engine honours it
(sampling under the mask where it must, checking scripted turns); the vLLM engine hands the same
grammar to vLLM's guidance backend as ``structured_outputs.grammar`` and follows the output with
its own matcher.
"""
