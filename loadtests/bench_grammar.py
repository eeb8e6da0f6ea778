"""Benchmark: what constrained decoding costs (issue 20).

For each constraint a client sends (five strict ``json_schema`` formats as the openai SDK
writes them, three strict tools under ``tool_choice: "required"``, Codex's ``apply_patch``
lark grammar), prints:

- the grammar's compile time, cold (first request with it) and cached (each later request:
  a copy of the compiled matcher), and the first mask (llguidance builds lexer states lazily);
- the cost per token of the mask: llguidance's ``compute_bitmask`` + ``consume_token``, and the
  rest of the simulated engine's step under the mask (reading it, the seeded choice);
- the simulated engine's CPU per token for a constrained and an unconstrained request, end to
  end through ``SimulatedEngine.generate`` (no Ray, no HTTP).

CPU time of this process (``time.process_time``: every thread, llguidance's included), so a
busy machine slows the figures little. Once per process, the llguidance vocabulary is built
first (about a second) and reported apart.

    python loadtests/bench_grammar.py --seeds 20

This is a benchmark, not a test: it prints numbers and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llguidance

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from serve_app.constraints import matcher as matchers  # noqa: E402
from serve_app.constraints.build import from_request  # noqa: E402
from serve_app.constraints.grammar import to_lark  # noqa: E402
from serve_app.constraints.sampling import MaskedSampler  # noqa: E402
from serve_app.constraints.spec import CompletionConstraint  # noqa: E402
from serve_app.constraints.vocab import harmony_tokenizer  # noqa: E402
from serve_app.engines.base import GenerateRequest, SamplingSettings  # noqa: E402
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig  # noqa: E402
from serve_app.harmony.encoding import CALL_TOKEN, RETURN_TOKEN  # noqa: E402
from serve_app.harmony.render import render_request  # noqa: E402
from serve_app.harmony.tools import ToolRegistry  # noqa: E402
from serve_app.protocol.requests import ResponsesRequest  # noqa: E402
from tests.support.client_schemas import SCHEMAS  # noqa: E402

MODEL = "gpt-oss-120b"
MAX_TOKENS = 1500
CODEX_PATCH_REQUEST = REPO / "tests" / "fixtures" / "codex" / "patch" / "req_001.json"
# The engine's time model never sleeps at this speed: what is measured is CPU work.
FAST = SimulatedEngineConfig(decode_tokens_per_s=10_000_000, prefill_tokens_per_s=10_000_000)


def cases() -> dict[str, ResponsesRequest]:
    """The constrained requests measured, by name."""
    requests = {
        f"json_schema {name}": {
            "text": {"format": {"type": "json_schema", "name": name, "strict": True, "schema": s}}
        }
        for name, s in SCHEMAS.items()
    }
    strict_tools = [
        {"type": "function", "name": f"save_{name}", "strict": True, "parameters": SCHEMAS[name]}
        for name in ("person", "order", "ticket")
    ]
    requests["3 strict tools, required"] = {"tools": strict_tools, "tool_choice": "required"}
    patch_tool = _codex_patch_tool()
    requests["codex apply_patch (lark)"] = {"tools": [patch_tool], "tool_choice": "required"}
    return {
        name: ResponsesRequest.model_validate({"model": MODEL, "input": "Go.", **fields})
        for name, fields in requests.items()
    }


def _codex_patch_tool() -> dict[str, Any]:
    body = json.loads(CODEX_PATCH_REQUEST.read_text())
    body = body.get("body", body)
    return next(tool for tool in body["tools"] if tool.get("type") == "custom")


def cpu_ms(work: Callable[[], object]) -> float:
    start = time.process_time()
    work()
    return (time.process_time() - start) * 1000


@dataclass
class CompileCost:
    grammar_chars: int
    cold_ms: float
    first_mask_ms: float
    cached_ms: float


def compile_cost(constraint: CompletionConstraint, repeats: int = 200) -> CompileCost:
    grammar = to_lark(constraint)
    matchers._compiled.cache_clear()
    cold: list[llguidance.LLMatcher] = []
    cold_ms = cpu_ms(lambda: cold.append(matchers.new_matcher(constraint)))
    first_mask_ms = cpu_ms(cold[0].compute_bitmask)
    cached_ms = cpu_ms(lambda: [matchers.new_matcher(constraint) for _ in range(repeats)])
    return CompileCost(len(grammar), cold_ms, first_mask_ms, cached_ms / repeats)


@dataclass
class MaskCost:
    tokens: int
    llguidance_us: float  # compute_bitmask + consume_token, per token
    step_us: float  # the rest of the sampler's step (reading the mask, the choice), per token


def mask_cost(constraint: CompletionConstraint, seeds: int) -> MaskCost:
    """Per-token cost of sampling under the mask, over ``seeds`` completions."""
    tokens = 0
    llguidance_s = 0.0
    start = time.process_time()
    for seed in range(seeds):
        sampler = MaskedSampler(matchers.new_matcher(constraint), seed)
        drawn = sampler.sample(MAX_TOKENS)
        tokens += len(drawn)
        llguidance_s += _replay(constraint, drawn)
    step_s = time.process_time() - start - llguidance_s
    return MaskCost(tokens, llguidance_s / tokens * 1e6, step_s / tokens * 1e6)


def _replay(constraint: CompletionConstraint, tokens: list[int]) -> float:
    """CPU seconds llguidance alone takes to mask and advance through ``tokens``."""
    matcher = matchers.new_matcher(constraint)
    start = time.process_time()
    for token in tokens:
        matcher.compute_bitmask()
        matcher.consume_token(token)
    return time.process_time() - start


async def engine_cpu_per_token(request: ResponsesRequest, seeds: int) -> tuple[int, float]:
    """Tokens and CPU µs per token of ``SimulatedEngine.generate`` for ``request``."""
    engine = SimulatedEngine(FAST)
    await engine.start()
    prompt = render_request(request)
    constraint = from_request(request, prompt.tools)
    tokens = 0
    start = time.process_time()
    for seed in range(seeds):
        generate = GenerateRequest(
            request_id=f"bench-{seed}",
            # The engine seeds its sampler with the prompt: a different prompt per seed.
            prompt_token_ids=[*prompt.token_ids, seed],
            sampling=SamplingSettings(
                max_tokens=MAX_TOKENS, stop_token_ids=(RETURN_TOKEN, CALL_TOKEN)
            ),
            constraint=constraint,
        )
        async for chunk in engine.generate(generate):
            tokens += len(chunk.token_ids)
    cpu_s = time.process_time() - start
    await engine.shutdown()
    return tokens, cpu_s / max(tokens, 1) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20, help="completions sampled per case")
    args = parser.parse_args()

    vocab_ms = cpu_ms(harmony_tokenizer)
    print(f"llguidance vocabulary (once per process): {vocab_ms:.0f} ms CPU\n")
    requests = cases()
    # One sample first: the structural token ids and harmony's regexes are built once.
    warm = requests["json_schema person"]
    first = from_request(warm, ToolRegistry.from_request(warm))
    MaskedSampler(matchers.new_matcher(first), 0).sample(50)
    header = (
        f"{'constraint':28} {'grammar':>8} {'cold ms':>8} {'1st mask':>9} {'cached':>8}"
        f" {'tokens':>7} {'mask µs/tok':>12} {'sampler µs/tok':>15}"
    )
    print(header)
    print("-" * len(header))
    for name, request in requests.items():
        constraint = from_request(request, ToolRegistry.from_request(request))
        assert constraint is not None, name
        compiled = compile_cost(constraint)
        masked = mask_cost(constraint, args.seeds)
        print(
            f"{name:28} {compiled.grammar_chars:>7}c {compiled.cold_ms:>8.1f}"
            f" {compiled.first_mask_ms:>9.2f} {compiled.cached_ms:>7.3f}m"
            f" {masked.tokens:>7} {masked.llguidance_us:>12.0f} {masked.step_us:>15.0f}"
        )

    print("\nsimulated engine, end to end (SimulatedEngine.generate, CPU per token):")
    free = ResponsesRequest.model_validate({"model": MODEL, "input": "Go."})
    constrained = requests["json_schema order"]
    for label, request in (("unconstrained", free), ("json_schema order", constrained)):
        tokens, per_token = asyncio.run(engine_cpu_per_token(request, args.seeds))
        print(f"  {label:20} {tokens:>7} tokens  {per_token:>8.0f} µs/token")
    print(f"\ncompiled grammars cached: {matchers.cache_info()}")


if __name__ == "__main__":
    main()
