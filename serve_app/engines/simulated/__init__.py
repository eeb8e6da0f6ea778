"""The simulated engine: a CPU stand-in for vLLM, honest about being one.

It has no model weights. It emits well-formed harmony completions made with the real
encoding, models a block-level prefix KV cache (`PrefixKVCache`, salted per tenant by the
request's ``cache_salt`` as vLLM's is) so routing and load tests measure real cache behaviour,
and models time: prefill of the *uncached* prompt tokens (one prefill at a time, first come
first served, as prefills share one accelerator) and decode steps that slow down as more
requests decode together.

What it says:
- By default, a short analysis message and a final answer that says it comes from the simulated
  engine, padded with filler words to ``default_output_tokens``. It never calls a tool on its
  own: an agent driven by it cannot be made to run anything, unless the request itself
  requires a call (``tool_choice`` required or named; see Constraints below).
- With a script (tests), the first turn whose ``match`` regex is found (``re.search``) in the
  decoded prompt's last message, header included, e.g. ``<|start|>user<|message|>…<|end|>``::

      turns:
        - match: "RESULT-42"            # optional: a turn without match matches anything
          items:
            - reasoning: "analysis channel text"
            - preamble: "commentary text with no recipient"
            - text: "final answer (ends with <|return|>)"
            - function_call: {name: exec_command, arguments: {cmd: ls}, namespace: functions}
            - custom_tool_call: {name: apply_patch, input: "raw text"}
            - builtin_call: {to: browser.search, input: {query: "zebras"}}   # or to: python
            - raw: "<|channel|>final<|message|>harmony text, specials included"
            - sleep: 0.5                # seconds, cut short by abort
            - fail: "EngineError message raised at this point"
            - fail: {message: "prompt rejected", code: invalid_prompt}   # with the error's code

  The script comes from ``config.script`` (a YAML/JSON path or the mapping itself), else the
  file ``$SERVE_APP_SIM_SCRIPT`` names. A turn plays out whole: stop tokens inside it (one
  ``<|call|>`` per tool call) do not end it; its end gives finish reason "stop". ``max_tokens``
  and abort cut it like any other output.

Constraints (``GenerateRequest.constraint``, issue 20): honoured with the llguidance grammar
vLLM's guidance backend enforces too. Unscripted, a completion that must be
JSON or must call a tool is sampled under the grammar's token mask (seeded like the default
answer), so it is valid by construction, not scripted; where a free final answer is allowed the
default answer stands (it obeys), and under ``tool_choice`` auto the sampler answers and never
calls a tool on its own. A scripted turn is checked against the constraint, each message
ending in ``<|return|>`` or ``<|call|>`` as its own completion: a turn that breaks it is an
`EngineError` (the test script is misconfigured), never silently invalid output.

Logprobs (``SamplingSettings.logprobs`` = k): deterministic stand-ins, a function of
(``seed``, position, token) only (`token_logprobs`). The sampled token gets a probability in
[0.5, 0.95), the most likely; the top k are the sampled token then k - 1 distinct filler words,
in decreasing order, sharing at most 90% of what is left, so every value is a valid
log-probability (≤ 0) and the shown ones sum to less than 1. No model computed them.

The output depends only on the prompt, the script and ``seed``; only the timing is wall-clock.
The chunk with the first token reports ``engine_ttft_s`` from the time model (arrival to the
modelled first token), so a benchmark on a busy host measures where requests were sent, not
how late the host's timers fired.

The package, by job: ``script`` (the script language), ``tokens`` (harmony messages as token
ids: scripted turns, the default answer), ``logprobs`` (the stand-ins), ``timing`` (the time
model: prefill queue, decode steps), ``constrained`` (sampling under a constraint's mask,
checking scripted turns), ``steps`` (a request's plan), ``shared_tier`` (the KV tier the
replicas of an app share on Ray, in one named Ray actor), ``config`` and ``engine``
(`SimulatedEngine`, the `Engine` contract over them).
"""

from serve_app.engines.simulated.config import SimulatedEngineConfig
from serve_app.engines.simulated.engine import SimulatedEngine
from serve_app.engines.simulated.logprobs import token_logprobs
from serve_app.engines.simulated.script import SCRIPT_ENV, EngineScript, load_script
from serve_app.engines.simulated.tokens import last_message_text

__all__ = [
    "SCRIPT_ENV",
    "EngineScript",
    "SimulatedEngine",
    "SimulatedEngineConfig",
    "last_message_text",
    "load_script",
    "token_logprobs",
]
