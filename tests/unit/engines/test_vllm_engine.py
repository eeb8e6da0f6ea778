"""The vLLM engine's mapping of vLLM's DELTA logprobs, on stand-ins shaped like vllm.outputs
(vLLM 0.32/0.33), and the prompt it hands vLLM's renderer; the real engine: tests/vllm_cpu."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from types import SimpleNamespace

import pytest

from serve_app.engines.vllm_engine import _render, _StopTokenGuard, _to_chunk
from serve_app.harmony.encoding import RETURN_TOKEN


def vllm_output(
    token_ids: list[int],
    logprobs: list[dict[int, tuple[float, int]]] | None,
    finish_reason: str | None = None,
    stop_reason: object = None,
) -> SimpleNamespace:
    """A ``RequestOutput`` with one ``CompletionOutput``; ``logprobs`` as vLLM's list of
    ``{token id: Logprob(logprob, rank)}``, one per new token."""
    positions = None
    if logprobs is not None:
        positions = [
            {
                tid: SimpleNamespace(logprob=lp, rank=rank, decoded_token=None)
                for tid, (lp, rank) in p.items()
            }
            for p in logprobs
        ]
    completion = SimpleNamespace(
        token_ids=token_ids,
        logprobs=positions,
        finish_reason=finish_reason,
        stop_reason=stop_reason,
    )
    return SimpleNamespace(
        outputs=[completion], finished=finish_reason is not None, num_cached_tokens=0
    )


def test_vllm_logprobs_map_to_ids_and_values() -> None:
    output = vllm_output(
        [5, 9],
        [
            # The sampled token is the best: its entry and the top 2 (it among them).
            {5: (-0.1, 1), 7: (-2.5, 2)},
            # The sampled token is not in the top 2: one entry more, first in vLLM's dict.
            {9: (-3.0, 5), 5: (-0.2, 1), 7: (-1.9, 2)},
        ],
    )
    chunk = _to_chunk(output, 10, _StopTokenGuard(), 2)
    assert chunk is not None and chunk.token_ids == [5, 9]
    assert chunk.logprobs == [(-0.1, ((5, -0.1), (7, -2.5))), (-3.0, ((5, -0.2), (7, -1.9)))]


def test_vllm_logprobs_with_no_alternatives_and_a_restored_stop_token() -> None:
    output = vllm_output([4], [{4: (-0.7, 3)}], finish_reason="stop", stop_reason=RETURN_TOKEN)
    chunk = _to_chunk(output, 10, _StopTokenGuard(), 0)
    # The guard re-appends the stop token vLLM left out: a placeholder keeps them aligned.
    assert chunk is not None and chunk.token_ids == [4, RETURN_TOKEN]
    assert chunk.logprobs == [(-0.7, ()), (0.0, ())]


def test_vllm_output_without_logprobs_gives_none() -> None:
    chunk = _to_chunk(vllm_output([4, 5], None), 10, _StopTokenGuard())
    assert chunk is not None and chunk.logprobs is None


async def test_the_cache_salt_rides_on_the_prompt_vllm_renders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM takes ``cache_salt`` on the prompt (``TokensPrompt``, a TypedDict), and its renderer
    copies it into the engine input (vllm/renderers/base.py ``_process_tokens``, 0.32 and 0.33):
    what the engine hands the renderer, with a stand-in for it (vLLM itself: tests/vllm_cpu)."""
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(TokensPrompt=dict))
    given: list[dict] = []

    class Renderer:
        async def render_cmpl_async(self, prompts: Sequence[dict]) -> list[dict]:
            given.extend(prompts)
            return list(prompts)

    engine = SimpleNamespace(renderer=Renderer())
    assert await _render(engine, (1, 2, 3), "tenant-a") == {
        "prompt_token_ids": [1, 2, 3],
        "cache_salt": "tenant-a",
    }
    await _render(engine, [4], None)
    assert given[1] == {"prompt_token_ids": [4]}  # unsalted: no key at all, as before
